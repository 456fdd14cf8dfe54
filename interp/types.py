"""Types shared by every layer of interp (a leaf: imports nothing of interp).

Shapes: `batch` prompts, `pos` positions, `d_vocab` logits.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, TypeVar

import torch
from jaxtyping import Int
from torch import Tensor

Pos = int | Sequence[int] | Int[Tensor, " batch"] | None
"""Positions: an int (the same for every prompt), a list of ints (several, for every prompt), a
LongTensor [batch] (one per prompt, e.g. each IOI prompt's END), or None. What None means is the
argument's documented default: the last position where one position is read (metrics, logit_pos),
every position where activations are selected (a patching `Site`)."""

Head = tuple[int, int]
"""(layer, head)."""

AblationKind = Literal["zero", "mean", "resample", "counterfactual"]
"""What an ablated activation becomes (heads, MLPs, neurons and edges alike): zero; its mean over
reference prompts at each position; its value on a random reference prompt; its value on the
reference prompt paired with each input (the corrupted prompt of a clean/corrupted pair). An
ablation with its reference prompts is `interp.Ablation`."""
ABLATIONS: tuple[str, ...] = ("zero", "mean", "resample", "counterfactual")

Metric = Callable[..., Tensor]
"""metric(logits) -> [batch]: logits [batch, pos, d_vocab] -> one value per prompt. A metric with
per-prompt answers may also take rows [batch], the prompts' indices: metric(logits, rows)
(see `interp.interventions.metrics.for_rows`)."""

Progress = Callable[[str, int, int], None]
"""progress(stage, done, total): the one progress callback, called as long work advances: `done` of
the `total` units of the stage named `stage` ("Edge scores", "path patching: heads -> logits"; a
function with one stage reports under its own name). A stage without countable units reports
(stage, 0, 1) as it begins and (stage, 1, 1) as it ends; one with nothing to do, (stage, 0, 0).
A stage named "STAGE: detail" is part of STAGE (`substages`). None: silent. Library code never
prints: the `interp` command's progress printer shows bars on a terminal and lines in a log."""


def upcast(x: Tensor) -> Tensor:
    """`x` in float32 at least (bfloat16 and float16 become float32; float64 stays float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def as_stage(
    progress: Progress | None, stage: str, offset: int = 0, total: int | None = None
) -> Progress | None:
    """`progress` for a callee whose work is part of the caller's `stage`: the callee's reports, under
    whatever stage name, arrive as progress(stage, offset + done, total (default: the callee's))."""
    if progress is None:
        return None
    return lambda _, done, of: progress(stage, offset + done, of if total is None else total)


T = TypeVar("T")


def counted(items: Sequence[T], progress: Progress | None, stage: str) -> Iterator[T]:
    """Each of `items` in turn, reported as progress(stage, done, len(items)) before each and once more
    after the last (done = len(items)): a stage whose units are the items."""
    for done, item in enumerate(items):
        if progress is not None:
            progress(stage, done, len(items))
        yield item
    if progress is not None:
        progress(stage, len(items), len(items))


def substages(progress: Progress | None, stage: str) -> Progress | None:
    """`progress` for a callee whose stages are parts of the caller's `stage`: the callee's
    progress(sub, done, total) arrives as progress("stage: sub", done, total)."""
    if progress is None:
        return None
    return lambda sub, done, total: progress(f"{stage}: {sub}", done, total)


MemorySize = int | str
"""A memory budget: bytes (an int) or a string with a unit, "2GiB", "512MiB", "1.5GB"."""

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip


def memory_bytes(size: MemorySize) -> int:
    """A `MemorySize` in bytes; anything else (or a size below one byte) raises a ValueError."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", size) if isinstance(size, str) else None
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif match and match.group(2).lower() in _UNITS:
        value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    else:
        raise ValueError(
            f"memory size {size!r} is not a size: give bytes (an int) or a string like '2GiB' or '512MiB'."
        )
    if value < 1:
        raise ValueError(f"memory size {size!r} must be at least one byte; give e.g. '2GiB'.")
    return value


def head_label(layer: int, head: int) -> str:
    """A head as every report writes it: "L9H6" (TransformerLens's label; MLPs are "MLP9")."""
    return f"L{layer}H{head}"


def label_head(label: str) -> Head:
    """The head a report's label names: "L9H6" -> (9, 6) (`head_label`'s inverse)."""
    layer, head = label[1:].split("H")
    return int(layer), int(head)
