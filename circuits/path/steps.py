"""The one analysis path for any `PairTask`: `head_path(model, task)` runs, on the task's family split,

1. discover (discovery families): every head's drop (`circuits.evidence.EFFECT_SIGN`) under the path's
   ablation estimated by attribution patching, the `n_candidates` strongest measured exactly; kept (at
   most `max_heads`) where the exact drop's CI excludes zero and |drop| >= `min_share` of the clean -
   corrupted gap;
2. classify (discovery families): by where the last token attends among the named positions (mean
   >= `attention_threshold`: "to NAME", else "unnamed"; without named positions, those where clean
   and corrupted differ), and by sign ("negative" lowers the answer);
3. validate (held-out families): each class against `n_random` random same-layer sets, pooled, per
   stratum and per family (`circuits.evidence.judge_class`); nothing is confirmed where the model
   shows no behaviour there (its logit diff's 95% CI spans 0: `no_behaviour`);
4. faithfulness (held-out families): the kept heads alone against the model and every head ablated.
Every choice is made in steps 1-2; every figure of steps 3-4 comes from held-out families.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from circuits.evidence import (
    ClassVerdict,
    Strata,
    StratumFaithfulness,
    every_head,
    head_class,
    head_labels,
    held_out_faithfulness,
    held_out_unit,
    judge_class,
    mean_ci,
    unclaimed_heads,
)
from circuits.finding import Finding
from circuits.path.results import HeadDrop, PathFigures
from circuits.path.task import PairTask
from interp.interventions.ablation import Ablation, Replacement, ablated_metrics
from interp.interventions.engine import RunOptions, forward_logits, read_with_grad
from interp.interventions.stats import FaithfulnessSummary
from interp.model import HookedTransformer, provenance
from interp.types import Head, Progress

PATH_STAGES = ("Discover heads", "Classify heads", "Validate classes", "Head faithfulness")


@dataclass(frozen=True, kw_only=True)
class PathSettings:
    """The path's choices (the module docstring says each step's use of them)."""

    n_candidates: int = 24
    max_heads: int = 12
    min_share: float = 0.03
    attention_threshold: float = 0.3
    n_random: int = 5
    ablation: str = "counterfactual"  # or "mean": the mean over the corrupted prompts at each position
    heldout: tuple[str, ...] | None = None  # held-out families; None: half of them, drawn with `seed`
    seed: int = 0


def metric_with_heads_ablated(
    model: HookedTransformer, task: PairTask, head_sets: Sequence[Sequence[Head]], ablation: str
) -> Tensor:
    """The metric [set, prompt] on `task`'s clean prompts with each set of heads ablated (an empty
    set: the model itself), on interp's engine. Ablated heads take each pair's corrupted prompt's
    output ("counterfactual") or the corrupted prompts' mean at each position ("mean")."""
    with torch.no_grad():
        return ablated_metrics(
            model, task.clean, task.metric, [list(heads) for heads in head_sets],
            _replacement(model, task, ablation),
            options=RunOptions(logit_pos=task.end, logit_tokens=torch.cat([task.correct, task.incorrect])),
        ).float().cpu()  # fmt: skip


def _replacement(model: HookedTransformer, task: PairTask, ablation: str) -> Replacement:
    """What ablated heads' z become: each pair's corrupted prompt's ("counterfactual") or the corrupted
    prompts' mean at each position ("mean")."""
    mask = task.corrupted_mask if ablation == "mean" else None
    return Replacement(
        model, model.layer_hook_names("z"), Ablation(ablation, reference=task.corrupted, mask=mask)
    )


def estimated_drops(model: HookedTransformer, task: PairTask, ablation: str) -> Float[Tensor, " layer_head"]:
    """Each head's drop on `task`'s clean prompts (mean over prompts), estimated to first order
    (attribution patching, Nanda 2023, of the path's own ablation): minus the metric's gradient on the
    clean run times (the values the ablation writes - the clean z), summed over positions and d_head."""
    names = model.layer_hook_names("z")
    written = _replacement(model, task, ablation).sources(names, task.clean)
    with read_with_grad(model, names) as z:
        metric = task.metric(forward_logits(model, task.clean, task.end))
        grads = torch.autograd.grad(metric.sum(), [z[name] for name in names])
    changes = [
        ((written[name] - z[name].detach()) * grad).sum((1, 3))
        for name, grad in zip(names, grads, strict=True)
    ]
    return -torch.stack(changes, 1).float().mean(0).flatten().cpu()  # [layer * head], layer-major


def _report(progress: Progress | None, stage: str, done: int) -> None:
    """progress(stage, done, 1) (0: the stage begins, 1: it ends), where there is a `progress`."""
    if progress is not None:
        progress(stage, done, 1)


def discover(
    model: HookedTransformer, task: PairTask, settings: PathSettings, progress: Progress | None = None
) -> tuple[list[Head], dict[Head, HeadDrop]]:
    """Step 1 on the discovery prompts: (kept heads, strongest first; every head's drop)."""
    estimated = estimated_drops(model, task, settings.ablation)  # [layer * head]
    heads = every_head(model)  # layer-major, as the estimates
    order = estimated.abs().argsort(descending=True)[: settings.n_candidates].tolist()
    candidates = [heads[i] for i in order]
    exact = f"{PATH_STAGES[0]}: exact drops of the candidates"
    _report(progress, exact, 0)
    sets = [[], *[[h] for h in candidates], heads]  # the model, each candidate, every head
    values = metric_with_heads_ablated(model, task, sets, settings.ablation)
    drops = values[0][None] - values[1:-1]  # [candidate, prompt]
    gap = float((values[0] - values[-1]).mean())  # every head ablated
    rows = {head: HeadDrop(head=label, estimated=float(value)) for head, label, value in
            zip(heads, head_labels(heads), estimated.tolist(), strict=True)}  # fmt: skip
    kept = []
    for head, drop in zip(candidates, drops, strict=True):
        ci = mean_ci(drop, settings.seed)
        rows[head].exact, rows[head].exact_ci = float(drop.mean()), ci
        if (ci[0] > 0 or ci[1] < 0) and abs(float(drop.mean())) >= settings.min_share * abs(gap):
            kept.append((abs(float(drop.mean())), head))
    _report(progress, exact, 1)
    chosen = [head for _, head in sorted(kept, reverse=True)[: settings.max_heads]]
    return chosen, rows


def attention_to_positions(
    model: HookedTransformer, task: PairTask, heads: Sequence[Head]
) -> dict[Head, dict[str, float]]:
    """Each head's mean attention from each clean prompt's last token to each named position."""
    if not task.positions or not heads:
        return {head: {} for head in heads}
    layers = sorted({layer for layer, _ in heads})
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    rows = torch.arange(len(task))
    with torch.no_grad():
        _, cache = model.run_with_cache(task.clean, names_filter=names, stop_at_layer=layers[-1] + 1)
    out = {}
    for layer, head in heads:
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][:, head].float().cpu()  # [n, query, key]
        from_end = pattern[rows, task.end]  # [n, key]
        out[(layer, head)] = {name: float(from_end[rows, pos].mean()) for name, pos in task.positions.items()}
    return out


def classify(
    heads: Sequence[Head], drops: dict[Head, float], attention: dict[Head, dict[str, float]], threshold: float
) -> dict[str, list[Head]]:
    """Step 2: class name -> heads (see the module docstring)."""
    classes: dict[str, list[Head]] = {}
    for head in heads:
        named = max(attention[head].items(), key=lambda item: item[1], default=None)
        name = f"to {named[0]}" if named is not None and named[1] >= threshold else "unnamed"
        name += " (negative)" if drops[head] < 0 else ""
        classes.setdefault(name, []).append(head)
    return classes


DEPENDENT_KINDS = {"stratum": "most", "family": "most"}  # the verdict's strata (`class_verdict`)


def validate(
    model: HookedTransformer,
    discovery: PairTask,
    heldout: PairTask,
    classes: dict[str, list[Head]],
    settings: PathSettings,
) -> tuple[list[ClassVerdict], str | None]:
    """Step 3: each class against random same-layer sets, on held-out families (and, for the
    comparison only, on discovery families), judged by `circuits.evidence.judge_class`; and why none
    is confirmed where the model shows no behaviour on the held-out prompts (`no_behaviour`), else None."""
    outside = unclaimed_heads(model, classes.values())
    signs = {name: -1 if name.endswith("(negative)") else 1 for name in classes}
    found = [
        head_class(model, name, heads, settings.n_random, settings.seed, signs[name], outside=outside)
        for name, heads in classes.items()
    ]

    def runs(task: PairTask) -> Tensor:
        """The metric [1 + sets, prompt] on `task` with no head, then each class's sets, ablated: one run."""
        return metric_with_heads_ablated(
            model, task, [[], *[s for c in found for s in c.sets]], settings.ablation
        )

    def drops(values: Tensor) -> list[Tensor]:
        """Each class's drops [1 + draws, prompt] from `runs`' values."""
        return list((values[0][None] - values[1:]).split([len(c.sets) for c in found]))

    tested = runs(heldout)
    why = no_behaviour(tested[0], settings.seed)
    unit = held_out_unit(heldout.families if heldout.has_families else None)
    strata = Strata(heldout.stratum_masks(), DEPENDENT_KINDS, families=heldout.family_labels)
    verdicts = [
        judge_class(
            check, held, discovery=chose, strata=strata, evidence_holds=why is None, unit=unit,
            seed=settings.seed,
        )
        for check, chose, held in zip(found, drops(runs(discovery)), drops(tested), strict=True)
    ]  # fmt: skip
    return verdicts, why


def no_behaviour(clean: Float[Tensor, " prompt"], seed: int = 0) -> str | None:
    """Why no class of heads can be confirmed, in words, where the model prefers neither answer on the
    held-out prompts (the 95% CI of its mean logit diff `clean`, correct - incorrect, spans 0); else
    None. No class is confirmed to help or hinder a behaviour the model does not show: a head of an
    untrained model can move the logit diff by 0.002 beyond random heads with a CI that excludes 0."""
    low, high = mean_ci(clean, seed)
    if low > 0 or high < 0:
        return None
    return (
        f"the model prefers neither answer on the held-out prompts (mean logit diff "
        f"{float(clean.mean()):+.3g}, 95% CI [{low:+.3g}, {high:+.3g}]): no class is confirmed"
    )


def head_faithfulness(
    model: HookedTransformer, task: PairTask, circuit: Sequence[Head], ablation: str, seed: int = 0
) -> tuple[FaithfulnessSummary | None, list[StratumFaithfulness], float]:
    """Step 4: the heads `circuit`'s faithfulness on `task` (ratio of means with its bootstrap CI over
    prompts, per-prompt error) and the same per stratum and family (`evidence.held_out_faithfulness`:
    None and none where the model does as well with every head ablated), and the mean drop with every
    head ablated."""
    every = every_head(model)
    outside = unclaimed_heads(model, [circuit])
    full, kept, none = metric_with_heads_ablated(model, task, [[], outside, every], ablation)
    summary, strata = held_out_faithfulness(
        kept, full, none, task.stratum_masks(), seed, families=task.family_labels
    )
    return summary, strata, float((full - none).mean())


def _changed_positions_note(model: HookedTransformer, task: PairTask) -> str:
    """What the positions of a task without named ones were named, with the first pair's tokens there."""
    named = task.with_changed_positions()
    if not named.positions:
        return (
            "no position was named and some pair's clean prompt does not differ from its corrupted one, "
            "so the classes are not named by attention (name positions with pos:NAME columns)"
        )

    def token(tokens: Tensor, position: Tensor) -> str:
        index = int(tokens[int(position)])
        return repr(model.tokenizer.decode([index])) if model.tokenizer is not None else str(index)

    first = [
        f"{name} (pair 1: {token(task.clean[0], pos[0])} -> {token(task.corrupted[0], pos[0])})"
        if int(pos[0]) <= int(task.corrupted_end[0])
        else f"{name} (pair 1: {token(task.clean[0], pos[0])}, past the corrupted prompt's end)"
        for name, pos in named.positions.items()
    ]
    return (
        "no position was named, so the positions where clean and corrupted prompts differ are: "
        + "; ".join(first)
    )


def head_path(
    model: HookedTransformer,
    task: PairTask,
    settings: PathSettings | None = None,
    progress: Progress | None = None,
) -> Finding:
    """Steps 1-4 (see the module docstring) on `task`'s family split."""
    settings = settings or PathSettings()
    if task.metric_kind != "logit_diff":
        raise ValueError(
            f"{task.name}: the head path measures logit(correct) - logit(incorrect), not {task.metric_kind}; "
            "build the task with metric='logit_diff' (every pair needs an incorrect answer)"
        )
    task.check_ablation(settings.ablation)
    notes = [] if task.positions else [_changed_positions_note(model, task)]
    task = task if task.positions else task.with_changed_positions()
    discovery, heldout = task.split(settings.heldout, settings.seed)
    _report(progress, PATH_STAGES[0], 0)
    heads, drops = discover(model, discovery, settings, progress)
    _report(progress, PATH_STAGES[1], 0)
    attention = attention_to_positions(model, discovery, heads)
    classes = classify(
        heads, {head: drops[head].exact for head in heads}, attention, settings.attention_threshold
    )
    _report(progress, PATH_STAGES[2], 0)
    checks, why_none = validate(model, discovery, heldout, classes, settings) if classes else ([], None)
    for check in checks:
        members = classes[check.name]  # in the order of `heads`, as `classify` keeps them
        check.details["attention"] = {
            name: sum(attention[h][name] for h in members) / len(members) for name in task.positions
        }
    _report(progress, PATH_STAGES[3], 0)
    faithfulness, faithfulness_strata, all_heads_drop = head_faithfulness(
        model, heldout, heads, settings.ablation, settings.seed
    )
    notes += [] if heads else ["no head's drop passed the discovery threshold: nothing to validate"]
    notes += [why_none] if why_none else []
    axis = "families" if task.has_families else "prompts"
    figures = PathFigures(
        task=task.name, by_family=task.has_families, n_discovery=len(discovery), n_heldout=len(heldout),
        all_heads_drop=all_heads_drop, drops=list(drops.values()), notes=notes,
    )  # fmt: skip
    return Finding(
        analysis="path", model=model.cfg.model_name, provenance=provenance(model), settings=settings,
        chose={axis: list(dict.fromkeys(discovery.families))},
        tested={axis: list(dict.fromkeys(heldout.families))},
        classes=checks, faithfulness=faithfulness, faithfulness_strata=faithfulness_strata, extras=figures,
    )  # fmt: skip
