"""Activation patching and attribution patching (path patching: `interp.interventions.path_patching`).

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

from collections.abc import Mapping, Sequence
from typing import Literal

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.catalog import COMPONENTS, HEAD_COMPONENTS
from interp.checks import check_distinct_pair, check_heads, check_layers, check_positions
from interp.interventions.engine import (
    Intervention,
    RunOptions,
    Site,
    Source,
    cached_run,
    check_logit_pos,
    check_pair,
    check_sites,
    forward_logits,
    hook_settings_for,
    metric_values,
    read_with_grad,
    run_site_sets,
    site_mask,
    start_names,
    takes_run_options,
)
from interp.interventions.metrics import Metric, check_differentiable, check_reads_real_tokens
from interp.interventions.results import PatchResult, grid_index
from interp.model import HookedTransformer
from interp.model.cache import act_name
from interp.types import Pos

Direction = Literal["denoise", "noise"]
PositionAxis = None | Literal["each"] | Sequence[int] | Mapping[str, Int[Tensor, " batch"]]
"""The positions a sweep patches, one per grid entry: None (all at once), "each", a list of positions,
or named per-prompt positions ({"S1": [batch], "END": [batch]})."""


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
    if isinstance(positions, Mapping):  # negative positions count from the end, as Python's and TL's
        values = [torch.as_tensor(p) for p in positions.values()]
        for name, p in zip(positions, values, strict=True):
            if p.is_floating_point() or p.dtype == torch.bool or p.is_complex():
                raise TypeError(
                    f"the positions of {name!r} must be integers, got dtype {p.dtype}; pass a LongTensor"
                )
            check_positions(p, n_pos, what=f"position of {name!r}")
        return list(positions), [p.long() for p in values]
    positions = check_positions(list(positions), n_pos)
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
    layers = list(range(cfg.n_layers)) if layers is None else check_layers(cfg, layers)
    pos_labels, site_pos = _position_axis(positions, n_pos)
    if component in HEAD_COMPONENTS:
        per_key_value_head = component in ("k", "v") and not cfg.ungroup_grouped_query_attention
        n_heads = cfg.n_kv_heads if per_key_value_head else cfg.n_heads  # ungrouped: a copy per query head
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


def _source_target(clean: Tensor, corrupted: Tensor, direction: Direction) -> tuple[Tensor, Tensor]:
    if direction == "denoise":
        return clean, corrupted
    if direction == "noise":
        return corrupted, clean
    raise ValueError(
        f"direction must be 'denoise' (corrupted run, clean activations) or 'noise', got {direction!r}"
    )


@takes_run_options("logit_pos", "logit_tokens", "batch_size", "progress")
def patch_sites(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    site_sets: Sequence[Site | Sequence[Site]],
    *,
    direction: Direction = "denoise",
    labels: Sequence[str] | None = None,
    options: RunOptions = RunOptions(),
) -> PatchResult:
    """The generic form: one patched run per entry of site_sets (a Site or a list patched together).

    Returns a PatchResult with dims ("patch",) labelled by `labels` (default: the hook names).
    options: `RunOptions`' logit_pos (the positions the metric reads: logits only there, NaN
      elsewhere), logit_tokens, batch_size and progress (the patched runs done, as `RunOptions` counts them).
    """
    logit_pos = options.logit_pos
    clean, corrupted = check_pair(model, clean, corrupted, _patched_run(direction))
    check_distinct_pair(clean, corrupted, "every patched run (the source run is the target run)")
    check_logit_pos(logit_pos, clean)
    metric = check_reads_real_tokens(model, metric, clean, corrupted, logit_pos=logit_pos)
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
    with model.settings(**hook_settings_for(names)):
        check_sites(model, site_sets)
        source_logits, sources = cached_run(model, source_tokens, names, logit_pos)
    target_logits, target = cached_run(model, target_tokens, start_names(model), logit_pos)
    values = run_site_sets(model, target_tokens, site_sets, sources, metric, target=target, options=options)
    index = pd.DataFrame({"component": labels, "layer": None, "head": None, "position": None})
    index["layer"] = [min((s.layer for s in sites), default=None) for sites in site_sets]
    return PatchResult(
        values=values,
        index=index,
        dims=("patch",),
        coords={"patch": labels},
        target=metric_values(metric, target_logits, target_tokens.shape[0]),
        source=metric_values(metric, source_logits, target_tokens.shape[0]),
        method=f"activation patching ({direction})",
    )


def _patched_run(direction: Direction) -> Literal["clean", "corrupted"]:
    """The run whose activations are replaced: the corrupted one when denoising, the clean when noising."""
    return "corrupted" if direction == "denoise" else "clean"


def patch(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"] | str | Sequence[str],
    metric: Metric,
    *,
    source: Int[Tensor, "batch pos"] | str | Sequence[str] | Source,
    head: tuple[int, int] | None = None,
    site: Site | None = None,
    pos: Pos = None,
    logit_pos: Pos = None,
) -> Float[Tensor, " batch"]:
    """The metric per prompt of the run on `tokens` with one head's output (its hook_z; at `pos`, else
    every position) or any `site` taken from `source`; the one-call form of activation patching.

    source: other prompts (token ids [batch, pos] or text, of the same shape: their run is cached and
      patched in, e.g. the corrupted prompts), or any `Source` of the engine (a cache, a tensor such
      as zeros, or a function of the activation).

        patched = interp.patch(model, clean, metric, head=(9, 6), source=corrupted)
        effect = patched - metric(model(clean))
    """
    tokens = model.input_tokens(tokens)
    if (head is None) == (site is None):
        raise ValueError("give exactly one of head=(layer, head) or site=Site(hook name, ...)")
    if head is not None:
        layer, index = check_heads(model.cfg, [head])[0]
        site = Site(act_name("z", layer), head=index, pos=pos)
    elif pos is not None:
        raise ValueError("with site=, put the positions in the Site: Site(name, pos=...)")
    if not isinstance(site, Site):
        raise TypeError(f"site must be an interp Site, got {type(site).__name__}")
    check_logit_pos(logit_pos, tokens)
    if isinstance(source, str) or (isinstance(source, Sequence) and not isinstance(source, Tensor)):
        source = model.input_tokens(source)
    if isinstance(source, Tensor) and not (source.is_floating_point() or source.is_complex()):
        tokens, source_tokens = check_pair(model, tokens, source, "clean" if site.pos is None else None)
        check_distinct_pair(tokens, source_tokens, "the patched run (the source run is the target run)")
        if site.pos is not None:
            _check_real_at(model, source_tokens, site.pos)
        with model.settings(**hook_settings_for([site.name])):
            _, source = cached_run(model, source_tokens, [site.name], logits=False)
    run = [Intervention(site, source)]
    return run_site_sets(model, tokens, [run], None, metric, options=RunOptions(logit_pos=logit_pos))[0]


def _check_real_at(model: HookedTransformer, source: Int[Tensor, "batch pos"], pos: Pos) -> None:
    """Refuse a site's positions `pos` (an int, ints, or one per prompt) where a source prompt is
    padding: its padding's activations would be written into the patched run."""
    n, n_pos = source.shape
    given = pos[:, None] if isinstance(pos, Tensor) else torch.tensor([pos] if isinstance(pos, int) else pos)
    written = given.cpu().expand(n, -1) % n_pos  # [batch, k]
    last, first = model.last_positions(source).cpu()[:, None], model.first_positions(source).cpu()[:, None]
    padding = (written > last) | (written < first)
    if bool(padding.any()):
        i, k = (int(index) for index in padding.nonzero()[0])
        raise ValueError(
            f"source prompt {i} is padding at position {int(written[i, k])} (its real tokens: "
            f"{int(first[i])}..{int(last[i])}), which the patch writes into the run: patch positions where "
            "both prompts are real, or pair prompts of one length in tokens (model.to_str_tokens shows them)"
        )


@takes_run_options("logit_pos", "logit_tokens", "batch_size", "progress")
def activation_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    component: str = "z",
    positions: PositionAxis = None,
    layers: Sequence[int] | None = None,
    *,
    direction: Direction = "denoise",
    options: RunOptions = RunOptions(),
) -> PatchResult:
    """Patch `component` at every layer (x head) x position from the source run into the target run.

    component: resid_pre, resid_mid, resid_post, attn_out, mlp_out ([layer, position] grid) or
      z, result, q, k, v, pattern (per head: [layer, head, position]; k and v index key/value heads).
    positions: None = all positions at once (label "all"); "each" = every position separately;
      a list of ints; or {name: LongTensor [batch]} for per-prompt positions (e.g. IOI's
      {"IO": ..., "S1": ..., "S2": ..., "END": ...}), labelled by name.
    metric: logits [batch, pos, d_vocab] -> [batch] (see interp.interventions.metrics).
    Each forward holds `options.batch_size` patched runs and starts at the patched layer.
    options: `RunOptions`' logit_pos (the positions the metric reads, e.g. END: the unembedding runs
      only there), logit_tokens (only their logits are computed in the patched runs), batch_size
      and progress (the patched runs done, as `RunOptions` counts them).
    The result's `metric_name` is "metric": label it with `dataclasses.replace(result, metric_name=...)`.
    """
    clean, corrupted = check_pair(model, clean, corrupted, _patched_run(direction))
    dims, coords, sites = _component_grid(model, component, layers, positions, clean.shape[1])
    result = patch_sites(model, clean, corrupted, metric, sites, direction=direction, options=options)
    result.index = grid_index(component, dims, coords)
    result.dims, result.coords = dims, coords
    return result


# ---------------------------------------------------------------------------------------------
# Attribution patching


@takes_run_options("logit_pos")
def attribution_patching(
    model: HookedTransformer,
    clean: Int[Tensor, "batch pos"],
    corrupted: Int[Tensor, "batch pos"],
    metric: Metric,
    component: str = "z",
    positions: PositionAxis = None,
    layers: Sequence[int] | None = None,
    *,
    direction: Direction = "denoise",
    options: RunOptions = RunOptions(),
) -> PatchResult:
    """Attribution patching (Nanda 2023): a first-order estimate of `activation_patching` with the
    same arguments and result layout, from one forward and one backward pass of the target run.

    For each site: metric(patched) ~= metric(target) + sum_site (source - target) * d metric / d act,
    the gradient taken on the target run (corrupted for denoising, clean for noising). Per prompt,
    since prompts do not interact. Exact when the metric is linear in the activation.
    Only activations get gradients (not weights), so the backward pass costs about one forward.
    options: `RunOptions`' logit_pos only (one pass: no batches, no logit_tokens, no progress).
    """
    logit_pos = options.logit_pos
    clean, corrupted = check_pair(model, clean, corrupted, _patched_run(direction))
    check_distinct_pair(clean, corrupted, "every patched run (the source run is the target run)")
    check_logit_pos(logit_pos, clean)
    metric = check_reads_real_tokens(model, metric, clean, corrupted, logit_pos=logit_pos)
    check_differentiable(metric, "attribution patching")
    source_tokens, target_tokens = _source_target(clean, corrupted, direction)
    dims, coords, sites = _component_grid(model, component, layers, positions, clean.shape[1])
    names = sorted({site.name for site in sites})
    with model.settings(**hook_settings_for(names)):
        source_logits, source = cached_run(model, source_tokens, names, logit_pos)
        with read_with_grad(model, names) as target:
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
        values=values,
        index=grid_index(component, dims, coords),
        dims=dims,
        coords=coords,
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
    """Run attribution and exact activation patching on the same sweep and `compare_to_exact` them
    (attribution patching takes the options' logit_pos only)."""
    exact = activation_patching(model, clean, corrupted, metric, component, **kwargs)
    options = RunOptions(logit_pos=kwargs.pop("options", RunOptions()).logit_pos)
    attribution = attribution_patching(model, clean, corrupted, metric, component, options=options, **kwargs)
    return compare_to_exact(attribution, exact)
