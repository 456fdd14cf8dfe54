"""`head_report`: probes -> scores (discovery family) -> weight evidence -> causal checks (held-out
family) -> classification; `confirmed_induction`: its induction part only."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import interp
from circuits.evidence import head_labels
from circuits.finding import Finding
from circuits.heads.causal import (
    CAUSAL_BOOTSTRAP,
    CAUSAL_TYPES,
    CLEAN_RUN_STAGE,
    FUTILITY_SE,
    INDUCTION_STAGE,
    MIN_EFFECT,
    N_RANDOM,
    PREVIOUS_TOKEN_STAGE,
    CausalEffects,
    ablated_layers,
    causal_checks,
    clean_run_for_ablations,
    induction_ablation_effects,
    never_random,
    random_head_classes,
    with_held_out_scores,
)
from circuits.heads.classify import head_table
from circuits.heads.probes import FAMILY_NAMES, REFERENCE_SEED_OFFSET, make_probes
from circuits.heads.results import TOKEN_AXIS, HeadFigures, head_classes
from circuits.heads.scores import (
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
from interp.types import Head, Progress

KEPT_STAGES = (SCORES_STAGE, INDUCTION_STAGE, PREVIOUS_TOKEN_STAGE)  # what head_report reports and keeps
BETWEEN_STAGES = (CLEAN_RUN_STAGE,)  # what head_report reports between them (not kept: one forward pass)
CHECKS = {  # how the causal checks run (`HeadFigures.checks`)
    "ablation": (
        "mean of hook_z per position over other sequences of the held-out family real there (the held-out "
        f"probe's layout with fresh tokens, seed + {REFERENCE_SEED_OFFSET}; padding excluded)"
    ),
    "causal_method": (
        "each candidate mean-ablated alone and with the other candidates of its type already ablated "
        "(minimality), each effect against n_random random heads of the candidate's layer over neither "
        "checked type's threshold (drawn once per layer with the seed + the layer; from other layers where "
        "its layer has none left; for a previous-token candidate, only layers before the induction heads "
        "its check reads), each ablated in the candidate's place, alone and on top of the other "
        "candidates: its effect beyond their mean, paired per held-out sequence, with a 95% "
        "bootstrap CI over the sequences and the random heads (circuits.evidence.judge_class); confirmed "
        "when, for either effect, that CI excludes 0, the figure beyond random is at least the minimum "
        "effect and positive at most repeat lengths, and the head's score on the held-out probe clears its "
        "type's threshold; sequential stopping in two looks (half of each repeat length's sequences, then "
        "the rest): an effect whose figure beyond random + futility_se_times standard errors is below the "
        "minimum effect after the first look is not run on the rest (an effect truly at the minimum is "
        "stopped so with the probability that Student's t, of one fewer degrees of freedom than the first "
        "look's sequences, falls below -futility_se_times: 0.32% at the default 24 sequences (n_samples "
        "16), 4.8% at 3 (n_samples 2); the standard error is estimated, not known, which would give 0.13%)"
    ),
    "futility_se_times": FUTILITY_SE,
    "confirm_if_beyond_random_at_least": MIN_EFFECT,
    "n_bootstrap": CAUSAL_BOOTSTRAP,
}


@dataclass(frozen=True)
class HeadSettings:
    """What `head_report` runs: n_samples sequences per probe (repeat length) of up to seq_len tokens,
    natural_text (default NATURAL_TEXT with a tokenizer; () skips it), the causal checks (unless
    causal=False) on up to max_candidates candidates per type against n_random random heads each,
    batch_size sequences per scoring pass."""

    n_samples: int = 16
    seed: int = 0
    seq_len: int = 24
    natural_text: Sequence[str] | str | None = None
    causal: bool = True
    max_candidates: int = 12
    batch_size: int = 8
    n_random: int = N_RANDOM

    def __post_init__(self) -> None:
        if self.max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {self.max_candidates}.")
        if self.n_random < 1:
            raise ValueError(
                f"n_random must be >= 1 (the random heads a candidate is compared with), got {self.n_random}."
            )


def head_report(
    model: interp.HookedTransformer,
    settings: HeadSettings | None = None,
    progress: Progress | None = None,
    stages: StageResults | None = None,
    **options: Any,
) -> Finding:
    """Score, causally check and classify every head of `model` with `settings`, any of its fields
    replaced by `options` (`head_report(model, n_samples=8)`): a `Finding` "heads" (chose and tested the
    token families; its classes each candidate's effects, `results.head_classes`; extras `HeadFigures`,
    every head's scores and types). progress: KEPT_STAGES and BETWEEN_STAGES; stages: each of
    KEPT_STAGES' results kept as it finishes, those already in it not run again."""
    settings = dataclasses.replace(settings or HeadSettings(), **options)
    check_finite_weights(model.state_dict(), f"{model.cfg.model_name}'s weights")  # NaN would type no head
    if model.cfg.d_vocab_out != model.cfg.d_vocab:
        raise ValueError(
            f"{model.cfg.model_name} predicts {model.cfg.d_vocab_out} tokens but reads {model.cfg.d_vocab}: "
            "the head report's copying scores and its induction loss read the logits of the tokens it feeds, "
            "so it needs a model whose output vocabulary is its input vocabulary"
        )
    stages = StageResults() if stages is None else stages
    n, seed, top = settings.n_samples, settings.seed, settings.max_candidates
    probes = make_probes(model, n, seed, settings.seq_len, settings.natural_text)
    scores = stages.run(
        SCORES_STAGE, lambda: score_heads(model, probes, seed, settings.batch_size, progress), progress
    )
    weights = weight_scores(model, scores.candidates("previous_token"))  # every typed one, not the top
    effects = {}
    if settings.causal:
        effects = causal_checks(model, probes, scores, top, progress, stages, settings.n_random, seed)
    cfg = model.cfg
    figures = HeadFigures(
        table=head_table(scores, weights, effects),
        thresholds=scores.thresholds,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        induction_lengths=probes.induction_lengths,
        max_prefix=probes.max_prefix,
        has_bos=probes.has_bos,
        skip_gram_probe=probes.skip_gram.name,
        checks=CHECKS,
        group_effects={kind: found.all_candidates for kind, found in effects.items()},
        str_tokens=scores.str_tokens,
        patterns=scores.patterns,
    )
    return Finding(
        analysis="heads",
        model=cfg.model_name,
        provenance=interp.provenance(model),
        settings=dataclasses.replace(settings, seq_len=probes.seq_len, natural_text=probes.natural_text),
        chose={TOKEN_AXIS: [FAMILY_NAMES["discovery"]]},
        tested={TOKEN_AXIS: [FAMILY_NAMES["held_out"]]},
        classes=head_classes(effects),
        extras=figures,
    )


def confirmed_induction(
    model: interp.HookedTransformer,
    n_samples: int = 16,
    seed: int = 0,
    seq_len: int = 24,
    max_candidates: int = 12,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> list[Head]:
    """`head_report(model, ...).heads_of_type("induction")` (strongest first), running only what the
    induction type reads. progress: SCORES_STAGE, then INDUCTION_STAGE."""
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
    layers = [layer for layer, _ in candidates]
    classes = random_head_classes(model, candidates, never_random(scores), N_RANDOM, seed)
    clean = clean_run_for_ablations(
        model, probes.held_out, probes.reference, ablated_layers(classes), layers, final=True
    )
    effects = induction_ablation_effects(model, probes.held_out, classes, progress, clean, seed)
    effects = with_held_out_scores(effects, probes.held_out, clean, candidates, "induction", limits)
    return [head for head in candidates if effects.confirmed(head)]


def heads_stage_notes(stage: str, value: HeadScores | CausalEffects) -> list[str]:
    """Lines on a finished stage of `head_report` (its kept `value`), for a partial result."""
    if isinstance(value, HeadScores):
        labels = {kind: ", ".join(head_labels(value.candidates(kind))) for kind in CAUSAL_TYPES}
        return [f"Over the {kind.replace('_', '-')} threshold: {labels[kind] or 'none'}." for kind in labels]
    confirmed = head_labels([head for head in value.alone if value.confirmed(head)])
    return [f"Confirmed by ablation: {', '.join(confirmed) or 'none'} (of {len(value.alone)} candidates)."]
