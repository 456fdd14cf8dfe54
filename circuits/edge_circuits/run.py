"""`interp circuit` as one library call: the edge circuit of a task and, for a prompt-pair file, the
head classes of the same pairs (`circuits.path`) on the same held-out families.

    task = CircuitTask(task="pairs.csv", heldout_families=("template 3",))   # read and checked, no model
    settings = EdgeCircuitSettings(method="eap-ig", n_edges=300)
    result = run_circuit(circuit_prompts(model, task, settings), settings)  # tokenised, then the work
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from circuits.edge_circuits.find import (
    MASK_METHODS,
    EdgeCircuitResult,
    EdgeCircuitSettings,
    edge_circuit_stages,
    find_edge_circuit,
)
from circuits.edge_circuits.tasks import (
    EdgeTask,
    check_task_name,
    edge_task,
    heldout_edge_task,
    pair_edge_task,
)
from circuits.evidence import MIN_STRATUM_PROMPTS, split_families
from circuits.path import PATH_STAGES, PairTask, PathSettings, head_path, pair_task
from circuits.quick import circuit_note
from interp.edges import mib_json
from interp.interventions.stats import MIN_FAMILIES
from interp.io.files import write_text_atomic
from interp.model import HookedTransformer, ungrouped
from interp.tasks.pairs import METRICS, check_families, check_pairs, read_pairs
from interp.types import Progress


@dataclass(frozen=True, kw_only=True)
class CircuitTask:
    """What `run_circuit` finds a circuit of. task: "ioi", "induction" or a prompt-pair file's path (read
    and checked here, once: `rows`); n_prompts: ioi's and induction's prompts (as many held out); metric:
    one of METRICS; heldout_families: a file's families that test the circuit (None: half, by seed)."""

    task: str = "ioi"
    n_prompts: int = 64
    metric: str = "logit_diff"
    heldout_families: tuple[str, ...] | None = None
    rows: list[dict[str, str]] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_task_name(self.task)
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; choose one of {', '.join(METRICS)}.")
        if self.metric != "logit_diff" and not self.is_file:
            raise ValueError(
                f"--metric {self.metric} applies to prompt-pair files; --task {self.task} measures its own "
                "logit difference: leave --metric out."
            )
        if self.heldout_families is not None and not self.is_file:
            raise ValueError(
                "--heldout-families names families of a prompt-pair file's family column; "
                f"--task {self.task} holds out its own (IOI's held-out templates, fresh induction sequences)."
            )
        if not self.is_file:
            return
        object.__setattr__(self, "rows", read_pairs(self.task))
        check_pairs(self.rows, self.task, self.metric)
        if self.heldout_families is None and any("family" in row for row in self.rows):  # in all or none
            check_families([row["family"] for row in self.rows], self.task)
        elif self.heldout_families is not None:
            try:
                families = [str(row.get("family") or "") for row in self.rows]
                if not any(families):
                    raise ValueError(f"{self.task} has no family column, so it has no families to hold out")
                split_families(families, heldout=self.heldout_families)
            except ValueError as error:
                raise ValueError(f"--heldout-families: {error}") from error
        if len(self.rows) < 2 * MIN_STRATUM_PROMPTS:
            raise ValueError(_too_few(f"{self.task} has {len(self.rows)} pairs"))

    @property
    def is_file(self) -> bool:
        return bool(Path(self.task).suffix)

    @property
    def with_heads(self) -> bool:
        """Whether the head classes are found too: a prompt-pair file's, by the logit difference."""
        return self.is_file and self.metric == "logit_diff"

    def heads_note(self) -> str | None:
        """What a prompt-pair file's head classes will lack, said before the run: none with another metric
        than the logit difference; a claim about new families, where 2 or 3 families are held out (their
        verdicts are about those families' prompts: `evidence.held_out_unit`). None where nothing (or it
        is no file)."""
        if not self.is_file:
            return None
        if not self.with_heads:
            return (
                f"no head classes with --metric {self.metric}: the head path (circuits.path) measures heads "
                "by the logit difference only; run with --metric logit_diff for them"
            )
        families = [str(row.get("family") or "") for row in self.rows]
        if not any(families):
            return None
        distinct, held = len(set(families)), len(split_families(families, self.heldout_families).heldout)
        if not 2 <= held < MIN_FAMILIES:
            return None
        return (
            f"{held} of the file's {distinct} families are held out: too few to stand for new families (at "
            f"least {MIN_FAMILIES}), so the head classes' verdicts and the faithfulness will be about these "
            f"families' prompts, not about new families; for that, give the file 7 or more families (about "
            f"half are held out), or name {MIN_FAMILIES} or more of {MIN_FAMILIES + 1} or more with "
            "--heldout-families"
        )

    def stages(self, settings: EdgeCircuitSettings) -> list[str]:
        """The stages `run_circuit` reports, in order."""
        searched = settings.n_edges is None and settings.fraction is None
        curve = settings.curve_fractions is not None
        edge_stages = edge_circuit_stages(settings.method, searched, curve, settings.bootstrap)
        return edge_stages + list(PATH_STAGES if self.with_heads else [])


@dataclass(frozen=True)
class CircuitPrompts:
    """One `run_circuit`'s prompts, built and checked before any long work: the edge circuit's
    discovery and held-out prompts and, for the head classes, the file's pairs (split the same way)."""

    model: HookedTransformer
    task: CircuitTask
    prompt_pairs: EdgeTask
    heldout: EdgeTask
    pairs: PairTask | None

    def quick_note(self, sizes: dict[str, tuple[int, int]], settings: EdgeCircuitSettings) -> str:
        """`interp circuit --quick`'s note (`circuits.quick.circuit_note`) against `sizes` (n_prompts,
        prune_steps: (with --quick, without))."""
        prompts = None if self.task.is_file else sizes["n_prompts"]  # a file's pairs are all used
        mask_steps = sizes["prune_steps"] if settings.method in MASK_METHODS else None
        discovery, tested = self.prompt_pairs.n_prompts, self.heldout.n_prompts
        return circuit_note(discovery, tested, prompts, mask_steps, settings.method)


def circuit_prompts(
    model: HookedTransformer, task: CircuitTask, settings: EdgeCircuitSettings
) -> CircuitPrompts:
    """`task`'s prompts on `model`, tokenised and checked (pairs that cannot run are refused here).
    "ioi", "induction": `edge_task` and `heldout_edge_task`. A file's rows: tokenised once and split
    once by whole families (`task.heldout_families`, else half drawn with the seed) for the edge circuit
    and the head classes alike, the pair task carrying the split as its own held-out families so that
    `head_path` draws the same."""
    if not task.is_file:
        heldout = heldout_edge_task(model, task.task, task.n_prompts, settings.seed)
        discovery = edge_task(model, task.task, task.n_prompts, settings.seed, task.metric)
        return CircuitPrompts(model, task, discovery, heldout, None)
    pairs = pair_task(model, task.rows, name=Path(task.task).name, metric=task.metric)
    pairs = replace(pairs, heldout_families=pairs.family_split(task.heldout_families, settings.seed).heldout)
    edge, (discovery, heldout) = pair_edge_task(pairs), pairs.split_rows()
    if min(len(discovery), len(heldout)) < MIN_STRATUM_PROMPTS:
        chose = f"{len(discovery)} pairs that choose and {len(heldout)} that test"
        raise ValueError(_too_few(f"{task.task}'s families split into {chose}"))
    pairs.check_ablation(settings.ablation)  # for the edges and the head classes, before any long work
    if settings.ablation == "mean":  # each side's means are over its own corrupted prompts
        for side, rows in (("discovery", discovery), ("held-out", heldout)):
            pairs.check_mean_reference(rows, side)
    heads_pairs = pairs if task.with_heads else None
    return CircuitPrompts(model, task, edge.subset(discovery), edge.subset(heldout), heads_pairs)


def _too_few(what: str) -> str:
    """Why a prompt-pair file is refused for too few pairs to choose on and to test on (`what` it has)."""
    return (
        f"{what}: a circuit is chosen on some pairs and tested on others, and each needs at least "
        f"{MIN_STRATUM_PROMPTS} (a CI over fewer is no CI); give {2 * MIN_STRATUM_PROMPTS} or more pairs, "
        "in families of similar sizes"
    )


def run_circuit(
    prompts: CircuitPrompts,
    settings: EdgeCircuitSettings,
    checkpoint: str | None = None,
    mib_out: str | None = None,
    progress: Progress | None = None,
) -> EdgeCircuitResult:
    """The edge circuit of `prompts` and, for a file, its head classes (`result.heads`). checkpoint: the
    edge mask's (prune, ensemble); mib_out: also write the circuit in MIB's submission format, found on
    MIB's edge graph (a grouped-query model's key/value heads copied to each query head: `ungrouped`)."""
    model = prompts.model
    graph_model = model if mib_out is None else ungrouped(model)
    result = find_edge_circuit(graph_model, prompts.prompt_pairs, settings, heldout=prompts.heldout,
                               checkpoint=checkpoint, progress=progress)  # fmt: skip
    if prompts.pairs is not None:
        heldout = prompts.task.heldout_families
        path_settings = PathSettings(seed=settings.seed, ablation=settings.ablation, heldout=heldout)
        result.heads = head_path(model, prompts.pairs, path_settings, progress)
    if mib_out is not None:
        write_text_atomic(mib_out, json.dumps(mib_json(result.scores, result.circuit, graph_model.cfg)))
    return result
