"""What `hop_report` finds, as data. Effects are in logits: the drop of the answer's logit minus the mean
logit of the other symbols (clean - ablated or patched; positive: the heads help)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jaxtyping import Float
from torch import Tensor

from circuits.evidence import ClassVerdict


@dataclass(kw_only=True)
class HopPath:
    """What carries hop j's result to hop j + 1's heads (path patching, held-out half): the senders
    output at the query their value on another sequence, every other head frozen, so the change travels
    only along `route` (the receivers' "q", "k" or "v", or "via L<a>[-L<b>]": every head between).
    effect: the drop with its CI; difference: minus the mean effect of `random_sets` (the senders'
    layers); `carries` when the difference's CI lies above 0."""

    from_hop: int
    to_hop: int
    senders: list[str]
    receivers: list[str]
    route: str  # "q", "k", "v" or "via L<a>[-L<b>]"
    effect: float
    effect_ci: tuple[float, float]
    random_sets: list[list[str]]
    random_effects: list[float]
    difference: float
    difference_ci: tuple[float, float]
    carries: bool


@dataclass(kw_only=True)
class HopResult:
    """`hop_report`'s result: the discovery half of the sequences chooses each hop's heads, the held-out
    half tests them (accuracy too is held out). lookups: hop j's lookup (to t_j, seen from the query) as
    a class "hop j": its heads chosen on the discovery half (attention to t_j - 1 or t_j >=
    `min_attention`, ablated alone a drop whose CI lies above 0), ablated together at the query on the
    held-out half against random same-layer sets; "confirmed" when the drop beyond random has its CI
    above 0 and their mean held-out attention is at least `min_attention`; "not found" when no head was
    chosen (NaN figures). details: "hop" (1..hops), "layers", "attention" (held out, one per head)."""

    model_name: str
    provenance: str
    hops: int
    n_sequences: int  # in all: half discovery, half held out
    seed: int
    min_attention: float
    accuracy: float  # held out: the answer is the top prediction at the query
    accuracy_ci: tuple[float, float]
    chance: float  # 1 / the symbols that can be the answer
    attention: Float[Tensor, "hops layer head"]  # held out: the query's attention to t_j - 1 or t_j
    discovery_change: Float[Tensor, "layer head"]  # each head ablated alone at the query
    lookups: list[ClassVerdict]  # one per hop, in order
    example_tokens: list[int]  # one held-out sequence, for the figure
    example_path: list[int]  # the query, then each hop's target in it
    paths: list[HopPath] = field(default_factory=list)  # hop j -> j + 1, for hops with heads in order

    def json_data(self) -> dict[str, Any]:
        """What `--format json` holds: every field, the model's name as "model"."""
        fields = dict(vars(self))
        return {"model": fields.pop("model_name"), **fields}
