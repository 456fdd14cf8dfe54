"""The IOI circuit's classes, settings and result types. Every effect is a drop
(`circuits.evidence.EFFECT_SIGN`): path patching's relative to the clean logit diff logit(IO) - logit(S)
at END ((clean - patched) / clean; +0.3: the head's path lowers it by 30%, it helps), held-out
validation's when a class is mean-ablated; attention is a mean probability, logit diffs in logits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from circuits.evidence import ClassVerdict, StratumFaithfulness
from interp.interventions.stats import FaithfulnessSummary
from interp.types import Head, head_label

# Each class, in report order, and the attention it shows: (query position, key position) of IOI roles.
CLASS_ATTENTION = {
    "name_mover": ("END", "IO"), "negative_name_mover": ("END", "IO"), "s_inhibition": ("END", "S2"),
    "s_suppression": ("END", "S2"), "induction": ("S2", "S1+1"), "duplicate_token": ("S2", "S1"),
    "previous_token": ("S1+1", "S1"), "backup_name_mover": ("END", "IO"),
}  # fmt: skip
CLASSES = tuple(CLASS_ATTENTION)
CLASS_KIND = {cls: "->".join(pair) for cls, pair in CLASS_ATTENTION.items()}  # "name_mover" -> "END->IO"
ATTENTION_KINDS = {"->".join(pair): pair for pair in CLASS_ATTENTION.values()}  # "END->IO" -> ("END", "IO")
# How each class that writes to the logits must write: (logit, sign of its direct attribution).
CLASS_WRITES = {"name_mover": ("IO", 1), "backup_name_mover": ("IO", 1), "negative_name_mover": ("IO", -1),
                "s_suppression": ("S", -1)}  # fmt: skip


@dataclass(kw_only=True)
class Settings:
    """What the discovery was run with (all of it goes into the JSON report)."""

    model: str
    n_prompts: int
    seed: int
    provenance: str = ""  # interp.provenance(model): source, quantisation, parameters, dtype
    attribution: str = ""  # how direct logit attribution linearises the norms ("": saved before)
    corrupted: str = "ABC"
    n_patching_prompts: int = 16
    effect_z: float = 3.0
    min_effect: float = 0.02
    min_share: float = 0.1
    attention_z: float = 3.0
    min_attention: float = 0.1
    large_attention: float = 0.3
    n_bootstrap: int = 1000
    n_completeness_subsets: int = 10
    n_random_draws: int = 5  # random head sets per class in held-out validation
    exact_candidates: int = 16  # senders EAP ranks first that are path-patched (`EAPRanking`; 0: all)


@dataclass(kw_only=True)
class Baseline:
    """The model on the clean IOI prompts; *_ci are 95% bootstrap intervals over prompts."""

    logit_diff: float
    logit_diff_ci: tuple[float, float]
    accuracy: float  # fraction of prompts where logit(IO) > logit(S)
    accuracy_ci: tuple[float, float]
    top1_io: float  # fraction of prompts whose top prediction is IO
    abc_logit_diff: float  # the clean answers' logit diff on the ABC prompts
    n_prompts: int


@dataclass(kw_only=True)
class HeadEvidence:
    """One head in the circuit: why it was selected."""

    layer: int
    head: int
    effect: float  # relative drop of the logit diff when its path is patched from ABC (+: it helps)
    z: float  # robust z-score of `effect` among the step's senders
    step: str  # the path-patching sweep that found it
    attention: dict[str, float]  # mean attention for each of ATTENTION_KINDS
    direct_logit_attribution: dict[str, float]  # "IO", "S": mean direct effect on each logit at END

    @property
    def name(self) -> str:
        return head_label(self.layer, self.head)


@dataclass(kw_only=True)
class Evaluation:
    """The paper's section 4, with F(X) = mean logit diff when every head outside X is mean-ablated."""

    model_logit_diff: float  # F(model): no head ablated
    circuit_logit_diff: float  # F(circuit)
    ablated_logit_diff: float  # F(empty): every head mean-ablated
    faithfulness: float  # (F(circuit) - F(empty)) / (F(model) - F(empty)) (interp.interventions.stats)
    recovered: float  # F(circuit) / F(model), as Wang et al. report it
    faithfulness_with_unclassified: float | None  # the same with the unclassified heads kept too
    recovered_with_unclassified: float | None
    completeness: list[dict]  # per subset K: heads, circuit_logit_diff, model_logit_diff, gap
    completeness_max_gap: float  # max |F(C \ K) - F(M \ K)|, relative to F(model)
    minimality: dict[str, float]  # "L9H6" -> (F(C \ K) - F(C \ (K + v))) / F(C)


@dataclass(kw_only=True)
class Validation:
    """The circuit on held-out prompts the finder never used (see circuits.ioi.evaluate). Each class is
    judged by `circuits.evidence.judge_class` on drops (clean - mean-ablated logit diff, relative to the
    held-out one) against random same-layer heads, per name order ("ABBA": IO first, "BABA") and
    template ("T3"): "confirmed" (pooled, in both orders and most templates), "order-dependent",
    "template-dependent" or "unconfirmed" (also where a writer writes the wrong way or the model does
    not do IOI). Its details: "heterogeneity" (Cochran's Q over templates: "Q", "df", "p", "I2") and,
    for the classes that write to the logits, "writes" (mean direct logit attribution to "IO" and "S"
    at END on the held-out prompts, in logits)."""

    prompts: str  # what was held out
    n_prompts: int
    logit_diff: float  # unablated
    faithfulness: float  # as Evaluation.faithfulness, on the held-out prompts (NaN: undefined there)
    recovered: float  # F(circuit) / F(model) on the held-out prompts
    recovered_ci: tuple[float, float]  # 95% bootstrap over prompts
    classes: dict[str, ClassVerdict]  # non-empty classes only, by name (`validate_circuit`)
    faithfulness_summary: FaithfulnessSummary | None = None  # with its per-prompt error (None: saved before)
    faithfulness_strata: list[StratumFaithfulness] = field(default_factory=list)  # per order and template

    @property
    def unconfirmed(self) -> list[str]:
        return [name for name, found in self.classes.items() if found.verdict != "confirmed"]


@dataclass
class ExamplePatterns:
    """tokens: [pos] strings of one clean prompt; patterns: "L9H6" -> [query_pos, key_pos] attention."""

    tokens: list[str]
    patterns: dict[str, Tensor]


@dataclass(kw_only=True)
class IOICircuitResult:
    settings: Settings
    baseline: Baseline
    classes: dict[str, list[HeadEvidence]]  # class name -> heads, strongest effect first
    unclassified: list[HeadEvidence]  # causal outliers without the matching attention
    effects: dict[str, Tensor]  # sweep -> [layer, head] relative drops (NaN: not a sender)
    attention: dict[str, Tensor]  # kind -> [layer, head] mean attention on clean prompts
    thresholds: dict[str, dict[str, float]]  # sweep or attention kind -> threshold figures
    evaluation: Evaluation | None = None
    validation: Validation | None = None  # held-out confirmation of each class
    example: ExamplePatterns | None = None  # attention of the circuit's heads on one clean prompt
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

    @property
    def circuit(self) -> dict[str, list[Head]]:
        return {name: [(h.layer, h.head) for h in heads] for name, heads in self.classes.items()}

    @property
    def heads(self) -> list[Head]:
        return sorted({head for heads in self.circuit.values() for head in heads})

    def json_data(self) -> dict[str, Any]:
        """`--format json`: every field (the heads labelled), the circuit as [layer, head] pairs per
        class, the logit diff, faithfulness and share recovered."""
        evaluation = self.evaluation
        renamed = ("classes", "unclassified", "timings")
        return {
            **{name: value for name, value in vars(self).items() if name not in renamed},
            "logit_diff": self.baseline.logit_diff,
            "circuit": self.circuit,
            "heads": {name: [_labelled(h) for h in heads] for name, heads in self.classes.items()},
            "unclassified": [_labelled(h) for h in self.unclassified],
            "faithfulness": None if evaluation is None else evaluation.faithfulness,
            "recovered": None if evaluation is None else evaluation.recovered,
            "timings_s": self.timings,
        }


def _labelled(evidence: HeadEvidence) -> dict[str, Any]:
    return {**vars(evidence), "name": evidence.name}
