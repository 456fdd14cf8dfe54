"""Indirect object identification (IOI, Wang et al. 2022): every IOI prompt interp and circuits use.

`IOIPrompts` is the prompt type shared by the toy IOI task (token ids, for models we train:
`ToyIOITask`) and the text dataset of the paper for pretrained models (`make_ioi_dataset`).
`ioi_dataset_for(model, ...)` picks the one a model gets, by the task it was trained on
(`model.cfg.task == "ioi"`: the toy task's closed vocabulary; otherwise text prompts).

    clean, abc, swap = ioi_dataset_for(model, n_prompts=64, seed=0)            # discovery split
    heldout, heldout_abc, _ = ioi_dataset_for(model, 64, seed=0, split="heldout")
    clean.logit_diff(model(clean.tokens)).mean()  # logit(IO) - logit(S) at the last prompt token

Prompts look like "When Mary and John went to the store, John gave a drink to" (answer " Mary").
`abc` replaces IO, S1 and S2 by three other names (the paper's ABC distribution), `swap`
exchanges IO and S1; both keep the clean prompt's shape, positions and answer ids.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from interp.tasks.synthetic import Batch, Task, _as_generator, split_generator

IOI_POSITION_KEYS = ("IO", "S1", "S1+1", "S2", "END")
IOI_ORDERS = ("ABBA", "BABA")


@dataclass
class IOIPrompts:
    """A batch of IOI prompts ("When Mary and John went to the store, John gave a drink to" -> " Mary").

    tokens: [batch, pos] right-padded; the prompt ends at positions["END"], whose next token is the answer.
    io_token, s_token: [batch] ids of the indirect object (the answer) and the subject.
    positions: [batch] indices for "IO", "S1" (first S), "S1+1", "S2" (second S) and "END".
    template: [batch] template index; order: "ABBA" (IO first) or "BABA" (S first) per prompt.
    texts: the prompt strings (text IOI), or None.

    Corrupted prompts (`abc`, `swap`) keep the clean prompt's positions, io_token, s_token,
    template and order, so that "positions" name the clean roles and
    `logit_diff` measures the CLEAN answers logit(IO) - logit(S) on the corrupted run.
    """

    tokens: Tensor
    io_token: Tensor
    s_token: Tensor
    positions: dict[str, Tensor]
    template: Tensor
    order: list[str]
    texts: list[str] | None = None

    def __post_init__(self):
        batch = self.tokens.shape[0]
        if set(self.positions) != set(IOI_POSITION_KEYS):
            raise ValueError(
                f"positions needs exactly the keys {IOI_POSITION_KEYS}, got {sorted(self.positions)}"
            )
        per_prompt = [self.io_token, self.s_token, self.template, *self.positions.values()]
        if any(t.shape != (batch,) for t in per_prompt) or len(self.order) != batch:
            raise ValueError(
                f"io_token, s_token, template, positions and order must all have length batch={batch}"
            )
        if self.texts is not None and len(self.texts) != batch:
            raise ValueError(f"texts must have length batch={batch}, got {len(self.texts)}")
        if set(self.order) - set(IOI_ORDERS):
            raise ValueError(f"order entries must be in {IOI_ORDERS}, got {sorted(set(self.order))}")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def to(self, device: torch.device | str) -> IOIPrompts:
        return dataclasses.replace(
            self,
            tokens=self.tokens.to(device),
            io_token=self.io_token.to(device),
            s_token=self.s_token.to(device),
            positions={key: value.to(device) for key, value in self.positions.items()},
            template=self.template.to(device),
        )

    def __getitem__(self, index: int | slice | Sequence[int] | Tensor) -> IOIPrompts:
        """Subset of prompts (an int keeps the batch dimension); the pos dimension is unchanged."""
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        rows = torch.arange(len(self))[index.cpu() if isinstance(index, Tensor) else index]
        on_device = rows.to(self.tokens.device)
        return IOIPrompts(
            tokens=self.tokens[on_device],
            io_token=self.io_token[on_device],
            s_token=self.s_token[on_device],
            positions={key: value[on_device] for key, value in self.positions.items()},
            template=self.template[on_device],
            order=[self.order[i] for i in rows.tolist()],
            texts=None if self.texts is None else [self.texts[i] for i in rows.tolist()],
        )

    def length_groups(self) -> list[Tensor]:
        """Row indices [n] of the prompts of each length (END + 1), shortest first: a group cut to
        its length (`truncated`) computes no padding."""
        end = self.positions["END"].cpu()
        return [(end == value).nonzero()[:, 0] for value in end.unique().tolist()]

    def truncated(self, n_pos: int) -> IOIPrompts:
        """The first n_pos token positions (every prompt's END must lie before n_pos)."""
        if int(self.positions["END"].max()) >= n_pos:
            raise ValueError(
                f"a prompt ends at {int(self.positions['END'].max())}: keep more than {n_pos} positions"
            )
        return dataclasses.replace(self, tokens=self.tokens[:, :n_pos])

    def logit_diff(self, logits: Tensor) -> Tensor:
        """logit(IO) - logit(S) at END: logits [batch, pos, d_vocab] -> [batch]."""
        rows = torch.arange(len(self), device=logits.device)
        end_logits = logits[rows, self.positions["END"].to(logits.device)]  # [batch, d_vocab]
        return (
            end_logits[rows, self.io_token.to(logits.device)]
            - end_logits[rows, self.s_token.to(logits.device)]
        )

    def abc(
        self,
        name_tokens: Tensor | Sequence[int],
        generator: torch.Generator | int | None = None,
    ) -> IOIPrompts:
        """The paper's ABC distribution: IO, S1 and S2 replaced by three distinct random names.

        The new names come from `name_tokens` (the name token ids) and differ from the clean IO
        and S. Same shape and positions; io_token/s_token stay the clean answers; texts -> None.
        """
        names = torch.as_tensor(name_tokens, dtype=torch.long).cpu().unique()
        if names.numel() < 5:
            raise ValueError(
                f"abc needs at least 5 distinct name tokens (2 clean + 3 new), got {names.numel()}"
            )
        scores = torch.rand(len(self), names.numel(), generator=_as_generator(generator))  # [batch, n_names]
        clean_names = torch.stack([self.io_token, self.s_token], dim=1).cpu()  # [batch, 2]
        is_clean_name = (names[None, None] == clean_names[..., None]).any(1)  # [batch, n_names]
        new_names = names[scores.masked_fill(is_clean_name, -1.0).topk(3, dim=1).indices]  # [batch, 3]
        return self._with_names({"IO": new_names[:, 0], "S1": new_names[:, 1], "S2": new_names[:, 2]})

    def swap(self) -> IOIPrompts:
        """IO and S1 swapped ("When B and A ..., B gave ... to" for "When A and B ..."): the answer
        is still IO, but it now sits where S1 was. Same shape and positions; texts -> None."""
        rows = torch.arange(len(self))
        tokens = self.tokens.cpu()
        return self._with_names(
            {
                "IO": tokens[rows, self.positions["S1"].cpu()],
                "S1": tokens[rows, self.positions["IO"].cpu()],
            }
        )

    def _with_names(self, names: dict[str, Tensor]) -> IOIPrompts:
        tokens = self.tokens.clone()
        rows = torch.arange(len(self), device=tokens.device)
        for key, values in names.items():
            tokens[rows, self.positions[key]] = values.to(tokens.device)
        return dataclasses.replace(self, tokens=tokens, texts=None)


def ioi_prompt_template(template: str, order: str) -> str:
    """Turn a BABA-form IOI template into a prompt template with role slots.

    `template` names the subject [B] and the indirect object [A] in BABA order and ends with
    the answer, e.g. "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]".
    Returns the prompt without the answer, with [IO], [S1], [S2] slots in `order`:
    ABBA -> "Then, [IO] and [S1] went ... [S2] gave a [OBJECT] to".
    """
    if order not in IOI_ORDERS:
        raise ValueError(f"order must be one of {IOI_ORDERS}, got {order!r}")
    if template.count("[A]") != 2 or template.count("[B]") != 2 or not template.endswith("[A]"):
        raise ValueError(
            f"an IOI template needs [A] (the indirect object) twice, [B] (the subject) twice, "
            f"in BABA order, and must end with the answer [A]; got {template!r}"
        )
    prompt = template.removesuffix("[A]").rstrip()
    if prompt.index("[B]") > prompt.index("[A]"):
        raise ValueError(f"write IOI templates in BABA order ([B] before [A]); got {template!r}")
    first, second = ("[IO]", "[S1]") if order == "ABBA" else ("[S1]", "[IO]")
    prompt = prompt.replace("[B]", "\0", 1).replace("[A]", second, 1).replace("\0", first, 1)
    return prompt.replace("[B]", "[S2]", 1)


TOY_IOI_TEMPLATES = (
    "When [B] and [A] went to the [PLACE] , [B] gave a [OBJECT] to [A]",
    "Then , [B] and [A] went to the [PLACE] . [B] gave a [OBJECT] to [A]",
    "After [B] and [A] went to the [PLACE] , [B] gave it to [A]",
    "While [B] and [A] were at the [PLACE] , [B] handed the [OBJECT] over to [A]",
    "[B] and [A] met . [B] said hi to [A]",
)
TOY_IOI_NAMES = (
    "Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory", "Niaj",
    "Olivia", "Peggy", "Rupert", "Sybil", "Trent", "Uma", "Victor", "Walter", "Xena", "Yara", "Zoe", "Mary",
    "John", "Anna", "Paul", "Kate", "Mark", "Lucy", "Tom", "Rose",
)  # fmt: skip
TOY_IOI_SLOTS = ("[IO]", "[S1]", "[S2]", "[PLACE]", "[OBJECT]")
TOY_IOI_PLACES = ("store", "park", "school", "office", "garden", "station")
TOY_IOI_OBJECTS = ("drink", "book", "ring", "ball", "snack", "key")


class ToyIOITask(Task):
    """IOI as token ids for toy models: one token per word, names are single tokens.

    Vocabulary: "<pad>" (0), "<bos>" (1), template words, places, objects, then names.
    Training rows are [BOS] prompt answer [PAD...] with loss only on the answer
    (loss_mask is True at END). `prompts`/`make_dataset` give eval `IOIPrompts` without the answer.
    """

    pad, bos = 0, 1

    def __init__(self, n_names: int = 16, templates: Sequence[str] = TOY_IOI_TEMPLATES):
        if not 5 <= n_names <= len(TOY_IOI_NAMES):
            raise ValueError(
                f"n_names must be in [5, {len(TOY_IOI_NAMES)}] (ABC corruption needs 5), got {n_names}"
            )
        self.templates = {
            order: [ioi_prompt_template(t, order).split() for t in templates] for order in IOI_ORDERS
        }
        words = sorted({w for t in self.templates["BABA"] for w in t if w not in TOY_IOI_SLOTS})
        if any("[" in w or "]" in w for w in words):
            raise ValueError(
                f"toy templates separate words by spaces; slots are {TOY_IOI_SLOTS}, got words {words}"
            )
        names = TOY_IOI_NAMES[:n_names]
        self.vocab = ["<pad>", "<bos>", *words, *TOY_IOI_PLACES, *TOY_IOI_OBJECTS, *names]
        self.token_id = {word: i for i, word in enumerate(self.vocab)}
        self.name_tokens = torch.tensor([self.token_id[name] for name in names])
        self.d_vocab = len(self.vocab)
        self.n_ctx = 2 + max(len(t) for t in self.templates["BABA"])  # BOS + prompt + answer

    def decode(self, tokens: Sequence[int] | Tensor) -> str:
        """Words of the given ids, joined by spaces ("<bos> When Alice and ...")."""
        return " ".join(self.vocab[int(i)] for i in tokens)

    def prompts(
        self,
        n_prompts: int,
        generator: torch.Generator | int | None = None,
        templates: Sequence[int] | None = None,
        names: Tensor | None = None,
    ) -> IOIPrompts:
        """n_prompts random prompts [n, n_ctx - 1]; orders alternate ABBA, BABA, ...

        templates: indices of the templates to draw from (default all); names: name token ids to
        draw IO and S from (default all of `name_tokens`).
        """
        if n_prompts < 1:
            raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
        generator = _as_generator(generator)
        choices = torch.arange(len(self.templates["BABA"])) if templates is None else torch.tensor(templates)
        template = choices[torch.randint(len(choices), (n_prompts,), generator=generator)]
        names = self.name_tokens if names is None else names
        # Two distinct names per prompt: IO = names[first], S = names[second].
        name_scores = torch.rand(n_prompts, len(names), generator=generator)
        io_token, s_token = names[name_scores.topk(2, dim=1).indices].unbind(1)
        place = torch.randint(len(TOY_IOI_PLACES), (n_prompts,), generator=generator)
        obj = torch.randint(len(TOY_IOI_OBJECTS), (n_prompts,), generator=generator)
        order = [IOI_ORDERS[i % 2] for i in range(n_prompts)]
        tokens = torch.full((n_prompts, self.n_ctx - 1), self.pad)
        positions = {key: torch.empty(n_prompts, dtype=torch.long) for key in IOI_POSITION_KEYS}
        for i in range(n_prompts):
            fill = {
                "[IO]": io_token[i],
                "[S1]": s_token[i],
                "[S2]": s_token[i],
                "[PLACE]": self.token_id[TOY_IOI_PLACES[place[i]]],
                "[OBJECT]": self.token_id[TOY_IOI_OBJECTS[obj[i]]],
            }
            words = self.templates[order[i]][template[i]]
            row = [self.bos] + [int(fill[w]) if w in fill else self.token_id[w] for w in words]
            tokens[i, : len(row)] = torch.tensor(row)
            for key, slot in (("IO", "[IO]"), ("S1", "[S1]"), ("S2", "[S2]")):
                positions[key][i] = 1 + words.index(slot)
            positions["END"][i] = len(row) - 1
        positions["S1+1"] = positions["S1"] + 1
        clean = IOIPrompts(tokens, io_token, s_token, positions, template, order)
        return self._with_texts(clean)

    def make_dataset(
        self,
        n_prompts: int,
        seed: int = 0,
        split: str = "eval",
        templates: Sequence[int] | None = None,
        names: Tensor | None = None,
    ) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
        """(clean, abc, swap) prompts from the (seed, split) stream; see IOIPrompts.abc / swap.
        templates, names: as in `prompts`; ABC names come from the same names."""
        generator = split_generator(seed, split)
        clean = self.prompts(n_prompts, generator, templates, names)
        names = self.name_tokens if names is None else names
        return (
            clean,
            self._with_texts(clean.abc(names, generator)),
            self._with_texts(clean.swap()),
        )

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        prompts = self.prompts(batch_size, generator)
        rows = torch.arange(batch_size)
        end = prompts.positions["END"]
        tokens = torch.cat([prompts.tokens, torch.full((batch_size, 1), self.pad)], dim=1)
        tokens[rows, end + 1] = prompts.io_token
        loss_mask = torch.zeros(batch_size, self.n_ctx - 1, dtype=torch.bool)
        loss_mask[rows, end] = True
        return Batch(tokens, loss_mask)

    def _with_texts(self, prompts: IOIPrompts) -> IOIPrompts:
        texts = [
            self.decode(row[1 : end + 1])
            for row, end in zip(prompts.tokens, prompts.positions["END"].tolist(), strict=True)
        ]
        return dataclasses.replace(prompts, texts=texts)


# ---------------------------------------------------------------------------------------------
# The paper's text dataset, for pretrained models

# The paper's templates, in BABA order: [B] is the subject S, [A] the indirect object IO.
# ABBA versions swap the first [A] and [B].
BABA_TEMPLATES = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to [A]",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to [A]",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to [A]",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to [A]",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to [A]",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to [A]",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to [A]",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to [A]",
)
NAMES = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel",
    "David", "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin",
    "Sarah", "William", "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather",
    "Eric", "Elizabeth", "Adam", "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy",
    "Christina", "Kyle", "Rachel", "Laura", "Lauren", "Amber", "Brittany", "Danielle", "Richard",
    "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle", "Tiffany", "Jeremy", "Benjamin", "Mark",
    "Emily", "Aaron", "Charles", "Rebecca", "Jacob", "Stephen", "Patrick", "Sean", "Erin", "Jamie",
    "Kelly", "Samantha", "Nathan", "Sara", "Dustin", "Paul", "Angela", "Tyler", "Scott", "Katherine",
    "Andrea", "Gregory", "Erica", "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen",
    "Jose", "Alexander", "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine",
    "Alicia", "Cody", "Allison", "Bradley", "Samuel",
)  # fmt: skip
PLACES = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
OBJECTS = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")

# Held out: templates, names, places and objects that circuit discovery never sees; a circuit found
# on the paper's distribution is validated on these (`ioi_dataset_for(..., split="heldout")`).
HELDOUT_TEMPLATES = (
    "Later, [B] and [A] walked into the [PLACE]. [B] handed a [OBJECT] to [A]",
    "Yesterday [B] and [A] cleaned the [PLACE], and then [B] passed the [OBJECT] to [A]",
    "On Sunday [B] and [A] visited the [PLACE]. [B] brought a [OBJECT] for [A]",
    "At the [PLACE], [B] and [A] found a [OBJECT]. [B] showed it to [A]",
    "In the morning [B] and [A] drove to the [PLACE], where [B] sold a [OBJECT] to [A]",
    "Before [B] and [A] left the [PLACE], [B] offered a [OBJECT] to [A]",
    "Once [B] and [A] arrived at the [PLACE], [B] lent the [OBJECT] to [A]",
    "Last year [B] and [A] worked at the [PLACE]. One day [B] mailed a [OBJECT] to [A]",
    # Other shapes: names introduced mid-sentence, by a verb rather than "and", in a subordinate
    # clause, or far from the end; the answer follows "for" or "with" as well as "to".
    "The [PLACE] was quiet when [B] and [A] arrived, so [B] left the [OBJECT] with [A]",
    "Once upon a time [B] met [A] at the [PLACE], and after a long talk [B] gave the [OBJECT] to [A]",
    "Because [B] and [A] were hungry after a day at the [PLACE], [B] bought a [OBJECT] for [A]",
    "It was [B] who invited [A] to the [PLACE], and it was [B] who threw the [OBJECT] to [A]",
    "Both [B] and [A] liked the [OBJECT] from the [PLACE], but in the end [B] gave it to [A]",
    "In the evening [B] phoned [A] from the [PLACE]. An hour later, [B] brought a [OBJECT] to [A]",
)
HELDOUT_NAMES = (
    "George", "Edward", "Henry", "Peter", "Frank", "Alice", "Helen", "Anna", "Emma", "Oliver", "Jack",
    "Harry", "Charlie", "Lucy", "Grace", "Sophie", "Kate", "Tom", "Sam", "Ben", "Max", "Leo", "Ruth",
    "Carl", "Victor", "Oscar", "Simon", "Martin", "Louis", "Arthur", "Albert", "Walter", "Philip",
    "Roger", "Julia", "Diana", "Rose", "Lily", "Chloe", "Jane", "Susan", "Karen", "Nancy", "Linda",
    "Carol", "Maria", "Anne", "Joan", "Paula", "Frances",
)  # fmt: skip
HELDOUT_PLACES = ("library", "museum", "park", "beach", "market", "kitchen", "church", "airport")
HELDOUT_OBJECTS = ("book", "letter", "cake", "flower", "pen", "hat", "key", "bag")

_SLOT = re.compile(r"\[(IO|S1|S2|PLACE|OBJECT)\]")
_NAME_ROLES = ("IO", "S1", "S2")


def single_token_names(model: Any, names: Sequence[str] = NAMES) -> dict[str, int]:
    """{name: token id} for the names that are one token with a leading space (" Mary")."""
    name_tokens = {}
    for name in names:
        try:
            name_tokens[name] = model.to_single_token(" " + name)
        except ValueError:
            continue
    return name_tokens


def make_ioi_dataset(
    model: Any,
    n_prompts: int,
    seed: int = 0,
    templates: Sequence[str] | None = None,
    names: Sequence[str] = NAMES,
    places: Sequence[str] = PLACES,
    objects: Sequence[str] = OBJECTS,
    allow_duplicates: bool = False,
    balanced: bool = False,
) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
    """(clean, abc, swap) IOI prompts tokenized for `model` (CPU tensors; use `.to(device)`).

    model: needs `tokenizer`, `to_tokens(texts)` (its BOS policy is kept) and `to_single_token`.
    templates: BABA-form templates (default: the paper's 15, `BABA_TEMPLATES`); each is used
    in both orders. Orders alternate ABBA, BABA, ...; templates, names (IO != S), places and
    objects are drawn with a torch.Generator seeded by `seed`.
    names: candidate names; only those that are a single token with a leading space are used.
    places, objects: fillers for [PLACE] and [OBJECT] (any number of tokens).
    allow_duplicates: the clean prompts are distinct unless this is True; asking for more prompts
    than there are distinct ones raises (the message gives their number).
    balanced: templates take turns instead of being drawn (prompts 2k and 2k + 1, one per order, use
    template k mod len(templates)), so every (template, order) stratum holds the same number of
    prompts, +-1: what validation per template and order needs.
    """
    if n_prompts < 1:
        raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
    templates = BABA_TEMPLATES if templates is None else tuple(templates)
    if not places or not objects:
        raise ValueError("places and objects must each hold at least one word")
    if not templates:
        raise ValueError("templates is empty: pass at least one BABA-form template, or None for the paper's")
    prompt_templates = {order: [ioi_prompt_template(t, order) for t in templates] for order in IOI_ORDERS}
    for template in prompt_templates["BABA"]:
        if any(f" [{role}]" not in template for role in _NAME_ROLES):
            raise ValueError(f"names in IOI templates must follow a space (' [A]', ' [B]'); got {template!r}")
    if model.tokenizer is None:
        raise ValueError(
            "this model has no tokenizer, so text IOI prompts cannot be tokenized; models trained by "
            "`interp train --task ioi` get their prompts from ioi_dataset_for (ToyIOITask)"
        )
    name_tokens = single_token_names(model, names)
    if len(name_tokens) < 5:
        raise ValueError(
            f"only {len(name_tokens)} of {len(names)} names are single tokens with a leading space in this "
            f"tokenizer ({sorted(name_tokens)}); IOI needs at least 5 (IO, S and three ABC names). "
            "Pass more names."
        )
    name_list = list(name_tokens)
    name_of_token = {token: name for name, token in name_tokens.items()}

    generator = torch.Generator().manual_seed(seed)
    template = (
        torch.arange(n_prompts) // 2 % len(templates)
        if balanced
        else torch.randint(len(templates), (n_prompts,), generator=generator)
    )
    io_index, s_index = (
        torch.rand(n_prompts, len(name_list), generator=generator).topk(2, dim=1).indices.unbind(1)
    )
    place = torch.randint(len(places), (n_prompts,), generator=generator)
    obj = torch.randint(len(objects), (n_prompts,), generator=generator)
    order = [IOI_ORDERS[i % 2] for i in range(n_prompts)]
    if not allow_duplicates:
        _redraw_duplicates(
            n_prompts, order, prompt_templates, template, io_index, s_index, place, obj,
            len(name_list), places, objects, generator, redraw_template=not balanced,
        )  # fmt: skip
    fillers = [
        (prompt_templates[order[i]][template[i]], places[place[i]], objects[obj[i]]) for i in range(n_prompts)
    ]

    texts, slot_chars = [], []
    for i, (prompt_template, place_i, obj_i) in enumerate(fillers):
        io, s = name_list[io_index[i]], name_list[s_index[i]]
        text, chars = _render(prompt_template, {"IO": io, "S1": s, "S2": s}, place_i, obj_i)
        texts.append(text)
        slot_chars.append(chars)
    tokens, positions = _tokenize_with_positions(model, texts, slot_chars)
    io_token = torch.tensor([name_tokens[name_list[i]] for i in io_index])
    s_token = torch.tensor([name_tokens[name_list[i]] for i in s_index])
    for role, expected in (("IO", io_token), ("S1", s_token), ("S2", s_token)):
        found = tokens[torch.arange(n_prompts), positions[role]]
        if not torch.equal(found, expected):
            bad = int((found != expected).nonzero()[0])
            raise ValueError(
                f"{role} name in {texts[bad]!r} is not its single token in context "
                f"(found {model.tokenizer.decode([int(found[bad])])!r}); remove that name from `names`."
            )
    clean = IOIPrompts(tokens, io_token, s_token, positions, template, order, texts)

    def with_texts(prompts: IOIPrompts) -> IOIPrompts:
        rows = torch.arange(len(prompts))
        role_names = {role: prompts.tokens[rows, prompts.positions[role]].tolist() for role in _NAME_ROLES}
        texts = [
            _render(t, {role: name_of_token[role_names[role][i]] for role in _NAME_ROLES}, p, o)[0]
            for i, (t, p, o) in enumerate(fillers)
        ]
        return dataclasses.replace(prompts, texts=texts)

    abc = with_texts(clean.abc(list(name_tokens.values()), generator))
    return clean, abc, with_texts(clean.swap())


def _redraw_duplicates(
    n_prompts: int,
    order: Sequence[str],
    prompt_templates: dict[str, list[str]],
    template: Tensor,
    io_index: Tensor,
    s_index: Tensor,
    place: Tensor,
    obj: Tensor,
    n_names: int,
    places: Sequence[str],
    objects: Sequence[str],
    generator: torch.Generator,
    redraw_template: bool = True,
) -> None:
    """Redraw (in place, with `generator`) each prompt that repeats an earlier one (its template too
    unless `redraw_template` is False), so that the prompts are distinct; raise if there are fewer
    distinct prompts of an order than asked for."""
    n_distinct = {
        o: len(set(prompt_templates[o])) * n_names * (n_names - 1) * len(set(places)) * len(set(objects))
        for o in IOI_ORDERS
    }
    wanted = {o: sum(1 for x in order if x == o) for o in IOI_ORDERS}
    if any(wanted[o] > n_distinct[o] for o in IOI_ORDERS):
        total = sum(n_distinct[o] for o in IOI_ORDERS)
        raise ValueError(
            f"asked for {n_prompts} IOI prompts, but these templates, names, places and objects make only "
            f"{total} distinct prompts ({n_distinct['ABBA']} per order, and orders alternate); ask for at "
            f"most {2 * min(n_distinct.values())}, pass more templates, names, places or objects, or "
            "allow_duplicates=True"
        )

    def key(i: int) -> tuple:
        return (
            order[i],
            prompt_templates[order[i]][template[i]],
            int(io_index[i]),
            int(s_index[i]),
            places[place[i]],
            objects[obj[i]],
        )

    seen: set[tuple] = set()
    for i in range(n_prompts):
        while key(i) in seen:
            if redraw_template:
                template[i] = int(torch.randint(len(prompt_templates[order[i]]), (), generator=generator))
            io_index[i], s_index[i] = torch.randperm(n_names, generator=generator)[:2]
            place[i] = int(torch.randint(len(places), (), generator=generator))
            obj[i] = int(torch.randint(len(objects), (), generator=generator))
        seen.add(key(i))


def _render(prompt_template: str, names: dict[str, str], place: str, obj: str) -> tuple[str, dict[str, int]]:
    """Fill a role-slot template; also return the character index of each name's leading space."""
    fill = {**names, "PLACE": place, "OBJECT": obj}
    text, chars, end = "", {}, 0
    for match in _SLOT.finditer(prompt_template):
        text += prompt_template[end : match.start()]
        if match[1] in names:
            chars[match[1]] = len(text) - 1  # the space before the name
        text += fill[match[1]]
        end = match.end()
    return text + prompt_template[end:], chars


def _tokenize_with_positions(
    model: Any, texts: list[str], slot_chars: list[dict[str, int]]
) -> tuple[Tensor, dict[str, Tensor]]:
    """model.to_tokens(texts) [batch, pos] and the token index of IO, S1, S1+1, S2, END per prompt."""
    tokenizer = model.tokenizer
    bodies = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    n_ctx, longest = model.cfg.n_ctx, max(range(len(texts)), key=lambda i: len(bodies[i]))
    if len(bodies[longest]) + int(bool(model.cfg.default_prepend_bos)) > n_ctx:
        raise ValueError(
            f"the IOI prompt {texts[longest]!r} is {len(bodies[longest])} tokens long (plus BOS when the "
            f"model prepends one), longer than the model's context of {n_ctx}; pass shorter templates, "
            "places or objects"
        )
    tokens = model.to_tokens(texts).cpu()
    n_prefix = tokens.shape[1] - max(len(body) for body in bodies)  # BOS tokens prepended by the model
    for text, row, body in zip(texts, tokens, bodies, strict=True):
        if (
            n_prefix < 0
            or row[n_prefix : n_prefix + len(body)].tolist() != body
            or not torch.equal(row[:n_prefix], tokens[0, :n_prefix])
        ):
            raise ValueError(
                f"model.to_tokens({text!r}) is not [BOS tokens] + tokenizer(text) right-padded; "
                "the IOI dataset needs that layout to locate the names."
            )
    positions = {key: torch.empty(len(texts), dtype=torch.long) for key in IOI_POSITION_KEYS}
    for i, (text, chars) in enumerate(zip(texts, slot_chars, strict=True)):
        for role, char in chars.items():
            positions[role][i] = n_prefix + len(tokenizer(text[:char], add_special_tokens=False)["input_ids"])
        positions["END"][i] = n_prefix + len(bodies[i]) - 1
    positions["S1+1"] = positions["S1"] + 1
    return tokens, positions


# ---------------------------------------------------------------------------------------------
# The dataset a model gets

IOI_SPLITS = ("discovery", "heldout")
TOY_DISCOVERY_TEMPLATES = (0, 1, 2)  # ToyIOITask template indices; the others are held out


def trained_on_ioi(model: Any) -> bool:
    """Whether `model` was trained on the toy IOI task (`interp train --task ioi`): its vocabulary is
    the toy task's, so it gets ToyIOITask prompts rather than text."""
    return model.cfg.task == "ioi"


def heldout_description(model: Any) -> str:
    """What `ioi_dataset_for(model, ..., split="heldout")` holds, in words (for reports)."""
    if trained_on_ioi(model):
        return "held-out toy templates and names (not used by discovery)"
    return "held-out templates, names, places and objects (interp.tasks.ioi.HELDOUT_*)"


def ioi_dataset_for(
    model: Any, n_prompts: int, seed: int = 0, split: str = "discovery"
) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
    """(clean, abc, swap) IOI prompts for `model`, from the discovery or the held-out split.

    Text models: discovery uses the paper's templates, names, places and objects; heldout uses
    HELDOUT_TEMPLATES, HELDOUT_NAMES, HELDOUT_PLACES and HELDOUT_OBJECTS (disjoint from them), each
    held-out template in both orders equally often (`balanced`).
    A model trained on the toy IOI task (`model.cfg.task == "ioi"`; its vocabulary is closed): the
    toy task's eval prompts, discovery from templates TOY_DISCOVERY_TEMPLATES and the first half of
    the names, heldout from the other templates and names (`heldout_description` says which in words).
    """
    if split not in IOI_SPLITS:
        raise ValueError(f"split must be one of {IOI_SPLITS}, got {split!r}")
    if not trained_on_ioi(model):
        if split == "discovery":
            return make_ioi_dataset(model, n_prompts, seed)
        return make_ioi_dataset(
            model, n_prompts, seed, HELDOUT_TEMPLATES, HELDOUT_NAMES, HELDOUT_PLACES, HELDOUT_OBJECTS,
            balanced=True,
        )  # fmt: skip
    task = ToyIOITask()
    if task.d_vocab != model.cfg.d_vocab:
        raise ValueError(
            f"this model was trained on the toy IOI task but has d_vocab {model.cfg.d_vocab}, while "
            f"ToyIOITask() has {task.d_vocab} tokens: build its prompts with the ToyIOITask it was trained "
            "on and pass them to find_ioi_circuit(prompts=...)"
        )
    n_templates = len(task.templates["BABA"])
    half = len(task.name_tokens) // 2
    if split == "discovery":
        templates, names = TOY_DISCOVERY_TEMPLATES, task.name_tokens[:half]
    else:
        templates = [t for t in range(n_templates) if t not in TOY_DISCOVERY_TEMPLATES]
        names = task.name_tokens[half:]
    return task.make_dataset(n_prompts, seed, templates=templates, names=names)
