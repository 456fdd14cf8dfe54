"""Activation patching, path patching and attribution patching.

Two runs of the model on prompts of the same shape: `clean` (the behaviour we study) and
`corrupted` (a counterfactual, e.g. IOI with IO and S1 swapped). Patching copies activations from
a *source* run into a *target* run and measures a metric (see interp.metrics) per prompt:

  direction="denoise": target = corrupted, source = clean  (is this activation sufficient?)
  direction="noise":   target = clean, source = corrupted  (is this activation necessary?)

A `Site` names what is overwritten: a hook, optionally one head (or several), a position (int,
or one per prompt as a LongTensor [batch]) and units of the last dimension (e.g. MLP neurons).
A patched run overwrites a *set* of sites at once. Sweeps batch several patched runs into one
forward pass and start each at the earliest patched layer from the target's cached residual
stream (`forward(start_at_layer=L)`), so nothing upstream is recomputed.

Results are `PatchResult`s: per-example values [n_patches, batch], a labelled grid
(`result.mean()` with `result.dims`, `result.coords`) and tidy DataFrames with bootstrap CIs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Literal

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.cache import Pos, act_name
from interp.metrics import Metric
from interp.model import HookedTransformer

Direction = Literal["denoise", "noise"]
PerPromptPos = Int[Tensor, " batch"]
SitePos = int | Sequence[int] | PerPromptPos | None
Positions = None | Literal["each"] | Sequence[int] | Mapping[str, PerPromptPos]

# Components that activation/attribution patching sweep over, and whether they have a head axis.
RESID_COMPONENTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
HEAD_COMPONENTS = ("z", "result", "q", "k", "v", "pattern")
COMPONENTS = RESID_COMPONENTS + HEAD_COMPONENTS

_HEAD_FIRST = {"pattern", "attn_scores"}  # [batch, head, query_pos, key_pos]
_PER_HEAD = {"q", "k", "v", "z", "result", "rot_q", "rot_k", "q_input", "k_input", "v_input"}


# ---------------------------------------------------------------------------------------------
# Sites and the batched patching engine


@dataclass
class Site:
    """Overwrite `name` (a full hook name) where head/pos/unit select; None selects everything.

    head: int or list of ints, the head axis of per-head hooks ([batch, pos, head, d] or the
      pattern's [batch, head, q_pos, k_pos]); for hook_k/hook_v/k_input/v_input these are
      key/value heads under grouped-query attention.
    pos: int, list of ints, or LongTensor [batch] (one position per prompt); for patterns this
      is the query position.
    unit: int or list of ints on the last axis (MLP neurons in mlp.hook_post, d_head dims, ...).
    """

    name: str
    head: int | Sequence[int] | None = None
    pos: SitePos = None
    unit: int | Sequence[int] | None = None

    @property
    def layer(self) -> int:
        """The block the hook lives in: -1 for embeddings, n_layers-like large for ln_final."""
        match = re.match(r"blocks\.(\d+)\.", self.name)
        if match:
            return int(match.group(1))
        return -1 if self.name.startswith("hook_") else 10**9


def _short(name: str) -> str:
    return name.rsplit("hook_", 1)[-1]


def _axis_mask(size: int, index: int | Sequence[int], what: str, device) -> Tensor:
    indices = torch.as_tensor(index, dtype=torch.long, device=device).reshape(-1)
    if indices.numel() and (indices.min() < -size or indices.max() >= size):
        raise ValueError(f"{what} {index} out of range: this activation has {size} {what}s")
    mask = torch.zeros(size, dtype=torch.bool, device=device)
    mask[indices] = True
    return mask


def site_mask(site: Site, shape: torch.Size, device: torch.device | str = "cpu") -> Tensor:
    """Boolean mask, broadcastable to an activation of `shape` ([batch, ...]), of what `site` selects."""
    short = _short(site.name)
    ndim = len(shape)
    head_dim = 1 if short in _HEAD_FIRST else 2 if short in _PER_HEAD else None
    pos_dim = 2 if short in _HEAD_FIRST else 1
    mask = torch.ones([1] * ndim, dtype=torch.bool, device=device)

    def along(dim: int, axis_mask: Tensor) -> Tensor:
        view = [1] * ndim
        view[dim] = shape[dim]
        return axis_mask.view(view)

    if site.head is not None:
        if head_dim is None:
            raise ValueError(
                f"{site.name} has no head axis; leave head=None (heads live in hook_z, hook_q, ...)"
            )
        mask = mask & along(head_dim, _axis_mask(shape[head_dim], site.head, "head", device))
    if site.pos is not None:
        if isinstance(site.pos, Tensor) and site.pos.ndim == 1 and site.pos.dtype != torch.bool:
            pos = site.pos.to(device)
            if pos.shape[0] != shape[0]:
                raise ValueError(f"per-prompt positions must be [batch={shape[0]}], got {tuple(pos.shape)}")
            if pos.min() < 0 or pos.max() >= shape[pos_dim]:
                raise ValueError(f"positions must lie in [0, {shape[pos_dim]}), got {pos.min()}..{pos.max()}")
            per_prompt = torch.zeros(shape[0], shape[pos_dim], dtype=torch.bool, device=device)
            per_prompt[torch.arange(shape[0], device=device), pos] = True
            view = [1] * ndim
            view[0], view[pos_dim] = shape[0], shape[pos_dim]
            mask = mask & per_prompt.view(view)
        else:
            mask = mask & along(pos_dim, _axis_mask(shape[pos_dim], site.pos, "position", device))
    if site.unit is not None:
        mask = mask & along(ndim - 1, _axis_mask(shape[-1], site.unit, "unit", device))
    return mask


def _check_sites(model: HookedTransformer, site_sets: Sequence[Sequence[Site]]) -> None:
    for sites in site_sets:
        for site in sites:
            try:
                model.check_hook_name(site.name)
            except KeyError as error:
                raise ValueError(f"unknown activation: {error.args[0]}") from None


def run_site_sets(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    site_sets: Sequence[Sequence[Site]],
    sources: Mapping[str, Tensor],
    metric: Metric,
    resid_pre: Sequence[Tensor] | None = None,
    batch_size: int | None = None,
    logit_pos: Pos = None,
) -> Float[Tensor, "n_sets batch"]:
    """Metric of each patched run: run i overwrites every site in site_sets[i] with `sources`.

    sources[name]: the replacement values for hook `name`, broadcastable to its activation
      [batch, ...] (a cached source run's activation, a mean, zeros, ...).
    resid_pre: the target run's residual stream before each block and after the last (n_layers + 1
      tensors [batch, pos, d_model]); with it a run starts at its earliest patched block instead of
      the embeddings.
    batch_size: patched copies of the batch per forward pass (default: ~64 prompts per pass).
    logit_pos: see `forward_logits`.
    Returns the per-example metric [n_sets, batch]. An empty site set is the unpatched target run.

    Runs share computation: the residual stream before block L depends only on the sites patched
    before L, so runs that patch the same sites there (e.g. circuits that all ablate the heads of
    the first layers) compute those blocks once. The runs are sorted by what they patch, segment by
    segment (embeddings, blocks, final norm), and walked breadth-first in chunks, one stacked
    forward pass per segment and group of copies.
    """
    _check_sites(model, site_sets)
    batch = tokens.shape[0]
    batch_size = batch_size or max(1, 64 // batch)
    n_layers = model.cfg.n_layers
    segments = range(-1, n_layers + 1)  # -1: embeddings, L: block L, n_layers: final norm and unembed
    keys = [_segment_keys(sites, n_layers) for sites in site_sets]
    order = sorted(range(len(site_sets)), key=lambda i: keys[i])
    node_bytes = tokens.numel() * model.cfg.d_model * torch.finfo(model.dtype).bits // 8
    chunk = max(batch_size, min(64, (2**29) // max(1, node_bytes)))  # runs walked together (~512 MiB)
    values = torch.empty(len(site_sets), batch)
    buffer = _LogitBuffer()

    with torch.no_grad():
        for start in range(0, len(order), chunk):
            # A group: runs that have patched the same sites so far, and their residual stream
            # (None: the unpatched target run's, taken from resid_pre when needed).
            groups: list[tuple[list[int], Tensor | None]] = [(order[start : start + chunk], None)]
            for segment in segments:
                pending: list[tuple[list[int], Tensor, list[Site]]] = []
                next_groups = []
                for runs, resid in groups:
                    for key, sub in _group_by(runs, [keys[i][segment + 1] for i in runs]).items():
                        if resid is None and resid_pre is not None and not key and segment < n_layers:
                            next_groups.append((sub, None))  # still the target run: nothing to compute
                            continue
                        if resid is not None:
                            parent = resid
                        else:  # without resid_pre the target run is computed from the tokens
                            parent = tokens if segment == -1 else resid_pre[segment]
                        sites = [s for s in site_sets[sub[0]] if _segment(s, n_layers) == segment]
                        pending.append((sub, parent, sites))
                for part in [pending[i : i + batch_size] for i in range(0, len(pending), batch_size)]:
                    outputs = _segment_forward(model, segment, part, sources, batch, logit_pos, buffer)
                    if segment < n_layers:
                        next_groups += [(sub, out) for (sub, _, _), out in zip(part, outputs, strict=True)]
                        continue
                    # The final segment: take each run's metric before the logit buffer is reused.
                    for (runs, _, _), logits in zip(part, outputs, strict=True):
                        value = _apply_metric(metric, logits, batch)
                        for i in runs:
                            values[i] = value
                groups = next_groups
    return values


def _segment(site: Site, n_layers: int) -> int:
    """The segment a site's hook fires in: -1 embeddings, L block L, n_layers final norm/unembed."""
    return max(-1, min(site.layer, n_layers))


def _site_key(site: Site) -> str:
    def plain(value) -> object:
        if isinstance(value, Tensor):
            return tuple(value.tolist())
        return tuple(value) if isinstance(value, Sequence) else value

    return repr((site.name, plain(site.head), plain(site.pos), plain(site.unit)))


def _segment_keys(sites: Sequence[Site], n_layers: int) -> tuple[str, ...]:
    """Per segment (-1 .. n_layers), a comparable key of the sites patched there ("" for none)."""
    per_segment = [[] for _ in range(n_layers + 2)]
    for site in sites:
        per_segment[_segment(site, n_layers) + 1].append(_site_key(site))
    return tuple("|".join(sorted(keys)) for keys in per_segment)


def _group_by(items: Sequence[int], keys: Sequence[str]) -> dict[str, list[int]]:
    """items grouped by their keys, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for item, key in zip(items, keys, strict=True):
        groups.setdefault(key, []).append(item)
    return groups


def _segment_forward(
    model: HookedTransformer,
    segment: int,
    part: Sequence[tuple[list[int], Tensor, list[Site]]],
    sources: Mapping[str, Tensor],
    batch: int,
    logit_pos: Pos,
    buffer: _LogitBuffer,
) -> list[Tensor]:
    """Run one segment for stacked copies (parent residual stream or tokens, the sites patched in
    this segment); the outputs, split per copy (logits after the last segment, in `buffer`)."""
    n = len(part)
    by_name: dict[str, list[tuple[int, Site]]] = {}
    for i, (_, _, sites) in enumerate(part):
        for site in sites:
            by_name.setdefault(site.name, []).append((i, site))
    missing = set(by_name) - set(sources)
    if missing:
        raise ValueError(f"no source values for {sorted(missing)}; cache them in the source run")

    def make_hook(name: str):
        def hook(act: Tensor, hook) -> Tensor:
            act = act.unflatten(0, (n, batch)).clone()
            source = sources[name].to(act.device, act.dtype)
            for i, site in by_name[name]:
                act[i] = torch.where(site_mask(site, act.shape[1:], act.device), source, act[i])
            return act.flatten(0, 1)

        return hook

    stacked = torch.cat([parent for _, parent, _ in part])
    n_layers = model.cfg.n_layers
    with model.hooks(fwd_hooks=[(name, make_hook(name)) for name in by_name]):
        if segment == -1:
            out = model(stacked, stop_at_layer=0)
        elif segment == n_layers:
            out = _forward_logits(model, stacked, logit_pos, n_layers, buffer)
        else:
            out = model(stacked, start_at_layer=segment, stop_at_layer=segment + 1)
    return list(out.split(batch))


def _apply_metric(metric: Metric, logits: Tensor, batch: int) -> Tensor:
    value = metric(logits)
    if not isinstance(value, Tensor) or value.shape != (batch,):
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(
            f"the metric must return one value per prompt, a tensor [batch={batch}]; got {shape}"
        )
    if value.isnan().any():
        raise ValueError(
            "the metric is NaN: does it read logits outside logit_pos (they are NaN there)? "
            "Pass the positions it reads as logit_pos, or logit_pos=None."
        )
    return value.detach().float().cpu().clone()  # not a view of logits that a buffer reuses


def forward_logits(
    model: HookedTransformer,
    input: Tensor,
    logit_pos: Pos = None,
    start_at_layer: int | None = None,
) -> Float[Tensor, "batch pos d_vocab"]:
    """model(input, start_at_layer=...), with the logits computed only at `logit_pos`.

    logit_pos: None (every position), an int, or a LongTensor [batch] (tiled when the input
      stacks several copies of the batch). Logits elsewhere are NaN. Most metrics read one
      position per prompt (IOI's END), and the unembedding is a large part of a forward pass.
    """
    return _forward_logits(model, input, logit_pos, start_at_layer, None)


class _LogitBuffer:
    """NaN logits [rows, pos, d_vocab] reused by the passes of one sweep: a fresh tensor that size,
    filled with NaN each pass, costs as much as the unembedding it saves. A pass's logits are valid
    until the next pass writes the buffer, so its metric must be taken first."""

    def __init__(self) -> None:
        self.logits: Tensor | None = None
        self.written: tuple[Tensor, Tensor] | None = None

    def put(self, picked: Float[Tensor, "rows d_vocab"], rows: Tensor, pos: Tensor, n_pos: int) -> Tensor:
        shape = (picked.shape[0], n_pos, picked.shape[-1])
        logits = self.logits
        if (
            logits is None
            or logits.shape != shape
            or logits.dtype != picked.dtype
            or logits.device != picked.device
        ):
            logits = self.logits = picked.new_full(shape, float("nan"))
        elif self.written is not None:
            logits[self.written] = float("nan")
        logits[rows, pos] = picked
        self.written = (rows, pos)
        return logits


def _forward_logits(
    model: HookedTransformer,
    input: Tensor,
    logit_pos: Pos,
    start_at_layer: int | None,
    buffer: _LogitBuffer | None,
) -> Float[Tensor, "batch pos d_vocab"]:
    """`forward_logits`, writing into `buffer` when one is given."""
    if logit_pos is None:
        return model(input, start_at_layer=start_at_layer)
    resid = model(input, start_at_layer=start_at_layer, stop_at_layer=model.cfg.n_layers)
    rows, n_pos = resid.shape[:2]
    if isinstance(logit_pos, int):
        pos = torch.full((rows,), logit_pos % n_pos, device=resid.device)
    else:
        pos = logit_pos.to(resid.device).repeat(rows // logit_pos.shape[0])
    row_index = torch.arange(rows, device=resid.device)
    picked = model.unembed(model.ln_final(resid[row_index, pos][:, None]))[:, 0]  # [rows, d_vocab]
    if buffer is not None:
        return buffer.put(picked, row_index, pos, n_pos)
    logits = picked.new_full((rows, n_pos, picked.shape[-1]), float("nan"))
    logits[row_index, pos] = picked
    return logits


def _check_logit_pos(logit_pos: Pos, tokens: Tensor) -> None:
    batch, n_pos = tokens.shape
    if logit_pos is None:
        return
    if isinstance(logit_pos, int):
        if not -n_pos <= logit_pos < n_pos:
            raise ValueError(f"logit_pos {logit_pos} is out of range for prompts of {n_pos} tokens")
        return
    if not isinstance(logit_pos, Tensor) or logit_pos.shape != (batch,):
        raise ValueError(f"logit_pos must be None, an int or a LongTensor [batch={batch}]")
    if logit_pos.min() < 0 or logit_pos.max() >= n_pos:
        raise ValueError(f"logit_pos must lie in [0, {n_pos}), got {logit_pos.min()}..{logit_pos.max()}")


def _resid_names(model: HookedTransformer) -> list[str]:
    return [act_name("resid_pre", layer) for layer in range(model.cfg.n_layers)]


def _final_resid_hook(model: HookedTransformer) -> str:
    return act_name("resid_post", model.cfg.n_layers - 1)


def _cached_run(
    model: HookedTransformer, tokens: Tensor, names: Iterable[str], logit_pos: Pos = None
) -> tuple[Tensor, dict[str, Tensor]]:
    """(logits, {name: activation}) of one run; the logits only at logit_pos (see forward_logits)."""
    names = sorted(set(names))
    cache: dict[str, Tensor] = {}

    def save(act: Tensor, hook) -> None:
        cache[hook.name] = act.detach()

    with torch.no_grad(), model.hooks(fwd_hooks=[(name, save) for name in names]):
        logits = forward_logits(model, tokens, logit_pos)
    return logits, cache


def _resid_stack(model: HookedTransformer, cache: Mapping[str, Tensor]) -> list[Tensor]:
    """resid_pre of every block plus the final residual stream (index n_layers)."""
    return [cache[name] for name in _resid_names(model)] + [cache[_final_resid_hook(model)]]


def _as_tokens(model: HookedTransformer, tokens) -> Tensor:
    if isinstance(tokens, Tensor):
        return model._as_tokens(tokens, None)
    return model.to_tokens(tokens)


def _check_pair(model: HookedTransformer, clean, corrupted) -> tuple[Tensor, Tensor]:
    clean, corrupted = _as_tokens(model, clean), _as_tokens(model, corrupted)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} tokens must have the same "
            "[batch, pos] shape: pair each clean prompt with one corrupted prompt of the same length"
        )
    return clean, corrupted


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class PatchResult:
    """Per-example metric values of a set of patched runs, with labels.

    values: [n_patches, batch] metric of each patched run on each prompt.
    index: one row per patch (columns component, layer, head, position).
    dims, coords: the grid the patches form (e.g. ("layer", "head") with their labels);
      `mean()` / `per_example()` reshape values to it.
    target, source: the metric on the unpatched target and source runs, [batch].
    """

    values: Tensor
    index: pd.DataFrame
    dims: tuple[str, ...]
    coords: dict[str, list]
    metric_name: str = "metric"
    target: Tensor | None = None
    source: Tensor | None = None
    method: str = "activation patching"
    extra: dict = field(default_factory=dict)

    def per_example(self) -> Float[Tensor, "*grid batch"]:
        return self.values.view(*[len(self.coords[d]) for d in self.dims], self.values.shape[-1])

    def mean(self) -> Float[Tensor, "*grid"]:
        """The batch-mean metric as a tensor shaped like the grid, e.g. [layer, head]."""
        return self.per_example().mean(-1)

    def to_dataframe(self) -> pd.DataFrame:
        """Tidy: one row per patch and prompt (component, layer, head, position, metric, example, value)."""
        n, batch = self.values.shape
        frame = self.index.loc[self.index.index.repeat(batch)].reset_index(drop=True)
        frame["metric"] = self.metric_name
        frame["example"] = list(range(batch)) * n
        frame["value"] = self.values.reshape(-1).numpy()
        return frame

    def summary(self, n_boot: int = 1000, ci: float = 0.95, seed: int = 0) -> pd.DataFrame:
        """One row per patch: mean over prompts and a percentile bootstrap CI (resampling prompts)."""
        low, high = bootstrap_ci(self.values, n_boot, ci, seed)
        frame = self.index.copy()
        frame["metric"] = self.metric_name
        frame["mean"] = self.values.mean(-1).numpy()
        frame["ci_low"], frame["ci_high"] = low.numpy(), high.numpy()
        frame["n"] = self.values.shape[-1]
        return frame


def bootstrap_ci(
    values: Float[Tensor, "n batch"], n_boot: int = 1000, ci: float = 0.95, seed: int = 0
) -> tuple[Float[Tensor, " n"], Float[Tensor, " n"]]:
    """Percentile bootstrap CI of the mean over the last axis (prompts), for every row."""
    generator = torch.Generator().manual_seed(seed)
    batch = values.shape[-1]
    samples = torch.randint(batch, (n_boot, batch), generator=generator)  # [n_boot, batch]
    means = values[:, samples].mean(-1)  # [n, n_boot]
    alpha = (1 - ci) / 2
    return means.quantile(alpha, dim=-1), means.quantile(1 - alpha, dim=-1)


def _grid_index(component: str, dims: tuple[str, ...], coords: dict[str, list]) -> pd.DataFrame:
    rows = [dict(zip(dims, labels, strict=True)) for labels in product(*(coords[d] for d in dims))]
    frame = pd.DataFrame(rows, columns=list(dims))
    frame.insert(0, "component", component)
    for column in ("layer", "head", "position"):
        if column not in frame:
            frame[column] = None
    return frame[["component", "layer", "head", "position"]]


# ---------------------------------------------------------------------------------------------
# Activation patching


def _position_axis(positions: Positions, n_pos: int) -> tuple[list, list[SitePos]]:
    """(labels, site positions) of a positions argument."""
    if positions is None:
        return ["all"], [None]
    if isinstance(positions, str):
        if positions != "each":
            raise ValueError(
                "positions must be None, 'each', a list of ints or a dict of [batch] tensors, "
                f"got {positions!r}"
            )
        return list(range(n_pos)), list(range(n_pos))
    if isinstance(positions, Mapping):
        return list(positions), [torch.as_tensor(p).long() for p in positions.values()]
    for p in positions:
        if not -n_pos <= p < n_pos:
            raise ValueError(f"position {p} is out of range for prompts of {n_pos} tokens")
    return list(positions), list(positions)


def _component_grid(
    model: HookedTransformer, component: str, layers: Sequence[int] | None, positions: Positions, n_pos: int
) -> tuple[tuple[str, ...], dict[str, list], list[Site]]:
    """The (dims, coords, sites) of a sweep of `component` over layers (x heads) x positions."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; choose one of {', '.join(COMPONENTS)}")
    cfg = model.cfg
    if component in ("resid_mid", "mlp_out") and cfg.attn_only:
        raise ValueError(f"{component!r} does not exist in an attention-only model")
    if component == "resid_mid" and cfg.parallel_residual:
        raise ValueError("'resid_mid' does not exist in a parallel-residual model")
    layers = list(range(cfg.n_layers)) if layers is None else list(layers)
    if any(not 0 <= layer < cfg.n_layers for layer in layers):
        raise ValueError(f"layers must lie in [0, {cfg.n_layers}), got {layers}")
    pos_labels, site_pos = _position_axis(positions, n_pos)
    if component in HEAD_COMPONENTS:
        n_heads = cfg.n_kv_heads if component in ("k", "v") else cfg.n_heads
        dims, coords = (
            ("layer", "head", "position"),
            {"layer": layers, "head": list(range(n_heads)), "position": pos_labels},
        )
        sites = [
            Site(act_name(component, layer), head=head, pos=pos)
            for layer in layers
            for head in range(n_heads)
            for pos in site_pos
        ]
    else:
        dims, coords = ("layer", "position"), {"layer": layers, "position": pos_labels}
        sites = [Site(act_name(component, layer), pos=pos) for layer in layers for pos in site_pos]
    return dims, coords, sites


def _settings_for(component_or_names: str | Iterable[str]) -> dict[str, bool]:
    names = [component_or_names] if isinstance(component_or_names, str) else list(component_or_names)
    settings = {}
    if any(_short(n) == "result" for n in names):
        settings["use_attn_result"] = True
    if any(_short(n) in ("q_input", "k_input", "v_input") for n in names):
        settings["use_split_qkv_input"] = True
    return settings


def _source_target(clean: Tensor, corrupted: Tensor, direction: Direction) -> tuple[Tensor, Tensor]:
    if direction == "denoise":
        return clean, corrupted
    if direction == "noise":
        return corrupted, clean
    raise ValueError(
        f"direction must be 'denoise' (corrupted run, clean activations) or 'noise', got {direction!r}"
    )


def patch_sites(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    site_sets: Sequence[Site | Sequence[Site]],
    direction: Direction = "denoise",
    labels: Sequence[str] | None = None,
    metric_name: str = "metric",
    batch_size: int | None = None,
    logit_pos: Pos = None,
) -> PatchResult:
    """The generic form: one patched run per entry of site_sets (a Site or a list patched together).

    Returns a PatchResult with dims ("patch",) labelled by `labels` (default: the hook names).
    logit_pos: the positions the metric reads (int or LongTensor [batch]); logits are computed
      only there (faster; NaN elsewhere). None: every position.
    """
    clean, corrupted = _check_pair(model, clean, corrupted)
    _check_logit_pos(logit_pos, clean)
    source_tokens, target_tokens = _source_target(clean, corrupted, direction)
    site_sets = [[s] if isinstance(s, Site) else list(s) for s in site_sets]
    names = {site.name for sites in site_sets for site in sites}
    labels = (
        list(labels)
        if labels is not None
        else ["+".join(s.name for s in sites) or "none" for sites in site_sets]
    )
    if len(labels) != len(site_sets):
        raise ValueError(f"got {len(labels)} labels for {len(site_sets)} site sets")
    with model.settings(**_settings_for(names)):
        _check_sites(model, site_sets)
        source_logits, sources = _cached_run(model, source_tokens, names, logit_pos)
        target_logits, target_cache = _cached_run(
            model, target_tokens, _resid_names(model) + [_final_resid_hook(model)], logit_pos
        )
        resid = _resid_stack(model, target_cache)
        values = run_site_sets(model, target_tokens, site_sets, sources, metric, resid, batch_size, logit_pos)
    index = pd.DataFrame({"component": labels, "layer": None, "head": None, "position": None})
    index["layer"] = [min((s.layer for s in sites), default=None) for sites in site_sets]
    return PatchResult(
        values,
        index,
        ("patch",),
        {"patch": labels},
        metric_name,
        target=_apply_metric(metric, target_logits, target_tokens.shape[0]),
        source=_apply_metric(metric, source_logits, target_tokens.shape[0]),
        method=f"activation patching ({direction})",
    )


def activation_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    component: str = "z",
    positions: Positions = None,
    layers: Sequence[int] | None = None,
    direction: Direction = "denoise",
    metric_name: str = "metric",
    batch_size: int | None = None,
    logit_pos: Pos = None,
) -> PatchResult:
    """Patch `component` at every layer (x head) x position from the source run into the target run.

    component: resid_pre, resid_mid, resid_post, attn_out, mlp_out ([layer, position] grid) or
      z, result, q, k, v, pattern (per head: [layer, head, position]; k and v index key/value heads).
    positions: None = all positions at once (label "all"); "each" = every position separately;
      a list of ints; or {name: LongTensor [batch]} for per-prompt positions (e.g. IOI's
      {"IO": ..., "S1": ..., "S2": ..., "END": ...}), labelled by name.
    metric: logits [batch, pos, d_vocab] -> [batch] (see interp.metrics).
    Each forward holds `batch_size` patched runs and starts at the patched layer.
    logit_pos: the positions the metric reads (int or LongTensor [batch], e.g. END): logits are
      computed only there, which saves the unembedding elsewhere. None: every position.
    """
    clean, corrupted = _check_pair(model, clean, corrupted)
    dims, coords, sites = _component_grid(model, component, layers, positions, clean.shape[1])
    result = patch_sites(
        model, clean, corrupted, metric, sites, direction, None, metric_name, batch_size, logit_pos
    )
    result.index = _grid_index(component, dims, coords)
    result.dims, result.coords = dims, coords
    return result


# ---------------------------------------------------------------------------------------------
# Path patching

Sender = tuple[int, int | str]  # (layer, head) or (layer, "mlp")
Receiver = tuple[int, int, str]  # (layer, head, "q" | "k" | "v" | any combination, e.g. "qkv")


def _check_senders(model: HookedTransformer, senders: Sequence[Sender]) -> None:
    cfg = model.cfg
    for sender in senders:
        layer, unit = sender
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(f"sender {sender}: layer must lie in [0, {cfg.n_layers})")
        if unit == "mlp":
            if cfg.attn_only:
                raise ValueError(f"sender {sender}: this model is attention-only and has no MLPs")
        elif not (isinstance(unit, int) and 0 <= unit < cfg.n_heads):
            raise ValueError(
                f"sender {sender}: give (layer, head) with head in [0, {cfg.n_heads}) or (layer, 'mlp')"
            )


def _check_receivers(model: HookedTransformer, receivers: Sequence[Receiver] | str) -> None:
    if isinstance(receivers, str):
        if receivers not in ("logits", "resid_final"):
            raise ValueError(
                f"receivers must be 'logits' or a list of (layer, head, 'q'|'k'|'v'), got {receivers!r}"
            )
        return
    if not receivers:
        raise ValueError("receivers is empty: give (layer, head, 'qkv') tuples or 'logits'")
    cfg = model.cfg
    for receiver in receivers:
        layer, head, inputs = receiver
        if not 0 <= layer < cfg.n_layers or not 0 <= head < cfg.n_heads:
            raise ValueError(
                f"receiver {receiver}: layer in [0, {cfg.n_layers}) and head in [0, {cfg.n_heads}) needed"
            )
        if not inputs or set(inputs) - set("qkv"):
            raise ValueError(f"receiver {receiver}: the input must be a combination of 'q', 'k', 'v'")


def path_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    receivers: Sequence[Receiver] | str = "logits",
    senders: Sequence[Sender | Sequence[Sender]] | None = None,
    sender_pos: SitePos = None,
    receiver_pos: SitePos = None,
    freeze_mlps: bool = False,
    metric_name: str = "metric",
    batch_size: int | None = None,
    logit_pos: Pos = None,
) -> PatchResult:
    """Path patching (Wang et al. 2022, sec. 3.1 and appendix B; Goldowsky-Dill et al. 2023): the
    effect of senders -> receivers paths, one patched run per sender (or per set of senders).

    Semantics (the clean run is the target; corrupted activations travel only along the paths):
      run 1: cache the clean and corrupted runs.
      run 2: the clean run in which every sender's output (hook_z of the head, or mlp_out) is
        set to its corrupted value at `sender_pos`, and the output (hook_z) of every other head,
        at every layer and position, is frozen to its clean value. MLPs are recomputed, as in the
        IOI paper, so sender -> MLP -> receiver paths count as part of the path; with
        freeze_mlps=True they are frozen to clean too (only direct sender -> receiver paths).
        Normalisations are always recomputed. Record the receivers' inputs.
      run 3: the clean run in which the receivers' inputs (at `receiver_pos`) are replaced by the
        values recorded in run 2, and everything else, downstream of the receivers included, is
        recomputed. The metric is measured on this run.
    receivers: (layer, head, "q"/"k"/"v"/"qkv"...) -- the query/key/value input of that head
      (hook_q_input/k_input/v_input); or "logits" (the final residual stream: the metric of run 2).
      Grouped-query attention: keys and values are computed per key/value head, so a receiver
      (layer, h, "k") patches the input of key/value head h // group_size, which every query
      head of that group shares.
    senders: a list of senders (each its own run: a sweep) or of lists of senders (patched
      together); default every head in layers before the last receiver (all layers for logits).
    sender_pos, receiver_pos: None (all positions), int, or LongTensor [batch] per prompt
      (e.g. receivers' queries at END).
    logit_pos: the positions the metric reads; logits only there (see forward_logits).
    Returns a PatchResult with dims ("layer", "head") for the default sweep, else ("patch",).
    """
    clean, corrupted = _check_pair(model, clean, corrupted)
    _check_logit_pos(logit_pos, clean)
    _check_receivers(model, receivers)
    cfg = model.cfg
    to_logits = isinstance(receivers, str)
    last_layer = cfg.n_layers if to_logits else max(r[0] for r in receivers)
    grid = senders is None
    if grid:
        dims = ("layer", "head")
        coords = {"layer": list(range(last_layer)), "head": list(range(cfg.n_heads))}
        senders = [(layer, head) for layer in coords["layer"] for head in coords["head"]]
    sender_sets = [[s] if _is_sender(s) else list(s) for s in senders]
    for sender_set in sender_sets:
        _check_senders(model, sender_set)
    names = {act_name("z", layer) for layer in range(cfg.n_layers)}
    names |= {act_name("mlp_out", layer) for layer in range(cfg.n_layers)} if not cfg.attn_only else set()
    names |= set(_resid_names(model)) | {_final_resid_hook(model)}
    clean_logits, clean_cache = _cached_run(model, clean, names, logit_pos)
    corrupted_logits, corrupted_cache = _cached_run(model, corrupted, names, logit_pos)
    batch_size = batch_size or max(1, 64 // clean.shape[0])
    values = torch.empty(len(sender_sets), clean.shape[0])
    buffer = _LogitBuffer()
    order = sorted(
        range(len(sender_sets)), key=lambda i: min((s[0] for s in sender_sets[i]), default=cfg.n_layers)
    )
    with torch.no_grad():
        for chunk in [order[i : i + batch_size] for i in range(0, len(order), batch_size)]:
            sets = [sender_sets[i] for i in chunk]
            logits = _path_patch_chunk(
                model,
                sets,
                receivers,
                clean_cache,
                corrupted_cache,
                sender_pos,
                receiver_pos,
                freeze_mlps,
                logit_pos,
                buffer,
            )
            for row, i in enumerate(chunk):
                values[i] = _apply_metric(
                    metric, logits[row * clean.shape[0] : (row + 1) * clean.shape[0]], clean.shape[0]
                )
    if grid:
        index = _grid_index("z", dims, coords)
    else:
        labels = [" + ".join(_sender_label(s) for s in sender_set) or "none" for sender_set in sender_sets]
        dims, coords = ("patch",), {"patch": labels}
        index = pd.DataFrame({"component": labels, "layer": None, "head": None, "position": None})
    return PatchResult(
        values,
        index,
        dims,
        coords,
        metric_name,
        target=_apply_metric(metric, clean_logits, clean.shape[0]),
        source=_apply_metric(metric, corrupted_logits, clean.shape[0]),
        method="path patching",
        extra={"receivers": receivers, "freeze_mlps": freeze_mlps},
    )


def _is_sender(sender) -> bool:
    return isinstance(sender, tuple) and len(sender) == 2 and isinstance(sender[0], int)


def _sender_label(sender: Sender) -> str:
    layer, unit = sender
    return f"MLP{layer}" if unit == "mlp" else f"L{layer}H{unit}"


def _path_patch_chunk(
    model: HookedTransformer,
    sender_sets: Sequence[Sequence[Sender]],
    receivers: Sequence[Receiver] | str,
    clean: Mapping[str, Tensor],
    corrupted: Mapping[str, Tensor],
    sender_pos: SitePos,
    receiver_pos: SitePos,
    freeze_mlps: bool,
    logit_pos: Pos,
    buffer: _LogitBuffer,
) -> Float[Tensor, "n_sets*batch pos d_vocab"]:
    """Runs 2 and 3 of path patching for len(sender_sets) stacked copies of the clean run (the
    logits in `buffer`)."""
    cfg = model.cfg
    n = len(sender_sets)
    resid = _resid_stack(model, clean)
    batch = resid[0].shape[0]
    start = min((s[0] for sender_set in sender_sets for s in sender_set), default=cfg.n_layers)
    to_logits = isinstance(receivers, str)
    receiver_layers = sorted({r[0] for r in receivers}) if not to_logits else []
    stop = cfg.n_layers if to_logits else receiver_layers[-1]

    # Run 2: senders corrupted, other heads (and optionally MLPs) frozen to clean; record receivers' inputs.
    def frozen(kind: str, layer: int):
        name = act_name(kind, layer)

        def hook(act: Tensor, hook) -> Tensor:
            base = act.unflatten(0, (n, batch)) if (kind == "mlp_out" and not freeze_mlps) else None
            out = base.clone() if base is not None else clean[name].expand(n, *clean[name].shape).clone()
            for i, sender_set in enumerate(sender_sets):
                for s_layer, unit in sender_set:
                    if s_layer != layer or (unit == "mlp") != (kind == "mlp_out"):
                        continue
                    site = Site(name, head=None if unit == "mlp" else unit, pos=sender_pos)
                    out[i] = torch.where(site_mask(site, out.shape[1:], out.device), corrupted[name], out[i])
            return out.flatten(0, 1)

        return hook

    recorded: dict[int, Tensor] = {}

    def record(layer: int):
        def hook(act: Tensor, hook) -> None:
            recorded[layer] = act.unflatten(0, (n, batch))

        return hook

    hooks = []
    for layer in range(max(start, 0), stop):
        hooks.append((act_name("z", layer), frozen("z", layer)))
        if not cfg.attn_only and (freeze_mlps or any(s == (layer, "mlp") for ss in sender_sets for s in ss)):
            hooks.append((act_name("mlp_out", layer), frozen("mlp_out", layer)))
    hooks += [
        (act_name("resid_pre", layer), record(layer)) for layer in receiver_layers if start <= layer < stop
    ]
    if start < stop:
        with model.hooks(fwd_hooks=hooks):
            run2 = model(
                resid[start].repeat(n, 1, 1), start_at_layer=start, stop_at_layer=stop, return_type=None
            )
        if to_logits:  # the receiver is the final residual stream: run 2 is the measured run
            return _forward_logits(model, run2, logit_pos, cfg.n_layers, buffer)
        recorded[stop] = run2.unflatten(0, (n, batch))
    elif to_logits:  # no sender before the end: the clean run
        return _forward_logits(model, resid[-1].repeat(n, 1, 1), logit_pos, cfg.n_layers, buffer)
    for layer in receiver_layers:
        if layer not in recorded:  # every sender is at or after this receiver: its input is clean
            recorded[layer] = resid[layer].expand(n, *resid[layer].shape)

    # Run 3: clean run with the receivers' inputs replaced by what run 2 recorded.
    def patch_inputs(layer: int, letter: str, heads: list[int]):
        site = Site(act_name(f"{letter}_input", layer), head=heads, pos=receiver_pos)

        def hook(act: Tensor, hook) -> Tensor:
            act = act.unflatten(0, (n, batch))
            value = recorded[layer][:, :, :, None, :]  # [n, batch, pos, 1, d_model]
            mask = site_mask(site, act.shape[1:], act.device)
            return torch.where(mask, value, act).flatten(0, 1)

        return hook

    hooks = []
    for layer in receiver_layers:
        for letter in "qkv":
            heads = sorted(
                {
                    h if letter == "q" else h // cfg.group_size
                    for r_layer, h, inputs in receivers
                    if r_layer == layer and letter in inputs
                }
            )
            if heads:
                hooks.append((act_name(f"{letter}_input", layer), patch_inputs(layer, letter, heads)))
    # Only the receivers' blocks need separate query/key/value inputs (they cost more than one input).
    x = resid[receiver_layers[0]].repeat(n, 1, 1)
    with model.settings(use_split_qkv_input=True), model.hooks(fwd_hooks=hooks):
        for layer in range(receiver_layers[0], cfg.n_layers):
            with model.settings(use_split_qkv_input=layer in receiver_layers):
                x = model(x, start_at_layer=layer, stop_at_layer=layer + 1)
    return _forward_logits(model, x, logit_pos, cfg.n_layers, buffer)


# ---------------------------------------------------------------------------------------------
# Attribution patching


def attribution_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    component: str = "z",
    positions: Positions = None,
    layers: Sequence[int] | None = None,
    direction: Direction = "denoise",
    metric_name: str = "metric",
    logit_pos: Pos = None,
) -> PatchResult:
    """Attribution patching (Nanda 2023): a first-order estimate of `activation_patching` with the
    same arguments and result layout, from one forward and one backward pass of the target run.

    For each site: metric(patched) ~= metric(target) + sum_site (source - target) * d metric / d act,
    the gradient taken on the target run (corrupted for denoising, clean for noising). Per prompt,
    since prompts do not interact. Exact when the metric is linear in the activation.
    Only activations get gradients (not weights), so the backward pass costs about one forward.
    """
    clean, corrupted = _check_pair(model, clean, corrupted)
    _check_logit_pos(logit_pos, clean)
    source_tokens, target_tokens = _source_target(clean, corrupted, direction)
    dims, coords, sites = _component_grid(model, component, layers, positions, clean.shape[1])
    names = sorted({site.name for site in sites})
    with model.settings(**_settings_for(component)):
        source_logits, source = _cached_run(model, source_tokens, names, logit_pos)
        target = {}

        def keep(act: Tensor, hook) -> None:
            target[hook.name] = act

        with torch.enable_grad(), model.hooks(fwd_hooks=[(name, keep) for name in names]):
            target_metric = metric(forward_logits(model, target_tokens, logit_pos))
            _apply_metric(lambda _: target_metric, None, target_tokens.shape[0])  # checks shape and NaN
            grads = torch.autograd.grad(target_metric.sum(), [target[name] for name in names])
    # (source - target) * gradient, per element: [batch, ...] for every hook.
    products = {
        name: ((source[name] - act.detach()) * grad).float()
        for name, act, grad in zip(names, [target[n] for n in names], grads, strict=True)
    }
    base = target_metric.detach().float().cpu()
    values = torch.stack(
        [
            base
            + (products[s.name] * site_mask(s, products[s.name].shape, products[s.name].device))
            .flatten(1)
            .sum(-1)
            .cpu()
            for s in sites
        ]
    )
    return PatchResult(
        values,
        _grid_index(component, dims, coords),
        dims,
        coords,
        metric_name,
        target=base,
        source=_apply_metric(metric, source_logits, target_tokens.shape[0]),
        method=f"attribution patching ({direction})",
    )


def compare_to_exact(attribution: PatchResult, exact: PatchResult) -> pd.DataFrame:
    """Side by side, per patch, the batch-mean exact and attribution values; attrs["correlation"]
    holds their Pearson correlation (both results must come from the same sweep)."""
    if attribution.dims != exact.dims or attribution.coords != exact.coords:
        raise ValueError("compare results of the same sweep (same component, layers and positions)")
    frame = exact.index.copy()
    frame["exact"] = exact.values.mean(-1).numpy()
    frame["attribution"] = attribution.values.mean(-1).numpy()
    stacked = torch.stack([exact.values.mean(-1), attribution.values.mean(-1)])
    frame.attrs["correlation"] = float(torch.corrcoef(stacked)[0, 1])
    return frame


def attribution_vs_exact(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    component: str = "z",
    **kwargs,
) -> pd.DataFrame:
    """Run attribution and exact activation patching on the same sweep and `compare_to_exact` them."""
    exact = activation_patching(model, clean, corrupted, metric, component, **kwargs)
    kwargs.pop("batch_size", None)
    attribution = attribution_patching(model, clean, corrupted, metric, component, **kwargs)
    return compare_to_exact(attribution, exact)
