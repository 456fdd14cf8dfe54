"""`head_report`: probes -> scores -> weight evidence -> causal checks -> classification.

The scores choose the candidates on the discovery token family's probes; the causal checks test them
on the held-out family's (`probes.TOKEN_FAMILIES`): `confirmed_induction` follows the same rule."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import interp
from circuits.heads.causal import (
    CAUSAL_TYPES,
    CLEAN_RUN_STAGE,
    FUTILITY_ERROR,
    FUTILITY_SE,
    INDUCTION_STAGE,
    MIN_EFFECT,
    N_RANDOM,
    PREVIOUS_TOKEN_STAGE,
    CausalEffects,
    ablated_layers,
    causal_checks,
    clean_run,
    induction_ablation_effects,
    random_head_classes,
    typed_heads,
    with_held_out_scores,
)
from circuits.heads.classify import HeadReport, classify
from circuits.heads.probes import (
    FAMILY_NAMES,
    HELD_OUT_SEED_OFFSET,
    Probes,
    make_probes,
)
from circuits.heads.scores import (
    N_BOOTSTRAP,
    SCORES_STAGE,
    HeadScores,
    mask_score_columns,
    mask_scores,
    probe_patterns,
    score_heads,
    score_thresholds,
)
from circuits.heads.weights import weight_scores
from circuits.stages import StageResults
from interp.checks import check_finite_weights
from interp.types import Head, Progress, head_label

KEPT_STAGES = (SCORES_STAGE, INDUCTION_STAGE, PREVIOUS_TOKEN_STAGE)  # what head_report reports and keeps
BETWEEN_STAGES = (CLEAN_RUN_STAGE,)  # what head_report reports between them (not kept: one forward pass)


def head_report(
    model: interp.HookedTransformer,
    n_samples: int = 16,
    seed: int = 0,
    seq_len: int = 24,
    progress: Progress | None = None,
    natural_text: Sequence[str] | str | None = None,
    causal: bool = True,
    max_candidates: int = 12,
    batch_size: int = 8,
    stages: StageResults | None = None,
    n_random: int = N_RANDOM,
) -> HeadReport:
    """Score, causally check and classify every attention head of `model`.

    Probes (`make_probes`): n_samples repeated random sequences per repeat length up to seq_len,
    n_samples unrepeated ones, and natural_text (default NATURAL_TEXT with a tokenizer; () skips it),
    the random ones of the discovery token family. Causal checks (unless causal=False) run on at most
    `max_candidates` induction and previous-token candidates each (highest scores first), on n_samples
    fresh repeated sequences per repeat length of the held-out family, each candidate against `n_random`
    random heads of its layer (`causal.random_head_classes`); `batch_size` sequences per forward pass
    while scoring.
    progress(stage, done, total) is called as each stage advances (None: nothing is reported): the
    stages of KEPT_STAGES (the first only without `causal`) and BETWEEN_STAGES.
    stages: each of KEPT_STAGES' results kept as it finishes; those already in it (a resumed run's,
    made with the same settings) are not run again.
    """
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}.")
    if n_random < 1:
        raise ValueError(
            f"n_random must be >= 1 (the random heads a candidate is compared with), got {n_random}."
        )
    check_finite_weights(model.state_dict(), f"{model.cfg.model_name}'s weights")  # NaN would type no head
    stages = StageResults() if stages is None else stages
    probes = make_probes(model, n_samples, seed, seq_len, natural_text)
    scores = stages.run(
        SCORES_STAGE, lambda: score_heads(model, probes, seed, batch_size, progress), progress
    )
    weights = weight_scores(model, scores.candidates("previous_token", max_candidates))
    effects = {}
    if causal:
        effects = causal_checks(model, probes, scores, max_candidates, progress, stages, n_random, seed)
    cfg = model.cfg
    return HeadReport(
        model_name=cfg.model_name,
        provenance=interp.provenance(model),
        table=classify(scores, weights, effects),
        settings=_settings(probes, n_samples, seed, causal, max_candidates, n_random),
        thresholds=scores.thresholds,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        group_effects={kind: found.all_candidates for kind, found in effects.items()},
        str_tokens=scores.str_tokens,
        patterns=scores.patterns,
    )


INDUCTION_ONLY_STAGES = (SCORES_STAGE, INDUCTION_STAGE)  # what confirmed_induction reports


def confirmed_induction(
    model: interp.HookedTransformer,
    n_samples: int = 16,
    seed: int = 0,
    seq_len: int = 24,
    max_candidates: int = 12,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> list[Head]:
    """`head_report(model, n_samples, seed, seq_len, max_candidates=..., batch_size=...)
    .heads_of_type("induction")` (strongest first), for the cost of the repeated probe, the held-out
    probe's clean run and the induction candidates' ablations on it only: the induction type reads
    nothing else (its score and threshold come from the repeated probe, its confirmation from the
    induction check and the held-out score on the held-out probe), so the other probes, the weight
    scores and the previous-token check are skipped. progress: INDUCTION_ONLY_STAGES."""
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}.")
    check_finite_weights(model.state_dict(), f"{model.cfg.model_name}'s weights")
    probes = dataclasses.replace(make_probes(model, n_samples, seed, seq_len, ()), text=None)
    repeated, _ = probe_patterns(model, probes.repeated, batch_size, mask_scores, progress)
    limits = score_thresholds(probes)
    columns = mask_score_columns({"repeated": repeated}, probes, limits, seed)
    scores = HeadScores(columns=columns, thresholds=limits, skip_gram_pairs=[], patterns={}, str_tokens={})
    candidates = scores.candidates("induction", max_candidates)
    if not candidates:
        return []
    typed = typed_heads(scores, "induction")
    layers = [layer for layer, _ in candidates]
    ablated = ablated_layers(random_head_classes(model, candidates, typed, N_RANDOM, seed))
    clean = clean_run(model, probes.held_out, ablated, layers, final=True)
    effects = induction_ablation_effects(
        model, probes.held_out, candidates, progress, clean, typed, N_RANDOM, seed
    )
    effects = with_held_out_scores(effects, probes.held_out, clean, candidates, "induction", limits)
    return [head for head in candidates if effects.confirmed(head)]


def heads_stage_notes(stage: str, value: HeadScores | CausalEffects) -> list[str]:
    """A line on a finished stage of `head_report` (its kept `value`), for a partial result."""
    if isinstance(value, HeadScores):
        over = {kind: value.candidates(kind, value.columns[kind].numel()) for kind in CAUSAL_TYPES}
        labels = {kind: ", ".join(head_label(*head) for head in heads) for kind, heads in over.items()}
        return [f"Over the {kind.replace('_', '-')} threshold: {labels[kind] or 'none'}." for kind in labels]
    confirmed = [head_label(*head) for head in value.alone if value.confirmed(head)]
    return [f"Confirmed by ablation: {', '.join(confirmed) or 'none'} (of {len(value.alone)} candidates)."]


def _settings(
    probes: Probes, n_samples: int, seed: int, causal: bool, max_candidates: int, n_random: int
) -> dict[str, Any]:
    """What the report was made with (its JSON's "settings")."""
    return {
        "n_samples": n_samples,
        "seed": seed,
        "seq_len": probes.seq_len,
        "induction_lengths": probes.induction_lengths,
        "max_prefix": probes.max_prefix,
        "has_bos": probes.has_bos,
        "natural_text": probes.natural_text,
        "skip_gram_probe": probes.skip_gram.name,
        "causal": causal,
        "max_candidates": max_candidates,
        "discovery_tokens": FAMILY_NAMES["discovery"],
        "held_out_tokens": FAMILY_NAMES["held_out"],
        "held_out_seed": seed + HELD_OUT_SEED_OFFSET,
        "ablation": (
            "mean of hook_z per position over the held-out probe's sequences real there (padding excluded)"
        ),
        "causal_method": (
            "each candidate mean-ablated alone and with the other candidates of its type already "
            "ablated (minimality), each effect against n_random random heads of the candidate's layer "
            "not over its type's threshold (drawn once per layer with the seed + the layer), ablated "
            "alone and on top of all the candidates: its effect beyond their mean, paired per held-out "
            "sequence, with a 95% "
            "bootstrap CI (circuits.evidence.judge_class); confirmed when, for either effect, that CI "
            "excludes 0, the figure beyond random is at least the minimum effect and positive at most "
            "repeat lengths, and the head's score on the held-out probe clears its type's threshold; "
            "sequential stopping in two looks (half of each repeat length's sequences, then the rest): "
            "an effect whose figure beyond random + futility_se_times standard errors is below the minimum "
            "effect after the first look is not run on the rest (an effect truly at the minimum is "
            f"stopped so with probability at most {FUTILITY_ERROR:.2%}, normal approximation)"
        ),
        "n_random": n_random,
        "futility_se_times": FUTILITY_SE,
        "confirm_if_beyond_random_at_least": MIN_EFFECT,
        "n_bootstrap": N_BOOTSTRAP,
    }
