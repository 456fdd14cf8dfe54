"""What `icl_report` and `function_vector_report` find, as data: the ICL score, each head's contribution,
classes against random heads, the score across a training run's checkpoints, and function-vector heads.

Signs follow `circuits.evidence.EFFECT_SIGN` (positive: the heads help). A change of the ICL score is
ablated - clean, in nats: the drop of the context's benefit (-score) when the heads are ablated."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from circuits.evidence import BeyondRandom, FamilySplit, StratumDrop
from circuits.icl.score import ICLScore
from circuits.icl.sequences import Windows

VERDICTS = ("confirmed", "unconfirmed")
TEMPLATE_KINDS = ("held-out template", "discovery template")  # `Comparison.strata`'s kinds


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
    """`icl_report`'s result. Documents are the families: the discovery documents rank every head by
    attribution; every claim is tested on held-out documents, which the ranking never saw: the ICL
    score on every one of them (`heldout`: the headline), each top head's exact change and each class
    against random heads on the first `n_ablated` of them."""

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
    n_ablated: int | None = None  # held-out documents the ablations ran on (None: every one; older files)
    loss_curve: Float[Tensor, " pos_minus_1"]  # mean loss of token t at [t - 1], every document
    loss_curve_se: Float[Tensor, " pos_minus_1"]  # its standard error over documents
    attributions: Float[Tensor, "layer head"]  # mean attributed change over the discovery documents
    heads: list[HeadEffect]
    classes: list[ClassEffect]
    training: TrainingCurve | None = None
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(kw_only=True)
class Comparison:
    """A class of heads against random same-layer sets of as many heads (`random_sets`), measured on the
    discovery families that chose the heads and, apart, on held-out families that did not: held-out
    word-pair tasks in held-out prompt templates, or documents. Effects follow
    `circuits.evidence.EFFECT_SIGN`: positive, the heads help (an ablation's drop = clean - ablated; a
    patch's or a vector's gain = with - without). `heldout` and `discovery` are
    `circuits.evidence.BeyondRandom` (discovery None where the families played no part in the choice);
    `note` is `held_out_note`'s verdict on how the effect travels. `strata`: the effect beyond random on
    the held-out tasks in each template (kind "held-out template", the test, or "discovery template":
    held out by task only; holds: its CI lies above 0), none for documents. verdict: "confirmed" when
    the held-out effect beyond random has a CI above 0 and so has each held-out template's,
    "template-dependent" when the pooled CI is above 0 and some held-out template's but not every
    one's is, else "unconfirmed" (`circuits.evidence.class_verdict`, the one verdict)."""

    name: str  # "FV heads: AIE"
    unit: str  # "p(answer)", "accuracy", "nats"
    heads: list[str]
    random_sets: list[list[str]]
    random_values: list[float]  # each random set's mean effect on the held-out families
    discovery: BeyondRandom | None
    heldout: BeyondRandom
    strata: list[StratumDrop]
    verdict: str
    note: str


@dataclass(kw_only=True)
class TaskVector:
    """One task's function vector tested on zero-shot prompts of its query pairs: top-1 accuracy
    without it, with it, and with the summed mean outputs of random same-layer heads instead
    (the mean over the random sets), each with a 95% bootstrap CI over prompts; and few-shot
    accuracy on the same queries, for scale. `family`: "discovery" (the task chose the heads and the
    layer; measured in the discovery templates) or "held-out" (measured in the held-out templates)."""

    task: str
    description: str
    family: str
    n_pairs: int  # single-token pairs (demonstration + query halves)
    few_shot: float
    zero_shot: float
    zero_shot_ci: tuple[float, float]
    with_fv: float
    with_fv_ci: tuple[float, float]
    with_random: float
    with_random_ci: tuple[float, float]


@dataclass(kw_only=True)
class TemplateVector:
    """The held-out tasks' queries in one prompt template, pooled over those tasks: few-shot accuracy,
    and zero-shot accuracy without the function vector, with it and with random same-layer heads'
    vectors (the mean over the random sets), each with a 95% bootstrap CI over prompts. `family`:
    "discovery" (the template chose the heads and the layer, on the discovery tasks) or "held-out"."""

    template: str  # a name of interp.tasks.icl_tasks.ICL_TEMPLATES
    family: str
    n_prompts: int
    few_shot: float
    zero_shot: float
    zero_shot_ci: tuple[float, float]
    with_fv: float
    with_fv_ci: tuple[float, float]
    with_random: float
    with_random_ci: tuple[float, float]


@dataclass(kw_only=True)
class FunctionVectorResult:
    """`function_vector_report`'s result. The word-pair tasks and the prompt templates are the
    families: the discovery tasks (`split.discovery`) in the discovery templates
    (`template_split.discovery`) rank every head by attributed AIE, then the candidates by exact AIE,
    and choose the layer the vector is added at; every reported effect is measured on the held-out
    tasks in the held-out templates, beside the same measure on the discovery tasks in the discovery
    templates, and per template on the held-out tasks (`Comparison.strata`, `template_vectors`). Each
    task's pairs are halved: few-shot prompts of the demonstration half give the heads' mean outputs
    (and, on discovery tasks, the AIE), prompts of the query half, the same pairs in every template,
    are tested; the ICL score is measured on Brown corpus texts."""

    model_name: str
    provenance: str
    tasks: list[str]
    split: FamilySplit  # which tasks chose (discovery) and which tested (held-out)
    templates: list[str]  # names of interp.tasks.icl_tasks.ICL_TEMPLATES
    template_split: FamilySplit  # which templates chose (discovery) and which tested (held-out)
    n_shots: int
    n_prompts: int  # per task, template and half
    seed: int
    aie_attributed: Float[Tensor, "layer head"]  # every head's AIE to first order (discovery, p(answer))
    aie_per_task: Float[Tensor, "task layer head"]  # the same per discovery task (its discovery templates)
    candidates: list[str]  # the top heads by attributed AIE
    candidates_aie: list[float]  # their exact AIE (discovery tasks and templates, mean over tasks)
    fv_heads: list[str]  # top candidates by exact AIE, strongest first
    fv_heads_heldout_aie: list[float]  # each alone, on the held-out tasks' queries in held-out templates
    induction_heads: list[str]
    induction_found_by: str
    overlap: list[str]  # heads in both classes
    fv_layer: int  # where the vector is added: the best layer on the discovery tasks' queries
    layer_accuracy: list[float]  # discovery prompts' zero-shot accuracy with the FV added at each layer
    aie_test: Comparison  # FV heads patched together into shuffled-label prompts
    vector_test: Comparison  # zero-shot accuracy gained with the FV, against random heads' vectors
    task_vectors: list[TaskVector]  # discovery tasks, then held-out tasks (in the templates that test)
    template_vectors: list[TemplateVector]  # the held-out tasks in each template
    ablations: list[Comparison]  # {FV, induction} heads x {few-shot accuracy, ICL score}
    n_documents: int
    # what each head's mean output written to the residual stream is (interp.model.cache's
    # head_contribution_linearisation); "" in results saved before it was recorded
    written: str = ""
    timings: dict[str, float] = field(default_factory=dict)
