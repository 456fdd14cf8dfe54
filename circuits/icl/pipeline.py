"""`icl_report`: the ICL score, every head ranked by attribution, the top heads and the induction heads
confirmed by exact ablation on held-out documents.

Documents are the families (`DocumentSplit`): the discovery documents rank every head; every other
document is held out and scored, so the headline ICL score is measured on documents that chose nothing;
the exact ablations, which cost a run per set of heads, run on the first `ablated` held-out documents.
One clean forward pass scores a held-out document; its ablations cost about six more, so scoring
many documents and ablating a few is how the default run affords a headline whose CI can exclude 0.

The steps (`ICLSettings` holds their sizes and choices; each of 1-4 is a kept stage):
  0. documents        the given documents, else `default_sequences`; checked against the windows
  1. induction heads  the class to test: given, else the heads `interp heads` confirms
  2. attribution      every head's change of the ICL score, on the discovery documents
  3. exact ablations  the `top` heads alone and the induction heads against random same-layer
                      sets, on the first `ablated` held-out documents
  4. scoring          every other held-out document scored clean (the headline: all held-out ones)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

import interp
from circuits.evidence import HeadClass, ci_verdict, head_class, head_labels, judge_class, mean_ci
from circuits.heads.cache import INDUCTION_HEADS_STAGE, induction_heads_or_confirmed
from circuits.icl.heads import (
    ATTRIBUTION_STAGE,
    EXACT_ABLATIONS_STAGE,
    ablated_icl_scores,
    check_icl_ablation,
    head_attributions,
)
from circuits.icl.results import ClassEffect, HeadEffect, ICLResult
from circuits.icl.score import icl_score, token_losses
from circuits.icl.sequences import ICLSequences, Windows, default_sequences
from circuits.stages import StageResults
from interp.checks import check_count
from interp.types import Head, Progress, head_label


@dataclass(frozen=True)
class DocumentSplit:
    """How `icl_report` uses its documents: the first `discovery` rank every head by attribution (at most
    half of them); all the others are held out and each is scored; the exact ablations run on the first
    `ablated` held-out documents (None: every one)."""

    discovery: int = 12
    ablated: int | None = 12

    def __post_init__(self) -> None:
        check_count(self.discovery, "discovery documents (that rank the heads)", 2)
        if self.ablated is not None:
            check_count(self.ablated, "ablated documents (held-out documents the ablations run on)", 2)

    def sizes(self, n_documents: int) -> tuple[int, int]:
        """(discovery documents, ablated held-out documents) among `n_documents`."""
        discovery = min(self.discovery, n_documents // 2)
        heldout = n_documents - discovery
        return discovery, heldout if self.ablated is None else min(self.ablated, heldout)


@dataclass(frozen=True, kw_only=True)
class ICLSettings:
    """The sizes and choices of `icl_report`.

    n_documents, windows: the documents when none are given (`default_sequences(model, n_documents,
      seed, windows)`: Brown corpus texts for a model with a tokenizer, its task's sequences for a toy
      model; windows None: `default_windows`).
    split: how many documents rank the heads (the first) and how many held-out ones the exact
      ablations run on; every held-out document is scored (`DocumentSplit`).
    ablation: "mean" (over every position of the half's documents), "zero" or "resample".
    top: heads confirmed by exact ablation: the largest positive attributed changes.
    n_random: random same-layer sets the induction heads are compared with.
    seed: the documents, the random sets and the bootstrap.
    batch_size: documents per forward and backward pass of the attribution.
    """

    n_documents: int = 60
    split: DocumentSplit = DocumentSplit()
    windows: Windows | None = None
    ablation: str = "mean"
    top: int = 3
    n_random: int = 4
    seed: int = 0
    batch_size: int = 4

    def __post_init__(self) -> None:
        check_icl_ablation(self.ablation)
        if self.windows is not None:  # what does not depend on the model's context
            self.windows.check(n_ctx=self.windows.late + self.windows.width)
        check_count(self.top, "top (heads to confirm)", 0)
        check_count(self.n_random, "n_random (random sets to compare a class with)", 1)


@torch.inference_mode()
def document_losses(
    model: interp.HookedTransformer,
    tokens: torch.Tensor,
    batch_size: int = 4,
    progress: Progress | None = None,
) -> torch.Tensor:
    """Each document's per-token losses [n_documents, pos - 1] (nats; [:, t - 1] is token t's), one
    clean forward pass per `batch_size` documents."""
    if len(tokens) == 0:
        return torch.zeros(0, tokens.shape[1] - 1)
    chunks, losses = tokens.split(batch_size), []
    for done, chunk in enumerate(chunks):
        if progress is not None:
            progress(SCORING_STAGE, done, len(chunks))
        losses.append(token_losses(model, model(chunk, stop_at_layer=model.cfg.n_layers), chunk).cpu())
    if progress is not None:
        progress(SCORING_STAGE, len(chunks), len(chunks))
    return torch.cat(losses).float()


SCORING_STAGE = "Scoring held-out documents"  # every held-out document scored: the headline


def icl_stage_notes(stage: str, value: Any) -> list[str]:
    """A line on a finished stage of `icl_report` (its kept `value`), for a partial result."""
    if stage == INDUCTION_HEADS_STAGE:
        return [f"Induction heads: {', '.join(head_labels(value)) or 'none'}."]
    if stage == ATTRIBUTION_STAGE:
        attributions, _ = value  # [document, layer, head]
        estimate = attributions.mean(0)
        order = estimate.flatten().argsort(descending=True)[:3].tolist()
        n_heads = estimate.shape[1]
        top = [f"{head_label(i // n_heads, i % n_heads)} ({estimate.flatten()[i]:+.3f} nats)" for i in order]
        return [f"Top heads by attribution on {len(attributions)} discovery documents: {', '.join(top)}."]
    if stage == EXACT_ABLATIONS_STAGE:
        _, clean, ablated = value
        return [
            f"{len(ablated)} sets of heads ablated on {len(clean)} held-out documents (their clean ICL "
            f"score {clean.mean():+.3f} nats)."
        ]
    return [f"{len(value)} further held-out documents scored."]


def icl_report_stages(find_induction_heads: bool) -> list[str]:
    """The stages `icl_report` reports and keeps (`StageResults`), in order; the first only when it
    finds the induction heads (`induction_heads=None`)."""
    first = [INDUCTION_HEADS_STAGE] if find_induction_heads else []
    return [*first, ATTRIBUTION_STAGE, EXACT_ABLATIONS_STAGE, SCORING_STAGE]


def _class_effect(
    found: HeadClass, found_by: str, estimate: torch.Tensor, changes: torch.Tensor, seed: int
) -> ClassEffect:
    """A class's held-out changes against its random sets' (changes [1 + draws, document], the class
    first), judged by `circuits.evidence.judge_class`."""
    verdict = judge_class(found, changes, seed=seed)
    layers = sorted(layer for layer, _ in found.heads)
    return ClassEffect(
        name=found.name,
        heads=verdict.heads,
        found_by=found_by,
        attributed=sum(estimate[layer, head].item() for layer, head in found.heads),
        change=verdict.heldout.drop,
        change_ci=verdict.heldout.drop_ci,
        random_sets=verdict.random_sets,
        random_same_layers=all(sorted(layer for layer, _ in draw) == layers for draw in found.draws),
        random_changes=verdict.random_effects,
        difference=verdict.heldout.beyond,
        difference_ci=verdict.heldout.beyond_ci,
        verdict=verdict.verdict,
    )


def _documents(
    model: interp.HookedTransformer, settings: ICLSettings, sequences: ICLSequences | None
) -> ICLSequences:
    """Step 0: the documents (`sequences`, else the settings' default ones), checked against the
    model's context and the windows."""
    if sequences is None:
        sequences = default_sequences(model, settings.n_documents, settings.seed, settings.windows)
    tokens = sequences.tokens
    if tokens.ndim != 2 or len(tokens) < 4:
        raise ValueError(
            f"need at least 4 documents [n_documents, n_tokens] (half find heads, half confirm them), "
            f"got shape {tuple(tokens.shape)}"
        )
    sequences.windows.check(model.cfg.n_ctx, tokens.shape[1])
    return sequences


def _top_heads(estimate: torch.Tensor, top: int) -> list[Head]:
    """The `top` heads of the largest positive attributed changes (those the model uses context
    through), from estimate [layer, head]."""
    n_heads = estimate.shape[1]
    ranked = [(int(i) // n_heads, int(i) % n_heads) for i in estimate.flatten().argsort(descending=True)]
    return [head for head in ranked if estimate[head] > 0][:top]


def _head_effects(
    top_heads: Sequence[Head], changes: torch.Tensor, estimate: torch.Tensor, seed: int
) -> list[HeadEffect]:
    """Each top head's exact change [document] beside its attributed one (estimate [layer, head])."""
    effects = []
    for (layer, head), change in zip(top_heads, changes, strict=True):
        ci = mean_ci(change, seed)
        effects.append(
            HeadEffect(
                head=head_label(layer, head),
                layer=layer,
                index=head,
                attributed=estimate[layer, head].item(),
                exact=change.mean().item(),
                exact_ci=ci,
                verdict=ci_verdict(ci),
            )
        )
    return effects


def _ablated_sets(
    model: interp.HookedTransformer, top_heads: list[Head], induction_heads: list[Head], settings: ICLSettings
) -> tuple[HeadClass | None, list[list[Head]]]:
    """Step 3's sets: (the induction class with its random same-layer sets (None without induction
    heads), every set ablated: each top head alone, then the induction heads and their random sets)."""
    if not induction_heads:
        return None, [[head] for head in top_heads]
    found = head_class(model, "induction", induction_heads, settings.n_random, settings.seed)
    return found, [[head] for head in top_heads] + found.sets


def _scores(
    discovery_losses: torch.Tensor, heldout_losses: torch.Tensor, windows: Windows, seed: int
) -> dict[str, Any]:
    """The ICL scores (every, discovery and held-out document) and the loss curve with its standard
    error, from per-token losses [document, pos - 1] (`ICLResult`'s fields)."""
    every_loss = torch.cat([discovery_losses, heldout_losses])
    return {
        "score": icl_score(every_loss, windows, seed),
        "discovery": icl_score(discovery_losses, windows, seed),
        "heldout": icl_score(heldout_losses, windows, seed),
        "loss_curve": every_loss.mean(0),
        "loss_curve_se": every_loss.std(0) / len(every_loss) ** 0.5,
    }


def icl_report(
    model: interp.HookedTransformer,
    settings: ICLSettings = ICLSettings(),
    *,
    sequences: ICLSequences | None = None,
    induction_heads: Sequence[Head] | None = None,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> ICLResult:
    """The in-context learning score of `model` and the heads that carry it (`ICLSettings`).

    sequences: the documents and windows (default: the settings' `default_sequences`).
    induction_heads: the class to test (default: `confirmed_induction_heads(model)`, the heads
      `interp heads` confirms, cached); () tests no class.
    stages: each stage's result (`icl_report_stages`) kept as it finishes; the stages already in it
      (a resumed run's, made with the same settings) are not run again.
    """
    began, timings = time.perf_counter(), {}

    def stage(name: str) -> None:
        timings[name] = time.perf_counter() - began - sum(timings.values())

    stages = StageResults() if stages is None else stages
    sequences = _documents(model, settings, sequences)  # 0. documents
    tokens, windows, seed, ablation = sequences.tokens, sequences.windows, settings.seed, settings.ablation
    induction_heads, found_by = induction_heads_or_confirmed(model, induction_heads, stages, progress)  # 1.
    stage("induction heads")
    half, n_ablated = settings.split.sizes(len(tokens))
    discovery, ablated_documents, scored = tokens.split([half, n_ablated, len(tokens) - half - n_ablated])
    attributions, discovery_losses = stages.run(  # 2. every head ranked on the discovery documents
        ATTRIBUTION_STAGE,
        lambda: head_attributions(model, discovery, windows, ablation, seed, settings.batch_size, progress),
        progress,
    )
    stage("attribution")
    estimate = attributions.mean(0)  # [layer, head]
    top_heads = _top_heads(estimate, settings.top)
    induction, sets = _ablated_sets(model, top_heads, induction_heads, settings)
    ablated_losses, clean, ablated = stages.run(  # 3. exact ablations on the first held-out documents
        EXACT_ABLATIONS_STAGE,
        lambda: ablated_icl_scores(model, ablated_documents, windows, sets, ablation, seed, progress),
        progress,
    )
    stage("exact ablations")
    scored_losses = stages.run(  # 4. every other held-out document scored
        SCORING_STAGE, lambda: document_losses(model, scored, settings.batch_size, progress), progress
    )
    stage("scoring")
    changes, n_top = ablated - clean, len(top_heads)  # [set, held-out document]
    classes = (
        [] if induction is None else [_class_effect(induction, found_by, estimate, changes[n_top:], seed)]
    )
    timings["total"] = time.perf_counter() - began
    return ICLResult(
        model_name=model.cfg.model_name,
        provenance=interp.provenance(model),
        source=sequences.source,
        windows=windows,
        ablation=ablation,
        seed=seed,
        discovery_names=sequences.names[:half],
        heldout_names=sequences.names[half:],
        n_ablated=n_ablated,
        attributions=estimate,
        heads=_head_effects(top_heads, changes[:n_top], estimate, seed),
        classes=classes,
        timings=timings,
        **_scores(discovery_losses, torch.cat([ablated_losses, scored_losses]), windows, seed),
    )
