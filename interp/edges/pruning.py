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

import hashlib
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.catalog import PRUNE_STEPS
from interp.checks import check_finite_scores, check_gradient_dtype
from interp.edges.attribution import edge_attribution
from interp.edges.graph import EdgeGraph, EdgeScores, edge_graph
from interp.edges.intervene import (
    EdgeRun,
    ablated_outputs,
    chunks,
    edge_ablation,
    edge_forward,
    edge_pair,
    logit_positions,
    read_at,
    writer_outputs,
)
from interp.edges.stability import normalised_ranks
from interp.interventions.ablation import Ablation
from interp.interventions.engine import forward_logits
from interp.interventions.metrics import check_differentiable, check_reads_real_tokens, for_rows
from interp.io.files import atomic_write
from interp.io.source_code import INTERP_SOURCE, source_key
from interp.model.loading import FINGERPRINT_SCHEME, weights_fingerprint
from interp.model.tokens import index_tokens
from interp.model.transformer import HookedTransformer
from interp.types import AblationKind, Metric, Progress

STAGE = "Edge pruning"
OWN_START = "eap-ig (prune_edges' own)"  # a checkpoint key's start where prune_edges ranked the edges itself
OBJECTIVES = ("kl", "metric")
CACHE_BYTES = 2**30
PATIENCE = 10  # steps the mask must keep the same edges at its final size before it stops early
CHECKPOINT_FORMAT = 2  # 2: keyed by the model, prompts, edge graph and metric too (1: by the settings)
_CHECKPOINT_FIELDS = frozenset({"format", "key", "step", "scores", "last", "optimizer", "stable"})
METRIC_RTOL = 1e-3  # a checkpoint's metric values agree with this run's to this (relative and absolute)
RANKS_TOL = 1e-3  # ... and its start ranking's normalised ranks to this, on average over the edges


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
    """What a run depends on; a checkpoint resumes only a run with the same key (`_differences`): the
    model, its prompts, edge graph and metric (what the run is of) and the training's settings."""

    weights: str  # `weights_fingerprint`
    graph: str  # a hash of the edge graph: its writers', readers' and edges' names
    prompts: str  # a hash of the clean and corrupted token ids and the positions the metric reads
    metric: tuple[float, ...]  # the metric on the clean, then the corrupted prompts (`METRIC_RTOL`)
    density: float  # target fraction of edges kept
    steps: int
    lr: float
    batch_size: int
    objective: str
    seed: int
    ablation: str  # `_ablation_key`
    n_prompts: int
    n_edges: int
    start: str  # the method of the start ranking (`OWN_START`: prune_edges' own)
    start_ranks: Tensor | None  # the start given's `normalised_ranks` per edge (None: none, not compared)
    code: str  # `source_key` of interp: a state another version trained is not resumed
    start_factor: float
    ramp: float
    patience: int | None


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
    `pruning.checkpoint_every` steps and resumed from when it holds this run's (the same model weights,
    edge graph, prompts, metric and settings: `_RunKey`); another run's, or a file that is no
    checkpoint, is refused (ValueError: `checkpoint_step` checks before other work). It is left in
    place. ablation: what ablated edges carry (`ablated_outputs`): mean and resample read the
    corrupted prompts (the Ablation's mask: theirs).
    progress("Edge pruning", steps done, steps; steps, steps when it stops early); resumed, first
    progress("Edge pruning: resumed from FILE at step k of steps", k, steps).
    Returns EdgeScores with method "prune" and `steps` the steps run."""
    steps, lr, batch_size = pruning.steps, pruning.lr, pruning.batch_size
    objective = pruning.objective
    seed, patience, checkpoint_every = pruning.seed, pruning.patience, pruning.checkpoint_every
    ablation = edge_ablation(ablation)
    if ablation.reference is not None:
        raise ValueError(
            "prune_edges ablates with the corrupted prompts as the reference (mean, resample): give an "
            "Ablation without a reference."
        )
    check_gradient_dtype(model.dtype, "prune_edges")
    if objective == "metric":
        check_differentiable(metric, "prune_edges (objective 'metric')")
    clean, corrupted = edge_pair(model, clean, corrupted, ablation)
    metric = check_reads_real_tokens(model, metric, clean)
    graph = edge_graph(model)
    if start is not None and tuple(start.scores.shape) != (graph.n_writers, graph.n_readers):
        raise ValueError(
            f"start holds scores of another graph ({tuple(start.scores.shape)}, this model's is "
            f"{(graph.n_writers, graph.n_readers)}): score this model's edges, e.g. with edge_attribution"
        )
    n = clean.shape[0]
    batch = min(batch_size, n)
    key = None if checkpoint is None else _run_key(
        model, clean, corrupted, metric, pruning, ablation=ablation, start=start, graph=graph
    )  # fmt: skip
    state = _load(checkpoint, key)
    if state is not None and progress:  # the start ranking and the steps done are not run again
        progress(
            f"{STAGE}: resumed from {checkpoint} at step {state['step']} of {steps}", state["step"], steps
        )
    if state is None and start is None:
        start = edge_attribution(
            model, clean, corrupted, metric, "eap-ig", ablation=ablation, batch_size=batch,
            progress=progress,
        )  # fmt: skip
    valid = graph.valid
    sizes = mask_sizes(graph.n_edges, pruning)
    with _frozen(model), torch.enable_grad():  # the scores alone learn, whatever the caller's grad mode
        # What ablated edges carry: every corrupted prompt's writer outputs at once where they fit in
        # CACHE_BYTES (counterfactual), else read per step; one mean or zero tensor otherwise.
        per_step = ablation.kind == "counterfactual" and (
            graph.n_writers * clean.numel() * model.cfg.d_model * model.dtype.itemsize > CACHE_BYTES
        )
        shared = None if per_step else ablated_outputs(model, clean, corrupted, ablation)
        last_real = model.last_positions(clean).cpu()  # [n]: where a plain metric's KL is read
        targets = _full_model(model, clean, metric, objective, batch, last_real)
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
            rows = _batch_rows(n, batch, step, seed)
            kept = _top(scores.detach(), sizes[step])
            through = kept + scores - scores.detach()  # 0/1 forward, the mask's gradient to the scores
            mask = torch.ones(graph.n_writers, graph.n_readers).masked_scatter(valid, through)
            positions = _read_positions(metric, rows, clean.shape[1], last_real)
            width = _width(model, positions, clean.shape[1])
            if per_step:
                ablated = writer_outputs(model, index_tokens(corrupted, (rows, slice(width))))
            else:
                ablated = (shared[:, rows] if shared.shape[1] == n else shared)[:, :, :width]
            tokens = index_tokens(clean, (rows, slice(width)))
            logit_pos = logit_positions(metric, rows, clean.shape[1])  # None: every position
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
                _save(checkpoint, key, done, scores, last, optimizer, stable)
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


def _read_positions(metric: Metric, rows: Tensor, n_pos: int, last: Tensor) -> Tensor:
    """The position each prompt's metric reads: its AnswerMetric's, otherwise the prompt's last real
    token (`last` [n]: `model.last_positions` of the prompts; the last column is padding where they
    are padded on the right)."""
    positions = logit_positions(metric, rows, n_pos)
    return last[rows] if positions is None else positions


def _width(model: HookedTransformer, positions: Tensor, n_pos: int) -> int:
    """The positions a step runs: up to the last one its metric reads, where attention is causal
    (later positions cannot change it), else all."""
    return int(positions.max()) + 1 if model.cfg.causal else n_pos


@torch.no_grad()
def _full_model(
    model: HookedTransformer, clean: Tensor, metric: Metric, objective: str, batch_size: int,
    last_real: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """What the masked model is fitted to, per prompt: the log-probabilities where the metric reads
    [n, d_vocab] ("kl": a plain metric's at each prompt's last real token, `last_real` [n]), or the
    metric [n] ("metric"); logits are made only where they are read (every position for a metric that
    does not say where it reads)."""
    n, out = clean.shape[0], []
    for rows in chunks(n, batch_size):
        if objective == "kl":
            positions = _read_positions(metric, rows, clean.shape[1], last_real).to(model.device)
            logits = forward_logits(model, index_tokens(clean, rows), positions)
            out.append(logits[torch.arange(len(rows)), positions].float().log_softmax(-1).cpu())
        else:
            positions = logit_positions(metric, rows, clean.shape[1])
            logits = forward_logits(model, index_tokens(clean, rows), positions)
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


def _save(path, key: _RunKey, step: int, scores: Tensor, last: Tensor, optimizer, stable: int) -> None:
    state = {
        "format": CHECKPOINT_FORMAT, "key": asdict(key), "step": step, "scores": scores.detach(),
        "last": last, "optimizer": optimizer.state_dict(), "stable": stable,
    }  # fmt: skip
    with atomic_write(path, "wb") as file:
        torch.save(state, file)


def _ablation_key(ablation: Ablation) -> str:
    """The ablation as a checkpoint's key records it: its kind and what else changes what ablated
    edges carry (a hash of mean's padding mask, resample's seed)."""
    if ablation.kind == "mean" and ablation.mask is not None:
        return f"mean over real tokens (mask {_digest(ablation.mask)})"
    if ablation.kind == "resample":
        return f"resample, seed {ablation.seed}"
    return ablation.kind


def _run_key(
    model: HookedTransformer,
    clean: Tensor,
    corrupted: Tensor,
    metric: Metric,
    pruning: PruneSettings,
    *,
    ablation: Ablation,
    start: EdgeScores | str | None,
    graph: EdgeGraph,
) -> _RunKey:
    """The key of the run `prune_edges` makes with these arguments: the weights' fingerprint, hashes of
    the edge graph and of the prompts, the start ranking's ranks, the metric's values on the clean and
    the corrupted prompts (one forward pass of each), the settings and interp's source code. start: the
    start ranking given, its method alone (its ranks not known yet, and not compared), or None
    (`OWN_START`: EAP-IG as `prune_edges` computes it, another start than any given one)."""
    n, n_pos = clean.shape
    batch = min(pruning.batch_size, n)
    positions = logit_positions(metric, torch.arange(n), n_pos)
    values = [_full_model(model, tokens, metric, "metric", batch) for tokens in (clean, corrupted)]
    edge_names = [f"{graph.writers[w]}->{graph.readers[r]}" for w, r in graph.valid.nonzero().tolist()]
    return _RunKey(
        weights=weights_fingerprint(model),
        graph=_digest("\n".join([*graph.writers, "", *graph.readers, "", *edge_names])),
        prompts=_digest(clean, corrupted, "all positions" if positions is None else positions),
        metric=tuple(torch.cat(values).tolist()),
        density=pruning.density, steps=pruning.steps, lr=pruning.lr, batch_size=batch,
        objective=pruning.objective, seed=pruning.seed, ablation=_ablation_key(ablation), n_prompts=n,
        n_edges=graph.n_edges, start=OWN_START if start is None else getattr(start, "method", start),
        start_ranks=normalised_ranks(start)[graph.valid] if isinstance(start, EdgeScores) else None,
        code=source_key(INTERP_SOURCE),
        start_factor=pruning.start_factor, ramp=pruning.ramp, patience=pruning.patience,
    )  # fmt: skip


def _digest(*parts: Tensor | str) -> str:
    """A short hash of texts and integer tensors (their values and shapes, wherever they are)."""
    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Tensor):
            digest.update(f"{tuple(part.shape)}".encode())
            part = part.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


_IDENTITY = {
    "weights": "model weights",
    "graph": "edge graph",
    "prompts": "prompts",
    "metric": "metric",
    "start_ranks": "start ranking",
    "code": "interp code",
}


def _differences(saved: dict, key: _RunKey) -> list[str]:
    """What differs between a checkpoint's key (`saved`) and this run's, in words; [] when it is this
    run's. The metric is a function: two are the same where their values on the clean and on the
    corrupted prompts agree to METRIC_RTOL (another metric, answer or position differs by far more;
    the same one computed again agrees to float rounding); two start rankings where their normalised
    ranks differ by RANKS_TOL at most on average (EAP-IG in another batch size moves a few near-tied
    edges by a rank or so; another method or number of steps moves most)."""
    here = asdict(key)
    parts = []
    for field_name, words in _IDENTITY.items():
        theirs, ours = saved.get(field_name), here[field_name]
        if field_name == "start_ranks":  # the same ranking computed again moves a few near-tied edges
            same = (
                theirs is None
                or ours is None
                or (theirs.shape == ours.shape and float((theirs - ours).abs().mean()) <= RANKS_TOL)
            )
        elif field_name == "metric":
            same = theirs is not None and len(theirs) == len(ours) and torch.allclose(
                torch.tensor(theirs, dtype=torch.float64), torch.tensor(ours, dtype=torch.float64),
                rtol=METRIC_RTOL, atol=METRIC_RTOL, equal_nan=True,
            )  # fmt: skip
        else:
            same = theirs == ours
        if not same:
            parts.append(words)
    changed = [
        f"{name} {saved.get(name)!r}, here {value!r}"
        for name, value in here.items()
        if name not in _IDENTITY and saved.get(name) != value
    ]
    if changed:
        parts.append(f"settings ({'; '.join(changed)})")  # "steps 30, here 45"
    return parts


def _load(path, key: _RunKey | None) -> dict | None:
    """The checkpoint's state, None where there is none; refused where it is another run's, of an
    older format or no checkpoint at all (`read_mask_checkpoint`)."""
    state = read_mask_checkpoint(path)
    if state is None:
        return None
    if not str(state["key"].get("weights", "")).startswith(FINGERPRINT_SCHEME + "-"):
        raise ValueError(
            f"{path} was written by an older interp, whose key cannot tell models apart; give another "
            f"checkpoint file or delete {path} to train the mask from scratch"
        )
    if differ := _differences(state["key"], key):
        raise ValueError(
            f"{path} is the checkpoint of another pruning run, with other {_listed(differ)}; give "
            f"another checkpoint file or delete {path} to train the mask from scratch"
        )
    return state


def _listed(parts: list[str]) -> str:
    """ "a", "a and b", "a, b and c" """
    return parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"


def read_mask_checkpoint(path: str | os.PathLike | None) -> dict | None:
    """The state in an edge-mask checkpoint file of `prune_edges` (None: no path, or no file there yet);
    a file that is none (another kind of file, a checkpoint of an older format that did not record the
    model, prompts and metric) refused in one line (ValueError). Needs no model: a command can check
    the file before it loads one; `checkpoint_step` checks it against a run."""
    if path is None or not os.path.exists(path):
        return None
    redo = f"give another checkpoint file or delete {path} to train the mask from scratch"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch.load's errors differ by what the file holds (pickle, zip, EOF, ...)
        raise ValueError(
            f"{path} is no edge-mask checkpoint (torch.load cannot read it: {type(error).__name__}); {redo}"
        ) from None
    if not isinstance(state, dict) or not set(state) >= _CHECKPOINT_FIELDS:
        if isinstance(state, dict) and "settings" in state and "step" in state:
            raise ValueError(
                f"{path} is an edge-mask checkpoint of an older format, which does not record the model, "
                f"prompts and metric it was trained on, so it cannot be checked against this run; {redo}"
            )
        raise ValueError(f"{path} is no edge-mask checkpoint (it holds no mask's training state); {redo}")
    if state["format"] != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path} is an edge-mask checkpoint of format {state['format']!r}; this interp reads format "
            f"{CHECKPOINT_FORMAT}; {redo}"
        )
    return state


def checkpoint_step(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    pruning: PruneSettings = PruneSettings(),
    checkpoint: str | os.PathLike | None = None,
    *,
    ablation: Ablation | AblationKind = "counterfactual",
    start: str | None = None,
) -> int | None:
    """The step `prune_edges` with these arguments resumes `checkpoint` from (None: no file, it trains
    from the start); a file that is not this run's checkpoint refused (ValueError naming what differs:
    model weights, edge graph, prompts, metric, settings), as `prune_edges` refuses it, so that a caller
    can check before other long work. start: the method of the start ranking `prune_edges` is given
    (the ranking itself is checked by `prune_edges`), or None where it ranks the edges itself."""
    if checkpoint is None or not os.path.exists(checkpoint):  # (`_load` reads it, and refuses another's)
        return None
    ablation = edge_ablation(ablation)
    clean, corrupted = edge_pair(model, clean, corrupted, ablation)
    metric = check_reads_real_tokens(model, metric, clean)
    graph = edge_graph(model)
    key = _run_key(
        model, clean, corrupted, metric, pruning, ablation=ablation, start=start, graph=graph
    )  # fmt: skip
    return int(_load(checkpoint, key)["step"])
