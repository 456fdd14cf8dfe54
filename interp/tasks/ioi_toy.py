"""The toy IOI task: IOI prompts as token ids over a closed vocabulary, for training toy models."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from interp.tasks.ioi_prompts import IOI_POSITION_KEYS, IOIPrompts
from interp.tasks.ioi_templates import (
    IOI_ORDERS,
    TOY_IOI_NAMES,
    TOY_IOI_OBJECTS,
    TOY_IOI_PLACES,
    TOY_IOI_SLOTS,
    TOY_IOI_TEMPLATES,
    ioi_prompt_template,
)
from interp.tasks.synthetic import Batch, Task, _as_generator, split_generator


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
        balanced: bool = False,
    ) -> IOIPrompts:
        """n_prompts random prompts [n, n_ctx - 1]; orders alternate ABBA, BABA, ...

        templates: indices of the templates to draw from (default all); names: name token ids to
        draw IO and S from (default all of `name_tokens`).
        balanced: templates take turns as in `make_ioi_dataset(balanced=True)` (prompts 2k and 2k + 1,
        one per order, use templates[k mod len(templates)]), so every (template, order) stratum holds
        the same number of prompts +-1, and no two prompts are equal (each stratum's are drawn without
        replacement); raises when that many distinct prompts do not exist. Otherwise every prompt is
        drawn independently (the training stream), so prompts may repeat.
        """
        if n_prompts < 1:
            raise ValueError(f"n_prompts must be >= 1, got {n_prompts}")
        generator = _as_generator(generator)
        n_templates = len(self.templates["BABA"])
        choices = (
            torch.arange(n_templates) if templates is None else torch.as_tensor(templates, dtype=torch.long)
        )
        if choices.ndim != 1 or not len(choices) or not ((choices >= 0) & (choices < n_templates)).all():
            raise ValueError(f"templates must be indices of the {n_templates} templates, got {templates!r}")
        names = self.name_tokens if names is None else torch.as_tensor(names)
        if names.unique().numel() != names.numel():
            raise ValueError(f"names must be distinct token ids, got {names.tolist()}")
        if len(names) < 2 or not torch.isin(names, self.name_tokens).all():
            raise ValueError(
                f"names must be two or more of the task's name token ids ({self.name_tokens.tolist()}), got "
                f"{names.tolist()}"
            )
        order = [IOI_ORDERS[i % 2] for i in range(n_prompts)]
        if balanced:
            template = choices[torch.arange(n_prompts) // 2 % len(choices)]
            io_token, s_token, place, obj = self._distinct_fillers(template, choices, names, generator)
        else:
            template = choices[torch.randint(len(choices), (n_prompts,), generator=generator)]
            # Two distinct names per prompt: IO = names[first], S = names[second].
            name_scores = torch.rand(n_prompts, len(names), generator=generator)
            io_token, s_token = names[name_scores.topk(2, dim=1).indices].unbind(1)
            place = torch.randint(len(TOY_IOI_PLACES), (n_prompts,), generator=generator)
            obj = torch.randint(len(TOY_IOI_OBJECTS), (n_prompts,), generator=generator)
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

    def _distinct_fillers(
        self, template: Tensor, choices: Tensor, names: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """IO and S token ids, place and object indices [n] for balanced prompts (`template` [n] taking
        turns over `choices`, orders alternating): distinct prompts, drawn without replacement per
        (template, order) stratum from every filling of the slots its template has."""
        words = {int(t): self.templates["BABA"][t] for t in choices}
        if len({tuple(w) for w in words.values()}) < len(choices):
            raise ValueError(f"balanced prompts need distinct templates, got indices {choices.tolist()}")
        n_names, n_prompts = len(names), len(template)
        sizes = {  # (name pairs, places, objects) each template tells apart
            t: (
                n_names * (n_names - 1),
                len(TOY_IOI_PLACES) if "[PLACE]" in w else 1,
                len(TOY_IOI_OBJECTS) if "[OBJECT]" in w else 1,
            )
            for t, w in words.items()
        }
        n_distinct = {t: math.prod(size) for t, size in sizes.items()}
        # Template choices[k]'s (c + 1)-th ABBA prompt is prompt 2 (k + c len(choices)).
        most = {t: 2 * (k + n_distinct[t] * len(choices)) for k, t in enumerate(words)}
        limit = min(most, key=most.get)
        if n_prompts > most[limit]:
            raise ValueError(
                f"asked for {n_prompts} balanced toy IOI prompts, but template {limit} "
                f"({' '.join(words[limit])!r}) makes only {n_distinct[limit]} distinct prompts per order "
                f"from {n_names} names, so with templates taking turns at most {most[limit]} are distinct; "
                "ask for fewer, or pass more names or templates"
            )
        io_index, s_index, place, obj = (torch.zeros(n_prompts, dtype=torch.long) for _ in range(4))
        for t, (_, n_places, n_objects) in sizes.items():
            for parity in (0, 1):  # ABBA, BABA
                rows = ((template == t) & (torch.arange(n_prompts) % 2 == parity)).nonzero()[:, 0]
                drawn = torch.randperm(n_distinct[t], generator=generator)[: len(rows)]
                pair, rest = drawn // (n_places * n_objects), drawn % (n_places * n_objects)
                place[rows], obj[rows] = rest // n_objects, rest % n_objects
                io_index[rows], other = pair // (n_names - 1), pair % (n_names - 1)
                s_index[rows] = other + (other >= io_index[rows]).long()  # every name but IO
        return names[io_index], names[s_index], place, obj

    def make_dataset(
        self,
        n_prompts: int,
        seed: int = 0,
        split: str = "eval",
        templates: Sequence[int] | None = None,
        names: Tensor | None = None,
        balanced: bool = False,
    ) -> tuple[IOIPrompts, IOIPrompts, IOIPrompts]:
        """(clean, abc, swap) prompts from the (seed, split) stream; see IOIPrompts.abc / swap.
        templates, names, balanced: as in `prompts`; ABC names come from the same names."""
        generator = split_generator(seed, split)
        clean = self.prompts(n_prompts, generator, templates, names, balanced)
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
