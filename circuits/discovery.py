"""Discovery strategies more than one analysis uses: the clean run read at END with the cache the heads'
evidence reads (`end_logits_and_cache`: IOI and retrieval), EAP's estimate of each sender's drop
(`eap_drops`) and the senders path-patched exactly after it (`exact_candidates`: IOI's `EAPRanking` and
retrieval's path patching)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

import interp
from interp import edges
from interp.interventions.engine import forward_logits
from interp.tasks.ioi_prompts import IOIPrompts
from interp.tasks.retrieval import RetrievalPrompts
from interp.types import Head


@torch.no_grad()
def end_logits_and_cache(
    model: interp.HookedTransformer, prompts: IOIPrompts | RetrievalPrompts
) -> tuple[Tensor, interp.ActivationCache]:
    """One run on `prompts`: logits [batch, pos, d_vocab] at END only (NaN elsewhere), and a cache of
    what the heads' evidence reads (attention patterns, z, scales, the final residual stream)."""
    final = interp.act_name("resid_post", model.cfg.n_layers - 1)
    names = [
        *model.layer_hook_names("pattern"),
        *model.head_contribution_hook_names(),
        interp.act_name("scale"),
        final,
    ]
    _, cache = model.run_with_cache(prompts.tokens.to(model.device), names_filter=names, return_type=None)
    end = prompts.positions["END"].to(model.device)
    return forward_logits(model, cache[final], end, start_at_layer=model.cfg.n_layers), cache


def eap_drops(
    model: interp.HookedTransformer, scores: edges.EdgeScores, senders: Sequence[Head], readers: Sequence[str]
) -> Tensor:
    """EAP's estimate of each sender's drop (logits): minus the sum of its edges' scores into `readers`
    (the graph's names: "logits", "a9.h6<q>", ...), [layer, head] (NaN: not a sender)."""
    graph = scores.graph
    columns = [graph.readers.index(name) for name in readers]
    estimate = torch.full((model.cfg.n_layers, model.cfg.n_heads), float("nan"))
    for layer, head in senders:
        estimate[layer, head] = -scores.scores[graph.writers.index(f"a{layer}.h{head}"), columns].sum()
    return estimate


def exact_candidates(
    estimate: Tensor, senders: Sequence[Head], n_exact: int, min_estimate: float
) -> list[Head]:
    """The senders to path-patch exactly, strongest estimate first: the `n_exact` EAP ranks first by
    |estimate| [layer, head] and every one whose |estimate| is at least `min_estimate` (logits). With
    min_estimate at most the selection's least effect, no head is ever selected on EAP's estimate."""
    ranked = sorted(senders, key=lambda head: -abs(float(estimate[head])))
    n_large = sum(abs(float(estimate[head])) >= min_estimate for head in senders)
    return ranked[: max(n_exact, n_large)]
