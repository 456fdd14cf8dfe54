"""Indirect object identification (Wang et al. 2022) on pretrained models."""

from circuits.ioi.dataset import (
    BABA_TEMPLATES,
    NAMES,
    OBJECTS,
    PLACES,
    ioi_dataset_for,
    make_ioi_dataset,
    single_token_names,
)

__all__ = [
    "BABA_TEMPLATES",
    "NAMES",
    "OBJECTS",
    "PLACES",
    "ioi_dataset_for",
    "make_ioi_dataset",
    "single_token_names",
]
