"""`IOIPrompts`: a batch of IOI prompts with the positions of their names, and its corruptions."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from interp.interventions.metrics import logit_diff
from interp.model.tokens import record_padding
from interp.tasks.ioi_templates import IOI_ORDERS
from interp.tasks.synthetic import _as_generator

IOI_POSITION_KEYS = ("IO", "S1", "S1+1", "S2", "END")


@dataclass
class IOIPrompts:
    """A batch of IOI prompts ("When Mary and John went to the store, John gave a drink to" -> " Mary").

    tokens: [batch, pos] right-padded, the padding recorded on them (`record_padding`: masked in runs and
      in means over the prompts); the prompt ends at positions["END"], whose next token is the answer.
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
        width, end = self.tokens.shape[1], self.positions["END"].to(self.tokens.device)
        if bool((end < width - 1).any()):  # the padding after END, recorded as `to_tokens` records it
            record_padding(self.tokens, (torch.arange(width, device=end.device) <= end[:, None]).long())

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

    @property
    def answers(self) -> Tensor:
        """[batch, 2]: the token ids `logit_diff` reads (IO, S), e.g. as a sweep's logit_tokens."""
        return torch.stack([self.io_token, self.s_token], dim=1)

    def logit_diff(self, logits: Tensor) -> Tensor:
        """logit(IO) - logit(S) at END (`metrics.logit_diff`): logits [batch, pos, d_vocab] -> [batch]."""
        device = logits.device
        return logit_diff(
            logits, self.io_token.to(device), self.s_token.to(device), self.positions["END"].to(device)
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
