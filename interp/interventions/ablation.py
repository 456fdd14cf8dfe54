"""Ablations: replace activations by zero, a reference mean, or another prompt's value.

What is ablated:
  heads   [(layer, head), ...]    at blocks.L.attn.hook_z [batch, pos, head, d_head] (that head's slice)
  mlps    [layer, ...]            at blocks.L.hook_mlp_out [batch, pos, d_model]
  neurons [(layer, neuron), ...]  at blocks.L.mlp.hook_post [batch, pos, d_mlp] (that unit)

What it becomes is an `Ablation` (its kind and reference prompts: the same for heads, MLPs, neurons
and edges). The default is "zero" where no reference prompts are needed (ablation_hooks, ablate,
ablation sweeps); functions given clean and corrupted prompts default to "counterfactual".

    with ablate(model, heads=[(9, 6), (9, 9)], ablation=Ablation("mean", reference=abc.tokens)):
        logits = model(clean.tokens)
    model.run_with_hooks(tokens, fwd_hooks=ablation_hooks(model, mlps=[0]))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import product
from typing import Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.checks import (
    RESAMPLE_MASK_ERROR,
    check_denominator,
    check_heads,
    check_int,
    check_layers,
    check_padding_mask,
    user_stacklevel,
)
from interp.interventions.engine import (
    Intervention,
    PerPrompt,
    RunOptions,
    Site,
    cached_run,
    check_logit_pos,
    intervened,
    intervention_hooks,
    metric_values,
    run_site_sets,
    start_names,
    takes_run_options,
)
from interp.interventions.metrics import Metric, check_reads_real_tokens
from interp.interventions.results import PatchResult
from interp.interventions.stats import faithfulness_ratio, masked_mean
from interp.model import HookedTransformer
from interp.model.cache import ActivationCache, act_name
from interp.model.tokens import (
    RunLayout,
    first_real,
    padding_mask,
    positions_of,
    record_padding,
    recorded_padding,
)
from interp.types import ABLATIONS, AblationKind, Head

Reference = Int[Tensor, "n_ref pos"] | str | Sequence[str] | ActivationCache | Mapping[str, Tensor]
"""Reference prompts: tokens [n_ref, pos], texts, or a cache of their activations (name -> [n_ref,
pos, ...])."""

GROUPS_ERROR = (
    "Ablation.groups must be a LongTensor [n_ref], one group per reference prompt (mean and resample "
    "ablations with a reference only)"
)


@dataclass(frozen=True, eq=False)
class Ablation:
    """What an ablated activation becomes (heads, MLPs, neurons and edges alike).

    kind:
      "zero":           0.
      "mean":           the mean over the reference prompts of the same activation, one mean per
                        position counted from each prompt's first real token (left padding of
                        references and, where the function takes the input prompts, of inputs is
                        skipped; the reference must be at least as long as the input); with
                        `groups` (e.g. IOI templates) one mean per group and position, each input
                        prompt getting its own group's mean (the inputs' groups [batch] are the
                        function's `groups`). Right-padded references need their `mask` (texts and
                        ids from `model.to_tokens` bring theirs), or the padding joins the means.
      "resample":       the activation of a random reference prompt (of the same group if `groups`
                        are given), drawn per input prompt with a generator seeded with `seed`: one
                        prompt for every ablated site, and the same draw in every run on as many
                        prompts.
      "counterfactual": the activation of the reference prompt paired with each input prompt
                        (reference[i] for prompt i: the corrupted prompt of a clean/corrupted pair).
    reference: tokens [n_ref, pos] (run once to cache the hooks), texts (tokenized by the model; the
      mask of their padding is the mask), or an ActivationCache (its run's padding is the mask; or a
      dict name -> [n_ref, pos, ...]) that already holds them (e.g. the clean run's own activations).
      Edge functions take tokens only and default to the corrupted prompts (mean, resample).
    mask: the reference's padding mask [n_ref, pos] (True or 1 at real tokens, False or 0 at padding;
      in edge functions without a reference, the corrupted prompts'): each position's mean is over the
      references real there; where none is there is no mean: refused where an input prompt is real,
      0 where it is padding (`check_means_defined`); zero and counterfactual ablation average
      nothing and ignore it; resample ablation refuses it.
    groups: the reference prompts' groups [n_ref] (mean and resample).
    seed: seeds resample's draw.

    `Ablation.of("mean")` is `Ablation("mean")`: every function that ablates takes either.
    """

    kind: AblationKind = "zero"
    reference: Reference | None = None
    mask: Int[Tensor, "n_ref pos"] | None = None
    groups: Int[Tensor, " n_ref"] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ABLATIONS:
            raise ValueError(f"unknown ablation {self.kind!r}; choose one of {', '.join(ABLATIONS)}")
        check_int(self.seed, "Ablation.seed")
        if self.mask is not None and self.kind == "resample":
            raise ValueError(RESAMPLE_MASK_ERROR)
        tokens = isinstance(self.reference, Tensor)
        if self.mask is not None:
            shape = tuple(self.reference.shape) if tokens and self.reference.ndim == 2 else (None, None)
            check_padding_mask(self.mask, *shape)
        if self.groups is not None and (
            self.kind not in ("mean", "resample")
            or self.reference is None
            or not isinstance(self.groups, Tensor)
            or self.groups.ndim != 1
            or (tokens and self.groups.shape[0] != self.reference.shape[0])
        ):
            raise ValueError(GROUPS_ERROR)

    @classmethod
    def of(cls, ablation: Ablation | AblationKind) -> Ablation:
        """`ablation` as an Ablation: a bare kind ("mean") is `Ablation(kind)`."""
        if isinstance(ablation, Ablation):
            return ablation
        if isinstance(ablation, str):
            return cls(ablation)
        raise TypeError(
            f"ablation must be an Ablation or one of {', '.join(ABLATIONS)}, got {type(ablation).__name__}"
        )

    def require_reference(self) -> None:
        """Refuse a kind that reads reference prompts without them (where no default reference exists)."""
        if self.kind != "zero" and self.reference is None:
            raise ValueError(
                f'{self.kind} ablation needs reference prompts: give Ablation("{self.kind}", reference=...) '
                "with tokens [n_ref, pos], texts or a cache (e.g. a corrupted dataset)"
            )


def ablation_sites(
    model: HookedTransformer,
    heads: Sequence[Head] = (),
    mlps: Sequence[int] = (),
    neurons: Sequence[tuple[int, int]] = (),
) -> list[Site]:
    """The sites to ablate, one per hook (heads of a layer share a site)."""
    cfg = model.cfg
    heads = check_heads(cfg, heads)
    mlps = check_layers(cfg, mlps, "MLP layer")
    neurons = [
        (check_int(unit[0], "a neuron's layer"), check_int(unit[1], "a neuron's index")) for unit in neurons
    ]
    for layer in list(mlps) + [layer for layer, _ in neurons]:
        if cfg.attn_only:
            raise ValueError("this model is attention-only: it has no MLPs or neurons to ablate")
        if not 0 <= layer < cfg.n_layers:
            raise ValueError(f"MLP layer {layer} out of range: the model has {cfg.n_layers} layers")
    for layer, neuron in neurons:
        if not 0 <= neuron < cfg.d_mlp:
            raise ValueError(f"neuron ({layer}, {neuron}) out of range: d_mlp is {cfg.d_mlp}")
    sites = []
    for layer in sorted({layer for layer, _ in heads}):
        sites.append(Site(act_name("z", layer), head=sorted(h for l_, h in heads if l_ == layer)))
    sites += [Site(act_name("mlp_out", layer)) for layer in sorted(set(mlps))]
    for layer in sorted({layer for layer, _ in neurons}):
        sites.append(Site(act_name("post", layer), unit=sorted(n for l_, n in neurons if l_ == layer)))
    return sites


def resample_draws(
    seed: int, batch: int, n_ref: int, allowed: Bool[Tensor, "batch n_ref"] | None = None
) -> Int[Tensor, " batch"]:
    """Each of `batch` input prompts' random reference prompt (an index < n_ref; among those `allowed`
    for it, where given), from `seed` alone: prompt i's draw is row i of the seed's random scores, the
    same for runs on any number of prompts. Resample ablation of heads and of edges draws with it."""
    scores = torch.rand(batch, n_ref, generator=torch.Generator().manual_seed(seed))
    return (scores if allowed is None else scores.masked_fill(~allowed, -1.0)).argmax(1)


KV_HOOKS = ("hook_k", "hook_v", "hook_rot_k", "hook_k_input", "hook_v_input")  # per key/value head


def warn_if_padded_without_mask(model: HookedTransformer, reference: Int[Tensor, "n_ref pos"]) -> None:
    """Warn where reference ids without a padding mask look padded: some rows end (or begin) in a longer
    run of the tokenizer's pad id than others, which the mean or the draws would take as tokens."""
    pad = None if model.tokenizer is None else model.tokenizer.pad_token_id
    if pad is None or reference.ndim != 2:
        return
    cfg = model.cfg
    for side in ("right", "left"):
        mask = padding_mask(reference.cpu(), pad, side, cfg.default_prepend_bos, cfg.bos_token_id)
        run = (mask == 0).sum(-1)
        if int(run.max()) > int(run.min()):
            rows = (run > run.min()).nonzero()[:, 0].tolist()
            warnings.warn(
                f"reference rows {rows[:8]} {'end' if side == 'right' else 'begin'} in more of the pad id "
                f"{pad} than others, and the ids carry no padding mask, so the ablation takes that padding "
                "as tokens; if it is padding, pass the ids as model.to_tokens returns them (a slice or copy "
                "loses their mask), the texts, or Ablation(..., mask=)",
                UserWarning,
                stacklevel=user_stacklevel(),
            )
            return


class Replacement:
    """The values that replace activations of the hooks `names` under `ablation` (`Ablation`).

    `values(name, batch, groups)` -> a tensor broadcastable to the activation [batch, pos, ...].
    """

    def __init__(self, model: HookedTransformer, names: Sequence[str], ablation: Ablation | AblationKind):
        ablation = Ablation.of(ablation)
        ablation.require_reference()
        reference, reference_mask = ablation.reference, ablation.mask
        if isinstance(reference, str | Sequence):  # texts
            reference, text_mask = model.to_tokens_and_mask(reference)
            if reference_mask is None and not bool(text_mask.all()):
                reference_mask = text_mask
        elif isinstance(reference, Tensor) and reference_mask is None:  # ids from to_tokens: their mask
            recorded = recorded_padding(reference)
            if recorded is None and ablation.kind in ("mean", "resample"):  # across prompts
                warn_if_padded_without_mask(model, reference)
            reference_mask = None if recorded is None or bool(recorded.all()) else recorded
        elif isinstance(reference, Tensor) and recorded_padding(reference) is None:
            # a mask given with bare ids: the reference run must mask the padding too (left padding would
            # otherwise be read as tokens); a copy carries it, the caller's ids are left as they are
            reference = record_padding(
                reference.clone(), check_padding_mask(reference_mask, *reference.shape[:2])
            )
        elif isinstance(reference, ActivationCache) and reference_mask is None:  # its run's padding
            real = reference.real_tokens
            reference_mask = None if real is None or bool(real.all()) else real
        cached = isinstance(reference, ActivationCache | Mapping)
        missing = [name for name in names if cached and ablation.kind != "zero" and name not in reference]
        if missing:
            raise ValueError(f"the reference cache lacks {missing}: cache these hooks in its run")
        if reference is None or not cached:
            shape = None if reference is None else reference.shape
        else:
            shape = next((reference[name].shape for name in names if name in reference), None)
        n_ref, n_pos = (None, None) if shape is None else shape[:2]
        if ablation.groups is not None and (n_ref is None or tuple(ablation.groups.shape) != (n_ref,)):
            raise ValueError(GROUPS_ERROR)
        if reference_mask is not None and ablation.kind == "resample":
            raise ValueError(RESAMPLE_MASK_ERROR)  # padded texts
        self.model, self.kind = model, ablation.kind
        self.ungrouped = model.hook_settings.ungroup_grouped_query_attention  # how k/v values are taken
        self.reference_mask = (
            None if reference_mask is None else check_padding_mask(reference_mask, n_ref, n_pos)
        )
        # each reference prompt's left padding (None: unknown), which counterfactual pairs must share
        self.reference_first = first_real(self.reference_mask)
        self.reference_groups = None if ablation.groups is None else ablation.groups.long().cpu()
        self.seed = ablation.seed
        self.draws: dict[tuple, Tensor] = {}  # (batch, groups) -> each input prompt's reference prompt
        self.acts: dict[str, Tensor] = {}
        if ablation.kind != "zero" and cached:
            self.acts = {name: reference[name] for name in names}  # name -> [n_ref, pos, ...]
        elif ablation.kind != "zero":
            with torch.no_grad():  # no logits: the run stops after the last block it caches
                _, cache = model.run_with_cache(reference, names_filter=list(names), return_type=None)
            self.acts = {name: cache[name] for name in names}
        if self.kind == "mean" and self.reference_mask is not None:  # left padding: from each start
            offsets = first_real(self.reference_mask)
            self.acts = {name: shifted(act, offsets) for name, act in self.acts.items()}
            self.reference_mask = shifted(self.reference_mask, offsets, fill=False)
        self.means = (
            {name: self._means(act) for name, act in self.acts.items()} if ablation.kind == "mean" else {}
        )

    def _means(self, act: Tensor) -> Float[Tensor, "group pos ..."]:
        """One mean per group of the reference prompts ([1, ...] without groups), in `_group_index` order."""
        if self.reference_groups is None:
            return self._mean(act, torch.ones(act.shape[0], dtype=torch.bool))[None]
        groups = self.reference_groups
        return torch.stack([self._mean(act, groups == label) for label in groups.unique()])

    def _group_index(self, groups: Int[Tensor, " batch"]) -> Int[Tensor, " batch"]:
        """Each input prompt's group as the index of its mean (`_means`); a group no reference prompt has
        is refused (its prompts would have no mean)."""
        labels, groups = self.reference_groups.unique(), groups.long().cpu()
        index = torch.searchsorted(labels, groups).clamp(max=len(labels) - 1)
        missing = sorted(set(groups[labels[index] != groups].tolist()))
        if missing:
            raise ValueError(
                f"input prompts of groups {missing} have no reference prompt of their group to take the mean "
                f"of (the reference prompts' groups are {labels.tolist()}); give reference prompts of every "
                "group the inputs have"
            )
        return index

    def _mean(self, act: Tensor, rows: Tensor) -> Float[Tensor, "pos ..."]:
        """The mean over the reference prompts `rows` [n_ref] (bool), over those real at each
        position if a mask was given."""
        selected = act[rows.to(act.device)]  # [n, pos, ...]
        if self.reference_mask is None:
            return selected.mean(0)
        real = self.reference_mask[rows.cpu()].view(*selected.shape[:2], *[1] * (act.ndim - 2))
        return masked_mean(selected, real, 0)

    def values(
        self, name: str, batch: int, groups: Int[Tensor, " n"] | None = None, prompts: Tensor | None = None
    ) -> Tensor:
        """The values for `batch` input prompts: prompts 0 .. batch - 1 of those `groups` [n] labels, or
        those of the indices `prompts` [batch] (`PerPrompt`). Rows per prompt [batch, pos, ...] (resample,
        counterfactual, grouped means) or [1, pos, ...]."""
        if self.kind == "zero":
            return torch.zeros(())
        self._check_grouping(name)
        if (groups is None) != (self.reference_groups is None):
            raise ValueError("give groups for the input prompts exactly when the Ablation has groups")
        rows = torch.arange(batch) if prompts is None else prompts.long().cpu()
        if self.kind == "mean":
            means = self.means[name]
            return means if groups is None else means[self._group_index(groups.long().cpu()[rows])]
        n_ref, n_inputs = self.acts[name].shape[0], int(rows.max()) + 1  # inputs 0 .. the last one here
        if self.kind == "counterfactual":
            if n_ref != n_inputs if prompts is None else n_inputs > n_ref:
                raise ValueError(
                    f"counterfactual ablation pairs reference prompt i with input prompt i: "
                    f"{n_ref} reference prompts for {n_inputs} inputs"
                )
            return self.acts[name][rows]
        return self.acts[name][self._drawn(n_ref, n_inputs if groups is None else len(groups), groups)[rows]]

    def _check_grouping(self, name: str) -> None:
        """Refuse values of a key or value hook taken per key/value head for a run that has one per query
        head (`ungroup_grouped_query_attention`), or the reverse: their shapes differ."""
        now = self.model.hook_settings.ungroup_grouped_query_attention
        per_group = name.split(".")[-1] in KV_HOOKS and self.model.cfg.group_size > 1
        if per_group and now != self.ungrouped:
            taken, runs = (
                ("per query head", "per key/value head")
                if self.ungrouped
                else ("per key/value head", "per query head")
            )
            raise ValueError(
                f"{name}'s ablation values were taken {taken} (ungroup_grouped_query_attention="
                f"{self.ungrouped}) and this run has them {runs}: make the ablation under the setting it "
                "runs with (model.settings(ungroup_grouped_query_attention=...))"
            )

    def _drawn(self, n_ref: int, batch: int, groups: Int[Tensor, " batch"] | None) -> Int[Tensor, " batch"]:
        """Each input prompt's random reference prompt (of its group), drawn once for runs on `batch`
        prompts of these groups: every site and every run of them reads the same reference prompt. Prompt
        i's draw is row i of the seed's random scores: the same for runs on any number of prompts."""
        key = (batch, None if groups is None else tuple(groups.long().cpu().tolist()))
        if key not in self.draws:
            same = None
            if groups is not None:
                same = groups.long().cpu()[:, None] == self.reference_groups[None, :]
                if not same.any(1).all():
                    raise ValueError("some input prompts' groups have no reference prompt to resample from")
            self.draws[key] = resample_draws(self.seed, batch, n_ref, same)
        return self.draws[key]

    def sources(
        self,
        names: Sequence[str],
        tokens: Int[Tensor, "batch pos"],
        groups: Int[Tensor, " batch"] | None = None,
    ) -> dict[str, Tensor]:
        """name -> the values for runs on `tokens` (their `groups` [batch] pick per-group values),
        broadcastable to the activation [batch, pos, ...] (`placed`)."""
        real = self.model._real_tokens(tokens, {})
        layout = RunLayout(None if real is None else positions_of(real), (real,), 0, tokens.shape[1])
        batch = tokens.shape[0]
        self.check_pairs_aligned(torch.arange(batch), layout)
        return {name: self.placed(name, self.values(name, batch, groups), layout, batch) for name in names}

    def check_pairs_aligned(self, rows: Int[Tensor, " batch"], layout: RunLayout) -> None:
        """Refuse counterfactual ablation of input prompts (`rows` of the reference's pairs, run as
        `layout` says) left-padded otherwise than their reference prompts, where both paddings are known:
        values are placed by index, so each pair must start at one position (as `engine.check_pair`)."""
        if self.kind != "counterfactual" or self.reference_first is None or layout.n_cached:
            return
        real = layout.real
        inputs = torch.zeros(len(rows), dtype=torch.long) if real is None else first_real(real)[: len(rows)]
        references = self.reference_first[rows.long().cpu()]
        differ = (inputs != references).nonzero()[:, 0].tolist()
        if differ:
            raise ValueError(
                f"counterfactual ablation places the reference prompt's values by index, but input prompts "
                f"{differ[:8]} start at positions {inputs[differ[:8]].tolist()} and their reference prompts "
                f"at {references[differ[:8]].tolist()} (padded otherwise): pair prompts of one length in "
                "tokens, padded alike (model.to_str_tokens shows them)"
            )

    def placed(self, name: str, value: Tensor, layout: RunLayout, rows: int) -> Tensor:
        """`value` [1 or rows, n, ...] (`values`) placed on `rows` prompts of a run (`layout`): mean and
        resample values by position (each prompt's position p, counted from its first real token, takes
        the reference's position p, so left padding and a KV cache's tokens are counted as the model
        counts them), counterfactual ones by index (prompt pairs share their layout). A mean undefined
        at a position (no reference prompt real there) is refused where a prompt is real, 0 at padding."""
        if value.ndim < 2 or value.shape[1] == 1:
            return value
        n_pos, real = layout.positions.shape[1], layout.real
        if self.kind == "counterfactual":  # by index: the pair's tokens, after a KV cache's
            at = torch.arange(layout.n_cached, layout.n_cached + n_pos)[None]
        else:
            at = layout.positions.cpu()
        if rows < at.shape[0]:  # one copy of a pass that stacks copies of the batch: their layout's first
            at, real = at[:rows], None if real is None else real[:rows]
        if int(at.max()) >= value.shape[1]:
            raise ValueError(
                f"{name}: the input reaches position {int(at.max())} but the reference has only "
                f"{value.shape[1]} positions; mean, resample and counterfactual ablations need reference "
                "prompts at least as long as the input"
            )
        first = int(at[0, 0])
        if at.shape[0] == 1 and bool((at[0] == torch.arange(first, first + n_pos)).all()):
            value = value[:, first : first + n_pos]
        else:
            n_rows = max(value.shape[0], at.shape[0])
            trailing = [1] * (value.ndim - 2)
            index = at.expand(n_rows, n_pos).view(n_rows, n_pos, *trailing).to(value.device)
            value = value.expand(n_rows, *value.shape[1:]).gather(
                1, index.expand(n_rows, n_pos, *value.shape[2:])
            )
        if self.kind != "mean" or self.reference_mask is None:
            return value
        return _defined_means(name, value, lambda: real)

    def interventions(
        self,
        sites: Sequence[Site],
        tokens: Int[Tensor, "batch pos"] | None = None,
        groups: Int[Tensor, " batch"] | None = None,
    ) -> list[Intervention]:
        """The interventions that ablate `sites` in runs on `tokens` (`sources`); without tokens, in
        any forward pass on prompts no longer than the reference (placed on its tokens as it runs,
        `HookedTransformer.run_layout`; resample ablation's draw is the same in every run on as many
        prompts)."""
        if tokens is not None:
            sources = self.sources([site.name for site in sites], tokens, groups)
            return [Intervention(site, sources[site.name]) for site in sites]

        def fitted(name: str) -> PerPrompt:
            def values(act: Tensor, prompts: Tensor | None) -> Tensor:
                layout = self.model.run_layout
                if layout is None:
                    raise RuntimeError(
                        f"{name}: an ablation's values are placed in a forward pass of its model"
                    )
                batch = len(groups) if prompts is None and groups is not None else act.shape[0]
                self.check_pairs_aligned(torch.arange(act.shape[0]) if prompts is None else prompts, layout)
                return self.placed(name, self.values(name, batch, groups, prompts), layout, act.shape[0])

            return PerPrompt(values)

        return [Intervention(site, fitted(site.name)) for site in sites]


def check_means_defined(
    undefined: Bool[Tensor, "rows pos"], real: Bool[Tensor, "batch pos"] | None, where: str
) -> None:
    """Refuse a mean ablation that would write an undefined mean (no reference prompt real at the
    position: `undefined`, rows 1 or batch) at a real token of an input prompt (`real`; None: every
    token is real). Where only padding takes it, the caller writes 0 instead of NaN: a NaN there
    would reach the real tokens through attention (0 x NaN)."""
    needed = torch.ones_like(undefined, dtype=torch.bool) if real is None else real.to(undefined.device)
    bad = undefined & needed
    if bool(bad.any()):
        prompt, pos = bad.nonzero()[0].tolist()
        raise ValueError(
            f"{where}: input prompt {prompt} is real at position {pos}, where none of the reference prompts "
            "(of its group) is, so mean ablation has no mean to write there; give reference prompts at least "
            "as long as each input prompt (e.g. the longer prompts of the pair), or ablate with zero or "
            "counterfactual"
        )


def _defined_means(name: str, values: Tensor, real: Callable[[], Tensor | None]) -> Tensor:
    """Mean-ablation values [rows, pos, ...] for runs on prompts whose real tokens are `real()`:
    refused where a real token would take an undefined (NaN) mean, 0 where only padding does."""
    undefined = values.isnan()
    if not bool(undefined.any()):
        return values
    check_means_defined(undefined.flatten(2).any(-1) if values.ndim > 2 else undefined, real(), name)
    return values.masked_fill(undefined, 0.0)


def shifted(values: Tensor, by: Int[Tensor, " rows"], fill: float | bool = torch.nan) -> Tensor:
    """values [1 or rows, pos, ...] with row i's position p taken from its position p + by[i], `fill`
    where that is outside [0, pos): by = the rows' left padding (`first_real`) moves left-padded prompts
    to start at 0; by = minus it puts values counted from a prompt's start after its padding."""
    values = values.expand(len(by), *values.shape[1:])
    index = torch.arange(values.shape[1])[None] + by[:, None]  # [rows, pos]
    outside = ((index < 0) | (index >= values.shape[1])).to(values.device)
    index = index.clamp(0, values.shape[1] - 1).to(values.device)
    trailing = [1] * (values.ndim - 2)
    moved = values.gather(1, index.view(*index.shape, *trailing).expand_as(values))
    return moved.masked_fill(outside.view(*outside.shape, *trailing), fill)


def ablation_interventions(
    model: HookedTransformer,
    heads: Sequence[Head] = (),
    mlps: Sequence[int] = (),
    neurons: Sequence[tuple[int, int]] = (),
    ablation: Ablation | AblationKind = "zero",
    *,
    groups: Int[Tensor, " batch"] | None = None,
) -> list[Intervention]:
    """The engine's interventions that ablate heads, MLP layers and neurons, in runs on any prompts
    no longer than the reference (`Replacement.interventions`): e.g. the `base` of a patching run.

    ablation: an `Ablation` (its kind and reference prompts) or a kind that needs none ("zero").
    groups: the input prompts' groups [batch] (with the Ablation's groups: per-group means/resampling).
    """
    sites = ablation_sites(model, heads, mlps, neurons)
    replacement = Replacement(model, [s.name for s in sites], ablation)
    return replacement.interventions(sites, groups=groups)


def ablation_hooks(model: HookedTransformer, *args, **kwargs) -> list[tuple[str, Callable]]:
    """fwd_hooks for model.run_with_hooks / model.hooks that ablate heads, MLP layers and neurons
    (the arguments of `ablation_interventions`; `engine.intervention_hooks`)."""
    return intervention_hooks(ablation_interventions(model, *args, **kwargs))


@contextmanager
def ablate(model: HookedTransformer, *args, **kwargs) -> Iterator[HookedTransformer]:
    """Context manager: `with ablate(model, heads=[(9, 6)], ablation=Ablation("mean", reference=tokens)): ...`
    (the arguments of `ablation_interventions`; `engine.intervened`)."""
    with intervened(model, ablation_interventions(model, *args, **kwargs)):
        yield model


@takes_run_options("logit_pos", "logit_tokens", "batch_size", "progress")
def ablated_metrics(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    head_sets: Sequence[Sequence[Head]],
    replacement: Replacement,
    *,
    groups: Int[Tensor, " batch"] | None = None,
    options: RunOptions = RunOptions(),
) -> Float[Tensor, "n_sets batch"]:
    """The metric per prompt with each set of heads ablated by `replacement` (its hooks must cover
    the sets' layers' hook_z), e.g. every circuit of a completeness or minimality check.

    Runs that ablate the same heads in the first blocks compute those blocks once (see
    `patching.run_site_sets`), so many sets cost far less than as many forward passes.
    groups: the prompts' groups [batch] (with the Ablation's groups: per-group means or resampling).
    options: `RunOptions`' logit_pos (the positions the metric reads: logits only there),
    logit_tokens (e.g. the answers: only their logits are computed), batch_size and progress (the
    runs done, as `RunOptions` counts them). Each prompt's position p takes the reference's position p
    (`Replacement.placed`).
    """
    tokens = model.input_tokens(tokens)
    check_logit_pos(options.logit_pos, tokens)
    metric = check_reads_real_tokens(model, metric, tokens, logit_pos=options.logit_pos)
    site_sets = [ablation_sites(model, heads=heads) for heads in head_sets]
    names = sorted({site.name for sites in site_sets for site in sites})
    sources = replacement.sources(names, tokens, groups)
    return run_site_sets(model, tokens, site_sets, sources, metric, options=options)


def _all_heads_but(model: HookedTransformer, keep: Sequence[Head]) -> list[Head]:
    keep = {tuple(h) for h in keep}
    cfg = model.cfg
    return [
        (layer, head)
        for layer in range(cfg.n_layers)
        for head in range(cfg.n_heads)
        if (layer, head) not in keep
    ]


def circuit_hooks(
    model: HookedTransformer,
    circuit: Sequence[Head],
    ablation: Ablation | AblationKind = "zero",
    *,
    groups: Int[Tensor, " batch"] | None = None,
) -> list:
    """fwd_hooks that ablate every head except those of `circuit` (MLPs are kept), for faithfulness.
    Every member of `circuit` must be a head of the model (`interp.checks.check_heads`); ablation and
    groups as `ablation_interventions`'."""
    circuit = check_heads(model.cfg, circuit)
    return ablation_hooks(model, heads=_all_heads_but(model, circuit), ablation=ablation, groups=groups)


def head_circuit_faithfulness(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    circuit: Sequence[Head],
    ablation: Ablation | AblationKind = "zero",
    *,
    groups: Int[Tensor, " batch"] | None = None,
) -> dict[str, float]:
    """How much of the model's metric `circuit`'s heads keep when every other head is ablated
    (MLPs kept; ablation and groups as `ablation_interventions`'), on interp's engine
    (`ablated_metrics`: the three runs share what they can).

    Returns the batch means of the metric for the full model ("model"), the circuit ("circuit")
    and the model with every head ablated ("no_heads"); "faithfulness", interp's one definition
    (`stats.faithfulness`): (circuit - no_heads) / (model - no_heads); and "recovered" =
    circuit / model (what Wang et al. 2022 report as faithfulness, with mean ablation).
    """
    circuit = check_heads(model.cfg, circuit)
    every = _all_heads_but(model, [])
    names = sorted({site.name for site in ablation_sites(model, heads=every)})
    replacement = Replacement(model, names, ablation)
    with torch.no_grad():
        full, kept, none = ablated_metrics(
            model, tokens, metric, [[], _all_heads_but(model, circuit), every], replacement, groups=groups
        ).mean(-1)
    check_denominator(float(full), float(full), "recovered (circuit / model)")
    return {
        "model": float(full),
        "circuit": float(kept),
        "no_heads": float(none),
        "faithfulness": float(faithfulness_ratio(kept[None], full[None], none[None])),
        "recovered": float(kept / full),
    }


@takes_run_options("logit_pos", "logit_tokens", "batch_size", "progress")
def ablation_sweep(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    component: Literal["heads", "mlps"] = "heads",
    *,
    ablation: Ablation | AblationKind = "zero",
    groups: Int[Tensor, " batch"] | None = None,
    base: Sequence[Head] = (),
    options: RunOptions = RunOptions(),
) -> PatchResult:
    """Ablate each head ([layer, head] grid) or each MLP layer ([layer] grid) in turn, on top of
    the heads in `base` (ablated in every run). Batches several ablated runs per forward and
    starts each at the ablated layer. `result.target` is the metric of the unablated model.
    ablation, groups: as `ablation_interventions`'. options: `RunOptions`' logit_pos, logit_tokens,
    batch_size and progress, as `ablated_metrics`' (its own `base` heads, not RunOptions.base)."""
    logit_pos = options.logit_pos
    ablation = Ablation.of(ablation)
    cfg = model.cfg
    tokens, base = model.input_tokens(tokens), check_heads(cfg, base)
    check_logit_pos(logit_pos, tokens)
    metric = check_reads_real_tokens(model, metric, tokens, logit_pos=logit_pos)
    if component == "heads":
        dims, coords = (
            ("layer", "head"),
            {"layer": list(range(cfg.n_layers)), "head": list(range(cfg.n_heads))},
        )
        units = [
            ablation_sites(model, heads=sorted({(layer, head), *base}))
            for layer, head in _all_heads_but(model, [])
        ]
    elif component == "mlps":
        dims, coords = ("layer",), {"layer": list(range(cfg.n_layers))}
        units = [ablation_sites(model, heads=base, mlps=[layer]) for layer in range(cfg.n_layers)]
    else:
        raise ValueError(f"component must be 'heads' or 'mlps', got {component!r}")
    names = sorted({site.name for sites in units for site in sites})
    replacement = Replacement(model, names, ablation)
    batch = tokens.shape[0]
    sources = replacement.sources(names, tokens, groups)
    logits, target = cached_run(model, tokens, start_names(model), logit_pos)
    values = run_site_sets(model, tokens, units, sources, metric, target=target, options=options)
    rows = [dict(zip(dims, labels, strict=True)) for labels in product(*(coords[d] for d in dims))]
    index = pd.DataFrame(rows).assign(component=f"{ablation.kind} ablation of {component}", position="all")
    if "head" not in index:
        index["head"] = None
    return PatchResult(
        values=values,
        index=index[["component", "layer", "head", "position"]],
        dims=dims,
        coords=coords,
        target=metric_values(metric, logits, batch),
        method=f"{ablation.kind} ablation",
    )
