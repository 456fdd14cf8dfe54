"""Seeded tasks: synthetic token tasks for training and probing toy models (`synthetic`), and IOI
prompts for toy and pretrained models (`ioi`, `ioi_prompts`, `ioi_templates`, `ioi_toy`)."""

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
from interp.tasks.ioi_toy import ToyIOITask
from interp.tasks.synthetic import (
    SPLITS,
    Batch,
    HopTask,
    InductionTask,
    MarkovChainTask,
    PeriodicTask,
    Task,
    hop_targets,
    in_context_bigram_probs,
    repeated_sequence_masks,
    repeated_sequences,
    sample_markov_chains,
    split_generator,
)

__all__ = [
    "IOI_ORDERS", "IOI_POSITION_KEYS", "SPLITS", "TOY_IOI_NAMES", "TOY_IOI_OBJECTS", "TOY_IOI_PLACES",
    "TOY_IOI_SLOTS", "TOY_IOI_TEMPLATES", "Batch", "HopTask", "IOIPrompts", "InductionTask",
    "MarkovChainTask", "PeriodicTask", "Task", "ToyIOITask", "hop_targets", "in_context_bigram_probs",
    "ioi_prompt_template",
    "repeated_sequence_masks", "repeated_sequences", "sample_markov_chains", "split_generator",
]  # fmt: skip
