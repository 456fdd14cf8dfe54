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


@dataclass(kw_only=True)
class Comparison:
    """A class of heads against random same-layer sets of as many heads (`random_sets`) on held-out
    prompts or documents: `value` the class's mean effect with a 95% bootstrap CI over them,
    `random_values` each random set's mean, `difference` the class's effect minus the random sets'
    mean, per prompt, with its CI. `expected` is the sign of an effect the claim needs ("+" or "-");
    "confirmed" when the difference's CI lies wholly on that side of 0, else "unconfirmed"."""

    name: str  # "FV heads: AIE on held-out prompts"
    unit: str  # "p(answer)", "accuracy", "nats"
    heads: list[str]
    random_sets: list[list[str]]
    expected: str  # "+" or "-"
    value: float
    value_ci: tuple[float, float]
    random_values: list[float]
    difference: float
    difference_ci: tuple[float, float]
    n: int  # prompts or documents
    verdict: str


@dataclass(kw_only=True)
class TaskVector:
    """One task's function vector tested on zero-shot prompts of held-out pairs: top-1 accuracy
    without it, with it, and with the summed mean outputs of random same-layer heads instead
    (the mean over the random sets), each with a 95% bootstrap CI over prompts; and few-shot
    accuracy on held-out prompts, for scale."""

    task: str
    description: str
    n_pairs: int  # single-token pairs (discovery + held-out)
    few_shot: float
    zero_shot: float
    zero_shot_ci: tuple[float, float]
    with_fv: float
    with_fv_ci: tuple[float, float]
    with_random: float
    with_random_ci: tuple[float, float]


@dataclass(kw_only=True)
class FunctionVectorResult:
    """`function_vector_report`'s result. The pairs of each task are split in two: discovery pairs
    rank every head by attributed AIE, then the candidates by exact AIE, give the mean outputs the
    function vectors sum and choose the layer they are added at; every claim is tested on prompts of
    the held-out pairs (and, for the ICL score, on Brown corpus documents)."""

    model_name: str
    provenance: str
    tasks: list[str]
    n_shots: int
    n_prompts: int  # per task and half
    seed: int
    aie_attributed: Float[Tensor, "layer head"]  # every head's AIE to first order (discovery, p(answer))
    aie_per_task: Float[Tensor, "task layer head"]  # the same per task
    candidates: list[str]  # the top heads by attributed AIE
    candidates_aie: list[float]  # their exact AIE (discovery prompts, mean over tasks)
    fv_heads: list[str]  # top candidates by exact AIE, strongest first
    fv_heads_heldout_aie: list[float]  # each alone, on held-out prompts
    induction_heads: list[str]
    induction_found_by: str
    overlap: list[str]  # heads in both classes
    fv_layer: int  # where the vector is added (best on discovery zero-shot prompts)
    layer_accuracy: list[float]  # discovery zero-shot accuracy with the FV added at each layer
    aie_test: Comparison  # FV heads patched together on held-out corrupted prompts vs random heads
    vector_test: Comparison  # FV vs random heads' vector, zero-shot accuracy, every task pooled
    task_vectors: list[TaskVector]
    ablations: list[Comparison]  # {FV, induction} heads x {few-shot accuracy, ICL score}
    n_documents: int
    timings: dict[str, float] = field(default_factory=dict)
