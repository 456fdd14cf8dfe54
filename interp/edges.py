"""Edge-level circuits: the graph of components, edge attribution (EAP, EAP-IG), exact edge
patching, and faithfulness of circuits with everything outside them ablated.

The graph (EAP-IG's and MIB's convention, extended to grouped-query attention):

  writers  "input" (token + position embedding), every head "a{L}.h{H}" (its `hook_result`), every
           MLP "m{L}" (its `hook_mlp_out`)                                        [W = 1 + L (H + 1)]
  readers  every head's query input "a{L}.h{H}<q>", every key/value head's key and value inputs
           ("a{L}.h{G}<k>", "<v>"; "a{L}.kv{G}<k>" under grouped-query attention, where a key/value
           head is shared by a group of query heads), every MLP's input "m{L}", and "logits"
  edges    writer -> every later reader (a layer's MLP reads its own heads unless the residual is
           parallel). GPT-2 small has 32,491 edges; SmolLM2-135M 70,651.

An edge's ablation replaces the writer's contribution to that reader's input only:

  reader_input = clean residual - sum over ablated edges (writer -> reader) of (writer - writer_ablated)

where "writer" is the writer's output in the current (intervened) run and `writer_ablated` its
output on the corrupted prompt (counterfactual), its mean over prompts (mean) or zero (zero). Biases
that belong to no writer (attention's b_O) stay. Scores are per edge, summed over positions and
averaged over prompts, and estimate m(edge ablated) - m(clean):

  EAP            (a_ablated - a_clean) . d m / d reader_input, at the clean run (Syed et al. 2023)
  EAP-IG inputs  the gradient averaged over `steps` runs whose input embeddings lie on the line from
                 the ablated to the clean input, alpha = k / steps, k = 1..steps (Hanna et al. 2024)
  EAP-IG activations  per writer group (the input, a layer's heads, an MLP) the gradient averaged over
                 runs with that group's outputs interpolated between ablated and clean
  exact          m(edge ablated) - m(clean), one intervened run per edge (verification, small graphs)

Prompts: clean and corrupted token batches [batch, pos] of one width (`pad_pair` right-pads prompts
of different lengths; position p of the corrupted prompt stands in for position p of the clean one).
A metric maps logits [batch, pos, d_vocab] and the prompts' indices [batch] to one value per prompt,
so that per-prompt answers and positions survive batching (see `logit_diff_metric`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.cache import act_name
from interp.config import Config
from interp.devices import module_weight
from interp.metrics import _token_values, logits_at
from interp.model import HookedTransformer, Norm

Method = Literal["eap", "eap-ig", "eap-ig-activations", "exact"]
Ablation = Literal["counterfactual", "mean", "zero"]
PromptMetric = Callable[
    [Tensor, Tensor], Tensor
]  # (logits [batch, pos, vocab], prompt ids [batch]) -> [batch]
Progress = Callable[[int, int], None]  # (done, total)

METHODS: tuple[str, ...] = ("eap", "eap-ig", "eap-ig-activations", "exact")
ABLATIONS: tuple[str, ...] = ("counterfactual", "mean", "zero")
# The circuit sizes of MIB's circuit-localisation track, as fractions of all edges.
MIB_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


# ---------------------------------------------------------------------------------------------
# The graph


@dataclass(frozen=True)
class EdgeGraph:
    """Writers, readers and edges of a model. Edge (w, r) exists where `valid[w, r]`.

    Writer index: 0 = input, then per layer its heads and its MLP. Reader index: per layer its query
    heads, key heads, value heads (key/value heads under grouped-query attention) and MLP; last the
    logits. `n_upstream[r]` writers (a prefix of the writer order) feed reader r.
    """

    n_layers: int
    n_heads: int
    n_kv_heads: int
    has_mlp: bool
    parallel: bool
    writers: tuple[str, ...]
    readers: tuple[str, ...]
    n_upstream: tuple[int, ...]

    @classmethod
    def from_config(cls, cfg: Config) -> EdgeGraph:
        n_heads, n_kv = cfg.n_heads, cfg.n_kv_heads
        has_mlp = not cfg.attn_only
        kv_name = "h" if n_kv == n_heads else "kv"
        writers, readers, n_upstream = ["input"], [], []
        for layer in range(cfg.n_layers):
            upstream = len(writers)
            readers += [f"a{layer}.h{h}<q>" for h in range(n_heads)]
            readers += [f"a{layer}.{kv_name}{g}<{x}>" for x in "kv" for g in range(n_kv)]
            n_upstream += [upstream] * (n_heads + 2 * n_kv)
            writers += [f"a{layer}.h{h}" for h in range(n_heads)]
            if has_mlp:
                readers.append(f"m{layer}")
                n_upstream.append(upstream if cfg.parallel_residual else len(writers))
                writers.append(f"m{layer}")
        readers.append("logits")
        n_upstream.append(len(writers))
        return cls(
            cfg.n_layers, n_heads, n_kv, has_mlp, cfg.parallel_residual, tuple(writers), tuple(readers),
            tuple(n_upstream),
        )  # fmt: skip

    @property
    def n_writers(self) -> int:
        return len(self.writers)

    @property
    def n_readers(self) -> int:
        return len(self.readers)

    @property
    def valid(self) -> Bool[Tensor, "writer reader"]:
        upstream = torch.tensor(self.n_upstream)
        return torch.arange(self.n_writers)[:, None] < upstream[None, :]

    @property
    def n_edges(self) -> int:
        return sum(self.n_upstream)

    def edge_name(self, writer: int, reader: int) -> str:
        return f"{self.writers[writer]}->{self.readers[reader]}"

    def edges(self, mask: Bool[Tensor, "writer reader"] | None = None) -> list[tuple[int, int]]:
        """(writer, reader) index pairs of the valid edges (where `mask` too), in graph order."""
        mask = self.valid if mask is None else self.valid & mask
        return [tuple(pair) for pair in mask.nonzero().tolist()]

    def layer_readers(self, layer: int) -> tuple[slice, slice, slice, int | None]:
        """Reader slices of one layer: (queries, keys, values, mlp index or None)."""
        per_layer = self.n_heads + 2 * self.n_kv_heads + int(self.has_mlp)
        start = layer * per_layer
        q = slice(start, start + self.n_heads)
        k = slice(q.stop, q.stop + self.n_kv_heads)
        v = slice(k.stop, k.stop + self.n_kv_heads)
        return q, k, v, (v.stop if self.has_mlp else None)

    def head_writers(self, layer: int) -> slice:
        start = 1 + layer * (self.n_heads + int(self.has_mlp))
        return slice(start, start + self.n_heads)

    def reader_node(self, reader: int) -> str:
        """The component a reader belongs to ("a3.h2", "a3.kv1", "m3", "logits")."""
        return self.readers[reader].split("<")[0]


def edge_graph(model_or_cfg: HookedTransformer | Config) -> EdgeGraph:
    """The edge graph of a model (or of a config: no weights needed to count edges)."""
    cfg = model_or_cfg.cfg if isinstance(model_or_cfg, HookedTransformer) else model_or_cfg
    if cfg.post_norm:
        raise ValueError(
            f"{cfg.model_name or 'this model'} normalises each block's outputs (post-norms, as Gemma 2/3 and "
            "OLMo 2 do), so the residual stream is not the sum of its heads' and MLPs' outputs and an edge's "
            "contribution is not defined; edge circuits need a pre-norm model. Use node-level patching "
            "(interp.patching) instead."
        )
    return EdgeGraph.from_config(cfg)


# ---------------------------------------------------------------------------------------------
# Prompts and metrics


def pad_pair(
    clean: Sequence[Sequence[int]] | Tensor, corrupted: Sequence[Sequence[int]] | Tensor, pad: int = 0
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Right-pad clean and corrupted token lists to one width (causal attention ignores the tail)."""
    rows = [list(map(int, row)) for row in list(clean) + list(corrupted)]
    if len(clean) != len(corrupted):
        raise ValueError(f"{len(clean)} clean prompts but {len(corrupted)} corrupted: pair them one to one.")
    width = max(len(row) for row in rows)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens[: len(clean)], tokens[len(clean) :]


@dataclass
class AnswerMetric:
    """A metric read at one position per prompt (None: the last): logit(correct) - logit(incorrect)
    ("logit_diff") or p(correct) ("prob"); several answers per prompt ([batch, n]) are averaged.
    Knowing the position lets the edge-level forward pass unembed that position only."""

    kind: Literal["logit_diff", "prob"]
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"]
    incorrect: Int[Tensor, " batch"] | Int[Tensor, "batch n"] | None = None
    pos: Int[Tensor, " batch"] | None = None

    def __call__(self, logits: Float[Tensor, "batch pos d_vocab"], ids: Int[Tensor, " batch"]) -> Tensor:
        end = logits_at(logits, None if self.pos is None else self.pos[ids]).float()
        if self.kind == "prob":
            return _token_values(end.softmax(-1), self.correct[ids])
        return _token_values(end, self.correct[ids]) - _token_values(end, self.incorrect[ids])

    def positions(self, ids: Tensor, n_pos: int) -> Int[Tensor, " batch"]:
        return torch.full_like(ids, n_pos - 1) if self.pos is None else self.pos[ids]


def logit_diff_metric(
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"],
    incorrect: Int[Tensor, " batch"] | Int[Tensor, "batch n"],
    pos: Int[Tensor, " batch"] | None = None,
) -> AnswerMetric:
    """logit(correct) - logit(incorrect) at each prompt's position (None: the last)."""
    return AnswerMetric("logit_diff", correct, incorrect, pos)


def prob_metric(
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"], pos: Int[Tensor, " batch"] | None = None
) -> AnswerMetric:
    """p(correct) at each prompt's position (several answers: the mean probability)."""
    return AnswerMetric("prob", correct, None, pos)


def _check_pair(model: HookedTransformer, clean: Tensor, corrupted: Tensor) -> tuple[Tensor, Tensor]:
    clean, corrupted = model._as_tokens(clean, None), model._as_tokens(corrupted, None)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} tokens differ in shape: "
            "pair each clean prompt with one corrupted prompt and right-pad both to one width "
            "(interp.edges.pad_pair)."
        )
    return clean, corrupted


# ---------------------------------------------------------------------------------------------
# The edge-level forward pass


@contextmanager
def _head_results(model: HookedTransformer) -> Iterator[dict[int, Tensor]]:
    """Capture each layer's per-head outputs [batch, pos, head, d_model] while the block runs."""
    results: dict[int, Tensor] = {}

    def save(tensor: Tensor, hook) -> None:
        results[int(hook.name.split(".")[1])] = tensor

    names = [f"blocks.{layer}.attn.hook_result" for layer in range(model.cfg.n_layers)]
    with model.settings(use_attn_result=True), model.hooks(fwd_hooks=[(name, save) for name in names]):
        yield results


def _embed(model: HookedTransformer, tokens: Tensor) -> Float[Tensor, "batch pos d_model"]:
    return model._embed(tokens, None)


@dataclass
class _Intervention:
    """What an edge-level forward changes.

    keep [K, W, R] (1 = kept) with ablated writer outputs [W, batch or 1, pos, d_model]: K circuits
    run at once on the prompts repeated K times. `overrides` replaces whole writers' outputs (index ->
    [batch, pos, d_model] or, for a layer's heads, [batch, pos, head, d_model]).
    """

    keep: Float[Tensor, "K writer reader"] | None = None
    ablated: Float[Tensor, "writer batch pos d_model"] | None = None
    overrides: dict[int, Tensor] = field(default_factory=dict)


def _correct(coef: Tensor, diffs: Tensor, resid: Tensor, n_k: int) -> Float[Tensor, "KB pos reader d_model"]:
    """resid[:, :, None] + sum_w coef[k, w, r] * diffs[w, k, ...] over the writers that have one.

    coef [K, nw, R]; diffs [W, K, batch, pos, d_model]; resid [K*batch, pos, d_model]."""
    active = coef.ne(0).any(dim=(0, 2)).nonzero()[:, 0]
    n_readers = coef.shape[-1]
    base = resid[:, :, None, :]
    if active.numel() == 0:
        return base.expand(-1, -1, n_readers, -1)
    d = diffs[active]  # [a, K, B, P, d]
    a, _, b, p, dm = d.shape
    c = coef[:, active, :]  # [K, a, R]
    # [K, R, a] @ [K, a, B*P*d] -> [K, R, B*P*d]
    out = torch.bmm(c.transpose(1, 2), d.transpose(0, 1).reshape(n_k, a, b * p * dm))
    out = out.view(n_k, n_readers, b, p, dm).permute(0, 2, 3, 1, 4).reshape(n_k * b, p, n_readers, dm)
    return base + out


def _edge_forward(
    model: HookedTransformer,
    graph: EdgeGraph,
    tokens: Int[Tensor, "batch pos"],
    intervention: _Intervention | None = None,
    input_embed: Tensor | None = None,
    reader_inputs: list[Tensor] | None = None,
    logit_pos: Int[Tensor, " KB"] | None = None,
) -> Float[Tensor, "KB pos d_vocab"]:
    """Run the model reader by reader (see the module docstring).

    With `logit_pos` only those positions (one per row) are unembedded; the other logits are zero.

    Without `keep`, every reader's input is the residual stream; with it, readers take the kept
    edges' current writer outputs and the other edges' ablated outputs. When `reader_inputs` is a
    list, each layer's reader inputs are appended to it (queries [B, P, H, d], keys and values
    [B, P, KV, d], MLP and logits [B, P, d]) with gradients retained.
    """
    cfg = model.cfg
    iv = intervention or _Intervention()
    keep = iv.keep
    n_k = 1 if keep is None else keep.shape[0]
    drop = None if keep is None else 1.0 - keep
    track = reader_inputs is not None

    x_input = _embed(model, tokens) if input_embed is None else input_embed
    x_input = iv.overrides.get(0, x_input)
    batch, n_pos, d_model = x_input.shape
    if n_k > 1:
        x_input = x_input.repeat(n_k, 1, 1)

    diffs = None
    resid_ablated = None
    if keep is not None:
        ablated = iv.ablated  # [W, B|1, P, d]
        diffs = torch.empty(
            graph.n_writers, n_k, batch, n_pos, d_model, dtype=x_input.dtype, device=x_input.device
        )
        diffs[0] = x_input.view(n_k, batch, n_pos, d_model) - ablated[0]
        resid_ablated = ablated[0]  # [B|1, pos, d]: the residual stream of the ablated writers

    def reader_input(resid: Tensor, resid_abl: Tensor | None, readers: slice | int) -> Tensor:
        """Inputs [KB, pos, R, d] of readers (a slice) given the current residual stream and the one
        of the ablated writers ([B|1, pos, d])."""
        index = range(readers.start, readers.stop) if isinstance(readers, slice) else [readers]
        nw = graph.n_upstream[index[0]]
        if keep is None:
            out = resid[:, :, None, :].expand(-1, -1, len(index), -1)
        else:
            cols = list(index)
            k_coef, d_coef = keep[:, :nw, cols], drop[:, :nw, cols]
            if k_coef.count_nonzero() <= d_coef.count_nonzero():  # fewer kept edges: start from ablated
                out = _correct(k_coef, diffs, resid_abl.expand(batch, -1, -1).repeat(n_k, 1, 1), n_k)
            else:
                out = _correct(-d_coef, diffs, resid, n_k)
        if track:
            reader_inputs.append(out)
        return out

    resid = x_input
    with _head_results(model) as results:
        for layer in range(cfg.n_layers):
            block = model.blocks[layer]
            q, k, v, mlp = graph.layer_readers(layer)
            q_in, k_in, v_in = (reader_input(resid, resid_ablated, readers) for readers in (q, k, v))
            attn_out = block.attn(block.ln1(q_in), block.ln1(k_in), block.ln1(v_in))  # includes b_O
            head_out = results.pop(layer)  # [KB, pos, head, d]
            heads = graph.head_writers(layer)
            if heads.start in iv.overrides:
                head_out = iv.overrides[heads.start].repeat(n_k, 1, 1, 1)
                attn_out = head_out.sum(2) + (0 if block.attn.b_O is None else block.attn.b_O)
            resid_pre, resid_ablated_pre = resid, resid_ablated
            resid = resid + attn_out
            if keep is not None:
                diffs[heads] = (
                    head_out.view(n_k, batch, n_pos, cfg.n_heads, d_model).permute(3, 0, 1, 2, 4)
                    - iv.ablated[heads][:, None]
                )
                bias = 0 if block.attn.b_O is None else block.attn.b_O
                resid_ablated = resid_ablated + iv.ablated[heads].sum(0) + bias
            if mlp is None:
                continue
            if cfg.parallel_residual:
                mlp_in = reader_input(resid_pre, resid_ablated_pre, mlp)[:, :, 0]
            else:
                mlp_in = reader_input(resid, resid_ablated, mlp)[:, :, 0]
            mlp_out = block.mlp(block.ln2(mlp_in))
            writer = heads.stop
            if writer in iv.overrides:
                mlp_out = iv.overrides[writer].repeat(n_k, 1, 1)
            resid = resid + mlp_out
            if keep is not None:
                diffs[writer] = mlp_out.view(n_k, batch, n_pos, d_model) - iv.ablated[writer]
                resid_ablated = resid_ablated + iv.ablated[writer]
        final = reader_input(resid, resid_ablated, graph.n_readers - 1)[:, :, 0]
    return _unembed(model, final, logit_pos)


def _unembed(
    model: HookedTransformer, final: Float[Tensor, "rows pos d_model"], logit_pos: Int[Tensor, " rows"] | None
) -> Float[Tensor, "rows pos d_vocab"]:
    """Logits of the final residual stream; with `logit_pos` only there (one position per row, zero
    elsewhere), differentiably."""
    if logit_pos is None:
        return model.unembed(model.ln_final(final))
    rows = torch.arange(final.shape[0], device=final.device)
    read = model.unembed(model.ln_final(final[rows, logit_pos][:, None]))[:, 0]  # [rows, d_vocab]
    logits = torch.zeros(*final.shape[:2], read.shape[-1], dtype=read.dtype, device=read.device)
    return logits.index_put((rows, logit_pos), read)


def _logit_pos(metric: PromptMetric, ids: Tensor, n_pos: int, n_k: int = 1) -> Tensor | None:
    """The one position per row that `metric` reads, when it says so (an AnswerMetric), else None."""
    if not isinstance(metric, AnswerMetric):
        return None
    return metric.positions(ids, n_pos).repeat(n_k)


@torch.no_grad()
def writer_outputs(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, "writer batch pos d_model"]:
    """Every writer's output on `tokens`: the input embedding, each head's result, each MLP's output."""
    graph = edge_graph(model)
    outputs = []
    with _head_results(model) as results:

        def collect_mlp(tensor: Tensor, hook) -> None:
            outputs.append(("m", int(hook.name.split(".")[1]), tensor))

        hooks = [(f"blocks.{layer}.hook_mlp_out", collect_mlp) for layer in range(model.cfg.n_layers)]
        hooks = hooks if graph.has_mlp else []
        with model.hooks(fwd_hooks=hooks):
            model(tokens, return_type=None)
        embed = _embed(model, tokens)
        stack = [embed]
        mlps = {layer: t for _, layer, t in outputs}
        for layer in range(model.cfg.n_layers):
            stack += list(results[layer].unbind(2))
            if graph.has_mlp:
                stack.append(mlps[layer])
    return torch.stack(stack)


def ablated_outputs(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    ablation: Ablation = "counterfactual",
    reference: Int[Tensor, "n pos"] | None = None,
) -> Float[Tensor, "writer batch_or_1 pos d_model"]:
    """What ablated edges carry: the writers' outputs on the corrupted prompts (counterfactual), their
    mean over `reference` prompts (default: the corrupted ones) at each position (mean), or zero."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation={ablation!r} is not one of {ABLATIONS}.")
    if ablation == "counterfactual":
        return writer_outputs(model, corrupted)
    n_writers = edge_graph(model).n_writers
    if ablation == "zero":
        return torch.zeros(
            n_writers, 1, clean.shape[1], model.cfg.d_model, dtype=model.dtype, device=model.device
        )
    reference = corrupted if reference is None else model._as_tokens(reference, None)
    if reference.shape[1] < clean.shape[1]:
        raise ValueError(
            f"mean ablation needs reference prompts at least as long as the clean ones ({clean.shape[1]} "
            f"tokens); got {reference.shape[1]}."
        )
    return writer_outputs(model, reference[:, : clean.shape[1]]).mean(1, keepdim=True)


# ---------------------------------------------------------------------------------------------
# Edge scores


@dataclass
class EdgeScores:
    """Per-edge scores [writer, reader] (0 where no edge), estimating m(edge ablated) - m(clean)."""

    graph: EdgeGraph
    scores: Float[Tensor, "writer reader"]
    method: str
    ablation: str
    steps: int
    n_prompts: int

    def top(self, n: int = 10) -> list[tuple[str, float]]:
        """The n edges with the largest |score|, strongest first."""
        flat = self.scores.masked_fill(~self.graph.valid, 0).abs().flatten()
        order = flat.argsort(descending=True)[:n]
        n_readers = self.graph.n_readers
        return [
            (self.graph.edge_name(i // n_readers, i % n_readers), float(self.scores.flatten()[i]))
            for i in order.tolist()
        ]

    def edge_values(self) -> Float[Tensor, " edge"]:
        return self.scores[self.graph.valid]


def _chunks(n: int, size: int) -> list[Tensor]:
    return [torch.arange(start, min(start + size, n)) for start in range(0, n, size)]


def _score_from_grads(
    graph: EdgeGraph, delta: Tensor, grads: list[Tensor], scores: Tensor, writers: slice | None = None
) -> None:
    """scores[w, r] += sum over batch, pos, d of delta[w] * grad[r], for every reader (in graph order)
    and the writers in `writers` (default all).

    delta [W, B, P, d] (or [W, 1, P, d], broadcast); grads as `_edge_forward` collects them."""
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
    metric: PromptMetric,
    method: Method = "eap-ig",
    steps: int = 5,
    ablation: Ablation = "counterfactual",
    reference: Int[Tensor, "n pos"] | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
    reader_pos: Int[Tensor, " batch"] | None = None,
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
        clean, corrupted = _check_pair(model, clean, corrupted)
        return _exact_scores(
            model, edge_graph(model), clean, corrupted, metric, ablation, reference, batch_size, progress
        )
    positions = {"": reader_pos}
    return edge_attribution_by_position(
        model, clean, corrupted, metric, positions, method, steps, ablation, reference, batch_size, progress
    )[""]


def edge_attribution_by_position(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: PromptMetric,
    reader_positions: dict[str, Int[Tensor, " batch"] | None],
    method: Literal["eap", "eap-ig", "eap-ig-activations"] = "eap",
    steps: int = 5,
    ablation: Ablation = "counterfactual",
    reference: Int[Tensor, "n pos"] | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> dict[str, EdgeScores]:
    """Gradient edge scores for several reader positions from one set of gradients: name ->
    EdgeScores of what readers read at those positions ([batch], one per prompt; None: all)."""
    _check_method(method, steps)
    if method == "exact":
        raise ValueError("scores by reader position come from the gradient methods (eap, eap-ig).")
    clean, corrupted = _check_pair(model, clean, corrupted)
    graph = edge_graph(model)
    steps = 1 if method == "eap" else steps
    scores = {name: torch.zeros(graph.n_writers, graph.n_readers) for name in reader_positions}
    ablated_all = ablated_outputs(model, clean, corrupted, ablation, reference)
    chunks = _chunks(clean.shape[0], batch_size)
    groups = _writer_groups(graph) if method == "eap-ig-activations" else [None]
    total, done = len(chunks) * len(groups) * steps, 0
    for ids in chunks:
        tokens = clean[ids]
        ablated = ablated_all if ablated_all.shape[1] == 1 else ablated_all[:, ids]
        with torch.no_grad():
            clean_out = writer_outputs(model, tokens)
        delta = (ablated - clean_out).float()  # [W, B|1, P, d]
        for group in groups:
            grads_sum = None
            for step in range(1, steps + 1):
                alpha = step / steps
                if group is None:  # integrated gradients over the input embedding
                    embed = ablated[0] + alpha * (clean_out[0] - ablated[0])
                    grads = _reader_grads(model, graph, tokens, metric, ids, None, embed)
                else:  # over one group of writers' outputs
                    base = ablated[group].expand_as(clean_out[group])
                    mixed = base + alpha * (clean_out[group] - base)
                    mixed = mixed[0] if group.stop - group.start == 1 else mixed.permute(1, 2, 0, 3)
                    grads = _reader_grads(
                        model, graph, tokens, metric, ids, _Intervention(overrides={group.start: mixed})
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
    metric: PromptMetric,
    ids: Tensor,
    intervention: _Intervention | None,
    input_embed: Tensor | None = None,
) -> list[Tensor]:
    """d(sum of the metric over prompts) / d(every reader's input), as `_edge_forward` lists them."""
    if intervention is None:
        return _reader_grads_by_norm_vjp(model, tokens, metric, ids, input_embed)
    inputs: list[Tensor] = []
    with torch.enable_grad():
        embed = _embed(model, tokens) if input_embed is None else input_embed
        embed = embed.detach().requires_grad_(True)
        if intervention is not None:  # overridden outputs are constants: make readers depend on them
            overrides = {i: t.detach().requires_grad_(True) for i, t in intervention.overrides.items()}
            intervention = _Intervention(intervention.keep, intervention.ablated, overrides)
        logit_pos = _logit_pos(metric, ids, tokens.shape[1])
        logits = _edge_forward(model, graph, tokens, intervention, embed, inputs, logit_pos)
        values = metric(logits, ids)
        grads = torch.autograd.grad(values.sum(), inputs, allow_unused=True)
    out = []
    for x, g in zip(inputs, grads, strict=True):
        g = torch.zeros_like(x) if g is None else g
        out.append(g.float() if g.ndim == 4 else g.float()[:, :, None])
    return out


def _reader_grads_by_norm_vjp(
    model: HookedTransformer, tokens: Tensor, metric: PromptMetric, ids: Tensor, input_embed: Tensor | None
) -> list[Tensor]:
    """`_reader_grads` without an intervention, from one ordinary forward and backward pass.

    Every reader of a layer reads the same residual stream x, so a reader's gradient is the
    vector-Jacobian product of its own path through the block's input norm: query head h gets
    VJP_norm(x, dm/dq_h W_Q[h]^T), a key/value head VJP_norm(x, dm/dk_g W_K[g]^T), the MLP
    VJP_norm(x, dm/d(normalised MLP input)), the logits dm/d(final residual stream). The norm's VJP
    is closed-form (`_norm_vjp`), which is cheap next to running the whole model on one copy of the
    residual stream per reader (what `_edge_forward` does with interventions)."""
    cfg = model.cfg
    kept: dict[str, Tensor] = {}

    def keep(tensor: Tensor, hook) -> None:
        if tensor.requires_grad:
            tensor.retain_grad()
        kept[hook.name] = tensor

    names = [act_name(kind, layer) for layer in range(cfg.n_layers) for kind in ("resid_pre", "q", "k", "v")]
    if not cfg.attn_only:
        names += [f"blocks.{layer}.ln2.hook_normalized" for layer in range(cfg.n_layers)]
        names += [act_name("resid_mid", layer) for layer in range(cfg.n_layers) if not cfg.parallel_residual]
    final = act_name("resid_post", cfg.n_layers - 1)
    with torch.enable_grad():
        embed = _embed(model, tokens) if input_embed is None else input_embed
        embed = embed.detach().requires_grad_(True)
        with model.hooks(fwd_hooks=[(name, keep) for name in names + [final]]):
            resid = model(embed, start_at_layer=0, stop_at_layer=cfg.n_layers)
        logits = _unembed(model, resid, _logit_pos(metric, ids, tokens.shape[1]))
        metric(logits, ids).sum().backward()

    def grad(name: str) -> Tensor:
        tensor = kept[name]
        return torch.zeros_like(tensor) if tensor.grad is None else tensor.grad

    with torch.no_grad():  # views of the result are summed in place over integration steps
        out = []
        for layer in range(cfg.n_layers):
            block = model.blocks[layer]
            attn = block.attn
            x = kept[act_name("resid_pre", layer)]
            g_q, g_k, g_v = (grad(act_name(kind, layer)) for kind in "qkv")
            # Weights read in where accelerate offloaded the block (device_map).
            W_Q, W_K, W_V = (module_weight(attn, name, g_q.device) for name in ("W_Q", "_W_K", "_W_V"))
            q = torch.einsum("bphe,hde->bphd", g_q, W_Q)
            k = torch.einsum("bpge,gde->bpgd", g_k, W_K)
            v = torch.einsum("bpge,gde->bpgd", g_v, W_V)
            out += list(
                _norm_vjp(block.ln1, x, torch.cat([q, k, v], dim=2)).split(
                    [q.shape[2], k.shape[2], v.shape[2]], 2
                )
            )
            if not cfg.attn_only:
                mlp_x = x if cfg.parallel_residual else kept[act_name("resid_mid", layer)]
                normalized = grad(f"blocks.{layer}.ln2.hook_normalized")[:, :, None]
                out.append(_norm_vjp(block.ln2, mlp_x, normalized))
        out.append(grad(final).float()[:, :, None])
    return out


def _norm_vjp(
    norm: torch.nn.Module, x: Tensor, cotangent: Tensor
) -> Float[Tensor, "batch pos reader d_model"]:
    """Vector-Jacobian products of a block's input norm at x [B, P, d] for cotangents [B, P, R, d]
    (one per reader), in closed form: for y = w * c / s + b with c = x (- mean x for LayerNorm) and
    s = sqrt(mean(c^2) + eps), dy^T g = P(w g / s - c <w g, c> / (d s^3)), P centring for LayerNorm."""
    g = cotangent.float()
    if not isinstance(norm, Norm):  # no input norm (the block reads the residual stream itself)
        return g
    c = x.detach().float()[:, :, None, :]  # [B, P, 1, d]
    if norm.center:
        c = c - c.mean(-1, keepdim=True)
    scale = (c.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()  # [B, P, 1, 1]
    if norm.w is not None:
        g = g * module_weight(norm, "w", g.device).float()  # read in if offloaded
    out = g / scale - c * ((g * c).sum(-1, keepdim=True) / (c.shape[-1] * scale.pow(3)))
    return out - out.mean(-1, keepdim=True) if norm.center else out


def _exact_scores(
    model: HookedTransformer,
    graph: EdgeGraph,
    clean: Tensor,
    corrupted: Tensor,
    metric: PromptMetric,
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
        base = metric(model(clean), ids).float()
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


@torch.no_grad()
def run_circuits(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    keep: Float[Tensor, "K writer reader"],
    ablated: Float[Tensor, "writer batch_or_1 pos d_model"],
    metric: PromptMetric,
    batch_size: int | None = None,
) -> Float[Tensor, "K batch"]:
    """The metric of each prompt with only the `keep` edges of each of K circuits (others ablated)."""
    graph = edge_graph(model)
    keep = keep.to(device=model.device, dtype=model.dtype)
    if keep.ndim == 2:
        keep = keep[None]
    keep = keep * graph.valid.to(keep.device) + (~graph.valid.to(keep.device)).to(keep.dtype)
    n_k, n = keep.shape[0], tokens.shape[0]
    out = torch.empty(n_k, n)
    for ids in _chunks(n, batch_size or n):
        abl = ablated if ablated.shape[1] == 1 else ablated[:, ids]
        logit_pos = _logit_pos(metric, ids, tokens.shape[1], n_k)
        logits = _edge_forward(
            model, graph, tokens[ids], _Intervention(keep=keep, ablated=abl), None, None, logit_pos
        )
        rep_ids = ids.repeat(n_k)
        out[:, ids] = metric(logits, rep_ids).float().view(n_k, len(ids)).cpu()
    return out


# ---------------------------------------------------------------------------------------------
# Circuits


def prune(graph: EdgeGraph, keep: Bool[Tensor, "writer reader"]) -> Bool[Tensor, "writer reader"]:
    """Only the edges on a path from the input to the logits: a writer other than the input needs a
    kept edge into one of its readers, and a reader other than the logits needs a kept edge out of its
    component."""
    keep = keep & graph.valid
    reader_of_writer = _writer_reader_map(graph)  # [W, R]: reader r belongs to writer w's component
    while True:
        has_in = (keep.any(0).float() @ reader_of_writer.T.float()) > 0  # [W]
        has_in[0] = True
        has_out = keep.any(1)  # [W]
        alive = has_in & has_out
        reader_alive = (alive.float() @ reader_of_writer.float()) > 0
        reader_alive[-1] = True
        new = keep & alive[:, None] & reader_alive[None, :]
        if torch.equal(new, keep):
            return keep
        keep = new


def _writer_reader_map(graph: EdgeGraph) -> Bool[Tensor, "writer reader"]:
    """[w, r] = reader r is an input of writer w's component (q/k/v of a head, its key/value group)."""
    out = torch.zeros(graph.n_writers, graph.n_readers, dtype=torch.bool)
    group = graph.n_heads // graph.n_kv_heads
    for layer in range(graph.n_layers):
        q, k, v, mlp = graph.layer_readers(layer)
        heads = graph.head_writers(layer)
        for h in range(graph.n_heads):
            w = heads.start + h
            out[w, q.start + h] = True
            out[w, k.start + h // group] = True
            out[w, v.start + h // group] = True
        if mlp is not None:
            out[heads.stop, mlp] = True
    return out


def top_circuit(scores: EdgeScores, n_edges: int, connected: bool = True) -> Bool[Tensor, "writer reader"]:
    """The n edges with the largest |score| (MIB's top-n), then only those connected input -> logits."""
    graph = scores.graph
    if not 0 <= n_edges <= graph.n_edges:
        raise ValueError(f"n_edges must lie in [0, {graph.n_edges}], got {n_edges}.")
    flat = scores.scores.abs().masked_fill(~graph.valid, -1.0).flatten()
    keep = torch.zeros(flat.numel(), dtype=torch.bool)
    keep[flat.argsort(descending=True, stable=True)[:n_edges]] = True
    keep = keep.view_as(scores.scores) & graph.valid
    return prune(graph, keep) if connected else keep


def node_circuit(graph: EdgeGraph, keep: Bool[Tensor, "writer reader"]) -> list[str]:
    """The components the edges touch (writers with a kept outgoing edge, plus the logits)."""
    keep = keep & graph.valid
    nodes = [graph.writers[w] for w in keep.any(1).nonzero()[:, 0].tolist()]
    return nodes + (["logits"] if keep[:, -1].any() else [])


@dataclass
class Faithfulness:
    """m(circuit) relative to the model and the empty circuit, with a bootstrap CI over prompts.

    values [K, batch]: each circuit's metric per prompt; full, empty [batch]."""

    values: Float[Tensor, "K batch"]
    full: Float[Tensor, " batch"]
    empty: Float[Tensor, " batch"]

    @property
    def faithfulness(self) -> Float[Tensor, " K"]:
        """(m(C) - m(empty)) / (m(model) - m(empty)), means over prompts."""
        return (self.values.mean(1) - self.empty.mean()) / (self.full.mean() - self.empty.mean())

    def ci(self, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[Tensor, Tensor]:
        """Percentile bootstrap CI of the faithfulness (prompts resampled, ratio recomputed)."""
        generator = torch.Generator().manual_seed(seed)
        n = self.full.shape[0]
        idx = torch.randint(n, (n_boot, n), generator=generator)
        empty, full = self.empty[idx].mean(1), self.full[idx].mean(1)  # [n_boot]
        values = self.values[:, idx].mean(-1)  # [K, n_boot]
        ratio = (values - empty) / (full - empty)
        alpha = (1 - level) / 2
        return ratio.quantile(alpha, dim=1), ratio.quantile(1 - alpha, dim=1)


def faithfulness(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: PromptMetric,
    circuits: Bool[Tensor, "K writer reader"] | Bool[Tensor, "writer reader"],
    ablation: Ablation = "counterfactual",
    reference: Int[Tensor, "n pos"] | None = None,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> Faithfulness:
    """Faithfulness of circuits: each run keeps its circuit's edges and ablates every other edge."""
    clean, corrupted = _check_pair(model, clean, corrupted)
    circuits = circuits[None] if circuits.ndim == 2 else circuits
    graph = edge_graph(model)
    ablated = ablated_outputs(model, clean, corrupted, ablation, reference)
    ids = torch.arange(clean.shape[0])
    with torch.no_grad():
        full = torch.cat([metric(model(clean[c]), c).float().cpu() for c in _chunks(len(ids), batch_size)])
    empty_keep = torch.zeros(1, graph.n_writers, graph.n_readers)
    empty = run_circuits(model, clean, empty_keep, ablated, metric, batch_size)[0]
    values = []
    for k in range(circuits.shape[0]):
        values.append(run_circuits(model, clean, circuits[k : k + 1].float(), ablated, metric, batch_size)[0])
        if progress:
            progress(k + 1, circuits.shape[0])
    return Faithfulness(torch.stack(values), full, empty)


@dataclass
class FaithfulnessCurve:
    """Faithfulness of the top circuits at several sizes, and MIB's summaries.

    CPR: area under faithfulness against the fraction of edges (trapezoid rule, higher is better);
    CMD: area between the curve and 1, |1 - f| (lower is better), as MIB's circuit track computes them.
    """

    fractions: tuple[float, ...]
    n_edges: list[int]  # edges kept after pruning
    result: Faithfulness
    random: Faithfulness | None = None
    random_n_edges: list[int] | None = None

    @property
    def faithfulness(self) -> Tensor:
        return self.result.faithfulness

    @property
    def cpr(self) -> float:
        return area_under(self.fractions, self.faithfulness.tolist())

    @property
    def cmd(self) -> float:
        return area_under(self.fractions, [abs(1 - f) for f in self.faithfulness.tolist()])

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


def random_scores(graph: EdgeGraph, seed: int = 0) -> EdgeScores:
    """Uniform random edge scores: the random-circuit baseline."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(graph.n_writers, graph.n_readers, generator=generator).masked_fill(~graph.valid, 0)
    return EdgeScores(graph, scores, "random", "-", 0, 0)


def faithfulness_curve(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: PromptMetric,
    scores: EdgeScores,
    fractions: Sequence[float] = MIB_FRACTIONS,
    ablation: Ablation = "counterfactual",
    reference: Int[Tensor, "n pos"] | None = None,
    random_baseline: bool = True,
    seed: int = 0,
    batch_size: int = 16,
    progress: Progress | None = None,
) -> FaithfulnessCurve:
    """Faithfulness of the top-|score| circuit at each fraction of edges, and of random circuits."""
    graph = scores.graph
    fractions = tuple(float(f) for f in fractions)
    if any(not 0 < f <= 1 for f in fractions) or list(fractions) != sorted(fractions):
        raise ValueError(f"fractions must increase within (0, 1], got {fractions}.")

    def circuits_of(s: EdgeScores) -> Tensor:
        return torch.stack([top_circuit(s, int(f * graph.n_edges)) for f in fractions])

    tops = circuits_of(scores)
    sets = [tops]
    rand = None
    if random_baseline:
        rand = circuits_of(random_scores(graph, seed))
        sets.append(rand)
    total = sum(len(s) for s in sets)

    def sub_progress(offset: int) -> Progress | None:
        return None if progress is None else (lambda done, _: progress(offset + done, total))

    result = faithfulness(
        model, clean, corrupted, metric, tops, ablation, reference, batch_size, sub_progress(0)
    )
    random_result = None
    if rand is not None:
        random_result = faithfulness(
            model, clean, corrupted, metric, rand, ablation, reference, batch_size, sub_progress(len(tops))
        )
    return FaithfulnessCurve(
        fractions,
        [int(c.sum()) for c in tops],
        result,
        random_result,
        None if rand is None else [int(c.sum()) for c in rand],
    )


def auroc(scores: Float[Tensor, " n"], positive: Bool[Tensor, " n"]) -> float:
    """Area under the ROC curve of ranking `positive` items first by `scores` (ties count half)."""
    pos, neg = scores[positive], scores[~positive]
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError("AUROC needs at least one positive and one negative item.")
    greater = (pos[:, None] > neg[None, :]).float().mean()
    ties = (pos[:, None] == neg[None, :]).float().mean()
    return float(greater + 0.5 * ties)


def mib_json(scores: EdgeScores, keep: Bool[Tensor, "writer reader"], cfg: Config) -> dict:
    """The circuit in MIB's submission format: {"cfg", "nodes": {name: {in_graph}}, "edges":
    {"a0.h1->a2.h3<q>": {score, in_graph}}}. Under grouped-query attention MIB names key and value
    edges per query head: each key/value-head edge is written once per query head of its group."""
    graph = scores.graph
    group = graph.n_heads // graph.n_kv_heads
    alive = set(node_circuit(graph, keep))
    nodes = {name: {"in_graph": name in alive} for name in graph.writers}
    nodes["logits"] = {"in_graph": True}
    edges = {}
    for w, r in graph.edges():
        score, kept = float(scores.scores[w, r]), bool(keep[w, r])
        name = graph.readers[r]
        if group > 1 and (name.endswith("<k>") or name.endswith("<v>")):
            layer, kv = name.split(".")[0], int(name.split(".kv")[1].split("<")[0])
            for h in range(kv * group, (kv + 1) * group):
                edges[f"{graph.writers[w]}->{layer}.h{h}{name[-3:]}"] = {"score": score, "in_graph": kept}
        else:
            edges[f"{graph.writers[w]}->{name}"] = {"score": score, "in_graph": kept}
    mib_cfg = {"n_layers": cfg.n_layers, "n_heads": cfg.n_heads, "parallel_attn_mlp": cfg.parallel_residual,
               "d_model": cfg.d_model}  # fmt: skip
    return {"cfg": mib_cfg, "nodes": nodes, "edges": edges}


def fraction_to_edges(graph: EdgeGraph, fraction: float) -> int:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}.")
    return max(1, math.floor(fraction * graph.n_edges))
