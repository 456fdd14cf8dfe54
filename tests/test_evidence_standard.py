"""The standard of evidence every verdict shares: CIs that cover what they claim at the sizes the
analyses use, families resampled where the claim is about new families, and random baselines that do
not rest on which sets the seed repeated. Each property is checked on data drawn with a known truth."""

import dataclasses
import math
from collections import Counter

import pytest
import torch
from conftest import tiny_config

import interp
from circuits.evidence import (
    CI_TAIL,
    DEPENDENCE_ALPHA,
    HeadClass,
    Strata,
    held_out_faithfulness,
    held_out_note,
    judge_class,
    random_same_layer_sets,
)
from interp.interventions.stats import bootstrap_ci, expanded_tail, groups_differ_p, resamples

REPS = 2000  # simulated data sets per size: a coverage of 0.95 is measured to about +-0.01


def binomial_band(rate: float, n: int) -> float:
    """Four standard errors of a rate measured on n trials."""
    return 4 * (rate * (1 - rate) / n) ** 0.5


@pytest.mark.parametrize("n", [8, 12, 24])
def test_a_95_percent_ci_covers_the_mean_95_percent_of_the_time_at_small_n(n):
    """Normal data of mean 0: the plain percentile bootstrap covered 89.5% at n = 8 and 91% at n = 12
    (one-sided misses 5.3% and 4.3% against 2.5%, each a false "confirmed")."""
    values = torch.randn(REPS, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    low, high = bootstrap_ci(values, seed=1)
    covered = ((low <= 0) & (high >= 0)).double().mean().item()
    assert covered >= 0.95 - binomial_band(0.95, REPS) - 0.015  # the bootstrap's own small-n shortfall
    above = (low > 0).double().mean().item()  # a CI wholly above a true mean of 0: a false claim
    assert above <= 0.025 + binomial_band(0.025, REPS) + 0.015


def test_the_expanded_tail_is_the_t_interval_s_width_in_percentiles():
    """Phi(-sqrt(n / (n - 1)) t_{n-1}): at large n the plain 2.5%; at n = 4 (t_3 = 3.182) 0.00012."""
    assert expanded_tail(10_000) == pytest.approx(0.025, abs=1e-4)
    assert expanded_tail(4) == pytest.approx(0.000117, rel=0.05)
    assert expanded_tail(12) == pytest.approx(0.0108, rel=0.02)  # t_11 = 2.201
    assert expanded_tail(12, level=0.9) > expanded_tail(12)


def test_a_ci_over_families_covers_the_effect_on_new_families():
    """Prompts in 8 families whose effects differ (family sd 1, prompt sd 1, 6 prompts each): the CI over
    prompts treats 48 prompts as independent and misses the mean over new families; the CI that
    resamples the families first covers it."""
    generator = torch.Generator().manual_seed(0)
    labels = [f"T{i // 6}" for i in range(48)]
    reps, over_prompts, over_families = 300, 0, 0
    for rep in range(reps):
        family = torch.randn(8, 1, generator=generator, dtype=torch.float64)
        values = (family + torch.randn(8, 6, generator=generator, dtype=torch.float64)).reshape(-1)
        low, high = bootstrap_ci(values, seed=rep)
        over_prompts += bool(low <= 0 <= high)
        low, high = bootstrap_ci(values, seed=rep, families=labels)
        over_families += bool(low <= 0 <= high)
    assert over_prompts / reps < 0.85
    assert over_families / reps >= 0.95 - binomial_band(0.95, reps)


def test_family_resamples_draw_whole_families_and_keep_the_size():
    """Four or more families are drawn first, so a resample can miss a family; two or three are too few
    to stand for new ones, so each family's prompts are drawn from its own, in place."""
    labels = ["a"] * 3 + ["b"] * 5 + ["c"] * 4 + ["d"] * 2
    drawn = resamples(14, 400, seed=2, families=labels)
    assert drawn.shape == (400, 14)
    family_of = torch.tensor([ord(label) - ord("a") for label in labels])
    n_drawn = torch.stack([(family_of[drawn] == f).any(1) for f in range(4)]).sum(0)  # [400]
    assert (n_drawn < 4).double().mean() > 0.8  # every family drawn: 4! / 4**4 = 0.09 of resamples at most
    for few in (labels[:8], labels[:12]):  # 2 and 3 families
        drawn = resamples(len(few), 400, seed=2, families=few)
        assert torch.equal(family_of[drawn], family_of[: len(few)].expand(400, -1))
        assert all(len(set(row)) > 1 for row in drawn.tolist()[:10])  # resampled, not copied
    assert torch.equal(resamples(12, 400, seed=2, families=["x"] * 12), resamples(12, 400, seed=2))
    with pytest.raises(ValueError, match="one label per prompt"):
        resamples(12, 10, families=labels[:-1])


def test_a_resampling_drawn_again_is_the_same_and_each_caller_owns_its_copy():
    """A CI and a p on one resampling draw it once (remembered); a caller that writes into its
    resamples changes no one else's, remembered (12 prompts) or not (more than REMEMBERED_INDICES)."""
    labels = ["a"] * 5 + ["b"] * 7
    for n_boot in (400, interp.interventions.stats.REMEMBERED_INDICES // 12 + 1):
        first = resamples(12, n_boot, seed=3, families=labels)
        kept = first.clone()
        first.zero_()
        again = resamples(12, n_boot, seed=3, families=list(labels))
        assert torch.equal(again, kept) and again.data_ptr() != first.data_ptr()
    assert not torch.equal(resamples(12, 400, seed=4, families=labels), kept[:400])


def test_the_prompts_of_one_family_get_the_prompts_ci():
    """A stratum of one template (relation) resamples its prompts, so its CI is theirs: not the range of
    the resamples that an interval over one family would be."""
    values = torch.randn(24, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert bootstrap_ci(values, seed=5, families=["T0"] * 24) == bootstrap_ci(values, seed=5)


def test_a_class_that_holds_in_one_family_only_is_not_confirmed_for_new_families():
    """A class beyond random on 48 prompts, all of its effect from one of 6 held-out families: judged
    per prompt, its CI excluded 0; judged over families, it does not."""
    generator = torch.Generator().manual_seed(1)
    labels = [f"T{i // 8}" for i in range(48)]
    effects = 0.05 * torch.randn(5, 48, generator=generator, dtype=torch.float64)
    effects[0, :8] += 1.0  # the class's effect lives in T0 alone
    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3, 4)])
    assert judge_class(found, effects).verdict == "confirmed"
    judged = judge_class(found, effects, strata=Strata(families=labels))
    assert judged.verdict == "unconfirmed" and judged.heldout.beyond_ci[0] <= 0


def test_a_small_pool_is_weighed_equally_whatever_the_seed(tiny_model):
    """Three other heads in the class's layer: three distinct sets. Drawn independently, 8 draws gave
    one of them 5 of the 8 at some seeds (toy-hop's L0H1), and its effect made the baseline."""
    outside = [(0, 0), (0, 1), (0, 3)]
    for seed in range(12):
        draws = random_same_layer_sets(tiny_model, [(0, 2)], 8, seed=seed, outside=outside)
        counts = Counter(tuple(draw) for draw in draws)
        assert sorted(counts) == [((0, 0),), ((0, 1),), ((0, 3),)]
        assert set(counts.values()) == {2}  # 8 // 3 each


def test_a_larger_pool_draws_no_set_twice_and_every_set_alike():
    model = interp.HookedTransformer(tiny_config(n_heads=8))  # seven other heads in the class's layer
    counts: Counter = Counter()
    for seed in range(300):
        draws = random_same_layer_sets(model, [(1, 0), (1, 5)], 5, seed=seed)  # 15 pairs of 6 others
        assert len({tuple(draw) for draw in draws}) == 5
        assert all(len(draw) == 2 and {layer for layer, _ in draw} == {1} for draw in draws)
        assert all((1, 0) not in draw and (1, 5) not in draw for draw in draws)
        assert random_same_layer_sets(model, [(1, 0), (1, 5)], 5, seed=seed) == draws  # seeded
        counts.update(tuple(draw) for draw in draws)
    assert len(counts) == 15 and max(counts.values()) < 1.4 * min(counts.values())  # 100 each expected


def test_a_layer_with_too_few_heads_lends_from_other_layers(tiny_model):
    """The class holds 3 of layer 1's 4 heads: each set takes layer 1's last free head and two others."""
    draws = random_same_layer_sets(tiny_model, [(1, 0), (1, 1), (1, 2)], 4, seed=0)
    assert len({tuple(draw) for draw in draws}) == 4
    assert all((1, 3) in draw and len(set(draw)) == 3 for draw in draws)
    assert all(not {(1, 0), (1, 1), (1, 2)} & set(draw) for draw in draws)


def test_a_class_beyond_random_pooled_but_in_no_order_alone_says_so():
    """Pooled beyond random (24 prompts), but neither name order's CI (12 prompts each) excludes 0:
    unconfirmed, and the reason names the orders, not "the analysis's other evidence"; the report's line
    of the class says it (its note alone says the pooled effect holds)."""
    from circuits.sections import ClassView, class_sections

    spread = torch.linspace(-1.6, 1.6, 12, dtype=torch.float64)  # sd about 1
    effects = torch.zeros(5, 24, dtype=torch.float64)
    effects[0] = 0.55 + torch.cat([spread, spread.flip(0)])
    effects[1:] = (
        0.01 * torch.arange(24, dtype=torch.float64).remainder(3) * torch.tensor([[1], [-1], [2], [-2]])
    )
    orders = [("order", name, torch.arange(24) < 12 if i == 0 else torch.arange(24) >= 12)
              for i, name in enumerate(("ABBA", "BABA"))]  # fmt: skip
    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3, 4)])
    judged = judge_class(found, effects, strata=Strata(orders, {"order": "all"}, by_ci=("order",)))
    assert judged.heldout.beyond_ci[0] > 0 and [s.holds for s in judged.strata] == [False, False]
    assert judged.verdict == "unconfirmed"
    assert judged.unconfirmed_because == "beyond random heads pooled, but in no order alone (ABBA, BABA)"
    line = next(line for line in class_sections([judged], ClassView())[0].lines if line.startswith("c: "))
    assert line.endswith("(unconfirmed: beyond random heads pooled, but in no order alone (ABBA, BABA))")


def test_a_circuit_s_faithfulness_ci_covers_its_spread_over_families():
    """Four held-out families where the circuit keeps 0.3, 0.6, 0.9 and 1.2 of the model's effect: the CI
    over prompts is narrow around the pooled 0.75, the CI over families spans most of that spread."""
    generator = torch.Generator().manual_seed(3)
    model = 2.0 + 0.1 * torch.randn(48, generator=generator, dtype=torch.float64)
    ablated = torch.zeros(48, dtype=torch.float64)
    kept = torch.tensor([0.3, 0.6, 0.9, 1.2], dtype=torch.float64).repeat_interleave(12)
    circuit = kept * model + 0.02 * torch.randn(48, generator=generator, dtype=torch.float64)
    labels = [f"T{i // 12}" for i in range(48)]
    over_prompts, _ = held_out_faithfulness(circuit, model, ablated, [])
    over_families, strata = held_out_faithfulness(
        circuit, model, ablated, [("order", "all", torch.ones(48, dtype=torch.bool))], families=labels
    )
    low, high = over_families.ratio_ci
    assert over_families.ratio == pytest.approx(over_prompts.ratio)
    assert low < 0.5 and high > 1.0 and high - low > 3 * (over_prompts.ratio_ci[1] - over_prompts.ratio_ci[0])
    assert strata[0].summary.ratio_ci == pytest.approx(
        over_families.ratio_ci
    )  # the stratum resamples them too


@pytest.mark.parametrize("sizes", [(32, 32), (4,) * 8])
def test_strata_of_one_effect_differ_at_the_test_s_rate(sizes):
    """Normal values, the same mean in every group: p < 0.05 in about 5% of 400 data sets (2 groups of
    32 prompts; 8 of 4, the smallest strata that get a verdict); a difference of 0.8 SD between two
    groups of 32 is found in most."""
    generator = torch.Generator().manual_seed(len(sizes))
    groups = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    null = [groups_differ_p(torch.randn(len(groups), generator=generator), groups, n_perm=400, seed=i)
            for i in range(400)]  # fmt: skip
    assert sum(p < DEPENDENCE_ALPHA for p in null) / 400 <= 0.05 + binomial_band(0.05, 400)
    if len(sizes) == 2:
        values = torch.randn(100, 64, generator=generator) + 0.8 * groups
        shifted = [groups_differ_p(values[i], groups, n_perm=400, seed=i) for i in range(100)]
        assert sum(p < DEPENDENCE_ALPHA for p in shifted) / 100 >= 0.7


def test_strata_are_compared_within_the_families_they_cross():
    """Eight families of large effects (SD 3), each with 7 prompts of one order and 1 of the other: the
    orders' means differ by which families lean to which order, not by order. Shuffled among all
    prompts the test finds a difference in over a fifth of 200 data sets; within each family, at its rate."""
    generator = torch.Generator().manual_seed(5)
    families = torch.arange(8).repeat_interleave(8)
    orders = torch.tensor(([0] * 7 + [1] + [1] * 7 + [0]) * 4)
    free, within = [], []
    for i in range(200):
        values = 3 * torch.randn(8, generator=generator)[families] + torch.randn(64, generator=generator)
        free.append(groups_differ_p(values, orders, n_perm=400, seed=i))
        within.append(groups_differ_p(values, orders, families, n_perm=400, seed=i))
    assert sum(p < DEPENDENCE_ALPHA for p in free) / 200 > 0.2
    assert sum(p < DEPENDENCE_ALPHA for p in within) / 200 <= 0.05 + binomial_band(0.05, 200)
    with pytest.raises(ValueError, match="1 of 64 are not: leave those prompts out"):
        groups_differ_p(torch.where(torch.arange(64) == 5, torch.nan, values), orders)
    # groups that are each one family: do the families differ beyond their prompts' spread
    assert groups_differ_p(values, families, families, n_perm=99) == groups_differ_p(
        values, families, n_perm=99
    )


def test_strata_that_are_unions_of_families_are_compared_by_whole_families():
    """Two strata of four families each (SD 1 between families, 0.3 within), no stratum effect: shuffled
    among all prompts the test finds a difference in a third of 200 data sets; shuffling the families'
    labels, at its rate; a stratum effect of 3 family SDs is still found in most."""
    generator = torch.Generator().manual_seed(7)
    families = torch.arange(8).repeat_interleave(6)
    strata = (families >= 4).long()
    free, whole, shifted = [], [], []
    for i in range(200):
        values = torch.randn(8, generator=generator)[families] + 0.3 * torch.randn(48, generator=generator)
        free.append(groups_differ_p(values, strata, n_perm=400, seed=i))
        whole.append(groups_differ_p(values, strata, families, n_perm=400, seed=i))
        if i < 50:
            shifted.append(groups_differ_p(values + 3 * strata, strata, families, n_perm=400, seed=i))
    assert sum(p < DEPENDENCE_ALPHA for p in free) / 200 > 0.2
    assert sum(p < DEPENDENCE_ALPHA for p in whole) / 200 <= 0.05 + binomial_band(0.05, 200)
    assert sum(p < DEPENDENCE_ALPHA for p in shifted) / 50 >= 0.7


def test_a_class_is_order_dependent_only_where_the_orders_differ():
    """One order's CI reaching 0 while the other's does not is no difference between them: the same
    effect (+0.3) in both orders, the BABA prompts noisier, is confirmed with the reason in its note;
    BABA at -0.3 instead makes the class order-dependent."""
    tight = torch.linspace(0.1, 0.5, 16, dtype=torch.float64)
    noisy = 0.3 + torch.linspace(-1.5, 1.5, 16, dtype=torch.float64)
    orders = [("order", name, (torch.arange(32) < 16) == (name == "ABBA")) for name in ("ABBA", "BABA")]
    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, 1)]])
    ruled = Strata(orders, {"order": "all"}, by_ci=("order",))
    same = judge_class(found, torch.stack([torch.cat([tight, noisy]), torch.zeros(32, dtype=torch.float64)]),
                       strata=ruled)  # fmt: skip
    assert [s.holds for s in same.strata] == [True, False] and same.heldout.beyond_ci[0] > 0
    assert same.differ_p["order"] > 0.5 and same.verdict == "confirmed"
    assert "not hold in the order BABA alone, but the order strata differ no more than chance" in same.note
    against = torch.cat([tight, -0.3 + 0.1 * torch.linspace(-1, 1, 16, dtype=torch.float64)])
    against = torch.cat([against[:16] + 0.5, against[16:]])  # pooled still above 0
    differs = judge_class(found, torch.stack([against, torch.zeros(32, dtype=torch.float64)]), strata=ruled)
    assert differs.heldout.beyond_ci[0] > 0 and differs.differ_p["order"] < 0.01
    assert differs.verdict == "order-dependent" and "the order strata differ (p = " in differs.note


@pytest.mark.parametrize("analysis", ["retrieval", "function vectors", "ioi", "heads"])
def test_a_legend_that_states_the_verdict_rule_states_the_strata_that_differ_no_more_than_chance(analysis):
    """A class whose stratum falls short while its strata differ no more than chance is confirmed (the test
    above), so every legend that says what "confirmed" asks of the strata says so too: retrieval's and the
    function vectors' said "positive in every stratum" / "in each held-out template alone" only, beside
    classes confirmed with a stratum that does not hold."""
    from circuits.heads.results import STRATUM_HOLDS
    from circuits.icl.results import FV_LEGEND
    from circuits.ioi.results import HOLDS
    from circuits.retrieval.results import LEGEND

    legends = {"retrieval": LEGEND, "function vectors": FV_LEGEND, "ioi": HOLDS, "heads": STRATUM_HOLDS}
    legend = legends[analysis]
    assert "no more than chance" in legend
    if analysis in ("retrieval", "function vectors"):  # the legends that name every verdict
        assert f"p < {DEPENDENCE_ALPHA}" in legend and "unconfirmed when" in legend


def test_an_effect_the_discovery_figure_does_not_show_is_not_said_to_hold():
    """The note beside a class compares its held-out effect with its discovery one: an effect beyond
    random on held-out families that discovery did not show (0 or the other way) is "seen on held-out
    families only", not "holds"; one that shrinks by a third or more "shrinks"; the class's own
    direction counts (sign -1: an effect against the behaviour)."""
    assert held_out_note(-0.003, 0.326, (0.135, 0.556)).startswith("seen on held-out families only: +0.326")
    assert held_out_note(0.01, -0.3, (-0.5, -0.1), sign=-1).startswith("seen on held-out families only")
    assert held_out_note(0.5, 0.45, (0.2, 0.7)).startswith("holds on held-out families (+0.45 against +0.5")
    assert held_out_note(0.5, 0.3, (0.1, 0.5)).startswith("shrinks on held-out families: +0.3 against +0.5")
    assert held_out_note(-0.4, -0.5, (-0.7, -0.3), sign=-1).startswith("holds")
    assert held_out_note(0.5, 0.2, (-0.1, 0.5)).startswith("does not hold on held-out families")


def test_a_class_with_no_random_heads_shows_no_effect_beyond_random():
    """Every head of a model in a class (toy-ioi's head path): the random sets are empty, their effect 0,
    and the class's raw drop read as its effect beyond random (+15.6 for toy-ioi's "to S2"), its strata
    "holding" and its note "holds on held-out families". Now there is no figure beyond random, no
    stratum verdict, and the note says why."""
    from circuits.evidence import HeadClass, Strata, judge_class, label_strata
    from circuits.sections import _class_line

    found = HeadClass(name="c", heads=[(0, 0), (1, 0)], draws=[[]] * 5)
    effects = torch.cat([torch.full((1, 16), 2.0) + torch.rand(1, 16), torch.zeros(5, 16)]).double()
    strata = Strata(label_strata("order", ["ABBA", "BABA"] * 8), {"order": "all"})
    judged = judge_class(found, effects, discovery=effects, strata=strata)
    assert judged.verdict == "unconfirmed" and "no random heads" in judged.note
    assert math.isnan(judged.heldout.beyond) and judged.heldout.drop > 2
    assert all(s.holds is None and math.isnan(s.beyond) for s in judged.strata)
    assert "other layers" not in _class_line(judged) and "fewer heads" not in _class_line(judged)


def null_classes(n_classes: int, n_prompts: int = 24, seed: int = 0) -> list:
    """Classes with no effect beyond their 5 random sets, judged on `n_prompts` prompts each."""
    generator = torch.Generator().manual_seed(seed)
    found = HeadClass(name="null", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3, 4, 5)])
    effects = torch.randn(n_classes, 6, n_prompts, generator=generator, dtype=torch.float64)
    return [dataclasses.replace(judge_class(found, e), name=f"null {i}") for i, e in enumerate(effects)]


def test_a_report_says_how_many_of_its_classes_chance_alone_could_confirm():
    """Each class is judged alone: the report says how many classes it judged and how many chance could
    confirm, at the rate a class with no effect beyond random heads is confirmed, measured here on 400
    such classes of 24 prompts and 5 random sets."""
    from circuits.evidence import CI_TAIL
    from circuits.sections import ClassView, class_sections

    judged = null_classes(400)
    rate = sum(c.verdict == "confirmed" for c in judged) / len(judged)
    assert rate <= CI_TAIL + binomial_band(CI_TAIL, len(judged))
    lines = class_sections(judged[:28], ClassView())[0].lines
    assert (
        "28 classes judged, each alone" in lines[-1]
        and "up to about 0.7 of them could be confirmed by chance" in lines[-1]
    )
    assert not any("judged, each alone" in line for line in class_sections(judged[:1], ClassView())[0].lines)


def test_a_class_s_p_is_below_the_ci_tail_where_its_ci_excludes_zero():
    """`beyond_p` reads the pooled CI's own resamples where the CI reads its bound (`expanded_p` inverts
    `expanded_tail`), so on classes whose effect is near the edge of significance, p < 0.025 where the
    CI excludes 0 (with a CI of its own 1,000 resamples, one of these 60 disagreed). A file saved before
    can hold a p and a CI that disagree: the report names each such class, and no other."""
    from circuits.evidence import CI_TAIL, ci_verdict
    from circuits.sections import ClassView, class_sections
    from interp.interventions.stats import expanded_p

    for n in (4, 14, 64):
        for tail in (1e-4, 0.003, expanded_tail(n), 0.2):
            assert expanded_tail(n, 1 - 2 * expanded_p(tail, n)) == pytest.approx(tail, rel=1e-9)
    assert expanded_p(expanded_tail(14), 14) == pytest.approx(CI_TAIL)
    generator = torch.Generator().manual_seed(1)
    found = HeadClass(name="edge", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3, 4, 5)])
    classes = []
    for i, shift in enumerate(torch.linspace(0.0, 0.9, 60).tolist()):
        effects = torch.randn(6, 24, generator=generator, dtype=torch.float64)
        effects[0] += shift
        classes.append(dataclasses.replace(judge_class(found, effects), name=f"edge {i}"))
    confirmed = [ci_verdict(c.heldout.beyond_ci) == "confirmed" for c in classes]
    assert [c.p < CI_TAIL for c in classes] == confirmed and 0 < sum(confirmed) < len(classes)
    older = [dataclasses.replace(c, p=0.03 if ok else 0.02) for c, ok in zip(classes, confirmed, strict=True)]
    for c in classes + older:  # each class alone: named where its p and CI disagree, else no such line
        lines = class_sections([c], ClassView())[0].lines
        named = [line for line in lines if "fall on two sides of the 95% level" in line]
        assert len(named) == any(c is o for o in older)
        assert all(f"for {c.name} (CI [" in line for line in named)


def test_holm_s_correction_bounds_the_familywise_error_and_keeps_real_effects():
    """Reports of 8 classes with no effect: uncorrected, some class is confirmed in about 8 x 1.5% of
    them; after Holm's correction (`holm`), in at most 2.5%. Classes with a real effect keep theirs, the
    report (its headline too) names a confirmed class the correction drops, and says where the
    resamples cannot tell: a
    strong class of 6 held-out families whose every resample is beyond 0, which bounds its p at 0.0097,
    over the correction's threshold for 9 classes (0.0028)."""
    from circuits.evidence import CI_TAIL, holm
    from circuits.sections import ClassView, class_sections, correction_headline

    reports = [null_classes(8, seed=seed) for seed in range(1, 151)]
    wrong = sum(any(holm(classes)) for classes in reports) / len(reports)
    uncorrected = sum(any(c.verdict == "confirmed" for c in classes) for classes in reports) / len(reports)
    assert wrong <= CI_TAIL + binomial_band(CI_TAIL, len(reports)) and uncorrected > wrong
    generator = torch.Generator().manual_seed(2)
    found = HeadClass(name="real", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3, 4, 5)])

    def judged(shift: float, name: str, families: list[str] | None = None):
        effects = torch.randn(6, 24, generator=generator, dtype=torch.float64)
        effects[0] += shift
        return dataclasses.replace(judge_class(found, effects, strata=Strata(families=families)), name=name)

    real = [judged(2.0, "real 0"), judged(2.0, "real 1")]  # strong effects
    edge = (judged(shift, "real 2") for shift in torch.linspace(0.3, 1.0, 40).tolist())
    real.append(next(c for c in edge if c.verdict == "confirmed" and c.p > CI_TAIL / 7))  # confirmed alone
    few = judged(2.0, "few families", [f"F{i % 6}" for i in range(24)])
    assert [c.verdict for c in [*real, few]] == ["confirmed"] * 4 and few.p_bound
    classes = real + null_classes(5, seed=0) + [few]
    corrected = holm(classes)
    assert [corrected[i] for i in (0, 1, 2, len(classes) - 1)] == [True, True, False, None]
    line = class_sections(classes, ClassView())[0].lines[-1]
    assert "Holm's correction over the 9" in line and f"not real 2 (p {real[2].p:.2g})" in line
    assert f"cannot tell for few families (p < {few.p:.2g})" in line
    assert correction_headline(classes) == [
        f"Corrected for the 9 classes judged (Holm): not real 2 (p {real[2].p:.2g}); the resamples cannot "
        f"tell for few families (p < {few.p:.2g})."
    ]
    assert correction_headline(real[:2] + null_classes(3, seed=0)) == []  # nothing dropped: no headline
    twins = [dataclasses.replace(null_classes(1)[0], name="twin"), dataclasses.replace(real[0], name="twin")]
    assert holm(twins) == [False, True]  # by position: classes may share a name (hop's routes)
    saved_before = [dataclasses.replace(c, p=math.nan) for c in classes]
    assert "holds no p-values" in class_sections(saved_before, ClassView())[0].lines[-1]


@pytest.mark.parametrize("n_families", [2, 3])
def test_a_ci_over_two_or_three_families_covers_their_prompts(n_families):
    """Two or three families are too few to stand for new ones, so their prompts are the units,
    resampled within each family: the CI covers the mean over new prompts of these families (their
    effects fixed, drawn once) at 95%, however far their effects lie apart."""
    generator = torch.Generator().manual_seed(n_families)
    labels = [f"F{i % n_families}" for i in range(8 * n_families)]
    family = 2 * torch.randn(n_families, generator=generator, dtype=torch.float64)  # far apart
    truth = family.mean().item()  # equal counts: the mean over these families' prompts
    reps, covered = 400, 0
    for rep in range(reps):
        values = family[torch.arange(len(labels)) % n_families] + torch.randn(
            len(labels), generator=generator, dtype=torch.float64
        )
        low, high = bootstrap_ci(values, seed=rep, families=labels)
        covered += bool(low <= truth <= high)
    assert covered / reps >= 0.95 - binomial_band(0.95, reps)


@pytest.mark.parametrize("n_families", [2, 3])
def test_a_class_held_out_on_two_or_three_families_is_judged_on_their_prompts(n_families):
    """A class strong in each of 2 or 3 held-out families is confirmed, and the claim is about those
    families' prompts: its CIs resample them within each family (no family resampled first), and its
    note names the families. A result saved before 2026-12-04, whose CI resampled the families first and
    was none, still reads "too few families"."""
    from circuits.sections import ClassView, class_sections

    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3, 4)])
    generator = torch.Generator().manual_seed(n_families)
    labels = [f"F{i % n_families}" for i in range(12 * n_families)]
    orders = [
        ("order", name, torch.arange(len(labels)) // n_families % 2 == i) for i, name in enumerate("AB")
    ]
    effects = 0.3 * torch.randn(5, len(labels), generator=generator, dtype=torch.float64)
    effects[0] += 2.0
    strata = Strata(orders, {"order": "all"}, by_ci=("order",), families=labels)
    judged = judge_class(found, effects, discovery=effects, strata=strata)
    assert judged.heldout.n_families == 0 and judged.heldout.beyond_ci[0] > 0
    assert judged.verdict == "confirmed" and judged.p < CI_TAIL and all(s.holds for s in judged.strata)
    families = ", ".join(f"F{i}" for i in range(n_families))
    assert f"prompts of the {n_families} held-out families ({families})" in judged.note
    nan = (math.nan, math.nan)
    saved_before = dataclasses.replace(
        judged,
        verdict="unconfirmed",
        heldout=dataclasses.replace(judged.heldout, n_families=n_families, beyond_ci=nan, drop_ci=nan),
        strata=[
            dataclasses.replace(s, n_families=n_families, beyond_ci=None, holds=None) for s in judged.strata
        ],
    )
    assert saved_before.unconfirmed_because == f"{n_families} held-out families, too few families"
    classes, by_stratum = class_sections([saved_before], ClassView())[:2]
    assert any("('too few families')" in line for line in by_stratum.lines)
    assert {row[6] for row in by_stratum.table.rows} == {"too few families"}


@pytest.mark.parametrize("n_families", [2, 3])
def test_a_faithfulness_over_two_or_three_families_is_judged_on_their_prompts(n_families):
    """A faithfulness over 2 or 3 held-out families has CIs over their prompts and a band, and is
    undetermined only where the model does not do the task; one saved before 2026-12-04 with no CI for
    its 2 or 3 families says so."""
    from circuits.evidence import undetermined_faithfulness
    from circuits.sections import faithfulness_section

    generator = torch.Generator().manual_seed(n_families)
    labels = [f"F{i % n_families}" for i in range(12 * n_families)]
    orders = [
        ("order", name, torch.arange(len(labels)) // n_families % 2 == i) for i, name in enumerate("AB")
    ]
    noise = 0.1 * torch.randn(3, len(labels), generator=generator, dtype=torch.float64)
    for model_effect in (3.0, 0.0):  # a model that does the task, and one that does not
        model, ablated = model_effect + noise[0], noise[1]
        circuit = model + noise[2]  # reproduces the model on every prompt
        summary, strata = held_out_faithfulness(circuit, model, ablated, orders, families=labels)
        words = faithfulness_section(summary, strata, "the circuit").lines[0]
        assert summary.n_families == 0 and not summary.too_few_families
        if model_effect:
            assert not undetermined_faithfulness(summary)
            assert summary.ratio_ci[0] < 1 < summary.ratio_ci[1] and "the circuit: faithful" in words
        else:
            assert words.startswith("the circuit: undetermined: the model's own effect")
    nan = (math.nan, math.nan)
    saved_before = dataclasses.replace(summary, n_families=n_families, ratio_ci=nan, model_effect_ci=nan)
    assert (
        faithfulness_section(saved_before, [], "the circuit")
        .lines[0]
        .startswith(f"the circuit: undetermined: {n_families} held-out families, too few families for a CI")
    )
