"""`icl_report`: the ICL score, every head ranked by attribution, the top heads (each a class of one) and
the induction heads judged against random same-layer heads by exact ablation on held-out documents;
`icl_analysis`: `interp icl` as one call.

Documents are the families (`DocumentSplit`): the discovery documents rank every head, every other one
is held out and scored (the headline); the exact ablations (~6 forward passes a document) run on the
first `ablated` held-out ones. The steps (1-4 kept as stages):
  0. documents        the given documents, else `default_sequences`; checked against the windows
  1. induction heads  the class to test: given, else the heads `interp heads` confirms
  2. attribution      every head's change of the ICL score, on the discovery documents
  3. exact ablations  each of the `top` heads alone and the induction heads, each with random same-layer sets
  4. scoring          every other held-out document scored clean
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import interp
from circuits.evidence import (
    ClassVerdict,
    HeadClass,
    head_class,
    head_labels,
    judge_class,
    mean_ci,
    unclaimed_heads,
)
from circuits.finding import Finding
from circuits.heads.cache import INDUCTION_HEADS_STAGE, induction_heads_or_confirmed
from circuits.icl.heads import (
    ATTRIBUTION_STAGE,
    EXACT_ABLATIONS_STAGE,
    ablated_icl_scores,
    check_icl_ablation,
    head_attributions,
    ranked_heads,
)
from circuits.icl.results import TOP_FOUND_BY, HeadEffect, ICLFigures, loss_curve_figure
from circuits.icl.score import icl_score, token_losses
from circuits.icl.sequences import ICLSequences, Windows, default_sequences, default_windows
from circuits.icl.training import icl_over_training, plot_icl_over_training
from circuits.stages import StageResults
from interp.checks import check_count
from interp.training import CHECKPOINTS
from interp.types import Head, Progress, as_stage, counted, head_label

SCORING_STAGE = "Scoring held-out documents"  # every held-out document scored: the headline
CHECKPOINTS_STAGE = "ICL and induction scores at each checkpoint"  # icl_analysis's, after icl_report's


@dataclass(frozen=True)
class DocumentSplit:
    """The first `discovery` documents (at most half) rank every head by attribution; all the others are
    held out and scored; the exact ablations run on the first `ablated` held-out ones (None: all)."""

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

    n_documents, windows: the documents when none are given: `default_sequences(model, n_documents,
      seed, windows)` (windows None: `default_windows`).
    split: the documents that rank the heads and those the exact ablations run on (`DocumentSplit`).
    ablation: "mean" (over every position of the documents), "zero" or "resample".
    top: heads tested alone by exact ablation, the largest positive attributed changes.
    n_random: random same-layer sets the induction heads are compared with.
    seed: the documents, the random sets and the bootstrap. batch_size: documents per attribution pass.
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
    losses = [
        token_losses(model, model(chunk, stop_at_layer=model.cfg.n_layers), chunk).cpu()
        for chunk in counted(tokens.split(batch_size), progress, SCORING_STAGE)
    ]
    return torch.cat(losses).float()


def icl_stage_notes(stage: str, value: Any) -> list[str]:
    """A line on a finished stage of `icl_report` (its kept `value`), for a partial result."""
    if stage == INDUCTION_HEADS_STAGE:
        return [f"Induction heads: {', '.join(head_labels(value)) or 'none'}."]
    if stage == ATTRIBUTION_STAGE:
        attributions, _ = value  # [document, layer, head]
        estimate = attributions.mean(0)
        top = [f"{head_label(*head)} ({estimate[head]:+.3f} nats)" for head in ranked_heads(estimate)[:3]]
        return [f"Top heads by attribution on {len(attributions)} discovery documents: {', '.join(top)}."]
    if stage == EXACT_ABLATIONS_STAGE:
        _, clean, ablated = value
        return [
            f"{len(ablated)} sets of heads ablated on {len(clean)} held-out documents (their clean ICL "
            f"score {clean.mean():+.3f} nats)."
        ]
    return [f"{len(value)} further held-out documents scored."]


def icl_report_stages(find_induction_heads: bool) -> list[str]:
    """The stages `icl_report` keeps, in order; the first only when it finds the induction heads."""
    first = [INDUCTION_HEADS_STAGE] if find_induction_heads else []
    return [*first, ATTRIBUTION_STAGE, EXACT_ABLATIONS_STAGE, SCORING_STAGE]


def _judged(
    found: HeadClass, found_by: str, estimate: torch.Tensor, changes: torch.Tensor, seed: int
) -> ClassVerdict:
    """A class's held-out changes against its random sets' (changes [1 + draws, document], the class
    first) judged by `judge_class`, with the details `ICLFigures` names (estimate [layer, head])."""
    verdict = judge_class(found, changes, seed=seed)
    verdict.details = {
        "found_by": found_by,
        "attributed": sum(estimate[layer, head].item() for layer, head in found.heads),
    }
    return verdict


def _head_effect(
    top: HeadClass, change: torch.Tensor, estimate: torch.Tensor, seed: int, verdict: str
) -> HeadEffect:
    """A top head's exact change [document] beside its attributed one (estimate [layer, head]), with its
    class's verdict (`_judged`: against random heads of its layer)."""
    ((layer, index),) = top.heads
    return HeadEffect(
        head=head_label(layer, index),
        layer=layer,
        index=index,
        attributed=estimate[layer, index].item(),
        exact=change.mean().item(),
        exact_ci=mean_ci(change, seed),
        verdict=verdict,
    )


def _documents(
    model: interp.HookedTransformer, settings: ICLSettings, sequences: ICLSequences | None
) -> ICLSequences:
    """Step 0: `sequences`, else the settings' default ones, checked against the model and the windows."""
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


def icl_report(
    model: interp.HookedTransformer,
    settings: ICLSettings = ICLSettings(),
    *,
    sequences: ICLSequences | None = None,
    induction_heads: Sequence[Head] | None = None,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> Finding:
    """The ICL score of `model` and the heads that carry it, as the Finding "icl" (see the module
    docstring). sequences: default the settings' `default_sequences`. induction_heads: default
    `confirmed_induction_heads(model)` (cached); () none. stages: finished stages are not run again."""
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
    top_heads = [head for head in ranked_heads(estimate) if estimate[head] > 0][: settings.top]
    outside = unclaimed_heads(model, [induction_heads, top_heads])  # random heads: none of those chosen
    classes = [  # each top head a class of one, against random heads of its layer; then the induction heads
        head_class(model, head_label(*head), [head], settings.n_random, seed, outside=outside)
        for head in top_heads
    ]
    if induction_heads:
        induction = head_class(model, "induction", induction_heads, settings.n_random, seed, outside=outside)
        classes.append(induction)
    sets = [heads for found in classes for heads in found.sets]
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
    # [set, held-out document] per class:
    changes = list((ablated - clean).split([len(c.sets) for c in classes])) if classes else []
    judged = [
        _judged(found, found_by if found.name == "induction" else TOP_FOUND_BY, estimate, change, seed)
        for found, change in zip(classes, changes, strict=True)
    ]
    heldout_losses = torch.cat([ablated_losses, scored_losses])
    every_loss = torch.cat([discovery_losses, heldout_losses])  # [document, pos - 1]
    timings["total"] = time.perf_counter() - began
    figures = ICLFigures(
        source=sequences.source,
        score=icl_score(every_loss, windows, seed),
        discovery=icl_score(discovery_losses, windows, seed),
        heldout=icl_score(heldout_losses, windows, seed),
        loss_curve=every_loss.mean(0),
        loss_curve_se=every_loss.std(0) / len(every_loss) ** 0.5,
        attributions=estimate,
        heads=[
            _head_effect(top, change[0], estimate, seed, found.verdict)
            for top, change, found in zip(classes[: len(top_heads)], changes, judged, strict=False)
        ],
    )
    return Finding(
        analysis="icl",
        model=model.cfg.model_name,
        provenance=interp.provenance(model),
        settings=dataclasses.replace(settings, n_documents=len(tokens), windows=windows),
        chose={"documents": sequences.names[:half]},
        tested={"documents": sequences.names[half:]},
        classes=judged,
        timings=timings,
        extras=figures,
    )


def training_run(source: str | Path) -> Path | None:
    """The training run's directory a model source names (one with checkpoints), else None."""
    return Path(source) if (Path(source) / CHECKPOINTS).is_dir() else None


def icl_analysis(
    model: interp.HookedTransformer,
    settings: ICLSettings,
    windows: Sequence[int | None] = (None, None, None),
    source: str | Path = "",
    induction_heads: Sequence[Head] | None = None,
    plot: str | None = None,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> Finding:
    """`icl_report` with the settings' windows, else the (early, late, width) `windows` given, those None
    from `default_windows(model)`; for a training run's directory `source`, `finding.extras.training`
    across its checkpoints (stage CHECKPOINTS_STAGE). plot: that run's curve, else the loss per token, to
    this file."""
    if settings.windows is None:
        defaults = dataclasses.astuple(default_windows(model))  # (early, late, width)
        given = [
            default if value is None else value for value, default in zip(windows, defaults, strict=True)
        ]
        settings = dataclasses.replace(settings, windows=Windows(*given))
    finding = icl_report(model, settings, induction_heads=induction_heads, progress=progress, stages=stages)
    figures: ICLFigures = finding.extras
    run = training_run(source)
    if run is not None:
        step = as_stage(progress, CHECKPOINTS_STAGE)
        figures.training = icl_over_training(
            run, settings.n_documents, settings.windows, settings.seed, progress=step
        )
    if plot is not None and run is not None:
        plot_icl_over_training(figures.training, plot)
    elif plot is not None:
        loss_curve_figure(finding, plot)
    return finding
