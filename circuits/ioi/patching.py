"""Path patching and mean ablation on IOI prompts, and the `SenderEffects` strategies that choose which
sender heads a step path-patches exactly (one patched forward pass per sender, the cost of the whole
discovery): `path_patching_effects`, every sender (the paper's procedure); `EAPRanking`, the senders
edge attribution (EAP) ranks first and every sender whose estimate is large (the others keep it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext

import torch
from torch import Tensor

import interp
from circuits.discovery import eap_drops, exact_candidates
from circuits.evidence import every_head
from interp import edges
from interp.interventions.ablation import Ablation, Replacement, ablated_metrics, ablation_sites
from interp.interventions.engine import RunOptions, read_with_grad
from interp.interventions.path_patching import PathPatcher
from interp.tasks.ioi_prompts import IOIPrompts
from interp.types import Head, Progress, as_stage

SenderEffects = Callable[..., Tensor]
"""A strategy for a step's sender effects, called as `path_patching_effects` (without `patchers`):
each sender's drop of the mean logit diff (logits; clean - patched) [layer, head], NaN: not a sender.
A strategy that estimates some senders records those its last call path-patched in `path_patched`
([layer, head] bool, as `EAPRanking`); without it, every sender was."""


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
    """Drop of the mean logit diff (logits; clean - patched, positive: the path helps predict IO) when
    each sender's output is patched from ABC along its paths to the receivers: [layer, head] (NaN: not
    a sender). Every sender is path-patched.

    receivers: None for the logits, else heads whose `receiver_input` ("q", "k", "v") at IOI position
    `position` receive the paths; on a grouped-query model a receiver's key or value is its own copy
    (`shared_by_a_group`): the other query heads of its key/value head keep theirs. senders: default
    every head before the last receiver, never the receivers. ablated: (mean ablation, heads)
    mean-ablated in every run. patchers: a dict kept across calls holding each length group's cached
    clean and ABC runs (`PathPatcher`) and their ablation."""
    sweep_senders = every_head(model, receivers) if senders is None else list(senders)
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
            options = RunOptions(logit_pos=end, logit_tokens=group.answers, base=base)
            patcher = PathPatcher(model, group.tokens, group_abc.tokens, options)
            kept[key] = (base_key, patcher)
        patched = patcher(
            group.logit_diff,
            receivers=to,
            senders=sweep_senders,
            receiver_pos=None if receivers is None else group.positions[position],
        )
        return torch.cat([patched.values, patched.target[None]])

    own_copies = shared_by_a_group(model, receiver_input)  # the model's own setting restored after
    with model.settings(ungroup_grouped_query_attention=True) if own_copies else nullcontext():
        values = by_length(clean, abc, patch)
    drop = values[-1].mean() - values[:-1].mean(-1)  # [n_senders]
    effects = torch.full((model.cfg.n_layers, model.cfg.n_heads), float("nan"))
    effects[tuple(torch.tensor(sweep_senders).mT)] = drop
    for layer, head in receivers or []:
        effects[layer, head] = float("nan")
    return effects


def shared_by_a_group(model: interp.HookedTransformer, receiver_input: str | None) -> bool:
    """Whether the receivers' `receiver_input` is a key or value that a key/value head computes for
    its group of query heads (grouped-query attention): path patching patches each receiver's own
    copy (as the paper), computed per query head (`ungroup_grouped_query_attention`), never the
    copy the group's other query heads read."""
    return receiver_input in ("k", "v") and model.cfg.group_size > 1


def own_copy_eap_drops(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    receivers: Sequence[Head],
    receiver_input: str,
    position: str,
    senders: Sequence[Head],
) -> Tensor:
    """EAP's estimate of each sender's drop (logits) along its direct paths into the receivers' own
    copies of their key or value (`receiver_input`) at IOI position `position`, as path patching's
    (`shared_by_a_group`): minus the mean over prompts of (its output on ABC - on clean, as the edge
    graph's writer: `edges.writer_outputs`) . (the gradient of the logit diff with respect to the
    residual stream each later receiver's copy reads there), summed over those receivers, [layer,
    head] (NaN: not a sender). The edge graph's key and value readers are key/value heads, whose
    scores add up the copies of their group."""
    inputs = {layer: interp.act_name(f"{receiver_input}_input", layer) for layer, _ in receivers}
    writers = edges.edge_graph(model).writers

    def estimate(group: IOIPrompts, group_abc: IOIPrompts) -> Tensor:
        """[n_senders, batch]: each sender's estimated change of the logit diff, patched - clean."""
        rows, pos = torch.arange(len(group)), group.positions[position].to(model.device)
        tokens, abc_tokens = group.tokens.to(model.device), group_abc.tokens.to(model.device)
        with torch.no_grad():  # ABC - clean: [writer, batch, pos, d_model] (`edges.writer_outputs`)
            change = edges.writer_outputs(model, tokens, edges.writer_outputs(model, abc_tokens))
        with (
            model.settings(ungroup_grouped_query_attention=True),
            read_with_grad(model, inputs.values()) as acts,
        ):
            logit_diff = group.logit_diff(model(tokens))
            grads = torch.autograd.grad(logit_diff.sum(), [acts[name] for name in inputs.values()])
        gradient = dict(zip(inputs, grads, strict=True))  # layer -> [batch, pos, head, d_model]
        changes = []
        for layer, head in senders:
            read = sum(gradient[lr][rows, pos, hr] for lr, hr in receivers if lr > layer)
            changes.append((change[writers.index(f"a{layer}.h{head}"), rows, pos] * read).sum(-1).float())
        return torch.stack(changes)

    drops = -by_length(clean, abc, estimate).mean(-1)  # [n_senders]
    effects = torch.full((model.cfg.n_layers, model.cfg.n_heads), float("nan"))
    effects[tuple(torch.tensor(list(senders)).mT)] = drops
    return effects


def by_length(
    clean: IOIPrompts, abc: IOIPrompts | None, run: Callable[[IOIPrompts, IOIPrompts | None], Tensor]
) -> Tensor:
    """run(prompts, abc prompts) [..., n] on each group of prompts of one length, cut to that length,
    reassembled in the prompts' order: [..., batch]."""
    parts = []
    for rows in clean.length_groups():
        width = int(clean.positions["END"][rows[0]]) + 1
        group_abc = None if abc is None else abc[rows].truncated(width)
        parts.append((rows, run(clean[rows].truncated(width), group_abc).cpu()))
    out = torch.empty(*parts[0][1].shape[:-1], len(clean))
    for rows, value in parts:
        out[..., rows] = value
    return out


def ioi_edge_attribution(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    positions: dict[str, str | None] | None = None,
    base: Sequence[interp.engine.Intervention] = (),
) -> dict[str, edges.EdgeScores]:
    """EAP scores of every edge for the logit diff at END (one backward pass) per reader position: key ->
    scores of what readers read at that IOI position (None: everywhere); default "all" and every role.
    base: interventions made in every run (heads mean-ablated: `MeanAblation.interventions`)."""
    if positions is None:
        positions = {"all": None} | {role: role for role in clean.positions}
    metric = edges.logit_diff_metric(clean.io_token, clean.s_token, clean.positions["END"])
    reader_positions = {key: role and clean.positions[role] for key, role in positions.items()}
    return edges.edge_attribution_by_position(
        model, clean.tokens, abc.tokens, metric, reader_positions, "eap", batch_size=len(clean), base=base
    )


EXHAUSTIVE_RATIO = 3  # senders per exact candidate up to which `EAPRanking` path-patches them all


class EAPRanking:
    """The `SenderEffects` strategy that path-patches only the `n_exact` senders EAP ranks first by |estimated
    drop| and every sender whose |estimate| is at least `min_estimate` (logits); the others keep the
    estimate: minus the sum of the sender's edges' EAP scores into the receivers' `receiver_input` at
    `position` (or into the logits). The unablated attribution (one backward pass) and the path patcher's
    cached runs are made once and reused by every later step; a call with heads ablated path-patches every
    sender (an attribution under the ablation would be a pass of its own, and IOI's one such step, backup
    name movers, path-patches them all anyway). Into the receivers' keys or values on a grouped-query
    model the estimate is into each receiver's own copy (`own_copy_eap_drops`, one backward pass per
    call), as path patching's: the edge graph's key and value readers add up their group's copies. Where
    the senders are at most EXHAUSTIVE_RATIO times `n_exact`, every one is path-patched: the ranking would
    save few runs, and EAP's linear estimate can miss a large path (Gemma 3's L5H3 into the S-inhibition
    heads' values: +0.2% estimated, +10% path-patched). path_patched: the senders the last call
    path-patched [layer, head] (bool; the other senders keep the estimate)."""

    def __init__(self, n_exact: int = 16, min_estimate: float = float("inf")):
        self.n_exact = n_exact
        self.min_estimate = min_estimate
        self.path_patched: Tensor | None = None
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
        given = senders
        receivers = list(receivers or [])
        candidates = every_head(model, receivers) if senders is None else senders
        senders = [head for head in candidates if head not in receivers]
        exact = lambda chosen: path_patching_effects(  # noqa: E731
            model, clean, abc, receivers or None, receiver_input, position, chosen, ablated, self._patchers
        )
        if ablated is not None or len(senders) <= EXHAUSTIVE_RATIO * self.n_exact:  # the exhaustive sweep
            effects = exact(given)
            self.path_patched = effects.isfinite()
            return effects
        if shared_by_a_group(model, receiver_input):
            estimate = own_copy_eap_drops(model, clean, abc, receivers, receiver_input, position, senders)
            return self._exact_where_chosen(estimate, senders, exact)
        cached = self._attribution
        if cached is None or cached[0] is not model or cached[1] is not clean:
            self._attribution = cached = (model, clean, ioi_edge_attribution(model, clean, abc))
        scores = cached[2][position if receivers else "all"]
        readers = sorted({f"a{layer}.h{head}<{receiver_input}>" for layer, head in receivers} or {"logits"})
        return self._exact_where_chosen(eap_drops(model, scores, senders, readers), senders, exact)

    def _exact_where_chosen(
        self, estimate: Tensor, senders: Sequence[Head], exact: Callable[[list[Head]], Tensor]
    ) -> Tensor:
        """`estimate` [layer, head] with the senders `exact_candidates` chooses path-patched (`exact`)."""
        measured = exact(exact_candidates(estimate, senders, self.n_exact, self.min_estimate))
        confirmed = ~measured.isnan()
        estimate[confirmed] = measured[confirmed]
        self.path_patched = confirmed
        return estimate


class MeanAblation:
    """Mean ablation of heads over the ABC distribution, one mean per (template, length) and position
    (as the paper, no mean mixing words or padding), computed once."""

    def __init__(
        self, model: interp.HookedTransformer, abc: IOIPrompts, cache: Mapping[str, Tensor] | None = None
    ):
        """cache: every layer's hook_z of the run on `abc`, if it was run already."""
        self.model = model
        names = model.layer_hook_names("z")
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
        """The engine's interventions that ablate `heads` in runs on `prompts` (their groups: the means)."""
        sites = ablation_sites(self.model, heads=heads)
        return self.replacement.interventions(sites, prompts.tokens, self.groups(prompts))

    def logit_diffs_many(
        self, head_sets: Sequence[Sequence[Head]], prompts: IOIPrompts, progress: Progress | None = None
    ) -> Tensor:
        """Logit diff per prompt [n_sets, batch] (CPU) with each set of heads mean-ablated (sets sharing
        their first layers' heads share those layers' runs)."""
        total = len(head_sets) * len(prompts.length_groups())
        finished = [0]  # runs of the length groups done before this one

        def run(group: IOIPrompts, _: None) -> Tensor:
            step = as_stage(progress, "ablated runs", finished[0], total)
            finished[0] += len(head_sets)
            return ablated_metrics(
                self.model, group.tokens, group.logit_diff, head_sets, self.replacement,
                groups=self.groups(group),
                options=RunOptions(
                    logit_pos=group.positions["END"], logit_tokens=group.answers, progress=step
                ),
            )  # fmt: skip

        return by_length(prompts, None, run)

    def logit_diff(self, ablate: Sequence[Head], prompts: IOIPrompts) -> float:
        """Mean logit diff on `prompts` with the heads `ablate` mean-ablated."""
        return self.logit_diffs_many([ablate], prompts)[0].mean().item()
