"""Edge pruning: a learned mask over the edge graph (Bhaskar et al. 2024, "Finding transformer circuits
with edge pruning").

Each edge (w, r) has a logit `log_alpha`; a hard-concrete gate (Louizos et al. 2018) in [0, 1] scales
it. Readers' inputs are rebuilt from the edges in the model's own forward pass (`intervene.edge_forward`
with a float mask that requires grad):

  reader_input = incoming - sum over writers w of (1 - z[w, r]) (writer_w - writer_w ablated)

so z = 1 everywhere is the model and z = 0 the fully ablated graph, as in `run_circuits`. Training
minimises, on the discovery prompts,

  objective + lambda_1 (density - target) + lambda_2 (density - target)^2

over the logits while the Lagrange multipliers lambda_1, lambda_2 ascend; `density` is the expected
fraction of gates that are non-zero and `target` ramps from 1 to `density` over the first half of the
steps. objective "kl": KL(model || masked model) of the next token where the metric reads; "metric":
the squared difference of the metric per prompt, in the metric's units squared.

The scores rank edges by how long they survive the sparsity ramp: an edge's deterministic gate is
open while log_alpha > -log(HIGH / -LOW); the score is -(the last step its gate was open +
sigmoid(log_alpha)) / (steps + 1), in (-1, 0) (negative: the edge is kept; the edges kept longest, then
the surest, most negative). As the target falls from 1 to `density` the circuits at every size in
between are one ranking, which `top_circuit` and `faithfulness_curve` take as they take EAP's.
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

from interp.edges.graph import EdgeGraph, EdgeScores, edge_graph
from interp.edges.intervene import (
    Intervention,
    ablated_outputs,
    chunks,
    edge_forward,
    logit_positions,
    writer_outputs,
)
from interp.interventions.engine import check_pair
from interp.interventions.metrics import check_reads_real_tokens, for_rows
from interp.io.files import atomic_write
from interp.model.transformer import HookedTransformer
from interp.types import Ablation, Metric, Progress

STAGE = "Edge pruning"
OBJECTIVES = ("kl", "metric")
# The hard-concrete gate's temperature and stretch (Louizos et al. 2018).
BETA, LOW, HIGH = 2 / 3, -0.1, 1.1
CACHE_BYTES = 2**30
OPEN = -math.log(HIGH / -LOW)  # the deterministic gate is open (> 0) where log_alpha exceeds this


@dataclass(frozen=True)
class PruneSettings:
    """What a run depends on; a checkpoint resumes only a run with the same settings."""

    density: float  # target fraction of edges kept
    steps: int
    lr: float
    batch_size: int
    objective: str
    seed: int
    ablation: str
    n_prompts: int
    n_edges: int


def gates(log_alpha: Tensor, generator: torch.Generator | None) -> Tensor:
    """Hard-concrete gates in [0, 1]: sampled with `generator`, or the deterministic gate without."""
    if generator is None:
        s = torch.sigmoid(log_alpha)
    else:
        u = torch.rand(log_alpha.shape, generator=generator).clamp(1e-6, 1 - 1e-6).to(log_alpha.device)
        s = torch.sigmoid((u.log() - (-u).log1p() + log_alpha) / BETA)
    return (s * (HIGH - LOW) + LOW).clamp(0, 1)


def expected_density(log_alpha: Tensor) -> Tensor:
    """The expected fraction of non-zero gates."""
    return torch.sigmoid(log_alpha - BETA * math.log(-LOW / HIGH)).mean()


def masked_logits(
    model: HookedTransformer,
    graph: EdgeGraph,
    tokens: Int[Tensor, "batch pos"],
    mask: Float[Tensor, "writer reader"],
    ablated: Float[Tensor, "writer batch_or_1 pos d_model"],
    logit_pos: Int[Tensor, " batch"] | None = None,
) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits with each edge (w, r) scaled by mask[w, r] in [0, 1] (the rest of its writer's output
    ablated), differentiable in `mask`; entries off the graph are ignored (kept)."""
    valid = graph.valid.to(mask.device)
    keep = torch.where(valid, mask, torch.ones_like(mask)).to(model.dtype)
    if not keep.requires_grad:  # a constant mask runs through the same (differentiable) path
        keep = keep.detach().requires_grad_(True)
    with torch.enable_grad():
        return edge_forward(
            model, graph, tokens, Intervention(keep=keep[None], ablated=ablated), None, logit_pos
        )


def prune_edges(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    density: float = 0.02,
    steps: int = 200,
    lr: float = 0.1,
    batch_size: int = 16,
    objective: str = "kl",
    ablation: Ablation = "counterfactual",
    reference_mask: Int[Tensor, "n pos"] | None = None,
    seed: int = 0,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int = 20,
    progress: Progress | None = None,
) -> EdgeScores:
    """Learn a mask over the edges of `model` keeping `density` of them (see the module docstring).

    clean, corrupted: the discovery prompt pairs [batch, pos]; each step trains on `batch_size` of them
    (an epoch in a seeded order). checkpoint: a file the run's state is written to (atomically) every
    `checkpoint_every` steps and resumed from when it exists with the same settings; it is left in
    place. progress("Edge pruning", steps done, steps). Returns EdgeScores with method "prune"."""
    if not 0 < density < 1:
        raise ValueError(f"density={density} must lie in (0, 1): the fraction of edges to keep, e.g. 0.02.")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective={objective!r} is not one of {OBJECTIVES}.")
    if steps < 1 or batch_size < 1 or checkpoint_every < 1:
        raise ValueError("steps, batch_size and checkpoint_every must be at least 1.")
    clean, corrupted = check_pair(model, clean, corrupted)
    metric = check_reads_real_tokens(model, metric, clean)
    graph = edge_graph(model)
    n = clean.shape[0]
    settings = PruneSettings(
        density=density, steps=steps, lr=lr, batch_size=min(batch_size, n), objective=objective,
        seed=seed, ablation=ablation, n_prompts=n, n_edges=graph.n_edges,
    )  # fmt: skip
    with _frozen(model):  # the mask alone learns
        # What ablated edges carry: every corrupted prompt's writer outputs at once where they fit in
        # CACHE_BYTES (counterfactual), else read per step; one mean or zero tensor otherwise.
        per_step = ablation == "counterfactual" and (
            graph.n_writers * clean.numel() * model.cfg.d_model * model.dtype.itemsize > CACHE_BYTES
        )
        shared = (
            None
            if per_step
            else ablated_outputs(model, clean, corrupted, ablation, reference_mask=reference_mask)
        )
        targets = _full_model(model, clean, metric, objective, settings.batch_size)

        log_alpha = torch.full((graph.n_edges,), 3.0, requires_grad=True)
        survived = torch.zeros(graph.n_edges)  # the last step each edge's deterministic gate was open
        lambdas = torch.zeros(2, requires_grad=True)
        mask_opt = torch.optim.Adam([log_alpha], lr=lr)
        lambda_opt = torch.optim.Adam([lambdas], lr=lr)
        start = 0
        if checkpoint is not None and os.path.exists(checkpoint):
            start = _resume(checkpoint, settings, log_alpha, lambdas, survived, mask_opt, lambda_opt)
        valid = graph.valid
        for step in range(start, steps):
            rows = _batch_rows(n, settings.batch_size, step, seed)
            generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
            z = gates(log_alpha, generator)
            mask = torch.ones(graph.n_writers, graph.n_readers).masked_scatter(valid, z)
            if per_step:
                ablated = writer_outputs(model, corrupted[rows])
            else:
                ablated = shared[:, rows] if shared.shape[1] == n else shared
            logit_pos = _read_positions(metric, rows, clean.shape[1])
            logits = masked_logits(model, graph, clean[rows], mask.to(model.device), ablated, logit_pos)
            fit = _objective(logits, rows, logit_pos, targets, metric, objective, n)
            target = max(density, 1 - (1 - density) * min(1.0, step / max(1, steps // 2)))
            gap = expected_density(log_alpha) - target
            loss = fit + lambdas[0] * gap + lambdas[1] * gap**2
            mask_opt.zero_grad()
            lambda_opt.zero_grad()
            loss.backward()
            lambdas.grad.neg_()  # the multipliers ascend
            mask_opt.step()
            lambda_opt.step()
            done = step + 1
            survived[log_alpha.detach() > OPEN] = done
            if checkpoint is not None and (done % checkpoint_every == 0 or done == steps):
                _save(checkpoint, settings, done, log_alpha, lambdas, survived, mask_opt, lambda_opt)
            if progress:
                progress(STAGE, done, steps)
    scores = torch.zeros(graph.n_writers, graph.n_readers)
    scores[valid] = -(survived + torch.sigmoid(log_alpha.detach().float())) / (steps + 1)
    return EdgeScores(graph=graph, scores=scores, method="prune", ablation=ablation, steps=steps, n_prompts=n)


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


@torch.no_grad()
def _full_model(
    model: HookedTransformer, clean: Tensor, metric: Metric, objective: str, batch_size: int
) -> Tensor:
    """What the masked model is fitted to, per prompt: the log-probabilities where the metric reads
    [n, d_vocab] ("kl"), or the metric [n] ("metric")."""
    n, out = clean.shape[0], []
    for rows in chunks(n, batch_size):
        logits = model(clean[rows])
        if objective == "kl":
            positions = _read_positions(metric, rows, clean.shape[1]).to(logits.device)
            out.append(logits[torch.arange(len(rows)), positions].float().log_softmax(-1).cpu())
        else:
            out.append(for_rows(metric, rows, n)(logits).float().cpu())
    return torch.cat(out)


def _objective(
    logits: Tensor, rows: Tensor, positions: Tensor, targets: Tensor, metric: Metric, objective: str, n: int
) -> Tensor:
    if objective == "kl":
        read = logits[torch.arange(len(rows)), positions.to(logits.device)].float().log_softmax(-1)
        full = targets[rows].to(read.device)
        return (full.exp() * (full - read)).sum(-1).mean()
    values = for_rows(metric, rows, n)(logits).float()
    return ((values - targets[rows].to(values.device)) ** 2).mean()


def _save(path, settings, step, log_alpha, lambdas, survived, mask_opt, lambda_opt) -> None:
    state = {
        "settings": asdict(settings), "step": step, "log_alpha": log_alpha.detach(),
        "lambdas": lambdas.detach(), "survived": survived, "mask_opt": mask_opt.state_dict(),
        "lambda_opt": lambda_opt.state_dict(),
    }  # fmt: skip
    with atomic_write(path, "wb") as file:
        torch.save(state, file)


def _resume(path, settings, log_alpha, lambdas, survived, mask_opt, lambda_opt) -> int:
    state = torch.load(path, weights_only=True)
    if state.get("settings") != asdict(settings):
        raise ValueError(
            f"{path} is the checkpoint of another pruning run ({state.get('settings')}); give another "
            "checkpoint path or delete it to start over"
        )
    with torch.no_grad():
        log_alpha.copy_(state["log_alpha"])
        lambdas.copy_(state["lambdas"])
        survived.copy_(state["survived"])
    mask_opt.load_state_dict(state["mask_opt"])
    lambda_opt.load_state_dict(state["lambda_opt"])
    return int(state["step"])
