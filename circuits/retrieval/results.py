"""What `find_retrieval_circuit` finds, as data. Logit differences are logit(answer) minus the largest
other in-context candidate's logit (logits); accuracy is the fraction of prompts whose answer ranks
first among the candidates."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from circuits.evidence import EFFECT_SIGN, BeyondRandom, FamilySplit, StratumDrop

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
    """Accuracy on a set of prompts with a 95% bootstrap CI over prompts, and chance (the mean of
    1 / candidates)."""

    prompts: str
    n_prompts: int
    accuracy: float
    ci: tuple[float, float]
    chance: float
    logit_diff: float


@dataclass(kw_only=True)
class RetrievalHead:
    """A head discovery selected: its path-patching effect (the drop of the mean logit diff when its
    path is patched from the corrupted run, clean - patched, logits; positive: the path helps), its
    mean attention from END to the queried fact's name ("NAME"), its value ("VALUE") and the query's
    name ("QUERY"), its direct logit attribution to the logit diff, and its class (None: no matching
    attention pattern)."""

    head: str
    layer: int
    index: int
    sweep: str  # "logits" or "mover_queries"
    effect: float
    attention: dict[str, float]
    direct: float
    cls: str | None


@dataclass(kw_only=True)
class RetrievalClass:
    """A class mean-ablated against random sets of as many heads from the same layers (none of the
    class's), per prompt, with the sign of `circuits.evidence.EFFECT_SIGN` (drop = clean - ablated
    logit diff; positive: the heads help). discovery: on the discovery prompts that chose the heads;
    heldout: on the held-out relations, names, fact counts and templates, the figure reported.
    note: `held_out_note` (whether the effect shrinks held out). accuracy with the class and with the
    random sets ablated (held out). verdict (`circuits.evidence.judge_class`): "confirmed" when the
    held-out CI of `beyond` lies above 0 and `beyond` is positive in every stratum; "facts-dependent",
    "template-dependent" or "relation-dependent" when only the pooled CI does (the first kind of
    stratum where it is not positive in every one); else "unconfirmed"."""

    name: str
    heads: list[str]
    induction_overlap: list[str]  # its heads that `interp heads` confirms as induction heads
    discovery: BeyondRandom
    heldout: BeyondRandom
    note: str
    accuracy: float
    random_accuracy: float
    random_sets: list[list[str]]
    strata: list[StratumDrop]  # kind "facts", "template" or "relation"; holds: beyond > 0
    verdict: str


@dataclass(kw_only=True)
class RetrievalResult:
    """`find_retrieval_circuit`'s result. Discovery prompts (discovery relations, names, fact count
    and template) select and classify heads; every claim (each class against random heads, per
    stratum; the circuit's faithfulness) is tested on held-out prompts: other relations (the family,
    `relations`), other names, other fact counts, both templates (`templates`: split -> names)."""

    model_name: str
    provenance: str
    # how each head's direct logit attribution linearises the norms (interp.model.cache's
    # direct_attribution_linearisation); "" in results saved before it was recorded
    attribution: str = ""
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
    classes: list[RetrievalClass]
    faithfulness: float  # held-out, the circuit (every classified head) kept, the rest mean-ablated
    circuit_logit_diff: float
    model_logit_diff: float
    ablated_logit_diff: float
    circuit_accuracy: float
    timings: dict[str, float] = field(default_factory=dict)

    def json_data(self) -> dict[str, Any]:
        """What `--format json` holds (`circuits.sections.result_json`): every field, the model's name
        as "model", and the sign of the effects."""
        fields = dict(vars(self))
        return {"model": fields.pop("model_name"), **fields, "effect_sign": EFFECT_SIGN}

    def confirmed(self, verdicts: tuple[str, ...] = ("confirmed",)) -> list[str]:
        """The names of the classes with those verdicts."""
        return [c.name for c in self.classes if c.verdict in verdicts]
