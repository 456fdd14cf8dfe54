"""The heads that make each induction lookup of the k-hop task (Sanford, Hsu & Telgarsky 2024).

Hop j lands on its target t_j (`interp.tasks.hop_targets`). Each head is scored at the query by its
attention to hop j's occurrence or target (t_j - 1 or t_j) and by the drop of the answer's logit minus
the other symbols' mean logit (clean - ablated, logits) when its output (hook_z) is mean-ablated at the
query. The discovery half of the sequences chooses each hop's heads; the held-out half tests them
against random same-layer heads (`circuits.evidence.judge_class`), and path-patches what carries hop
j's result to hop j + 1's heads (`hop_paths`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from jaxtyping import Float, Int
from torch import Tensor

import interp
from circuits.evidence import (
    BeyondRandom,
    ClassVerdict,
    every_head,
    head_class,
    head_labels,
    judge_class,
    mean_ci,
    unclaimed_heads,
)
from circuits.finding import Finding
from circuits.hop.results import HopFigures
from interp.interventions.ablation import Ablation, Replacement
from interp.interventions.engine import RunOptions, Site, cached_run, run_site_sets, start_names
from interp.interventions.metrics import AnswerMetric
from interp.interventions.path_patching import PathPatcher
from interp.interventions.stats import bootstrap_ci
from interp.tasks import HopTask, hop_targets
from interp.types import Head, Progress

HOP_STAGES = ("hop lookups", "ablations and paths")  # the stages hop_report reports, in order
NOT_FOUND = "not found"  # the verdict of a hop whose discovery half chose no head
NOT_FOUND_NOTE = "no head attends to the hop and lowers the answer's logit difference on the discovery half"


def hop_task_of(model: interp.HookedTransformer) -> HopTask:
    """The hop task a checkpoint was trained on (`interp train --task hop` records it in its Config)."""
    cfg = model.cfg
    if cfg.task != "hop" or not cfg.hops:
        raise ValueError(
            f"{cfg.model_name} was not trained on the hop task (its task: {cfg.task}); "
            "pass a checkpoint of `interp train --task hop --hops K`"
        )
    return HopTask(cfg.hops, cfg.d_vocab, cfg.n_ctx, bos=cfg.bos_token_id or 0)


def lookup_positions(task: HopTask, tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """Where each hop's lookup lands from the query (its target t_j): [batch, hops]."""
    return hop_targets(tokens, task.hops)[:, :, task.query]


def answer_metric(task: HopTask, tokens: Int[Tensor, "batch pos"]) -> AnswerMetric:
    """logit(answer) - mean logit of the other symbols, at the query."""
    symbols = torch.tensor([t for t in range(task.d_vocab) if t != task.bos])
    answers = tokens[:, -1]
    others = symbols[None].expand(len(tokens), -1)
    others = others[others != answers[:, None]].view(len(tokens), -1)  # [batch, symbols - 1]
    return AnswerMetric("logit_diff", answers, others, pos=task.query)


def attention_to_hops(
    model: interp.HookedTransformer, tokens: Tensor, query: int, targets: Tensor
) -> Float[Tensor, "side hops layer head batch"]:
    """Each head's attention from the query to each hop's occurrence (side 0: t_j - 1) and target
    (side 1: t_j), per sequence; targets [batch, hops]. NaN in a sequence where one of hop j's two
    positions is also another hop's (from 3 hops on): the attention there would credit one head to two
    hops, so those sequences are left out of the hop's means."""
    windows = torch.stack([targets - 1, targets], -1)  # [batch, hops, 2]
    same = windows[:, :, None, :, None] == windows[:, None, :, None, :]  # [batch, hop, other, 2, 2]
    shared = same.flatten(-2).any(-1) & ~torch.eye(targets.shape[1], dtype=torch.bool)  # [batch, hop, other]
    ambiguous = shared.any(-1)  # [batch, hops]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    rows = torch.arange(len(tokens))[:, None]  # [batch, 1]
    per_layer = []
    for layer in range(model.cfg.n_layers):
        from_query = cache["pattern", layer][:, :, query].transpose(1, 2).cpu()  # [batch, key, head]
        # [2, batch, hops, head]: the attention to each hop's occurrence, then to its target
        picked = torch.stack([from_query[rows, targets - 1], from_query[rows, targets]])
        picked = picked.masked_fill(ambiguous[None, :, :, None], float("nan"))
        per_layer.append(picked.permute(0, 2, 3, 1))  # [2, hops, head, batch]
    return torch.stack(per_layer, 2)


class _Half(NamedTuple):
    """One half of the sequences with what both steps read of it."""

    tokens: Int[Tensor, "batch pos"]
    attention: Float[Tensor, "side hops layer head batch"]  # `attention_to_hops`
    metric: AnswerMetric
    mean_z: dict[str, Tensor]  # every layer's hook_z -> its mean over the half at each position


def _ablated_changes(
    model: interp.HookedTransformer, half: _Half, head_sets: list[list[Head]]
) -> Float[Tensor, "sets batch"]:
    """Clean minus ablated metric per sequence of `half` when each set's heads are mean-ablated at the
    query (the metric's position) only."""
    pos = half.metric.pos
    runs = [
        [Site(interp.act_name("z", layer), head=head, pos=pos) for layer, head in heads]
        for heads in head_sets
    ]
    target = cached_run(model, half.tokens, start_names(model), logits=False)[1]
    options = RunOptions(logit_pos=pos)
    values = run_site_sets(
        model, half.tokens, [[], *runs], half.mean_z, half.metric, target=target, options=options
    )
    return values[0] - values[1:]


@dataclass(frozen=True, kw_only=True)
class HopSettings:
    """The sizes of `hop_report` (`hop_report(model, **vars(settings))`), checked on construction."""

    n_sequences: int = 256
    seed: int = 0
    min_attention: float = 0.3
    n_random: int = 8

    def __post_init__(self) -> None:
        if self.n_sequences < 8 or self.n_sequences % 2:
            raise ValueError(
                f"--n-sequences must be an even number of at least 8 (half discovery, half held out), got "
                f"{self.n_sequences}."
            )
        if not 0 < self.min_attention <= 1:
            raise ValueError(f"--min-attention must lie in (0, 1], got {self.min_attention}.")


def _read_half(model: interp.HookedTransformer, task: HopTask, tokens: Tensor) -> _Half:
    names = model.layer_hook_names("z")
    mean_z = Replacement(model, names, Ablation("mean", reference=tokens)).sources(names, tokens)
    metric = answer_metric(task, tokens.cpu())
    attention = attention_to_hops(model, tokens, task.query, lookup_positions(task, tokens.cpu()))
    return _Half(tokens, attention, metric, mean_z)


def hop_report(
    model: interp.HookedTransformer,
    n_sequences: int = 256,
    seed: int = 0,
    min_attention: float = 0.3,
    n_random: int = 8,
    progress: Progress | None = None,
) -> Finding:
    """Each hop's heads on a model trained on the hop task: chosen on half of `n_sequences` held-out
    task sequences (the eval stream of `seed`, which training never draws), tested on the other half.
    progress: the stages HOP_STAGES."""
    settings = HopSettings(n_sequences=n_sequences, seed=seed, min_attention=min_attention, n_random=n_random)
    say = progress or (lambda *_: None)
    task = hop_task_of(model)
    cfg = model.cfg
    tokens, half = task.eval_batch(n_sequences, seed).tokens.to(model.device), n_sequences // 2
    each_head = [[head] for head in every_head(model)]
    with torch.no_grad():
        say(HOP_STAGES[0], 0, 2)
        discovery = _read_half(model, task, tokens[:half])
        say(HOP_STAGES[0], 1, 2)
        heldout = _read_half(model, task, tokens[half:])
        say(HOP_STAGES[0], 2, 2)
        say(HOP_STAGES[1], 0, 1)
        alone = _ablated_changes(model, discovery, each_head)
        low, _ = bootstrap_ci(alone, seed=seed)  # [heads]
        chosen = [
            [heads[0] for heads, attends, lowers in zip(each_head, row, low, strict=True)
             if attends >= min_attention and lowers > 0]
            for row in discovery.attention.sum(0).nanmean(-1).flatten(1)  # [hops, heads]
        ]  # fmt: skip
        part = heldout.tokens
        correct = (model(part)[:, task.query].argmax(-1) == part[:, -1]).float().cpu()
        unclaimed = unclaimed_heads(model, chosen)
        lookups = [
            _test_lookup(model, j, heads, heldout, settings, unclaimed) for j, heads in enumerate(chosen)
        ]
        paths = hop_paths(model, part, chosen, heldout.metric, n_random, seed, unclaimed)
    say(HOP_STAGES[1], 1, 1)
    path = torch.cat([torch.tensor([task.query]), lookup_positions(task, part[:1].cpu())[0]])
    figures = HopFigures(
        hops=task.hops,
        accuracy=correct.mean().item(),
        accuracy_ci=mean_ci(correct, seed),
        chance=task.chance_of(part.cpu()),
        attention=heldout.attention.sum(0).nanmean(-1),
        discovery_change=alone.mean(-1).view(cfg.n_layers, cfg.n_heads),
        example_tokens=part[0].tolist(),
        example_path=path.tolist(),
        paths=paths,
    )
    return Finding(
        analysis="hop",
        model=cfg.model_name,
        provenance=interp.provenance(model),
        settings=settings,
        chose={"sequences": [f"0-{half - 1}"]},
        tested={"sequences": [f"{half}-{n_sequences - 1}"]},
        classes=lookups,
        extras=figures,
    )


def hop_paths(
    model: interp.HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    heads: list[list[Head]],
    metric: AnswerMetric,
    n_random: int,
    seed: int,
    outside: Sequence[Head] | None = None,
) -> list[ClassVerdict]:
    """For each pair of successive hops whose heads lie in successive layers (hop j's all before hop
    j + 1's; heads: each hop's, in order), each route from hop j's heads to hop j + 1's ("q", "k", "v"
    of the receivers, or "via" every head of the layers between) path-patched with the senders' outputs
    at the query taken from the next sequence (`tokens` rolled by one), against random same-layer
    senders: each route a class of the senders (`judge_class`'s verdict on clean - patched), its route,
    hops and receivers in details."""
    patcher = PathPatcher(model, tokens, tokens.roll(1, 0), RunOptions(logit_pos=metric.pos))
    paths = []
    for j, (senders, receivers) in enumerate(zip(heads[:-1], heads[1:], strict=True)):
        if not senders or not receivers or max(senders)[0] >= min(receivers)[0]:
            continue
        first, last = max(senders)[0] + 1, min(receivers)[0] - 1  # the layers between the hops
        routes = {letter: [(layer, head, letter) for layer, head in receivers] for letter in "qkv"}
        if first <= last:
            between = [
                (layer, head, "qkv") for layer in range(first, last + 1) for head in range(model.cfg.n_heads)
            ]
            routes[f"via L{first}" + (f"-L{last}" if last > first else "")] = between
        found = head_class(model, f"hop {j + 1}", senders, n_random, seed + 100 + j, outside=outside)
        receiving = head_labels(receivers)
        for route, inputs in routes.items():
            patched = patcher(metric, inputs, found.sets, sender_pos=metric.pos)
            verdict = judge_class(found, patched.target - patched.values, seed=seed)  # clean - patched
            verdict.details = {"from_hop": j + 1, "to_hop": j + 2, "receivers": receiving, "route": route}
            paths.append(verdict)
    return paths


def not_found_lookup(hop: int) -> ClassVerdict:
    """Hop `hop` (1-based) where the discovery half chose no head: NaN figures, verdict "not found"
    (older files' hops without heads read as this too)."""
    nan = float("nan")
    nothing = BeyondRandom(n_prompts=0, drop=nan, drop_ci=(nan, nan), random_drop=nan, beyond=nan,
                           beyond_ci=(nan, nan))  # fmt: skip
    return ClassVerdict(
        name=f"hop {hop}", heads=[], sign=1, random_sets=[], random_effects=[], heldout=nothing,
        discovery=None, strata=[], verdict=NOT_FOUND, note=NOT_FOUND_NOTE, per_prompt=torch.empty(0),
        details={"hop": hop, "layers": [], "attention": []},
    )  # fmt: skip


def _test_lookup(
    model: interp.HookedTransformer,
    hop: int,
    heads: list[Head],
    heldout: _Half,
    settings: HopSettings,
    outside: Sequence[Head] | None = None,
) -> ClassVerdict:
    """Hop `hop` (0-based)'s heads tested on the held-out half against random same-layer sets drawn from
    `outside` (`evidence.unclaimed_heads`: no hop's heads)."""
    if not heads:
        return not_found_lookup(hop + 1)
    seed = settings.seed + hop
    found = head_class(model, f"hop {hop + 1}", heads, settings.n_random, seed, outside=outside)
    changes = _ablated_changes(model, heldout, found.sets)
    # [head, 2]: each head's held-out attention to the hop's occurrence and to its target
    sides = torch.stack([heldout.attention[:, hop, layer, head].nanmean(-1) for layer, head in heads])
    attention = sides.sum(-1).tolist()
    attends = sum(attention) / len(attention) >= settings.min_attention
    verdict = judge_class(found, changes, evidence_holds=attends, seed=settings.seed)
    layers = sorted({layer for layer, _ in heads})
    side = "occurrence" if sides[:, 0].sum() > sides[:, 1].sum() else "target"  # where the heads look more
    verdict.details = {"hop": hop + 1, "layers": layers, "attention": attention, "side": side}
    return verdict
