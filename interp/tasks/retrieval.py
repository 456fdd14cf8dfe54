"""Retrieval from context: facts stated in the prompt, then a query about one of them.

    The mother of Charlotte is Eve. The pet of John is dog. [...] The pet of John is  -> " dog"

Every fact reads "The {attribute} of {subject} is {value}." or, in the second template, "For
{subject}, the {attribute} is {value}." (`FACT_TEMPLATES`; one token each for the attribute, the
subject and the value, so every prompt of a fact count and template has one length). The query
repeats the queried fact's opening ("statement": "The pet of John is") or asks it ("question": "Question: What
is the pet of John? Answer:"). The candidates are the values stated in the prompt; the metric is
the answer's logit minus the largest other candidate's (logits), and a prompt is answered right
when that difference is positive (the answer ranks first among the candidates; chance: 1 / facts).

Two-hop prompts chain two relations ("The mother of John is Helen. The job of Helen is doctor. [...]
The job of the mother of John is" -> " doctor"); their candidates are the jobs stated.

Relations are the families a finding is held out by: `RELATIONS` holds them all, `HELDOUT_RELATIONS`
those held out by default, `DISCOVERY_RELATIONS` the rest. Subjects (the IOI names, the held-out
names), fact counts and templates come in a discovery and a held-out split too, so a circuit found
on one is tested on the other.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from interp.checks import check_count
from interp.tasks.ioi_templates import HELDOUT_NAMES, NAMES

# relation -> (its attribute word, its values); each attribute and value one token after a space.
# The relation is the family a finding is held out by (`circuits.evidence.split_families`).
RELATIONS = {
    "mother": ("mother", ("Eve", "Helen", "Alice", "Lucy", "Grace", "Rose", "Julia", "Kate", "Jane",
                          "Susan", "Linda", "Anna", "Emma", "Diana", "Ruth", "Nancy")),
    "job": ("job", ("doctor", "teacher", "lawyer", "farmer", "pilot", "nurse", "chef", "baker",
                    "writer", "singer", "driver", "painter", "dancer", "judge", "soldier", "banker")),
    "city": ("city", ("Paris", "London", "Berlin", "Rome", "Madrid", "Tokyo", "Boston", "Chicago",
                      "Dublin", "Vienna", "Moscow", "Cairo", "Sydney", "Toronto", "Denver", "Seattle")),
    "pet": ("pet", ("dog", "cat", "horse", "rabbit", "parrot", "snake", "mouse", "fish", "turtle",
                    "goat", "duck", "pig", "sheep", "frog", "bird", "fox")),
    "colour": ("colour", ("red", "blue", "green", "yellow", "black", "white", "purple", "orange",
                          "pink", "brown", "grey", "gold", "silver")),
    "sport": ("sport", ("tennis", "football", "golf", "hockey", "cricket", "rugby", "baseball",
                        "soccer", "boxing", "chess", "swimming", "running")),
    "drink": ("drink", ("coffee", "tea", "milk", "juice", "water", "beer", "wine", "soda",
                        "whisky", "vodka", "lemonade", "cocoa")),
    "food": ("food", ("pizza", "pasta", "bread", "rice", "soup", "cake", "cheese", "salad", "steak",
                      "bacon", "eggs", "beans", "pie", "curry", "sushi", "noodles")),
    "country": ("country", ("France", "Spain", "Italy", "Japan", "China", "India", "Brazil", "Mexico",
                            "Canada", "Egypt", "Kenya", "Peru", "Greece", "Norway", "Sweden", "Russia")),
    "instrument": ("instrument", ("piano", "guitar", "violin", "drum", "flute", "harp", "trumpet",
                                  "organ", "bass")),
    "language": ("language", ("English", "French", "German", "Spanish", "Italian", "Russian", "Chinese",
                              "Japanese", "Arabic", "Dutch", "Greek", "Hindi", "Polish", "Korean")),
    "month": ("month", ("January", "February", "March", "April", "May", "June", "July", "August",
                        "September", "October", "November", "December")),
    "metal": ("metal", ("gold", "silver", "iron", "copper", "steel", "tin", "lead", "zinc", "nickel",
                        "bronze", "brass", "aluminum")),
    "fruit": ("fruit", ("apple", "banana", "orange", "grape", "lemon", "mango", "peach", "pear",
                        "cherry", "plum", "kiwi", "lime")),
    "hobby": ("hobby", ("reading", "painting", "cooking", "fishing", "hiking", "dancing", "singing",
                        "swimming")),
}  # fmt: skip
# the relations held out by default: every other relation of RELATIONS is a discovery relation
HELDOUT_RELATIONS = ("colour", "sport", "drink", "food", "country", "instrument", "language", "month",
                     "metal", "fruit", "hobby")  # fmt: skip
DISCOVERY_RELATIONS = tuple(name for name in RELATIONS if name not in HELDOUT_RELATIONS)
# template -> one fact's sentence; the statement query is the sentence up to its value
FACT_TEMPLATES = {
    "of": "The {attribute} of {subject} is {value}.",
    "for": "For {subject}, the {attribute} is {value}.",
}
DISCOVERY_TEMPLATES = ("of",)
HELDOUT_TEMPLATES = ("of", "for")  # "for" is a template discovery never sees
QUERY_FORMS = ("statement", "question")
DISCOVERY_FACT_COUNTS = (4,)
HELDOUT_FACT_COUNTS = (2, 3, 6, 8)


def fact_text(attribute: str, subject: str, value: str, template: str = "of") -> str:
    return FACT_TEMPLATES[template].format(attribute=attribute, subject=subject, value=value)


def query_text(attribute: str, subject: str, form: str, template: str = "of") -> str:
    """The query about `subject`'s `attribute`; its next token is the answer."""
    if form == "statement":
        return FACT_TEMPLATES[template].split(" {value}")[0].format(attribute=attribute, subject=subject)
    return f"Question: What is the {attribute} of {subject}? Answer:"


@dataclass
class RetrievalPrompts:
    """A batch of retrieval prompts of one length (one fact count), no padding.

    tokens, corrupted: [batch, pos]; corrupted has the query's subject replaced by a name the prompt
      does not hold (nothing to retrieve), every other token the same.
    answer: [batch] the queried value's id. candidates: [batch, n_facts] every stated value's id,
      in the order stated (the answer among them at `queried`).
    positions: [batch] indices of "NAME" (the queried fact's subject), "VALUE" (its value), "QUERY"
      (the subject in the query) and "END" (the last token, whose next token is the answer).
    names, values: [batch, n_facts] the position of each fact's subject and value.
    relation: the relation of each prompt; n_facts, queried: per prompt; texts: the prompts;
    template: the facts' sentence (a key of FACT_TEMPLATES), one per batch (one length).
    """

    tokens: Tensor
    corrupted: Tensor
    answer: Tensor
    candidates: Tensor
    positions: dict[str, Tensor]
    names: Tensor
    values: Tensor
    queried: Tensor
    relation: list[str]
    texts: list[str]
    template: str = "of"

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_facts(self) -> int:
        return self.candidates.shape[1]

    def __getitem__(self, index: int | slice | Sequence[int] | Tensor) -> RetrievalPrompts:
        """The prompts `index` selects (rows; the batch dimension is kept, an int's too)."""
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        rows = torch.arange(len(self))[index.cpu() if isinstance(index, Tensor) else index]
        on = rows.to(self.tokens.device)
        tensors = {
            field.name: getattr(self, field.name)[on]
            for field in dataclasses.fields(self)
            if isinstance(getattr(self, field.name), Tensor)
        }
        return RetrievalPrompts(
            **tensors,
            positions={key: value[on] for key, value in self.positions.items()},
            relation=[self.relation[i] for i in rows.tolist()],
            texts=[self.texts[i] for i in rows.tolist()],
            template=self.template,
        )

    def to(self, device: torch.device | str) -> RetrievalPrompts:
        """The tokens on `device` (the metric's indices follow the logits' device)."""
        return dataclasses.replace(self, tokens=self.tokens.to(device), corrupted=self.corrupted.to(device))

    def candidate_logits(self, logits: Tensor, rows: Tensor | None = None) -> Tensor:
        """Each candidate's logit at END: logits [n, pos, d_vocab] of the prompts `rows` (default:
        all) -> [n, n_facts]."""
        rows = torch.arange(len(self)) if rows is None else rows.cpu()
        at = torch.arange(len(rows), device=logits.device)
        end = logits[at, self.positions["END"][rows].to(logits.device)]  # [n, d_vocab]
        return end.gather(1, self.candidates[rows].to(logits.device))

    def logit_diff(self, logits: Tensor, rows: Tensor | None = None) -> Tensor:
        """logit(answer) - the largest logit of the other candidates, at END: logits [n, pos, d_vocab]
        of the prompts `rows` (default: all; a sub-batch when the engine splits the batch) -> [n].
        Positive exactly when the answer ranks first among the candidates."""
        candidate = self.candidate_logits(logits, rows)
        queried = (self.queried if rows is None else self.queried[rows.cpu()]).to(logits.device)
        answer = candidate.gather(1, queried[:, None])[:, 0]
        others = candidate.scatter(1, queried[:, None], float("-inf"))
        return answer - others.max(1).values

    def correct(self, logits: Tensor, rows: Tensor | None = None) -> Tensor:
        """[n] bool: the answer ranks first among the candidates at END."""
        return self.logit_diff(logits, rows) > 0


def _single_tokens(model: Any, words: Sequence[str]) -> dict[str, int]:
    """{word: id} for the words that are one token after a space."""
    ids = {}
    for word in words:
        try:
            ids[word] = model.to_single_token(" " + word)
        except ValueError:
            continue
    return ids


def _relations(model: Any, relations: dict[str, tuple[str, tuple[str, ...]]], n_facts: int) -> dict:
    """relation -> (attribute, {value: id}) for the relations this tokenizer can state in one length."""
    usable = {}
    for relation, (attribute, values) in relations.items():
        ids = _single_tokens(model, values)
        if _single_tokens(model, [attribute]) and len(ids) >= n_facts:
            usable[relation] = (attribute, ids)
    if not usable:
        raise ValueError(
            f"none of the relations {', '.join(relations)} has a one-token attribute and {n_facts} one-token "
            "values in this model's tokenizer; retrieval prompts need a tokenizer with whole-word tokens"
        )
    return usable


def _slot_positions(model: Any, text: str, slots: Sequence[tuple[int, int]], ids: Sequence[int]) -> list[int]:
    """The token position of each slot (its character span in `text`), checked to hold its id."""
    positions = [model.to_tokens(text[:end], move_to_device=False).shape[1] - 1 for _, end in slots]
    tokens = model.to_tokens(text, move_to_device=False)[0]
    for position, token in zip(positions, ids, strict=True):
        if position >= len(tokens) or int(tokens[position]) != token:
            raise ValueError(f"{text!r}: a name or value is not its own single token in context")
    return positions


def _render(
    facts: Sequence[tuple[str, str, str]], query: str, template: str
) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
    """The prompt text and the character spans of each fact's subject and value (each with its
    leading space)."""
    parts, subjects, values, offset = [], [], [], 0
    for attribute, subject, value in facts:
        sentence = fact_text(attribute, subject, value, template)
        for spans, pattern, word in ((subjects, " {subject}", subject), (values, " {value}", value)):
            before = FACT_TEMPLATES[template].split(pattern)[0].format(attribute=attribute, subject=subject)
            spans.append((offset + len(before), offset + len(before) + 1 + len(word)))
        parts.append(sentence)
        offset += len(sentence) + 1
    return " ".join(parts) + "\n" + query, subjects, values


def _check_split(split: str) -> None:
    if split not in ("discovery", "heldout"):
        raise ValueError(f"split must be 'discovery' or 'heldout', got {split!r}")


def make_retrieval_prompts(
    model: Any,
    n_prompts: int,
    n_facts: int = 4,
    split: str = "discovery",
    seed: int = 0,
    query: str = "statement",
    relations: Sequence[str] | None = None,
    template: str = "of",
) -> RetrievalPrompts:
    """`n_prompts` retrieval prompts of `n_facts` facts (2-8) for `model`'s tokenizer, seeded.

    1. the arguments checked, the relations chosen (`_check_arguments`)
    2. the relations and subject names the tokenizer states in one token each (`_vocabulary`)
    3. each prompt's relation, subjects, values, queried fact and stranger drawn (`_draw_facts`)
    4. each prompt rendered and tokenized, clean and corrupted, its slots located (`_tokenize_prompt`)
    5. the prompts batched, one length (`_batch`)

    split: "discovery" (the IOI names as subjects; by default DISCOVERY_RELATIONS) or "heldout"
      (HELDOUT_NAMES; by default HELDOUT_RELATIONS). Each prompt states one relation about `n_facts`
      distinct subjects with distinct values; relations take turns, and the queried index shifts by
      one each round, so every relation is queried at every index.
    query: "statement" or "question" (see the module docstring).
    relations: the relations to use, any of RELATIONS (default: the split's that the tokenizer allows).
    template: the facts' sentence, a key of FACT_TEMPLATES ("of": "The pet of John is dog.", "for":
      "For John, the pet is dog."); the statement query follows it.
    """
    relations = _check_arguments(n_prompts, n_facts, split, query, relations, template)  # 1.
    usable, subjects = _vocabulary(model, relations, n_facts, split)  # 2.
    drawn = _draw_facts(n_prompts, n_facts, usable, sorted(subjects), seed)  # 3.
    prompts = [_tokenize_prompt(model, facts, subjects, usable, query, template) for facts in drawn]  # 4.
    return _batch(prompts, n_facts, template)  # 5.


def _check_arguments(
    n_prompts: int, n_facts: int, split: str, query: str, relations: Sequence[str] | None, template: str
) -> Sequence[str]:
    """1. The relations to use (default: the split's), every argument of make_retrieval_prompts
    checked."""
    _check_split(split)
    if query not in QUERY_FORMS:
        raise ValueError(f"query must be one of {', '.join(QUERY_FORMS)}, got {query!r}")
    if isinstance(n_facts, bool) or not isinstance(n_facts, int) or not 2 <= n_facts <= 8:
        raise ValueError(f"n_facts must be an int in 2..8 (facts per prompt), got {n_facts!r}")
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise ValueError(f"n_prompts must be an int >= 1, got {n_prompts!r}")
    if template not in FACT_TEMPLATES:
        raise ValueError(f"template must be one of {', '.join(FACT_TEMPLATES)}, got {template!r}")
    if relations is None:
        relations = DISCOVERY_RELATIONS if split == "discovery" else HELDOUT_RELATIONS
    unknown = sorted(set(relations) - set(RELATIONS))
    if unknown:
        raise ValueError(f"unknown relations {unknown}; choose from {', '.join(RELATIONS)}")
    return relations


def _vocabulary(
    model: Any, relations: Sequence[str], n_facts: int, split: str
) -> tuple[dict[str, tuple[str, dict[str, int]]], dict[str, int]]:
    """2. (relation -> (attribute, {value: id}) for the relations the tokenizer can state,
    {subject name: id} for the split's names that are one token and no relation's value, of either
    split: a held-out subject is never a discovery prompt's value, such as a mother's name)."""
    usable = _relations(model, {name: RELATIONS[name] for name in relations}, n_facts)
    taken = {value for _, values in RELATIONS.values() for value in values}
    subjects = {
        name: token
        for name, token in _single_tokens(model, NAMES if split == "discovery" else HELDOUT_NAMES).items()
        if name not in taken
    }
    if len(subjects) < n_facts + 1:
        raise ValueError(f"only {len(subjects)} one-token subject names; {n_facts + 1} needed")
    return usable, subjects


@dataclass
class _Facts:
    """One prompt's draw: its relation, its facts (attribute, subject, value) in the order stated,
    the queried fact's index, and a name stated in none of them (the corrupted query's subject)."""

    relation: str
    facts: list[tuple[str, str, str]]
    queried: int
    stranger: str


def _draw_facts(
    n_prompts: int, n_facts: int, usable: dict[str, tuple[str, dict[str, int]]], names: list[str], seed: int
) -> list[_Facts]:
    """3. Each prompt's facts, drawn with random.Random(seed): relations in turn (sorted), each relation's
    queried index moving on by one each round (every relation queried at every index in turn, and the
    relations of a round at different ones where there are as many indices); `n_facts` + 1 distinct
    `names` (the last one the stranger) and `n_facts` distinct values."""
    rng = random.Random(seed)
    order = sorted(usable)
    drawn = []
    for i in range(n_prompts):
        relation = order[i % len(order)]
        attribute, value_ids = usable[relation]
        chosen = rng.sample(names, n_facts + 1)
        people, stranger = chosen[:n_facts], chosen[n_facts]
        stated = rng.sample(sorted(value_ids), n_facts)
        queried = (i % len(order) + i // len(order)) % n_facts  # each relation's index moves on each round
        facts = [(attribute, person, value) for person, value in zip(people, stated, strict=True)]
        drawn.append(_Facts(relation=relation, facts=facts, queried=queried, stranger=stranger))
    return drawn


@dataclass
class _Prompt:
    """One prompt tokenized: tokens and corrupted [pos]; the answer's and every stated value's id;
    the positions of each fact's subject and value."""

    drawn: _Facts
    text: str
    tokens: Tensor
    corrupted: Tensor
    answer: int
    candidates: list[int]
    names: list[int]
    values: list[int]


def _tokenize_prompt(
    model: Any,
    drawn: _Facts,
    subjects: dict[str, int],
    usable: dict[str, tuple[str, dict[str, int]]],
    query: str,
    template: str,
) -> _Prompt:
    """4. The prompt of `drawn` and its corrupted form (the stranger queried) rendered and tokenized,
    each subject and value located; refuses a slot that is not its own token in context and a
    corrupted query more than one token away from the clean one."""
    attribute, value_ids = usable[drawn.relation]
    people = [person for _, person, _ in drawn.facts]
    stated = [value for _, _, value in drawn.facts]
    text, subject_spans, value_spans = _render(
        drawn.facts, query_text(attribute, people[drawn.queried], query, template), template
    )
    corrupted_text, _, _ = _render(
        drawn.facts, query_text(attribute, drawn.stranger, query, template), template
    )
    ids = [subjects[p] for p in people] + [value_ids[v] for v in stated]
    positions = _slot_positions(model, text, subject_spans + value_spans, ids)
    tokens = model.to_tokens(text, move_to_device=False)[0]
    corrupted = model.to_tokens(corrupted_text, move_to_device=False)[0]
    if corrupted.shape != tokens.shape or (corrupted != tokens).sum() != 1:
        raise ValueError(f"{corrupted_text!r}: the corrupted query is not one token away from the clean one")
    n_facts = len(drawn.facts)
    return _Prompt(
        drawn=drawn,
        text=text,
        tokens=tokens,
        corrupted=corrupted,
        answer=value_ids[stated[drawn.queried]],
        candidates=[value_ids[v] for v in stated],
        names=positions[:n_facts],
        values=positions[n_facts:],
    )


def _batch(prompts: list[_Prompt], n_facts: int, template: str) -> RetrievalPrompts:
    """5. The prompts as one batch; refuses prompts of more than one length."""
    lengths = {len(prompt.tokens) for prompt in prompts}
    if len(lengths) != 1:
        raise ValueError(
            f"prompts of {n_facts} facts tokenize to {sorted(lengths)} tokens; expected one length"
        )
    tokens = torch.stack([prompt.tokens for prompt in prompts])
    corrupted = torch.stack([prompt.corrupted for prompt in prompts])
    names_at = torch.tensor([prompt.names for prompt in prompts])
    values_at = torch.tensor([prompt.values for prompt in prompts])
    queried = torch.tensor([prompt.drawn.queried for prompt in prompts])
    batch = torch.arange(len(prompts))
    query_at = (tokens != corrupted).nonzero()[:, 1]
    return RetrievalPrompts(
        tokens=tokens,
        corrupted=corrupted,
        answer=torch.tensor([prompt.answer for prompt in prompts]),
        candidates=torch.tensor([prompt.candidates for prompt in prompts]),
        positions={
            "NAME": names_at[batch, queried],
            "VALUE": values_at[batch, queried],
            "QUERY": query_at,
            "END": torch.full((len(prompts),), tokens.shape[1] - 1),
        },
        names=names_at,
        values=values_at,
        queried=queried,
        relation=[prompt.drawn.relation for prompt in prompts],
        texts=[prompt.text for prompt in prompts],
        template=template,
    )


@dataclass
class TwoHopPrompts:
    """Two-hop prompts ("The mother of John is Helen. The job of Helen is doctor. [...] The job of
    the mother of John is" -> " doctor"), one length. tokens [batch, pos]; answer [batch]; candidates
    [batch, n_people] the jobs stated (the answer at `queried`); texts."""

    tokens: Tensor
    answer: Tensor
    candidates: Tensor
    queried: Tensor
    texts: list[str]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def logit_diff(self, logits: Tensor) -> Tensor:
        """logit(answer) - the largest other candidate's logit at the last position: [batch, pos,
        d_vocab] -> [batch]."""
        candidate = logits[:, -1].gather(1, self.candidates.to(logits.device))
        queried = self.queried.to(logits.device)
        answer = candidate[torch.arange(len(self), device=logits.device), queried]
        return answer - candidate.scatter(1, queried[:, None], float("-inf")).max(1).values


def make_two_hop_prompts(
    model: Any, n_prompts: int, n_people: int = 4, seed: int = 0, query: str = "statement"
) -> TwoHopPrompts:
    """`n_prompts` two-hop prompts: `n_people` subjects, each with a mother (a "mother" fact) who has a
    job (a "job" fact); the mothers' facts, then the jobs' facts, each group shuffled; the query asks
    the job of one subject's mother ("statement": "The job of the mother of John is", "question":
    "Question: What is the job of the mother of John? Answer:"). The queried subject takes each index
    in turn."""
    if query not in QUERY_FORMS:
        raise ValueError(f"query must be one of {', '.join(QUERY_FORMS)}, got {query!r}")
    n_prompts = check_count(n_prompts, "n_prompts")
    if isinstance(n_people, bool) or not isinstance(n_people, int) or not 2 <= n_people <= 8:
        raise ValueError(f"n_people must be an int in 2..8, got {n_people!r}")
    mothers = _single_tokens(model, RELATIONS["mother"][1])
    jobs = _single_tokens(model, RELATIONS["job"][1])
    subjects = sorted(set(_single_tokens(model, NAMES)) - set(mothers))
    if min(len(mothers), len(jobs), len(subjects)) < n_people:
        raise ValueError(f"this tokenizer has too few one-token names and jobs for {n_people} people")
    rng = random.Random(seed)
    tokens, answers, candidates, queried, texts = [], [], [], [], []
    for i in range(n_prompts):
        people = rng.sample(subjects, n_people)
        their_mothers = rng.sample(sorted(mothers), n_people)
        their_jobs = rng.sample(sorted(jobs), n_people)
        k = i % n_people
        mother_facts = [fact_text("mother", p, m) for p, m in zip(people, their_mothers, strict=True)]
        job_facts = [fact_text("job", m, j) for m, j in zip(their_mothers, their_jobs, strict=True)]
        rng.shuffle(mother_facts)
        rng.shuffle(job_facts)
        ask = (
            f"The job of the mother of {people[k]} is"
            if query == "statement"
            else f"Question: What is the job of the mother of {people[k]}? Answer:"
        )
        text = " ".join(mother_facts + job_facts) + "\n" + ask
        texts.append(text)
        tokens.append(model.to_tokens(text, move_to_device=False)[0])
        answers.append(jobs[their_jobs[k]])
        candidates.append([jobs[j] for j in their_jobs])
        queried.append(k)
    if len({len(t) for t in tokens}) != 1:
        raise ValueError("two-hop prompts tokenize to several lengths; expected one")
    return TwoHopPrompts(
        tokens=torch.stack(tokens),
        answer=torch.tensor(answers),
        candidates=torch.tensor(candidates),
        queried=torch.tensor(queried),
        texts=texts,
    )
