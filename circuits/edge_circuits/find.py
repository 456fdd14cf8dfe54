"""Edge circuits: scores, mask, size and selection frequencies on discovery prompts; faithfulness, its
CI and curve on held-out ones (`split_task`). Scores estimate m(edge ablated) - m(clean) in the metric's
units (negative: the edge helps); "prune" and "ensemble" scores only rank, and their edges are listed by
m(circuit without the edge) - m(circuit) on the held-out prompts (`interp.edges.removal_effects`),
measured for the edges of largest estimate on the discovery prompts.

`--format json`: schema "interp-edge-circuit-3" (`EdgeCircuitResult.json_data`), in docs/guide/edges.md.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Bool
from torch import Tensor

import interp
from circuits.edge_circuits.tasks import EdgeTask
from circuits.evidence import (
    FamilySplit,
    StratumFaithfulness,
    check_apart,
    faithfulness_band,
    faithfulness_by_stratum,
    held_out_unit,
    resampled_words,
    split_families,
    undetermined_faithfulness,
)
from circuits.finding import Finding
from circuits.path.task import family_rows
from interp import edges
from interp.edges.evaluate import clean_metric
from interp.edges.intervene import logit_positions
from interp.edges.pruning import checkpoint_step
from interp.model import HookedTransformer
from interp.types import MemorySize, Progress, memory_bytes

SCHEMA = "interp-edge-circuit-3"
CIRCUIT_METHODS: tuple[str, ...] = (*edges.METHODS, "prune", "ensemble")
ENSEMBLE_MEMBERS: tuple[str, ...] = ("eap-ig", "prune")  # the methods `method="ensemble"` ranks with
MASK_METHODS: tuple[str, ...] = ("prune", "ensemble")  # the methods that train an edge mask (prune_steps)
SIGN_CONVENTION = (
    "edge scores estimate m(edge ablated) - m(clean) in the metric's units: negative, the edge helps the "
    "clean answer; positive, it works against it; circuits keep the largest |score|"
)
RANK_CONVENTION = (
    "edge scores rank edges (prune: -(the last step the edge was in the learned mask + its learned "
    "score's rank) / (steps + 2), the final circuit first; ensemble: -(mean normalised rank by |score|)); "
    "circuits keep the largest |score|; a learned mask repeats on one CPU, but another CPU's float rounding "
    "over its training can move its size and verdict (docs/results/circuits.md, the learned circuit across "
    "CPUs): attribution's ranking (eap, eap-ig) moves by the rounding only"
)
REMOVAL_CONVENTION = (
    "; the circuit's edges are listed by their effect of removal instead: m(circuit without the edge) - "
    "m(circuit) on the held-out prompts, in the metric's units (negative: the edge helps the circuit), "
    "which orders the edges and changes none of them"
)


@dataclass(frozen=True, kw_only=True)
class CircuitEdge:
    """One edge of a circuit as reports list it. frequency: selection frequency (None: not measured);
    removal_effect: m(circuit without it) - m(circuit) in the metric's units (None: attribution scores),
    measured or a first-order estimate (`removal_measured`)."""

    writer: str
    reader: str
    score: float
    frequency: float | None
    removal_effect: float | None
    removal_measured: bool | None


@dataclass(kw_only=True)
class EdgeCircuitResult:
    """What `find_edge_circuit` found. circuit: [writer, reader] bool mask of the kept edges; task: the
    discovery prompts; heldout_task: those `faithfulness`, the metrics and `curve` are measured on (None
    in a result saved before held-out prompts: everything on `task`); split: the split in words."""

    model: str
    task: EdgeTask
    scores: edges.EdgeScores
    circuit: Bool[Tensor, "writer reader"]
    requested_edges: int
    faithfulness: edges.Faithfulness
    clean_metric: float
    corrupted_metric: float
    curve: edges.FaithfulnessCurve | None
    seconds: dict[str, float]
    n_kv_heads: int
    ig_points: str = "paper"  # EAP-IG's integration points (edges.IG_POINTS)
    provenance: str = ""  # interp.provenance(model)
    target: float | None = None  # the faithfulness the size was searched for; None: the size was given
    frequency: Tensor | None = None  # [writer, reader] selection frequency over bootstrap resamples
    n_boot: int = 0  # the resamples behind `frequency` (0: not measured)
    heldout_task: EdgeTask | None = None
    discovery_faithfulness: edges.Faithfulness | None = None  # on the discovery prompts, shown beside
    split: str = ""
    heads: Finding | None = None  # the head path on the same prompt pairs (`circuits.path`), if run
    removal: edges.RemovalEffects | None = None  # rank-scored methods: each edge's effect of removal
    size_search: dict[int, float] | None = None  # a searched size: discovery faithfulness at each size tried

    @property
    def held_out(self) -> bool:
        return self.heldout_task is not None

    def held_out_note(self) -> str:
        """How the discovery faithfulness fares on the held-out prompts, in words ("" when not held out)."""
        if self.discovery_faithfulness is None:
            return ""
        low, high = (float(bound[0]) for bound in self.faithfulness.ci())
        unit = held_out_unit(None if self.heldout_task is None else self.heldout_task.families)
        measured = (self.faithfulness, self.discovery_faithfulness)  # held out, discovery
        held, found = (float(faith.faithfulness[0]) for faith in measured)
        band, there = (
            "undetermined" if undetermined_faithfulness(faith.summary()) else faithfulness_band(ratio)
            for ratio, faith in zip((held, found), measured, strict=True)
        )
        band, there = (word.replace("within", "faithful") for word in (band, there))
        if band == there:
            return f"{band} on held-out {unit}, as on discovery ({held:.3g}; on discovery {found:.3g})"
        held_ci = f"{held:.3g} " + ("(no CI)" if math.isnan(low) else f"[{low:.3g}, {high:.3g}]")
        return f"{band} on held-out {unit}: {held_ci} against {found:.3g} ({there}) on discovery"

    @property
    def graph(self) -> edges.EdgeGraph:
        return self.scores.graph

    @property
    def nodes(self) -> list[str]:
        return edges.node_circuit(self.graph, self.circuit)

    def circuit_edges(self) -> list[tuple[str, str, float]]:
        """(writer, reader, effect of removal where measured or estimated, else score), strongest first."""
        return [
            (row.writer, row.reader, row.score if row.removal_effect is None else row.removal_effect)
            for row in self.circuit_edge_rows()
        ]

    def circuit_edge_rows(self) -> list[CircuitEdge]:
        """The circuit's edges, strongest first: by |score|, or with `removal` the measured ones by
        |effect of removal|, then the others by |estimate| (ties: the stronger score first)."""
        effects = {} if self.removal is None else self.removal.effects()
        rows = [
            CircuitEdge(
                writer=self.graph.writers[w], reader=self.graph.readers[r],
                score=float(self.scores.scores[w, r]), frequency=self.edge_frequency(w, r),
                removal_effect=effects.get((w, r), (None, None))[0],
                removal_measured=effects.get((w, r), (None, None))[1],
            )
            for w, r in self.graph.edges(self.circuit)
        ]  # fmt: skip
        rows.sort(key=lambda row: -abs(row.score))
        if self.removal is not None:
            rows.sort(key=lambda row: (not row.removal_measured, -abs(row.removal_effect)))
        return rows

    def edge_frequency(self, writer: int, reader: int) -> float | None:
        return None if self.frequency is None else float(self.frequency[writer, reader])

    @property
    def ci_resamples(self) -> str:
        """What the faithfulness CIs resample (`resampled_words`)."""
        return resampled_words(self.faithfulness.families)

    def faithfulness_strata(self) -> list[StratumFaithfulness]:
        """The faithfulness per stratum and family of the prompts it is measured on."""
        faith = self.faithfulness
        masks = (self.heldout_task or self.task).stratum_masks()
        return faithfulness_by_stratum(faith.values[0], faith.full, faith.empty, masks, 0, faith.families)

    def score_convention(self) -> str:
        """What an edge's score means, and what the circuit's edges are listed by."""
        if self.scores.method in edges.METHODS:
            return SIGN_CONVENTION
        return RANK_CONVENTION + ("" if self.removal is None else REMOVAL_CONVENTION)

    def json_data(self, top: int = 50) -> dict:
        """What `--format json` holds (the module docstring's schema), with the `top` strongest edges."""
        low, high = self.faithfulness.ci()
        summary = self.faithfulness.summary()
        graph, found, curve = self.graph, self.discovery_faithfulness, self.curve
        strata = [
            {"kind": s.kind, "name": s.name, "n_prompts": s.n_prompts,
             **({} if s.summary is None else {"faithfulness": s.summary.ratio,
                "faithfulness_ci": list(s.summary.ratio_ci), "faithfulness_error": s.summary.error,
                "faithfulness_within": s.summary.within})}
            for s in self.faithfulness_strata()
        ]  # fmt: skip
        return {
            "schema": SCHEMA,
            "model": {"name": self.model, "provenance": self.provenance, "n_layers": graph.n_layers,
                      "n_heads": graph.n_heads, "n_kv_heads": self.n_kv_heads},
            "task": {"name": self.task.name, "n_prompts": self.task.n_prompts,
                     "n_heldout": None if self.heldout_task is None else self.heldout_task.n_prompts,
                     "split": self.split, "metric": self.task.metric_name, "clean_metric": self.clean_metric,
                     "corrupted_metric": self.corrupted_metric},
            "method": {"name": self.scores.method, "steps": self.scores.steps,
                       "ablation": self.scores.ablation, "ig_points": self.ig_points,
                       "bootstrap": self.n_boot, "score_convention": self.score_convention()},
            "graph": {"n_nodes": graph.n_writers + 1, "n_edges": graph.n_edges},
            "circuit": {
                "requested_edges": self.requested_edges, "size_target": self.target,
                "n_edges": int(self.circuit.sum()), "nodes": self.nodes,
                "metric": float(self.faithfulness.values[0].mean()),  # m(circuit), every other edge ablated
                "ablated_metric": float(self.faithfulness.empty.mean()),  # m(every edge ablated)
                "edges": [dataclasses.asdict(row) for row in self.circuit_edge_rows()],
                "faithfulness": float(self.faithfulness.faithfulness[0]),
                "faithfulness_ci": [float(low[0]), float(high[0])], "ci_resamples": self.ci_resamples,
                "faithfulness_error": summary.error, "faithfulness_within": summary.within,
                "model_effect": summary.model_effect, "model_effect_ci": list(summary.model_effect_ci),
                "faithfulness_strata": strata,
                "discovery_faithfulness": None if found is None else float(found.faithfulness[0]),
                "discovery_faithfulness_ci": None if found is None else [float(b[0]) for b in found.ci()],
                "held_out_note": self.held_out_note(),
                "size_search": self.size_search and list(map(list, self.size_search.items())),
            },
            "curve": None if curve is None else {
                "fractions": list(curve.fractions), "n_edges": curve.n_edges,
                "faithfulness": curve.faithfulness.tolist(),
                "ci_low": curve.result.ci()[0].tolist(), "ci_high": curve.result.ci()[1].tolist(),
                "cpr": curve.cpr, "cmd": curve.cmd,  # MIB's: ranked by signed score, by |score|
                "cpr_abs": curve.cpr_abs, "cmd_signed": curve.cmd_signed,
                "faithfulness_signed": curve.signed_result.faithfulness.tolist(),
                "random": None if curve.random is None else {
                    "n_edges": curve.random_n_edges, "faithfulness": curve.random.faithfulness.tolist(),
                    "cpr": curve.random_cpr, "cmd": curve.random_cmd},
            },
            "top_edges": [{"edge": name, "score": score,
                           "frequency": self.edge_frequency(*graph.edge_index(name))}
                          for name, score in self.scores.top(top)],
            "seconds": self.seconds,
            "heads": None if self.heads is None else self.heads.json_data(),
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class EdgeCircuitSettings:
    """The choices of `find_edge_circuit` (each checked as its `interp circuit` option).

    method: one of `edges.METHODS` (attribution), "prune" (a mask learned in `prune_steps` steps towards
    keeping `density` of the edges: by default the requested size's share) or "ensemble" (the mean
    normalised rank of `ENSEMBLE_MEMBERS`). n_edges or fraction (of all edges): the circuit's size;
    neither: the fewest edges reaching faithfulness `target` on the discovery prompts. steps, ig_points:
    EAP-IG's integration. batch_size: prompts per run; max_memory (bytes or "2GiB"): picks the scores'
    batch size instead. curve_fractions: the faithfulness curve's sizes (None: no curve), with random
    circuits when `random_baseline`. bootstrap: resamples of the prompts for each edge's selection
    frequency (0: not measured). seed: the held-out half, the mask's batch order, the random circuits
    and resamples. measured_edges: rank-scored methods' edges whose effect of removal is measured.
    """

    method: str = "prune"
    n_edges: int | None = None
    fraction: float | None = None
    target: float = 0.8
    steps: int = 5
    ig_points: edges.IGPoints = "paper"
    ablation: edges.AblationKind = "counterfactual"
    batch_size: int = 16
    max_memory: MemorySize | None = None
    curve_fractions: tuple[float, ...] | None = edges.MIB_FRACTIONS
    random_baseline: bool = True
    bootstrap: int = 0
    prune_steps: int = edges.PruneSettings.steps
    density: float | None = None
    seed: int = 0
    measured_edges: int = 25

    def __post_init__(self) -> None:
        refusals = [  # (refused, what to pass instead), in the order checked
            (self.n_edges is not None and self.fraction is not None,
             "give the circuit size as --edges N or --fraction F (one of them), or neither to search."),
            (self.fraction is not None and not 0 < self.fraction <= 1,
             f"--fraction {self.fraction} must lie in (0, 1]: the fraction of all edges, e.g. 0.05."),
            (not 0 < self.target <= 1, f"--target {self.target} must lie in (0, 1]; 0.8 is a common choice."),
            (self.bootstrap < 0,
             f"--bootstrap {self.bootstrap} must be 0 (not measured) or a number of resamples, e.g. 20."),
            (self.density is not None and not 0 < self.density < 1,
             f"--density {self.density} must lie in (0, 1): the fraction of edges the mask keeps, e.g. "
             "0.02."),
            (self.prune_steps < 1, f"--prune-steps {self.prune_steps} must be at least 1."),
            (self.density is not None and self.method not in MASK_METHODS,
             f"--density is read by --method prune or ensemble, not by {self.method}: leave it out."),
            (self.ig_points != "paper" and self.method.startswith("eap-ig-activations"),
             f"--ig-points applies to eap-ig (over inputs); {self.method} takes alpha = k/m, k = 1..m."),
            (self.max_memory is not None and self.method == "exact",
             "--max-memory applies to the gradient methods (eap, eap-ig, ...), not to exact."),
        ]  # fmt: skip
        for refused, message in refusals:
            if refused:
                raise ValueError(message)
        if self.max_memory is not None:
            try:
                memory_bytes(self.max_memory)
            except ValueError as error:
                raise ValueError(f"--max-memory: {error}") from error
        for name, value, allowed in [
            ("method", self.method, CIRCUIT_METHODS), ("ablation", self.ablation, edges.ABLATIONS),
            ("ig-points", self.ig_points, edges.IG_POINTS),
        ]:  # fmt: skip
            if value not in allowed:
                raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}.")
        if self.measured_edges < 0:
            raise ValueError(
                f"measured_edges={self.measured_edges} must be 0 (estimates only) or a number of edges."
            )

    def requested_edges(self, graph: edges.EdgeGraph) -> int | None:
        """The circuit's size in edges (`n_edges`, or `fraction` of the graph's); None: searched for."""
        requested = self.n_edges if self.fraction is None else edges.fraction_to_edges(graph, self.fraction)
        if requested is not None and not 0 < requested <= graph.n_edges:
            raise ValueError(f"The circuit size must lie in 1..{graph.n_edges} edges, got {requested}.")
        return requested

    def pruning(self, graph: edges.EdgeGraph, requested: int | None) -> edges.PruneSettings:
        """The mask's training: towards `density`, else the requested size's share, else the default."""
        density = self.density
        if density is None:
            default = edges.PruneSettings().density
            density = default if requested is None else min(requested, graph.n_edges - 1) / graph.n_edges
        return edges.PruneSettings(density=density, steps=self.prune_steps, seed=self.seed)


def find_edge_circuit(
    model: HookedTransformer,
    task: EdgeTask,
    settings: EdgeCircuitSettings = EdgeCircuitSettings(),
    *,
    heldout: EdgeTask | None = None,
    checkpoint: str | None = None,
    progress: Progress | None = None,
) -> EdgeCircuitResult:
    """The edge circuit of `task`, in the numbered steps below; heldout: the prompts that test it (None:
    half of `task`'s families); checkpoint: the edge mask's; progress: `edge_circuit_stages`' stages."""
    graph = edges.edge_graph(model)
    requested = settings.requested_edges(graph)
    check_ablation(task, settings.ablation, "prompts")
    task, heldout, split = split_task(task, heldout, settings.seed)  # 1.
    check_ablation(heldout, settings.ablation, "held-out prompts")
    model.eval()
    seconds: dict[str, float] = {}
    began = time.perf_counter()

    def stage(name: str) -> None:  # the seconds since the last stage ended
        seconds[name] = time.perf_counter() - began - sum(seconds.values())

    pruning = settings.pruning(graph, requested)  # 2.
    resumed = mask_checkpoint_step(model, task, settings, pruning, checkpoint)
    scores, scores_of = method_scores(model, task, settings, pruning, checkpoint, progress)
    stage("scores")
    size, tried = requested, None
    if not requested:  # 3.
        size, tried = smallest_faithful_size(
            model, task, scores, settings.target, settings.ablation, settings.batch_size, progress
        )
    circuit = edges.top_circuit(scores, size)
    found, faith, corrupted = circuit_faithfulness(model, task, heldout, circuit, settings, progress)  # 4.
    stage("circuit")
    held = dict(
        ablation=heldout.ablation(settings.ablation), batch_size=settings.batch_size, progress=progress
    )
    curve = frequency = removal = None
    if settings.curve_fractions is not None:  # 5.
        curve = edges.faithfulness_curve(
            model, *heldout.pair, scores, settings.curve_fractions, random_baseline=settings.random_baseline,
            seed=settings.seed, families=heldout.families, **held,
        )  # fmt: skip
        stage("curve")
    if settings.bootstrap > 0:  # 6.
        frequency = edges.selection_frequency(
            scores_of, task.n_prompts, size, settings.bootstrap, settings.seed, progress
        )
        stage("stability")
    if settings.method not in edges.METHODS:  # 7. the edges measured chosen by their discovery estimates
        chosen = edges.removal_effects(
            model, *task.pair, circuit, 0, ablation=task.ablation(settings.ablation),
            batch_size=settings.batch_size,
        ).estimate  # fmt: skip
        removal = edges.removal_effects(
            model, *heldout.pair, circuit, settings.measured_edges, rank_by=chosen, **held
        )
        stage("effects")
    provenance = interp.provenance(model) + resumed_note(checkpoint, resumed, pruning)
    return EdgeCircuitResult(
        model=model.cfg.model_name, task=task, scores=scores, circuit=circuit, requested_edges=size,
        faithfulness=faith, clean_metric=float(faith.full.mean()), corrupted_metric=corrupted, curve=curve,
        seconds=seconds, n_kv_heads=model.cfg.n_kv_heads, ig_points=settings.ig_points,
        provenance=provenance, target=settings.target if requested is None else None,
        frequency=frequency, n_boot=settings.bootstrap, heldout_task=heldout, discovery_faithfulness=found,
        split=split, removal=removal, size_search=tried,
    )  # fmt: skip


def mask_checkpoint_step(
    model: HookedTransformer,
    task: EdgeTask,
    settings: EdgeCircuitSettings,
    pruning: edges.PruneSettings,
    checkpoint: str | None,
) -> int | None:
    """The step the edge mask resumes `checkpoint` from (None: no checkpoint or no file yet, or a method
    that trains no mask); a file that is not this mask's checkpoint (another model, prompts, metric or
    settings; no checkpoint at all) refused here, before the edge scores (`checkpoint_step`)."""
    if checkpoint is None or settings.method not in MASK_METHODS:
        return None
    prompts = task.subset(torch.arange(task.n_prompts))  # as `method_scores` trains the mask on them
    return checkpoint_step(
        model, *prompts.pair, pruning, checkpoint, ablation=prompts.ablation(settings.ablation),
        start=ENSEMBLE_MEMBERS[0] if settings.method == "ensemble" else None,  # its first member's ranks
    )  # fmt: skip


def resumed_note(checkpoint: str | None, resumed: int | None, pruning: edges.PruneSettings) -> str:
    """The provenance's note of a mask resumed from its checkpoint ("" where none was)."""
    if resumed is None:
        return ""
    return (
        f"; the edge mask resumed from {checkpoint} at step {resumed} of {pruning.steps} (not trained "
        "from scratch in this run)"
    )


def check_ablation(task: EdgeTask, ablation: edges.AblationKind, which: str) -> None:
    """Refuse resample ablation on prompts of different lengths (`which`: the task's prompts in words)."""
    if ablation == "resample" and task.corrupted_mask is not None:
        raise ValueError(
            f"task {task.name}'s {which} differ in length (right-padded), and resample ablation would "
            "give a prompt another's tokens or padding at its positions; use --ablation mean (the mean "
            "over the prompts real at each position), counterfactual or zero"
        )


def circuit_faithfulness(
    model: HookedTransformer,
    task: EdgeTask,
    heldout: EdgeTask,
    circuit: Bool[Tensor, "writer reader"],
    settings: EdgeCircuitSettings,
    progress: Progress | None,
) -> tuple[edges.Faithfulness, edges.Faithfulness, float]:
    """The circuit's faithfulness on the discovery and on the held-out prompts, and the model's mean
    metric on the held-out corrupted prompts (at their own positions)."""
    found, faith = (
        edges.faithfulness(
            model, *prompts.pair, circuit, ablation=prompts.ablation(settings.ablation),
            batch_size=settings.batch_size, progress=progress, families=prompts.families,
        )
        for prompts in (task, heldout)
    )  # fmt: skip
    corrupted_metric = heldout.corrupted_metric or heldout.metric
    corrupted_value = clean_metric(model, heldout.corrupted, corrupted_metric, settings.batch_size)
    return found, faith, float(corrupted_value.mean())


def split_task(
    task: EdgeTask, heldout: EdgeTask | None = None, seed: int = 0
) -> tuple[EdgeTask, EdgeTask, str]:
    """(discovery prompts, held-out prompts, the split in words): `task` and `heldout` when given; else
    whole families of `task` (each prompt its own where it has none), a seeded half held out
    (`circuits.evidence.split_families`, the head path's rule)."""
    if heldout is not None:
        ends = [
            logit_positions(t.metric, torch.arange(t.n_prompts), t.clean.shape[1]) for t in (task, heldout)
        ]
        check_apart(task.clean, heldout.clean, *ends)  # up to where each metric reads, where it says
        if task.families is not None and heldout.families is not None:
            chose, tested = tuple(dict.fromkeys(task.families)), tuple(dict.fromkeys(heldout.families))
            return task, heldout, FamilySplit(chose, tested).describe()
        return task, heldout, f"chosen on {task.n_prompts} prompts; tested on {heldout.n_prompts} others"
    if task.families is None and task.n_prompts < 2:
        raise ValueError(
            f"task {task.name} has {task.n_prompts} prompt pair; a circuit is tested on prompts that did not "
            "find it, so give two or more (or held-out prompts)"
        )
    labels = task.families if task.families is not None else [str(i) for i in range(task.n_prompts)]
    families = split_families(labels, seed=seed)
    chose, tested = (task.subset(rows) for rows in family_rows(labels, families))
    if task.families is not None:
        return chose, tested, families.describe()
    return chose, tested, (
        f"chosen on {chose.n_prompts} prompts; tested on the other {tested.n_prompts} (no family column: "
        "held-out prompts, not families)"
    )  # fmt: skip


def method_scores(
    model: HookedTransformer,
    task: EdgeTask,
    settings: EdgeCircuitSettings,
    pruning: edges.PruneSettings,
    checkpoint: str | None = None,
    progress: Progress | None = None,
) -> tuple[edges.EdgeScores, Callable[[Tensor], edges.EdgeScores] | None]:
    """`settings.method`'s scores on the task's prompts, and a function scoring a resample of them
    (prompt indices [n]; None for attribution without bootstrap): attribution then scores each prompt
    alone (a resample's scores are its prompts' mean), edge pruning runs again."""
    graph = edges.edge_graph(model)
    steps, ablation, ig_points = settings.steps, settings.ablation, settings.ig_points

    def attribution(name: str) -> tuple[edges.EdgeScores, Callable[[Tensor], edges.EdgeScores] | None]:
        if settings.bootstrap > 0:
            each = edges.prompt_scores(
                model, *task.pair, name, steps, task.ablation(ablation), progress, ig_points=ig_points
            )
            like = edges.EdgeScores(
                graph=graph, scores=each.mean(0), method=name, ablation=ablation,
                steps=1 if name == "eap" else steps, n_prompts=task.n_prompts,
            )  # fmt: skip
            return like, lambda rows: edges.mean_scores(graph, each, rows, like)
        scores = edges.edge_attribution(
            model, *task.pair, name, steps, ablation=task.ablation(ablation), progress=progress,
            batch_size=settings.batch_size if settings.max_memory is None else None, ig_points=ig_points,
            max_memory=settings.max_memory,
        )  # fmt: skip
        return scores, None

    def pruned(
        rows: Tensor | None, report: Progress | None = None, start: edges.EdgeScores | None = None
    ) -> edges.EdgeScores:
        """The learned mask's scores on the prompts `rows` (None: all, the run `checkpoint` keeps),
        started from `start` (None: EAP-IG on those prompts)."""
        prompts = task.subset(torch.arange(task.n_prompts) if rows is None else rows)
        return edges.prune_edges(
            model, *prompts.pair, pruning, ablation=prompts.ablation(ablation), start=start,
            checkpoint=checkpoint if rows is None else None, progress=report,
        )  # fmt: skip

    if settings.method == "prune":
        return pruned(None, progress), pruned
    if settings.method == "ensemble":  # the mask starts from the EAP-IG member's scores: EAP-IG runs once
        first, first_of = attribution(ENSEMBLE_MEMBERS[0])
        scores = edges.ensemble([first, pruned(None, progress, first)])
        if first_of is None:
            return scores, None

        def resampled(rows: Tensor) -> edges.EdgeScores:
            member = first_of(rows)
            return edges.ensemble([member, pruned(rows, start=member)])

        return scores, resampled
    return attribution(settings.method)


SIZE_SEARCH_STAGE = "Size search"  # the stage smallest_faithful_size reports


def edge_circuit_stages(method: str, searched: bool, curve: bool, bootstrap: int = 0) -> list[str]:
    """The stages `find_edge_circuit` reports, in order."""
    ranked = method in MASK_METHODS
    stages = ["Edge scores"] + (["Edge pruning"] if ranked else [])
    stages += [SIZE_SEARCH_STAGE] if searched else []
    stages += ["Faithfulness"] + (["Faithfulness curve"] if curve else [])
    return stages + (["Edge stability"] if bootstrap > 0 else []) + ([edges.REMOVAL_STAGE] if ranked else [])


def smallest_faithful_size(
    model: HookedTransformer, task: EdgeTask, scores: edges.EdgeScores, target: float = 0.8,
    ablation: edges.AblationKind = "counterfactual", batch_size: int = 16, progress: Progress | None = None,
) -> tuple[int, dict[int, float]]:  # fmt: skip
    """The fewest top-|score| edges whose circuit reaches faithfulness `target`, and the faithfulness at
    each size tried (size -> faithfulness): MIB's sizes first (one batched run), then bisection
    (faithfulness assumed to grow with size; `size_search_note` says where it did not).
    progress(SIZE_SEARCH_STAGE, circuits evaluated, circuits to evaluate: an upper bound until MIB's
    sizes have run)."""
    n_all = scores.graph.n_edges
    sizes = sorted({max(1, edges.fraction_to_edges(scores.graph, f)) for f in edges.MIB_FRACTIONS} | {n_all})
    evaluated, tried = 0, {}

    def faithful(sizes: list[int], total: int) -> list[float]:
        nonlocal evaluated
        circuits = torch.stack([edges.top_circuit(scores, n) for n in sizes])

        def runs_done(_: str, done: int, runs: int) -> None:  # the runs (the empty circuit's too) as circuits
            progress(SIZE_SEARCH_STAGE, evaluated + done * len(sizes) // runs, total)

        result = edges.faithfulness(
            model, *task.pair, circuits, ablation=task.ablation(ablation), batch_size=batch_size,
            progress=None if progress is None else runs_done,
        )  # fmt: skip
        evaluated += len(sizes)
        if progress is not None:
            progress(SIZE_SEARCH_STAGE, evaluated, total)
        tried.update(zip(sizes, result.faithfulness.tolist(), strict=True))
        return result.faithfulness.tolist()

    if progress is not None:
        progress(SIZE_SEARCH_STAGE, 0, len(sizes) + math.ceil(math.log2(n_all)))
    found = faithful(sizes, len(sizes) + math.ceil(math.log2(n_all)))
    reached = [n for n, f in zip(sizes, found, strict=True) if f >= target]
    high = reached[0] if reached else n_all
    low = max([n for n in sizes if n < high], default=0)
    total = evaluated + math.ceil(math.log2(max(1, high - low)))
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if faithful([middle], total)[0] >= target else (middle, high)
    return high, dict(sorted(tried.items()))
