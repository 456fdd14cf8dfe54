"""Types shared by every layer of interp (a leaf: imports nothing of interp).

Shapes: `batch` prompts, `pos` positions, `d_vocab` logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from jaxtyping import Int
from torch import Tensor

Pos = int | Sequence[int] | Int[Tensor, " batch"] | None
"""Positions: an int (the same for every prompt), a list of ints (several, for every prompt), a
LongTensor [batch] (one per prompt, e.g. each IOI prompt's END), or None. What None means is the
argument's documented default: the last position where one position is read (metrics, logit_pos),
every position where activations are selected (a patching `Site`)."""

Head = tuple[int, int]
"""(layer, head)."""

Ablation = Literal["zero", "mean", "resample", "counterfactual"]
"""What an ablated activation becomes (heads, MLPs, neurons and edges alike): zero; its mean over
reference prompts at each position; its value on a random reference prompt; its value on the
reference prompt paired with each input (the corrupted prompt of a clean/corrupted pair)."""
ABLATIONS: tuple[str, ...] = ("zero", "mean", "resample", "counterfactual")

Metric = Callable[..., Tensor]
"""metric(logits) -> [batch]: logits [batch, pos, d_vocab] -> one value per prompt. A metric with
per-prompt answers may also take rows [batch], the prompts' indices: metric(logits, rows)
(see `interp.interventions.metrics.for_rows`)."""

Progress = Callable[[int, int], None]
"""progress(done, total): called as long work advances (None: silent)."""

StageProgress = Callable[[str, int, int], None]
"""progress(stage, done, total): called as each stage of a long procedure advances (None: silent)."""


def head_label(layer: int, head: int) -> str:
    """A head as every report writes it: "L9H6" (TransformerLens's label; MLPs are "MLP9")."""
    return f"L{layer}H{head}"
