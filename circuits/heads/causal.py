"""Causal checks of induction and previous-token candidates, by mean ablation of a head's output z.

A head's z is replaced by its mean over the repeated probe's sequences at each position
(`interp.interventions.ablation`, method "mean"). Each effect is measured two ways, because heads back
each other up: alone, and with the other candidates of its type already ablated (the IOI paper's
minimality: what the head adds once its stand-ins are gone).

  induction        loss increase on the second copies of the repeated sequences (nats)
  previous_token   drop of the mean induction score of the later induction heads (a fraction of
                   attention), from the confirmed induction heads (all candidates if none is confirmed)

A candidate is confirmed if either way its effect exceeds CONFIRM_SE standard errors (over probe
sequences) and MIN_EFFECT (a significant but negligible effect confirms nothing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

import interp
from circuits.heads.probes import Probe, Probes
from circuits.heads.scores import HeadScores, StageProgress, pattern_scores, score_masks, stage_progress
from interp.interventions.ablation import ablation_hooks
from interp.model.cache import ActivationCache
from interp.types import Head, Progress

CAUSAL_TYPES = ("induction", "previous_token")  # types with ablation checks
CONFIRM_SE = 2.0  # a causal effect is confirmed when effect > CONFIRM_SE * standard error ...
MIN_EFFECT = {"induction": 0.02, "previous_token": 0.02}  # ... and at least this large (nats; score)

Effect = tuple[float, float]
"""(mean, standard error) over probe sequences."""


@dataclass
class CausalEffects:
    """Per candidate head: the effect of ablating it alone, and with the other candidates ablated
    (what it adds once its stand-ins are gone); and the effect of ablating all candidates."""

    alone: dict[Head, Effect]
    with_others_ablated: dict[Head, Effect]
    all_candidates: Effect
    min_effect: float  # an effect below this is negligible, however small its error

    def confirmed(self, head: Head) -> bool:
        """Either effect exceeds CONFIRM_SE standard errors and min_effect."""
        return any(
            effects[head][0] > max(CONFIRM_SE * effects[head][1], self.min_effect)
            for effects in (self.alone, self.with_others_ablated)
            if head in effects
        )


def _mean_ablation_hooks(
    model: interp.HookedTransformer, heads: Sequence[Head], cache: ActivationCache
) -> list:
    """Hooks replacing each head's z by its mean over the probe batch, per position (from `cache`)."""
    return ablation_hooks(model, heads=heads, method="mean", reference=cache)


def _mean_se(values: Float[Tensor, " batch"]) -> Effect:
    values = values.double()
    se = float(values.std() / math.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), se


def _candidate_effects(
    heads: Sequence[Head],
    measure: Callable[[Sequence[Head]], Float[Tensor, " batch"]],
    sign: int,
    min_effect: float,
    progress: Progress | None,
) -> CausalEffects:
    """measure(ablated heads) -> per-sequence measurement; an effect is sign * (measurement with the
    heads ablated - measurement without them), for each head alone, each head on top of the other
    candidates, and all candidates. Each set of heads is measured once; progress(sets done, sets)."""
    measured: dict[frozenset, Tensor] = {}

    def effect(ablated: Sequence[Head], baseline: Sequence[Head] = ()) -> Effect:
        for heads_ in (ablated, baseline):
            if frozenset(heads_) not in measured:
                measured[frozenset(heads_)] = measure(sorted(heads_))
        return _mean_se(sign * (measured[frozenset(ablated)] - measured[frozenset(baseline)]))

    total = 2 * len(heads) + 1
    if progress:
        progress(0, total)
    alone, with_others = {}, {}
    for head in heads:
        alone[head] = effect([head])
        if progress:
            progress(len(alone), total)
    for head in heads:
        others = [h for h in heads if h != head]
        with_others[head] = effect(heads, others) if others else alone[head]
        if progress:
            progress(len(heads) + len(with_others), total)
    group = effect(heads)
    if progress:
        progress(total, total)
    return CausalEffects(alone, with_others, group, min_effect)


@torch.inference_mode()
def induction_ablation_effects(
    model: interp.HookedTransformer, probe: Probe, heads: Sequence[Head], progress: Progress | None = None
) -> CausalEffects:
    """Loss increase on the second copies (nats) when candidate heads are mean-ablated: each alone,
    each with the other candidates ablated, all together."""
    tokens = probe.tokens.to(model.device)
    n_layers = model.cfg.n_layers
    layers = sorted({layer for layer, _ in heads})
    names = [interp.act_name(kind, layer) for layer in layers for kind in ("resid_pre", "z")]
    final = interp.act_name("resid_post", n_layers - 1)
    _, cache = model.run_with_cache(tokens, names_filter=names + [final], return_type=None)
    second = probe.second_copy_predictions().to(model.device)  # [batch, pos - 1]
    rows, pos = second.nonzero(as_tuple=True)  # predictions on the second copies
    targets = tokens[rows, pos + 1]

    def loss(ablated: Sequence[Head]) -> Float[Tensor, " batch"]:
        """Mean loss per sequence on its second copy (logits only where it is scored)."""
        resid = cache[final]
        if ablated:
            start = min(layer for layer, _ in ablated)
            with model.hooks(fwd_hooks=_mean_ablation_hooks(model, ablated, cache)):
                resid = model(cache["resid_pre", start], start_at_layer=start, stop_at_layer=n_layers)
        logits = model.unembed(model.ln_final(resid[rows, pos][:, None]))[:, 0]  # [n_scored, d_vocab]
        per_token = torch.zeros(second.shape, dtype=torch.float32, device=second.device)
        per_token[rows, pos] = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
        return (per_token.sum(-1) / second.sum(-1)).float().cpu()

    return _candidate_effects(heads, loss, 1, MIN_EFFECT["induction"], progress)


@torch.inference_mode()
def previous_token_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    heads: Sequence[Head],
    targets: Sequence[Head],
    progress: Progress | None = None,
) -> CausalEffects:
    """Drop in the mean induction score of the `targets` (induction heads) in layers after the
    earliest candidate when candidates are mean-ablated: each alone, each with the other candidates
    ablated, all together. Candidates in or after the last target's layer are not tested."""
    heads = [head for head in heads if any(lt > head[0] for lt, _ in targets)]
    start = min((layer for layer, _ in heads), default=0)
    later = [target for target in targets if target[0] > start]
    if not heads or not later:
        return CausalEffects({}, {}, (float("nan"), float("nan")), MIN_EFFECT["previous_token"])
    masks = {"induction": score_masks(probe.tokens, probe.lengths)["induction"]}
    target_layers = sorted({layer for layer, _ in later})
    names = [
        interp.act_name(kind, layer) for layer in sorted({h[0] for h in heads}) for kind in ("resid_pre", "z")
    ]
    names += [interp.act_name("pattern", layer) for layer in target_layers]
    _, cache = model.run_with_cache(probe.tokens.to(model.device), names_filter=names, return_type=None)

    def target_score(ablated: Sequence[Head]) -> Float[Tensor, " batch"]:
        """Mean induction score of the later targets with `ablated` mean-ablated."""
        patterns = {layer: cache["pattern", layer] for layer in target_layers}
        first = min((layer for layer, _ in ablated), default=max(target_layers) + 1)
        affected = [layer for layer in target_layers if layer > first]  # earlier ones stay clean
        if affected:
            with model.hooks(fwd_hooks=_mean_ablation_hooks(model, ablated, cache)):
                _, run = model.run_with_cache(
                    cache["resid_pre", first],
                    names_filter=[interp.act_name("pattern", layer) for layer in affected],
                    start_at_layer=first,
                    stop_at_layer=max(affected) + 1,
                )
            patterns.update({layer: run["pattern", layer] for layer in affected})
        per_target = [
            pattern_scores(patterns[lt][:, ht : ht + 1].float().cpu(), masks, probe.lengths)["induction"][
                :, 0
            ]
            for lt, ht in later
        ]
        return torch.stack(per_target).mean(0)

    return _candidate_effects(heads, target_score, -1, MIN_EFFECT["previous_token"], progress)


def causal_checks(
    model: interp.HookedTransformer,
    probes: Probes,
    scores: HeadScores,
    max_candidates: int = 12,
    progress: StageProgress | None = None,
) -> dict[str, CausalEffects]:
    """Stage 4 of `head_report`: mean-ablate up to `max_candidates` induction candidates (highest
    scores first), then as many previous-token candidates, on the repeated probe. {} when no head is
    an induction candidate."""
    induction = scores.candidates("induction", max_candidates)
    if not induction:
        return {}
    induction_effects = induction_ablation_effects(
        model, probes.repeated, induction, stage_progress(progress, "Ablating induction candidates")
    )
    confirmed = [head for head in induction if induction_effects.confirmed(head)]
    previous_token_effects = previous_token_ablation_effects(
        model,
        probes.repeated,
        scores.candidates("previous_token", max_candidates),
        confirmed or induction,
        stage_progress(progress, "Ablating previous-token candidates"),
    )
    return {"induction": induction_effects, "previous_token": previous_token_effects}
