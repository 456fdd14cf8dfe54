"""`icl_report`: the ICL score, every head ranked by attribution, the top heads and the induction heads
confirmed by exact ablation on held-out documents."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

import interp
from circuits.evidence import ci_verdict, head_labels, mean_ci, random_same_layer_sets
from circuits.icl.heads import (
    ablated_icl_scores,
    check_ablation,
    confirmed_induction_heads,
    head_attributions,
)
from circuits.icl.results import ClassEffect, HeadEffect, ICLResult
from circuits.icl.score import summarise
from circuits.icl.sequences import ICLSequences, Windows, default_sequences
from interp.checks import check_count, check_heads
from interp.types import Head, Progress, head_label


def _class_effect(
    name: str,
    heads: Sequence[Head],
    found_by: str,
    estimate: torch.Tensor,
    change: torch.Tensor,
    draws: Sequence[Sequence[Head]],
    random_changes: torch.Tensor,
    seed: int,
) -> ClassEffect:
    """A class's held-out change [document] against its random sets' ([draw, document])."""
    difference = change - random_changes.mean(0)
    ci = mean_ci(difference, seed)
    layers = sorted(layer for layer, _ in heads)
    return ClassEffect(
        name=name,
        heads=head_labels(heads),
        found_by=found_by,
        attributed=sum(estimate[layer, head].item() for layer, head in heads),
        change=change.mean().item(),
        change_ci=mean_ci(change, seed),
        random_sets=[head_labels(draw) for draw in draws],
        random_same_layers=all(sorted(layer for layer, _ in draw) == layers for draw in draws),
        random_changes=random_changes.mean(1).tolist(),
        difference=difference.mean().item(),
        difference_ci=ci,
        verdict=ci_verdict(ci),
    )


def icl_report(
    model: interp.HookedTransformer,
    sequences: ICLSequences | None = None,
    *,
    n_documents: int = 24,
    windows: Windows | None = None,
    ablation: str = "mean",
    induction_heads: Sequence[Head] | None = None,
    top: int = 3,
    n_random: int = 4,
    seed: int = 0,
    batch_size: int = 4,
    progress: Progress | None = None,
) -> ICLResult:
    """The in-context learning score of `model` and the heads that carry it.

    sequences: the documents and windows (default: `default_sequences(model, n_documents, seed,
      windows)`: Brown corpus texts for a model with a tokenizer, its task's sequences for a toy model).
      The first half of the documents is the discovery half, the rest the held-out half.
    ablation: "mean" (over every position of the half's documents), "zero" or "resample".
    induction_heads: the class to test (default: `confirmed_induction_heads(model)`, the heads
      `interp heads` confirms, cached); () tests no class.
    top: heads confirmed by exact ablation: the largest positive attributed changes.
    n_random: random same-layer sets the class is compared with.
    batch_size: documents per forward and backward pass of the attribution.
    """
    began = time.perf_counter()
    check_ablation(ablation)
    check_count(top, "top (heads to confirm)", 0)
    check_count(n_random, "n_random (random sets to compare a class with)", 1)
    if sequences is None:
        sequences = default_sequences(model, n_documents, seed, windows)
    tokens, windows = sequences.tokens, sequences.windows
    if tokens.ndim != 2 or len(tokens) < 4:
        raise ValueError(
            f"need at least 4 documents [n_documents, n_tokens] (half find heads, half confirm them), "
            f"got shape {tuple(tokens.shape)}"
        )
    windows.check(model.cfg.n_ctx, tokens.shape[1])
    timings = {}
    found_by = "given"
    if induction_heads is None:
        induction_heads = confirmed_induction_heads(model, progress=progress)
        found_by = "confirmed by interp heads"
    induction_heads = check_heads(model.cfg, induction_heads)
    timings["induction heads"] = time.perf_counter() - began

    half = len(tokens) // 2
    attributions, discovery_losses = head_attributions(
        model, tokens[:half], windows, ablation, seed, batch_size, progress
    )
    timings["attribution"] = time.perf_counter() - began - sum(timings.values())
    estimate = attributions.mean(0)  # [layer, head]
    n_heads = model.cfg.n_heads
    ranked = [(int(i) // n_heads, int(i) % n_heads) for i in estimate.flatten().argsort(descending=True)]
    top_heads = [head for head in ranked if estimate[head] > 0][:top]  # those the model uses context through
    draws = random_same_layer_sets(model, induction_heads, n_random, seed) if induction_heads else []
    sets = [[head] for head in top_heads] + ([induction_heads, *draws] if induction_heads else [])
    heldout_losses, clean, ablated = ablated_icl_scores(
        model, tokens[half:], windows, sets, ablation, seed, progress
    )
    timings["exact ablations"] = time.perf_counter() - began - sum(timings.values())
    changes = ablated - clean  # [set, held-out document]
    n_top = len(top_heads)

    heads = []
    for (layer, head), change in zip(top_heads, changes[:n_top], strict=True):
        ci = mean_ci(change, seed)
        heads.append(
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
    classes = []
    if induction_heads:
        tested = (induction_heads, found_by, estimate, changes[n_top], draws, changes[n_top + 1 :], seed)
        classes.append(_class_effect("induction", *tested))
    every_loss = torch.cat([discovery_losses, heldout_losses])
    timings["total"] = time.perf_counter() - began
    return ICLResult(
        model_name=model.cfg.model_name,
        provenance=interp.provenance(model),
        source=sequences.source,
        windows=windows,
        ablation=ablation,
        seed=seed,
        score=summarise(every_loss, windows, seed),
        discovery=summarise(discovery_losses, windows, seed),
        heldout=summarise(heldout_losses, windows, seed),
        discovery_names=sequences.names[:half],
        heldout_names=sequences.names[half:],
        loss_curve=every_loss.mean(0),
        loss_curve_se=every_loss.std(0) / len(every_loss) ** 0.5,
        attributions=estimate,
        heads=heads,
        classes=classes,
        timings=timings,
    )
