"""Edge circuits of tasks: IOI, induction and the user's own prompt pairs, found with `interp.edges`.

    task = ioi_task(model, n_prompts=64)     # or induction_task(model), file_task(model, "pairs.csv")
    heldout = ioi_task(model, 64, split="heldout")        # optional: else held out of `task` itself
    # a prompt-pair file as `interp circuit` splits it, once for the edges and the head classes:
    # task, heldout, pairs = circuit_tasks(model, "pairs.csv", heldout_families=("frame 2",))
    result = find_edge_circuit(model, task, EdgeCircuitSettings(n_edges=200), heldout=heldout)
    # EdgeCircuitSettings(method="eap-ig", fraction=0.05, seed=1, ...): the method, size and the rest
    result_json(result)          # circuits.sections: the `--format json` output, the schema below
    interp.edges.mib_json(result.scores, result.circuit, model.cfg)   # MIB's submission format

Prompt-pair files (CSV with a header, or JSONL, one object per line) have the fields `clean`,
`corrupted`, `correct` and `incorrect` (answers: one token each, mind the leading space; `incorrect` is
optional with the probability metric), and optionally `family` (a template, relation or task per
pair: the unit held out) and the rest `circuits.path.task` reads (the one read of a file). Clean and
corrupted prompts may differ in length.

Discovery and held-out prompts (`split_task`): the scores, the mask, the circuit's size and the edges'
selection frequencies come from the discovery prompts; the faithfulness, its CI, the verdict and the
curve from held-out ones, never from the prompts that chose the circuit (the discovery faithfulness
is shown beside, with `circuits.evidence.held_out_note`). The held-out prompts are `heldout` when
given (the CLI: IOI's held-out templates and names, fresh induction sequences, a prompt-pair file's
held-out families from `tasks.circuit_tasks`: the head classes' own), else a seeded half of the task's
families, each prompt its own family where it has none (`circuits.evidence.split_families`).

JSON schema ("interp-edge-circuit-3"; -2 held the heads as the head path's report, text; -1 had no
held-out prompts: its faithfulness was measured on the discovery prompts and it had no n_heldout,
split, discovery_faithfulness, discovery_faithfulness_ci, held_out_note):
  model     {name, provenance, n_layers, n_heads, n_kv_heads}
  task      {name, n_prompts, n_heldout, split, metric, clean_metric, corrupted_metric}
            (n_prompts: discovery prompts; split: which families (or prompts) chose and which tested;
            metric means over the held-out prompts)
  method    {name, steps, ablation, ig_points, bootstrap, score_convention}
            (bootstrap: resamples of the prompts behind `frequency`; score_convention: what a score means)
  graph     {n_nodes, n_edges}
  circuit   {requested_edges, size_target, n_edges, nodes: [name],
             edges: [{writer, reader, score, frequency, removal_effect, removal_measured}], faithfulness,
             faithfulness_ci: [low, high], faithfulness_error, faithfulness_within, faithfulness_strata,
             discovery_faithfulness, discovery_faithfulness_ci, held_out_note}
            (faithfulness on the held-out prompts, 95 % bootstrap over prompts;
             discovery_*: on the prompts that found the circuit, beside it; size_target: the
             faithfulness requested_edges was searched for (on discovery prompts), null when given)
  curve     {fractions, n_edges, faithfulness, ci_low, ci_high, cpr, cmd,
             cpr_abs, cmd_signed, faithfulness_signed, random: {n_edges, faithfulness, cpr, cmd}} or null
            (on the held-out prompts)
  top_edges [{edge, score, frequency}]  the strongest edges by |score|, circuit or not
  seconds   {scores, circuit, curve, stability}
  heads     the head path on the same prompt pairs (`circuits.path.PathResult`'s fields: classes with
            their drops beyond random, CIs as [low, high], strata, faithfulness), or null
Scores estimate m(edge ablated) - m(clean) in the metric's units (negative: the edge helps); "prune"
and "ensemble" scores rank edges only (`interp.edges.pruning`, `interp.edges.stability`). frequency: the
fraction of bootstrap resamples of the prompts whose circuit of the same size holds the edge (null
when not measured). removal_effect ("prune" and "ensemble" only, else null): m(circuit without the
edge) - m(circuit) on the held-out prompts, in the metric's units (negative: the edge helps), measured
(removal_measured true) for the `measured_edges` of largest first-order estimate, estimated for the
rest (`interp.edges.removal_effects`); the circuit's edges are listed by it, largest measured first.
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
    faithfulness_by_stratum,
    held_out_note,
    split_families,
)
from circuits.path.steps import PathResult
from interp import edges
from interp.checks import check_finite_scores
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
    "circuits keep the largest |score|"
)
REMOVAL_CONVENTION = (
    "; the circuit's edges are listed by their effect of removal instead: m(circuit without the edge) - "
    "m(circuit) on the held-out prompts, in the metric's units (negative: the edge helps the circuit), "
    "which orders the edges and changes none of them"
)


@dataclass(frozen=True, kw_only=True)
class CircuitEdge:
    """One edge of a circuit as reports list it: its score, selection frequency (None: not measured),
    and effect of removal from the circuit in the metric's units (None: not measured, attribution
    scores), measured or a first-order estimate (`interp.edges.RemovalEffects`)."""

    writer: str
    reader: str
    score: float
    frequency: float | None
    removal_effect: float | None
    removal_measured: bool | None


@dataclass(kw_only=True)
class EdgeCircuitResult:
    """What `find_edge_circuit` found. circuit: [writer, reader] bool mask of the kept edges.
    task: the discovery prompts (scores, mask, size); heldout_task: the prompts `faithfulness`,
    `clean_metric`, `corrupted_metric` and `curve` are measured on; split: which chose and which
    tested, in words. A result saved before held-out prompts (heldout_task None) measured everything
    on `task`."""

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
    provenance: str = ""  # interp.provenance(model): source, quantisation, parameters, dtype
    target: float | None = None  # the faithfulness the size was searched for; None: the size was given
    frequency: Tensor | None = None  # [writer, reader] selection frequency over bootstrap resamples
    n_boot: int = 0  # the resamples behind `frequency` (0: not measured)
    heldout_task: EdgeTask | None = None
    discovery_faithfulness: edges.Faithfulness | None = None  # on the discovery prompts, shown beside
    split: str = ""
    heads: PathResult | None = None  # the head path on the same prompt pairs (`circuits.path`), if run
    removal: edges.RemovalEffects | None = None  # rank-scored methods: each edge's effect of removal
    # from the circuit on the held-out prompts (None: attribution scores, or a result saved before)

    @property
    def held_out(self) -> bool:
        """Whether the faithfulness was measured on held-out prompts (False: a result saved before)."""
        return self.heldout_task is not None

    def held_out_note(self) -> str:
        """How the discovery faithfulness fares on the held-out prompts, in words ("" when not held out)."""
        if self.discovery_faithfulness is None:
            return ""
        low, high = self.faithfulness.ci()
        return held_out_note(
            float(self.discovery_faithfulness.faithfulness[0]),
            float(self.faithfulness.faithfulness[0]),
            (float(low[0]), float(high[0])),
            "families" if self.heldout_task is not None and self.heldout_task.families else "prompts",
        )

    @property
    def graph(self) -> edges.EdgeGraph:
        return self.scores.graph

    @property
    def nodes(self) -> list[str]:
        return edges.node_circuit(self.graph, self.circuit)

    def circuit_edges(self) -> list[tuple[str, str, float]]:
        """(writer, reader, strength) of the circuit's edges, strongest first: the effect of removal
        where measured or estimated (`removal`), else the score."""
        return [
            (row.writer, row.reader, row.score if row.removal_effect is None else row.removal_effect)
            for row in self.circuit_edge_rows()
        ]

    def circuit_edge_rows(self) -> list[CircuitEdge]:
        """The circuit's edges, strongest first: by |score|, or with `removal` those measured by their
        |effect of removal|, then the others by |estimate| (ties: the stronger score first)."""
        rows = []
        effects = {} if self.removal is None else self.removal.effects()
        for w, r in self.graph.edges(self.circuit):
            effect, measured = effects.get((w, r), (None, None))
            rows.append(
                CircuitEdge(
                    writer=self.graph.writers[w], reader=self.graph.readers[r],
                    score=float(self.scores.scores[w, r]), frequency=self.edge_frequency(w, r),
                    removal_effect=effect, removal_measured=measured,
                )
            )  # fmt: skip
        rows.sort(key=lambda row: -abs(row.score))
        if self.removal is not None:
            rows.sort(key=lambda row: (not row.removal_measured, -abs(row.removal_effect)))
        return rows

    def edge_frequency(self, writer: int, reader: int) -> float | None:
        return None if self.frequency is None else float(self.frequency[writer, reader])

    def faithfulness_strata(self) -> list[StratumFaithfulness]:
        """The circuit's faithfulness per stratum (IOI: name order) and family of the prompts it is
        measured on (`circuits.evidence.faithfulness_by_stratum`)."""
        task = self.heldout_task or self.task
        faith = self.faithfulness
        return faithfulness_by_stratum(faith.values[0], faith.full, faith.empty, task.stratum_masks())

    def score_convention(self) -> str:
        """What an edge's score means: a signed estimate (attribution methods) or a rank (prune,
        ensemble), and what the circuit's edges are listed by when that is their effect of removal."""
        if self.scores.method in edges.METHODS:
            return SIGN_CONVENTION
        return RANK_CONVENTION + ("" if self.removal is None else REMOVAL_CONVENTION)

    def json_data(self, top: int = 50) -> dict:
        """What `--format json` holds (`circuits.sections.result_json`; the module doc's schema), with
        the `top` strongest edges by |score|."""
        low, high = self.faithfulness.ci()
        summary = self.faithfulness.summary()
        graph = self.graph
        found = self.discovery_faithfulness
        found_ci = None if found is None else [float(bound[0]) for bound in found.ci()]
        out = {
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
                "requested_edges": self.requested_edges,
                "size_target": self.target,
                "n_edges": int(self.circuit.sum()),
                "nodes": self.nodes,
                "edges": [dataclasses.asdict(row) for row in self.circuit_edge_rows()],
                "faithfulness": float(self.faithfulness.faithfulness[0]),
                "faithfulness_ci": [float(low[0]), float(high[0])],
                "faithfulness_error": summary.error,
                "faithfulness_within": summary.within,
                "faithfulness_strata": [
                    {"kind": s.kind, "name": s.name, "n_prompts": s.n_prompts,
                     **({} if s.summary is None else {"faithfulness": s.summary.ratio,
                        "faithfulness_ci": list(s.summary.ratio_ci), "faithfulness_error": s.summary.error,
                        "faithfulness_within": s.summary.within})}
                    for s in self.faithfulness_strata()
                ],
                "discovery_faithfulness": None if found is None else float(found.faithfulness[0]),
                "discovery_faithfulness_ci": found_ci,
                "held_out_note": self.held_out_note(),
            },
            "curve": None,
            "top_edges": [{"edge": name, "score": score,
                           "frequency": self.edge_frequency(*graph.edge_index(name))}
                          for name, score in self.scores.top(top)],
            "seconds": self.seconds,
            "heads": self.heads,
        }  # fmt: skip
        curve = self.curve
        if curve is not None:
            c_low, c_high = curve.result.ci()
            out["curve"] = {
                "fractions": list(curve.fractions),
                "n_edges": curve.n_edges,
                "faithfulness": curve.faithfulness.tolist(),
                "ci_low": c_low.tolist(),
                "ci_high": c_high.tolist(),
                "cpr": curve.cpr,  # MIB's: circuits ranked by signed score
                "cmd": curve.cmd,  # MIB's: circuits ranked by |score|
                "cpr_abs": curve.cpr_abs,
                "cmd_signed": curve.cmd_signed,
                "faithfulness_signed": curve.signed_result.faithfulness.tolist(),
                "random": None
                if curve.random is None
                else {"n_edges": curve.random_n_edges, "faithfulness": curve.random.faithfulness.tolist(),
                      "cpr": curve.random_cpr, "cmd": curve.random_cmd},
            }  # fmt: skip
        return out


@dataclass(frozen=True, kw_only=True)
class EdgeCircuitSettings:
    """The choices of `find_edge_circuit`.

    method: one of `edges.METHODS` (attribution), "prune" (a learned mask, `edges.prune_edges`:
    `prune_steps` steps towards keeping `density` of the edges, by default the requested size's share,
    else `edges.PruneSettings`' density) or "ensemble" (the mean normalised rank of `ENSEMBLE_MEMBERS`'
    scores). n_edges or fraction (of all edges): the circuit's size; neither: the smallest number of
    edges reaching faithfulness `target` on the discovery prompts (`smallest_faithful_size`).
    steps: EAP-IG's integration steps; ig_points: its points, "paper" (alpha = k/m, k = 1..m) or
    "mib" (k = 0..m-1). ablation: what ablated edges carry. batch_size: prompts per run; max_memory
    (bytes or "2GiB"): the scores' memory budget, which picks their batch size instead
    (`edges.edge_attribution`). curve_fractions: the faithfulness curve's sizes (None: no curve), with
    random circuits of each size when `random_baseline`. bootstrap: resamples of the prompts for each
    edge's selection frequency at the circuit's size (0: not measured); attribution then scores each
    prompt alone (the same work), edge pruning runs again on each resample. seed: the held-out half of
    the families (or prompts), the mask's batch order, the curve's random circuits and the resamples.
    measured_edges: with "prune" and "ensemble", whose scores only rank, each edge's effect of removal
    from the circuit on the held-out prompts is estimated, and measured for this many edges (those of
    largest estimate; `edges.removal_effects`): what the report lists the circuit's edges by.
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
    prune_steps: int = edges.PruneSettings.steps  # the mask's training steps
    density: float | None = None
    seed: int = 0
    measured_edges: int = 25  # rank-scored methods: edges whose removal from the circuit is measured

    def __post_init__(self) -> None:
        """Refuse choices that cannot run, saying what to pass (each named as its `interp circuit`
        option), before any model loads."""
        if self.n_edges is not None and self.fraction is not None:
            raise ValueError(
                "give the circuit size as --edges N or --fraction F (one of them), or neither to search."
            )
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(
                f"--fraction {self.fraction} must lie in (0, 1]: the fraction of all edges, e.g. 0.05."
            )
        if not 0 < self.target <= 1:
            raise ValueError(f"--target {self.target} must lie in (0, 1]; 0.8 is a common choice.")
        if self.bootstrap < 0:
            raise ValueError(
                f"--bootstrap {self.bootstrap} must be 0 (not measured) or a number of resamples, e.g. 20."
            )
        if self.density is not None and not 0 < self.density < 1:
            raise ValueError(
                f"--density {self.density} must lie in (0, 1): the fraction of edges the mask keeps, e.g. "
                "0.02."
            )
        if self.prune_steps < 1:
            raise ValueError(f"--prune-steps {self.prune_steps} must be at least 1.")
        if self.ig_points != "paper" and self.method.startswith("eap-ig-activations"):
            raise ValueError(
                f"--ig-points applies to eap-ig (over inputs); {self.method} takes alpha = k/m, k = 1..m."
            )
        if self.max_memory is not None:
            if self.method == "exact":
                raise ValueError(
                    "--max-memory applies to the gradient methods (eap, eap-ig, ...), not to exact."
                )
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
        """The mask's training (`edges.prune_edges`): `prune_steps` steps, batches drawn with `seed`,
        towards `density`, else the requested size's share, else the default density."""
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
    """Find the edge circuit of `task` on its discovery prompts and measure it on held-out ones
    (`EdgeCircuitSettings` holds the choices; the module docstring the split):

      1. the discovery and held-out prompts: `heldout`, else a seeded half of `task`'s families
         (each prompt its own where it has none: `split_task`);
      2. every edge's score on the discovery prompts (`method_scores`; the mask resumable from
         `checkpoint`);
      3. the circuit: the top edges by |score| (connected input -> logits), as many as requested,
         else the fewest reaching the target faithfulness on the discovery prompts;
      4. its faithfulness on the held-out prompts, the discovery faithfulness beside
         (`circuit_faithfulness`);
      5. the faithfulness curve on the held-out prompts, unless `curve_fractions` is None;
      6. each edge's selection frequency over `bootstrap` resamples of the discovery prompts;
      7. with a rank-scored method (prune, ensemble), each edge's effect of removal from the circuit on
         the held-out prompts (`edges.removal_effects`): the report lists the edges by it.

    progress(stage, done, total): the stages `edge_circuit_stages` lists."""
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
    scores, scores_of = method_scores(model, task, settings, pruning, checkpoint, progress)
    stage("scores")
    check_finite_scores(
        scores.scores,
        "the edge scores",
        lambda i: f"{scores.graph.writers[i[0]]} -> {scores.graph.readers[i[1]]}",
    )
    size = requested or smallest_faithful_size(  # 3.
        model, task, scores, settings.target, settings.ablation, settings.batch_size, progress
    )
    circuit = edges.top_circuit(scores, size)
    found, faith, corrupted = circuit_faithfulness(model, task, heldout, circuit, settings, progress)  # 4.
    stage("circuit")
    curve = None
    if settings.curve_fractions is not None:  # 5.
        curve = edges.faithfulness_curve(
            model, heldout.clean, heldout.corrupted, heldout.metric, scores, settings.curve_fractions,
            ablation=task_ablation(heldout, settings.ablation), random_baseline=settings.random_baseline,
            seed=settings.seed, batch_size=settings.batch_size, progress=progress,
        )  # fmt: skip
        stage("curve")
    frequency = None
    if settings.bootstrap > 0:  # 6.
        frequency = edges.selection_frequency(
            scores_of, task.n_prompts, size, settings.bootstrap, settings.seed, progress
        )
        stage("stability")
    removal = None
    if settings.method not in edges.METHODS:  # 7.
        removal = edges.removal_effects(
            model, heldout.clean, heldout.corrupted, heldout.metric, circuit, settings.measured_edges,
            ablation=task_ablation(heldout, settings.ablation), batch_size=settings.batch_size,
            progress=progress,
        )  # fmt: skip
        stage("effects")
    return EdgeCircuitResult(
        model=model.cfg.model_name,
        task=task,
        scores=scores,
        circuit=circuit,
        requested_edges=size,
        faithfulness=faith,
        clean_metric=float(faith.full.mean()),
        corrupted_metric=corrupted,
        curve=curve,
        seconds=seconds,
        n_kv_heads=model.cfg.n_kv_heads,
        ig_points=settings.ig_points,
        provenance=interp.provenance(model),
        target=settings.target if requested is None else None,
        frequency=frequency,
        n_boot=settings.bootstrap,
        heldout_task=heldout,
        discovery_faithfulness=found,
        split=split,
        removal=removal,
    )


def task_ablation(task: EdgeTask, kind: edges.AblationKind) -> edges.Ablation:
    """`kind` of ablation on `task`'s prompts: mean over the corrupted prompts real at each position."""
    return edges.Ablation(kind, mask=task.corrupted_mask)


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
    """The circuit's faithfulness on the discovery prompts and on the held-out ones, and the model's
    mean metric on the held-out corrupted prompts (at their own positions)."""
    found, faith = (
        edges.faithfulness(
            model, prompts.clean, prompts.corrupted, prompts.metric, circuit,
            ablation=task_ablation(prompts, settings.ablation), batch_size=settings.batch_size,
            progress=progress,
        )
        for prompts in (task, heldout)
    )  # fmt: skip
    corrupted_metric = heldout.corrupted_metric or heldout.metric
    chunks = torch.arange(heldout.n_prompts).split(settings.batch_size)
    with torch.no_grad():
        corrupted_value = torch.cat(
            [corrupted_metric(model(heldout.corrupted[c]), c).float() for c in chunks]
        )
    return found, faith, float(corrupted_value.mean())


def split_task(
    task: EdgeTask, heldout: EdgeTask | None = None, seed: int = 0
) -> tuple[EdgeTask, EdgeTask, str]:
    """(discovery prompts, held-out prompts, which chose and which tested in words): `task` and
    `heldout` when given; else whole families of `task` split by `split_families` (a seeded half held
    out), each prompt its own family where it has none (held-out prompts, not families): the head
    path's split (`circuits.path.task.PairTask.split`)."""
    if heldout is not None:
        if task.families is not None and heldout.families is not None:
            families = FamilySplit(
                tuple(dict.fromkeys(task.families)), tuple(dict.fromkeys(heldout.families))
            )
            return task, heldout, families.describe()
        return task, heldout, f"chosen on {task.n_prompts} prompts; tested on {heldout.n_prompts} others"
    if task.families is None and task.n_prompts < 2:
        raise ValueError(
            f"task {task.name} has {task.n_prompts} prompt pair; a circuit is tested on prompts that did not "
            "find it, so give two or more (or held-out prompts)"
        )
    labels = task.families if task.families is not None else [str(i) for i in range(task.n_prompts)]
    families = split_families(labels, seed=seed)
    held = torch.tensor([label in families.heldout for label in labels])
    chose, tested = task.subset((~held).nonzero()[:, 0]), task.subset(held.nonzero()[:, 0])
    if task.families is not None:
        return chose, tested, families.describe()
    return (
        chose,
        tested,
        f"chosen on {chose.n_prompts} prompts; tested on the other {tested.n_prompts} (no family column: "
        "held-out prompts, not families)",
    )


def method_scores(
    model: HookedTransformer,
    task: EdgeTask,
    settings: EdgeCircuitSettings,
    pruning: edges.PruneSettings,
    checkpoint: str | None = None,
    progress: Progress | None = None,
) -> tuple[edges.EdgeScores, Callable[[Tensor], edges.EdgeScores] | None]:
    """`settings.method`'s scores on all the task's prompts, and a function scoring a resample of
    them (prompt indices [n], with repeats; None for attribution without `settings.bootstrap`):
    attribution scores each prompt alone when bootstrapped (a resample's scores are then the mean of
    its prompts'), edge pruning (trained as `pruning` says) runs again."""
    graph = edges.edge_graph(model)
    method, steps, ablation = settings.method, settings.steps, settings.ablation
    ig_points, max_memory, batch_size = settings.ig_points, settings.max_memory, settings.batch_size

    def attribution(name: str) -> tuple[edges.EdgeScores, Callable[[Tensor], edges.EdgeScores] | None]:
        if settings.bootstrap > 0:
            each = edges.prompt_scores(
                model, task.clean, task.corrupted, task.metric, name, steps, task_ablation(task, ablation),
                progress, ig_points=ig_points,
            )  # fmt: skip
            like = edges.EdgeScores(
                graph=graph, scores=each.mean(0), method=name, ablation=ablation,
                steps=1 if name == "eap" else steps, n_prompts=task.n_prompts,
            )  # fmt: skip
            return like, lambda rows: edges.mean_scores(graph, each, rows, like)
        scores = edges.edge_attribution(
            model, task.clean, task.corrupted, task.metric, name, steps,
            ablation=task_ablation(task, ablation), batch_size=batch_size if max_memory is None else None,
            progress=progress, ig_points=ig_points, max_memory=max_memory,
        )  # fmt: skip
        return scores, None

    def pruned(
        rows: Tensor | None, report: Progress | None = None, start: edges.EdgeScores | None = None
    ) -> edges.EdgeScores:
        """The learned mask's scores on the prompts `rows` (all: None), started from `start` (None:
        EAP-IG on those prompts, which `prune_edges` computes)."""
        rows = torch.arange(task.n_prompts) if rows is None else rows
        mask = None if task.corrupted_mask is None else task.corrupted_mask[rows]
        return edges.prune_edges(
            model, task.clean[rows], task.corrupted[rows], edges.subset_metric(task.metric, rows), pruning,
            ablation=edges.Ablation(ablation, mask=mask), start=start,
            checkpoint=checkpoint if report is not None else None, progress=report,
        )  # fmt: skip

    if method == "prune":
        return pruned(None, progress), pruned
    if method == "ensemble":  # the mask starts from the EAP-IG member's scores: EAP-IG runs once
        first, first_of = attribution(ENSEMBLE_MEMBERS[0])
        scores = edges.ensemble([first, pruned(None, progress, first)])
        if first_of is None:
            return scores, None

        def resampled(rows: Tensor) -> edges.EdgeScores:
            member = first_of(rows)
            return edges.ensemble([member, pruned(rows, start=member)])

        return scores, resampled
    return attribution(method)


SIZE_SEARCH_STAGE = "Size search"  # the stage smallest_faithful_size reports


def edge_circuit_stages(method: str, searched: bool, curve: bool, bootstrap: int = 0) -> list[str]:
    """The stages `find_edge_circuit` reports to its progress, in order: the scores (edge pruning
    ranks its start by EAP-IG, then trains the mask), the size search when no size is given, the
    circuit's faithfulness, the curve and the selection frequencies when asked for, and the edges'
    effects of removal (rank-scored methods: those that train an edge mask)."""
    ranked = method in MASK_METHODS
    stages = ["Edge scores"] + (["Edge pruning"] if ranked else [])
    stages += [SIZE_SEARCH_STAGE] if searched else []
    stages += ["Faithfulness"] + (["Faithfulness curve"] if curve else [])
    return stages + (["Edge stability"] if bootstrap > 0 else []) + ([edges.REMOVAL_STAGE] if ranked else [])


def smallest_faithful_size(
    model: HookedTransformer, task: EdgeTask, scores: edges.EdgeScores, target: float = 0.8,
    ablation: edges.AblationKind = "counterfactual", batch_size: int = 16, progress: Progress | None = None,
) -> int:  # fmt: skip
    """The smallest number of top-|score| edges whose circuit reaches faithfulness `target`: MIB's
    sizes first (one batched run), then bisection between the last size below and the first above
    (faithfulness is assumed to grow with size; every edge kept gives 1 by definition).
    progress(SIZE_SEARCH_STAGE, circuits evaluated, circuits to evaluate): the bisection's count is
    an upper bound until MIB's sizes have run, then exact."""
    n_all = scores.graph.n_edges
    sizes = sorted({max(1, edges.fraction_to_edges(scores.graph, f)) for f in edges.MIB_FRACTIONS} | {n_all})
    evaluated = 0

    def faithful(sizes: list[int], total: int) -> list[float]:
        nonlocal evaluated
        circuits = torch.stack([edges.top_circuit(scores, n) for n in sizes])

        def runs_done(_: str, done: int, runs: int) -> None:  # the runs (the empty circuit's too) as circuits
            progress(SIZE_SEARCH_STAGE, evaluated + done * len(sizes) // runs, total)

        report = None if progress is None else runs_done
        result = edges.faithfulness(
            model,
            task.clean,
            task.corrupted,
            task.metric,
            circuits,
            ablation=task_ablation(task, ablation),
            batch_size=batch_size,
            progress=report,
        )
        evaluated += len(sizes)
        if progress is not None:
            progress(SIZE_SEARCH_STAGE, evaluated, total)
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
    return high
