"""Statistics of intervention results: one bootstrap, one faithfulness, robust z-scores (`robust_z`),
AUROC, the mean over the prompts real at each position (`masked_mean`, for mean ablation of padded
prompts).

Every confidence interval in interp is one bootstrap over prompts (`bootstrap`): prompts are
resampled with replacement (or, where they come in 4 or more families, the families and then the
prompts within them; in 2 or 3, each family's prompts within it: `resamples`) and the statistic
recomputed. The interval is the expanded percentile interval (`expanded_tail`), which a plain
percentile interval undercovers at small n: 80% at n = 4 and 91% at n = 12 for a 95% CI of normal
data. Faithfulness has one definition:

  faithfulness = (m(circuit) - m(ablated)) / (m(model) - m(ablated)),  means over prompts

where m(ablated) is the metric with the whole circuit's complement *and* the circuit ablated (the
empty circuit). Other ratios get other names. A ratio of means can hide per-prompt error (a circuit
that overshoots on half the prompts and falls short on the other half scores 1), so every report
gives it beside the per-prompt figures of `faithfulness_summary`:

  error  = mean_i |m_i(circuit) - m_i(model)| / |mean m(model) - mean m(ablated)|
           (the typical prompt's miss, in units of the model's effect: 0 is exact)
  within = the share of prompts i with |m_i(circuit) - m_i(model)| <= 0.2 |m_i(model) - m_i(ablated)|
           (the prompt's own faithfulness within 1 +- 0.2)
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from interp.types import upcast


def masked_mean(values: Tensor, real: Bool[Tensor, "..."], dim: int, keepdim: bool = False) -> Tensor:
    """The mean of `values` along `dim` over the entries where `real` (broadcastable to `values`,
    e.g. [prompt, pos, 1, ...], False at padding) is True; NaN where none is. Summed in float32 at
    least (a float16 sum of a few hundred activations overflows), returned in `values`' dtype."""
    real = real.to(values.device)
    total = torch.where(real, upcast(values), 0).sum(dim, keepdim=keepdim)
    return (total / real.sum(dim, keepdim=keepdim).to(total.dtype)).to(values.dtype)


def resamples(
    n: int, n_boot: int, seed: int = 0, families: Sequence[Hashable] | None = None
) -> Int[Tensor, "n_boot n"]:
    """The bootstrap's resamples of n prompts: indices drawn with replacement, seeded. With `families`
    (a label per prompt: a template, relation, task) of `MIN_FAMILIES` or more, two stages: the k
    families are drawn with replacement, then n prompts with replacement, each in proportion to how
    often its family was drawn; a CI then covers the effect on new families of the kind, not only on
    new prompts of these. With 2 or 3 families, too few to stand for new ones, each family's prompts
    are drawn from its own (as many as it has): a CI covers new prompts of these families, in these
    proportions. One family is the plain resample. The last few draws of up to `REMEMBERED_INDICES`
    indices are remembered (a CI and a p taken on one resampling draw it once); each call gets its own
    copy."""
    if n < 1:
        raise ValueError("A bootstrap needs at least one prompt.")
    if families is not None and len(families) != n:
        raise ValueError(f"{len(families)} family labels for {n} prompts: give one label per prompt")
    key = (n, n_boot, seed, None if families is None else tuple(families))
    return _draw_resamples(*key) if n * n_boot > REMEMBERED_INDICES else _remembered_resamples(*key).clone()


REMEMBERED_INDICES = 1 << 22  # 32 MB of indices: 10,000 resamples of up to 419 prompts


def _draw_resamples(n: int, n_boot: int, seed: int, families: tuple[Hashable, ...] | None) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    if families is None or len(set(families)) < 2:
        return torch.randint(n, (n_boot, n), generator=generator)
    index = {family: i for i, family in enumerate(dict.fromkeys(families))}
    of_prompt = torch.tensor([index[family] for family in families])  # [n]
    if len(index) < MIN_FAMILIES:  # within each family: its prompts from its own, in place
        drawn = torch.empty(n_boot, n, dtype=torch.long)
        for family in range(len(index)):
            members = (of_prompt == family).nonzero().flatten()  # [m]
            picks = torch.randint(len(members), (n_boot, len(members)), generator=generator)  # [n_boot, m]
            drawn[:, members] = members[picks]
        return drawn
    drawn = torch.randint(len(index), (n_boot, len(index)), generator=generator)  # [n_boot, k]
    times = torch.zeros(n_boot, len(index)).scatter_add_(1, drawn, torch.ones(drawn.shape))  # [n_boot, k]
    return torch.multinomial(times[:, of_prompt], n, replacement=True, generator=generator)


_remembered_resamples = functools.lru_cache(maxsize=4)(_draw_resamples)


MIN_FAMILIES = 4
"""The fewest families a CI resamples first (`resamples`), so that it covers new families. The expanded
interval of 2 or 3 units is the range of their resamples, narrower than the t interval of so few: two
families whose effects are drawn around 0 gave a class CI above 0 in 11% of draws (2.5% claimed), and
the least one-sided p that 10,000 resamples of 2 or 3 families can show is 0.11 or 0.046
(`expanded_p`). So 2 or 3 families are not the units: their prompts are, resampled within each
family, and the CI covers those families' prompts only (as it does for one family)."""


def family_count(families: Sequence[Hashable] | None) -> int:
    """How many families `resamples` draws first: the distinct `families` where they are `MIN_FAMILIES`
    or more, else 0 (none given, or 1 to 3: the prompts are the units)."""
    k = 0 if families is None else len(set(families))
    return k if k >= MIN_FAMILIES else 0


def too_few_families(n_families: int) -> bool:
    """Whether a figure saved before 2026-12-04 resampled 2 or 3 families first (its `n_families`), which
    then gave no CI; `family_count` never gives 2 or 3."""
    return 2 <= n_families < MIN_FAMILIES


def resampled_units(n: int, families: Sequence[Hashable] | None = None) -> int:
    """How many independent units `resamples` draws from n prompts: their families where there are
    `MIN_FAMILIES` or more, else the prompts. The expanded interval's n (`expanded_tail`, `expanded_p`)."""
    return family_count(families) or n


def expanded_tail(n: int, level: float = 0.95) -> float:
    """The tail probability at which the expanded percentile interval (Hesterberg 2015, "What teachers
    should know about the bootstrap", 6.5) takes its quantiles for a `level` CI from n independent
    units (prompts, or families): Phi(-sqrt(n / (n - 1)) t), t Student's quantile with n - 1 degrees
    of freedom (Abramowitz & Stegun 26.7.5, within 0.1% from 3 degrees up). n = 64: 0.019 for a 95%
    CI; n = 12: 0.011; n = 4: 0.0001, the resamples' range."""
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    df = max(n - 1, 1)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    t = z + sum(term / df**power for power, term in enumerate(terms, 1))
    return NormalDist().cdf(-math.sqrt(max(n, 2) / df) * t)


def expanded_p(tail: float, n: int) -> float:
    """The one-sided p-value of the expanded percentile interval: the p whose two-sided (1 - 2p) interval
    from n units has its bound where a share `tail` of the resamples lies beyond it (`expanded_tail(n,
    1 - 2p) = tail`). A 95% CI excludes 0 on one side where the share of resamples on the other side is
    below `expanded_tail(n)`, which is where this p is below 0.025. tail >= 0.5: p = tail."""
    if tail >= 0.5:
        return tail
    low, high = 1e-12, 0.5  # expanded_tail(n, 1 - 2p) rises with p
    for _ in range(100):
        middle = math.sqrt(low * high)  # bisection in log p: p spans orders of magnitude
        low, high = (middle, high) if expanded_tail(n, 1 - 2 * middle) < tail else (low, middle)
    return high


def bootstrap(
    statistic: Callable[[Tensor], Tensor],
    n: int,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    defined: Bool[Tensor, "..."] | bool = True,
    families: Sequence[Hashable] | None = None,
) -> tuple[Tensor, Tensor]:
    """Expanded percentile bootstrap over n prompts: statistic(samples) maps resampled prompt indices
    [n_boot, n] to values [..., n_boot]; returns the (low, high) quantiles over the last axis at
    `expanded_tail` of the units resampled: the prompts, or their `families` (`resamples`).

    defined: where the statistic is defined on the prompts themselves ([...]; False where a prompt's
    value is NaN/inf): elsewhere the CI is NaN, not the CI of the resamples that miss that prompt. A
    resample whose statistic alone is undefined (a ratio whose denominator is 0 on those prompts) is
    left out, with a warning saying how many; if every resample is, it raises, and where more than the
    interval's tail share are, the CI is NaN (the resamples left out could lie beyond either end: those
    kept would give a CI as narrow as the few prompts that define the value). One prompt (n = 1) has
    no CI: NaN."""
    values = statistic(resamples(n, n_boot, seed, families))
    no_ci = ~torch.as_tensor(defined, device=values.device)[..., None]  # [..., 1]
    no_ci = no_ci | (n < 2)  # every resample is the one prompt: a CI of width 0 would claim certainty
    undefined = ~torch.isfinite(values) & ~no_ci
    if undefined.all(-1).any():
        raise ValueError(
            f"every one of the {n_boot} bootstrap resamples gives an undefined value (NaN/inf), so there is "
            "no confidence interval: a ratio's denominator is 0 on every resample. Use prompts where the "
            "metric differs between the runs it is normalised by"
        )
    tail = expanded_tail(resampled_units(n, families), level)
    too_many = undefined.sum(-1, keepdim=True) > tail * n_boot  # [..., 1]
    if undefined.any():
        warnings.warn(
            f"{int(undefined.sum(-1).max())} of {n_boot} bootstrap resamples give an undefined value "
            "(NaN/inf: a denominator of 0 on the resampled prompts) and are left out of the confidence "
            "interval"
            + (
                f"; more than its tail ({tail:.3g}) are, so there is no CI (NaN): use prompts where the "
                "metric differs between the runs it is normalised by"
                if too_many.any()
                else ""
            ),
            RuntimeWarning,
            stacklevel=2,
        )
    values = values.masked_fill(undefined | no_ci | too_many, torch.nan)  # a row of NaN only: a NaN CI
    return values.nanquantile(tail, dim=-1), values.nanquantile(1 - tail, dim=-1)


def bootstrap_ci(
    values: Float[Tensor, "... batch"],
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
    families: Sequence[Hashable] | None = None,
) -> tuple[Float[Tensor, "..."], Float[Tensor, "..."]]:
    """The `bootstrap` CI of the mean over the last axis (prompts, of `families` where given), for every
    row (NaN for a row holding a NaN/inf value, whose mean is not finite)."""

    def mean(samples: Tensor) -> Tensor:
        return values[..., samples].mean(-1)

    defined = torch.isfinite(values).all(-1)
    return bootstrap(mean, values.shape[-1], n_boot, ci, seed, defined=defined, families=families)


def defined_gap(gap: Tensor, scale: float) -> Tensor:
    """Where a ratio's denominator `gap` is finite and not (numerically) zero: abs(gap) > 1e-6 * scale,
    `scale` the size of the values it is a difference of (a metric of probabilities near 1e-7 has
    gaps of that size)."""
    return torch.isfinite(gap) & (gap.abs() > 1e-6 * scale)


def _scale(model: Tensor, ablated: Tensor) -> float:
    """The size of a faithfulness's values: the larger mean |value| of the model's and the ablated runs."""
    return max(float(model.abs().mean()), float(ablated.abs().mean()))


def faithfulness_ratio(
    circuit: Float[Tensor, "... batch"], model: Float[Tensor, " batch"], ablated: Float[Tensor, " batch"]
) -> Float[Tensor, "..."]:
    """(mean m(circuit) - mean m(ablated)) / (mean m(model) - mean m(ablated)); see the module docstring."""
    for values, run in ((model, "the model's run"), (ablated, "the run with everything ablated")):
        if not bool(torch.isfinite(values).all()):
            raise ValueError(
                f"Faithfulness is undefined: the metric is not finite (NaN or inf) on "
                f"{int((~torch.isfinite(values)).sum())} of {values.numel()} prompts of {run}; leave those "
                "prompts out, or check the metric"
            )
    gap = model.mean() - ablated.mean()
    if not defined_gap(gap, _scale(model, ablated)):
        raise ValueError(
            "Faithfulness is undefined: the metric is the same for the model and with everything ablated "
            f"({float(model.mean()):.4g} vs {float(ablated.mean()):.4g}). Use prompts the model does the "
            "task on, or another ablation."
        )
    return (circuit.mean(-1) - ablated.mean()) / gap


FAITHFUL_BAND = 0.2  # a prompt is reproduced when its own faithfulness is within 1 +- this
OVERSHOOT = 1 + FAITHFUL_BAND  # a circuit above this keeps more than the model does
PARTIAL = 0.5  # a circuit below this keeps too little of the model's effect to be partial: not faithful


@dataclass(kw_only=True)
class FaithfulnessSummary:
    """A circuit's faithfulness on n prompts: the ratio of means with its 95% bootstrap CI, the
    per-prompt figures (`error`, `within`: see the module docstring), unitless; the ratio's
    denominator, the model's own effect mean m(model) - m(ablated) with its CI, in the metric's units
    (NaN in a summary saved before it was kept); and the families its CIs resample first (`family_count`:
    0 for none or fewer than `MIN_FAMILIES`, and in a summary saved before it was kept; 2 or 3 only in
    one saved before 2026-12-04, which has no CI)."""

    n_prompts: int
    ratio: float
    ratio_ci: tuple[float, float]
    error: float
    within: float
    model_effect: float = math.nan
    model_effect_ci: tuple[float, float] = (math.nan, math.nan)
    n_families: int = 0

    @property
    def too_few_families(self) -> bool:
        """Whether it was saved resampling 2 or 3 families first, with no CI (`too_few_families`)."""
        return too_few_families(self.n_families)

    @property
    def overshoots(self) -> bool:
        """The circuit alone does more than the model: left-out components work against the answer."""
        return self.ratio > OVERSHOOT


def faithfulness_ci(
    circuit: Float[Tensor, "K batch"],
    model: Float[Tensor, " batch"],
    ablated: Float[Tensor, " batch"],
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    families: Sequence[Hashable] | None = None,
) -> tuple[Float[Tensor, " K"], Float[Tensor, " K"]]:
    """The `bootstrap` CI of each circuit's `faithfulness_ratio` (prompts resampled, their `families`
    first where given, the ratio recomputed); resamples whose denominator is 0 are left out, with a
    warning saying how many."""
    scale = _scale(model, ablated)

    def ratio(samples: Tensor) -> Tensor:  # samples [n_boot, n] -> [K, n_boot]; NaN where undefined
        empty, full = ablated[samples].mean(1), model[samples].mean(1)
        gap = full - empty
        return torch.where(defined_gap(gap, scale), (circuit[:, samples].mean(-1) - empty) / gap, torch.nan)

    finite = torch.isfinite(circuit).all(-1) & torch.isfinite(model).all() & torch.isfinite(ablated).all()
    return bootstrap(ratio, model.shape[0], n_boot, level, seed, finite, families)


def faithfulness_summary(
    circuit: Float[Tensor, " batch"],
    model: Float[Tensor, " batch"],
    ablated: Float[Tensor, " batch"],
    n_boot: int = 1000,
    seed: int = 0,
    families: Sequence[Hashable] | None = None,
) -> FaithfulnessSummary:
    """The faithfulness of one circuit from the metric per prompt with the circuit alone, the model
    and everything ablated ([batch] each): the ratio of means, its CI (resampling the prompts'
    `families` first, where given), the per-prompt figures (NaN where a circuit value is not finite)
    and the model's effect over everything ablated with its CI."""
    circuit, model, ablated = (values.detach().double().cpu() for values in (circuit, model, ablated))
    ratio = float(faithfulness_ratio(circuit, model, ablated))
    low, high = faithfulness_ci(circuit[None], model, ablated, n_boot, seed=seed, families=families)
    miss = (circuit - model).abs()
    error = float(miss.mean() / (model.mean() - ablated.mean()).abs())
    within = float((miss <= FAITHFUL_BAND * (model - ablated).abs()).double().mean())
    if not bool(torch.isfinite(circuit).all()):  # no figure of the circuit, as its CI
        ratio = error = within = math.nan
    effect_low, effect_high = bootstrap_ci(model - ablated, n_boot, seed=seed, families=families)
    return FaithfulnessSummary(
        n_prompts=len(model),
        ratio=ratio,
        ratio_ci=(float(low[0]), float(high[0])),
        error=error,
        within=within,
        model_effect=float((model - ablated).mean()),
        model_effect_ci=(float(effect_low), float(effect_high)),
        n_families=family_count(families),
    )


def median_mad(values: Tensor) -> tuple[Tensor, Tensor]:
    """Median and median absolute deviation of the finite entries of `values`; of an even count, the
    mean of the two middle values (so negating `values` negates the median and keeps the MAD)."""
    finite = upcast(values[values.isfinite()])  # quantile takes float32 or float64 only
    median = finite.quantile(0.5)
    return median, (finite - median).abs().quantile(0.5)


def robust_z(values: Tensor) -> Tensor:
    """(x - median) / (1.4826 MAD) over the finite entries; NaN stays NaN.

    1.4826 MAD estimates the standard deviation of normal data, and unlike it ignores the outliers
    we are looking for. A zero MAD (most values equal) falls back to the mean absolute deviation.
    """
    median, mad = median_mad(values)
    spread = 1.4826 * mad
    if spread <= 1e-12:
        finite = values[values.isfinite()]
        spread = (finite - median).abs().mean().clamp_min(1e-12)
    return (values - median) / spread


def auroc(scores: Float[Tensor, " n"], positive: Bool[Tensor, " n"]) -> float:
    """Area under the ROC curve of ranking `positive` items first by `scores` (ties count half)."""
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(
            f"AUROC needs finite scores; {int((~torch.isfinite(scores)).sum())} of {scores.numel()} are not "
            "(NaN/inf): leave those items out"
        )
    pos, neg = scores[positive], scores[~positive]
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError("AUROC needs at least one positive and one negative item.")
    greater = (pos[:, None] > neg[None, :]).float().mean()
    ties = (pos[:, None] == neg[None, :]).float().mean()
    return float(greater + 0.5 * ties)


def groups_differ_p(
    values: Float[Tensor, " batch"],
    groups: Int[Tensor, " batch"],
    blocks: Int[Tensor, " batch"] | None = None,
    n_perm: int = 2000,
    seed: int = 0,
) -> float:
    """Permutation test that the `groups` (strata) do not matter to `values`: the p-value of the spread of
    the groups' means, sum_g n_g (mean_g - mean)², among `n_perm` shufflings of the group labels.

    values: one value per prompt; groups: each prompt's group (any integer labels). blocks: each
    prompt's family, where families cross the groups (a family holds prompts of two or more groups):
    labels are then shuffled within each family only, so that a family's own effect is not read as a
    difference between the groups; where each group is a union of families, two or more in some, the
    families' labels are shuffled among the families (whole families move: their prompts share their
    effect); where each group is one family, among all prompts (do the families differ beyond their
    prompts' spread). p = (1 + shufflings at least as spread) / (1 + n_perm): small when the groups'
    means differ beyond what the assignment of prompts explains. nan with fewer than two groups; refuses
    values that are not all finite (no mean to compare)."""
    if not torch.isfinite(values).all():
        raise ValueError(
            f"values must be finite to compare the groups' means; {int((~torch.isfinite(values)).sum())} of "
            f"{values.numel()} are not: leave those prompts out"
        )
    labels = torch.unique(groups.cpu(), return_inverse=True)[1]
    n_groups = int(labels.max()) + 1 if len(labels) else 0
    if n_groups < 2:
        return float("nan")
    values = values.detach().cpu().double()

    def spread(assigned: Int[Tensor, "perm batch"]) -> Float[Tensor, " perm"]:
        sums, counts = (torch.zeros(len(assigned), n_groups, dtype=torch.float64) for _ in range(2))
        sums.scatter_add_(1, assigned, values.expand(len(assigned), -1))
        counts.scatter_add_(1, assigned, torch.ones_like(values).expand(len(assigned), -1))
        return (sums**2 / counts).sum(1)  # sum_g n_g mean_g², which orders shufflings as the spread does

    block = torch.zeros_like(labels) if blocks is None else torch.unique(blocks.cpu(), return_inverse=True)[1]
    pairs = torch.unique(torch.stack([block, labels]), dim=1)  # [2, distinct (family, group)], by family
    generator = torch.Generator().manual_seed(seed)
    crossed = bool(torch.bincount(pairs[0]).max() > 1)  # a family holds two groups or more
    if blocks is not None and not crossed and pairs.shape[1] > n_groups:
        # each group a union of whole families, some of several: shuffle the families' labels
        shuffled = torch.argsort(torch.rand(n_perm, pairs.shape[1], generator=generator), dim=1)
        assigned = pairs[1][shuffled][:, block]  # [perm, batch]: each prompt its family's new label
    else:
        if not crossed:
            block = torch.zeros_like(labels)  # each group one family, or none given: among all prompts
        by_block = torch.argsort(block, stable=True)  # each block's prompts, blocks in order
        shuffled = torch.argsort(block + torch.rand(n_perm, len(labels), generator=generator), dim=1)
        assigned = torch.empty(n_perm, len(labels), dtype=torch.long)
        assigned[:, by_block] = labels[shuffled]  # within each block, its labels in a random order
    observed = spread(labels[None])[0]
    at_least = (spread(assigned) >= observed * (1 - 1e-12)).sum().item()
    return (1 + at_least) / (1 + n_perm)
