"""What `icl_report` finds, as data: the ICL score, each head's contribution, classes against random
heads, and the score across a training run's checkpoints. Changes are ablated - clean, in nats."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from circuits.icl.score import ICLScore
from circuits.icl.sequences import Windows

VERDICTS = ("confirmed", "unconfirmed")


@dataclass(kw_only=True)
class HeadEffect:
    """One head ablated alone: its attributed change of the ICL score on the discovery documents, and
    the exact change on the held-out documents with a 95% bootstrap CI over them. "confirmed" when
    that CI lies above 0 (without the head, the model uses its context less on unseen documents)."""

    head: str  # "L20H1"
    layer: int
    index: int  # the head's index in its layer
    attributed: float
    exact: float
    exact_ci: tuple[float, float]
    verdict: str


@dataclass(kw_only=True)
class ClassEffect:
    """A class of heads ablated together on the held-out documents, against random sets of as many
    heads from the same layers (`random_sets`, none of the class's heads; from other layers where the
    class leaves too few in its own). `difference`: the class's
    change minus the random sets' mean change, per document, with a 95% bootstrap CI over documents;
    "confirmed" when that CI lies above 0, else "unconfirmed"."""

    name: str  # "induction"
    heads: list[str]
    found_by: str  # where the heads came from
    attributed: float  # the sum of its heads' attributed changes (discovery documents)
    change: float
    change_ci: tuple[float, float]
    random_sets: list[list[str]]
    random_same_layers: bool  # False where the class fills a layer: the rest come from other layers
    random_changes: list[float]  # each random set's mean change: the null distribution
    difference: float
    difference_ci: tuple[float, float]
    verdict: str


@dataclass(kw_only=True)
class TrainingCurve:
    """The ICL score (on the same sequences) and every head's induction score (`interp heads`'s
    `induction` column, scores only) at each saved step of a training run."""

    steps: list[int]
    scores: list[float]
    ci: list[tuple[float, float]]
    induction: pd.DataFrame  # step, layer, head, induction


@dataclass(kw_only=True)
class ICLResult:
    """`icl_report`'s result. Documents are split in two: the discovery half ranks every head by
    attribution; every claim (each top head's exact change, each class against random heads) is
    tested on the held-out half, which the ranking never saw."""

    model_name: str
    provenance: str
    source: str  # what the documents are
    windows: Windows
    ablation: str
    seed: int
    score: ICLScore  # every document
    discovery: ICLScore
    heldout: ICLScore
    discovery_names: list[str]
    heldout_names: list[str]
    loss_curve: Float[Tensor, " pos_minus_1"]  # mean loss of token t at [t - 1], every document
    loss_curve_se: Float[Tensor, " pos_minus_1"]  # its standard error over documents
    attributions: Float[Tensor, "layer head"]  # mean attributed change over the discovery documents
    heads: list[HeadEffect]
    classes: list[ClassEffect]
    training: TrainingCurve | None = None
    timings: dict[str, float] = field(default_factory=dict)
