"""Word-pair tasks for in-context learning (Todd et al. 2024's "function vector" tasks, written out here).

    task = ICL_TASKS["antonym"]                        # ("hot", "cold"), ...
    pairs = single_token_pairs(model, task)            # those whose answer is one token of the model's
    discovery, heldout = split_pairs(pairs, seed=0)    # disjoint halves: find heads, then test them
    prompts = few_shot_prompts(discovery, 8, n_shots=5, generator=torch.Generator().manual_seed(0))

A few-shot prompt is Todd et al.'s template, `n_shots` solved pairs then the query:

    "Q: hot\\nA: cold\\n\\nQ: big\\nA: small\\n\\nQ: fast\\nA:"       -> the answer " slow"

and its corrupted twin has the same pairs with the answers shuffled among them (the query and its
answer unchanged), so the prompt shows the format but not the task. A zero-shot prompt is the query
alone ("Q: fast\\nA:").

Source and licence: the pairs below were written out for interp from common knowledge (English
antonyms, world capitals, English verb and noun inflection) and are distributed under interp's own
licence; no third-party word list was copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from interp.model.transformer import HookedTransformer

QUESTION, ANSWER, SEPARATOR = "Q:", "A:", "\n\n"


@dataclass(frozen=True)
class WordPairTask:
    """A task given by example pairs (input word, answer word)."""

    name: str
    description: str
    pairs: tuple[tuple[str, str], ...]


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


def single_token_pairs(model: HookedTransformer, task: WordPairTask) -> list[tuple[str, str]]:
    """The task's pairs whose answer, after a space (" cold"), is one token of the model's tokenizer:
    the token the model must predict after "A:" (a ValueError if the model has no tokenizer)."""
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


def _shot(x: str, y: str) -> str:
    return f"{QUESTION} {x}\n{ANSWER} {y}{SEPARATOR}"


def few_shot_prompts(
    pairs: Sequence[tuple[str, str]], n_prompts: int, n_shots: int, generator: torch.Generator
) -> FewShotPrompts:
    """`n_prompts` prompts from `pairs`: each query a different pair where there are enough (drawn
    with `generator`), its `n_shots` examples other pairs of the same list. The corrupted prompt's
    answers are a permutation of the examples' answers that moves every one (a derangement), so no
    example is solved."""
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
        ask = f"{QUESTION} {x}\n{ANSWER}"
        clean.append("".join(_shot(*example) for example in examples) + ask)
        corrupted.append(
            "".join(_shot(example[0], z) for example, z in zip(examples, moved, strict=True)) + ask
        )
        zero_shot.append(ask)
        answers.append(y)
    return FewShotPrompts(clean=clean, corrupted=corrupted, zero_shot=zero_shot, answers=answers)
