"""Seeded tasks: synthetic token tasks for training and probing toy models (`synthetic`), IOI prompts
for toy and pretrained models (`ioi`, `ioi_prompts`, `ioi_templates`, `ioi_toy`), and a user's
prompt-pair files (`pairs`, read without torch). Each public name is imported on first use, so reading
a pairs file does not import torch."""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    **dict.fromkeys(["IOI_POSITION_KEYS", "IOIPrompts"], "interp.tasks.ioi_prompts"),
    **dict.fromkeys(
        ["IOI_ORDERS", "TOY_IOI_NAMES", "TOY_IOI_OBJECTS", "TOY_IOI_PLACES", "TOY_IOI_SLOTS",
         "TOY_IOI_TEMPLATES", "ioi_prompt_template"],
        "interp.tasks.ioi_templates",
    ),
    "ToyIOITask": "interp.tasks.ioi_toy",
    **dict.fromkeys(
        ["SPLITS", "Batch", "HopTask", "InductionTask", "MarkovChainTask", "PeriodicTask", "Task",
         "hop_targets", "in_context_bigram_probs", "repeated_sequence_masks", "repeated_sequences",
         "sample_markov_chains", "split_generator"],
        "interp.tasks.synthetic",
    ),
    **dict.fromkeys(["check_pairs", "read_pairs"], "interp.tasks.pairs"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    """A public name of interp.tasks, imported on first use."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'interp.tasks' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


__all__ = list(_PUBLIC)
