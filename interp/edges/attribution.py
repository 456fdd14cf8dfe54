"""Edge scores: EAP, EAP-IG (over inputs or activations) and exact edge patching.

Scores are per edge, summed over positions and averaged over prompts, and estimate
m(edge ablated) - m(clean) in the metric's units (negative: the edge helps):

  EAP            (a_ablated - a_clean) . d m / d reader_input, at the clean run (Syed et al. 2023)
  EAP-IG inputs  the gradient averaged over `steps` runs whose input embeddings lie on the line from
                 the ablated to the clean input, alpha = k / steps with k = 1..steps (`ig_points="paper"`:
                 the right Riemann sum, Hanna et al. 2024) or k = 0..steps-1 (`"mib"`: the left sum, the
                 EAP-IG reference code since Feb 2025 and so MIB's circuit track)
  EAP-IG activations  as the reference code (hannamw/EAP-IG, `get_scores_ig_activations`): for each
                 writer group G (the input, a layer's heads, an MLP) and k = 1..steps, one run with G's
                 outputs replaced by ablated + k/steps (clean - ablated) (a constant: no gradient flows
                 through G); every edge's gradient is the mean over all (G, k) runs
  EAP-IG activations, grouped  each writer's edges take the mean gradient over its own group's runs
                 only (Marks et al. 2024's per-layer integrated gradients)
  exact          m(edge ablated) - m(clean), one edge-level run per edge (verification, small graphs)

Why both activation variants: the reference's mean runs over every group, so most of an edge's runs
keep its writer clean (its score drifts towards EAP's), and in the run that replaces the reader's own
group the reader's gradient is zero; the grouped variant integrates each writer's group along its own
path. The reference's is `"eap-ig-activations"` because MIB and published scores use it.

Prompts: clean and corrupted token batches [batch, pos] of one width (`pad_pair` right-pads prompts
of different lengths; position p of the corrupted prompt stands in for position p of the clean one).
A metric is `interp.types.Metric`; one with per-prompt answers (`metrics.logit_diff_metric`) scores
sub-batches (`batch_size`) and lets runs unembed only the positions it reads.

Memory: gradients of every reader's input are summed over the integration steps, layer by layer, in
one fp32 tensor [reader, batch, pos, d_model]; EAP and EAP-IG over inputs read the writers' outputs
(ablated minus clean, one tensor [writer, batch, pos, d_model]) after the backward passes, so the two
never meet the backward pass's saved activations. `max_memory` picks the batch size from an
estimate of these per prompt (`_bytes_per_prompt`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from jaxtyping import Int
from torch import Tensor

from interp.checks import check_gradient_dtype
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
    run_circuits,
    unembed_at,
    writer_outputs,
)
from interp.interventions.ablation import Ablation
from interp.interventions.engine import Intervention, Site, intervened, read_with_grad
from interp.interventions.metrics import check_differentiable, check_reads_real_tokens, for_rows
from interp.io.devices import module_weight
from interp.model.cache import act_name
from interp.model.components import Norm
from interp.model.tokens import index_tokens
from interp.model.transformer import HookedTransformer
from interp.types import AblationKind, MemorySize, Metric, Progress, memory_bytes

Method = Literal["eap", "eap-ig", "eap-ig-activations", "eap-ig-activations-grouped", "exact"]
METHODS: tuple[str, ...] = ("eap", "eap-ig", "eap-ig-activations", "eap-ig-activations-grouped", "exact")
IGPoints = Literal["paper", "mib"]
IG_POINTS: tuple[str, ...] = ("paper", "mib")
DEFAULT_BATCH_SIZE = 16
STAGE = "Edge scores"  # the stage edge scoring reports to a Progress callback


def _score_from_grads(
    graph: EdgeGraph, delta: Tensor, grads: Tensor, scores: Tensor, writers: slice | None = None
) -> None:
    """scores[w, r] += sum over batch, pos, d of delta[w] * grads[r], for every edge (w, r) with w in
    `writers` (default all). delta [W, B, P, d]; grads [R, B, P, d].

    One product of every writer with every reader, the pairs that are not edges then dropped: it
    reads delta and grads once (per-layer products, which skip the non-edges, re-read delta per
    reader layer and were memory-bound: 3x slower on SmolLM2)."""
    first, last = (0, graph.n_writers) if writers is None else (writers.start, writers.stop)
    if last <= first:
        return
    products = delta[first:last].reshape(last - first, -1) @ grads.reshape(grads.shape[0], -1).T
    valid = graph.valid[first:last].to(products.device)
    scores[first:last] += products.masked_fill_(~valid, 0).to(scores.device, scores.dtype)


def edge_attribution(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    method: Method = "eap-ig",
    steps: int = 5,
    *,
    ablation: Ablation | AblationKind = "counterfactual",
    batch_size: int | None = None,
    progress: Progress | None = None,
    reader_pos: Int[Tensor, " batch"] | None = None,
    ig_points: IGPoints = "paper",
    max_memory: MemorySize | None = None,
    base: Sequence[Intervention] = (),
) -> EdgeScores:
    """Score every edge of `model` on prompt pairs (see the module docstring for the methods).

    Gradient methods cost 2 forward passes and `steps` forward and backward passes per batch of
    prompts ("eap": steps = 1; the activation methods: `steps` per writer group); "exact" costs one
    forward pass per edge (batched). `batch_size` prompts per batch (default 16); `max_memory` (bytes
    or "2GiB") picks the largest batch whose estimated memory fits, at most `batch_size` where given
    (gradient methods). `reader_pos` ([batch], gradient methods) scores only what readers read at one
    position per prompt (a path-patching-like estimate, e.g. heads -> name movers' queries at END).
    `ablation`: what ablated edges carry (`ablated_outputs`; mean and resample read the corrupted
    prompts unless the Ablation has its own reference tokens).
    `base`: the engine's interventions made in every run, clean, corrupted, reference and
    intervened (e.g. heads mean-ablated: `ablation.ablation_interventions`; per-prompt values
    are those of the clean prompts, taken row by row in each batch; `engine.intervention_hooks`).
    progress("Edge scores", done, total): batches x integration steps done (exact: edges scored).
    """
    if method == "exact":
        if reader_pos is not None:
            raise ValueError("reader_pos applies to the gradient methods (eap, eap-ig), not to exact.")
        if max_memory is not None:
            raise ValueError(
                "max_memory applies to the gradient methods (eap, eap-ig); exact runs batch_size prompts."
            )
        _check_method(model, method, steps, metric)
        ablation = edge_ablation(ablation)
        clean, corrupted = edge_pair(model, clean, corrupted, ablation)
        metric = check_reads_real_tokens(model, metric, clean)
        with intervened(model, base, torch.arange(clean.shape[0])):
            return _exact_scores(
                model, edge_graph(model), clean, corrupted, metric, ablation,
                batch_size or DEFAULT_BATCH_SIZE, progress,
            )  # fmt: skip
    positions = {"": reader_pos}
    return edge_attribution_by_position(
        model, clean, corrupted, metric, positions, method, steps, ablation=ablation,
        batch_size=batch_size, progress=progress, ig_points=ig_points, max_memory=max_memory, base=base,
    )[""]  # fmt: skip


def edge_attribution_by_position(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    reader_positions: dict[str, Int[Tensor, " batch"] | None],
    method: Literal["eap", "eap-ig", "eap-ig-activations", "eap-ig-activations-grouped"] = "eap",
    steps: int = 5,
    *,
    ablation: Ablation | AblationKind = "counterfactual",
    batch_size: int | None = None,
    progress: Progress | None = None,
    ig_points: IGPoints = "paper",
    max_memory: MemorySize | None = None,
    base: Sequence[Intervention] = (),
) -> dict[str, EdgeScores]:
    """Gradient edge scores for several reader positions from one set of gradients: name ->
    EdgeScores of what readers read at those positions ([batch], one per prompt; None: all).
    ig_points: where EAP-IG over inputs evaluates gradients (module docstring); EAP always takes
    alpha = 1, the activation methods k = 1..steps (the reference code's). ablation, batch_size,
    max_memory, base: as `edge_attribution`."""
    _check_method(model, method, steps, metric)
    ablation = edge_ablation(ablation)
    if ig_points not in IG_POINTS:
        raise ValueError(f"ig_points={ig_points!r} is not one of {IG_POINTS}; 'mib' is MIB's convention.")
    if method == "exact":
        raise ValueError("scores by reader position come from the gradient methods (eap, eap-ig).")
    activations = method.startswith("eap-ig-activations")
    if activations and ig_points != "paper":
        raise ValueError(
            f"ig_points={ig_points!r} applies to EAP-IG over inputs (method='eap-ig'); {method} takes "
            "alpha = k/steps, k = 1..steps, as the reference code does: leave ig_points='paper'."
        )
    clean, corrupted = edge_pair(model, clean, corrupted, ablation)
    metric = check_reads_real_tokens(model, metric, clean)
    graph = edge_graph(model)
    steps = 1 if method == "eap" else steps
    first = 0 if ig_points == "mib" and method == "eap-ig" else 1
    alphas = [k / steps for k in range(first, first + steps)]
    batch_size = _batch_size(model, graph, clean.shape, method, ablation.kind, batch_size, max_memory)
    scores = {name: torch.zeros(graph.n_writers, graph.n_readers) for name in reader_positions}
    # Counterfactual outputs are read per batch (all prompts' writer outputs at once are the largest
    # tensor here: writers x prompts x positions x d_model); the other ablations are one mean or
    # resampled set.
    if ablation.kind == "counterfactual":
        ablated_all = None
    else:
        with intervened(model, base):
            ablated_all = ablated_outputs(model, clean, corrupted, ablation)
    batches = chunks(clean.shape[0], batch_size)
    groups = _writer_groups(graph) if activations else [slice(0, 1)]
    head_groups = [graph.head_writers(layer) for layer in range(graph.n_layers)]  # one-head layers too
    total, done = len(batches) * len(groups) * steps, 0
    for ids in batches:
        with intervened(model, base, ids):  # the base interventions in every run of the batch
            tokens = index_tokens(clean, ids)
            with torch.no_grad():  # the ends of the integration: every writer's outputs, or the input's only
                writers = slice(0, graph.n_writers if activations else 1)
                ablated = _ablated_outputs(model, index_tokens(corrupted, ids), ablated_all, ids, writers)
                clean_out = writer_outputs(model, tokens) if activations else _input_embedding(model, tokens)
            grads = torch.zeros(graph.n_readers, *tokens.shape, model.cfg.d_model, device=model.device)
            delta = (ablated - clean_out).float() if activations else None
            for group in groups:
                start, end = ablated[group], clean_out[group]  # [n, B|1, P, d], [n, B, P, d]
                for alpha in alphas:
                    point = start + alpha * (end - start)
                    if not activations:  # integrated gradients over the input embedding (EAP: alpha = 1)
                        _add_reader_grads(model, graph, tokens, metric, ids, grads, input_embed=point[0])
                    else:  # over one writer group's outputs: a layer's heads [B, P, head, d], else [B, P, d]
                        point = point.permute(1, 2, 0, 3) if group in head_groups else point[0]
                        iv = EdgeRun(overrides={group.start: point})
                        _add_reader_grads(model, graph, tokens, metric, ids, grads, iv)
                    done += 1
                    if progress:
                        progress(STAGE, done, total)
                if method == "eap-ig-activations-grouped":
                    _score_positions(graph, delta, grads, reader_positions, ids, scores, group)
                    grads.zero_()
            del ablated, clean_out, start, end
            if method != "eap-ig-activations-grouped":
                if delta is None:  # read after the backward passes: they and this never hold memory together
                    delta = _writer_deltas(model, tokens, index_tokens(corrupted, ids), ablated_all, ids)
                _score_positions(graph, delta, grads, reader_positions, ids, scores)
            del delta, grads
    runs = steps * (len(groups) if method == "eap-ig-activations" else 1)
    return {
        name: EdgeScores(
            graph=graph,
            scores=(s / (clean.shape[0] * runs)).masked_fill(~graph.valid, 0.0),
            method=method,
            ablation=ablation.kind,
            steps=steps,
            n_prompts=clean.shape[0],
        )
        for name, s in scores.items()
    }


def _check_method(model: HookedTransformer, method: str, steps: int, metric: Metric) -> None:
    if method != "exact":
        check_gradient_dtype(model.dtype, f"edge attribution by {method}")
        check_differentiable(metric, f"edge attribution by {method}")
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}.")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}.")


def _input_embedding(model: HookedTransformer, tokens: Tensor) -> Tensor:
    """The input writer's output [1, batch, pos, d_model] (the residual stream before block 0)."""
    name = "blocks.0.hook_resid_pre"
    return model.run_with_cache(tokens, names_filter=name, return_type=None)[1][name][None]


def _ablated_outputs(
    model: HookedTransformer, corrupted: Tensor, ablated_all: Tensor | None, ids: Tensor, writers: slice
) -> Tensor:
    """What ablated `writers` carry for the batch `ids` [n, batch or 1, pos, d_model]: the outputs on
    its corrupted prompts, or its rows of the mean / zero / resampled outputs."""
    if ablated_all is not None:
        return ablated_all[writers] if ablated_all.shape[1] == 1 else ablated_all[writers, ids]
    return writer_outputs(model, corrupted) if writers.stop > 1 else _input_embedding(model, corrupted)


@torch.no_grad()
def _writer_deltas(
    model: HookedTransformer, tokens: Tensor, corrupted: Tensor, ablated_all: Tensor | None, ids: Tensor
) -> Tensor:
    """Every writer's ablated minus clean output on the batch [W, batch, pos, d_model], float32, made
    in one tensor (the clean outputs are subtracted in place as the clean run makes them)."""
    graph = edge_graph(model)
    ablated = _ablated_outputs(model, corrupted, ablated_all, ids, slice(0, graph.n_writers))
    if ablated_all is not None:  # a fresh tensor of the batch's size to subtract from
        ablated = ablated.expand(-1, len(ids), -1, -1).clone()
    return writer_outputs(model, tokens, subtract_from=ablated).float()


def _score_positions(
    graph: EdgeGraph,
    delta: Tensor,
    grads: Tensor,
    reader_positions: dict[str, Tensor | None],
    ids: Tensor,
    scores: dict[str, Tensor],
    writers: slice | None = None,
) -> None:
    """Add the batch's scores at each set of reader positions (see `_score_from_grads`)."""
    for name, positions in reader_positions.items():
        at_delta, at_grads = _at_positions(delta, grads, positions, ids)
        _score_from_grads(graph, at_delta, at_grads, scores[name], writers)


def _at_positions(
    delta: Tensor, grads: Tensor, positions: Tensor | None, ids: Tensor
) -> tuple[Tensor, Tensor]:
    """delta [W, B, P, d] and readers' gradients [R, B, P, d] at one position per prompt of the
    batch `ids` ([W, B, 1, d], [R, B, 1, d]); None: every position (unchanged)."""
    if positions is None:
        return delta, grads
    rows = torch.arange(len(ids), device=delta.device)
    pos = positions[ids].to(delta.device)
    return delta[:, rows, pos][:, :, None], grads[:, rows, pos][:, :, None]


def _writer_groups(graph: EdgeGraph) -> list[slice]:
    """The input, each layer's heads, each MLP: the units EAP-IG-activations interpolates."""
    groups = [slice(0, 1)]
    for layer in range(graph.n_layers):
        heads = graph.head_writers(layer)
        groups.append(heads)
        if graph.has_mlp:
            groups.append(slice(heads.stop, heads.stop + 1))
    return groups


def _batch_size(
    model: HookedTransformer,
    graph: EdgeGraph,
    shape: torch.Size,
    method: str,
    kind: AblationKind,
    batch_size: int | None,
    max_memory: MemorySize | None,
) -> int:
    """`batch_size` (default 16), or with `max_memory` the most prompts (at most `batch_size`) whose
    estimated memory (`_bytes_per_prompt`, plus a resampled ablation's outputs) fits."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if max_memory is None:
        return batch_size or DEFAULT_BATCH_SIZE
    budget = memory_bytes(max_memory)
    n_prompts, n_pos = shape
    fixed = graph.n_writers * n_prompts * n_pos * model.cfg.d_model * model.dtype.itemsize
    fixed = fixed if kind == "resample" else 0
    per_prompt = _bytes_per_prompt(model, graph, n_pos, method)
    fits = (budget - fixed) // per_prompt
    if fits < 1:
        raise ValueError(
            f"max_memory={max_memory!r} is less than one prompt of {n_pos} positions needs for {method} "
            f"on this model (an estimated {(fixed + per_prompt) / 2**20:.0f} MiB): raise max_memory, or "
            "score shorter prompts."
        )
    return int(min(fits, batch_size or n_prompts, max(n_prompts, 1)))


# Saved activations of a forward pass for the backward pass, per token and layer, in d_model- and
# d_mlp-sized tensors (measured with saved-tensor hooks on SmolLM2 and GPT-2-shaped models, rounded up).
SAVED_PER_D_MODEL, SAVED_PER_D_MLP = 24, 6


def _saved_bytes_per_token(model: HookedTransformer, n_pos: int) -> int:
    """Estimated bytes the forward pass saves for the backward pass per token (attention patterns
    grow with the prompt's length `n_pos`)."""
    cfg = model.cfg
    d_mlp = 0 if cfg.attn_only else cfg.d_mlp
    per_layer = SAVED_PER_D_MODEL * cfg.d_model + SAVED_PER_D_MLP * d_mlp + 4 * cfg.n_heads * n_pos
    return cfg.n_layers * per_layer * model.dtype.itemsize


def _bytes_per_prompt(model: HookedTransformer, graph: EdgeGraph, n_pos: int, method: str) -> int:
    """Estimated peak memory of one prompt in a gradient batch, in bytes: the readers' summed
    gradients (fp32) plus the larger of the backward pass's saved activations and the writers'
    deltas; the activation methods also hold both ends of every writer and the edge-level run's
    reader inputs."""
    d, item = model.cfg.d_model, model.dtype.itemsize
    grads = 4 * graph.n_readers * d
    deltas = graph.n_writers * d * (item + 4)
    saved = _saved_bytes_per_token(model, n_pos)
    if method.startswith("eap-ig-activations"):
        return n_pos * (grads + 3 * deltas + saved + 2 * graph.n_readers * d * item)
    return n_pos * (grads + max(saved, deltas))


def _add_reader_grads(
    model: HookedTransformer,
    graph: EdgeGraph,
    tokens: Tensor,
    metric: Metric,
    ids: Tensor,
    into: Tensor,
    intervention: EdgeRun | None = None,
    input_embed: Tensor | None = None,
) -> None:
    """into [R, B, P, d] += d(sum of the metric over prompts) / d(every reader's input), readers in
    graph order; the run's input embedding replaced by `input_embed` [B, P, d] where given."""
    if intervention is None:
        return _add_reader_grads_by_norm_vjp(model, tokens, metric, ids, into, input_embed)
    inputs: list[Tensor] = []
    overrides = {i: t.detach().requires_grad_(True) for i, t in intervention.overrides.items()}
    if input_embed is not None:
        overrides[0] = input_embed.detach().requires_grad_(True)
    intervention = EdgeRun(intervention.keep, intervention.ablated, overrides)
    n_prompts = int(ids.max()) + 1 if len(ids) else 0
    with torch.enable_grad():
        logit_pos = logit_positions(metric, ids, tokens.shape[1])
        logits = edge_forward(model, graph, tokens, intervention, inputs, logit_pos)
        values = for_rows(read_at(metric, logit_pos), ids, n_prompts)(logits)
        grads = torch.autograd.grad(values.sum(), inputs, allow_unused=True)
    reader = 0
    for x, g in zip(inputs, grads, strict=True):
        n = 1 if x.ndim == 3 else x.shape[2]
        if g is not None:
            into[reader : reader + n] += g.permute(2, 0, 1, 3) if g.ndim == 4 else g[None]
        reader += n


def _add_reader_grads_by_norm_vjp(
    model: HookedTransformer,
    tokens: Tensor,
    metric: Metric,
    ids: Tensor,
    into: Tensor,
    input_embed: Tensor | None,
) -> None:
    """`_add_reader_grads` without an intervention, from one ordinary forward and backward pass.

    Every reader of a layer reads the same residual stream x, so a reader's gradient is the
    vector-Jacobian product of its own path through the block's input norm: query head h gets
    VJP_norm(x, dm/dq_h W_Q[h]^T), a key/value head VJP_norm(x, dm/dk_g W_K[g]^T); the norm's VJP
    is closed-form (`Norm.vjp`), which is cheap next to running the whole model on one copy of the
    residual stream per reader (what `edge_forward` does with interventions). The MLP's and the
    logits' gradients are taken at their inputs (`hook_mlp_in`, the final residual stream). Each
    layer's gradients are added to `into` as they are made (one layer's worth at a time)."""
    cfg = model.cfg
    graph = edge_graph(model)

    def input_point(act: Tensor) -> Tensor:
        """The input embedding (`input_embed` where given), a tensor the gradients flow from."""
        value = act if input_embed is None else input_embed.to(act.dtype)
        return value if value.requires_grad else value.detach().requires_grad_(True)

    names = [act_name(kind, layer) for layer in range(cfg.n_layers) for kind in ("resid_pre", "q", "k", "v")]
    if not cfg.attn_only:
        names += [f"blocks.{layer}.hook_mlp_in" for layer in range(cfg.n_layers)]
    final = act_name("resid_post", cfg.n_layers - 1)
    n_prompts = int(ids.max()) + 1 if len(ids) else 0
    set_input = Intervention(Site("blocks.0.hook_resid_pre"), input_point)
    per_kv_head = model.settings(ungroup_grouped_query_attention=False)  # hook_k/v per key/value head
    with per_kv_head, intervened(model, [set_input]), read_with_grad(model, names + [final]) as kept:
        resid = model(tokens, stop_at_layer=cfg.n_layers)
        logit_pos = logit_positions(metric, ids, tokens.shape[1])
        logits = unembed_at(model, resid, logit_pos)
        wanted = [name for name in names + [final] if not name.endswith("resid_pre")]
        found = torch.autograd.grad(
            for_rows(read_at(metric, logit_pos), ids, n_prompts)(logits).sum(),
            [kept[n] for n in wanted],
            allow_unused=True,
        )
    grads = dict(zip(wanted, found, strict=True))
    del found, logits, resid

    with torch.no_grad():
        for layer in range(cfg.n_layers):
            block = model.blocks[layer]
            attn = block.attn
            x = kept.pop(act_name("resid_pre", layer))
            g_q, g_k, g_v = (_grad_or_zeros(grads, kept, act_name(kind, layer)) for kind in "qkv")
            # Weights read in where accelerate offloaded the block (device_map).
            W_Q, W_K, W_V = (module_weight(attn, name, g_q.device) for name in ("W_Q", "_W_K", "_W_V"))
            q = torch.einsum("bphe,hde->bphd", g_q, W_Q)
            k = torch.einsum("bpge,gde->bpgd", g_k, W_K)
            v = torch.einsum("bpge,gde->bpgd", g_v, W_V)
            q_readers, _, v_readers, mlp = graph.layer_readers(layer)
            vjp = _input_norm_vjp(block.ln1, x, torch.cat([q, k, v], dim=2))
            into[q_readers.start : v_readers.stop] += vjp.permute(2, 0, 1, 3)
            del x, q, k, v, vjp
            if mlp is not None:  # the MLP's input, through ln2 by autograd
                into[mlp] += _grad_or_zeros(grads, kept, f"blocks.{layer}.hook_mlp_in")
        into[-1] += _grad_or_zeros(grads, kept, final)


def _grad_or_zeros(grads: dict[str, Tensor | None], kept: dict[str, Tensor], name: str) -> Tensor:
    """The gradient at hook `name` (zeros where the metric does not depend on it), released."""
    g, x = grads.pop(name), kept.pop(name)
    return torch.zeros_like(x) if g is None else g


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
    batch_size: int,
    progress: Progress | None,
) -> EdgeScores:
    """m(edge ablated) - m(clean), averaged over prompts: one intervened run per edge."""
    edges = graph.edges()
    ablated = ablated_outputs(model, clean, corrupted, ablation)
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
            scores[w, r] = float((values[k].to(base.device) - base).mean())
        if progress:
            progress(STAGE, min(start + per_run, len(edges)), len(edges))
    return EdgeScores(
        graph=graph, scores=scores, method="exact", ablation=ablation.kind, steps=1, n_prompts=clean.shape[0]
    )
