"""interp.interventions.metrics on hand-made logits: per-prompt positions, answers, baselines, bad input."""

import math
import warnings

import pytest
import torch

import interp
from interp import metrics
from interp.model.tokens import record_padding


@pytest.fixture
def logits() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(3, 5, 11)  # [batch, pos, d_vocab]


def test_logit_diff_at_per_prompt_positions(logits):
    pos = torch.tensor([4, 2, 0])
    correct, incorrect = torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6])
    value = metrics.logit_diff(logits, correct, incorrect, pos=pos)
    expected = torch.stack(
        [logits[b, pos[b], correct[b]] - logits[b, pos[b], incorrect[b]] for b in range(3)]
    )
    torch.testing.assert_close(value, expected)
    last = metrics.logit_diff(logits, correct, incorrect)  # default: the last position
    torch.testing.assert_close(last, metrics.logit_diff(logits, correct, incorrect, pos=4))


def test_logit_diff_with_several_answers_averages_them(logits):
    correct = torch.tensor([[1, 2], [3, 4], [5, 6]])
    value = metrics.logit_diff(logits, correct, torch.tensor([0, 0, 0]), pos=1)
    expected = logits[:, 1].gather(1, correct).mean(1) - logits[:, 1, 0]
    torch.testing.assert_close(value, expected)


def test_several_answers_are_one_probability_and_padded_answer_rows_are_refused(logits):
    """Several answers per prompt: every probability the mean of theirs (`answer_prob` as `prob_metric`);
    answer rows with recorded padding (ids from to_tokens of texts of different lengths) would count
    the pad id as an answer, so they are refused, by the functions and by the metrics."""
    correct = torch.tensor([[1, 2], [3, 4], [5, 6]])
    expected = logits[:, -1].softmax(-1).gather(1, correct).mean(1)
    torch.testing.assert_close(metrics.answer_prob(logits, correct), expected)
    torch.testing.assert_close(metrics.prob_metric(correct)(logits), expected)
    padded = record_padding(correct, torch.tensor([[1, 1], [1, 0], [1, 1]]))
    for name, score in {
        "logit_diff": lambda: metrics.logit_diff(logits, padded, torch.tensor([0, 0, 0])),
        "answer_prob": lambda: metrics.answer_prob(logits, padded),
        "logit_diff_metric": lambda: metrics.logit_diff_metric(torch.tensor([0, 0, 0]), padded)(logits),
        "prob_metric": lambda: metrics.prob_metric(padded)(logits),
    }.items():
        with pytest.raises(ValueError, match=r"answer row 1 is padded \(1 of 2 ids real\)"):
            score()
            pytest.fail(f"{name} counted the pad id as an answer")
    unpadded = record_padding(correct, torch.ones(3, 2, dtype=torch.long))  # every id real: averaged
    torch.testing.assert_close(metrics.prob_metric(unpadded)(logits), expected)


def test_probabilities_kl_and_loss(logits):
    answer, pos = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2])
    probs = logits[torch.arange(3), pos].softmax(-1)[torch.arange(3), answer]
    torch.testing.assert_close(metrics.answer_prob(logits, answer, pos), probs)
    torch.testing.assert_close(metrics.answer_logprob(logits, answer, pos), probs.log())
    assert metrics.kl_divergence(logits, logits).abs().max() < 1e-6
    other = logits + torch.randn_like(logits)
    kl = metrics.kl_divergence(other, logits, pos)
    assert (kl > 0).all()
    p = logits[torch.arange(3), pos].log_softmax(-1)
    q = other[torch.arange(3), pos].log_softmax(-1)
    torch.testing.assert_close(kl, (p.exp() * (p - q)).sum(-1))
    tokens = torch.randint(11, (3, 5))
    torch.testing.assert_close(metrics.loss(logits, tokens).mean(), interp.next_token_loss(logits, tokens))


def test_accuracy_is_whether_the_answer_is_the_top_token(logits):
    pos = torch.tensor([0, 1, 2])
    top = logits[torch.arange(3), pos].argmax(-1)
    answer = torch.stack([top[0], (top[1] + 1) % 11, top[2]])
    accuracy = metrics.accuracy_metric(answer, pos=pos)
    assert accuracy(logits).tolist() == [1.0, 0.0, 1.0]
    assert accuracy(logits[1:], torch.tensor([1, 2])).tolist() == [0.0, 1.0]  # a sub-batch's rows
    assert accuracy(logits.clone().requires_grad_()).tolist() == [1.0, 0.0, 1.0]  # a forward pass's logits
    with pytest.raises(ValueError, match="one answer per prompt"):
        metrics.accuracy_metric(answer[:, None].repeat(1, 2), pos=pos)(logits)
    with pytest.raises(ValueError, match=r"answer token ids must lie in \[0, 11\)"):
        metrics.accuracy_metric(torch.tensor([0, 11, 1]), pos=pos)(logits)


def test_methods_that_take_the_metric_s_gradient_refuse_accuracy(tiny_model):
    """Accuracy (the top token) has no gradient: attribution patching, EAP, the removal estimate and
    edge pruning refuse it by name rather than fail inside autograd."""
    clean = torch.randint(1, tiny_model.cfg.d_vocab, (4, 6))
    corrupted = clean.flip(0)
    accuracy = metrics.accuracy_metric(clean[:, 0])
    circuit = interp.edges.edge_graph(tiny_model).valid
    for run in (
        lambda: interp.patching.attribution_patching(tiny_model, clean, corrupted, accuracy),
        lambda: interp.edges.edge_attribution(tiny_model, clean, corrupted, accuracy, method="eap"),
        lambda: interp.edges.removal_effects(tiny_model, clean, corrupted, accuracy, circuit),
        lambda: interp.edges.prune_edges(tiny_model, clean, corrupted, accuracy),
    ):
        with pytest.raises(ValueError, match="takes the metric's gradient, and accuracy .* has none"):
            run()


def test_normalized_metric_is_zero_on_corrupted_and_one_on_clean(logits):
    corrupted = logits.flip(0)
    base = lambda lg: metrics.logit_diff(lg, torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]))  # noqa: E731
    metric = metrics.normalized(base, logits, corrupted)
    assert metric(logits).mean().item() == pytest.approx(1.0, abs=1e-5)
    assert metric(corrupted).mean().item() == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="same on the clean and corrupted"):
        metrics.normalized(base, logits, logits)


def test_normalized_baselines_from_logits_that_require_grad_raise_no_warning(logits):
    """Baselines from a forward pass with autograd on: no "requires_grad ... to a scalar" warning, and the
    metric's gradient flows through the logits it scores, not the baselines."""
    clean = logits.clone().requires_grad_(True)
    base = lambda lg: metrics.logit_diff(lg, torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]))  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric = metrics.normalized(base, clean, logits.flip(0))
        value = metric(clean).mean()
    assert value.item() == pytest.approx(1.0, abs=1e-5)
    value.backward()
    assert clean.grad is not None and clean.grad.abs().sum() > 0


def test_interp_patch_runs_without_warnings():
    """The `interp patch` path (normalised metric from the model's own logits) under warnings as errors."""
    from circuits.patch_report import ioi_patching

    model = interp.load_model("toy-ioi")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = ioi_patching(model, n_prompts=4, top=3)
    assert len(report.ranked()) > 0


def test_bad_input_raises(logits):
    answers = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="out of range"):
        metrics.logit_diff(logits, answers, answers, pos=5)
    with pytest.raises(ValueError, match="must lie in"):
        metrics.logit_diff(logits, answers, answers, pos=torch.tensor([0, 1, 9]))
    with pytest.raises(ValueError, match=r"\[batch=3\]"):
        metrics.logit_diff(logits, answers, answers, pos=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="answer tokens"):
        metrics.answer_prob(logits, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="batch, pos, d_vocab"):
        metrics.answer_prob(logits[:, 0], answers)
    with pytest.raises(ValueError, match="differ in shape"):
        metrics.kl_divergence(logits, logits[:2])


def test_int_and_negative_positions_count_from_the_end_as_transformer_lens(tiny_model):
    """TL code writes pos=-1: every metric takes ints (negative from the end) and LongTensors [batch],
    the engine's functions too."""
    torch.manual_seed(0)
    logits = torch.randn(2, 6, 11)
    correct, incorrect = torch.tensor([1, 2]), torch.tensor([3, 4])
    rows = torch.arange(2)
    expected = logits[rows, -1, correct] - logits[rows, -1, incorrect]
    for pos in (-1, 5, None, torch.tensor([-1, 5]), [5, -1], torch.tensor(-1)):
        torch.testing.assert_close(metrics.logit_diff_metric(correct, incorrect, pos=pos)(logits), expected)
        torch.testing.assert_close(metrics.logit_diff(logits, correct, incorrect, pos=pos), expected)
    metric = metrics.prob_metric(correct, pos=-2)
    torch.testing.assert_close(metric(logits), logits[rows, -2].softmax(-1)[rows, correct])
    assert metric.positions(rows, 6).tolist() == [4, 4]
    tokens = torch.randint(61, (2, 6))
    values = [
        interp.patch(
            tiny_model, tokens, metrics.logit_diff_metric(correct, incorrect, pos=pos), head=(1, 0),
            source=torch.zeros(1), logit_pos=logit_pos,
        )
        for pos, logit_pos in ((-1, -1), (None, None), (torch.tensor([5, -1]), torch.tensor([5, 5])))
    ]  # fmt: skip
    torch.testing.assert_close(values[0], values[1])
    torch.testing.assert_close(values[2], values[1])


def test_faithfulness_summary_shows_what_a_ratio_of_means_hides():
    """A circuit that overshoots on half the prompts and falls short on the other half keeps the
    model's mean (ratio 1) but reproduces no prompt: the per-prompt figures and the verdict say so;
    a ratio above 1.2 is named an overshoot."""
    from circuits.evidence import faithfulness_by_stratum, faithfulness_verdict, label_strata
    from interp.interventions.stats import faithfulness_summary

    model = torch.full((40,), 4.0)
    ablated = torch.zeros(40)
    swings = torch.tensor([2.0, -2.0]).repeat(20)
    summary = faithfulness_summary(model + swings, model, ablated)
    assert summary.ratio == pytest.approx(1.0) and summary.ratio_ci[0] < 1 < summary.ratio_ci[1]
    assert summary.error == pytest.approx(0.5) and summary.within == 0
    assert faithfulness_verdict(summary).startswith("faithful on average only")
    strata = faithfulness_by_stratum(
        model + swings, model, ablated, label_strata("order", ["ABBA", "BABA"] * 20)
    )
    assert [round(s.summary.ratio, 2) for s in strata] == [1.5, 0.5]
    assert "ABBA 1.50 (overshoots), BABA 0.50 (partial)" in faithfulness_verdict(summary, strata)
    exact = faithfulness_summary(model, model, ablated)
    assert exact.error == 0 and exact.within == 1 and faithfulness_verdict(exact).startswith("faithful:")
    assert faithfulness_verdict(faithfulness_summary(1.3 * model, model, ablated)).startswith("overshoots")
    assert faithfulness_verdict(faithfulness_summary(0.6 * model, model, ablated)).startswith("partial")
    edge = faithfulness_verdict(faithfulness_summary(0.7969 * model, model, ablated))
    assert edge.startswith("partial: keeps 0.797"), edge  # not "0.80" beside "partial" (below 0.8)
    for short in (0.2, -0.14):  # below 0.5, as the edge circuit's verdict: not partial
        verdict = faithfulness_verdict(faithfulness_summary(short * model, model, ablated))
        assert verdict.startswith(f"not faithful: keeps {short:.2f}"), verdict
    few = faithfulness_by_stratum(model, model, ablated, [("family", "tiny", torch.arange(40) < 3)])
    assert few[0].summary is None and few[0].n_prompts == 3
    half_missed = torch.tensor([0.0, 4.0, 0.0, -4.0]).repeat(10)  # half the prompts exact, half off by 4
    halves = faithfulness_summary(model + half_missed, model, ablated)
    assert halves.within == 0.5 and faithfulness_verdict(halves).startswith("faithful on average only")


def test_faithfulness_beside_a_model_effect_indistinguishable_from_zero_is_undetermined():
    """An untrained model's logit diff: m(model) - m(all ablated) has a 95% CI that spans 0, so a ratio
    over it divides by noise. The verdict says "undetermined" with the model's effect and its CI, not a
    band with advice; a clear effect keeps its band."""
    from circuits.evidence import faithfulness_verdict
    from interp.interventions.stats import faithfulness_summary

    generator = torch.Generator().manual_seed(0)
    model = torch.randn(48, generator=generator, dtype=torch.float64) * 0.1
    ablated = torch.randn(48, generator=generator, dtype=torch.float64) * 0.1
    model += 0.01 - (model - ablated).mean()  # the model's mean effect: +0.01, its CI spanning 0
    circuit = ablated + 0.58 * (model - ablated)
    summary = faithfulness_summary(circuit, model, ablated)
    low, high = summary.model_effect_ci
    assert summary.ratio == pytest.approx(0.58) and low < 0 < high
    assert summary.model_effect == pytest.approx(0.01)
    verdict = faithfulness_verdict(summary)
    assert verdict.startswith("undetermined: the model's own effect"), verdict
    assert f"{low:+.3g}" in verdict and "partial" not in verdict and "try" not in verdict
    clear = faithfulness_summary(circuit + 0.58, model + 1, ablated)
    assert clear.model_effect_ci[0] > 0 and faithfulness_verdict(clear).startswith("partial")


def test_faithfulness_is_defined_at_any_scale_and_says_which_values_are_missing():
    """A metric of small probabilities (1e-7) has a faithfulness like any other; a non-finite value of
    the model or the ablated run is refused by name (not "the same for the model and ablated"); one of
    the circuit leaves every figure of the circuit undefined, the share within ±20% too; family labels
    of another count than the prompts are refused, one label as well as two."""
    from interp.interventions.stats import faithfulness_summary

    model, ablated = torch.tensor([3.0, 2.0, 4.0, 3.0]) * 1e-7, torch.full((4,), 1e-8)
    summary = faithfulness_summary(0.5 * model, model, ablated)
    assert summary.ratio == pytest.approx((1.5e-7 - 1e-8) / (3e-7 - 1e-8)) and summary.within == 0
    for values in (model, ablated):
        broken = values.clone()
        broken[1] = torch.nan
        with pytest.raises(ValueError, match=r"not finite \(NaN or inf\) on 1 of 4 prompts of the"):
            faithfulness_summary(0.5 * model, *((broken, ablated) if values is model else (model, broken)))
    circuit = 0.5 * model
    circuit[2] = torch.inf
    missing = faithfulness_summary(circuit, model, ablated)
    assert all(math.isnan(x) for x in (missing.ratio, *missing.ratio_ci, missing.error, missing.within))
    for families in (["x"] * 3, ["x", "y", "y"]):
        with pytest.raises(ValueError, match="3 family labels for 4 prompts"):
            faithfulness_summary(0.5 * model, model, ablated, families=families)


def test_a_prompt_with_a_non_finite_value_leaves_its_row_without_a_ci():
    """A NaN or inf per-prompt value makes the mean undefined: its CI is NaN, not the CI of the
    resamples that happen to miss that prompt, and the class it belongs to is not confirmed."""
    from circuits.evidence import HeadClass, judge_class
    from interp.interventions.stats import bootstrap_ci

    torch.manual_seed(0)
    values = torch.randn(3, 30, dtype=torch.float64) + 1
    alone = bootstrap_ci(values[1:2])
    values[0, 7], values[2, 3] = float("nan"), float("inf")
    low, high = bootstrap_ci(values)
    assert low[0].isnan() and high[0].isnan() and low[2].isnan() and high[2].isnan()
    torch.testing.assert_close((low[1:2], high[1:2]), alone)  # the finite row is untouched
    effects = torch.cat([values[:1] + 1, torch.rand(3, 30, dtype=torch.float64) * 0.1])
    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3)])
    judged = judge_class(found, effects)
    assert judged.verdict == "unconfirmed" and all(math.isnan(bound) for bound in judged.heldout.beyond_ci)
    assert judged.unconfirmed_because == "its held-out effect has no CI (a value is not finite)"


def test_a_class_judged_on_some_held_out_prompts_reports_those_prompts_per_prompt():
    """With `tested` (function vectors: held-out tasks in held-out templates), the per-prompt effects
    beside the pooled figure are those of the prompts it is judged on."""
    from circuits.evidence import HeadClass, judge_class

    tested = torch.tensor([True, True, False, True, False, True])
    effects = torch.zeros(4, 6, dtype=torch.float64)
    effects[0] = torch.where(tested, 1.0, -3.0)  # beyond random: +1 where tested, -3 elsewhere
    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3)])
    judged = judge_class(found, effects, tested=tested)
    assert judged.heldout.n_prompts == len(judged.per_prompt) == 4
    assert judged.heldout.beyond == pytest.approx(float(judged.per_prompt.mean())) == pytest.approx(1.0)


def test_a_class_judged_on_fewer_than_min_stratum_prompts_is_unconfirmed():
    """Three held-out prompts or fewer give a CI that is the range of their values: the pooled
    verdict is "unconfirmed" with a note, as a stratum of so few prompts gets no verdict, and their
    faithfulness is not summarised."""
    from circuits.evidence import MIN_STRATUM_PROMPTS, HeadClass, held_out_faithfulness, judge_class

    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3)])
    for n in (MIN_STRATUM_PROMPTS - 1, MIN_STRATUM_PROMPTS):
        effects = torch.cat([1 + 0.1 * torch.arange(n)[None], 0.01 * torch.rand(3, n)]).double()
        judged = judge_class(found, effects)
        assert judged.verdict == ("confirmed" if n == MIN_STRATUM_PROMPTS else "unconfirmed")
        assert ("too few prompts" in judged.note) == (n < MIN_STRATUM_PROMPTS)
        summary, _ = held_out_faithfulness(0.9 * torch.ones(n), torch.ones(n), torch.zeros(n), [])
        assert (summary is None) == (n < MIN_STRATUM_PROMPTS)


def test_robust_z_keeps_float64():
    """Robust z-scores of float64 effects are computed in float64 (float32 loses small differences
    between large values)."""
    from interp.interventions.stats import robust_z

    values = 1000 + torch.tensor([0, 1, 2, 3, 4, 5, 6, 100], dtype=torch.float64) * 1e-5
    median = (values.sort().values[3] + values.sort().values[4]).item() / 2
    mad = (values - median).abs().sort().values[3:5].mean().item()
    torch.testing.assert_close(robust_z(values), (values - median) / (1.4826 * mad))


def test_a_dependence_the_strata_were_too_small_to_test_is_said_untested():
    """When every stratum of a dependent kind has fewer than MIN_STRATUM_PROMPTS prompts, the
    verdict cannot read that kind: the note says so, rather than letting "confirmed" imply it held."""
    from circuits.evidence import HeadClass, Strata, judge_class, label_strata

    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3)])
    effects = torch.cat([1 + 0.1 * torch.rand(1, 12), 0.01 * torch.rand(3, 12)]).double()
    for per_template, untested in ((3, True), (4, False)):
        templates = label_strata("template", [f"T{i // per_template}" for i in range(12)])
        judged = judge_class(found, effects, strata=Strata(templates, {"template": "most"}))
        assert judged.verdict == "confirmed"
        assert ("template dependence untested" in judged.note) == untested


def test_undefined_values_are_never_read_as_numbers(logits):
    """A prompt of one real token has no next-token loss (NaN, not 0 nats); KL reads 0 log 0 as 0 where
    the reference gives a token no probability; AUROC refuses NaN scores (they lost every comparison);
    the normalised metric takes a metric of small values (1e-7 against 2e-7) as any other."""
    from interp.interventions.stats import auroc

    tokens = torch.randint(11, (3, 5))
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[2, :4] = 0  # left padding: one real token
    found = metrics.loss(logits, tokens, mask)
    assert found[2].isnan() and found[:2].isfinite().all()
    reference = logits.clone()
    reference[..., 0] = -torch.inf
    by_hand = reference[:, -1].log_softmax(-1)[:, 1:]
    expected = (by_hand.exp() * (by_hand - logits[:, -1].log_softmax(-1)[:, 1:])).sum(-1)
    torch.testing.assert_close(metrics.kl_divergence(logits, reference), expected)
    scores = torch.tensor([0.1, 0.9, float("nan"), 0.4])
    with pytest.raises(ValueError, match="1 of 4 are not"):
        auroc(scores, torch.tensor([True, False, True, False]))
    small = metrics.normalized(
        lambda lg: lg[:, -1, 0] * 0 + lg.new_tensor(1e-7 if lg is logits else 2e-7), logits, -logits
    )
    assert small(logits).mean().item() == pytest.approx(1.0)


def test_a_faithfulness_or_effect_that_is_not_finite_is_said_undefined():
    """A circuit whose metric is NaN on one prompt is "undefined", not "faithful ... nan% of prompts";
    a held-out effect without a CI does not "hold"; a stratum whose mean is not finite is untested
    (it made a strong class "template-dependent"); a faithfulness CI from which more than its tail
    share of resamples drop out is NaN (one prompt of four decided it: [0.49994, 0.49994])."""
    from circuits.evidence import (
        HeadClass,
        Strata,
        faithfulness_verdict,
        held_out_note,
        judge_class,
        label_strata,
    )
    from interp.interventions.stats import faithfulness_summary

    model, ablated = torch.tensor([3.0, 2.0, 4.0, 3.0]).repeat(3), torch.zeros(12)
    circuit = model.clone()
    circuit[5] = torch.nan
    assert faithfulness_verdict(faithfulness_summary(circuit, model, ablated)).startswith("undefined")
    assert "holds" not in held_out_note(0.6, math.nan, (math.nan, math.nan))
    torch.manual_seed(0)
    effects = torch.randn(4, 16, dtype=torch.float64) * 0.5
    effects[0] += 3.0
    effects[0, 15] = torch.nan  # a prompt outside the pooled figure, in the stratum T3
    tested = torch.arange(16) < 12
    found = HeadClass(name="c", heads=[(1, 0)], draws=[[(1, i)] for i in (1, 2, 3)])
    strata = Strata(label_strata("template", ["T1"] * 6 + ["T2"] * 6 + ["T3"] * 4), {"template": "all"})
    judged = judge_class(found, effects, tested=tested, strata=strata)
    assert judged.verdict == "confirmed", judged.note
    assert [s.holds for s in judged.strata if s.name == "T3"] == [None]
    one = torch.tensor([1.0, 1.0, 2.0, 1.0])  # the model and the empty circuit differ on one prompt
    with pytest.warns(RuntimeWarning, match="no CI"):
        few = faithfulness_summary(torch.tensor([1.0, 1.0, 1.5, 1.0]), one, torch.ones(4))
    assert all(math.isnan(bound) for bound in few.ratio_ci)


def test_a_head_score_over_one_sequence_has_no_standard_error():
    """A head score read on one sequence (a fixed offset only one is long enough for) has no standard
    error (NaN), not 0: a 0 showed it as certain."""
    from circuits.heads.scores import _mean_se_confidence

    per_sequence = torch.full((4, 1, 3), torch.nan)
    per_sequence[:3, 0, 0] = torch.tensor([0.2, 0.5, 0.8])
    per_sequence[0, 0, 1] = 0.7
    _, se, _ = _mean_se_confidence(per_sequence, 0.5, 0)
    assert se[0, 0].item() == pytest.approx(0.3 / math.sqrt(3)) and se[0, 1:].isnan().all()


def test_a_faithfulness_band_read_off_the_ratio_says_what_its_ci_leaves_open():
    """toy-ioi on 8 prompts: "not faithful: keeps 0.27" while the CI [-0.31, 1.30] reaches every band;
    one held-out prompt pair read "faithful (>= 0.8)" with no CI. Both say so now."""
    from circuits.edge_circuits.report import faithfulness_advice
    from circuits.evidence import faithfulness_verdict
    from interp.interventions.stats import FaithfulnessSummary

    wide = FaithfulnessSummary(n_prompts=8, ratio=0.27, ratio_ci=(-0.31, 1.30), error=0.9, within=0.1)
    assert "undetermined at these prompts: its 95% CI [-0.31, 1.30]" in faithfulness_verdict(wide)
    narrow = FaithfulnessSummary(n_prompts=64, ratio=0.95, ratio_ci=(0.88, 1.02), error=0.1, within=0.9)
    assert "undetermined" not in faithfulness_verdict(narrow)
    assert faithfulness_advice(0.991, "eap", "mean").endswith("no CI, so the band is a point estimate's")
