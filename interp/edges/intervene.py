"""Edge-level runs: the model's own forward pass, with each reader's input rebuilt from its edges.

An edge's ablation replaces the writer's contribution to that reader's input only:

  reader_input = the input the model gives the reader's hook point
                 - sum over ablated edges (writer -> reader) of (writer - writer_ablated)

where "writer" is the writer's output in the current (intervened) run and `writer_ablated` what the
ablation (`interp.Ablation`) puts there: its output on the corrupted prompt (counterfactual,
the default), its mean over reference prompts at each position (mean), its output on a random
reference prompt (resample) or zero. Biases that belong to no writer (attention's b_O) stay, and so
do a shortformer model's positions (added to every block's query and key inputs, written by no writer).

The run is the model's forward pass with hooks, as EAP-IG's reference code does it: writers are read
at `blocks.0.hook_resid_pre` (the input), `attn.hook_result` (heads) and `hook_mlp_out` (MLPs);
readers' inputs are replaced at `hook_q_input`, `hook_k_input`, `hook_v_input`, `hook_mlp_in` and the
last block's `hook_resid_post` (the logits' input). Every hook a user has put on the model fires as
in an ordinary run, and is seen by the edge-level run (added before the run, so it fires first).
K circuits run at once on the prompts repeated K times. A float `keep` that requires grad makes the
run differentiable in the mask (edge pruning, `interp.edges.pruning`): each reader's input is then
incoming - sum over writers of (writer - writer_ablated) + sum over writers of keep (writer -
writer_ablated), the last sum over the writers with a kept edge only, every writer's difference held
once for the mask's gradient.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.checks import RESAMPLE_MASK_ERROR, check_padding_mask, check_token_pair
from interp.edges.graph import EdgeGraph, edge_graph
from interp.interventions.ablation import Ablation, check_means_defined, resample_draws, shifted
from interp.interventions.engine import check_pair
from interp.interventions.metrics import AnswerMetric, check_reads_real_tokens, for_rows, takes_rows
from interp.interventions.stats import masked_mean
from interp.model.cache import ActivationCache
from interp.model.tokens import first_real, index_tokens, record_padding, recorded_padding
from interp.model.transformer import HookedTransformer
from interp.types import AblationKind, Metric


def pad_pair(
    clean: Sequence[Sequence[int]] | Tensor, corrupted: Sequence[Sequence[int]] | Tensor, pad: int = 0
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Right-pad clean and corrupted token lists to one width (causal attention ignores the tail;
    bidirectional attention reads it, so give a bidirectional model prompts of one length)."""
    rows = [list(map(int, row)) for row in list(clean) + list(corrupted)]
    if len(clean) != len(corrupted):
        raise ValueError(f"{len(clean)} clean prompts but {len(corrupted)} corrupted: pair them one to one.")
    width = max(len(row) for row in rows)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens[: len(clean)], tokens[len(clean) :]


@dataclass
class EdgeRun:
    """What an edge-level run changes.

    keep [K, W, R] (1 = kept) with ablated writer outputs [W, batch or 1, pos, d_model]: K circuits
    run at once on the prompts repeated K times. `overrides` replaces whole writers' outputs (index ->
    [batch, pos, d_model] or, for a layer's heads, [batch, pos, head, d_model]).
    """

    keep: Float[Tensor, "K writer reader"] | None = None
    ablated: Float[Tensor, "writer batch pos d_model"] | None = None
    overrides: dict[int, Tensor] = field(default_factory=dict)


def _correction(coef: Tensor, diffs: Tensor, n_k: int) -> Float[Tensor, "KB pos reader d_model"] | None:
    """sum_w coef[k, w, r] * diffs[k, w, ...] over the writers that have a coefficient (None: none has).

    coef [K, nw, R] (the first nw writers); diffs [K, W, batch, pos, d_model]. Unless only a few of
    the nw writers have a coefficient, the product reads diffs in place (a view, zero coefficients
    included); else it gathers those few."""
    used = coef.ne(0).any(dim=(0, 2))
    n_used = int(used.sum())
    if n_used == 0:
        return None
    n_readers, n_writers = coef.shape[-1], coef.shape[1]
    d = diffs[:, :n_writers]  # [K, nw, B, P, d], a view
    if 4 * n_used < n_writers:  # a gather of a few costs less than reading all
        active = used.nonzero()[:, 0]
        d, coef = d.index_select(1, active), coef.index_select(1, active)
    _, a, b, p, dm = d.shape
    # [K, R, a] @ [K, a, B*P*d] -> [K, R, B*P*d]
    out = torch.bmm(coef.transpose(1, 2), d.reshape(n_k, a, b * p * dm))
    return out.view(n_k, n_readers, b, p, dm).permute(0, 2, 3, 1, 4).reshape(n_k * b, p, n_readers, dm)


DENSE_SHARE = 0.2  # _KeptSum multiplies every upstream row once this share of them has a kept edge


class _KeptSum(torch.autograd.Function):
    """sum over writers w of keep[w, r] * diff[w] for each reader r: [R, rows], from keep [nw, R] and the
    first nw rows of `buffer` [W, rows] (every writer's diff, flattened), reading only the writers with
    a kept edge where they are few (below DENSE_SHARE of nw; else all rows, a view: copying the kept
    rows out would cost more than the zero rows' products). The gradient reaches the kept writers' diffs
    through their group's tensor (`groups`, covering rows 0..nw in order; a group without a kept writer
    gets none), so it flows on into the model; the mask's gradient is every writer's, buffer @ grad.T.
    The backward pass reads the buffer's rows 0..nw, which no later writer changes."""

    @staticmethod
    def forward(ctx, keep: Tensor, buffer: Tensor, *groups: Tensor) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.buffer, ctx.shapes = buffer, [group.shape for group in groups]
        nw = keep.shape[0]
        kept = keep.ne(0).any(1)
        ctx.kept = kept
        if int(kept.sum()) >= DENSE_SHARE * nw:
            return keep.T @ buffer[:nw]
        rows = kept.nonzero()[:, 0]
        return keep[rows].T @ buffer[rows]

    @staticmethod
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        grad_keep = ctx.buffer[: keep.shape[0]] @ grad.T  # [nw, R]
        grads, start = [], 0
        for shape in ctx.shapes:
            stop = start + shape[0]
            grads.append((keep[start:stop] @ grad).view(shape) if ctx.kept[start:stop].any() else None)
            start = stop
        return grad_keep, None, *grads


class _EdgeRun:
    """The hooks of one edge-level run and what they share: each writer's difference from its
    ablated output (diffs [K, W, batch, pos, d]) and their running sum over the writers so far."""

    def __init__(self, graph: EdgeGraph, iv: EdgeRun, batch: int, n_pos: int, track: list[Tensor] | None):
        self.graph, self.iv, self.batch, self.track = graph, iv, batch, track
        self.n_k = 1 if iv.keep is None else iv.keep.shape[0]
        self.drop = None if iv.keep is None else 1.0 - iv.keep
        self.n_pos = n_pos
        self.diffs: Tensor | None = None
        self.total: Tensor | None = None  # sum of diffs over the writers so far, [K*batch, pos, d]
        # A mask that requires grad: each writer group's diffs [n, batch, pos, d] by first writer.
        self.differentiable = iv.keep is not None and iv.keep.requires_grad and torch.is_grad_enabled()
        self.groups: list[tuple[int, Tensor]] = []
        self.buffer: Tensor | None = None  # [W, batch * pos * d]: every writer's diff, filled in order
        self.added: dict[int, Tensor] = {}  # a reader group's [R, batch * pos * d], by its first reader
        if self.differentiable and self.n_k != 1:
            raise ValueError("a mask that requires grad runs one circuit at a time (keep [1, W, R])")
        self.total_before_layer: Tensor | None = None
        self.corrections: dict[int, tuple[Tensor | None, bool]] = {}  # a reader group's, by its first reader

    def _override(self, writer: int, value: Tensor) -> Tensor:
        if writer not in self.iv.overrides:
            return value
        override = self.iv.overrides[writer].to(value.dtype)
        return override.repeat(self.n_k, *([1] * (override.ndim - 1)))

    def _record(self, writers: slice, value: Tensor) -> None:
        """Store the differences of writers (value [K*B, pos, (n,) d]) from their ablated outputs."""
        if self.iv.keep is None:
            return
        n_k, batch = self.n_k, self.batch
        if self.diffs is None and not self.differentiable:
            self.diffs = torch.empty(
                n_k, self.graph.n_writers, batch, *value.shape[1:2], value.shape[-1],
                dtype=value.dtype, device=value.device,
            )  # fmt: skip
            self.total = torch.zeros_like(value[:, :, 0] if value.ndim == 4 else value)
        per_k = value.view(n_k, batch, *value.shape[1:])
        if per_k.ndim == 5:  # a layer's heads: [K, B, P, H, d] -> [K, H, B, P, d]
            diff = per_k.permute(0, 3, 1, 2, 4) - self.iv.ablated[writers]
        else:
            diff = (per_k - self.iv.ablated[writers.start])[:, None]
        if self.differentiable:  # the values in one buffer, the autograd graph through each group's diff
            diff = diff[0]  # [n, B, P, d]: one circuit
            if self.buffer is None:
                self.buffer = value.new_empty(self.graph.n_writers, batch * value.shape[1] * value.shape[-1])
            self.buffer[writers] = diff.detach().reshape(diff.shape[0], -1)
            self.groups.append((writers.start, diff))
            summed = diff.sum(0)
            self.total = summed if self.total is None else self.total + summed
            return
        self.diffs[:, writers] = diff
        self.total = self.total + diff.sum(1).view_as(self.total)  # not in place: snapshots keep theirs

    def correction(self, group: slice) -> tuple[Tensor | None, bool]:
        """What a group of readers (with the same upstream writers) add to their base input, [K*B, pos,
        R, d] or None, and whether that base is the ablated input (the kept edges added back) or the
        incoming one (the dropped edges taken away): whichever reads fewer writers' differences."""
        if group.start not in self.corrections:
            nw = self.graph.n_upstream[group.start]
            k_coef, d_coef = self.iv.keep[:, :nw, group], self.drop[:, :nw, group]
            kept_from, dropped_from = (coef.ne(0).any(dim=(0, 2)).sum() for coef in (k_coef, d_coef))
            from_ablated = bool(kept_from <= dropped_from)
            coef = k_coef if from_ablated else -d_coef
            self.corrections[group.start] = (_correction(coef, self.diffs, self.n_k), from_ablated)
        return self.corrections[group.start]

    def reader_input(
        self, incoming: Tensor, readers: slice, total: Tensor | None, group: slice | None = None
    ) -> Tensor:
        """Inputs [K*B, pos, R, d] of `readers` given what the model passes their hook point. group:
        the readers (around `readers`, with the same upstream writers) whose corrections are made
        together, once: a layer's queries, keys and values."""
        if self.iv.keep is None:
            out = incoming
        elif self.differentiable:
            out = self._masked_input(incoming, readers, total, group or readers)
        else:
            group = group or readers
            added, from_ablated = self.correction(group)
            out = incoming - total[:, :, None, :] if from_ablated else incoming
            if added is not None:
                out = out + added[:, :, readers.start - group.start : readers.stop - group.start]
        if self.track is not None:
            self.track.append(out)
        return out

    def _masked_input(self, incoming: Tensor, readers: slice, total: Tensor, group: slice) -> Tensor:
        """incoming - total + sum over upstream writers w of keep[w, r] * diffs[w] (total: the sum of
        the upstream writers' diffs [B, pos, d]): the kept edges added to the ablated input, one product
        (`_KeptSum`) per group of readers (a layer's queries, keys and values), kept for the group's
        other hooks."""
        if group.start not in self.added:
            nw = self.graph.n_upstream[group.start]
            groups = [diff for start, diff in self.groups if start < nw]
            self.added[group.start] = _KeptSum.apply(self.iv.keep[0, :nw, group], self.buffer, *groups)
        part = self.added[group.start][readers.start - group.start : readers.stop - group.start]
        kept = part.view(part.shape[0], *incoming.shape[:2], -1).permute(1, 2, 0, 3)
        return incoming - total[:, :, None, :] + kept

    def hooks(self, model: HookedTransformer) -> list[tuple[str, object]]:
        graph, n_layers, has_mlp, parallel = (
            self.graph,
            model.cfg.n_layers,
            self.graph.has_mlp,
            self.graph.parallel,
        )

        def block_index(block) -> int:
            return next(i for i, b in enumerate(model.blocks) if b is block)

        hooks: list[tuple[str, object]] = []

        def on_input(x: Tensor, hook) -> Tensor:
            x = self._override(0, x)
            self._record(slice(0, 1), x)
            return x

        hooks.append(("blocks.0.hook_resid_pre", on_input))
        for layer in range(n_layers):
            q, k, v, mlp = graph.layer_readers(layer)
            heads = graph.head_writers(layer)

            def snapshot(x: Tensor, hook) -> Tensor:
                self.total_before_layer = self.total
                return x

            def reader(readers: slice, before_layer: bool = False, group: slice | None = None):
                def hook_fn(x: Tensor, hook) -> Tensor:
                    total = self.total_before_layer if before_layer else self.total
                    if x.ndim == 3:  # one reader reading [batch, pos, d_model]
                        return self.reader_input(x[:, :, None], readers, total)[:, :, 0]
                    return self.reader_input(x, readers, total, group)

                return hook_fn

            def head_writer(heads: slice):
                def hook_fn(result: Tensor, hook) -> Tensor:
                    result = self._override(heads.start, result)
                    self._record(heads, result)
                    return result

                return hook_fn

            def post_norm_head_writers(block, heads: slice):
                """hook_result, ln1_post's hook_scale and hook_attn_out: heads' contributions through
                the post-norm, with any override applied to the attention output."""
                stash: dict[str, Tensor] = {}

                def keep_result(result: Tensor, hook) -> Tensor:
                    stash["result"] = result
                    return result

                def keep_scale(scale: Tensor, hook) -> Tensor:
                    stash["contribution"] = block.head_contributions(stash.pop("result"), scale)
                    return scale

                def write(out: Tensor, hook) -> Tensor:
                    contribution = stash.pop("contribution")
                    replaced = self._override(heads.start, contribution)
                    if replaced is not contribution:
                        out = out + (replaced.sum(2) - contribution.sum(2)).to(out.dtype)
                    self._record(heads, replaced)
                    return out

                return [
                    (f"blocks.{block_index(block)}.attn.hook_result", keep_result),
                    (f"blocks.{block_index(block)}.ln1_post.hook_scale", keep_scale),
                    (f"blocks.{block_index(block)}.hook_attn_out", write),
                ]

            def mlp_writer(writer: int):
                def hook_fn(out: Tensor, hook) -> Tensor:
                    out = self._override(writer, out)
                    self._record(slice(writer, writer + 1), out)
                    return out

                return hook_fn

            if parallel:
                hooks.append((f"blocks.{layer}.hook_resid_pre", snapshot))
            qkv = slice(q.start, v.stop)
            hooks += [
                (f"blocks.{layer}.hook_q_input", reader(q, group=qkv)),
                (f"blocks.{layer}.hook_k_input", reader(k, group=qkv)),
                (f"blocks.{layer}.hook_v_input", reader(v, group=qkv)),
            ]
            if model.cfg.post_norm:
                hooks += post_norm_head_writers(model.blocks[layer], heads)
            else:
                hooks.append((f"blocks.{layer}.attn.hook_result", head_writer(heads)))
            if has_mlp:
                hooks += [
                    (f"blocks.{layer}.hook_mlp_in", reader(slice(mlp, mlp + 1), before_layer=parallel)),
                    (f"blocks.{layer}.hook_mlp_out", mlp_writer(heads.stop)),
                ]
        last = graph.n_readers - 1
        hooks.append((f"blocks.{n_layers - 1}.hook_resid_post", reader(slice(last, last + 1))))
        return hooks


def edge_forward(
    model: HookedTransformer,
    graph: EdgeGraph,
    tokens: Int[Tensor, "batch pos"],
    intervention: EdgeRun | None = None,
    reader_inputs: list[Tensor] | None = None,
    logit_pos: Int[Tensor, " KB"] | None = None,
) -> Float[Tensor, "KB pos d_vocab"]:
    """The model's forward pass on `tokens` with the edge intervention (see the module docstring).

    Without `keep`, every reader's input is what the model gives it; with it, readers take the kept
    edges' current writer outputs and the other edges' ablated outputs. When `reader_inputs` is a
    list, every reader input is appended to it in graph order (queries [B, P, H, d], keys and values
    [B, P, KV, d], MLP and logits [B, P, d]) as part of the autograd graph. With `logit_pos` only
    those positions (one per row) are unembedded: [KB, 1, d_vocab] (`unembed_at`, `read_at`).
    """
    if logit_pos is not None and not (isinstance(logit_pos, Tensor) and logit_pos.ndim == 1):
        raise ValueError(
            f"logit_pos takes one position per prompt (a LongTensor [batch]), got {logit_pos!r}: pass "
            "model.last_positions(tokens) for each prompt's last real token."
        )
    cfg = model.cfg
    iv = intervention or EdgeRun()
    run = _EdgeRun(graph, iv, tokens.shape[0], tokens.shape[1], reader_inputs)
    hooks = run.hooks(model)
    settings = {
        "use_attn_result": True,
        "use_split_qkv_input": True,
        "use_hook_mlp_in": graph.has_mlp,
        "ungroup_grouped_query_attention": False,
    }  # fmt: skip  (readers' k/v inputs per key/value head)
    with model.settings(**settings), model.hooks(fwd_hooks=hooks):
        repeated = index_tokens(tokens, torch.arange(len(tokens)).repeat(run.n_k))  # each circuit's copy
        final = model(repeated, stop_at_layer=cfg.n_layers)
    return unembed_at(model, final, logit_pos)


def unembed_at(
    model: HookedTransformer, final: Float[Tensor, "rows pos d_model"], logit_pos: Int[Tensor, " rows"] | None
) -> Float[Tensor, "rows pos d_vocab"]:
    """Logits of the final residual stream, differentiably; with `logit_pos` only there, one position
    per row: [rows, 1, d_vocab] (a metric reads them through `read_at`), so no [rows, pos, d_vocab]
    tensor is made (gigabytes with a 262k vocabulary)."""
    if logit_pos is None:
        return model.unembed(model.ln_final(final))
    rows = torch.arange(final.shape[0], device=final.device)
    return model.unembed(model.ln_final(final[rows, logit_pos.to(final.device)][:, None]))


def read_at(metric: Metric, logit_pos: Tensor | None) -> Metric:
    """The metric of `unembed_at`'s logits: with `logit_pos`, an AnswerMetric reads their one
    position (made at its own positions, `logit_positions`); otherwise the metric itself."""
    if logit_pos is not None and isinstance(metric, AnswerMetric):
        return metric.at_read_positions()
    return metric


def logit_positions(metric: Metric, rows: Tensor, n_pos: int, n_k: int = 1) -> Tensor | None:
    """The one position per row that `metric` reads, when it says so (an AnswerMetric), else None."""
    if not isinstance(metric, AnswerMetric):
        return None
    return metric.positions(rows, n_pos).repeat(n_k)


@torch.no_grad()
def writer_outputs(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], subtract_from: Tensor | None = None
) -> Float[Tensor, "writer batch pos d_model"]:
    """Every writer's output on `tokens`: the input embedding, each head's result, each MLP's output.

    With `subtract_from` ([writer, batch, pos, d_model], e.g. the outputs on other prompts) the outputs
    are subtracted from it in place as they are made, and it is returned: no second tensor of them."""
    graph, cfg = edge_graph(model), model.cfg
    out = subtract_from
    stash: dict[str, Tensor] = {}

    def put(writers: slice, value: Tensor) -> None:
        nonlocal out
        value = value.permute(2, 0, 1, 3) if value.ndim == 4 else value[None]  # [n, batch, pos, d]
        if out is None:
            out = torch.empty(graph.n_writers, *value.shape[1:], dtype=value.dtype, device=value.device)
        if subtract_from is None:
            out[writers] = value
        else:
            out[writers] -= value

    def writer(writers: slice):
        def hook_fn(value: Tensor, hook) -> None:
            put(writers, value)

        return hook_fn

    def keep_result(result: Tensor, hook) -> None:
        stash["result"] = result

    def post_norm_heads(block, heads: slice):
        def hook_fn(scale: Tensor, hook) -> None:
            put(heads, block.head_contributions(stash.pop("result"), scale))

        return hook_fn

    hooks = [("blocks.0.hook_resid_pre", writer(slice(0, 1)))]
    for layer in range(cfg.n_layers):
        heads = graph.head_writers(layer)
        if cfg.post_norm:
            hooks += [
                (f"blocks.{layer}.attn.hook_result", keep_result),
                (f"blocks.{layer}.ln1_post.hook_scale", post_norm_heads(model.blocks[layer], heads)),
            ]
        else:
            hooks.append((f"blocks.{layer}.attn.hook_result", writer(heads)))
        if graph.has_mlp:
            hooks.append((f"blocks.{layer}.hook_mlp_out", writer(slice(heads.stop, heads.stop + 1))))
    with model.settings(use_attn_result=True), model.hooks(fwd_hooks=hooks):
        model(tokens, stop_at_layer=cfg.n_layers)
    return out


def ablated_outputs(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    ablation: Ablation | AblationKind = "counterfactual",
) -> Float[Tensor, "writer batch_or_1 pos d_model"]:
    """What ablated edges carry: the writers' outputs on the corrupted prompts (counterfactual), their
    mean over the Ablation's reference tokens [n, pos] (default: the corrupted prompts) at each
    position (mean), their outputs on a random reference prompt per clean prompt (resample, drawn with
    the Ablation's seed; positions counted from each clean prompt's first real token; references with
    padding refused), or zero. The Ablation's mask: the reference prompts' padding mask [n, pos]
    (the corrupted prompts' where it has no reference): each position's mean is over the prompts real
    there, positions counted from each prompt's first real token (`_mean_outputs`); a position where
    none is has no mean, refused where a clean prompt is real and 0 at padding
    (`check_means_defined`). Without it, the mask the reference ids carry (texts and ids from
    `model.to_tokens` do), else none."""
    ablation = edge_ablation(ablation)
    clean, corrupted = model.input_tokens(clean), model.input_tokens(corrupted)
    check_token_pair(clean, corrupted)
    if ablation.kind == "counterfactual":
        return writer_outputs(model, corrupted)
    n_writers = edge_graph(model).n_writers
    if ablation.kind == "zero":
        return torch.zeros(
            n_writers, 1, clean.shape[1], model.cfg.d_model, dtype=model.dtype, device=model.device
        )
    reference = corrupted if ablation.reference is None else model.input_tokens(ablation.reference)
    if reference.shape[1] < clean.shape[1]:
        raise ValueError(
            f"{ablation.kind} ablation needs reference prompts at least as long as the clean ones "
            f"({clean.shape[1]} tokens); got {reference.shape[1]}."
        )
    if ablation.kind == "mean":
        return _mean_outputs(model, clean, reference, ablation.mask)
    padding = recorded_padding(reference)
    if padding is not None and not bool(padding.all()):
        raise ValueError(RESAMPLE_MASK_ERROR)
    outputs = writer_outputs(model, index_tokens(reference, (slice(None), slice(clean.shape[1]))))
    drawn = resample_draws(ablation.seed, clean.shape[0], reference.shape[0])
    outputs = outputs[:, drawn.to(outputs.device)]  # [writer, batch, pos, d_model]
    offsets = model.first_positions(clean)
    if bool(offsets.any()):  # a left-padded prompt's tokens from its first real one
        outputs = shifted(outputs.permute(1, 2, 0, 3), -offsets, 0.0).permute(2, 0, 1, 3)
    return outputs


def _mean_outputs(
    model: HookedTransformer, clean: Tensor, reference: Tensor, mask: Tensor | None
) -> Float[Tensor, "writer batch_or_1 pos d_model"]:
    """Each writer's mean output over the reference prompts real at each position, positions counted
    from each prompt's first real token (left padding skipped, of the references and of the clean
    prompts, which then get their own rows); `mask`: the references' (default: the one their ids
    carry)."""
    n_pos = clean.shape[1]
    mask = mask if mask is not None else recorded_padding(reference)
    real = None if mask is None else check_padding_mask(mask, *reference.shape).bool()
    if real is not None and recorded_padding(reference) is None:  # a mask given with bare ids: run with it
        reference = record_padding(reference.clone(), real.long())
    offsets = None if real is None else first_real(real)
    if offsets is not None and bool(offsets.any()):  # left padding: from each reference's start
        outputs = writer_outputs(model, reference).permute(1, 2, 0, 3)  # [n, pos, writer, d_model]
        outputs = shifted(outputs, offsets).permute(2, 0, 1, 3)[:, :, :n_pos]
        real = shifted(real, offsets, fill=False)
    else:
        outputs = writer_outputs(model, index_tokens(reference, (slice(None), slice(n_pos))))
    real = None if real is None or bool(real[:, :n_pos].all()) else real[:, :n_pos]
    if real is None:
        mean = outputs.mean(1, keepdim=True)
    else:
        mean = masked_mean(outputs, real[None, :, :, None], 1, keepdim=True)
    undefined = None if real is None else ~real.any(0, keepdim=True)  # [1, pos]: no reference real there
    real_clean = model._real_tokens(clean, {})
    clean_offsets = None if real_clean is None else first_real(real_clean)
    if clean_offsets is not None and bool(clean_offsets.any()):  # each clean prompt after its padding
        mean = shifted(mean.permute(1, 2, 0, 3), -clean_offsets, 0.0).permute(2, 0, 1, 3)
        undefined = None if undefined is None else shifted(undefined, -clean_offsets, False)
    if undefined is None:
        return mean
    check_means_defined(undefined, real_clean, "edges' mean ablation")
    return mean.masked_fill(undefined.to(mean.device)[None, :, :, None], 0.0)


def edge_pair(
    model: HookedTransformer, clean: Tensor, corrupted: Tensor, ablation: Ablation
) -> tuple[Tensor, Tensor]:
    """`engine.check_pair` for edges: the clean run is patched from the corrupted one where ablated
    edges carry the corrupted run's outputs (counterfactual), from neither otherwise."""
    return check_pair(model, clean, corrupted, "clean" if ablation.kind == "counterfactual" else None)


def edge_ablation(ablation: Ablation | AblationKind) -> Ablation:
    """`ablation` as an Ablation of edges (`Ablation.of`), refused where edges cannot take it: edges
    take reference tokens without groups, and counterfactual edges carry the corrupted prompts'."""
    ablation = Ablation.of(ablation)
    if ablation.groups is not None:
        raise ValueError(
            "edge ablations take no groups: give an Ablation without groups (one mean or draw for all "
            "prompts)."
        )
    if ablation.kind == "counterfactual" and ablation.reference is not None:
        raise ValueError(
            "counterfactual edge ablation carries each pair's corrupted prompt: give "
            'Ablation("counterfactual") without a reference.'
        )
    if isinstance(ablation.reference, ActivationCache | Mapping):
        raise ValueError(
            "edge ablations need reference tokens [n, pos] (the writers' outputs are read from a run on "
            "them), not a cache."
        )
    return ablation


def chunks(n: int, size: int) -> list[Tensor]:
    """Row indices of n prompts in batches of `size`."""
    return [torch.arange(start, min(start + size, n)) for start in range(0, n, size)]


@torch.no_grad()
def run_circuits(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    keep: Float[Tensor, "K writer reader"],
    ablated: Float[Tensor, "writer batch_or_1 pos d_model"],
    metric: Metric,
    batch_size: int | None = None,
) -> Float[Tensor, "K batch"]:
    """The metric of each prompt with only the `keep` edges of each of K circuits (others ablated)."""
    metric = check_reads_real_tokens(model, metric, tokens)
    graph = edge_graph(model)
    keep = keep.to(device=model.device, dtype=model.dtype)
    if keep.ndim == 2:
        keep = keep[None]
    keep = keep * graph.valid.to(keep.device) + (~graph.valid.to(keep.device)).to(keep.dtype)
    n_k, n = keep.shape[0], tokens.shape[0]
    out = torch.empty(n_k, n)
    for rows in chunks(n, batch_size or n):
        abl = ablated if ablated.shape[1] == 1 else ablated[:, int(rows[0]) : int(rows[-1]) + 1]  # a view
        logit_pos = logit_positions(metric, rows, tokens.shape[1], n_k)
        run = EdgeRun(keep=keep, ablated=abl)
        logits = edge_forward(model, graph, index_tokens(tokens, rows), run, None, logit_pos)
        read = read_at(metric, logit_pos)
        if takes_rows(read):
            values = read(logits, rows.repeat(n_k))
        else:
            values = torch.cat([for_rows(read, rows, n)(part) for part in logits.split(len(rows))])
        out[:, rows] = values.float().view(n_k, len(rows)).cpu()
    return out
