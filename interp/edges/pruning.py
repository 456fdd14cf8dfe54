"""Edge pruning: a learned 0/1 mask over the edge graph, trained through the model's own forward pass.

Each valid edge e has a learned score s_e. Each step keeps the k_t edges of largest score (a 0/1
mask; the rest of their writers' outputs ablated, `intervene.edge_forward`) and moves the scores down
the gradient of the objective with respect to the mask (the straight-through estimator: d/ds = d/dmask,
for kept and dropped edges alike; Ramanujan et al. 2020's edge-popup applied to the edges of a circuit):

  1. s_e <- the normalised rank (0 weakest, 1 strongest) of |score| of a start ranking (default:
     EAP-IG on the same prompts), so the first mask is that method's circuit.
  2. for t = 0 .. steps - 1:  k_t = round(k_0 (k / k_0) ** min(1, t / ramp)), k = ceil(density N),
     k_0 = min(N, start_factor k) (3 k by default), ramp = a share of the steps (40 % by default;
     N: the graph's edges);
     mask = top-k_t(s); s <- Adam(s, d objective(mask) / d mask) on `batch_size` prompts;
     last_e <- t + 1 for the edges in the mask.
  3. The circuit is top-k(s) after the last step (last_e <- steps + 1).

The mask stops early once it has kept the same k edges for `patience` consecutive steps at its final
size (the steps run then stand for `steps` below); a mask that keeps changing runs every step.

objective "metric" (the default): the squared difference between the masked model's metric and the
model's, per prompt, in the metric's units squared (what faithfulness measures); "kl": KL(model ||
masked model) of the next token where the metric reads (Bhaskar et al. 2024's). The number of edges is
exact at every step: a penalty on the expected number of open gates (hard-concrete gates with a
Lagrangian, Bhaskar et al. 2024) leaves 44 % of SmolLM2's 70,651 gates open after 160 steps.

Scores rank edges by how long they stayed in the mask as k fell: -(last_e + q_e) / (steps + 2), in
(-1, 0), q_e in (0, 1) increasing with s_e (negative: the edge is kept; the final circuit first, then
the edges that left the mask last). `top_circuit` and `faithfulness_curve` take them as they take EAP's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.catalog import PRUNE_STEPS
from interp.checks import check_finite_scores
from interp.edges.attribution import edge_attribution
from interp.edges.graph import EdgeGraph, EdgeScores, edge_graph
from interp.edges.intervene import (
    EdgeRun,
    ablated_outputs,
    chunks,
    edge_ablation,
    edge_forward,
    logit_positions,
    read_at,
    writer_outputs,
)
from interp.edges.stability import normalised_ranks
from interp.interventions.ablation import Ablation
from interp.interventions.engine import check_pair, forward_logits
from interp.interventions.metrics import check_reads_real_tokens, for_rows
from interp.io.files import atomic_write
from interp.model.transformer import HookedTransformer
from interp.types import AblationKind, Metric, Progress

STAGE = "Edge pruning"
OBJECTIVES = ("kl", "metric")
CACHE_BYTES = 2**30
PATIENCE = 10  # steps the mask must keep the same edges at its final size before it stops early


@dataclass(frozen=True, kw_only=True)
class PruneSettings:
    """How `prune_edges` trains its mask (the module docstring).

    density: the fraction of the edges the final mask keeps; steps: training steps;
    lr: Adam's step on the scores, in normalised ranks; batch_size: prompts per step (an epoch in an
    order drawn with `seed`); objective: one of OBJECTIVES; patience: the steps the mask must keep the
    same edges at its final size before it stops early (None: every step runs); checkpoint_every: the
    steps between checkpoints (when `prune_edges` is given a checkpoint file); start_factor: the first
    mask keeps this many times the final number of edges; ramp: the share of the steps over which it
    shrinks to its final size (`mask_sizes`).

    The defaults (45 steps at lr 0.0067 from 3x the size over 40 % of the steps) keep the held-out
    faithfulness of 100 steps at lr 0.003 from 10x over 60 % on SmolLM2's IOI circuit of 300 edges in
    half the steps (docs/results/performance.md).
    """

    density: float = 0.02
    steps: int = PRUNE_STEPS
    lr: float = 0.0067
    batch_size: int = 8
    objective: str = "metric"
    seed: int = 0
    patience: int | None = PATIENCE
    checkpoint_every: int = 20
    start_factor: float = 3.0
    ramp: float = 0.4

    def __post_init__(self) -> None:
        if not 0 < self.density < 1:
            raise ValueError(
                f"density={self.density} must lie in (0, 1): the fraction of edges to keep, e.g. 0.02."
            )
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective={self.objective!r} is not one of {OBJECTIVES}.")
        counts = (self.steps, self.batch_size, self.checkpoint_every)
        if min(counts) < 1 or (self.patience is not None and self.patience < 1):
            raise ValueError("steps, batch_size, checkpoint_every and patience must be at least 1.")
        if self.start_factor < 1 or not 0 < self.ramp <= 1:
            raise ValueError(
                f"start_factor={self.start_factor} must be at least 1 (times the final size) and "
                f"ramp={self.ramp} in (0, 1] (a share of the steps)."
            )


@dataclass(frozen=True)
class _RunKey:
    """What a run depends on; a checkpoint resumes only a run with the same key."""

    density: float  # target fraction of edges kept
    steps: int
    lr: float
    batch_size: int
    objective: str
    seed: int
    ablation: str  # `_ablation_key`
    n_prompts: int
    n_edges: int
    start: str  # the method of the start ranking
    start_factor: float
    ramp: float


def mask_sizes(n_edges: int, pruning: PruneSettings) -> list[int]:
    """The number of edges the mask keeps at each of `pruning.steps` steps: geometric from
    min(N, start_factor k) to k = ceil(density N) over the first `ramp` share of the steps, then k."""
    final = max(1, math.ceil(pruning.density * n_edges - 1e-6))  # density = n / N gives n
    first = min(n_edges, round(pruning.start_factor * final))
    ramp = max(1, math.ceil(pruning.ramp * pruning.steps))
    return [round(first * (final / first) ** min(1.0, t / ramp)) for t in range(pruning.steps)]


def masked_logits(
    model: HookedTransformer,
    graph: EdgeGraph,
    tokens: Int[Tensor, "batch pos"],
    mask: Float[Tensor, "writer reader"],
    ablated: Float[Tensor, "writer batch_or_1 pos d_model"],
    logit_pos: Int[Tensor, " batch"] | None = None,
) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits with each edge (w, r) scaled by mask[w, r] in [0, 1] (the rest of its writer's output
    ablated), differentiable in `mask`; entries off the graph are ignored (kept). With `logit_pos`,
    those positions' only: [batch, 1, d_vocab] (`edge_forward`)."""
    valid = graph.valid.to(mask.device)
    keep = torch.where(valid, mask, torch.ones_like(mask)).to(model.dtype)
    if not keep.requires_grad:  # a constant mask runs through the same (differentiable) path
        keep = keep.detach().requires_grad_(True)
    with torch.enable_grad():
        return edge_forward(model, graph, tokens, EdgeRun(keep=keep[None], ablated=ablated), None, logit_pos)


def prune_edges(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    pruning: PruneSettings = PruneSettings(),
    *,
    ablation: Ablation | AblationKind = "counterfactual",
    start: EdgeScores | None = None,
    checkpoint: str | os.PathLike | None = None,
    progress: Progress | None = None,
) -> EdgeScores:
    """Learn a 0/1 mask over the edges of `model` keeping `pruning.density` of them (the module
    docstring; `PruneSettings`).

    clean, corrupted: the discovery prompt pairs [batch, pos]; each step trains on `pruning.batch_size`
    of them. start: the ranking the scores start from (default: EAP-IG on these prompts,
    `edge_attribution`). checkpoint: a file the run's state is written to (atomically) every
    `pruning.checkpoint_every` steps and resumed from when it exists with the same settings; it is
    left in place. ablation: what ablated edges carry (`ablated_outputs`): mean and resample read the
    corrupted prompts (the Ablation's mask: theirs).
    progress("Edge pruning", steps done, steps; steps, steps when it stops early).
    Returns EdgeScores with method "prune" and `steps` the steps run."""
    density, steps, lr, batch_size = pruning.density, pruning.steps, pruning.lr, pruning.batch_size
    objective = pruning.objective
    seed, patience, checkpoint_every = pruning.seed, pruning.patience, pruning.checkpoint_every
    ablation = edge_ablation(ablation)
    if ablation.reference is not None:
        raise ValueError(
            "prune_edges ablates with the corrupted prompts as the reference (mean, resample): give an "
            "Ablation without a reference."
        )
    clean, corrupted = check_pair(model, clean, corrupted)
    metric = check_reads_real_tokens(model, metric, clean)
    graph = edge_graph(model)
    if start is not None and tuple(start.scores.shape) != (graph.n_writers, graph.n_readers):
        raise ValueError(
            f"start holds scores of another graph ({tuple(start.scores.shape)}, this model's is "
            f"{(graph.n_writers, graph.n_readers)}): score this model's edges, e.g. with edge_attribution"
        )
    n = clean.shape[0]
    settings = _RunKey(
        density=density, steps=steps, lr=lr, batch_size=min(batch_size, n), objective=objective,
        seed=seed, ablation=_ablation_key(ablation), n_prompts=n, n_edges=graph.n_edges,
        start="eap-ig" if start is None else start.method, start_factor=pruning.start_factor,
        ramp=pruning.ramp,
    )  # fmt: skip
    state = _load(checkpoint, settings)
    if state is None and start is None:
        start = edge_attribution(
            model, clean, corrupted, metric, "eap-ig", ablation=ablation, batch_size=settings.batch_size,
            progress=progress,
        )  # fmt: skip
    valid = graph.valid
    sizes = mask_sizes(graph.n_edges, pruning)
    with _frozen(model):  # the scores alone learn
        # What ablated edges carry: every corrupted prompt's writer outputs at once where they fit in
        # CACHE_BYTES (counterfactual), else read per step; one mean or zero tensor otherwise.
        per_step = ablation.kind == "counterfactual" and (
            graph.n_writers * clean.numel() * model.cfg.d_model * model.dtype.itemsize > CACHE_BYTES
        )
        shared = None if per_step else ablated_outputs(model, clean, corrupted, ablation)
        targets = _full_model(model, clean, metric, objective, settings.batch_size)

        if state is None:  # NaN would rank as the largest score
            check_finite_scores(start.scores[valid], "the start scores")
        scores = normalised_ranks(start)[valid] if state is None else state["scores"]
        scores.requires_grad_(True)
        last = torch.zeros(graph.n_edges) if state is None else state["last"]
        optimizer = torch.optim.Adam([scores], lr=lr)
        if state is not None:
            optimizer.load_state_dict(state["optimizer"])
        done = 0 if state is None else state["step"]
        stable = 0 if state is None else state.get("stable", 0)  # steps the kept edges stayed the same
        for step in range(done, steps):
            if patience is not None and stable >= patience:
                break
            rows = _batch_rows(n, settings.batch_size, step, seed)
            kept = _top(scores.detach(), sizes[step])
            through = kept + scores - scores.detach()  # 0/1 forward, the mask's gradient to the scores
            mask = torch.ones(graph.n_writers, graph.n_readers).masked_scatter(valid, through)
            positions = _read_positions(metric, rows, clean.shape[1])
            width = _width(model, positions, clean.shape[1])
            if per_step:
                ablated = writer_outputs(model, corrupted[rows, :width])
            else:
                ablated = (shared[:, rows] if shared.shape[1] == n else shared)[:, :, :width]
            tokens = clean[rows, :width]
            logit_pos = logit_positions(metric, rows, width)  # None: every position (the metric's choice)
            logits = masked_logits(model, graph, tokens, mask.to(model.device), ablated, logit_pos)
            loss = _objective(logits, rows, positions, logit_pos, targets, metric, objective, n)
            if not torch.isfinite(loss):
                raise ValueError(
                    f"the pruning objective is {loss.item()} at step {step + 1} (prompts {rows.tolist()}): "
                    "check the metric and that the model's outputs are finite on these prompts"
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            same = (  # the same edges as the step before, both at the final size
                step > 0 and sizes[step - 1] == sizes[-1] and bool((last[kept.bool()] == step).all())
            )
            stable = stable + 1 if same else 0
            done = step + 1
            last[kept.bool()] = done
            stops = patience is not None and stable >= patience
            if checkpoint is not None and (done % checkpoint_every == 0 or done == steps or stops):
                _save(checkpoint, settings, done, scores, last, optimizer, stable)
            if progress:
                progress(STAGE, steps if stops else done, steps)
    final = scores.detach()
    last[_top(final, sizes[-1]).bool()] = done + 1
    spread = float(final.max() - final.min())
    margin = 1e-3 * spread + 1e-9
    order = (final - final.min() + margin) / (spread + 2 * margin)  # in (0, 1), increasing with s
    out = torch.zeros(graph.n_writers, graph.n_readers)
    out[valid] = -(last + order) / (done + 2)
    return EdgeScores(
        graph=graph, scores=out, method="prune", ablation=ablation.kind, steps=done, n_prompts=n
    )


def _top(scores: Float[Tensor, " n"], k: int) -> Float[Tensor, " n"]:
    """The 0/1 mask of the k largest scores."""
    kept = torch.zeros(len(scores))
    kept[scores.topk(k).indices] = 1
    return kept


@contextmanager
def _frozen(model: HookedTransformer) -> Iterator[None]:
    """The model's parameters without grad for the block, as they were after it."""
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    for parameter in trainable:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        for parameter in trainable:
            parameter.requires_grad_(True)


def _batch_rows(n: int, batch_size: int, step: int, seed: int) -> Tensor:
    """The prompts of a step: epochs of a seeded permutation, a function of the step alone (resumable)."""
    per_epoch = math.ceil(n / batch_size)
    epoch, index = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return order[index * batch_size : (index + 1) * batch_size].sort().values


def _read_positions(metric: Metric, rows: Tensor, n_pos: int) -> Tensor:
    """The position each prompt's metric reads (its AnswerMetric's; otherwise the last)."""
    positions = logit_positions(metric, rows, n_pos)
    return torch.full((len(rows),), n_pos - 1) if positions is None else positions


def _width(model: HookedTransformer, positions: Tensor, n_pos: int) -> int:
    """The positions a step runs: up to the last one its metric reads, where attention is causal
    (later positions cannot change it), else all."""
    return int(positions.max()) + 1 if model.cfg.causal else n_pos


@torch.no_grad()
def _full_model(
    model: HookedTransformer, clean: Tensor, metric: Metric, objective: str, batch_size: int
) -> Tensor:
    """What the masked model is fitted to, per prompt: the log-probabilities where the metric reads
    [n, d_vocab] ("kl"), or the metric [n] ("metric"); logits are made only where they are read (every
    position for a metric that does not say where it reads)."""
    n, out = clean.shape[0], []
    for rows in chunks(n, batch_size):
        if objective == "kl":
            positions = _read_positions(metric, rows, clean.shape[1]).to(model.device)
            logits = forward_logits(model, clean[rows], positions)
            out.append(logits[torch.arange(len(rows)), positions].float().log_softmax(-1).cpu())
        else:
            logits = forward_logits(model, clean[rows], logit_positions(metric, rows, clean.shape[1]))
            out.append(for_rows(metric, rows, n)(logits).float().cpu())
    return torch.cat(out)


def _objective(
    logits: Tensor,
    rows: Tensor,
    positions: Tensor,
    logit_pos: Tensor | None,
    targets: Tensor,
    metric: Metric,
    objective: str,
    n: int,
) -> Tensor:
    """The loss of a step: KL from the full model's log-probabilities at `positions` ("kl") or the
    squared error of the metric ("metric"); logits made at `logit_pos` only ([rows, 1, d_vocab]) or at
    every position (None)."""
    if objective == "kl":
        at = (
            logits[:, 0]
            if logit_pos is not None
            else logits[torch.arange(len(rows)), positions.to(logits.device)]
        )
        read = at.float().log_softmax(-1)
        full = targets[rows].to(read.device)
        return (full.exp() * (full - read)).sum(-1).mean()
    values = for_rows(read_at(metric, logit_pos), rows, n)(logits).float()
    return ((values - targets[rows].to(values.device)) ** 2).mean()


def _save(path, settings: _RunKey, step: int, scores: Tensor, last: Tensor, optimizer, stable: int) -> None:
    state = {
        "settings": asdict(settings), "step": step, "scores": scores.detach(), "last": last,
        "optimizer": optimizer.state_dict(), "stable": stable,
    }  # fmt: skip
    with atomic_write(path, "wb") as file:
        torch.save(state, file)


def _ablation_key(ablation: Ablation) -> str:
    """The ablation as a checkpoint's key records it: its kind and what else changes what ablated
    edges carry (mean's padding mask, resample's seed)."""
    if ablation.kind == "mean" and ablation.mask is not None:
        return "mean over real tokens (masked)"
    if ablation.kind == "resample":
        return f"resample, seed {ablation.seed}"
    return ablation.kind


def _load(path, settings: _RunKey) -> dict | None:
    """The checkpoint's state, None where there is none; refused where it is another run's."""
    if path is None or not os.path.exists(path):
        return None
    state = torch.load(path, weights_only=True)
    if state.get("settings") != asdict(settings):
        raise ValueError(
            f"{path} is the checkpoint of another pruning run ({state.get('settings')}); give another "
            "checkpoint path or delete it to start over"
        )
    return state
