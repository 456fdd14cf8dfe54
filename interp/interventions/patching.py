"""Activation patching, path patching and attribution patching.

Two runs of the model on prompts of the same shape: `clean` (the behaviour we study) and
`corrupted` (a counterfactual, e.g. IOI with IO and S1 swapped). Patching copies activations from
a *source* run into a *target* run and measures a metric (see interp.interventions.metrics) per prompt:

  direction="denoise": target = corrupted, source = clean  (is this activation sufficient?)
  direction="noise":   target = clean, source = corrupted  (is this activation necessary?)

What is overwritten is a set of `Site`s, run by the intervention engine
(`interp.interventions.engine.run_site_sets`): sweeps batch several patched runs into one forward
pass and start each at the earliest patched layer from the target's cached residual stream, so
nothing upstream is recomputed.

Results are `PatchResult`s: per-example values [n_patches, batch], a labelled grid
(`result.mean()` with `result.dims`, `result.coords`) and tidy DataFrames with bootstrap CIs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Literal

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.interventions.engine import (
    LogitBuffer,
    Site,
    cached_run,
    check_logit_pos,
    check_pair,
    check_sites,
    final_resid_hook,
    forward_logits,
    metric_values,
    resid_names,
    resid_stack,
    run_site_sets,
    short_name,
    site_mask,
)
from interp.interventions.metrics import Metric
from interp.interventions.stats import bootstrap_ci
from interp.model import HookedTransformer
from interp.model.cache import act_name
from interp.types import Pos

Direction = Literal["denoise", "noise"]
PositionAxis = None | Literal["each"] | Sequence[int] | Mapping[str, Int[Tensor, " batch"]]
"""The positions a sweep patches, one per grid entry: None (all at once), "each", a list of positions,
or named per-prompt positions ({"S1": [batch], "END": [batch]})."""

# Components that activation/attribution patching sweep over, and whether they have a head axis.
RESID_COMPONENTS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
HEAD_COMPONENTS = ("z", "result", "q", "k", "v", "pattern")
COMPONENTS = RESID_COMPONENTS + HEAD_COMPONENTS


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


def _position_axis(positions: PositionAxis, n_pos: int) -> tuple[list, list[Pos]]:
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
    model: HookedTransformer,
    component: str,
    layers: Sequence[int] | None,
    positions: PositionAxis,
    n_pos: int,
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
    if any(short_name(n) == "result" for n in names):
        settings["use_attn_result"] = True
    if any(short_name(n) in ("q_input", "k_input", "v_input") for n in names):
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
    clean, corrupted = check_pair(model, clean, corrupted)
    check_logit_pos(logit_pos, clean)
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
        check_sites(model, site_sets)
        source_logits, sources = cached_run(model, source_tokens, names, logit_pos)
        target_logits, target_cache = cached_run(
            model, target_tokens, resid_names(model) + [final_resid_hook(model)], logit_pos
        )
        resid = resid_stack(model, target_cache)
        values = run_site_sets(model, target_tokens, site_sets, sources, metric, resid, batch_size, logit_pos)
    index = pd.DataFrame({"component": labels, "layer": None, "head": None, "position": None})
    index["layer"] = [min((s.layer for s in sites), default=None) for sites in site_sets]
    return PatchResult(
        values,
        index,
        ("patch",),
        {"patch": labels},
        metric_name,
        target=metric_values(metric, target_logits, target_tokens.shape[0]),
        source=metric_values(metric, source_logits, target_tokens.shape[0]),
        method=f"activation patching ({direction})",
    )


def activation_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    component: str = "z",
    positions: PositionAxis = None,
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
    metric: logits [batch, pos, d_vocab] -> [batch] (see interp.interventions.metrics).
    Each forward holds `batch_size` patched runs and starts at the patched layer.
    logit_pos: the positions the metric reads (int or LongTensor [batch], e.g. END): logits are
      computed only there, which saves the unembedding elsewhere. None: every position.
    """
    clean, corrupted = check_pair(model, clean, corrupted)
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
    sender_pos: Pos = None,
    receiver_pos: Pos = None,
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
    clean, corrupted = check_pair(model, clean, corrupted)
    check_logit_pos(logit_pos, clean)
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
    names |= set(resid_names(model)) | {final_resid_hook(model)}
    clean_logits, clean_cache = cached_run(model, clean, names, logit_pos)
    corrupted_logits, corrupted_cache = cached_run(model, corrupted, names, logit_pos)
    batch_size = batch_size or max(1, 64 // clean.shape[0])
    values = torch.empty(len(sender_sets), clean.shape[0])
    buffer = LogitBuffer()
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
                values[i] = metric_values(
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
        target=metric_values(metric, clean_logits, clean.shape[0]),
        source=metric_values(metric, corrupted_logits, clean.shape[0]),
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
    sender_pos: Pos,
    receiver_pos: Pos,
    freeze_mlps: bool,
    logit_pos: Pos,
    buffer: LogitBuffer,
) -> Float[Tensor, "n_sets*batch pos d_vocab"]:
    """Runs 2 and 3 of path patching for len(sender_sets) stacked copies of the clean run (the
    logits in `buffer`)."""
    cfg = model.cfg
    n = len(sender_sets)
    resid = resid_stack(model, clean)
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
            return forward_logits(model, run2, logit_pos, cfg.n_layers, buffer)
        recorded[stop] = run2.unflatten(0, (n, batch))
    elif to_logits:  # no sender before the end: the clean run
        return forward_logits(model, resid[-1].repeat(n, 1, 1), logit_pos, cfg.n_layers, buffer)
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
    return forward_logits(model, x, logit_pos, cfg.n_layers, buffer)


# ---------------------------------------------------------------------------------------------
# Attribution patching


def attribution_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    component: str = "z",
    positions: PositionAxis = None,
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
    clean, corrupted = check_pair(model, clean, corrupted)
    check_logit_pos(logit_pos, clean)
    source_tokens, target_tokens = _source_target(clean, corrupted, direction)
    dims, coords, sites = _component_grid(model, component, layers, positions, clean.shape[1])
    names = sorted({site.name for site in sites})
    with model.settings(**_settings_for(component)):
        source_logits, source = cached_run(model, source_tokens, names, logit_pos)
        target = {}

        def keep(act: Tensor, hook) -> None:
            target[hook.name] = act

        with torch.enable_grad(), model.hooks(fwd_hooks=[(name, keep) for name in names]):
            target_metric = metric(forward_logits(model, target_tokens, logit_pos))
            metric_values(lambda _: target_metric, None, target_tokens.shape[0])  # checks shape and NaN
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
        source=metric_values(metric, source_logits, target_tokens.shape[0]),
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
