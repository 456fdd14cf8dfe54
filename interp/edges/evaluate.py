"""Faithfulness of edge circuits: each circuit keeps its edges, every other edge is ablated.

  faithfulness(C) = (m(C) - m(empty)) / (m(model) - m(empty)), means over prompts

with a bootstrap CI over prompts; `faithfulness_curve` evaluates the top circuits at MIB's sizes and
summarises the curve as MIB's CPR and CMD. `removal_effects`: what each edge of a circuit does there,
m(circuit without the edge) - m(circuit), in the metric's units.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.checks import check_distinct_pair, check_gradient_dtype
from interp.edges.graph import MIB_FRACTIONS, EdgeScores, edge_graph, random_scores, top_circuit
from interp.edges.intervene import (
    ablated_outputs,
    chunks,
    edge_ablation,
    edge_pair,
    logit_positions,
    read_at,
    run_circuits,
)
from interp.edges.pruning import masked_logits
from interp.interventions.ablation import Ablation
from interp.interventions.engine import forward_logits
from interp.interventions.metrics import check_differentiable, check_reads_real_tokens, for_rows
from interp.interventions.stats import (
    FaithfulnessSummary,
    faithfulness_ci,
    faithfulness_ratio,
    faithfulness_summary,
)
from interp.model.tokens import index_tokens
from interp.model.transformer import HookedTransformer
from interp.types import AblationKind, Metric, Progress, as_stage

REMOVAL_STAGE = "Edge effects"  # the stage removal_effects reports


@dataclass(kw_only=True)
class Faithfulness:
    """m(circuit) relative to the model and the empty circuit, with a bootstrap CI over prompts.

    values [K, batch]: each circuit's metric per prompt; full, empty [batch]; families: each prompt's
    family [batch] (a template, relation, ...), which the CIs resample first, then the prompts within
    them, so that a CI covers the faithfulness on new families (None: each prompt its own)."""

    values: Float[Tensor, "K batch"]
    full: Float[Tensor, " batch"]
    empty: Float[Tensor, " batch"]
    families: Sequence[Hashable] | None = None

    def __post_init__(self):  # refuse an undefined ratio now, not as "0 [0, 0]" in a report
        faithfulness_ratio(self.values, self.full, self.empty)

    @property
    def faithfulness(self) -> Float[Tensor, " K"]:
        """(m(C) - m(empty)) / (m(model) - m(empty)), means over prompts (`stats.faithfulness_ratio`)."""
        return faithfulness_ratio(self.values, self.full, self.empty)

    def ci(self, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[Tensor, Tensor]:
        """Bootstrap CI of the faithfulness (families, then prompts resampled, ratio recomputed); resamples
        whose denominator is 0 are left out, with a warning saying how many (`stats.faithfulness_ci`)."""
        return faithfulness_ci(self.values, self.full, self.empty, n_boot, level, seed, self.families)

    def summary(self, k: int = 0, seed: int = 0) -> FaithfulnessSummary:
        """Circuit k's ratio with its CI and per-prompt figures (`stats.faithfulness_summary`)."""
        return faithfulness_summary(self.values[k], self.full, self.empty, seed=seed, families=self.families)


def faithfulness(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    circuits: Bool[Tensor, "K writer reader"] | Bool[Tensor, "writer reader"],
    *,
    ablation: Ablation | AblationKind = "counterfactual",
    batch_size: int = 16,
    progress: Progress | None = None,
    families: Sequence[Hashable] | None = None,
) -> Faithfulness:
    """Faithfulness of circuits: each run keeps its circuit's edges and ablates every other edge
    (`ablation`: what ablated edges carry, `ablated_outputs`). Circuits that are the same run once
    (`evaluate_circuits`). families: each prompt's family [batch], which the CIs resample first
    (`Faithfulness`). progress("Faithfulness", runs done, runs)."""
    ablation = edge_ablation(ablation)
    clean, corrupted = edge_pair(model, clean, corrupted, ablation)
    metric = check_reads_real_tokens(model, metric, clean)
    if ablation.kind == "counterfactual":
        check_distinct_pair(clean, corrupted, "every ablated edge (counterfactual: the corrupted run's)")
    if not isinstance(circuits, Tensor):
        raise TypeError(f"circuits must be a bool tensor [K, writer, reader], got {type(circuits).__name__}")
    circuits = circuits[None] if circuits.ndim == 2 else circuits
    if circuits.dtype != torch.bool and not ((circuits == 0) | (circuits == 1)).all():
        raise ValueError(
            "circuits must be masks of kept edges (bool, or 0 and 1 only); for a soft mask use run_circuits"
        )
    graph = edge_graph(model)
    if circuits.ndim != 3 or tuple(circuits.shape[1:]) != (graph.n_writers, graph.n_readers):
        raise ValueError(
            f"circuits must be [K, {graph.n_writers}, {graph.n_readers}] masks of this model's edge graph "
            f"(writers x readers), got shape {tuple(circuits.shape)}; build them with top_circuit"
        )
    if families is not None and len(families) != clean.shape[0]:
        raise ValueError(
            f"families must name the family of each of the {clean.shape[0]} prompts, got {len(families)}"
        )
    ablated = ablated_outputs(model, clean, corrupted, ablation)
    evaluated = evaluate_circuits(model, clean, metric, circuits, ablated, batch_size, progress)
    return replace(evaluated, families=None if families is None else list(families))


def evaluate_circuits(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    metric: Metric,
    circuits: Bool[Tensor, "K writer reader"],
    ablated: Float[Tensor, "writer batch_or_1 pos d_model"],
    batch_size: int = 16,
    progress: Progress | None = None,
) -> Faithfulness:
    """`faithfulness` given what ablated edges carry (`ablated_outputs`): one run per distinct
    circuit and one of the empty circuit (shared with any empty circuit among them); a circuit of
    every edge is the model itself (its values are the model's, faithfulness 1 exactly).
    progress("Faithfulness", runs done, runs)."""
    graph = edge_graph(model)
    valid = graph.valid
    masks = torch.cat([torch.zeros_like(valid)[None], circuits.cpu().bool() & valid])  # the empty one first
    distinct, which = torch.unique(masks.flatten(1), dim=0, return_inverse=True)
    distinct = distinct.view(-1, *valid.shape)
    every = [bool(torch.equal(mask, valid)) for mask in distinct]
    full = clean_metric(model, clean, metric, batch_size)
    runs = [i for i, whole in enumerate(every) if not whole]
    values = torch.empty(len(distinct), clean.shape[0])
    for done, i in enumerate(runs, 1):
        values[i] = run_circuits(model, clean, distinct[i : i + 1].float(), ablated, metric, batch_size)[0]
        if progress:
            progress("Faithfulness", done, len(runs))
    for i, whole in enumerate(every):
        if whole:
            values[i] = full
    values = values[which]
    return Faithfulness(values=values[1:], full=full, empty=values[0])


@torch.no_grad()
def clean_metric(
    model: HookedTransformer, clean: Int[Tensor, "batch pos"], metric: Metric, batch_size: int = 16
) -> Float[Tensor, " batch"]:
    """The metric of the model itself on each prompt, the logits made only where an AnswerMetric reads."""
    out = []
    for rows in chunks(clean.shape[0], batch_size):
        logit_pos = logit_positions(metric, rows, clean.shape[1])
        logits = forward_logits(model, index_tokens(clean, rows), logit_pos)
        out.append(for_rows(metric, rows, clean.shape[0])(logits).float().cpu())
    return torch.cat(out)


@dataclass(kw_only=True)
class FaithfulnessCurve:
    """Faithfulness of the top circuits at several sizes, and MIB's summaries.

    CPR: area under faithfulness against the fraction of edges (trapezoid rule, higher is better);
    CMD: area between the curve and 1, |1 - f| (lower is better), as MIB's circuit track computes them.
    MIB's leaderboard takes CPR from circuits of the edges that help most (ranked by signed score,
    `signed_result`) and CMD from circuits ranked by |score| (`result`); `cpr_abs` and `cmd_signed`
    give the other pairings.
    """

    fractions: tuple[float, ...]
    n_edges: list[int]  # edges kept after pruning (ranked by |score|)
    result: Faithfulness  # circuits ranked by |score|
    random: Faithfulness | None = None
    random_n_edges: list[int] | None = None
    signed_result: Faithfulness | None = None  # circuits ranked by signed score (None: not measured)

    @property
    def faithfulness(self) -> Tensor:
        return self.result.faithfulness

    @property
    def cpr(self) -> float:
        """MIB's CPR: over the signed ranking when measured, else over the |score| ranking."""
        ranked = self.result if self.signed_result is None else self.signed_result
        return area_under(self.fractions, ranked.faithfulness.tolist())

    @property
    def cmd(self) -> float:
        """MIB's CMD: over the |score| ranking."""
        return area_under(self.fractions, [abs(1 - f) for f in self.faithfulness.tolist()])

    @property
    def cpr_abs(self) -> float:
        return area_under(self.fractions, self.faithfulness.tolist())

    @property
    def cmd_signed(self) -> float | None:
        if self.signed_result is None:
            return None
        return area_under(self.fractions, [abs(1 - f) for f in self.signed_result.faithfulness.tolist()])

    @property
    def random_cpr(self) -> float | None:
        return None if self.random is None else area_under(self.fractions, self.random.faithfulness.tolist())

    @property
    def random_cmd(self) -> float | None:
        if self.random is None:
            return None
        return area_under(self.fractions, [abs(1 - f) for f in self.random.faithfulness.tolist()])


def area_under(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Trapezoid-rule area under (x, y) points."""
    return sum((x2 - x1) * (y1 + y2) / 2 for x1, x2, y1, y2 in zip(xs, xs[1:], ys, ys[1:], strict=False))


def faithfulness_curve(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    scores: EdgeScores,
    fractions: Sequence[float] = MIB_FRACTIONS,
    *,
    ablation: Ablation | AblationKind = "counterfactual",
    random_baseline: bool = True,
    seed: int = 0,
    batch_size: int = 16,
    progress: Progress | None = None,
    families: Sequence[Hashable] | None = None,
) -> FaithfulnessCurve:
    """Faithfulness of the top-|score| and the top-signed-score circuits at each fraction of edges, and
    of random circuits (drawn with `seed`), all in one `faithfulness` (one run per distinct circuit).
    ablation, families: as `faithfulness`. progress("Faithfulness curve", runs done, runs)."""
    graph = scores.graph
    fractions = tuple(float(f) for f in fractions)
    if any(not 0 < f <= 1 for f in fractions) or list(fractions) != sorted(fractions):
        raise ValueError(f"fractions must increase within (0, 1], got {fractions}.")

    def circuits_of(s: EdgeScores, signed: bool = False) -> Tensor:
        return torch.stack([top_circuit(s, int(f * graph.n_edges), signed=signed) for f in fractions])

    tops = torch.cat([circuits_of(scores), circuits_of(scores, signed=True)])  # |score|, then signed
    rand = circuits_of(random_scores(graph, seed)) if random_baseline else None
    evaluated = faithfulness(
        model, clean, corrupted, metric, tops if rand is None else torch.cat([tops, rand]), ablation=ablation,
        batch_size=batch_size, progress=as_stage(progress, "Faithfulness curve"), families=families,
    )  # fmt: skip
    n = len(fractions)

    def part(start: int) -> Faithfulness:
        return replace(evaluated, values=evaluated.values[start : start + n])

    return FaithfulnessCurve(
        fractions=fractions,
        n_edges=[int(c.sum()) for c in tops[:n]],
        result=part(0),
        random=None if rand is None else part(2 * n),
        random_n_edges=None if rand is None else [int(c.sum()) for c in rand],
        signed_result=part(n),
    )


@dataclass(kw_only=True)
class RemovalEffects:
    """Each edge's effect of removal from a circuit (the rest of the circuit kept, every other edge
    ablated): m(circuit without the edge) - m(circuit), mean over prompts, in the metric's units
    (negative: the edge helps the circuit's metric; the sign of attribution scores, relative to the
    circuit instead of the model).

    edges: (writer, reader) of the circuit's edges [n, 2], in graph order; estimate [n]: first order,
    -d m / d keep[edge] at the circuit; measured [n]: the circuit run without the edge, for the edges
    of largest |estimate|, or of another ranking's (NaN for the others); circuit_metric: m(circuit),
    the mean over the prompts; ranked_elsewhere: whether values from other prompts chose the measured
    edges (`removal_effects`' rank_by), not these prompts' estimates."""

    edges: Int[Tensor, "n 2"]
    estimate: Float[Tensor, " n"]
    measured: Float[Tensor, " n"]
    circuit_metric: float
    ranked_elsewhere: bool = False

    @property
    def n_measured(self) -> int:
        return int(self.measured.isfinite().sum())

    def effects(self) -> dict[tuple[int, int], tuple[float, bool]]:
        """(writer, reader) -> (the edge's effect, whether measured): measured where it was, else the
        estimate."""
        return {
            (writer, reader): (estimate, False) if measured != measured else (measured, True)
            for (writer, reader), estimate, measured in zip(
                self.edges.tolist(), self.estimate.tolist(), self.measured.tolist(), strict=True
            )
        }


def removal_effects(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    circuit: Bool[Tensor, "writer reader"],
    n_measured: int = 25,
    *,
    ablation: Ablation | AblationKind = "counterfactual",
    rank_by: Float[Tensor, " n"] | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> RemovalEffects:
    """Each edge of `circuit`'s effect of removal on these prompts (`RemovalEffects`): estimated for
    every edge by one forward and backward pass of the circuit per batch, then measured for the
    `n_measured` edges of largest |rank_by| (ties: graph order) by one run of the circuit without each.
    rank_by: a value per edge of the circuit, in graph order, that chooses the measured edges, e.g. the
    estimates on the prompts that chose the circuit (`.estimate` of a call on them), so that the edges
    measured on held-out prompts are not chosen on them; None: this call's estimates. ablation: what
    ablated edges carry (`ablated_outputs`). progress("Edge effects", batches and runs done, batches
    and runs)."""
    ablation = edge_ablation(ablation)
    check_gradient_dtype(model.dtype, "removal_effects' estimate")
    check_differentiable(metric, "removal_effects' estimate")
    clean, corrupted = edge_pair(model, clean, corrupted, ablation)
    metric = check_reads_real_tokens(model, metric, clean)
    graph = edge_graph(model)
    if not isinstance(circuit, Tensor) or tuple(circuit.shape) != (graph.n_writers, graph.n_readers):
        raise ValueError(
            f"circuit must be a [{graph.n_writers}, {graph.n_readers}] mask of this model's edge graph "
            "(writers x readers); build it with top_circuit"
        )
    if circuit.dtype != torch.bool and not ((circuit == 0) | (circuit == 1)).all():
        raise ValueError("circuit must be a mask of kept edges (bool, or 0 and 1 only)")
    if n_measured < 0:
        raise ValueError(f"n_measured={n_measured} must be 0 (estimates only) or a number of edges.")
    if ablation.kind == "counterfactual":
        check_distinct_pair(clean, corrupted, "every ablated edge (counterfactual: the corrupted run's)")
    kept = circuit.cpu().bool() & graph.valid
    ablated = ablated_outputs(model, clean, corrupted, ablation)
    n = clean.shape[0]
    batches = chunks(n, batch_size)
    edges = graph.edges(kept)
    n_runs = len(batches) + 1 + min(n_measured, len(edges))  # the gradient's batches, the circuit, each edge
    gradient = torch.zeros(graph.n_writers, graph.n_readers)
    with torch.enable_grad():
        for done, rows in enumerate(batches, 1):
            keep = kept.float().to(model.device).requires_grad_(True)
            abl = ablated if ablated.shape[1] == 1 else ablated[:, rows.to(ablated.device)]
            logit_pos = logit_positions(metric, rows, clean.shape[1])
            logits = masked_logits(model, graph, index_tokens(clean, rows), keep, abl, logit_pos)
            values = for_rows(read_at(metric, logit_pos), rows, n)(logits).float()
            gradient += torch.autograd.grad(values.sum(), keep)[0].float().cpu()
            if progress:
                progress(REMOVAL_STAGE, done, n_runs)
    estimate = -gradient[kept] / n  # [n_edges], graph order (row-major, as graph.edges)
    measured = torch.full_like(estimate, torch.nan)
    if rank_by is None:
        rank_by = estimate
    elif tuple(rank_by.shape) != (len(edges),):
        raise ValueError(
            f"rank_by must hold one value per edge of the circuit ({len(edges)}, in graph order: a "
            f"RemovalEffects' estimate of the same circuit), got shape {tuple(rank_by.shape)}"
        )
    order = sorted(range(len(edges)), key=lambda i: -abs(float(rank_by[i])))[:n_measured]
    circuit_values = run_circuits(model, clean, kept[None].float(), ablated, metric, batch_size)[0]
    if progress:
        progress(REMOVAL_STAGE, len(batches) + 1, n_runs)
    for done, i in enumerate(order, len(batches) + 2):
        without = kept.clone()
        without[edges[i]] = False
        values = run_circuits(model, clean, without[None].float(), ablated, metric, batch_size)[0]
        measured[i] = float((values - circuit_values).mean())
        if progress:
            progress(REMOVAL_STAGE, done, n_runs)
    return RemovalEffects(
        edges=torch.tensor(edges, dtype=torch.long).view(-1, 2), estimate=estimate, measured=measured,
        circuit_metric=float(circuit_values.mean()), ranked_elsewhere=rank_by is not estimate,
    )  # fmt: skip
