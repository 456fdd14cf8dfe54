"""The intervention engine: every patched, ablated or read run goes through `run_site_sets`.

One primitive, an `Intervention`: a `Site` (a hook, optionally heads, positions and units of the
last axis) and a source of the values written there (a cached run such as the clean or corrupted
one, a tensor such as zeros or a mean over reference prompts, or a function of the activation).
A run makes a list of interventions; `run_site_sets` runs many such lists on one batch of prompts
and returns the metric of each (`read_site_sets`: activations instead of logits). Runs are sorted by
what they change, segment by segment (embeddings, each block, final norm), and walked breadth-first,
so runs that make the same interventions in the first blocks compute those blocks once; an
unchanged prefix comes from the target's cached run (`cached_run`, `start_names`), blocks whose z
every run of a pass overwrites skip the attention (`overwritten_z`), a run that changes only the
positions the metric reads is carried at those alone (`_Narrowed`), opt-in hook points are switched
on only in the blocks that use them (`hook_settings_for`), and logits are computed only at the
positions and for the tokens the metric reads (`forward_logits`, `logit_tokens`). Interventions
made in every run, the target's included (e.g. heads mean-ablated throughout), are a `base`.
Outside these runs, `intervention_hooks` and `intervened` make interventions in any forward pass,
and `read_with_grad` keeps activations for gradients with respect to them. Activation,
attribution and path patching (`interp.interventions.patching`, `.path_patching`), ablation
(`interp.interventions.ablation`) and the head report's causal checks are interventions plus this
scheduling.

    _, target = cached_run(model, corrupted, start_names(model), logits=False)
    _, clean_cache = cached_run(model, clean, ["blocks.3.attn.hook_z"], logits=False)
    values = run_site_sets(model, corrupted, [[Site("blocks.3.attn.hook_z", head=2)], []],
                           clean_cache, metric, target=target)
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from interp.checks import check_count, check_gradient_dtype, check_metric_output, check_token_pair
from interp.interventions.metrics import (
    AnswerMetric,
    Metric,
    check_reads_real_tokens,
    positions_read,
    refuse_padding,
)
from interp.model.cache import ActivationCache, act_name
from interp.model.hooks import HookPoint, opt_in_setting
from interp.model.kv_cache import HookedTransformerKeyValueCacheEntry
from interp.model.tokens import recorded_padding
from interp.model.transformer import HookedTransformer
from interp.types import Pos, Progress

_HEAD_FIRST = {"pattern", "attn_scores"}  # [batch, head, query_pos, key_pos]
_PER_HEAD = {"q", "k", "v", "z", "result", "rot_q", "rot_k", "q_input", "k_input", "v_input"}


@dataclass
class Site:
    """Overwrite `name` (a full hook name) where head/pos/unit select; None selects everything.

    head: int or list of ints, the head axis of per-head hooks ([batch, pos, head, d] or the
      pattern's [batch, head, q_pos, k_pos]); for hook_k/hook_v/k_input/v_input these are
      key/value heads under grouped-query attention.
    pos: int, list of ints, or LongTensor [batch] (one position per prompt); negative positions
      count from the end, as Python's and TransformerLens's; for patterns this is the query position.
    unit: int or list of ints on the last axis (MLP neurons in mlp.hook_post, d_head dims, ...).
    """

    name: str
    head: int | Sequence[int] | None = None
    pos: Pos = None
    unit: int | Sequence[int] | None = None

    @property
    def layer(self) -> int:
        """The block the hook lives in: -1 for embeddings, n_layers-like large for ln_final."""
        return _hook_layer(self.name)


@functools.cache
def _hook_layer(name: str) -> int:
    """`Site.layer` of a hook name (read for every intervention in every segment of a walk)."""
    match = re.match(r"blocks\.(\d+)\.", name)
    if match:
        return int(match.group(1))
    return -1 if name.startswith("hook_") else 10**9


def short_name(name: str) -> str:
    """The activation's kind in a hook name: "blocks.3.attn.hook_z" -> "z"."""
    return name.rsplit("hook_", 1)[-1]


def _indices(index: int | Sequence[int] | Tensor, what: str) -> Tensor:
    """`index` (an int, ints, or an integer tensor of at most one dim) as a tensor of ints; a boolean
    mask or floats are refused (cast, they would select positions 0 and 1, or truncated ones)."""
    indices = torch.as_tensor(index)
    if indices.dtype == torch.bool or indices.is_floating_point() or indices.is_complex() or indices.ndim > 1:
        raise ValueError(
            f"{what} must be an int, a list of ints or a 1-D integer tensor, got a {indices.ndim}-D "
            f"{indices.dtype} {'tensor' if isinstance(index, Tensor) else type(index).__name__}; for a "
            "boolean mask pass its indices, mask.nonzero()[:, 0].tolist()"
        )
    return indices


def _axis_mask(size: int, index: int | Sequence[int], what: str, device) -> Tensor:
    indices = _indices(index, what).to(device=device, dtype=torch.long).reshape(-1)
    if indices.numel() and (indices.min() < -size or indices.max() >= size):
        raise ValueError(f"{what} {index} out of range: this activation has {size} {what}s")
    mask = torch.zeros(size, dtype=torch.bool, device=device)
    mask[indices] = True
    return mask


def site_mask(site: Site, shape: torch.Size, device: torch.device | str = "cpu") -> Tensor:
    """Boolean mask, broadcastable to an activation of `shape` ([batch, ...]), of what `site` selects."""
    short = short_name(site.name)
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
        if isinstance(site.pos, Tensor) and site.pos.ndim == 1:
            pos = _indices(site.pos, "position").to(device)
            if pos.shape[0] != shape[0]:
                raise ValueError(f"per-prompt positions must be [batch={shape[0]}], got {tuple(pos.shape)}")
            n_pos = shape[pos_dim]
            if pos.min() < -n_pos or pos.max() >= n_pos:  # negative ones count from the end, as TL's
                raise ValueError(f"positions must lie in [-{n_pos}, {n_pos}), got {pos.min()}..{pos.max()}")
            pos = pos % n_pos
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


@dataclass(frozen=True)
class PerPrompt:
    """A source whose values depend on which prompts a pass runs (a resample ablation's draw, the
    means of the prompts' groups). `values(act, prompts)`: act [batch, ...], one copy of the pass's
    prompts; prompts [batch], their indices among the prompts the source serves (the `rows` of
    `intervention_hooks`), or None where the pass's rows are those prompts, in order -> values
    broadcastable to act. A pass that stacks copies of its prompts gives every copy the same values."""

    values: Callable[[Tensor, Tensor | None], Tensor]


Source = ActivationCache | Mapping[str, Tensor] | Tensor | PerPrompt | Callable[[Tensor], Tensor]
"""Where an intervention's values come from: a run's cached activations by hook name (an
ActivationCache or a dict; the clean or corrupted run's), a tensor broadcastable to the activation
[batch, ...] (zeros, a mean, a steering vector ...), values per prompt (`PerPrompt`), or a function of
the activation [batch, ...] -> its new values (broadcastable)."""


@dataclass(frozen=True, eq=False)
class Intervention:
    """Overwrite what `site` selects with values from `source` (see `Source`)."""

    site: Site
    source: Source

    def values(self, act: Tensor, prompts: Tensor | None = None) -> Tensor:
        """The values for activation `act` [batch, ...], on its device and in its dtype (prompts: the
        indices of act's rows, for a `PerPrompt` source)."""
        source = self.source
        if isinstance(source, Mapping | ActivationCache):
            if self.site.name not in source:
                raise ValueError(f"no source values for {self.site.name}; cache it in the source run")
            value = source[self.site.name]
        elif isinstance(source, Tensor):
            value = source
        elif isinstance(source, PerPrompt):
            value = source.values(act, prompts)
        else:
            value = source(act)
            if not isinstance(value, Tensor):
                raise TypeError(f"the source function for {self.site.name} returned {type(value).__name__}")
        return value.to(act.device, act.dtype)


def hook_settings_for(names: Iterable[str]) -> dict[str, bool]:
    """The opt-in hook settings (`model.settings(...)`) under which the hooks `names` fire."""
    return {setting: True for setting in {opt_in_setting(name) for name in names} - {None}}


def check_sites(model: HookedTransformer, site_sets: Sequence[Sequence[Site]]) -> None:
    """Raise a ValueError naming the closest hook names if a site's hook does not exist."""
    for sites in site_sets:
        for site in sites:
            try:
                model.check_hook_name(site.name)
            except KeyError as error:
                raise ValueError(f"unknown activation: {error.args[0]}") from None


def as_interventions(
    site_sets: Sequence[Sequence[Site | Intervention]], sources: Source | None
) -> list[list[Intervention]]:
    """Each run's interventions: a bare Site takes its values from `sources`."""
    runs = []
    for entries in site_sets:
        run = []
        for entry in entries:
            if isinstance(entry, Intervention):
                run.append(entry)
            elif isinstance(entry, Site):
                if sources is None:
                    raise ValueError(
                        f"{entry.name}: a bare Site needs `sources` (a cached run, a tensor or a function); "
                        "or pass Intervention(site, source)"
                    )
                run.append(Intervention(entry, sources))
            else:
                raise TypeError(f"a run is a list of Site or Intervention, got {type(entry).__name__}")
        runs.append(run)
    return runs


@dataclass(frozen=True, kw_only=True, eq=False)
class RunOptions:
    """How a function's many runs are made: the one `options=` keyword of the engine
    (`run_site_sets`, `read_site_sets`) and of the sweeps built on it (activation and path patching,
    ablation sweeps, distributed patching). Each function reads the fields its `takes_run_options` names and
    refuses the others when they are set (`refuse_unused`), so none is silently ignored.

    logit_pos: the positions the metric reads (None: every position; an int; a LongTensor [batch]):
      the logits are computed there only (see `forward_logits`).
    logit_tokens: the token ids the metric reads at logit_pos (e.g. each prompt's answers, any
      shape; with logit_pos): only their logits are computed, the others are NaN.
    batch_size: patched copies of the batch per forward pass (None: ~64 prompts per pass).
    progress(stage, done, total): the runs done, in runs' worth of blocks walked (the runs walked together
      finish at their last block), never lower than the runs finished (see `interp.types.Progress`).
    base: interventions made in every run before its own, the target run's included (e.g. heads
      mean-ablated throughout: `ablation.ablation_interventions`).
    """

    logit_pos: Pos = None
    logit_tokens: Tensor | None = None
    batch_size: int | None = None
    progress: Progress | None = None
    base: Sequence[Intervention] = ()

    def __post_init__(self) -> None:  # checked once, as the options are made
        if self.batch_size is not None:
            check_count(self.batch_size, "RunOptions.batch_size")
        if self.progress is not None and not callable(self.progress):
            raise TypeError(
                f"RunOptions.progress must be a callable progress(stage, done, total), got {self.progress!r}"
            )
        if isinstance(self.base, Intervention) or not isinstance(self.base, Sequence):
            raise TypeError(
                f"RunOptions.base must be a list of Interventions, got {type(self.base).__name__}"
            )

    def refuse_unused(self, function: str, used: Iterable[str]) -> None:
        """A TypeError naming the options set here that `function` does not read."""
        unused = [f.name for f in fields(self) if f.name not in used and _is_set(getattr(self, f.name))]
        if unused:
            raise TypeError(f"{function} does not read RunOptions' {', '.join(unused)}: leave them unset")


def takes_run_options(*reads: str) -> Callable[[Callable], Callable]:
    """A function's `options=`: the `RunOptions` fields it `reads` (the others refused when set,
    `refuse_unused`), and a run option passed as a keyword of its own (`batch_size=8`, as these
    functions took them before `RunOptions`) refused saying how to pass it
    (`options=RunOptions(batch_size=8)`); likewise the retired `metric_name`."""

    def decorate(function: Callable) -> Callable:
        parameters = inspect.signature(function).parameters
        assert parameters["options"].kind is inspect.Parameter.KEYWORD_ONLY, function  # read from kwargs
        names = {f.name for f in fields(RunOptions)} - set(parameters)

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            moved = sorted(names & kwargs.keys())
            if moved:
                given = ", ".join(f"{name}=..." for name in moved)
                where = f"options=RunOptions({given})"
                raise TypeError(f"{function.__name__} takes {', '.join(moved)} in {where}")
            if "metric_name" in kwargs:
                raise TypeError(
                    f"{function.__name__} takes no metric_name: its result is labelled 'metric'; relabel "
                    "it with dataclasses.replace(result, metric_name=...)"
                )
            kwargs.get("options", RunOptions()).refuse_unused(function.__name__, reads)
            return function(*args, **kwargs)

        return checked

    return decorate


def _is_set(value: Any) -> bool:
    return value is not None and not (isinstance(value, Sequence) and len(value) == 0)


@takes_run_options("logit_pos", "logit_tokens", "batch_size", "progress", "base")
def run_site_sets(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    site_sets: Sequence[Sequence[Site | Intervention]],
    sources: Source | None,
    metric: Metric,
    *,
    target: Mapping[str, Tensor] | None = None,
    options: RunOptions = RunOptions(),
) -> Float[Tensor, "n_sets batch"]:
    """Metric of each patched run: run i makes every intervention in site_sets[i] (a bare `Site` takes
    its values from `sources`: a cached source run, a tensor, a function; see `Intervention`).

    target: the target run's cached activations (`cached_run(model, tokens, start_names(model))`);
      with it a run starts at its earliest patched block, from the target's residual stream there,
      instead of at the embeddings.
    options: every field of `RunOptions` (progress: stage "patched runs"; the target run must have
      been cached with the base interventions, `cached_run(..., base=options.base)`).
    Returns the per-example metric [n_sets, batch]. An empty site set is the target run.
    A metric that would read right padding is refused (`metrics.check_reads_real_tokens`). An
    `AnswerMetric` reading logit_pos is given the logits there only ([batch, 1, d_vocab]).
    """
    runs = as_interventions(site_sets, sources)
    metric = check_reads_real_tokens(model, metric, tokens, logit_pos=options.logit_pos)
    batch = tokens.shape[0]
    values = torch.empty(len(runs), batch)
    one_position = _reads_logit_pos_only(metric, options.logit_pos, tokens)
    metric = metric.at_read_positions() if one_position else metric
    buffer = LogitBuffer(logit_columns(model, options.logit_tokens), one_position)

    def finish(indices: list[int], logits: Tensor) -> None:
        value = metric_values(metric, logits, batch)  # before the logit buffer is reused
        for i in indices:
            values[i] = value

    _walk(model, tokens, runs, _Walk(options, target, (), finish, buffer))
    return values


def _reads_logit_pos_only(metric: Metric, logit_pos: Pos, tokens: Tensor) -> bool:
    """Whether `metric` is an `AnswerMetric` that reads each prompt at its `logit_pos` (so that its
    logits elsewhere need not be held, even as NaN: [batch, pos, d_vocab] runs to gigabytes with a
    large vocabulary)."""
    if not isinstance(metric, AnswerMetric) or logit_pos is None:
        return False
    batch, n_pos = tokens.shape
    read = metric.positions(torch.arange(batch), n_pos).cpu()
    return torch.equal(read, positions_read(logit_pos, batch, n_pos, "logit_pos"))


@takes_run_options("batch_size", "progress", "base")
def read_site_sets(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    site_sets: Sequence[Sequence[Site | Intervention]],
    reads: Sequence[str],
    readout: Callable[[dict[str, Tensor]], Any],
    sources: Source | None = None,
    *,
    target: Mapping[str, Tensor] | None = None,
    options: RunOptions = RunOptions(),
) -> list[Any]:
    """`run_site_sets` that reads activations instead of logits: each run stops after the last block
    holding a hook of `reads` and gives readout({name: activation [batch, ...]}) (runs that share
    every block up to there share one readout call). A run that left a read hook's block unchanged
    reads the target's cached value there (`target` must hold it), so the target run itself is read
    from the cache. options: `RunOptions`' batch_size, progress and base (as in `run_site_sets`).
    Returns the readouts, one per site set."""
    if not reads:
        raise ValueError("reads is empty: name the hooks to read, or use run_site_sets for a metric")
    runs = as_interventions(site_sets, sources)
    reads = sorted(set(reads))
    out: list[Any] = [None] * len(runs)

    def finish(indices: list[int], captured: dict[str, Tensor]) -> None:
        missing = [name for name in reads if name not in captured]
        if missing and (target is None or any(name not in target for name in missing)):
            raise ValueError(f"the target cache lacks {missing}: cache them in the target run")
        value = readout({name: captured[name] if name in captured else target[name] for name in reads})
        for i in indices:
            out[i] = value

    _walk(model, tokens, runs, _Walk(options, target, reads, finish))
    return out


Group = tuple[list[int], Tensor | None, dict[str, Tensor]]
"""Runs that have made the same interventions so far, their residual stream (None: still the target
run's) and what they read so far."""


@dataclass
class _Walk:
    """What `_walk` does with the runs: made with `options`, from the `target` run's cache, read at
    `reads` (none: the logits, in `buffer`), each finished group handed to finish(runs, output)."""

    options: RunOptions
    target: Mapping[str, Tensor] | None
    reads: Sequence[str]
    finish: Callable[[list[int], Any], None]
    buffer: LogitBuffer | None = None


def _walk(model: HookedTransformer, tokens: Tensor, runs: list[list[Intervention]], walk: _Walk) -> None:
    """The scheduler behind `run_site_sets` and `read_site_sets`: runs sorted by what they patch,
    segment by segment (-1 embeddings, L block L, n_layers final norm and unembedding), walked
    breadth-first in chunks; finish(runs, logits) after the unembedding, or, with `reads`,
    finish(runs, {name: activation}) after the last block that holds a read hook. The `base`
    interventions are made in every block a run computes, before its own; they are part of the
    target run, so runs are sorted and shared by their own interventions only. Blocks run with
    the attention mask the forward pass gives `tokens` (left padding) and a shortformer model's
    positions (`shortformer_positions`). From the block on which every later block of a run
    overwrites all of z (`_narrow_from`), or from the block after its last intervention where
    every intervention writes at or after each prompt's read position only (`_narrow_after`), its
    residual stream is carried at the positions the metric reads only (`_Narrowed`): no attention
    reads the other positions there, or they hold the target's values, whose keys and values the
    read positions attend to (`_Prefix`)."""
    target, reads, finish, progress = walk.target, walk.reads, walk.finish, walk.options.progress
    [base] = as_interventions([walk.options.base], None)
    n_layers = model.cfg.n_layers
    mask = model.attention_mask_of(tokens)
    stop = max((_segment(Site(name), n_layers) for name in reads), default=n_layers)
    base = [iv for iv in base if _segment(iv.site, n_layers) <= stop]  # later ones change nothing read
    _check_runs(model, runs, base, reads, stop)
    made = {iv.site.name for run in [*runs, base] for iv in run}
    batch = tokens.shape[0]
    narrowed = None if reads else _Narrowed.of(walk.options.logit_pos, tokens)
    narrow_from = [n_layers] * len(runs)  # the block each run is narrowed from (n_layers: none)
    prefix = None
    if narrowed is not None:
        hooked = [_hooked(part) for part in [*model.blocks, model.ln_final]]  # per block, then the final norm
        narrow_from = [_narrow_from(model, [*base, *run], hooked) for run in runs]
        after = [_narrow_after(model, run, base, hooked, narrowed) for run in runs]
        if min(after, default=n_layers) < n_layers:
            prefix = _Prefix.of(model, tokens, base, min(after), narrowed, mask, target)
            narrow_from = [min(pair) for pair in zip(narrow_from, after, strict=True)]
    pos_embed = shortformer_positions(model, tokens, made)
    prompts = _Prompts(batch, walk.options.logit_pos, walk.buffer, mask, pos_embed, narrowed, prefix)
    batch_size = walk.options.batch_size or max(1, 64 // batch)
    source_ids: dict[int, int] = {}
    keys = [_segment_keys(run, n_layers, source_ids) for run in runs]
    order = sorted(range(len(runs)), key=lambda i: keys[i])
    node_bytes = tokens.numel() * model.cfg.d_model * torch.finfo(model.dtype).bits // 8
    chunk = max(batch_size, min(64, (2**29) // max(1, node_bytes)))  # runs walked together (~512 MiB)
    done, shown = [0], [0]  # runs finished; the count last reported (never lower)

    def blocks(i: int) -> int:  # the segments run i computes: from its first patched one, given a target
        first = -1 if target is None else next((s for s in range(-1, n_layers) if keys[i][s + 1]), n_layers)
        return max(0, stop - first + 1)

    def report(count: int) -> None:
        if progress and count > shown[0]:
            shown[0] = count
            progress("patched runs", count, len(runs))

    def finished(indices: list[int], output: Any) -> None:
        finish(indices, output)
        done[0] += len(indices)
        report(done[0])

    with torch.no_grad():
        for start in range(0, len(order), chunk):
            groups: list[Group] = [(order[start : start + chunk], None, {})]
            n_runs, to_walk, walked = len(groups[0][0]), sum(blocks(i) for i in groups[0][0]), 0
            for segment in range(-1, stop + 1):
                pending: list[tuple[list[int], Tensor, list[Intervention], dict[str, Tensor]]] = []
                next_groups: list[Group] = []
                for indices, resid, read in groups:
                    for key, sub in _group_by(indices, [keys[i][segment + 1] for i in indices]).items():
                        if resid is None and target is not None and not key and segment < n_layers:
                            next_groups.append((sub, None, read))  # still the target run
                            continue
                        parent = resid if resid is not None else _target_input(model, tokens, target, segment)
                        narrow_here = all(narrow_from[i] <= segment < n_layers for i in sub)
                        if narrowed is not None and narrow_here and not narrowed.carries(parent):
                            parent = narrowed.take(parent)
                        made_here = [*base, *runs[sub[0]]]
                        if resid is None and target is not None and 0 <= segment < n_layers:
                            made_here = [*_after_input(base, segment), *runs[sub[0]]]
                        here = [iv for iv in made_here if _segment(iv.site, n_layers) == segment]
                        pending.append((sub, parent, here, read))
                # a chunk's runs all finish at its last segment: meanwhile, the segments walked in runs' worth
                walked += sum(len(entry[0]) for entry in pending)
                report(done[0] + min(n_runs - 1, n_runs * walked // max(1, to_walk)))
                reads_here = [name for name in reads if _segment(Site(name), n_layers) == segment]
                for part in _passes(model, segment, pending, batch_size, narrowed):
                    copies = [(parent, here) for _, parent, here, _ in part]
                    outputs, captured = _segment_forward(model, segment, copies, reads_here, prompts)
                    for k, ((sub, _, _, read), out) in enumerate(zip(part, outputs, strict=False)):
                        if segment == n_layers:
                            finished(sub, out)  # each copy's logits, before the buffer is reused
                        else:
                            next_groups.append((sub, out, read | {n: c[k] for n, c in captured.items()}))
                groups = next_groups
            if stop < n_layers:
                for indices, _, read in groups:
                    finished(indices, read)


def _after_input(base: Sequence[Intervention], layer: int) -> list[Intervention]:
    """`base` less its interventions on block `layer`'s input (hook_resid_pre), for a run that starts
    from the target's cached input there, which was cached with them made (made again, an edit that
    reads its activation, e.g. steering, would be made twice)."""
    block_input = act_name("resid_pre", layer)
    return [intervention for intervention in base if intervention.site.name != block_input]


def _check_runs(
    model: HookedTransformer,
    runs: Sequence[Sequence[Intervention]],
    base: Sequence[Intervention],
    reads: Sequence[str],
    stop: int,
) -> None:
    """Refuse unknown hooks, sources that lack a site's values and interventions after the last
    segment read (`stop`), before any run."""
    made = [iv for run in [*runs, base] for iv in run]
    names = {iv.site.name for iv in made} | set(reads)
    after_blocks = sorted(
        name for name in reads if _segment(Site(name), model.cfg.n_layers) == model.cfg.n_layers
    )
    if after_blocks:
        raise ValueError(
            f"cannot read {after_blocks[0]}, after the last block: read "
            f"{act_name('resid_post', model.cfg.n_layers - 1)} and apply model.ln_final to it"
        )
    for name in names:  # each under its own setting (hook_attn_in's and hook_q_input's exclude each other)
        with model.settings(**hook_settings_for([name])):
            check_sites(model, [[Site(name)]])
    uncached = sorted(
        {iv.site.name for iv in made if isinstance(iv.source, Mapping) and iv.site.name not in iv.source}
    )
    if uncached:
        raise ValueError(f"no source values for {uncached}; cache them in the source run")
    n_layers = model.cfg.n_layers
    late = sorted({iv.site.name for run in runs for iv in run if _segment(iv.site, n_layers) > stop})
    if late:
        raise ValueError(f"{late} fire after the last hook read ({max(reads)}): they cannot change it")


def _passes(
    model: HookedTransformer, segment: int, pending: list[tuple], batch_size: int, narrowed: _Narrowed | None
) -> list[list[tuple]]:
    """The pending copies of a segment (their second field: the parent) cut into passes: those
    `narrowed` carries whose z is wholly overwritten (as many rows per pass as `batch_size` full
    copies), those it carries that attend to the target's other positions (`batch_size` copies a
    pass: each reads every position's keys), then full ones, those whose z is wholly overwritten
    first (their passes skip the attention)."""
    given, attending, full = [], [], []
    for entry in pending:
        overwrites = _overwrites_z(model, segment, entry[2])
        if narrowed is not None and narrowed.carries(entry[1]):
            (given if overwrites else attending).append(entry)
        else:
            full.append((not overwrites, entry))
    full = [entry for _, entry in sorted(full, key=lambda pair: pair[0])]  # stable: overwriting ones first
    size = batch_size * (1 if narrowed is None else narrowed.n_pos)
    passes = [given[i : i + size] for i in range(0, len(given), size)] + [
        part[i : i + batch_size] for part in (attending, full) for i in range(0, len(part), batch_size)
    ]
    return [cut for part in passes for cut in _apart_by_attention_input(part)]


def _apart_by_attention_input(part: list[tuple]) -> list[list[tuple]]:
    """A pass cut in two where its copies edit both hook_attn_in and hook_q/k/v_input, whose settings
    cannot both be on in one forward pass (hook_attn_in would not fire)."""
    if not any(iv.site.name.endswith("hook_attn_in") for entry in part for iv in entry[2]):
        return [part]  # the common pass: nothing more to read per copy
    needs = [hook_settings_for(iv.site.name for iv in entry[2]) for entry in part]
    attn_in = [entry for entry, need in zip(part, needs, strict=True) if need.get("use_attn_in")]
    if not any(need.get("use_split_qkv_input") for need in needs):
        return [part]
    return [attn_in, [entry for entry, need in zip(part, needs, strict=True) if not need.get("use_attn_in")]]


MIN_NARROWED_ROWS = 4
"""Fewer prompts are not narrowed: MKL multiplies matrices of 1-3 rows with other kernels, about twice
the rounding error of the rows of a larger product (up to 1e-3 in a logit diff of SmolLM2 with every
head ablated), while 4 rows or more give each row's bits as the full product does."""


@dataclass(frozen=True)
class _Narrowed:
    """Residual streams carried at the one position per prompt that the metric reads: [batch, 1, ...]
    for prompts of `n_pos` tokens, read at `positions` [batch]."""

    positions: Tensor
    n_pos: int

    @staticmethod
    def of(logit_pos: Pos, tokens: Tensor) -> _Narrowed | None:
        """The narrowing for a metric that reads `logit_pos` (an int or [batch]) of `tokens`; None
        where it reads every position, the prompts have one token, or there are fewer than
        `MIN_NARROWED_ROWS` prompts."""
        batch, n_pos = tokens.shape
        if logit_pos is None or n_pos == 1 or batch < MIN_NARROWED_ROWS:
            return None
        positions = torch.as_tensor(logit_pos).long().expand(batch) % n_pos
        return _Narrowed(positions, n_pos)

    def carries(self, values: Tensor) -> bool:
        """Whether `values` (a parent: tokens [batch, n_pos] or a residual stream) are already taken at
        the read positions ([batch, 1, ...])."""
        return values.ndim >= 3 and values.shape[1] == 1

    def take(self, values: Tensor) -> Tensor:
        """values [batch, n_pos, ...] at the read positions: [batch, 1, ...]."""
        rows = torch.arange(values.shape[0], device=values.device)
        return values[rows, self.positions.to(values.device)][:, None]

    def at_or_after(self, site: Site) -> bool:
        """Whether `site` writes at no position before a prompt's read position (those after it reach
        no read position through causal attention)."""
        if site.pos is None:
            return False
        pos = torch.as_tensor(site.pos).long() % self.n_pos
        if isinstance(site.pos, Tensor) and pos.ndim == 1:  # one position per prompt
            return bool((pos >= self.positions).all())
        return bool(pos.min() >= self.positions.max())


def _hooked(module: nn.Module) -> bool:
    """Whether a hook point of `module` has a hook (the caller's, or an intervention made as one)."""
    return any(point.has_hooks() for point in module.modules() if isinstance(point, HookPoint))


def _narrow_from(model: HookedTransformer, run: Sequence[Intervention], hooked: Sequence[bool]) -> int:
    """The first block from which every block of the run (its interventions `run`, the base's
    included) only overwrites all of z and is not `hooked` (by block, then the final norm: a hook of
    the caller's on it): the attention is not computed there, so no position but those the metric
    reads matters. n_layers where the last block does not, or where the run intervenes on, or the
    caller hooks, the final norm (its positions are the prompts')."""
    n_layers = model.cfg.n_layers
    here: dict[int, list[Intervention]] = {}
    for intervention in run:
        here.setdefault(_segment(intervention.site, n_layers), []).append(intervention)
    if here.get(n_layers) or hooked[n_layers]:
        return n_layers
    start = n_layers
    while start > 0:
        block, made = start - 1, here.get(start - 1, [])
        only_z = all(iv.site.name == act_name("z", block) for iv in made)
        if hooked[block] or not (only_z and _overwrites_z(model, block, made)):
            break
        start = block
    return start


def _narrow_after(
    model: HookedTransformer,
    run: Sequence[Intervention],
    base: Sequence[Intervention],
    hooked: Sequence[bool],
    narrowed: _Narrowed,
) -> int:
    """The block after a run's last intervention where each of its interventions writes at or after
    the prompts' read positions only (`_Narrowed.at_or_after`): from there every other position the
    read positions attend to holds the target run's values (causal attention), so the run is
    carried at the read positions, attending to the target's keys and values (`_Prefix`). n_layers
    where it is not: another intervention, the base's after the run's last, a hook of the caller's
    from there on (`hooked`: by block, then the final norm), or attention that is not causal or
    whose keys no hook gives (`_key_hook`)."""
    n_layers = model.cfg.n_layers
    if not run:
        return n_layers
    start = max(_segment(iv.site, n_layers) for iv in run) + 1
    if start >= n_layers or any(hooked[start:]) or any(_segment(iv.site, n_layers) >= start for iv in base):
        return n_layers
    if not all(narrowed.at_or_after(iv.site) for iv in run):
        return n_layers
    if any(_key_hook(model, layer) is None for layer in range(start, n_layers)):
        return n_layers
    return start


def _key_hook(model: HookedTransformer, layer: int) -> str | None:
    """The hook of block `layer`'s keys as its attention reads them (after rotary and any key norm);
    None where no hook gives them (a key norm without rotary, keys per query head, bidirectional
    attention)."""
    attention, cfg = model.blocks[layer].attn, model.cfg
    if not cfg.causal or (model.hook_settings.ungroup_grouped_query_attention and cfg.group_size > 1):
        return None
    if attention.rotary:
        return act_name("rot_k", layer)
    return act_name("k", layer) if cfg.qk_norm == "none" else None


@dataclass(frozen=True)
class _Prefix:
    """What runs carried at the read positions attend to besides themselves: the target run's keys and
    values of each block from the first such run's ([batch, pos, kv_head, d_head], as the attention
    reads them), which keys each read position sees (`key_mask` [batch, pos + 1]: its prompt's real
    tokens before it, then itself) and its position from its prompt's first real token (`positions`
    [batch, 1])."""

    keys_values: dict[int, tuple[Tensor, Tensor]]
    key_mask: Tensor
    positions: Tensor

    @staticmethod
    def of(
        model: HookedTransformer,
        tokens: Tensor,
        base: Sequence[Intervention],
        first: int,
        narrowed: _Narrowed,
        mask: Tensor | None,
        target: Mapping[str, Tensor] | None = None,
    ) -> _Prefix:
        """The target run's keys and values from block `first` on (from the `target` cache where it
        holds them, `start_names(model, keys_values=True)`; else one run of `tokens` with the `base`
        interventions, as the target's), seen from `narrowed`'s read positions; mask: the prompts'
        attention mask (None: every token real)."""
        layers = range(first, model.cfg.n_layers)
        names = {layer: (_key_hook(model, layer), act_name("v", layer)) for layer in layers}
        every = [name for pair in names.values() for name in pair]
        if target is not None and all(name in target for name in every):
            cache = target
        else:
            _, cache = cached_run(model, tokens, every, base=base, logits=False)
        batch, n_pos = tokens.shape
        real = torch.ones(batch, n_pos, dtype=torch.bool) if mask is None else mask.cpu().bool()
        before = real & (torch.arange(n_pos) < narrowed.positions.cpu()[:, None])
        key_mask = torch.cat([before, torch.ones(batch, 1, dtype=torch.bool)], 1).to(model.device)
        positions = before.sum(-1, keepdim=True).to(model.device)
        return _Prefix({layer: (cache[k], cache[v]) for layer, (k, v) in names.items()}, key_mask, positions)

    def forward(
        self, model: HookedTransformer, layer: int, resid: Tensor, pos_embed: Tensor | None
    ) -> Float[Tensor, "rows 1 d_model"]:
        """Block `layer` of stacked copies carried at the read positions (resid [copies * batch, 1,
        d_model]), each attending to the target's keys and values before its read position."""
        copies = resid.shape[0] // self.key_mask.shape[0]
        keys, values = self.keys_values[layer]
        entry = HookedTransformerKeyValueCacheEntry(
            keys.repeat(copies, 1, 1, 1), values.repeat(copies, 1, 1, 1), frozen=True
        )
        return model.blocks[layer](
            resid, past_kv_cache_entry=entry, attention_mask=self.key_mask.repeat(copies, 1),
            positions=self.positions.repeat(copies, 1), shortformer_pos_embed=pos_embed,
        )  # fmt: skip


def shortformer_positions(
    model: HookedTransformer, tokens: Tensor, patched: Iterable[str] = ()
) -> Float[Tensor, "batch pos d_model"] | None:
    """A shortformer model's positions of `tokens` (what its blocks add to their query and key inputs,
    not held by the residual stream the engine carries between blocks); None for other models. Runs
    that patch hook_pos_embed there are refused: the patched positions would reach no block."""
    if model.cfg.positional != "shortformer":
        return None
    if "hook_pos_embed" in patched:
        raise ValueError(
            "hook_pos_embed of a shortformer model feeds every block's queries and keys, not the residual "
            "stream that patched runs carry between blocks: patch it with model.hooks(...) around an "
            "ordinary forward pass instead."
        )
    with torch.no_grad():
        return model.input_to_embed(tokens)[2]


def _target_input(
    model: HookedTransformer, tokens: Tensor, target: Mapping[str, Tensor] | None, segment: int
):
    """What segment `segment` of the target run starts from: its tokens, or its cached residual stream."""
    if segment == -1:
        return tokens
    name = final_resid_hook(model) if segment == model.cfg.n_layers else act_name("resid_pre", segment)
    if target is None or name not in target:
        raise ValueError(f"the target cache lacks {name}: cache start_names(model) in the target run")
    return target[name]


def _segment(site: Site, n_layers: int) -> int:
    """The segment a site's hook fires in: -1 embeddings, L block L, n_layers final norm/unembed."""
    return max(-1, min(site.layer, n_layers))


def _site_key(intervention: Intervention, source_ids: dict[int, int]) -> str:
    def plain(value) -> object:  # a tensor of positions is one per prompt, a list the same for every one
        if isinstance(value, Tensor):
            return ("tensor", tuple(value.shape), tuple(value.reshape(-1).tolist()))
        return tuple(value) if isinstance(value, Sequence) else value

    site = intervention.site
    source = source_ids.setdefault(id(intervention.source), len(source_ids))  # in order of first use
    return repr((site.name, plain(site.head), plain(site.pos), plain(site.unit), source))


def _segment_keys(run: Sequence[Intervention], n_layers: int, source_ids: dict[int, int]) -> tuple[str, ...]:
    """Per segment (-1 .. n_layers), a comparable key of the interventions made there ("" for none),
    in the order they are made (a later one overwrites an earlier one where they overlap)."""
    per_segment = [[] for _ in range(n_layers + 2)]
    for intervention in run:
        per_segment[_segment(intervention.site, n_layers) + 1].append(_site_key(intervention, source_ids))
    return tuple("|".join(keys) for keys in per_segment)


def _group_by(items: Sequence[int], keys: Sequence[str]) -> dict[str, list[int]]:
    """items grouped by their keys, in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for item, key in zip(items, keys, strict=True):
        groups.setdefault(key, []).append(item)
    return groups


@dataclass(frozen=True)
class _Prompts:
    """What every pass of a walk shares: the number of prompts, the positions the metric reads, the
    logit buffer, the prompts' attention mask [batch, pos] (None: nothing masked), their shortformer
    positions [batch, pos, d_model] (None: the model has none), the narrowing of runs carried at
    the read positions only (None: none are) and the target's keys and values that those of them
    that attend read (None: none do)."""

    batch: int
    logit_pos: Pos
    buffer: LogitBuffer | None
    mask: Tensor | None
    pos_embed: Tensor | None
    narrowed: _Narrowed | None
    prefix: _Prefix | None


def _segment_forward(
    model: HookedTransformer,
    segment: int,
    part: Sequence[tuple[Tensor, list[Intervention]]],
    reads: Sequence[str],
    prompts: _Prompts,
) -> tuple[list[Tensor] | Iterator[Tensor], dict[str, Tensor]]:
    """Run one segment for stacked copies (parent residual stream or tokens, the interventions made in
    this segment): (the outputs split per copy, or after the last segment each copy's logits in turn
    in the buffer (`forward_logit_copies`); the read hooks' activations [copy, batch, ...]). Parents
    of one position where the prompts have more are carried at the read positions only (`_Narrowed`):
    every copy overwrites all of z here, or attends to the target's other positions (`_Prefix`)."""
    n, batch, mask, pos_embed = len(part), prompts.batch, prompts.mask, prompts.pos_embed
    narrowed = prompts.narrowed if prompts.narrowed and prompts.narrowed.carries(part[0][0]) else None
    by_name: dict[str, list[tuple[int, Intervention]]] = {}
    for i, (_, here) in enumerate(part):
        for intervention in here:
            by_name.setdefault(intervention.site.name, []).append((i, intervention))

    def make_hook(name: str):
        def hook(act: Tensor, hook) -> Tensor:
            act = act.unflatten(0, (n, batch)).clone()
            for i, intervention in by_name[name]:
                mask = site_mask(intervention.site, act.shape[1:], act.device)
                act[i] = torch.where(mask, intervention.values(act[i]), act[i])
            return act.flatten(0, 1)

        return hook

    captured: dict[str, Tensor] = {}

    def read(act: Tensor, hook) -> None:
        captured[hook.name] = act.unflatten(0, (n, batch))

    stacked = torch.cat([parent for parent, _ in part])
    given: AbstractContextManager = nullcontext()
    overwrites = all(_overwrites_z(model, segment, here) for _, here in part)
    if overwrites:
        # every copy overwrites all of z here: the attention need not compute it
        z_name = act_name("z", segment)
        cfg = model.cfg
        shape = (batch, stacked.shape[1] if narrowed is None else narrowed.n_pos, cfg.n_heads, cfg.d_head)
        z = [_given_z(model, segment, here, shape, stacked) for _, here in part]
        z = torch.cat(z if narrowed is None else [narrowed.take(copy) for copy in z])
        given = overwritten_z(model, segment, z)
        del by_name[z_name]
    hooks = [(name, make_hook(name)) for name in by_name] + [(name, read) for name in reads]
    if narrowed is not None:
        mask = None if mask is None else narrowed.take(mask)
        pos_embed = None if pos_embed is None else narrowed.take(pos_embed)
    copies = torch.ones(stacked.shape[:2], dtype=torch.long) if mask is None else mask.repeat(n, 1)
    with given, model.settings(**hook_settings_for([*by_name, *reads])), model.hooks(fwd_hooks=hooks):
        if segment == -1:
            out = model(stacked, stop_at_layer=0, attention_mask=copies)
        elif segment == model.cfg.n_layers:
            n_pos = None if narrowed is None else narrowed.n_pos
            logits = forward_logit_copies(
                model, stacked, batch, prompts.logit_pos, segment, prompts.buffer, n_pos
            )
            return logits, captured
        else:
            positions = None if pos_embed is None else pos_embed.repeat(n, 1, 1)
            if narrowed is not None and not overwrites:
                out = prompts.prefix.forward(model, segment, stacked, positions)
            else:
                out = model(
                    stacked, start_at_layer=segment, stop_at_layer=segment + 1, attention_mask=copies,
                    shortformer_pos_embed=positions,
                )  # fmt: skip
    return list(out.split(batch)), captured


def _covers_z(model: HookedTransformer, segment: int, intervention: Intervention) -> bool:
    """Whether an intervention overwrites every head's z of block `segment` at every position with
    values that do not depend on the activation."""
    site, n_heads = intervention.site, model.cfg.n_heads
    if site.name != act_name("z", segment) or site.pos is not None or site.unit is not None:
        return False
    source = intervention.source
    if isinstance(source, PerPrompt) or (callable(source) and not isinstance(source, Tensor | Mapping)):
        return False
    heads = range(n_heads) if site.head is None else _indices(site.head, "head").reshape(-1).tolist()
    return {head % n_heads for head in heads} == set(range(n_heads))


def _overwrites_z(model: HookedTransformer, segment: int, here: Sequence[Intervention]) -> bool:
    """Whether a run's interventions in block `segment` overwrite every head's z at every position, and
    those after the last that does are made without the forward pass (`_given_z`: not a `PerPrompt`
    source, whose values are placed by the pass's prompts)."""
    if not 0 <= segment < model.cfg.n_layers:
        return False
    on_z = [iv for iv in here if iv.site.name == act_name("z", segment)]
    covering = [i for i, iv in enumerate(on_z) if _covers_z(model, segment, iv)]
    return bool(covering) and not any(isinstance(iv.source, PerPrompt) for iv in on_z[covering[-1] + 1 :])


def _given_z(
    model: HookedTransformer, segment: int, here: Sequence[Intervention], shape: tuple[int, ...], like: Tensor
) -> Tensor:
    """One copy's z [batch, pos, head, d_head] in block `segment`: the values of the last intervention
    that covers all of it, then the interventions made after it."""
    on_z = [iv for iv in here if iv.site.name == act_name("z", segment)]
    first = max(i for i, iv in enumerate(on_z) if _covers_z(model, segment, iv))
    z = on_z[first].values(like).expand(shape)
    for intervention in on_z[first + 1 :]:
        z = torch.where(site_mask(intervention.site, shape, like.device), intervention.values(z), z)
    return z


def overwritten_z(model: HookedTransformer, layer: int, z: Tensor) -> AbstractContextManager:
    """A context in which block `layer`'s z [batch, pos, head, d_head] is overwritten by `z`, after any
    hooks the caller has on it: given to the attention (`model.given_z`, which then computes no
    q, k, v or pattern) when no hook is on hook_z, else a last hook on hook_z."""
    if model.blocks[layer].attn.hook_z.has_hooks():
        return model.hooks(fwd_hooks=[(act_name("z", layer), lambda act, hook: z)])
    return model.given_z({layer: z})


def metric_values(metric: Metric, logits: Tensor, batch: int) -> Float[Tensor, " batch"]:
    """metric(logits) checked to be one finite value per prompt, as float32 on the CPU."""
    value = check_metric_output(metric(logits), batch, finite=False)
    if not torch.isfinite(value).all():
        bad = int((~torch.isfinite(value)).nonzero()[0])
        raise ValueError(
            f"the metric is {value[bad].item()} on prompt {bad}: does it read logits outside logit_pos "
            "or logit_tokens (they are NaN there)? Pass the positions and tokens it reads, or None. Or are "
            "the model's own outputs NaN/inf? Check its weights with "
            "interp.checks.first_non_finite(model.state_dict())."
        )
    return value.detach().float().cpu().clone()  # not a view of logits that a buffer reuses


class LogitBuffer:
    """The logits at `logit_pos` of a pass that stacks copies of a batch, handed to the metric one
    copy at a time in one NaN tensor [batch, pos, d_vocab] reused by every pass of a sweep. A fresh
    NaN tensor per pass costs as much as the unembedding it saves, and one for all copies at once
    runs to gigabytes. A copy's logits are valid until the next copy is written, so its metric must
    be taken first.

    columns: the token ids [k] the metric reads (`logit_columns`); only their logits are computed
    (None: every token's). one_position: the metric reads the logits at `logit_pos` only, given as
    [batch, 1, d_vocab] (`AnswerMetric.at_read_positions`)."""

    def __init__(self, columns: Int[Tensor, " k"] | None = None, one_position: bool = False) -> None:
        self.columns = columns
        self.one_position = one_position
        self.logits: Tensor | None = None
        self.written: tuple[Tensor, ...] | None = None

    def copies(
        self, picked: Float[Tensor, "rows k"], pos: Int[Tensor, " rows"], n_pos: int, batch: int, d_vocab: int
    ) -> Iterator[Float[Tensor, "batch pos d_vocab"]]:
        """Each copy's logits in turn (rows i * batch .. (i + 1) * batch of `picked`), NaN except at
        `pos` (and, with columns, except the columns); with `one_position`, [batch, 1, d_vocab]."""
        if self.one_position:
            pos, n_pos = torch.zeros_like(pos), 1
        shape = (batch, n_pos, d_vocab)
        logits = self.logits
        kind = (shape, picked.dtype, picked.device)
        if logits is None or (logits.shape, logits.dtype, logits.device) != kind:
            logits = self.logits = picked.new_full(shape, float("nan"))
            self.written = None
        rows = torch.arange(batch, device=picked.device)
        for start in range(0, picked.shape[0], batch):
            if self.written is not None:
                logits[self.written] = float("nan")
            at = pos[start : start + batch]
            if self.columns is None:
                self.written = (rows, at)
            else:
                self.written = (rows[:, None], at[:, None], self.columns.to(picked.device)[None, :])
            logits[self.written] = picked[start : start + batch]
            yield logits


def logit_columns(model: HookedTransformer, logit_tokens: Tensor | None) -> Int[Tensor, " k"] | None:
    """The distinct token ids of `logit_tokens` (any shape: the tokens a metric reads, e.g. each
    prompt's answers), checked; None stays None (every token)."""
    if logit_tokens is None:
        return None
    tokens = torch.as_tensor(logit_tokens)
    if tokens.is_floating_point() or tokens.dtype == torch.bool or tokens.is_complex() or not tokens.numel():
        raise ValueError(
            f"logit_tokens must be integer token ids, got {tokens.dtype} of shape {tuple(tokens.shape)}"
        )
    if tokens.min() < 0 or tokens.max() >= model.cfg.d_vocab_out:
        raise ValueError(
            f"logit_tokens must lie in [0, {model.cfg.d_vocab_out}), "
            f"got {tokens.min().item()}..{tokens.max().item()}"
        )
    return tokens.reshape(-1).long().unique()


def forward_logits(
    model: HookedTransformer, input: Tensor, logit_pos: Pos = None, start_at_layer: int | None = None
) -> Float[Tensor, "batch pos d_vocab"]:
    """model(input, start_at_layer=...), with the logits computed only at `logit_pos`.

    logit_pos: None (every position), an int, or a LongTensor [batch] (tiled when the input
      stacks several copies of the batch). Logits elsewhere are NaN. Most metrics read one
      position per prompt (IOI's END), and the unembedding is a large part of a forward pass.
    """
    if logit_pos is None:
        return model(input, start_at_layer=start_at_layer)
    picked, pos, n_pos = _logits_at(model, input, logit_pos, start_at_layer, None)
    logits = picked.new_full((pos.shape[0], n_pos, picked.shape[-1]), float("nan"))
    logits[torch.arange(pos.shape[0], device=pos.device), pos] = picked
    return logits


def forward_logit_copies(
    model: HookedTransformer,
    input: Tensor,
    batch: int,
    logit_pos: Pos,
    start_at_layer: int | None,
    buffer: LogitBuffer,
    narrowed_from: int | None = None,
) -> Iterator[Float[Tensor, "batch pos d_vocab"]]:
    """`forward_logits` of an input that stacks copies of a batch [n * batch, ...], each copy's
    logits in turn: the forward pass runs now, each copy's logits are written into `buffer` as the
    iterator reaches them (with its `columns`, only those tokens' logits are computed at logit_pos).
    narrowed_from: the prompts' length where the input holds only the read positions [rows, 1, ...]."""
    if logit_pos is None:
        return iter(model(input, start_at_layer=start_at_layer).split(batch))
    picked, pos, n_pos = _logits_at(model, input, logit_pos, start_at_layer, buffer.columns, narrowed_from)
    return buffer.copies(picked, pos, n_pos, batch, model.cfg.d_vocab_out)


def _logits_at(
    model: HookedTransformer,
    input: Tensor,
    logit_pos: int | Tensor,
    start_at_layer: int | None,
    columns: Tensor | None,
    narrowed_from: int | None = None,
) -> tuple[Float[Tensor, "rows k"], Int[Tensor, " rows"], int]:
    """(the logits at logit_pos, of every token or of `columns`; those positions; the prompts'
    number of positions: the input's, or `narrowed_from` where the input holds only the read
    positions [rows, 1, ...]). An int logit_pos that lands on a prompt's padding is refused."""
    resid = model(input, start_at_layer=start_at_layer, stop_at_layer=model.cfg.n_layers)
    rows, n_pos = resid.shape[0], narrowed_from or resid.shape[1]
    if isinstance(logit_pos, int):
        pos = torch.full((rows,), logit_pos % n_pos, device=resid.device)
        if start_at_layer is None:  # token ids: each prompt's last real token is known
            last, first = model.last_positions(input), model.first_positions(input)
            refuse_padding(last, pos, n_pos, f"logit_pos={logit_pos} reads", first)
    else:
        pos = logit_pos.to(resid.device).repeat(rows // logit_pos.shape[0])
    at = pos if narrowed_from is None else torch.zeros_like(pos)
    picked = torch.arange(rows, device=resid.device), at
    if _hooked(model.ln_final):
        normed = model.ln_final(resid)[picked][:, None]  # its hooks see every position, as in a forward
    else:
        normed = model.ln_final(resid[picked][:, None])
    return model.unembed(normed, columns)[:, 0], pos, n_pos


def check_logit_pos(logit_pos: Pos, tokens: Tensor) -> None:
    """Refuse logit positions outside the prompts (or of the wrong shape) before any run."""
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


def resid_names(model: HookedTransformer) -> list[str]:
    """hook_resid_pre of every block."""
    return [act_name("resid_pre", layer) for layer in range(model.cfg.n_layers)]


def final_resid_hook(model: HookedTransformer) -> str:
    """The hook of the final residual stream (the last block's hook_resid_post)."""
    return act_name("resid_post", model.cfg.n_layers - 1)


def cached_run(
    model: HookedTransformer,
    tokens: Tensor,
    names: Iterable[str],
    logit_pos: Pos = None,
    base: Sequence[Intervention] = (),
    logits: bool = True,
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """(logits, {name: activation}) of one run, with the `base` interventions made in it (the cache
    holds what they wrote); the logits only at logit_pos (see forward_logits). logits=False: no
    unembedding (None; the final norm still runs, so its hooks are cached), for runs whose activations
    alone are read (a target run, a mean), where a large vocabulary makes the logits the costliest part."""
    names = sorted(set(names))
    cache: dict[str, Tensor] = {}

    def save(act: Tensor, hook) -> None:
        cache[hook.name] = act.detach()

    with torch.no_grad(), intervened(model, base), model.hooks(fwd_hooks=[(name, save) for name in names]):
        if not logits:
            model(tokens, return_type=None)
            return None, cache
        return forward_logits(model, tokens, logit_pos), cache


def intervention_hooks(
    interventions: Sequence[Intervention], rows: Int[Tensor, " batch"] | None = None
) -> list[tuple[str, Callable]]:
    """fwd_hooks (`model.hooks`, `run_with_hooks`) that make `interventions`, in order, in any forward
    pass: the one way a run outside `run_site_sets` writes activations.

    rows: the prompts the passes run, as indices into the per-prompt values of the sources (those
      whose leading axis is the batch: a cached run's activations [n, ...], per-prompt means), for
      passes on a sub-batch of the prompts the sources were made for; None: those prompts, in order.
    A pass may stack copies of its prompts along the batch (per-prompt values and positions are
    tiled); a source function is given the activation of the whole pass, a `PerPrompt` source that of
    one copy, with `rows`."""
    by_name: dict[str, list[Intervention]] = {}
    for intervention in as_interventions([interventions], None)[0]:
        by_name.setdefault(intervention.site.name, []).append(intervention)

    def make_hook(name: str):
        def hook(act: Tensor, hook) -> Tensor:
            for intervention in by_name[name]:
                act = _written(intervention, act, rows)
            return act

        return hook

    return [(name, make_hook(name)) for name in by_name]


@contextmanager
def intervened(
    model: HookedTransformer, interventions: Sequence[Intervention], rows: Int[Tensor, " batch"] | None = None
) -> Iterator[HookedTransformer]:
    """A context in which every forward pass of `model` makes `interventions` (`intervention_hooks`;
    rows: see there), with the opt-in hook points they write switched on."""
    names = {intervention.site.name for intervention in interventions}
    with model.settings(**hook_settings_for(names)):
        check_sites(model, [[intervention.site for intervention in interventions]])
        with model.hooks(fwd_hooks=intervention_hooks(interventions, rows)):
            yield model


def _written(intervention: Intervention, act: Tensor, rows: Tensor | None) -> Tensor:
    """act [batch, ...] (or stacked copies of the batch) with what the intervention selects
    overwritten; rows: see `intervention_hooks`."""
    site, source = intervention.site, intervention.source
    if isinstance(source, PerPrompt):  # made for one copy of the prompts `rows`, tiled over the others
        value = intervention.values(act[: act.shape[0] if rows is None else len(rows)], rows)
    else:
        value = intervention.values(act)
    per_prompt = value.ndim == act.ndim and value.shape[0] > 1
    if per_prompt and rows is not None and isinstance(source, Tensor | Mapping | ActivationCache):
        value = value[rows.to(value.device)]
    pos = site.pos
    if isinstance(pos, Tensor) and pos.ndim == 1:
        pos = _tiled(site.name, pos if rows is None else pos[rows.to(pos.device)], act.shape[0])
    value = _tiled(site.name, value, act.shape[0]) if per_prompt else value
    mask = site_mask(Site(site.name, site.head, pos, site.unit), act.shape, act.device)
    return torch.where(mask, value, act)


def _tiled(name: str, per_prompt: Tensor, rows: int) -> Tensor:
    """Per-prompt values [batch, ...] for a pass of `rows` rows that stacks copies of the batch."""
    batch = per_prompt.shape[0]
    if rows % batch:
        raise ValueError(f"{name}: a pass of {rows} rows is not copies of {batch} prompts")
    return per_prompt.repeat(rows // batch, *[1] * (per_prompt.ndim - 1))


@contextmanager
def read_with_grad(model: HookedTransformer, names: Iterable[str]) -> Iterator[dict[str, Tensor]]:
    """A context with gradients on in which every forward pass keeps the activations of the hooks
    `names` in the dict it gives, {name: activation [batch, ...]}, in the autograd graph, for
    gradients with respect to them (not the weights):

        with read_with_grad(model, names) as acts:
            score = metric(model(tokens))
            grads = torch.autograd.grad(score.sum(), [acts[name] for name in names])
    """
    check_gradient_dtype(model.dtype, "attribution patching")
    names = sorted(set(names))
    acts: dict[str, Tensor] = {}

    def keep(act: Tensor, hook) -> None:
        acts[hook.name] = act

    with torch.enable_grad(), model.settings(**hook_settings_for(names)):
        check_sites(model, [[Site(name) for name in names]])
        with model.hooks(fwd_hooks=[(name, keep) for name in names]):
            yield acts


def start_names(model: HookedTransformer, keys_values: bool = False) -> list[str]:
    """What a target run caches for `run_site_sets` to start runs anywhere: the residual stream before
    every block and after the last. keys_values: also each block's keys (as its attention reads them)
    and values, which runs that write at the metric's read positions only attend to (`_Prefix`): with
    them cached, `run_site_sets` does not run the target again to get them."""
    names = resid_names(model) + [final_resid_hook(model)]
    if keys_values:
        layers = [layer for layer in range(model.cfg.n_layers) if _key_hook(model, layer) is not None]
        names += [name for layer in layers for name in (_key_hook(model, layer), act_name("v", layer))]
    return names


def check_pair(
    model: HookedTransformer, clean, corrupted, patched: Literal["clean", "corrupted"] | None = "clean"
) -> tuple[Tensor, Tensor]:
    """Clean and corrupted prompts (text or token ids) as token batches of one [batch, pos] shape,
    each pair's first real token at one position (left padding alike: patching goes position by
    position, so another padding would write one prompt's tokens into the other's padding).
    patched: the run the other's values are written into (None: neither, e.g. a mean ablation); where
    both prompts' padding is known (text, ids from `to_tokens`), none of its tokens may face the
    other prompt's padding."""
    clean, corrupted = model.input_tokens(clean), model.input_tokens(corrupted)
    check_token_pair(clean, corrupted)
    firsts = [model.first_positions(tokens) for tokens in (clean, corrupted)]
    differ = (firsts[0] != firsts[1]).nonzero()[:, 0].tolist()
    if differ:
        raise ValueError(
            f"prompt pairs {differ[:8]} are left-padded differently (first real tokens at "
            f"{firsts[0][differ[:8]].tolist()} and {firsts[1][differ[:8]].tolist()}): patching goes position "
            "by position, so one prompt's tokens would be written into the other's padding; pair prompts of "
            "one length in tokens (model.to_str_tokens shows them)"
        )
    if patched is not None:
        _check_no_padding_patched_in(*((clean, corrupted) if patched == "clean" else (corrupted, clean)))
    return clean, corrupted


def _check_no_padding_patched_in(target: Tensor, source: Tensor) -> None:
    """Refuse pairs whose target prompt (the run patched) is real where its source prompt is padding,
    where both record their padding (`to_tokens`' masks; ids without one may hold padding unknown)."""
    real = [recorded_padding(tokens) for tokens in (target, source)]
    if real[0] is None or real[1] is None:
        return
    real = [mask.bool() for mask in real]
    facing = (real[0] & ~real[1].to(real[0].device)).any(-1).nonzero()[:, 0].tolist()
    if facing:
        i = facing[0]
        lengths = (
            f"{int(real[0][i].sum())} real tokens in the run patched, {int(real[1][i].sum())} in its source"
        )
        raise ValueError(
            f"prompt pairs {facing[:8]} have tokens of the run patched where their other prompts are "
            f"padding (pair {i}: {lengths}): patching goes position by position, so those tokens would "
            "take the other run's padding; pair prompts of one length in tokens (model.to_str_tokens "
            "shows them)"
        )
