"""What `hop_report` finds, as data: the model's accuracy on the k-hop task and, for each hop, the heads
that make its induction lookup, tested on held-out sequences. Effects are in logits: the drop of the
answer's logit minus the mean logit of the other symbols when heads are mean-ablated (clean - ablated)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jaxtyping import Float
from torch import Tensor

VERDICTS = ("confirmed", "unconfirmed", "not found")


@dataclass(kw_only=True)
class HopLookup:
    """Hop j's lookup: to the token after the last earlier occurrence of the token the previous hop
    reached (the query's own token for hop 1), t_j, seen from the query.

    heads: the heads chosen on the discovery sequences: the query's attention to hop j's occurrence
    or target (t_j - 1 or t_j) of at least `min_attention` there, and a mean ablation at the query
    (that head's output only there) that lowers the answer's logit difference, with a 95% bootstrap
    CI above 0. On the held-out sequences: their mean attention, the change when they are ablated
    together at the query, and that change minus the mean change of `random_sets` (as many heads of
    the same layers, ablated there too) with its CI; "confirmed" when that CI lies above 0 and the
    heads' mean held-out attention is at least `min_attention` too."""

    hop: int  # 1..hops
    heads: list[str]
    layers: list[int]
    attention: list[float]  # held-out, one per head
    change: float
    change_ci: tuple[float, float]
    random_sets: list[list[str]]
    random_changes: list[float]
    difference: float
    difference_ci: tuple[float, float]
    verdict: str


@dataclass(kw_only=True)
class HopPath:
    """What carries hop j's result to hop j + 1's heads, by path patching on the held-out sequences.

    The senders (hop j's heads) output, at the query only, their value on another held-out sequence
    (each sequence's hop j lands elsewhere); every other head is frozen to the clean run, so the
    change travels only along `route`: into the receivers' (hop j + 1's heads) query, key or value
    input ("q", "k", "v"), or into every head of the layers between the two hops ("via L1"), whose
    outputs then reach everything after them. Effect: the drop of the answer's logit minus the other
    symbols' mean logit (clean - patched, logits) with its 95% bootstrap CI; `difference`: that minus
    the mean effect of `random_sets` (as many heads of the senders' layers, patched the same way);
    `carries` when the difference's CI lies above 0."""

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
    """`hop_report`'s result. The task's sequences are split in two: the discovery half chooses each
    hop's heads, the held-out half tests them (accuracy too is held out)."""

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
    lookups: list[HopLookup]
    example_tokens: list[int]  # one held-out sequence, for the figure
    example_path: list[int]  # the query, then each hop's target in it
    paths: list[HopPath] = field(default_factory=list)  # hop j -> j + 1, for hops with heads in order

    def json_data(self) -> dict[str, Any]:
        """What `--format json` holds (`circuits.sections.result_json`): every field, the model's name
        as "model"."""
        fields = dict(vars(self))
        return {"model": fields.pop("model_name"), **fields}

    def lookup_layers(self) -> list[list[int]]:
        """For each hop, the layers of its confirmed heads (empty where none is confirmed)."""
        return [lookup.layers if lookup.verdict == "confirmed" else [] for lookup in self.lookups]
