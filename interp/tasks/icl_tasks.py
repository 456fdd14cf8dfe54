"""Word-pair tasks for in-context learning (Todd et al. 2024's "function vector" tasks, written out here),
and the prompt templates they are asked in.

    task = ICL_TASKS["antonym"]                        # ("hot", "cold"), ...
    pairs = single_token_pairs(model, task)            # those whose answer is one token of the model's
    discovery, heldout = split_pairs(pairs, seed=0)    # disjoint halves: find heads, then test them
    prompts = few_shot_prompts(discovery, 8, n_shots=5, generator=torch.Generator().manual_seed(0))

A few-shot prompt is `n_shots` solved pairs then the query, in one template (`ICL_TEMPLATES`); the
default, "qa", is Todd et al.'s:

    "Q: hot\\nA: cold\\n\\nQ: big\\nA: small\\n\\nQ: fast\\nA:"       -> the answer " slow"

and its corrupted twin has the same pairs with the answers shuffled among them (the query and its
answer unchanged), so the prompt shows the format but not the task. A zero-shot prompt is the query
alone ("Q: fast\\nA:"). The templates are "qa" (Q: x / A: y), "input_output" (Input: x / Output: y),
"arrow" (x -> y) and "colon" (x: y); every template's answer follows its query after a space.

Each task is a family: an analysis chooses its heads and settings on some tasks and tests them on the
others (`circuits.evidence.split_families`), so there are twenty: antonym, country_capital,
present_past, singular_plural, capitalise, comparative, adverb, country_language, first_letter,
next_item, male_female, synonym, superlative, plural_singular, verb_agent, previous_item,
city_country, chemical_symbol, profession_place and person_tool. The templates are families too: a
function vector chosen in some templates is tested in the others.

Source and licence: the pairs below were written out for interp from common knowledge (English
antonyms, synonyms, comparatives, superlatives, adverbs and inflection, world capitals, cities and
languages, letters, numbers, weekdays and months, chemical elements, professions and their places
and tools) and are distributed under interp's own licence; no third-party word list was copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interp.checks import check_count
from interp.model.transformer import HookedTransformer


@dataclass(frozen=True)
class WordPairTask:
    """A task given by example pairs (input word, answer word)."""

    name: str
    description: str
    pairs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class PromptTemplate:
    """How a pair is written in a prompt: `query` with the input word in place of {x}, then " " + the
    answer word, then `separator` before the next pair."""

    name: str
    query: str  # "Q: {x}\nA:"
    separator: str  # "\n\n"

    def ask(self, x: str) -> str:
        """The query alone, the answer to come: "Q: fast\nA:"."""
        return self.query.format(x=x)

    def shot(self, x: str, y: str) -> str:
        """A solved pair and the separator: "Q: hot\nA: cold\n\n"."""
        return f"{self.ask(x)} {y}{self.separator}"

    @property
    def pattern(self) -> str:
        """One solved pair as reports show it, newlines escaped: "Q: x\\nA: y"."""
        return self.shot("x", "y").strip().replace("\n", "\\n")


ICL_TEMPLATES: dict[str, PromptTemplate] = {
    template.name: template
    for template in [
        PromptTemplate("qa", "Q: {x}\nA:", "\n\n"),
        PromptTemplate("input_output", "Input: {x}\nOutput:", "\n\n"),
        PromptTemplate("arrow", "{x} ->", "\n"),
        PromptTemplate("colon", "{x}:", "\n"),
    ]
}
DEFAULT_TEMPLATE = "qa"


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    """ "hot cold, big small" -> (("hot", "cold"), ("big", "small"))."""
    return tuple(tuple(item.split()) for item in text.split(","))  # type: ignore[misc]


ICL_TASKS: dict[str, WordPairTask] = {
    task.name: task
    for task in [
        WordPairTask(
            name="antonym",
            description="a word -> its opposite",
            pairs=_pairs(
                "hot cold, big small, fast slow, up down, good bad, happy sad, high low, long short, "
                "open closed, light dark, rich poor, strong weak, hard soft, early late, young old, "
                "full empty, wet dry, true false, left right, win lose, love hate, thick thin, "
                "clean dirty, loud quiet, first last, inside outside, buy sell, push pull, north south, "
                "east west, begin end, heavy light, wide narrow, deep shallow, safe dangerous, "
                "cheap expensive, friend enemy, day night, give take, above below, before after, "
                "simple complex, sweet sour, alive dead, question answer, increase decrease, "
                "maximum minimum, accept reject, enter exit, remember forget"
            ),
        ),
        WordPairTask(
            name="country_capital",
            description="a country -> its capital",
            pairs=_pairs(
                "France Paris, Germany Berlin, Italy Rome, Spain Madrid, Japan Tokyo, China Beijing, "
                "Russia Moscow, Egypt Cairo, Greece Athens, Portugal Lisbon, Austria Vienna, "
                "Ireland Dublin, Norway Oslo, Sweden Stockholm, Finland Helsinki, Denmark Copenhagen, "
                "Poland Warsaw, Hungary Budapest, Kenya Nairobi, Peru Lima, Chile Santiago, "
                "Cuba Havana, Thailand Bangkok, Iran Tehran, Iraq Baghdad, Canada Ottawa, "
                "Australia Canberra, Belgium Brussels, "
                "Netherlands Amsterdam, Switzerland Bern, Turkey Ankara, "
                "Indonesia Jakarta, Philippines Manila, Vietnam Hanoi, Ukraine Kyiv, "
                "Romania Bucharest, Bulgaria Sofia, Serbia Belgrade, Czechia Prague, Nigeria Abuja, "
                "Morocco Rabat, Colombia Bogota, Venezuela Caracas, Pakistan Islamabad, "
                "Afghanistan Kabul, Syria Damascus, Lebanon Beirut, Jordan Amman"
            ),
        ),
        WordPairTask(
            name="present_past",
            description="a verb -> its past tense",
            pairs=_pairs(
                "go went, see saw, eat ate, run ran, take took, give gave, come came, make made, "
                "know knew, think thought, find found, tell told, become became, leave left, feel felt, "
                "bring brought, begin began, keep kept, hold held, write wrote, stand stood, hear heard, "
                "meet met, sit sat, speak spoke, lead led, grow grew, lose lost, fall fell, send sent, "
                "build built, buy bought, pay paid, drive drove, break broke, choose chose, draw drew, "
                "fly flew, forget forgot, sing sang, swim swam, throw threw, wear wore, win won, "
                "walk walked, play played, open opened, talk talked, jump jumped, ask asked, "
                "call called, help helped, move moved, live lived, want wanted, look looked"
            ),
        ),
        WordPairTask(
            name="singular_plural",
            description="a noun -> its plural",
            pairs=_pairs(
                "cat cats, dog dogs, house houses, car cars, book books, tree trees, bird birds, "
                "child children, man men, woman women, mouse mice, foot feet, tooth teeth, "
                "person people, box boxes, city cities, country countries, baby babies, knife knives, "
                "leaf leaves, wolf wolves, life lives, story stories, party parties, church churches, "
                "bus buses, glass glasses, dish dishes, watch watches, hand hands, eye eyes, door doors, "
                "table tables, chair chairs, friend friends, school schools, student students, "
                "teacher teachers, game games, song songs, river rivers, animal animals, girl girls, "
                "boy boys, apple apples, idea ideas, road roads, window windows, phone phones, "
                "family families"
            ),
        ),
        WordPairTask(
            name="capitalise",
            description="a word -> the same word capitalised",
            pairs=_pairs(
                "cat Cat, dog Dog, red Red, blue Blue, house House, water Water, book Book, tree Tree, "
                "city City, music Music, river River, light Light, world World, time Time, school School, "
                "table Table, friend Friend, garden Garden, money Money, story Story, paper Paper, "
                "summer Summer, winter Winter, morning Morning, family Family, market Market, "
                "church Church, island Island, mountain Mountain, forest Forest"
            ),
        ),
        WordPairTask(
            name="comparative",
            description="an adjective -> its comparative",
            pairs=_pairs(
                "big bigger, small smaller, fast faster, slow slower, tall taller, short shorter, "
                "old older, young younger, long longer, strong stronger, weak weaker, rich richer, "
                "poor poorer, hard harder, soft softer, hot hotter, cold colder, warm warmer, cool cooler, "
                "high higher, low lower, deep deeper, wide wider, thin thinner, thick thicker, good better, "
                "bad worse, easy easier, happy happier, early earlier, late later, great greater, "
                "large larger, clean cleaner, dark darker, bright brighter, loud louder, quiet quieter, "
                "cheap cheaper, safe safer, close closer, near nearer, far farther, heavy heavier, "
                "light lighter, new newer, sweet sweeter, smart smarter"
            ),
        ),
        WordPairTask(
            name="adverb",
            description="an adjective -> its adverb",
            pairs=_pairs(
                "quick quickly, slow slowly, happy happily, sad sadly, easy easily, careful carefully, "
                "loud loudly, quiet quietly, clear clearly, rapid rapidly, sudden suddenly, real really, "
                "final finally, usual usually, actual actually, bad badly, nice nicely, soft softly, "
                "kind kindly, brave bravely, proud proudly, calm calmly, strong strongly, exact exactly, "
                "free freely, open openly, rare rarely, warm warmly, wide widely, full fully"
            ),
        ),
        WordPairTask(
            name="country_language",
            description="a country -> its language",
            pairs=_pairs(
                "France French, Germany German, Spain Spanish, Italy Italian, Japan Japanese, "
                "China Chinese, Russia Russian, Greece Greek, Portugal Portuguese, Poland Polish, "
                "Netherlands Dutch, Sweden Swedish, Norway Norwegian, Denmark Danish, Finland Finnish, "
                "Turkey Turkish, Hungary Hungarian, Korea Korean, Vietnam Vietnamese, Thailand Thai, "
                "Iran Persian, Israel Hebrew, Egypt Arabic, Ukraine Ukrainian, "
                "Romania Romanian, Czechia Czech, England English, "
                "India Hindi, Indonesia Indonesian, Pakistan Urdu, Kenya Swahili, Ireland Irish, "
                "Wales Welsh, Iceland Icelandic, Croatia Croatian, Serbia Serbian, Bulgaria Bulgarian"
            ),
        ),
        WordPairTask(
            name="first_letter",
            description="a word -> its first letter",
            pairs=_pairs(
                "apple a, banana b, cat c, dog d, egg e, fish f, goat g, house h, ice i, juice j, kite k, "
                "lion l, moon m, nest n, orange o, pen p, queen q, river r, sun s, tree t, umbrella u, "
                "violin v, water w, yellow y, zebra z"
            ),
        ),
        WordPairTask(
            name="next_item",
            description="a number, ordinal, weekday or month -> the next one",
            pairs=_pairs(
                "one two, two three, three four, four five, five six, six seven, seven eight, eight nine, "
                "nine ten, ten eleven, eleven twelve, twelve thirteen, thirteen fourteen, "
                "fourteen fifteen, fifteen sixteen, sixteen seventeen, seventeen eighteen, "
                "eighteen nineteen, nineteen twenty, first second, second third, third fourth, "
                "fourth fifth, fifth sixth, sixth seventh, seventh eighth, eighth ninth, ninth tenth, "
                "Monday Tuesday, Tuesday Wednesday, Wednesday Thursday, Thursday Friday, "
                "Friday Saturday, Saturday Sunday, Sunday Monday, January February, February March, "
                "March April, April May, May June, June July, July August, August September, "
                "September October, October November, November December, December January"
            ),
        ),
        WordPairTask(
            name="male_female",
            description="a male noun or pronoun -> its female counterpart",
            pairs=_pairs(
                "king queen, man woman, boy girl, father mother, son daughter, brother sister, "
                "uncle aunt, husband wife, actor actress, prince princess, grandfather grandmother, "
                "he she, him her, lord lady, male female, "
                "waiter waitress, hero heroine, god goddess, bull cow, rooster hen, groom bride, "
                "monk nun, dad mom, men women, boys girls, kings queens, sons daughters, "
                "brothers sisters, fathers mothers"
            ),
        ),
        WordPairTask(
            name="synonym",
            description="a word -> a word of the same meaning",
            pairs=_pairs(
                "big large, small little, fast quick, begin start, finish end, smart clever, angry mad, "
                "gift present, shut close, rock stone, road street, sick ill, hard difficult, easy simple, "
                "fix repair, buy purchase, center middle, correct right, couch sofa, error mistake, "
                "exam test, autumn fall, choose pick, cap hat, quiet silent, rich wealthy, sad unhappy, "
                "speak talk, trash garbage, jump leap, shop store, kid child, hurry rush, afraid scared, "
                "brave bold, cold chilly, huge giant, wet damp, odd strange, job work, sure certain, "
                "glad happy, nap sleep, shout yell, grin smile, aid help"
            ),
        ),
        WordPairTask(
            name="superlative",
            description="an adjective -> its superlative",
            pairs=_pairs(
                "big biggest, small smallest, fast fastest, slow slowest, tall tallest, short shortest, "
                "long longest, high highest, low lowest, old oldest, young youngest, strong strongest, "
                "weak weakest, rich richest, poor poorest, hard hardest, easy easiest, happy happiest, "
                "early earliest, late latest, good best, bad worst, great greatest, large largest, "
                "close closest, deep deepest, wide widest, cheap cheapest, near nearest, "
                "bright brightest, dark darkest, hot hottest, cold coldest, warm warmest, safe safest, "
                "fine finest, simple simplest, smart smartest, nice nicest, quick quickest, "
                "heavy heaviest, clean cleanest, busy busiest"
            ),
        ),
        WordPairTask(
            name="plural_singular",
            description="a plural noun -> its singular",
            pairs=_pairs(
                "cats cat, dogs dog, books book, trees tree, houses house, cars car, birds bird, "
                "hands hand, eyes eye, days day, years year, friends friend, girls girl, boys boy, "
                "apples apple, chairs chair, tables table, doors door, rooms room, schools school, "
                "cities city, stories story, babies baby, countries country, parties party, boxes box, "
                "buses bus, glasses glass, dishes dish, wolves wolf, leaves leaf, knives knife, "
                "wives wife, lives life, men man, women woman, children child, feet foot, teeth tooth, "
                "mice mouse"
            ),
        ),
        WordPairTask(
            name="verb_agent",
            description="a verb -> the person who does it",
            pairs=_pairs(
                "teach teacher, write writer, sing singer, drive driver, paint painter, bake baker, "
                "farm farmer, play player, read reader, run runner, lead leader, speak speaker, "
                "work worker, build builder, hunt hunter, fight fighter, own owner, swim swimmer, "
                "win winner, report reporter, train trainer, manage manager, design designer, "
                "develop developer, produce producer, direct director, act actor, invent inventor, "
                "visit visitor, edit editor, sail sailor, rule ruler, kill killer, print printer, "
                "buy buyer, sell seller, follow follower, listen listener, observe observer, "
                "dance dancer"
            ),
        ),
        WordPairTask(
            name="previous_item",
            description="a number, ordinal, weekday or month -> the one before",
            pairs=_pairs(
                "two one, three two, four three, five four, six five, seven six, eight seven, "
                "nine eight, ten nine, eleven ten, twelve eleven, thirteen twelve, fourteen thirteen, "
                "fifteen fourteen, sixteen fifteen, seventeen sixteen, eighteen seventeen, "
                "nineteen eighteen, twenty nineteen, second first, third second, fourth third, "
                "fifth fourth, sixth fifth, seventh sixth, eighth seventh, ninth eighth, tenth ninth, "
                "Tuesday Monday, Wednesday Tuesday, Thursday Wednesday, Friday Thursday, "
                "Saturday Friday, Sunday Saturday, Monday Sunday, February January, March February, "
                "April March, May April, June May, July June, August July, September August, "
                "October September, November October, December November, January December"
            ),
        ),
        WordPairTask(
            name="city_country",
            description="a city that is not its country's capital -> its country",
            pairs=_pairs(
                "Munich Germany, Osaka Japan, Milan Italy, Barcelona Spain, Lyon France, "
                "Sydney Australia, Toronto Canada, Mumbai India, Shanghai China, Istanbul Turkey, "
                "Zurich Switzerland, Krakow Poland, Porto Portugal, Antwerp Belgium, "
                "Rotterdam Netherlands, Gothenburg Sweden, Bergen Norway, Salzburg Austria, "
                "Glasgow Scotland, Manchester England, Cork Ireland, Alexandria Egypt, "
                "Casablanca Morocco, Lagos Nigeria, Karachi Pakistan, Busan Korea, Mombasa Kenya, "
                "Medellin Colombia, Guadalajara Mexico, Cusco Peru, Valparaiso Chile, "
                "Thessaloniki Greece, Odessa Ukraine, Kazan Russia, Aleppo Syria, Basra Iraq, "
                "Isfahan Iran, Rio Brazil, Rosario Argentina, Surabaya Indonesia, Cebu Philippines, "
                "Chittagong Bangladesh"
            ),
        ),
        WordPairTask(
            name="chemical_symbol",
            description="a chemical element -> its symbol",
            pairs=_pairs(
                "hydrogen H, helium He, carbon C, nitrogen N, oxygen O, sodium Na, magnesium Mg, "
                "aluminium Al, silicon Si, phosphorus P, sulfur S, chlorine Cl, potassium K, "
                "calcium Ca, iron Fe, copper Cu, zinc Zn, silver Ag, gold Au, lead Pb, mercury Hg, "
                "tin Sn, neon Ne, argon Ar, uranium U, nickel Ni, fluorine F, lithium Li, boron B, "
                "iodine I, titanium Ti, platinum Pt, cobalt Co, chromium Cr, manganese Mn"
            ),
        ),
        WordPairTask(
            name="profession_place",
            description="a profession -> where it works",
            pairs=_pairs(
                "teacher school, doctor hospital, chef kitchen, farmer farm, judge court, "
                "priest church, librarian library, banker bank, waiter restaurant, actor stage, "
                "sailor ship, pilot plane, miner mine, scientist laboratory, astronaut space, "
                "student classroom, clerk office, mechanic garage, lifeguard beach, zookeeper zoo, "
                "gardener garden, baker bakery, pharmacist pharmacy, professor university, "
                "monk monastery, jockey racetrack, cowboy ranch, lumberjack forest, curator museum, "
                "senator senate, jailer prison, nun convent, miller mill, brewer brewery"
            ),
        ),
        WordPairTask(
            name="person_tool",
            description="a person -> the tool or instrument of their work",
            pairs=_pairs(
                "carpenter hammer, painter brush, writer pen, photographer camera, tailor needle, "
                "barber scissors, astronomer telescope, biologist microscope, drummer drum, "
                "pianist piano, violinist violin, guitarist guitar, golfer club, plumber wrench, "
                "archer bow, knight sword, sculptor chisel, blacksmith anvil, programmer computer, "
                "teacher chalk, typist keyboard, cellist cello, trumpeter trumpet, harpist harp, "
                "fisherman rod, woodcutter axe, gardener rake, farmer plough, sailor compass, "
                "miner pickaxe, surgeon scalpel, doctor stethoscope, hunter rifle, cowboy lasso, "
                "chef knife, flutist flute, organist organ, baker oven, potter wheel, weaver loom"
            ),
        ),
    ]
}


def check_task_names(names: Sequence[str]) -> list[str]:
    """The names checked against ICL_TASKS (a ValueError naming the choices otherwise), in order."""
    unknown = [name for name in names if name not in ICL_TASKS]
    if unknown or not names:
        raise ValueError(
            f"unknown ICL task(s) {unknown or names!r}; choose from {', '.join(ICL_TASKS)} "
            "(a comma-separated list)"
        )
    return list(dict.fromkeys(names))


def check_template_names(names: Sequence[str]) -> list[str]:
    """The names checked against ICL_TEMPLATES (a ValueError naming the choices otherwise), in order."""
    unknown = [name for name in names if name not in ICL_TEMPLATES]
    if unknown or not names:
        raise ValueError(
            f"unknown prompt template(s) {unknown or names!r}; choose from {', '.join(ICL_TEMPLATES)} "
            "(a comma-separated list)"
        )
    return list(dict.fromkeys(names))


def single_token_pairs(model: HookedTransformer, task: WordPairTask) -> list[tuple[str, str]]:
    """The task's pairs whose answer, after a space (" cold"), is one token of the model's tokenizer:
    the token the model must predict after the query, "Q: hot\nA:" (a ValueError if the model has no
    tokenizer)."""
    if model.tokenizer is None:
        raise ValueError(
            f"{model.cfg.model_name} has no tokenizer; word-pair tasks need a model with one "
            "(e.g. smollm2-135m)"
        )
    encode = model.tokenizer.encode
    return [(x, y) for x, y in task.pairs if len(encode(" " + y, add_special_tokens=False)) == 1]


def answer_token(model: HookedTransformer, answer: str) -> int:
    """The one token id of " answer" (see `single_token_pairs`)."""
    (token,) = model.tokenizer.encode(" " + answer, add_special_tokens=False)
    return token


def split_pairs(
    pairs: Sequence[tuple[str, str]], seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(discovery, held-out): the pairs shuffled with `seed` and cut in two halves with no pair in
    both (the first half one larger when the count is odd)."""
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    half = (len(pairs) + 1) // 2
    return [pairs[i] for i in order[:half]], [pairs[i] for i in order[half:]]


@dataclass(kw_only=True)
class FewShotPrompts:
    """Few-shot prompts of one task and what they should be answered with: `clean` shows `n_shots`
    solved pairs, `corrupted` the same with the answers shuffled among them, `zero_shot` the query
    alone. [n_prompts] lists of text."""

    clean: list[str]
    corrupted: list[str]
    zero_shot: list[str]
    answers: list[str]  # the query's answer word (predicted as " " + answer)


def few_shot_prompts(
    pairs: Sequence[tuple[str, str]],
    n_prompts: int,
    n_shots: int,
    generator: torch.Generator,
    template: str = DEFAULT_TEMPLATE,
) -> FewShotPrompts:
    """`n_prompts` prompts from `pairs` in `template` (a name of ICL_TEMPLATES): each query a different
    pair where there are enough (drawn with `generator`; the draws do not depend on the template), its
    `n_shots` examples other pairs of the same list. The corrupted prompt's answers are a permutation of
    the examples' answers that moves every one (a derangement), so no example is solved."""
    (name,) = check_template_names([template])
    written = ICL_TEMPLATES[name]
    n_prompts = check_count(n_prompts, "n_prompts")
    if n_shots < 2 or len(pairs) < n_shots + 1:
        raise ValueError(
            f"need n_shots >= 2 and more than n_shots pairs; got {n_shots} shots of {len(pairs)}"
        )
    queries = torch.cat(
        [torch.randperm(len(pairs), generator=generator) for _ in range(-(-n_prompts // len(pairs)))]
    )
    clean, corrupted, zero_shot, answers = [], [], [], []
    for query in queries[:n_prompts].tolist():
        others = [i for i in range(len(pairs)) if i != query]
        shots = [others[i] for i in torch.randperm(len(others), generator=generator)[:n_shots].tolist()]
        shift = 1 + int(
            torch.randint(n_shots - 1, (), generator=generator)
        )  # a cyclic shift moves every answer
        examples = [pairs[i] for i in shots]
        moved = [examples[(i + shift) % n_shots][1] for i in range(n_shots)]
        x, y = pairs[query]
        ask = written.ask(x)
        clean.append("".join(written.shot(*example) for example in examples) + ask)
        corrupted.append(
            "".join(written.shot(example[0], z) for example, z in zip(examples, moved, strict=True)) + ask
        )
        zero_shot.append(ask)
        answers.append(y)
    return FewShotPrompts(clean=clean, corrupted=corrupted, zero_shot=zero_shot, answers=answers)
