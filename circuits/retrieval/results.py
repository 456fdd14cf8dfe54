"""What `find_retrieval_circuit` finds, as data. Logit diff: logit(answer) minus the largest other
in-context candidate's logit (logits); accuracy: the share of prompts whose answer ranks first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from circuits.evidence import EFFECT_SIGN, ClassVerdict, FamilySplit

RETRIEVAL_CLASSES = ("mover", "mention", "query")
CLASS_MEANINGS = {
    "mover": "attends END -> the queried value and writes it (the lookup's copy)",
    "mention": "attends END -> the earlier mention of the queried name",
    "query": "attends END -> the queried name in the query",
    "induction": "the induction heads `interp heads` confirms (tested as a class, not found here)",
}
VERDICTS = ("confirmed", "facts-dependent", "template-dependent", "relation-dependent", "unconfirmed")


@dataclass(kw_only=True)
class RetrievalAccuracy:
    """Accuracy on a set of prompts with its 95% bootstrap CI, and chance (the mean of 1 / candidates)."""

    prompts: str
    n_prompts: int
    accuracy: float
    ci: tuple[float, float]
    chance: float
    logit_diff: float


@dataclass(kw_only=True)
class RetrievalHead:
    """A head discovery selected: its path-patching drop (clean - patched, logits), its mean attention
    from END to the queried fact's name ("NAME"), value ("VALUE") and the query's name ("QUERY"), its
    direct logit attribution, its class (None: no matching attention pattern)."""

    head: str
    layer: int
    index: int
    sweep: str  # "logits" or "mover_queries"
    effect: float
    attention: dict[str, float]
    direct: float
    cls: str | None


@dataclass(kw_only=True)
class RetrievalResult:
    """`find_retrieval_circuit`'s result: heads chosen on discovery prompts, every claim tested on
    held-out relations (`relations`), names, fact counts and templates (`templates`: split -> names).
    classes: each class as `judge_class` judged it (drops; strata of kind "facts", "template",
    "relation"), its details: "induction_overlap" (its heads `interp heads` confirms as induction heads),
    "accuracy" and "random_accuracy" (held-out accuracy with the class, and with its random sets on
    average, mean-ablated)."""

    model_name: str
    provenance: str
    attribution: str = ""  # direct_attribution_linearisation; "" in results saved before it was recorded
    seed: int
    settings: dict[str, float | int | str]
    relations: FamilySplit
    templates: dict[str, list[str]]
    discovery: RetrievalAccuracy
    heldout: RetrievalAccuracy
    heldout_by_facts: list[RetrievalAccuracy]
    question: RetrievalAccuracy  # the query asked as a question (measured only)
    two_hop: list[RetrievalAccuracy]  # two-hop prompts, statement and question (measured only)
    effects: dict[str, Tensor]  # sweep -> [layer, head] path-patching drop, logits (NaN: not patched)
    heads: list[RetrievalHead]
    induction_heads: list[str]
    classes: list[ClassVerdict]
    faithfulness: float  # held-out, the circuit (every classified head) kept, the rest mean-ablated
    circuit_logit_diff: float
    model_logit_diff: float
    ablated_logit_diff: float
    circuit_accuracy: float
    timings: dict[str, float] = field(default_factory=dict)

    def json_data(self) -> dict[str, Any]:
        """What `--format json` holds: every field, the model's name as "model", the effects' sign."""
        fields = dict(vars(self))
        return {"model": fields.pop("model_name"), **fields, "effect_sign": EFFECT_SIGN}
