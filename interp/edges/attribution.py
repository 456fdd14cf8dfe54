"""Edge scores: EAP, EAP-IG (over inputs or activations) and exact edge patching.

Scores are per edge, summed over positions and averaged over prompts, and estimate
m(edge ablated) - m(clean) in the metric's units (negative: the edge helps):

  EAP            (a_ablated - a_clean) . d m / d reader_input, at the clean run (Syed et al. 2023)
  EAP-IG inputs  the gradient averaged over `steps` runs whose input embeddings lie on the line from
                 the ablated to the clean input, alpha = k / steps with k = 1..steps (`ig_points="paper"`:
                 the right Riemann sum, Hanna et al. 2024) or k = 0..steps-1 (`"mib"`: the left sum, the
                 EAP-IG reference code since Feb 2025 and so MIB's circuit track)
  EAP-IG activations  per writer group (the input, a layer's heads, an MLP) the gradient averaged over
                 runs with that group's outputs interpolated between ablated and clean
  exact          m(edge ablated) - m(clean), one edge-level run per edge (verification, small graphs)

Prompts: clean and corrupted token batches [batch, pos] of one width (`pad_pair` right-pads prompts
of different lengths; position p of the corrupted prompt stands in for position p of the clean one).
A metric is `interp.types.Metric`; one with per-prompt answers (`metrics.logit_diff_metric`) scores
sub-batches (`batch_size`) and lets runs unembed only the positions it reads.
"""

from __future__ import annotations

from typing import Literal

import torch
from jaxtyping import Int
from torch import Tensor

from interp.edges.graph import EdgeGraph, EdgeScores, edge_graph
from interp.edges.intervene import (
    Intervention,
    ablated_outputs,
    chunks,
    edge_forward,
    logit_positions,
    run_circuits,
    unembed_at,
    writer_outputs,
)
from interp.interventions.engine import check_pair
from interp.interventions.metrics import for_rows
from interp.io.devices import module_weight
from interp.model.cache import act_name
from interp.model.components import Norm
from interp.model.transformer import HookedTransformer
from interp.types import Ablation, Metric, Progress

Method = Literal["eap", "eap-ig", "eap-ig-activations", "exact"]
METHODS: tuple[str, ...] = ("eap", "eap-ig", "eap-ig-activations", "exact")
IGPoints = Literal["paper", "mib"]
IG_POINTS: tuple[str, ...] = ("paper", "mib")


def _score_from_grads(
    graph: EdgeGraph, delta: Tensor, grads: list[Tensor], scores: Tensor, writers: slice | None = None
) -> None:
    """scores[w, r] += sum over batch, pos, d of delta[w] * grad[r], for every reader (in graph order)
    and the writers in `writers` (default all).

    delta [W, B, P, d] (or [W, 1, P, d], broadcast); grads as `edge_forward` collects them."""
    delta = delta.expand(-1, grads[0].shape[0], -1, -1)
    first, last = (0, graph.n_writers) if writers is None else (writers.start, writers.stop)
    reader = 0
    for grad in grads:
        g = grad.permute(2, 0, 1, 3)  # [R, B, P, d]
        n_r = g.shape[0]
        stop = min(last, graph.n_upstream[reader])
        if stop > first:
            flat_delta = delta[first:stop].reshape(stop - first, -1)
            scores[first:stop, reader : reader + n_r] += flat_delta @ g.reshape(n_r, -1).T
        reader += n_r


def edge_attribution(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    method: Method = "eap-ig",
    steps: int = 5,
    ablation: Ablation = "counterfactual",
    reference: Int[Tensor, "n pos"] | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
    reader_pos: Int[Tensor, " batch"] | None = None,
    ig_points: IGPoints = "paper",
) -> EdgeScores:
    """Score every edge of `model` on prompt pairs (see the module docstring for the methods).

    Gradient methods cost (steps + 2) forward passes and `steps` backward passes per batch of
    `batch_size` prompts ("eap": steps = 1); "exact" costs one forward pass per edge (batched).
    `reader_pos` ([batch], gradient methods) scores only what readers read at one position per prompt
    (a path-patching-like estimate, e.g. heads -> name movers' queries at END).
    """
    if method == "exact":
        if reader_pos is not None:
            raise ValueError("reader_pos applies to the gradient methods (eap, eap-ig), not to exact.")
        _check_method(method, steps)
        clean, corrupted = check_pair(model, clean, corrupted)
        return _exact_scores(
            model, edge_graph(model), clean, corrupted, metric, ablation, reference, batch_size, progress
        )
    positions = {"": reader_pos}
    return edge_attribution_by_position(
        model, clean, corrupted, metric, positions, method, steps, ablation, reference, batch_size, progress,
        ig_points,
    )[""]  # fmt: skip


def edge_attribution_by_position(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    reader_positions: dict[str, Int[Tensor, " batch"] | None],
    method: Literal["eap", "eap-ig", "eap-ig-activations"] = "eap",
    steps: int = 5,
    ablation: Ablation = "counterfactual",
    reference: Int[Tensor, "n pos"] | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
    ig_points: IGPoints = "paper",
) -> dict[str, EdgeScores]:
    """Gradient edge scores for several reader positions from one set of gradients: name ->
    EdgeScores of what readers read at those positions ([batch], one per prompt; None: all).
    ig_points: where EAP-IG evaluates gradients (module docstring); EAP always takes alpha = 1."""
    _check_method(method, steps)
    if ig_points not in IG_POINTS:
        raise ValueError(f"ig_points={ig_points!r} is not one of {IG_POINTS}; 'mib' is MIB's convention.")
    first = 0 if ig_points == "mib" and method != "eap" else 1
    if method == "exact":
        raise ValueError("scores by reader position come from the gradient methods (eap, eap-ig).")
    clean, corrupted = check_pair(model, clean, corrupted)
    graph = edge_graph(model)
    steps = 1 if method == "eap" else steps
    scores = {name: torch.zeros(graph.n_writers, graph.n_readers) for name in reader_positions}
    # Counterfactual outputs are read per batch (all prompts' writer outputs at once are the largest
    # tensor here: writers x prompts x positions x d_model); the other ablations are one mean or
    # resampled set.
    per_batch = ablation == "counterfactual"
    ablated_all = None if per_batch else ablated_outputs(model, clean, corrupted, ablation, reference)
    batches = chunks(clean.shape[0], batch_size)
    groups = _writer_groups(graph) if method == "eap-ig-activations" else [None]
    total, done = len(batches) * len(groups) * steps, 0
    for ids in batches:
        tokens = clean[ids]
        with torch.no_grad():
            if ablated_all is None:
                ablated = writer_outputs(model, corrupted[ids])
            else:
                ablated = ablated_all if ablated_all.shape[1] == 1 else ablated_all[:, ids]
            clean_out = writer_outputs(model, tokens)
        delta = (ablated - clean_out).float()  # [W, B|1, P, d]
        for group in groups:
            grads_sum = None
            for step in range(first, first + steps):
                alpha = step / steps
                if group is None:  # integrated gradients over the input embedding
                    embed = ablated[0] + alpha * (clean_out[0] - ablated[0])
                    grads = _reader_grads(model, graph, tokens, metric, ids, None, embed)
                else:  # over one group of writers' outputs
                    base = ablated[group].expand_as(clean_out[group])
                    mixed = base + alpha * (clean_out[group] - base)
                    mixed = mixed[0] if group.stop - group.start == 1 else mixed.permute(1, 2, 0, 3)
                    grads = _reader_grads(
                        model, graph, tokens, metric, ids, Intervention(overrides={group.start: mixed})
                    )
                grads_sum = (
                    grads if grads_sum is None else [a.add_(b) for a, b in zip(grads_sum, grads, strict=True)]
                )
                done += 1
                if progress:
                    progress(done, total)
            for name, positions in reader_positions.items():
                at_delta, at_grads = _at_positions(delta, grads_sum, positions, ids)
                _score_from_grads(graph, at_delta, at_grads, scores[name], group)
    return {
        name: EdgeScores(
            graph,
            (s / (clean.shape[0] * steps)).masked_fill(~graph.valid, 0.0),
            method,
            ablation,
            steps,
            clean.shape[0],
        )
        for name, s in scores.items()
    }


def _check_method(method: str, steps: int) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}.")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}.")


def _at_positions(
    delta: Tensor, grads: list[Tensor], positions: Tensor | None, ids: Tensor
) -> tuple[Tensor, list[Tensor]]:
    """delta [W, B|1, P, d] and readers' gradients [B, P, R, d] at one position per prompt of the
    batch `ids` ([W, B, 1, d], [B, 1, R, d]); None: every position (unchanged)."""
    if positions is None:
        return delta, grads
    rows = torch.arange(len(ids), device=delta.device)
    pos = positions[ids].to(delta.device)
    at_delta = delta.expand(-1, len(ids), -1, -1)[:, rows, pos][:, :, None]
    return at_delta, [grad[rows, pos][:, None] for grad in grads]


def _writer_groups(graph: EdgeGraph) -> list[slice]:
    """The input, each layer's heads, each MLP: the units EAP-IG-activations interpolates."""
    groups = [slice(0, 1)]
    for layer in range(graph.n_layers):
        heads = graph.head_writers(layer)
        groups.append(heads)
        if graph.has_mlp:
            groups.append(slice(heads.stop, heads.stop + 1))
    return groups


def _reader_grads(
    model: HookedTransformer,
    graph: EdgeGraph,
    tokens: Tensor,
    metric: Metric,
    ids: Tensor,
    intervention: Intervention | None,
    input_embed: Tensor | None = None,
) -> list[Tensor]:
    """d(sum of the metric over prompts) / d(every reader's input), as `edge_forward` lists them."""
    if intervention is None:
        return _reader_grads_by_norm_vjp(model, tokens, metric, ids, input_embed)
    inputs: list[Tensor] = []
    overrides = {i: t.detach().requires_grad_(True) for i, t in intervention.overrides.items()}
    if input_embed is not None:
        overrides[0] = input_embed.detach().requires_grad_(True)
    intervention = Intervention(intervention.keep, intervention.ablated, overrides)
    n_prompts = int(ids.max()) + 1 if len(ids) else 0
    with torch.enable_grad():
        logit_pos = logit_positions(metric, ids, tokens.shape[1])
        logits = edge_forward(model, graph, tokens, intervention, inputs, logit_pos)
        values = for_rows(metric, ids, n_prompts)(logits)
        grads = torch.autograd.grad(values.sum(), inputs, allow_unused=True)
    out = []
    for x, g in zip(inputs, grads, strict=True):
        g = torch.zeros_like(x) if g is None else g
        out.append(g.float() if g.ndim == 4 else g.float()[:, :, None])
    return out


def _reader_grads_by_norm_vjp(
    model: HookedTransformer, tokens: Tensor, metric: Metric, ids: Tensor, input_embed: Tensor | None
) -> list[Tensor]:
    """`_reader_grads` without an intervention, from one ordinary forward and backward pass.

    Every reader of a layer reads the same residual stream x, so a reader's gradient is the
    vector-Jacobian product of its own path through the block's input norm: query head h gets
    VJP_norm(x, dm/dq_h W_Q[h]^T), a key/value head VJP_norm(x, dm/dk_g W_K[g]^T); the norm's VJP
    is closed-form (`Norm.vjp`), which is cheap next to running the whole model on one copy of the
    residual stream per reader (what `edge_forward` does with interventions). The MLP's and the
    logits' gradients are taken at their inputs (`hook_mlp_in`, the final residual stream)."""
    cfg = model.cfg
    kept: dict[str, Tensor] = {}

    def keep(tensor: Tensor, hook) -> None:
        kept[hook.name] = tensor

    def set_input(tensor: Tensor, hook) -> Tensor:
        tensor = tensor if input_embed is None else input_embed.to(tensor.dtype)
        return tensor if tensor.requires_grad else tensor.detach().requires_grad_(True)

    names = [act_name(kind, layer) for layer in range(cfg.n_layers) for kind in ("resid_pre", "q", "k", "v")]
    if not cfg.attn_only:
        names += [f"blocks.{layer}.hook_mlp_in" for layer in range(cfg.n_layers)]
    final = act_name("resid_post", cfg.n_layers - 1)
    n_prompts = int(ids.max()) + 1 if len(ids) else 0
    hooks = [("blocks.0.hook_resid_pre", set_input)] + [(name, keep) for name in names + [final]]
    with torch.enable_grad():
        with model.settings(use_hook_mlp_in=not cfg.attn_only), model.hooks(fwd_hooks=hooks):
            resid = model(tokens, stop_at_layer=cfg.n_layers)
        logits = unembed_at(model, resid, logit_positions(metric, ids, tokens.shape[1]))
        wanted = [name for name in names + [final] if not name.endswith("resid_pre")]
        found = torch.autograd.grad(
            for_rows(metric, ids, n_prompts)(logits).sum(), [kept[n] for n in wanted], allow_unused=True
        )
    grads = {
        name: torch.zeros_like(kept[name]) if g is None else g for name, g in zip(wanted, found, strict=True)
    }

    with torch.no_grad():  # views of the result are summed in place over integration steps
        out = []
        for layer in range(cfg.n_layers):
            block = model.blocks[layer]
            attn = block.attn
            x = kept[act_name("resid_pre", layer)]
            g_q, g_k, g_v = (grads[act_name(kind, layer)] for kind in "qkv")
            # Weights read in where accelerate offloaded the block (device_map).
            W_Q, W_K, W_V = (module_weight(attn, name, g_q.device) for name in ("W_Q", "_W_K", "_W_V"))
            q = torch.einsum("bphe,hde->bphd", g_q, W_Q)
            k = torch.einsum("bpge,gde->bpgd", g_k, W_K)
            v = torch.einsum("bpge,gde->bpgd", g_v, W_V)
            out += list(
                _input_norm_vjp(block.ln1, x, torch.cat([q, k, v], dim=2)).split(
                    [q.shape[2], k.shape[2], v.shape[2]], 2
                )
            )
            if not cfg.attn_only:  # the MLP's input, through ln2 by autograd
                out.append(grads[f"blocks.{layer}.hook_mlp_in"].float()[:, :, None])
        out.append(grads[final].float()[:, :, None])
    return out


def _input_norm_vjp(norm: torch.nn.Module, x: Tensor, cotangent: Tensor) -> Tensor:
    """A block's input norm's VJP (`Norm.vjp`); the cotangent itself where the block has no input norm."""
    return norm.vjp(x, cotangent) if isinstance(norm, Norm) else cotangent.float()


def _exact_scores(
    model: HookedTransformer,
    graph: EdgeGraph,
    clean: Tensor,
    corrupted: Tensor,
    metric: Metric,
    ablation: Ablation,
    reference: Tensor | None,
    batch_size: int,
    progress: Progress | None,
) -> EdgeScores:
    """m(edge ablated) - m(clean), averaged over prompts: one intervened run per edge."""
    edges = graph.edges()
    ablated = ablated_outputs(model, clean, corrupted, ablation, reference)
    ids = torch.arange(clean.shape[0])
    with torch.no_grad():
        base = for_rows(metric, ids, len(ids))(model(clean)).float()
    per_run = max(1, (batch_size * 8) // clean.shape[0])
    scores = torch.zeros(graph.n_writers, graph.n_readers)
    for start in range(0, len(edges), per_run):
        group = edges[start : start + per_run]
        keep = torch.ones(
            len(group), graph.n_writers, graph.n_readers, dtype=model.dtype, device=model.device
        )
        for k, (w, r) in enumerate(group):
            keep[k, w, r] = 0.0
        values = run_circuits(model, clean, keep, ablated, metric)  # [K, batch]
        for k, (w, r) in enumerate(group):
            scores[w, r] = float((values[k] - base).mean())
        if progress:
            progress(min(start + per_run, len(edges)), len(edges))
    return EdgeScores(graph, scores, "exact", ablation, 1, clean.shape[0])
