"""Stability of edge selections over the prompts, and ensembles of edge rankings.

  selection frequency of edge e = the fraction of bootstrap resamples of the prompts (drawn with
      replacement, `stats.resamples`) whose circuit of n edges (top n by |score| on that resample,
      connected input -> logits) contains e
  ensemble = the mean of the methods' normalised ranks by |score| (0 weakest, 1 strongest; tied scores
      share their mean rank), as scores -mean rank: scores that only rank, without a sign (a member's
      sign does not carry over), so the signed ranking (`top_circuit(signed=True)`) is this ranking

Attribution scores are means over prompts, so a resample's scores are the mean of its prompts' own
scores (`prompt_scores`: one attribution per prompt, their mean the scores of all of them); methods
that are not means (edge pruning) are run again on each resample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.edges.attribution import Method, edge_attribution
from interp.edges.graph import EdgeGraph, EdgeScores, check_finite_edge_scores, top_circuit
from interp.interventions.ablation import Ablation
from interp.interventions.metrics import AnswerMetric, takes_rows
from interp.interventions.stats import resamples
from interp.model.tokens import index_tokens
from interp.model.transformer import HookedTransformer
from interp.types import AblationKind, Metric, Progress

STAGE = "Edge stability"


def subset_metric(metric: Metric, rows: Int[Tensor, " n"]) -> Metric:
    """`metric` for the prompts `rows` of its batch, as a metric of those prompts alone."""
    if isinstance(metric, AnswerMetric):
        pos = metric.pos[rows] if isinstance(metric.pos, Tensor) else metric.pos
        incorrect = None if metric.incorrect is None else metric.incorrect[rows]
        return AnswerMetric(metric.kind, metric.correct[rows], incorrect, pos)
    if not takes_rows(metric):
        raise ValueError(
            "Scores per prompt need a metric that takes the prompts' indices (metric(logits, rows)), "
            "e.g. metrics.logit_diff_metric(correct, incorrect, pos)."
        )

    def of_rows(logits: Tensor, sub: Tensor | None = None) -> Tensor:
        return metric(logits, rows if sub is None else rows[sub])

    return of_rows


def prompt_scores(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    method: Method = "eap-ig",
    steps: int = 5,
    ablation: Ablation | AblationKind = "counterfactual",
    progress: Progress | None = None,
    reader_pos: Int[Tensor, " batch"] | None = None,
    **options,
) -> Float[Tensor, "batch writer reader"]:
    """Each prompt's own edge scores (`edge_attribution` on it alone; `options` go to it). Mean and zero
    ablation take their means over all the corrupted prompts (the Ablation's mask: theirs), as a run on
    all of them does, and `reader_pos` ([batch]) gives each prompt its own position, so the mean of
    these is the scores of all the prompts. progress("Edge scores", prompts done, prompts)."""
    ablation = Ablation.of(ablation)
    if ablation.kind == "resample":
        raise ValueError(
            "Scores per prompt take counterfactual, mean or zero ablation (resample draws per batch)."
        )
    if ablation.reference is not None:
        raise ValueError(
            "Scores per prompt take their reference from the ablation: the corrupted prompts (mean, "
            "zero), each prompt's own (counterfactual); give an Ablation without a reference."
        )
    n, out = clean.shape[0], []
    if reader_pos is not None and tuple(reader_pos.shape) != (n,):
        raise ValueError(
            f"reader_pos must hold one position per prompt, shape ({n},), got {tuple(reader_pos.shape)}."
        )
    if ablation.kind != "counterfactual":  # every prompt's means over all the corrupted prompts
        ablation = replace(ablation, reference=corrupted)
    for i in range(n):
        rows = torch.tensor([i])
        scores = edge_attribution(
            model, index_tokens(clean, rows), index_tokens(corrupted, rows), subset_metric(metric, rows),
            method, steps, ablation=ablation, reader_pos=None if reader_pos is None else reader_pos[rows],
            **options,
        )  # fmt: skip
        out.append(scores.scores)
        if progress:
            progress("Edge scores", i + 1, n)
    return torch.stack(out)


def mean_scores(
    graph: EdgeGraph,
    per_prompt: Float[Tensor, "batch writer reader"],
    rows: Int[Tensor, " n"],
    like: EdgeScores,
) -> EdgeScores:
    """The scores of the prompts `rows` (repeats count twice): the mean of their own scores."""
    return EdgeScores(
        graph=graph, scores=per_prompt[rows].mean(0), method=like.method, ablation=like.ablation,
        steps=like.steps, n_prompts=len(rows),
    )  # fmt: skip


def selection_frequency(
    scores_of: Callable[[Int[Tensor, " n"]], EdgeScores],
    n_prompts: int,
    n_edges: int,
    n_boot: int = 20,
    seed: int = 0,
    progress: Progress | None = None,
) -> Float[Tensor, "writer reader"]:
    """How often each edge is in the circuit of `n_edges` edges over `n_boot` bootstrap resamples of
    the prompts; scores_of(rows) scores the edges on the prompts `rows` ([n] indices, with repeats).
    Values in [0, 1]; 0 off the graph. progress("Edge stability", resamples done, n_boot)."""
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot} must be at least 1 (bootstrap resamples of the prompts).")
    total = None
    for b, rows in enumerate(resamples(n_prompts, n_boot, seed)):
        circuit = top_circuit(scores_of(rows), n_edges).float()
        total = circuit if total is None else total + circuit
        if progress:
            progress(STAGE, b + 1, n_boot)
    return total / n_boot


def normalised_ranks(scores: EdgeScores) -> Float[Tensor, "writer reader"]:
    """Each edge's rank by |score| among the graph's edges, 0 (weakest) to 1 (strongest), edges of
    equal |score| sharing their mean rank; 0 off the graph."""
    check_finite_edge_scores(scores)
    graph = scores.graph
    values = scores.scores[graph.valid].abs()
    order = values.argsort(stable=True)
    _, tie, count = torch.unique_consecutive(values[order], return_inverse=True, return_counts=True)
    last = count.cumsum(0) - 1  # each run of equal values: its last position in the order
    ranks = torch.empty(values.shape[0])
    ranks[order] = (last - (count - 1) / 2).float()[tie]
    out = torch.zeros(graph.n_writers, graph.n_readers)
    out[graph.valid] = ranks / max(1, values.shape[0] - 1)
    return out


def ensemble(members: Sequence[EdgeScores]) -> EdgeScores:
    """One ranking from several methods' scores of one graph: -(mean normalised rank by |score|), scores
    that only rank (the module docstring)."""
    if not members:
        raise ValueError("An ensemble needs the scores of at least one method.")
    graph = members[0].graph
    if any(m.graph != graph for m in members):
        raise ValueError("The ensemble's scores must be of one edge graph (one model).")
    scores = -torch.stack([normalised_ranks(m) for m in members]).mean(0)
    return EdgeScores(
        graph=graph, scores=scores, method="ensemble(" + ",".join(m.method for m in members) + ")",
        ablation=members[0].ablation, steps=max(m.steps for m in members), n_prompts=members[0].n_prompts,
    )  # fmt: skip
