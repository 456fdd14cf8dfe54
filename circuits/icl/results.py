"""What `icl_report` and `function_vector_report` find, as data. Signs follow
`circuits.evidence.EFFECT_SIGN` (positive: the heads help); a change of the ICL score is ablated - clean,
in nats: the drop of the context's benefit (-score) when the heads are ablated."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from circuits.evidence import EFFECT_SIGN, ClassVerdict, FamilySplit
from circuits.icl.score import ICLScore
from circuits.icl.sequences import Windows
from interp.tasks.icl_tasks import ICL_TEMPLATES

LEGEND = (  # the ICL report's legend, in its JSON too
    "Change = ICL score with the head(s) ablated - without (nats): the drop of the context's benefit "
    "(-score), as circuits.evidence signs every effect; positive: without them the model uses its context "
    "less. Attributed: a first-order estimate on the discovery documents; exact: the "
    "ablated run on the held-out documents, which no head was chosen on; [95% bootstrap CI over documents]. "
    "A class is confirmed when its change exceeds that of random heads from the same layers (CI of the "
    "difference above 0); a head when its exact change is above 0."
)
FV_LEGEND = (  # the function-vector report's legend, in its JSON too
    "The word-pair tasks and the prompt templates are the families: the discovery tasks in the discovery "
    "templates choose the FV heads (AIE) and the layer the vector is added at; every effect is reported on "
    "the held-out tasks in the held-out templates, beside the same measure on the discovery tasks in the "
    "discovery templates, and per template on the held-out tasks (in a discovery template they are held "
    "out by task only). Each task's pairs are halved: few-shot prompts of one half give the heads' mean "
    "outputs (per task and template), prompts of the other, the same pairs in every template, are tested. "
    "AIE: p(answer) on a prompt whose examples' answers are "
    "shuffled, with the head's output at the last token set to its mean over clean few-shot prompts of the "
    "task, minus without (Todd et al. 2024); attributed: its first-order estimate for every head, exact for "
    "the top candidates. The function vector sums the FV heads' mean outputs as written to the residual "
    "stream (z @ W_O; on a post-norm model, through ln1_post at each prompt's scale) and is added to the "
    "residual stream at the last token of zero-shot prompts. Ablation: each head's z set to its mean over "
    "every position. Effects: "
    + EFFECT_SIGN
    + " (few-shot accuracy: clean - ablated; ICL score: ablated - clean nats, the context's benefit lost; "
    "patches and vectors: with - without). Each class against random heads from the same layers, paired "
    "by prompt (or Brown corpus text, for the ICL score): [95% bootstrap CI]; confirmed when the CI of the "
    "effect beyond random lies above 0 on the held-out tasks in the held-out templates and in each "
    "held-out template alone (template-dependent when the pooled CI is and a held-out template's is not)."
)
TEMPLATE_KINDS = ("held-out template", "discovery template")  # the kinds of the FV tests' strata


@dataclass(kw_only=True)
class HeadEffect:
    """One head ablated alone: its attributed change of the ICL score (discovery documents) and its exact
    change (held-out documents, 95% bootstrap CI); "confirmed" when that CI lies above 0."""

    head: str  # "L20H1"
    layer: int
    index: int  # the head's index in its layer
    attributed: float
    exact: float
    exact_ci: tuple[float, float]
    verdict: str


@dataclass(kw_only=True)
class TrainingCurve:
    """The ICL score and every head's induction score at each saved step of a training run."""

    steps: list[int]
    scores: list[float]
    ci: list[tuple[float, float]]
    induction: pd.DataFrame  # step, layer, head, induction


@dataclass(kw_only=True)
class ICLResult:
    """`icl_report`'s result: the discovery documents rank every head; the held-out ones test (`heldout`,
    the headline; the exact ablations on the first `n_ablated`)."""

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
    # on the ablated held-out documents; details: "found_by" (where the heads came from), "attributed"
    # (the sum of its heads' attributed changes, discovery documents), "random_same_layers" (False where
    # the class fills a layer: its random sets take heads from other layers too)
    classes: list[ClassVerdict]
    training: TrainingCurve | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def headline_verdict(self) -> str:
        """Whether the held-out score's CI lies below 0, and if not, how many documents would settle it."""
        tested = self.heldout
        low, high = tested.ci
        if high < 0:
            return f"established: its 95% CI over the {tested.n_documents} held-out documents lies below 0"
        if tested.score >= 0:
            return f"not established: no sign on these {tested.n_documents} held-out documents that it does"
        needed = math.ceil(1.5 * tested.n_documents * ((high - low) / 2 / -tested.score) ** 2)
        return (
            f"not established at {tested.n_documents} held-out documents (the CI reaches 0); about {needed} "
            f"would settle it: pass --n-documents {self.discovery.n_documents + needed} (n_documents)"
        )

    def loss_bins(self) -> list[tuple[str, float]]:
        """The mean loss per token in doubling ranges of tokens: ("1", 9.8), ("2-3", 5.0), ("4-7", ...)..."""
        curve = self.loss_curve
        bins, start = [], 1
        while start <= len(curve):
            end = min(2 * start - 1, len(curve))
            label = str(start) if start == end else f"{start}-{end}"
            bins.append((label, curve[start - 1 : end].mean().item()))
            start *= 2
        return bins

    def json_data(self) -> dict[str, Any]:
        """`--format json`: every field, the headline's verdict, `loss_bins`, the legend."""

        def score(found: ICLScore, **more: Any) -> dict[str, Any]:
            return {**vars(found), "n_documents": found.n_documents, **more}

        renamed = ("model_name", "source", "score", "discovery_names", "heldout_names", "n_ablated")
        training = self.training
        return {
            "model": self.model_name,
            "documents": self.source,
            **{name: value for name, value in vars(self).items() if name not in renamed},
            "icl_score": score(self.score),
            "discovery": score(self.discovery, documents=self.discovery_names),
            "heldout": score(
                self.heldout,
                documents=self.heldout_names,
                n_ablated=self.n_ablated,
                headline=self.headline_verdict(),
            ),
            "loss_by_token": dict(self.loss_bins()),
            "training": None
            if training is None
            else {"steps": training.steps, "icl_scores": training.scores, "ci": training.ci},
            "legend": LEGEND,
        }


@dataclass(kw_only=True)
class QueryAccuracy:
    """Queries' few-shot accuracy, and zero-shot accuracy without the vector, with it and with random
    same-layer heads' (mean over the sets), 95% CIs over prompts."""

    few_shot: float
    zero_shot: float
    zero_shot_ci: tuple[float, float]
    with_fv: float
    with_fv_ci: tuple[float, float]
    with_random: float
    with_random_ci: tuple[float, float]


@dataclass(kw_only=True)
class TaskVector(QueryAccuracy):
    """One task's queries in the templates that test it. `family`: "discovery" (in the discovery
    templates) or "held-out" (the held-out ones)."""

    task: str
    description: str
    family: str
    n_pairs: int  # single-token pairs (demonstration + query halves)


@dataclass(kw_only=True)
class TemplateVector(QueryAccuracy):
    """The held-out tasks' queries in one template; `family`: whether the template chose ("discovery")
    or tests ("held-out")."""

    template: str  # a name of interp.tasks.icl_tasks.ICL_TEMPLATES
    family: str
    n_prompts: int


@dataclass(kw_only=True)
class FunctionVectorResult:
    """`function_vector_report`'s result: the discovery tasks in the discovery templates choose the heads
    and the layer; every effect is measured on the held-out tasks in the held-out templates, beside
    discovery and per template (see `FV_LEGEND`)."""

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
    # each test of a class against random same-layer heads (`circuits.evidence.judge_class`), named by the
    # class and what it measures; details["unit"]: "p(answer)", "accuracy" or "nats"; its strata per
    # template on the held-out tasks (`TEMPLATE_KINDS`); verdict "template-dependent" where the pooled CI
    # lies above 0 and some held-out template's does not
    aie_test: ClassVerdict  # FV heads patched together into shuffled-label prompts
    vector_test: ClassVerdict  # zero-shot accuracy gained with the FV, against random heads' vectors
    task_vectors: list[TaskVector]  # discovery tasks, then held-out tasks (in the templates that test)
    template_vectors: list[TemplateVector]  # the held-out tasks in each template
    ablations: list[ClassVerdict]  # {FV, induction} heads x {few-shot accuracy, ICL score}
    n_documents: int
    # what each head's mean output written to the residual stream is (interp.model.cache's
    # head_contribution_linearisation); "" in results saved before it was recorded
    written: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def fv_head_figures(self) -> list[dict[str, Any]]:
        """Each FV head, strongest first: its attributed AIE, its exact AIE on the discovery tasks and
        alone on the held-out ones, and "induction" in `also` where it is an induction head too."""
        exact = dict(zip(self.candidates, self.candidates_aie, strict=True))
        rows = []
        for label, heldout in zip(self.fv_heads, self.fv_heads_heldout_aie, strict=True):
            layer, head = (int(part) for part in label[1:].split("H"))
            rows.append({
                "head": label, "aie_attributed": self.aie_attributed[layer, head].item(),
                "aie_discovery": exact[label], "aie_heldout": heldout,
                "also": "induction" if label in self.induction_heads else "",
            })  # fmt: skip
        return rows

    def json_data(self) -> dict[str, Any]:
        """`--format json`: every field, `fv_head_figures`, each family's tasks and templates, each
        template's pattern, the sign of the effects, the legend."""
        renamed = ("model_name", "fv_heads", "templates", "layer_accuracy")
        return {
            "model": self.model_name,
            **{name: value for name, value in vars(self).items() if name not in renamed},
            "discovery_tasks": self.split.discovery,
            "heldout_tasks": self.split.heldout,
            "templates": {name: ICL_TEMPLATES[name].pattern for name in self.templates},
            "discovery_templates": self.template_split.discovery,
            "heldout_templates": self.template_split.heldout,
            "effect_sign": EFFECT_SIGN,
            "fv_heads": self.fv_head_figures(),
            "layer_accuracy_discovery": self.layer_accuracy,
            "legend": FV_LEGEND,
        }
