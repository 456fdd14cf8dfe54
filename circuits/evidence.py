"""The one standard of evidence of every analysis: its sign, its baseline, its split and its verdicts.

Sign. An effect is a *drop*, per prompt:

    drop = metric(clean run) - metric(run with the heads ablated)     (the metric's units)

positive: the heads help the behaviour the metric measures. Every report states it with
`EFFECT_SIGN`.

Baseline. A class of heads is compared with random sets of as many heads drawn from the same layers,
outside every class the analysis reports (`head_class` draws them, `random_same_layer_sets`, no set
twice, from `unclaimed_heads`: a class is not compared with another class's heads, whose own effect
would make its baseline): `beyond_random` is the class's drop minus the random sets' mean drop, paired
by prompt, with a bootstrap CI (`beyond_ci`, on `interp.interventions.stats`' one expanded percentile
bootstrap) that resamples the held-out families, then the prompts within them, and the random sets,
so that a verdict holds for new families of the kind and does not rest on which few random heads
were drawn (with 1 to 3 held-out families, too few to stand for new ones, the prompts within each:
the verdict is about those families' prompts, `held_out_unit`); and the same per stratum of the
prompts (`stratum_drops`: name orders, templates, relations, ...; one of fewer than
`MIN_STRATUM_PROMPTS` prompts gets neither a CI nor a verdict: "too few prompts"). `judge_class` is the
one judge every
analysis calls: pooled, per stratum and per family on held-out prompts, beside the discovery figure,
with one verdict (`class_verdict`) whose strata kinds are the analysis's.

Split. Heads, layers, sizes and every other choice are made on *discovery* families (templates,
relations, word-pair tasks, documents) and every reported effect is measured on *held-out* families
(`FamilySplit`), never on the data that chose it. `held_out_note` says when an effect shrinks there.

Selection. A head stands out when its robust z-score (`interp.interventions.stats.robust_z`: the
distance from the median of all heads in 1.4826 MADs) or its share of the summed effect is large
(`select_heads`).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, combinations, product
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.interventions.stats import (
    FAITHFUL_BAND,
    MIN_FAMILIES,
    OVERSHOOT,
    PARTIAL,
    FaithfulnessSummary,
    bootstrap,
    bootstrap_ci,
    expanded_p,
    faithfulness_summary,
    family_count,
    groups_differ_p,
    median_mad,
    resampled_units,
    resamples,
    robust_z,
    too_few_families,
)
from interp.types import Head, head_label, label_head

EFFECT_SIGN = "drop = metric(clean) - metric(ablated), per prompt; positive: the heads help"
MIN_STRATUM_PROMPTS = 4
"""The fewest prompts a stratum or family needs for a CI and a verdict. With n prompts, the bootstrap
resample that repeats the smallest value n times has probability n**-n: 1/27 (3.7%) for n = 3, above
the 2.5% tail, so the 95% CI of 3 prompts or fewer is the range of their values and says nothing
they do not; for n = 4 it is 1/256 (0.4%). Families are the units only where there are
`MIN_FAMILIES` or more (resampled first); 2 or 3 are too few to stand for new families (the least p
that 10,000 resamples of 2 families can show is 0.11, of 3 0.046), so their prompts are the units,
resampled within each family, and the claim is about those families' prompts. Figures saved before
2026-12-04 resampled 2 or 3 families first and have no CI (TOO_FEW_FAMILIES)."""
TOO_FEW_PROMPTS = "too few prompts"  # what a stratum of fewer than MIN_STRATUM_PROMPTS shows for its verdict
TOO_FEW_FAMILIES = "too few families"  # ... and one saved resampling 2 or 3 families first
DEPENDENCE_RULES = ("all", "most")  # a kind's strata must hold in every one, or in more than half
DEPENDENCE_ALPHA = 0.05
"""A class is "<kind>-dependent" only where its strata of the kind differ: `groups_differ_p` below this.
One stratum's CI reaching 0 while another's does not is no test of a difference between them."""
CI_TAIL = 0.025
"""At most how often a class with no effect beyond random heads is confirmed: its 95% CI beyond 0 in its
direction. Each class is judged alone."""


def head_labels(heads: Sequence[Head]) -> list[str]:
    """Heads as reports name them: ["L9H6", ...]."""
    return [head_label(layer, head) for layer, head in heads]


def mean_ci(
    values: Tensor, seed: int = 0, n_boot: int = 1000, families: Sequence[str] | None = None
) -> tuple[float, float]:
    """The 95% bootstrap CI of the mean of `values` [n] (in float64; resampling their `families` first
    where given: `interp.interventions.stats.resamples`), as two floats."""
    low, high = bootstrap_ci(values.double(), n_boot=n_boot, seed=seed, families=families)
    return float(low), float(high)


def too_few(n_prompts: int, n_families: int = 0) -> str | None:
    """Why prompts of `n_families` families resampled first (0: none) are too few for a CI and a verdict
    (`MIN_STRATUM_PROMPTS`: TOO_FEW_PROMPTS; TOO_FEW_FAMILIES for a figure saved resampling 2 or 3
    families first, `too_few_families`), else None."""
    if n_prompts < MIN_STRATUM_PROMPTS:
        return TOO_FEW_PROMPTS
    return TOO_FEW_FAMILIES if too_few_families(n_families) else None


def too_few_note(n_prompts: int, n_families: int = 0) -> str:
    """`too_few`'s reason with its count: "3 held-out prompts, too few prompts", "2 held-out families,
    too few families"."""
    why = too_few(n_prompts, n_families)
    return (
        f"{n_prompts} held-out prompts, {why}"
        if why == TOO_FEW_PROMPTS
        else f"{n_families} held-out families, {why}"
    )


def ci_verdict(ci: tuple[float, float], sign: int = 1) -> str:
    """ "confirmed" when the CI excludes zero in the direction `sign` (+1: a positive drop), else
    "unconfirmed"."""
    return "confirmed" if (ci[0] > 0 if sign > 0 else ci[1] < 0) else "unconfirmed"


def every_head(model: Any, receivers: Sequence[Head] | None = None) -> list[Head]:
    """Every head of the model, in layer order, or every head before the last of `receivers`' layers:
    the senders of a sweep to them. model: anything with `cfg.n_layers` and `cfg.n_heads`."""
    last = max((layer for layer, _ in receivers or []), default=model.cfg.n_layers)
    return [(layer, head) for layer in range(last) for head in range(model.cfg.n_heads)]


def random_same_layer_sets(
    model, heads: Sequence[Head], n_draws: int, seed: int = 0, outside: Sequence[Head] | None = None
) -> list[list[Head]]:
    """`n_draws` random sets of as many heads as `heads`, drawn with `seed` from `outside` (default:
    every head not in `heads`), each with as many heads of each layer as `heads` has there; a layer
    with too few gives all it has and the set takes the rest from any layer. No set is drawn twice:
    where the pool holds only k <= n_draws sets (a layer of three other heads), each of them comes
    n_draws // k times, so that the baseline (the sets' mean) is the pool's own mean, not weighted by
    how often the seed repeated one. model: anything with `cfg.n_layers` and `cfg.n_heads`."""
    generator = torch.Generator().manual_seed(seed)
    if outside is None:
        others = [head for head in every_head(model) if head not in set(heads)]
    else:
        others = [tuple(head) for head in outside if tuple(head) not in set(heads)]
    wanted = Counter(layer for layer, _ in heads)
    by_layer = {layer: [head for head in others if head[0] == layer] for layer in wanted}
    sizes = [math.comb(len(by_layer[layer]), count) for layer, count in wanted.items()]
    if all(sizes) and math.prod(sizes) <= n_draws:  # the whole pool, each set equally often
        per_layer = [combinations(by_layer[layer], count) for layer, count in wanted.items()]
        pool = [sorted(chain.from_iterable(choice)) for choice in product(*per_layer)]
        return pool * (n_draws // len(pool))

    def draw() -> list[Head]:
        chosen: list[Head] = []
        for layer, count in wanted.items():
            same = by_layer[layer]
            chosen += [same[i] for i in torch.randperm(len(same), generator=generator)[:count].tolist()]
        free = [head for head in others if head not in chosen]
        shortfall = min(len(heads) - len(chosen), len(free))
        chosen += [free[i] for i in torch.randperm(len(free), generator=generator)[:shortfall].tolist()]
        return sorted(chosen)

    draws: list[list[Head]] = []
    for _ in range(DISTINCT_SET_TRIES * n_draws):  # the pool holds over n_draws sets, or a layer is short
        candidate = draw()
        if candidate not in draws:
            draws.append(candidate)
        if len(draws) == n_draws:
            break
    return draws * (n_draws // len(draws)) if draws else draws


DISTINCT_SET_TRIES = 50
"""Draws per wanted set `random_same_layer_sets` makes before it takes the k distinct sets found as the
pool (each then n_draws // k times): reached only where a layer is short and the heads of other layers
allow fewer than n_draws distinct sets."""


def beyond_per_prompt(effects: Float[Tensor, "set prompt"]) -> Float[Tensor, " prompt"]:
    """A class's effect beyond the mean of its random sets' effects, paired by prompt: effects[0] minus
    the mean of effects[1:] (the rows of `HeadClass.sets`, the class first)."""
    return effects[0] - effects[1:].mean(0)


def _random_set_draws(
    effects: Float[Tensor, "set prompt"], seed: int, n_boot: int
) -> Int[Tensor, "draw n_boot"]:
    """The random sets each bootstrap resample takes (rows of effects[1:], with replacement), drawn with
    `seed` + 1: apart from the prompts' stream."""
    n_sets = effects.shape[0] - 1
    if n_sets < 1:
        raise ValueError(
            "effects holds the class's row only: give at least one random set's effects after it"
        )
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randint(n_sets, (n_sets, n_boot), generator=generator)


def _resampled_means(values: Float[Tensor, "set prompt"], samples: Int[Tensor, "n_boot n"]) -> Tensor:
    """Each set's mean over each resample of the prompts [set, n_boot], as a product with the times each
    prompt is drawn (no [set, n_boot, n] gather)."""
    counts = torch.zeros(samples.shape, dtype=torch.float64).scatter_add_(
        1, samples, torch.ones(samples.shape, dtype=torch.float64)
    )
    return values @ counts.T / samples.shape[1]


def _beyond_resampled(per_set: Float[Tensor, "set n_boot"], draws: Int[Tensor, "draw n_boot"]) -> Tensor:
    """Per resample, the class's mean (per_set[0]) minus the mean of its resampled random sets' [n_boot]."""
    return per_set[0] - per_set[1:].gather(0, draws).mean(0)


def beyond_ci(
    effects: Float[Tensor, "set prompt"],
    seed: int = 0,
    n_boot: int = 1000,
    families: Sequence[str] | None = None,
) -> tuple[float, float]:
    """The 95% CI (float64) of a class's mean effect beyond its random sets': the one bootstrap
    resampling the prompts (their `families` first, where given) and, independently, the random sets
    effects[1:]; with `beyond_p`'s seed and `n_boot` its resamples are that p's."""
    values = effects.double()
    draws = _random_set_draws(values, seed, n_boot)

    def statistic(samples: Tensor) -> Tensor:  # samples [n_boot, prompt] -> [n_boot]
        return _beyond_resampled(_resampled_means(values, samples), draws)

    finite = bool(torch.isfinite(values).all())  # else a NaN/inf effect: no CI (NaN)
    low, high = bootstrap(statistic, values.shape[-1], n_boot, seed=seed, defined=finite, families=families)
    return float(low), float(high)


P_RESAMPLES = 10_000
"""Resamples of a class's pooled held-out CIs and of `beyond_p`, the same resamples (so the CI excludes 0
where p < `CI_TAIL`, to a resample): its smallest p, a share 1 / 10,001 of them read at the expanded tail, is
0.0017 for 14 held-out families and 0.00024 for 64 prompts, below Holm's first threshold for as many
classes as a report judges (`holm`: 0.025 / 7 = 0.0036 for IOI's seven). With fewer units the
expanded tail keeps it higher: 0.0097 for 6 held-out tasks, where `holm` may not be able to tell, and
0.0032 for 10."""


def beyond_p(
    effects: Float[Tensor, "set prompt"],
    sign: int = 1,
    seed: int = 0,
    n_boot: int = P_RESAMPLES,
    families: Sequence[str] | None = None,
) -> tuple[float, bool]:
    """The one-sided p that a class has no effect beyond its random sets in its direction `sign`, on
    `beyond_ci`'s resampling (`n_boot` resamples): the share of them at or beyond 0 the other way, (1 +
    count) / (1 + n_boot), read at the units' expanded tail (`expanded_p`: below `CI_TAIL` where the 95%
    CI excludes 0 in the class's direction, up to the resamples' noise); and whether it is only a bound
    (no resample the other way: the p of 1 / (1 + n_boot), the least `n_boot` resamples of these units
    can show). NaN where an effect is not finite."""
    values = effects.detach().double().cpu()
    draws = _random_set_draws(values, seed, n_boot)
    if not torch.isfinite(values).all():
        return math.nan, False
    n = values.shape[-1]
    beyond = _beyond_resampled(_resampled_means(values, resamples(n, n_boot, seed, families)), draws)
    against = int((sign * beyond <= 0).sum())
    return expanded_p((1 + against) / (1 + n_boot), resampled_units(n, families)), against == 0


@dataclass(kw_only=True)
class BeyondRandom:
    """A class's drop on held-out prompts against random same-layer sets. drop, random_drop, beyond:
    means over prompts; drop_ci: 95% bootstrap CI over prompts; beyond_ci: `beyond_ci`; n_families: the
    families resampled first (0: none given, and in files saved before 2026-12-04)."""

    n_prompts: int
    drop: float
    drop_ci: tuple[float, float]
    random_drop: float
    beyond: float
    beyond_ci: tuple[float, float]
    n_families: int = 0


def beyond_random(
    drop: Float[Tensor, " prompt"],
    random_drops: Float[Tensor, "draw prompt"],
    seed: int = 0,
    n_boot: int = 1000,
    families: Sequence[str] | None = None,
) -> BeyondRandom:
    """The class's drop [prompt] beyond the mean of its random sets' drops [draw, prompt], paired by
    prompt, with its CI (`beyond_ci`; resampling the prompts' `families` first, where given)."""
    difference = drop - random_drops.mean(0)
    ci = beyond_ci(torch.cat([drop[None], random_drops]), seed, n_boot, families)
    return BeyondRandom(
        n_prompts=len(drop),
        drop=drop.mean().item(),
        drop_ci=mean_ci(drop, seed, n_boot, families),
        random_drop=random_drops.mean().item(),
        beyond=difference.mean().item(),
        beyond_ci=ci,
        n_families=family_count(families),
    )


def kept(labels: Sequence[str] | None, members: Bool[Tensor, " prompt"]) -> list[str] | None:
    """The labels [prompt] of the prompts `members` keeps (None for None)."""
    if labels is None:
        return None
    return [label for label, member in zip(labels, members.tolist(), strict=True) if member]


@dataclass(kw_only=True)
class StratumDrop:
    """A class's mean drop beyond random on one stratum's held-out prompts, in the drop's units, with its
    `beyond_ci`; under `MIN_STRATUM_PROMPTS` prompts (or saved resampling 2 or 3 families first),
    neither CI nor verdict (None: `too_few`)."""

    kind: str  # what divides the prompts: "order", "template", "facts", "relation", "stratum", "family"
    name: str  # the stratum: "ABBA", "T3", "4 facts", "capital", ...
    n_prompts: int
    beyond: float
    beyond_ci: tuple[float, float] | None  # None: too few prompts
    holds: bool | None  # in the class's direction: the mean, or for the kinds tested by CI the whole CI
    example: str | None = None  # one of its prompts, where the analysis has their texts
    n_families: int = 0  # the families its CI resamples first (`family_count`; 0 in files saved before)


def label_strata(kind: str, labels: Sequence[str]) -> list[tuple[str, str, Tensor]]:
    """(kind, label, members [prompt] bool) per distinct label of `labels` [prompt], in order of first
    appearance: the strata `stratum_drops` takes."""
    return [(kind, name, torch.tensor([label == name for label in labels])) for name in dict.fromkeys(labels)]


def stratum_drops(
    effects: Float[Tensor, "set prompt"],
    strata: Iterable[tuple[str, str, Tensor]],
    sign: int = 1,
    by_ci: Collection[str] = (),
    seed: int = 0,
    n_boot: int = 1000,
    families: Sequence[str] | None = None,
) -> list[StratumDrop]:
    """A class's drop beyond random in each non-empty stratum (kind, name, members [prompt] bool), from
    effects [1 + draws, prompt] (of `families` [prompt], resampled first where given). A stratum holds
    when its mean points the class's way `sign` (+1: it helps), or for kinds in `by_ci` when its CI
    excludes zero that way."""
    out = []
    for kind, name, members in strata:
        values = effects[:, members.to(effects.device)]
        if values.shape[1] == 0:
            continue
        mean = beyond_per_prompt(values).mean().item()
        labels = kept(families, members)
        n_families = family_count(labels)
        if too_few(values.shape[1], n_families) or not math.isfinite(mean):  # no verdict: untested
            ci, holds = None, None
        else:
            ci = beyond_ci(values, seed, n_boot, labels)
            holds = ci_verdict(ci, sign) == "confirmed" if kind in by_ci else sign * mean > 0
        out.append(StratumDrop(kind=kind, name=name, n_prompts=values.shape[1], beyond=mean, beyond_ci=ci,
                               holds=holds, n_families=n_families))  # fmt: skip
    return out


@dataclass(frozen=True)
class FamilySplit:
    """Which families chose (discovery) and which tested (held-out); never both."""

    discovery: tuple[str, ...]
    heldout: tuple[str, ...]

    def __post_init__(self) -> None:
        both = set(self.discovery) & set(self.heldout)
        if both:
            raise ValueError(
                f"families {sorted(both)} are both discovery and held-out; a family is one or the other"
            )
        if not self.discovery or not self.heldout:
            raise ValueError(
                f"a split needs a discovery and a held-out family (got {len(self.discovery)} and "
                f"{len(self.heldout)}): give more families, or name the held-out ones"
            )

    def describe(self) -> str:
        return f"chosen on {', '.join(self.discovery)}; tested on {', '.join(self.heldout)}"


def check_apart(
    chose: Tensor, tested: Tensor, chose_end: Tensor | None = None, tested_end: Tensor | None = None
) -> None:
    """Refuse held-out prompts that are discovery prompts: the same token ids [prompt, pos] up to the
    position each prompt's metric reads (`*_end` [prompt]; None: the whole row, right-padded rows
    compared at one width). A caller's held-out prompts are otherwise taken as given."""

    def rows(tokens: Tensor, end: Tensor | None, width: int) -> list[tuple[int, ...]]:
        if end is None:
            padded = torch.full((len(tokens), width), -1, dtype=torch.long)
            padded[:, : tokens.shape[1]] = tokens.cpu()
            return [tuple(row) for row in padded.tolist()]
        return [tuple(row[: int(e) + 1]) for row, e in zip(tokens.tolist(), end.tolist(), strict=True)]

    width = max(chose.shape[1], tested.shape[1])
    first = {row: i for i, row in reversed(list(enumerate(rows(chose, chose_end, width), 1)))}
    shared = [(first[row], j) for j, row in enumerate(rows(tested, tested_end, width), 1) if row in first]
    if shared:
        i, j = shared[0]
        raise ValueError(
            f"{len(shared)} of the {len(tested)} held-out prompts are discovery prompts (the first: held-out "
            f"prompt {j} is discovery prompt {i}); a held-out figure is measured on prompts that did not "
            "choose: give held-out prompts of other templates, names or families than the discovery ones"
        )


def split_families(
    families: Sequence[str], heldout: Sequence[str] | None = None, fraction: float = 0.5, seed: int = 0
) -> FamilySplit:
    """Split the distinct `families` (in order of first appearance): the named `heldout` ones (at
    least one, not all), or a seeded `fraction` of them (at least one each side)."""
    distinct = list(dict.fromkeys(families))
    if heldout is not None:
        unknown = sorted(set(heldout) - set(distinct))
        if unknown:
            raise ValueError(f"held-out families {unknown} are not among the task's families {distinct}")
        if not heldout:
            raise ValueError(f"no held-out family named; name one or more of the task's families {distinct}")
        if set(distinct) <= set(heldout):
            raise ValueError(
                f"every family of the task is held out ({distinct}): none is left to choose; hold out fewer"
            )
        held = set(heldout)
    elif len(distinct) < 2:
        raise ValueError(
            f"the task has {len(distinct)} family ({distinct}); holding out whole families needs two or more "
            "(add a family column: a template, relation, task or document per prompt)"
        )
    else:
        order = torch.randperm(len(distinct), generator=torch.Generator().manual_seed(seed)).tolist()
        n_heldout = min(len(distinct) - 1, max(1, round(fraction * len(distinct))))
        held = {distinct[i] for i in order[:n_heldout]}
    return FamilySplit(tuple(f for f in distinct if f not in held), tuple(f for f in distinct if f in held))


def held_out_unit(families: Iterable[str] | None, family: str = "family", plural: str = "families") -> str:
    """What the held-out figures generalise to, in words, from the held-out prompts' families (None: no
    family column): "families" where `MIN_FAMILIES` or more are held out (resampled first); with fewer,
    the bootstrap resamples their prompts only, "prompts of the one held-out family (F)", "prompts of
    the 2 held-out families (F, G)"; else "prompts". family, plural: what the analysis calls a family
    ("task", "tasks")."""
    distinct = sorted(set(families or ()))
    if family_count(distinct):  # resampled first
        return plural
    if len(distinct) > 1:
        return f"prompts of the {len(distinct)} held-out {plural} ({', '.join(distinct)})"
    return f"prompts of the one held-out {family} ({distinct[0]})" if distinct else "prompts"


def resampled_words(families: Iterable[str] | None) -> str:
    """What a CI over prompts of `families` resamples (`interp.interventions.stats.resamples`), in
    words: "families, then prompts" (`MIN_FAMILIES` or more), "prompts within each family" (2 or 3),
    else "prompts"."""
    distinct = sorted(set(families or ()))
    if family_count(distinct):
        return "families, then prompts"
    return "prompts within each family" if len(distinct) > 1 else "prompts"


def held_out_note(
    discovery: float, heldout: float, heldout_ci: tuple[float, float], unit: str = "families", sign: int = 1
) -> str:
    """How an effect measured on discovery `unit` (families, or prompts) fares on held-out ones, in words;
    sign -1: an effect against the behaviour, judged by its size the other way (its figures as measured).
    An effect the discovery figure does not show (0 or the other way) is not said to hold."""
    low, high = heldout_ci
    if not all(math.isfinite(x) for x in (heldout, low, high)):
        return f"no CI on held-out {unit} ({heldout:+.3g}): too few prompts, or a value is not finite"
    if min(sign * low, sign * high) <= 0:
        return f"does not hold on held-out {unit} ({heldout:+.3g}, CI [{low:+.3g}, {high:+.3g}])"
    if sign * discovery <= 0:
        return f"seen on held-out {unit} only: {heldout:+.3g} against {discovery:+.3g} on discovery"
    if sign * heldout < 0.67 * sign * discovery:
        return f"shrinks on held-out {unit}: {heldout:+.3g} against {discovery:+.3g} on discovery"
    return f"holds on held-out {unit} ({heldout:+.3g} against {discovery:+.3g} on discovery)"


@dataclass(kw_only=True)
class HeadClass:
    """A class of heads and the random same-layer sets it is compared with (`head_class` draws them).
    sign: +1, the class helps the behaviour (its drop is positive); -1, it works against it."""

    name: str
    heads: list[Head]
    draws: list[list[Head]]
    sign: int = 1

    @property
    def sets(self) -> list[list[Head]]:
        """The class, then its random sets: the rows of the effects `judge_class` takes."""
        return [self.heads, *self.draws]


def unclaimed_heads(model: Any, classes: Iterable[Sequence[Head]]) -> list[Head]:
    """Every head of the model in none of `classes`: where each class's random sets are drawn from."""
    claimed = {tuple(head) for heads in classes for head in heads}
    return [head for head in every_head(model) if head not in claimed]


def head_class(
    model,
    name: str,
    heads: Sequence[Head],
    n_random: int,
    seed: int = 0,
    sign: int = 1,
    outside: Sequence[Head] | None = None,
) -> HeadClass:
    """The class `heads` with `n_random` random same-layer sets drawn with `seed` from `outside`
    (default: every other head; `random_same_layer_sets`)."""
    heads = [tuple(head) for head in heads]
    draws = random_same_layer_sets(model, heads, n_random, seed, outside)
    return HeadClass(name=name, heads=heads, draws=draws, sign=sign)


@dataclass(kw_only=True)
class ClassVerdict:
    """A class judged by `judge_class`: held-out (`heldout`), discovery (`discovery`, None where none
    chose it), per stratum (`strata`), one verdict and a note. random_effects: each random set's mean
    held-out effect; per_prompt: the held-out effect beyond random [prompt]; details: the analysis's
    own figures by name, shown by `circuits.sections.class_sections`; differ_p: per dependent kind, the
    permutation p that its strata share one effect (`strata_differ_p`; empty in files saved before); p:
    the one-sided p of its pooled held-out effect beyond random (`beyond_p`; NaN where it has no CI, and
    in files saved before 2026-12-02), which `holm` corrects across a report's classes; p_bound: p is
    only a bound, the least its resamples can show (none lay on the other side of 0)."""

    name: str
    heads: list[str]
    sign: int
    random_sets: list[list[str]]
    random_effects: list[float]
    heldout: BeyondRandom
    discovery: BeyondRandom | None
    strata: list[StratumDrop]
    verdict: str
    note: str
    per_prompt: Tensor
    details: dict[str, Any] = field(default_factory=dict)
    differ_p: dict[str, float] = field(default_factory=dict)
    p: float = math.nan
    p_bound: bool = False

    @property
    def has_ci(self) -> bool:
        """Whether its held-out effect beyond random has a CI (not where it has no random heads, too few
        prompts or an effect that is not finite): the classes a report judges."""
        return not any(math.isnan(bound) for bound in self.heldout.beyond_ci)

    @property
    def random_same_layers(self) -> bool:
        """Whether every random set holds as many heads of each layer as the class (False: a layer had too
        few heads left to draw from, and the set took some from other layers)."""

        def layers(labels: Sequence[str]) -> list[int]:
            return sorted(label_head(label)[0] for label in labels)

        return all(layers(draw) == layers(self.heads) for draw in self.random_sets)

    @property
    def no_random_heads(self) -> bool:
        """Whether every random set is empty (every head of the model is in a class): no baseline."""
        return all(len(draw) == 0 for draw in self.random_sets)

    @property
    def random_sets_short(self) -> bool:
        """Whether a random set has fewer heads than the class (the model had too few other heads to draw
        from): no baseline of its size, so the class stays unconfirmed whatever its effect."""
        return any(len(draw) < len(self.heads) for draw in self.random_sets)

    @property
    def unconfirmed_because(self) -> str | None:
        """Why the class is unconfirmed, in words (None where it is not)."""
        if self.verdict != "unconfirmed":
            return None
        if self.random_sets_short:
            return "random sets of fewer heads than it: no baseline of its size"
        if self.too_few:
            return too_few_note(self.heldout.n_prompts, self.heldout.n_families)
        if not self.has_ci:
            return "its held-out effect has no CI (a value is not finite)"
        if ci_verdict(self.heldout.beyond_ci, self.sign) != "confirmed":
            return "no larger effect than random heads"
        for kind, judged in _judged_strata(self.strata, dict.fromkeys(s.kind for s in self.strata)).items():
            if judged and not any(s.holds for s in judged):  # `class_verdict`: no stratum of the kind holds
                names = ", ".join(s.name for s in judged)
                return f"beyond random heads pooled, but in no {kind} alone ({names})"
        return "beyond random heads, but the analysis's other evidence fails"

    @property
    def too_few(self) -> bool:
        """Whether its held-out prompts, or their families, are too few for a verdict (`too_few`)."""
        return too_few(self.heldout.n_prompts, self.heldout.n_families) is not None

    @property
    def one_random_set(self) -> bool:
        """Whether its two or more random sets are all the same heads (its layers had no others to draw
        from): the baseline is those heads, and its CI carries no spread over which heads were drawn."""
        unique = {tuple(draw) for draw in self.random_sets}
        return len(self.random_sets) > 1 and len(unique) == 1 and not self.random_sets_short


def class_verdict(
    pooled_holds: bool,
    strata: Sequence[StratumDrop],
    dependent_kinds: Mapping[str, str],
    differ_p: Mapping[str, float] | None = None,
) -> str:
    """The one verdict of a class: "unconfirmed" unless the pooled effect holds and, in each kind of
    `dependent_kinds`, at least one stratum does; else "<kind>-dependent" for the first kind (in the
    mapping's order) whose strata do not hold as its rule asks ("all": every one; "most": more than
    half) and differ (`differ_p`: kind -> `groups_differ_p` of its strata, below `DEPENDENCE_ALPHA`; a
    kind it lacks counts as differing; None, for files saved before the test: every kind); else
    "confirmed". Strata of too few prompts (holds None) are left out: a kind with none left does not
    change the verdict. Kinds: "order", "template", "relation", "facts", "family", ..."""
    unknown = set(dependent_kinds.values()) - set(DEPENDENCE_RULES)
    if unknown:
        raise ValueError(f"unknown dependence rule(s) {sorted(unknown)}; choose from {DEPENDENCE_RULES}")
    if not pooled_holds:
        return "unconfirmed"
    judged = _judged_strata(strata, dependent_kinds)
    if any(found and not any(s.holds for s in found) for found in judged.values()):
        return "unconfirmed"
    for kind in _short_kinds(judged, dependent_kinds):
        if differ_p is None or differ_p.get(kind, 0.0) < DEPENDENCE_ALPHA:
            return f"{kind}-dependent"
    return "confirmed"


def _judged_strata(strata: Sequence[StratumDrop], kinds: Iterable[str]) -> dict[str, list[StratumDrop]]:
    """Per kind of `kinds`, its strata that have a verdict (enough prompts: holds not None), in order."""
    return {kind: [s for s in strata if s.kind == kind and s.holds is not None] for kind in kinds}


def _short_kinds(judged: Mapping[str, list[StratumDrop]], dependent_kinds: Mapping[str, str]) -> list[str]:
    """The kinds whose judged strata (`_judged_strata`) do not hold as the kind's rule asks."""

    def met(holds: list[bool], rule: str) -> bool:
        return all(holds) if rule == "all" else 2 * sum(holds) > len(holds)

    return [
        kind
        for kind, rule in dependent_kinds.items()
        if judged[kind] and not met([s.holds for s in judged[kind]], rule)
    ]


def strata_differ_p(
    effects: Float[Tensor, "set prompt"],
    groups: Iterable[tuple[str, str, Tensor]],
    judged: Sequence[StratumDrop],
    kinds: Iterable[str],
    families: Sequence[str] | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """Per kind of `kinds`: the p-value that its strata of `groups` (kind, name, members [prompt]) share one
    drop beyond random of effects [1 + draws, prompt], `groups_differ_p`'s (labels shuffled within
    `families` where the kind crosses them), over the strata `judged` gave a verdict (enough prompts).
    A kind of fewer than two such strata, whose strata overlap, or whose prompts' effects are not all
    finite is left out (untested: `class_verdict` counts it as differing)."""
    per_prompt = beyond_per_prompt(effects)
    groups = list(groups)
    index = None if families is None else {family: i for i, family in enumerate(dict.fromkeys(families))}
    out = {}
    for kind, with_verdict in _judged_strata(judged, kinds).items():
        names = {s.name for s in with_verdict}
        masks = [members for k, name, members in groups if k == kind and name in names]
        if len(masks) < 2:
            continue
        stacked = torch.stack(masks).to(per_prompt.device)
        if (stacked.sum(0) > 1).any():
            continue  # a prompt in two strata of the kind: no one label per prompt
        member = stacked.any(0)
        if not torch.isfinite(per_prompt[member]).all():
            continue
        blocks = None
        if index is not None:
            blocks = torch.tensor([index[family] for family in kept(families, member.cpu())])
        out[kind] = groups_differ_p(per_prompt[member], stacked.int().argmax(0)[member], blocks, seed=seed)
    return out


HELD_OUT_ONLY = "measured on held-out data only (none of it chose the heads)"


@dataclass(frozen=True)
class Strata:
    """How a class's held-out prompts divide: groups (kind, name, members [prompt] bool);
    dependent_kinds: kind -> "all" or "most" (`class_verdict`); by_ci: see `stratum_drops`; families:
    each prompt's family [prompt] (a template, relation, task), which the CIs resample first, so that
    they cover the effect on new families (None: each prompt its own, a sequence or a document)."""

    groups: Sequence[tuple[str, str, Tensor]] = ()
    dependent_kinds: Mapping[str, str] = field(default_factory=dict)
    by_ci: Collection[str] = ()
    families: Sequence[str] | None = None


NO_RANDOM_HEADS = "no random heads to compare it with (every head is in a class): no effect beyond random"


def _without_baseline(effects: Float[Tensor, "set prompt"]) -> Float[Tensor, "set prompt"]:
    """Effects whose random sets are empty: their rows NaN, so nothing is read as beyond them (an empty
    set's effect is 0, and the class's raw drop would read as its effect beyond random)."""
    return torch.cat([effects[:1], torch.full_like(effects[1:], torch.nan)])


def judge_class(
    found: HeadClass,
    heldout: Float[Tensor, "set prompt"],
    *,
    discovery: Float[Tensor, "set prompt"] | None = None,
    strata: Strata = Strata(),
    evidence_holds: bool = True,
    tested: Bool[Tensor, " prompt"] | None = None,
    unit: str | None = None,
    seed: int = 0,
    n_boot: int = 1000,
) -> ClassVerdict:
    """The one judge of a class of heads against its random same-layer sets.

    heldout: each of `found.sets`' effect per held-out prompt [1 + draws, prompt], the class first,
      signed as `EFFECT_SIGN` (a drop: metric(clean) - metric(ablated); or a gain the analysis makes);
      the analysis's own ablation and metric make it.
    discovery: the same on the discovery prompts that chose the class (shown beside, never judged).
    strata: `Strata`; default: none, so "confirmed" or "unconfirmed" by the pooled CI.
    evidence_holds: the analysis's other evidence for the class (IOI: it writes the logit it should;
      hop: it attends to the hop); False makes it "unconfirmed" whatever its effect, as do random sets
      of fewer heads than the class (`ClassVerdict.random_sets_short`).
    tested: the held-out prompts the pooled figure is judged on [prompt] (default: all of them); the
      strata may also divide prompts held out on fewer axes (function vectors: held-out tasks in
      discovery templates), shown beside.
    unit: what was held out ("families", "prompts"), for the note; default: `held_out_unit` of the
      judged prompts' families ("families" without them).
    n_boot: resamples of the strata's and the discovery figure's CIs; the pooled held-out CIs take
      `P_RESAMPLES`, the resamples of the class's p (`beyond_p`)."""
    sign = found.sign
    no_baseline = all(len(draw) == 0 for draw in found.draws)  # no head outside the classes to draw
    if no_baseline:
        heldout, discovery = (None if x is None else _without_baseline(x) for x in (heldout, discovery))
    judged = heldout if tested is None else heldout[:, tested.to(heldout.device)]
    families = strata.families
    judged_families = families if tested is None else kept(families, tested)
    if unit is None:
        unit = "families" if judged_families is None else held_out_unit(judged_families)
    tested = beyond_random(judged[0], judged[1:], seed, P_RESAMPLES, judged_families)  # beyond_p's resamples
    chosen = None if discovery is None else beyond_random(discovery[0], discovery[1:], seed, n_boot)
    per_prompt = beyond_per_prompt(judged)  # the prompts the pooled figure is judged on
    by_stratum = stratum_drops(heldout, strata.groups, sign, strata.by_ci, seed, n_boot, families)
    short = any(len(draw) < len(found.heads) for draw in found.draws)  # no baseline of the class's size
    few = too_few(tested.n_prompts, tested.n_families)  # so few units: a CI is their range
    pooled_holds = not (short or few) and evidence_holds and ci_verdict(tested.beyond_ci, sign) == "confirmed"
    if no_baseline:
        note = NO_RANDOM_HEADS
    elif chosen is None:
        note = HELD_OUT_ONLY
    elif few:  # no CI to say whether it holds: the figures only
        note = f"{tested.beyond:+.3g} beyond random on held-out {unit}, {chosen.beyond:+.3g} on discovery"
    else:
        note = held_out_note(chosen.beyond, tested.beyond, tested.beyond_ci, unit, sign)
    if few:  # too few prompts (2 or 3 families are not resampled first: `family_count`)
        note = f"{too_few_note(tested.n_prompts)} for a verdict (at least {MIN_STRATUM_PROMPTS}); {note}"
    for kind in strata.dependent_kinds:  # strata all too small: the verdict could not read the kind
        sizes = [s.n_prompts for s in by_stratum if s.kind == kind]
        if sizes and max(sizes) < MIN_STRATUM_PROMPTS:
            note += f"; {kind} dependence untested (no {kind} has {MIN_STRATUM_PROMPTS} held-out prompts)"
    differ_p = strata_differ_p(heldout, strata.groups, by_stratum, strata.dependent_kinds, families, seed)
    verdict = class_verdict(pooled_holds, by_stratum, strata.dependent_kinds, differ_p)
    p, p_bound = (math.nan, False) if no_baseline else beyond_p(judged, sign, seed, families=judged_families)
    if verdict != "unconfirmed":
        note += dependence_note(by_stratum, strata.dependent_kinds, differ_p)
    return ClassVerdict(
        name=found.name,
        heads=head_labels(found.heads),
        sign=sign,
        random_sets=[head_labels(draw) for draw in found.draws],
        random_effects=judged[1:].mean(1).tolist(),
        heldout=tested,
        discovery=chosen,
        strata=by_stratum,
        verdict=verdict,
        note=note,
        per_prompt=per_prompt,
        differ_p=differ_p,
        p=p,
        p_bound=p_bound,
    )


def dependence_note(
    strata: Sequence[StratumDrop], dependent_kinds: Mapping[str, str], differ_p: Mapping[str, float]
) -> str:
    """For each kind whose strata fall short of its rule: those that do not hold alone, and whether the
    strata differ (the "<kind>-dependent" verdict) or no more than chance (then not counted)."""
    judged = _judged_strata(strata, dependent_kinds)
    note = ""
    for kind in _short_kinds(judged, dependent_kinds):
        failing = ", ".join(s.name for s in judged[kind] if not s.holds)
        note += f"; does not hold in the {kind} {failing} alone"
        p = differ_p.get(kind)
        if p is None:
            note += " (difference untested)"
        elif p < DEPENDENCE_ALPHA:
            note += f", and the {kind} strata differ (p = {p:.2g})"
        else:
            note += f", but the {kind} strata differ no more than chance (p = {p:.2g}): no {kind} dependence"
    return note


def _holm_passes(ps: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down test of `ps`, in their order: in order of p, each passes while p <= alpha / (the
    p-values not yet passed); the first that does not stops the rest."""
    passes = [False] * len(ps)
    for rank, i in enumerate(sorted(range(len(ps)), key=ps.__getitem__)):
        if ps[i] > alpha / (len(ps) - rank):
            break
        passes[i] = True
    return passes


def holm(classes: Sequence[ClassVerdict], alpha: float = CI_TAIL) -> list[bool | None] | None:
    """Holm's step-down correction over the `classes` that have a held-out CI (those a report judges),
    familywise error at most `alpha`, one-sided as each CI: per class, in order, whether its pooled
    effect beyond random holds (True), does not (False; so for a class without a CI, which is not
    judged), or its resamples cannot tell (None: its p is only a bound, `ClassVerdict.p_bound`, and the
    correction passes it at p = 0 but not at the bound; the test is monotone in each p). None where a
    judged class has no p (a file saved before 2026-12-02). By position, not name: classes may share
    one (hop's routes of one hop)."""
    judged = [c for c in classes if c.has_ci]
    if any(math.isnan(c.p) for c in judged):
        return None
    sure = iter(_holm_passes([c.p for c in judged], alpha))  # each bound taken as the p
    hoped = iter(_holm_passes([0.0 if c.p_bound else c.p for c in judged], alpha))
    held: list[bool | None] = []
    for found in classes:
        passes = found.has_ci and next(sure)
        can = found.has_ci and next(hoped)
        held.append(True if passes else (None if can else False))
    return held


def select_heads(
    effects: Tensor, sign: int, effect_z: float, min_effect: float, min_share: float
) -> tuple[list[Head], Tensor, dict[str, float]]:
    """Heads whose effect [layer, head] (a drop: clean - patched) in direction `sign` (+1: the head
    helps, its drop is positive; -1: it works against the behaviour) is at least `min_effect` and
    either an outlier (sign * robust z >= effect_z) or at least `min_share` of the summed effect of
    all heads in that direction. Returns the heads (strongest first), the robust z-scores
    [layer, head] and the threshold figures."""
    z = robust_z(effects)
    signed = (sign * effects).nan_to_num(nan=0.0)
    share = signed / signed.clamp_min(0).sum().clamp_min(1e-12)
    patched = effects.isfinite()  # NaN: not patched (not a sender), never selected
    chosen = ((sign * z >= effect_z) | (share >= min_share)) & (signed >= min_effect) & patched
    heads = [tuple(map(int, index)) for index in chosen.nonzero()]
    heads.sort(key=lambda head: -sign * effects[head].item())
    median, mad = median_mad(effects)
    figures = {
        "median": median.item(),
        "mad": mad.item(),
        "effect_z": effect_z,
        "min_effect": min_effect,
        "min_share": min_share,
    }
    return heads, z, figures


@dataclass(kw_only=True)
class StratumFaithfulness:
    """A circuit's faithfulness on one stratum's prompts; None under `MIN_STRATUM_PROMPTS` prompts or
    where undefined."""

    kind: str
    name: str
    n_prompts: int
    summary: FaithfulnessSummary | None


def faithfulness_by_stratum(
    circuit: Float[Tensor, " prompt"],
    model: Float[Tensor, " prompt"],
    ablated: Float[Tensor, " prompt"],
    strata: Iterable[tuple[str, str, Tensor]],
    seed: int = 0,
    families: Sequence[str] | None = None,
) -> list[StratumFaithfulness]:
    """The circuit's faithfulness in each stratum (kind, name, members [prompt] bool; empty ones left
    out), from the metric per prompt with the circuit alone, the model and everything ablated; its CI
    resamples the prompts' `families` [prompt] first, where given."""
    out = []
    for kind, name, members in strata:
        n = int(members.sum())
        if n == 0:
            continue
        summary = None
        if n >= MIN_STRATUM_PROMPTS:
            try:
                summary = faithfulness_summary(
                    circuit[members],
                    model[members],
                    ablated[members],
                    seed=seed,
                    families=kept(families, members),
                )
            except ValueError:  # no gap between the model and everything ablated in this stratum
                summary = None
        out.append(StratumFaithfulness(kind=kind, name=name, n_prompts=n, summary=summary))
    return out


def held_out_faithfulness(
    circuit: Float[Tensor, " prompt"],
    model: Float[Tensor, " prompt"],
    ablated: Float[Tensor, " prompt"],
    strata: Iterable[tuple[str, str, Tensor]],
    seed: int = 0,
    n_boot: int = 1000,
    families: Sequence[str] | None = None,
) -> tuple[FaithfulnessSummary | None, list[StratumFaithfulness]]:
    """The circuit's faithfulness pooled and per stratum, from the metric per prompt, its CIs resampling
    the held-out `families` [prompt] first where given (as `judge_class`'s); (None, []) where undefined
    (the model does as well with everything ablated) or under MIN_STRATUM_PROMPTS prompts."""
    if len(model) < MIN_STRATUM_PROMPTS:
        return None, []
    try:
        summary = faithfulness_summary(circuit, model, ablated, n_boot, seed, families)
    except ValueError:
        return None, []
    return summary, faithfulness_by_stratum(circuit, model, ablated, strata, seed, families)


def faithfulness_band(ratio: float) -> str:
    """Where a faithfulness ratio lies: above, within or below 1 ± FAITHFUL_BAND, or below PARTIAL
    ("undefined" where it is NaN)."""
    if math.isnan(ratio):
        return "undefined"
    if ratio > OVERSHOOT:
        return "overshoots"
    if ratio >= 1 - FAITHFUL_BAND:
        return "within"
    return "partial" if ratio >= PARTIAL else "not faithful"


def band_spanned(ci: tuple[float, float]) -> str:
    """What a faithfulness CI leaves open, as a clause to add to a verdict read off the ratio: "" where
    both ends lie in one band; else the bands it reaches (no CI: too few prompts, or a value not finite)."""
    low, high = ci
    if not (math.isfinite(low) and math.isfinite(high)):
        return "; no CI, so the band is a point estimate's"
    if faithfulness_band(low) == faithfulness_band(high):
        return ""
    return (
        f"; undetermined at these prompts: its 95% CI [{low:.2f}, {high:.2f}] reaches from "
        f"'{faithfulness_band(low)}' to '{faithfulness_band(high)}'"
    )


def undetermined_faithfulness(summary: FaithfulnessSummary) -> str:
    """Why a faithfulness says nothing: it was saved resampling 2 or 3 families first, too few for a CI
    (`too_few_families`), or the model's own effect, the ratio's denominator m(model) - m(all ablated), has
    a 95% CI that spans 0 (an untrained model, a task it does not do); "" where neither holds or the
    figures were not kept (a summary saved before)."""
    if summary.too_few_families:
        return (
            f"undetermined: {summary.n_families} held-out families, {TOO_FEW_FAMILIES} for a CI or a "
            f"verdict (at least {MIN_FAMILIES}); the ratio ({summary.ratio:.2f}) holds for these "
            "families' prompts only"
        )
    low, high = summary.model_effect_ci
    if not low <= 0 <= high:
        return ""
    return (
        f"undetermined: the model's own effect on these prompts, m(model) - m(all ablated) = "
        f"{summary.model_effect:+.3g} [{low:+.3g}, {high:+.3g}] in the metric's units, is not told apart "
        f"from 0, so the ratio ({summary.ratio:.2f}) divides by noise: the model does not do the task here"
    )


def _in_band(ratio: float) -> str:
    """A ratio in two decimals, three where two would round it across a band's edge (0.7969: 0.797,
    not 0.80 beside "partial")."""
    shown = f"{ratio:.2f}"
    return shown if faithfulness_band(float(shown)) == faithfulness_band(ratio) else f"{ratio:.3f}"


def faithfulness_verdict(summary: FaithfulnessSummary, strata: Sequence[StratumFaithfulness] = ()) -> str:
    """In words: whether the circuit reproduces the model (ratio within 1 ± 0.2 and most prompts within
    it), overshoots (ratio above 1.2: it leaves out components that work against the answer), falls
    short, or does so only on average; and the strata that fall elsewhere, their CI excluding 1."""
    band = f"1 ± {FAITHFUL_BAND:g}"
    if not math.isfinite(summary.ratio):
        return "undefined: the metric is not finite (NaN/inf) on some prompts with the circuit kept"
    if undetermined := undetermined_faithfulness(summary):
        return undetermined
    if summary.overshoots:
        verdict = (
            f"overshoots: keeps {_in_band(summary.ratio)} of the model's effect (above {OVERSHOOT:g}), so "
        )
        verdict += "components left out work against the answer"
    elif summary.ratio < PARTIAL:
        verdict = f"not faithful: keeps {_in_band(summary.ratio)} of the model's effect (below {PARTIAL:g})"
    elif summary.ratio < 1 - FAITHFUL_BAND:
        verdict = (
            f"partial: keeps {_in_band(summary.ratio)} of the model's effect (below {1 - FAITHFUL_BAND:g})"
        )
    elif summary.within <= 0.5:  # most prompts: more than half
        verdict = (
            f"faithful on average only: the ratio is within {band} but {1 - summary.within:.0%} of prompts "
            f"are not (per-prompt error {summary.error:.2f})"
        )
    else:
        verdict = f"faithful: within {band}, and so are {summary.within:.0%} of prompts"
    verdict += band_spanned(summary.ratio_ci)
    off = [
        f"{s.name} {_in_band(s.summary.ratio)} ({faithfulness_band(s.summary.ratio)})"
        for s in strata
        if s.summary is not None
        and faithfulness_band(s.summary.ratio) != faithfulness_band(summary.ratio)
        and (s.summary.ratio_ci[0] > 1 or s.summary.ratio_ci[1] < 1)  # its CI excludes reproducing the model
    ]
    if off:
        verdict += f"; not in every stratum: {', '.join(off)}"
    return verdict
