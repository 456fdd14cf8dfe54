"""Indirect object identification (IOI) prompts: `IOIPrompts`, the prompt type shared by the toy
IOI task (token ids, for models we train) and the text IOI dataset built for pretrained models
(`circuits.ioi.dataset`), and the toy IOI task itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

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
