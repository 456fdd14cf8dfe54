"""What `interp COMMAND --quick` runs, in words made from the sizes the run uses (never a fixed text):
the command says it on stderr before the long work, and the report's model line carries it.

    circuit_note(16, 16, prompts=(16, 64), mask_steps=(30, 45))
    # "quick preset: 16 prompt pairs find the circuit and 16 held-out ones test it, instead of 64 and
    #  64, CIs about 2.0x wider; the edge mask trained 30 steps instead of 45: a less faithful ..."

Each size is (with --quick, without it): the value the run uses and the one the same command would use
without --quick (an option given keeps its value, so it is the same). The CIs widen by
sqrt(without / with) of the prompts they are computed over.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Size = tuple[int, int]  # (with --quick, without it)


def _wider(size: Size) -> float:
    """How much wider a CI over `size[0]` samples is than over `size[1]`: sqrt(without / with)."""
    return math.sqrt(size[1] / size[0])


def _note(changes: Sequence[str], unchanged: Sequence[str] = ()) -> str:
    """ "quick preset: CHANGE; CHANGE (SAME, as without --quick)", or "quick preset: nothing smaller
    (SAME)" when nothing changed."""
    if not changes:
        return f"quick preset: nothing smaller ({'; '.join(unchanged)})"
    same = f" ({'; '.join(unchanged)}, as without --quick)" if unchanged else ""
    return "quick preset: " + "; ".join(changes) + same


def heads_note(samples: Size) -> str:
    """`interp heads --quick`: `samples` probe sequences per repeat length."""
    if samples[0] == samples[1]:
        return _note([], [f"{samples[0]} probe sequences per repeat length, as given"])
    changed = (
        f"{samples[0]} probe sequences per repeat length instead of {samples[1]}, standard errors "
        f"about {_wider(samples):.1f}x larger: fewer heads are confirmed by ablation"
    )
    return _note([changed])


def ioi_note(prompts: Size) -> str:
    """`interp ioi --quick`: `prompts` discovery prompts, and as many held out."""
    if prompts[0] == prompts[1]:
        return _note([], [f"{prompts[0]} prompts and {prompts[0]} held out, as given"])
    changed = (
        f"{prompts[0]} prompts (and {prompts[0]} held out) instead of {prompts[1]} (and {prompts[1]}), "
        f"CIs about {_wider(prompts):.1f}x wider: fewer classes are confirmed on held-out prompts"
    )
    return _note([changed])


def circuit_note(
    n_discovery: int, n_heldout: int, prompts: Size | None, mask_steps: Size | None, method: str = ""
) -> str:
    """`interp circuit --quick`: `n_discovery` prompt pairs found the circuit and `n_heldout` test it
    (the run's split); prompts: --n-prompts (each side's pairs) for a task that makes them (ioi,
    induction), None for a file's pairs (all used, whatever --n-prompts); mask_steps: the edge mask's
    training steps, None for a `method` that trains no mask."""
    changes, unchanged = [], []
    pairs = f"{n_discovery} prompt pairs find the circuit and {n_heldout} held-out ones test it"
    if prompts is None:
        unchanged.append(f"the file's pairs are all used: {pairs}")
    elif prompts[0] != prompts[1]:
        changes.append(
            f"{pairs}, instead of {prompts[1]} and {prompts[1]}, CIs about {_wider(prompts):.1f}x wider"
        )
    else:
        unchanged.append(pairs)
    if mask_steps is None:
        unchanged.append(f"{method} trains no edge mask")
    elif mask_steps[0] != mask_steps[1]:
        changes.append(
            f"the edge mask trained {mask_steps[0]} steps instead of {mask_steps[1]}: a less faithful "
            "circuit for its size"
        )
    else:
        unchanged.append(f"the edge mask trained {mask_steps[0]} steps")
    return _note(changes, unchanged)


def _documents(values: dict[str, int | None], split: type, default_documents: int) -> tuple[int, str]:
    """(the held-out documents, all of them in words) of `interp icl` with the options `values`
    (n_documents None: `default_documents`), split by `split` (`DocumentSplit`) as `icl_report` does."""
    documents = values["n_documents"] or default_documents
    discovery, ablated = split(values["n_discovery"], values["n_ablated"]).sizes(documents)
    heldout = documents - discovery
    text = f"{documents} documents ({discovery} rank the heads, {heldout} held out, {ablated} ablated)"
    return heldout, text


def icl_sizes_note(sizes: dict[str, Size], split: type, default_documents: int) -> str:
    """`interp icl --quick`'s note from its options' sizes (n_documents, n_discovery, n_ablated: (with
    --quick, without); n_documents None: `default_documents`), split by `split` (`DocumentSplit`)."""
    used, without = (
        _documents({name: size[side] for name, size in sizes.items()}, split, default_documents)
        for side in (0, 1)
    )
    if used == without:
        return _note([], [f"{used[1]}, as without --quick"])
    changed = (
        f"{used[1]} instead of {without[1]}, CIs about {_wider((used[0], without[0])):.1f}x wider: a "
        "headline or verdict whose CI includes 0 is not established"
    )
    return _note([changed])


RETRIEVAL_SIZES = {  # option -> what its number counts in `interp retrieval`
    "n_prompts": "discovery prompts",
    "n_heldout": "held-out prompts per fact count and template",
    "n_exact": "senders path-patched per step",
    "n_two_hop": "two-hop prompts per query form",
}


def retrieval_note(sizes: dict[str, Size]) -> str:
    """`interp retrieval --quick`: each option of RETRIEVAL_SIZES, (with --quick, without)."""
    changes = [
        f"{used} {RETRIEVAL_SIZES[name]} instead of {without}"
        for name, (used, without) in sizes.items()
        if used != without
    ]
    if not changes:
        return _note([], ["every size as given"])
    heldout = sizes["n_heldout"]
    cost = f"CIs about {_wider(heldout):.1f}x wider, " if heldout[0] != heldout[1] else ""
    return _note([", ".join(changes) + f": {cost}fewer heads found and confirmed"])
