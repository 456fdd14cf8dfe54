"""Path patching and mean ablation on IOI prompts (interp.interventions.patching and .ablation), and
the strategies that choose which sender heads a step path-patches.

A step measures, for each sender head, the drop of the mean logit diff when the sender's output is
patched from the ABC run along its paths to the step's receivers (`path_patching_effects`; clean -
patched, `circuits.evidence.EFFECT_SIGN`: positive, the path helps predict IO). That is one patched
forward pass per sender, the cost of the whole discovery, so a `SenderEffects` strategy decides which
senders are path-patched exactly:

  path_patching_effects   every sender (exhaustive: the paper's procedure)
  EAPRanking              the senders edge attribution patching (EAP, interp.edges) ranks first, and
                          every sender whose estimate is large; the others keep the estimate
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch
from torch import Tensor

import interp
from interp import edges
from interp.interventions.ablation import Ablation, Replacement, ablated_metrics, ablation_sites
from interp.interventions.path_patching import PathPatcher
from interp.tasks.ioi_prompts import IOIPrompts
from interp.types import Head, Progress, as_stage


class SenderEffects(Protocol):
    """A strategy for a step's sender effects: the drop of the mean logit diff (logits; clean -
    patched) when each sender's output is patched from ABC along its paths to the receivers,
    [layer, head] (NaN: not a sender). The arguments are those of `path_patching_effects`."""

    def __call__(
        self,
        model: interp.HookedTransformer,
        clean: IOIPrompts,
        abc: IOIPrompts,
        receivers: Sequence[Head] | None,
        receiver_input: str | None = None,
        position: str = "END",
        senders: Sequence[Head] | None = None,
        ablated: tuple[MeanAblation, Sequence[Head]] | None = None,
    ) -> Tensor: ...


def path_patching_effects(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    receivers: Sequence[Head] | None,
    receiver_input: str | None = None,
    position: str = "END",
    senders: Sequence[Head] | None = None,
    ablated: tuple[MeanAblation, Sequence[Head]] | None = None,
    patchers: dict[tuple[bytes, ...], tuple[object, PathPatcher]] | None = None,
) -> Tensor:
    """Drop of the mean logit diff (in logits; clean - patched, positive: the path helps predict IO)
    when each head's output is patched from the ABC run along its paths to the receivers:
    [layer, head] (NaN: not a sender). Every sender is path-patched: the exhaustive `SenderEffects`
    strategy.

    receivers: None for the logits (direct path), else heads whose `receiver_input` ("q", "k" or
    "v") at IOI position `position` receive the patched paths. Senders: every head before the
    last receiver (or `senders`), except the receivers themselves. ablated: (mean ablation, heads)
    mean-ablated in every run (the path patcher's base interventions). Prompts of each length run
    cut to that length (`by_length`). patchers: a dict kept across calls (steps) that holds each
    length group's cached clean and ABC runs (`PathPatcher`) with the ablation they were made under,
    made again when it differs.
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if senders is None:
        last = n_layers if receivers is None else max(layer for layer, _ in receivers)
        senders = [(layer, head) for layer in range(last) for head in range(n_heads)]
    sweep_senders = list(senders)
    to = "logits" if receivers is None else [(layer, head, receiver_input) for layer, head in receivers]

    def patch(group: IOIPrompts, group_abc: IOIPrompts) -> Tensor:
        """[n_senders + 1, batch]: each sender's patched logit diff, then the clean one."""
        end = group.positions["END"]
        key = tuple(t.cpu().numpy().tobytes() for t in (group.tokens, group_abc.tokens, end))
        base_key = None if ablated is None else (ablated[0], tuple(ablated[1]))
        kept = {} if patchers is None else patchers
        made_for, patcher = kept.get(key, (None, None))
        if patcher is None or made_for != base_key or patcher.model is not model or not patcher.is_current():
            base = [] if ablated is None else ablated[0].interventions(ablated[1], group)
            patcher = PathPatcher(model, group.tokens, group_abc.tokens, logit_pos=end, base=base)
            kept[key] = (base_key, patcher)
        patched = patcher(
            group.logit_diff,
            receivers=to,
            senders=sweep_senders,
            receiver_pos=None if receivers is None else group.positions[position],
            logit_tokens=group.answers,
        )
        return torch.cat([patched.values, patched.target[None]])

    values = by_length(clean, abc, patch)
    drop = values[-1].mean() - values[:-1].mean(-1)  # [n_senders]
    effects = torch.full((n_layers, n_heads), float("nan"))
    effects[tuple(torch.tensor(sweep_senders).mT)] = drop
    for layer, head in receivers or []:
        effects[layer, head] = float("nan")
    return effects


def by_length(
    clean: IOIPrompts, abc: IOIPrompts | None, run: Callable[[IOIPrompts, IOIPrompts | None], Tensor]
) -> Tensor:
    """run(prompts, abc prompts) [..., n] on each group of prompts of one length, cut to that length
    (no padding is computed), reassembled in the prompts' order: [..., batch]."""
    parts = []
    for rows in clean.length_groups():
        width = int(clean.positions["END"][rows[0]]) + 1
        group_abc = None if abc is None else abc[rows].truncated(width)
        parts.append((rows, run(clean[rows].truncated(width), group_abc).cpu()))
    out = torch.empty(*parts[0][1].shape[:-1], len(clean))
    for rows, value in parts:
        out[..., rows] = value
    return out


def ranked_path_patching_effects(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    receivers: Sequence[Head] | None,
    receiver_input: str | None = None,
    position: str = "END",
    senders: Sequence[Head] | None = None,
    n_exact: int = 16,
    attribution: dict[str, edges.EdgeScores] | None = None,
    ablated: tuple[MeanAblation, Sequence[Head]] | None = None,
    min_estimate: float = float("inf"),
    patchers: dict[tuple[bytes, ...], tuple[object, PathPatcher]] | None = None,
) -> Tensor:
    """`path_patching_effects`, path-patching only the `n_exact` senders that edge attribution (EAP,
    interp.edges) ranks first by |estimated effect|, and any other sender whose |estimate| is at
    least `min_estimate` (logits); the other senders keep the estimate.

    The estimate of a sender's drop is minus the sum of its edges' EAP scores (each the estimated
    patched - clean change) into the receivers' `receiver_input` (key and value inputs: the receivers'
    key/value heads) read at `position`, or into the logits.
    attribution: `ioi_edge_attribution(model, clean, abc)`, computed once for every step (default:
    computed here, with the `ablated` heads mean-ablated). patchers: see `path_patching_effects`.
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    given = senders
    receivers = list(receivers or [])
    if senders is None:
        last = n_layers if not receivers else max(layer for layer, _ in receivers)
        senders = [(layer, head) for layer in range(last) for head in range(n_heads)]
    senders = [head for head in senders if head not in receivers]
    if len(senders) <= n_exact:  # every sender is a candidate: the exhaustive sweep
        return path_patching_effects(
            model, clean, abc, receivers or None, receiver_input, position, given, ablated, patchers
        )
    key = position if receivers else "all"
    if attribution is None:
        base = [] if ablated is None else ablated[0].interventions(ablated[1], clean)
        attribution = ioi_edge_attribution(model, clean, abc, {key: position if receivers else None}, base)
    scores = attribution[key]
    graph = scores.graph
    if receivers:
        group = n_heads // model.cfg.n_kv_heads
        kv = "h" if group == 1 else "kv"
        names = {
            f"a{layer}.h{head}<q>"
            if receiver_input == "q"
            else f"a{layer}.{kv}{head // group}<{receiver_input}>"
            for layer, head in receivers
        }
    else:
        names = {"logits"}
    columns = [graph.readers.index(name) for name in sorted(names)]
    estimate = torch.full((n_layers, n_heads), float("nan"))
    for layer, head in senders:
        estimate[layer, head] = -scores.scores[graph.writers.index(f"a{layer}.h{head}"), columns].sum()
    ranked = sorted(senders, key=lambda head: -abs(float(estimate[head])))
    n_large = sum(abs(float(estimate[head])) >= min_estimate for head in senders)
    ranked = ranked[: max(n_exact, n_large)]
    exact = path_patching_effects(
        model, clean, abc, receivers or None, receiver_input, position, ranked, ablated, patchers
    )
    confirmed = ~exact.isnan()
    estimate[confirmed] = exact[confirmed]
    return estimate


def ioi_edge_attribution(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    positions: dict[str, str | None] | None = None,
    base: Sequence[interp.engine.Intervention] = (),
) -> dict[str, edges.EdgeScores]:
    """EAP scores of every edge for the logit diff at END, from one backward pass, per reader position:
    key -> scores of what readers read at that IOI position (None: everywhere). Default keys: "all"
    and every role position ("END", "S2", ...). base: interventions made in every run (e.g. heads
    mean-ablated: `MeanAblation.interventions`)."""
    if positions is None:
        positions = {"all": None} | {role: role for role in clean.positions}
    metric = edges.logit_diff_metric(clean.io_token, clean.s_token, clean.positions["END"])
    reader_positions = {key: role and clean.positions[role] for key, role in positions.items()}
    return edges.edge_attribution_by_position(
        model, clean.tokens, abc.tokens, metric, reader_positions, "eap", batch_size=len(clean), base=base
    )


class EAPRanking:
    """The `SenderEffects` strategy that path-patches only the `n_exact` senders EAP ranks first and
    every sender whose |estimate| is at least `min_estimate` (logits); see
    `ranked_path_patching_effects`. The attribution of the unablated model is computed once, on the
    first call, and reused by every later call on the same model and prompts (one backward pass for
    every step), as are the clean and ABC runs that path patching caches; a call with heads ablated
    attributes and caches with them ablated."""

    def __init__(self, n_exact: int = 16, min_estimate: float = float("inf")):
        self.n_exact = n_exact
        self.min_estimate = min_estimate
        self._attribution: tuple[interp.HookedTransformer, IOIPrompts, dict[str, edges.EdgeScores]] | None
        self._attribution = None
        self._patchers: dict[tuple[bytes, ...], tuple[object, PathPatcher]] = {}

    def __call__(
        self,
        model: interp.HookedTransformer,
        clean: IOIPrompts,
        abc: IOIPrompts,
        receivers: Sequence[Head] | None,
        receiver_input: str | None = None,
        position: str = "END",
        senders: Sequence[Head] | None = None,
        ablated: tuple[MeanAblation, Sequence[Head]] | None = None,
    ) -> Tensor:
        attribution = None
        if ablated is None:
            cached = self._attribution
            if cached is None or cached[0] is not model or cached[1] is not clean:
                self._attribution = cached = (model, clean, ioi_edge_attribution(model, clean, abc))
            attribution = cached[2]
        return ranked_path_patching_effects(
            model, clean, abc, receivers, receiver_input, position, senders,
            self.n_exact, attribution, ablated, self.min_estimate, self._patchers,
        )  # fmt: skip


class MeanAblation:
    """Mean ablation of heads over the ABC distribution, one mean per template and position (as the
    paper), computed once: `interventions(heads, prompts)` ablate `heads` (the engine's). The prompts of a
    template that differ in length (places or objects of several tokens) put different words at a
    position, so each (template, length) has its own means: no mean mixes words or padding."""

    def __init__(
        self, model: interp.HookedTransformer, abc: IOIPrompts, cache: Mapping[str, Tensor] | None = None
    ):
        """cache: every layer's hook_z of the run on `abc`, if it was run already."""
        self.model = model
        names = [interp.act_name("z", layer) for layer in range(model.cfg.n_layers)]
        reference = abc.tokens if cache is None else cache
        keys = sorted(set(self._keys(abc)))
        self.group_of = {key: group for group, key in enumerate(keys)}  # (template, END) -> group
        groups = self.groups(abc)
        self.replacement = Replacement(model, names, Ablation("mean", reference=reference, groups=groups))

    @staticmethod
    def _keys(prompts: IOIPrompts) -> list[tuple[int, int]]:
        return list(zip(prompts.template.tolist(), prompts.positions["END"].tolist(), strict=True))

    def groups(self, prompts: IOIPrompts) -> Tensor:
        """The group of each prompt [batch]: its (template, length)'s among the ABC prompts'."""
        keys = self._keys(prompts)
        missing = sorted(set(keys) - set(self.group_of))
        if missing:
            raise ValueError(
                f"no ABC prompt has the (template, END position) of these prompts: {missing[:5]}; the "
                "mean ablation's ABC prompts must be the ABC versions of the prompts it ablates"
            )
        return torch.tensor([self.group_of[key] for key in keys])

    def interventions(self, heads: Sequence[Head], prompts: IOIPrompts) -> list[interp.engine.Intervention]:
        """The engine's interventions that ablate `heads` in runs on `prompts` (their groups pick the
        means): a `base` of the engine, path patching and edge attribution, or hooks
        (`engine.intervention_hooks`)."""
        sites = ablation_sites(self.model, heads=heads)
        return self.replacement.interventions(sites, prompts.tokens, self.groups(prompts))

    def logit_diffs_many(
        self, head_sets: Sequence[Sequence[Head]], prompts: IOIPrompts, progress: Progress | None = None
    ) -> Tensor:
        """Logit diff per prompt [n_sets, batch] (CPU) with each set of heads mean-ablated; sets that
        ablate the same heads in the first layers share those layers' computation.
        progress(stage, done, total): as the ablated runs of each prompt length finish."""
        total = len(head_sets) * len(prompts.length_groups())
        finished = [0]  # runs of the length groups done before this one

        def run(group: IOIPrompts, _: None) -> Tensor:
            step = as_stage(progress, "ablated runs", finished[0], total)
            finished[0] += len(head_sets)
            return ablated_metrics(
                self.model, group.tokens, group.logit_diff, head_sets, self.replacement,
                groups=self.groups(group), logit_pos=group.positions["END"], logit_tokens=group.answers,
                progress=step,
            )  # fmt: skip

        return by_length(prompts, None, run)

    def logit_diffs(self, ablate: Sequence[Head], prompts: IOIPrompts) -> Tensor:
        """Logit diff per prompt [batch] (CPU) with the heads `ablate` mean-ablated."""
        return self.logit_diffs_many([ablate], prompts)[0]

    def logit_diff(self, ablate: Sequence[Head], prompts: IOIPrompts) -> float:
        """Mean logit diff on `prompts` with the heads `ablate` mean-ablated."""
        return self.logit_diffs(ablate, prompts).mean().item()
