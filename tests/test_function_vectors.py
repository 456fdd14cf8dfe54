"""Function-vector heads: the word-pair tasks and their prompt templates, AIE and the vector's addition
against hand-made hooks on SmolLM2, and the whole report on a small random model with SmolLM2's
tokenizer."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import assert_same_finding_figures
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.evidence import TOO_FEW_PROMPTS, class_verdict, stratum_drops
from circuits.finding import finding_report, write_finding_report
from circuits.icl import (
    FunctionVectorSettings,
    attributed_indirect_effects,
    few_shot_accuracy,
    function_vector,
    function_vector_report,
    function_vectors,
    head_indirect_effects,
    mean_head_outputs,
    task_prompts,
    zero_shot_accuracy,
)
from circuits.icl.fv_pipeline import FV_STAGES, MEANS_STAGE, function_vector_stages, fv_stage_notes
from circuits.icl.results import AIE_TEST, TEMPLATE_KINDS, VECTOR_TEST
from circuits.progress_printer import ProgressPrinter
from circuits.results_file import PartialResult, load_result, resume_stages, save_result
from circuits.sections import render_html, render_markdown
from interp.io.serialize import encode
from interp.model import weights_fingerprint
from interp.tasks.icl_tasks import (
    ICL_TASKS,
    ICL_TEMPLATES,
    check_task_names,
    few_shot_prompts,
    single_token_pairs,
    split_pairs,
)
from tests.conftest import tiny_config
from tests.test_quick_and_resume import rendered, stop_after, without_timings


def test_word_pair_tasks_make_the_prompts_they_promise(smollm2):
    assert len(ICL_TASKS) >= 10  # families enough to choose on some and test on others
    for task in ICL_TASKS.values():
        pairs = single_token_pairs(smollm2, task)
        assert len(pairs) >= 18 and len({x for x, _ in pairs}) == len(pairs)  # 6 shots + a query per half
        assert len({y for _, y in pairs}) == len(pairs)  # a shuffled answer is always a wrong one
        assert all(len(smollm2.tokenizer.encode(" " + y, add_special_tokens=False)) == 1 for _, y in pairs)
        discovery, heldout = split_pairs(pairs, seed=1)
        assert not set(discovery) & set(heldout) and sorted(discovery + heldout) == sorted(pairs)
        prompts = few_shot_prompts(heldout, 6, 4, torch.Generator().manual_seed(0))
        answers = dict(heldout)
        for clean, corrupted, zero, answer in zip(
            prompts.clean, prompts.corrupted, prompts.zero_shot, prompts.answers, strict=True
        ):
            assert clean.endswith(zero) and corrupted.endswith(zero) and answers[zero[3:-3]] == answer
            shots = [block.split("\n") for block in clean.split("\n\n")[:-1]]
            moved = [block.split("\n") for block in corrupted.split("\n\n")[:-1]]
            assert len(shots) == 4 and [x for x, _ in shots] == [x for x, _ in moved]
            assert all(answers[x[3:]] == y[3:] for x, y in shots)  # every example solved
            assert all(answers[x[3:]] != y[3:] for x, y in moved)  # none solved: answers shuffled
            assert sorted(y for _, y in shots) == sorted(y for _, y in moved)
    assert len(single_token_pairs(smollm2, ICL_TASKS["country_capital"])) < len(
        ICL_TASKS["country_capital"].pairs
    )
    with pytest.raises(ValueError, match="unknown ICL task"):
        check_task_names(["antonym", "rhyme"])


def test_every_template_asks_the_same_pairs(smollm2):
    assert len(ICL_TEMPLATES) >= 4  # families enough to choose in some and test in others
    pairs = split_pairs(single_token_pairs(smollm2, ICL_TASKS["antonym"]))[1]
    answers = dict(pairs)
    qa = few_shot_prompts(pairs, 3, 2, torch.Generator().manual_seed(4))
    for name, template in ICL_TEMPLATES.items():
        written = few_shot_prompts(pairs, 3, 2, torch.Generator().manual_seed(4), name)
        assert written.answers == qa.answers
        for kind in ("clean", "corrupted"):
            for text, solved in zip(getattr(written, kind), getattr(qa, kind), strict=True):
                shots = [block.split("\n") for block in solved.split("\n\n")]  # the same pairs as "qa"
                *examples, (query, _) = [(x[3:], y[3:]) for x, y in shots]
                assert answers[query] and text == "".join(template.shot(*shot) for shot in examples) + (
                    template.ask(query)
                )
        assert written.zero_shot == [template.ask(text[3:-3]) for text in qa.zero_shot]
    with pytest.raises(ValueError, match="unknown prompt template"):
        few_shot_prompts(pairs, 3, 2, torch.Generator(), "table")


def test_groups_are_tasks_in_templates(smollm2):
    tasks = ("antonym", "adverb")
    pairs = {name: split_pairs(single_token_pairs(smollm2, ICL_TASKS[name]))[0] for name in tasks}
    both = task_prompts(smollm2, pairs, n_prompts=2, n_shots=2, seed=3, templates=["arrow", "input_output"])
    assert both.n_groups == 4 and both.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert both.prompt_templates() == ["arrow", "arrow", "input_output", "input_output"] * 2
    means = mean_head_outputs(smollm2, both)  # .z [group, layer, head, d_head]
    for at, name in enumerate(["arrow", "input_output"]):
        alone = task_prompts(smollm2, pairs, n_prompts=2, n_shots=2, seed=3, templates=[name])
        assert torch.equal(alone.answers, both.answers[both.template_index == at])
        torch.testing.assert_close(means.z[at::2], mean_head_outputs(smollm2, alone).z, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def prompts(smollm2):
    pairs = {
        name: split_pairs(single_token_pairs(smollm2, ICL_TASKS[name]))[0]
        for name in ("antonym", "present_past")
    }
    return task_prompts(smollm2, pairs, n_prompts=3, n_shots=3, seed=0)


def _answer_probs(model, tokens, last, answers) -> torch.Tensor:
    logits = model(tokens)
    return logits[torch.arange(len(tokens)), last].softmax(-1)[torch.arange(len(tokens)), answers]


def test_aie_equals_a_hooked_patch_of_the_heads(smollm2, prompts):
    means = mean_head_outputs(smollm2, prompts)
    clean = smollm2.run_with_cache(prompts.clean, names_filter="blocks.4.attn.hook_z")[1][
        "blocks.4.attn.hook_z"
    ]
    task0 = prompts.task_index == 0
    expected = clean[torch.arange(len(clean)), prompts.clean_last][task0].mean(0)  # [head, d_head]
    torch.testing.assert_close(means.z[0, 4], expected, atol=1e-5, rtol=0)
    head_sets = [[(4, 2)], [(12, 0), (12, 5), (20, 3)]]
    effects = head_indirect_effects(smollm2, prompts, means, head_sets)
    rows = torch.arange(len(prompts.answers))
    last = prompts.corrupted_last
    with torch.no_grad():
        base = _answer_probs(smollm2, prompts.corrupted, last, prompts.answers)
        for heads, effect in zip(head_sets, effects, strict=True):

            def patch(z, hook, heads=heads):
                layer = int(hook.name.split(".")[1])
                for layer_, head in heads:
                    if layer_ == layer:
                        z[rows, last, head] = means.z[prompts.task_index, layer, head]
                return z

            hooks = [(f"blocks.{layer}.attn.hook_z", patch) for layer in {layer for layer, _ in heads}]
            with smollm2.hooks(fwd_hooks=hooks):
                patched = _answer_probs(smollm2, prompts.corrupted, last, prompts.answers)
            torch.testing.assert_close(effect, patched - base, atol=1e-5, rtol=0)


def test_attributed_effects_are_the_first_order_patch_in_chunks_of_any_size(smollm2, prompts, monkeypatch):
    """(mean z - z) . d p(answer) / dz at the last token, by hand for block 4's heads; the prompts' chunks
    (`GRADIENT_PROMPTS`, which bounds the memory of the backward pass) change nothing."""
    means = mean_head_outputs(smollm2, prompts)
    whole = attributed_indirect_effects(smollm2, prompts, means)
    monkeypatch.setattr(function_vectors, "GRADIENT_PROMPTS", 5)
    assert len(prompts.answers) > 5
    torch.testing.assert_close(attributed_indirect_effects(smollm2, prompts, means), whole, atol=1e-5, rtol=0)
    rows, last, kept = torch.arange(len(prompts.answers)), prompts.corrupted_last, {}

    def keep(z, hook):
        kept["z"] = z
        return z

    with torch.enable_grad(), smollm2.hooks(fwd_hooks=[("blocks.4.attn.hook_z", keep)]):
        probs = smollm2(prompts.corrupted)[rows, last].softmax(-1)[rows, prompts.answers]
        (grad,) = torch.autograd.grad(probs.sum(), [kept["z"]])
    by_hand = ((means.z[prompts.group_index, 4] - kept["z"].detach()[rows, last]) * grad[rows, last]).sum(-1)
    torch.testing.assert_close(whole[:, 4], by_hand, atol=1e-5, rtol=0)


def test_the_vector_and_the_ablation_equal_hooked_runs(smollm2, prompts):
    means = mean_head_outputs(smollm2, prompts)
    heads = [(9, 1), (14, 6)]
    vectors = function_vector(means, heads)  # [task, d_model]
    rows, last = torch.arange(len(prompts.answers)), prompts.zero_shot_last
    with torch.no_grad():
        expected = means.z[:, 9, 1] @ smollm2.W_O[9, 1] + means.z[:, 14, 6] @ smollm2.W_O[14, 6]
        torch.testing.assert_close(vectors, expected)
        plain, added = zero_shot_accuracy(smollm2, prompts, [(0, None), (6, 8 * vectors)])

        def add(resid, hook):
            resid[rows, last] += 8 * vectors[prompts.task_index]
            return resid

        for hooks, accuracy in [([], plain), ([("blocks.6.hook_resid_pre", add)], added)]:
            with smollm2.hooks(fwd_hooks=hooks):
                top = smollm2(prompts.zero_shot)[rows, last].argmax(-1)
            assert torch.equal(accuracy, (top == prompts.answers).float())
        clean, (ablated,) = few_shot_accuracy(smollm2, prompts, [heads])
        real = torch.arange(prompts.clean.shape[1]) <= prompts.clean_last[:, None]

        def ablate(z, hook):
            head = 1 if hook.name.startswith("blocks.9.") else 6
            z[:, :, head] = z[:, :, head][real].mean(0)
            return z

        with smollm2.hooks(fwd_hooks=[("blocks.9.attn.hook_z", ablate), ("blocks.14.attn.hook_z", ablate)]):
            top = smollm2(prompts.clean)[rows, prompts.clean_last].argmax(-1)
        assert torch.equal(ablated, (top == prompts.answers).float())
        top = smollm2(prompts.clean)[rows, prompts.clean_last].argmax(-1)
        assert torch.equal(clean, (top == prompts.answers).float())


def test_the_few_shot_ablation_is_the_same_on_left_padding(smollm2):
    """The mean z the few-shot ablation writes is over each prompt's real tokens, first to last: on
    left-padded prompts the padding before the first is not in it (it was: L3-5's heads ablated, a
    prompt right with right padding was wrong with left)."""
    pairs = {
        name: split_pairs(single_token_pairs(smollm2, ICL_TASKS[name]))[0]
        for name in ("antonym", "present_past")
    }
    head_sets = [[(layer, head) for layer in (3, 4, 5) for head in range(9)], [(20, 5), (17, 5), (23, 3)]]
    accuracies, side_before = {}, smollm2.default_padding_side
    try:
        for side in ("right", "left"):
            smollm2.default_padding_side = side
            prompts = task_prompts(smollm2, pairs, n_prompts=3, n_shots=3, seed=0, templates=["qa", "arrow"])
            accuracies[side] = few_shot_accuracy(smollm2, prompts, head_sets)
    finally:
        smollm2.default_padding_side = side_before
    assert bool(smollm2.first_positions(prompts.clean).any())  # the left-padded batch has padding
    (clean, ablated), (clean_left, ablated_left) = accuracies["right"], accuracies["left"]
    assert torch.equal(clean_left, clean)
    assert torch.equal(ablated_left, ablated)


@pytest.fixture(scope="module")
def tiny_model(smollm2):
    """A random 3-layer model with SmolLM2's tokenizer (so: Brown documents too)."""
    torch.manual_seed(0)
    config = tiny_config(n_layers=3, d_model=32, n_heads=4, d_vocab=smollm2.cfg.d_vocab, n_ctx=600)
    return interp.HookedTransformer(config, tokenizer=smollm2.tokenizer)


def _report(model, heldout_task: str, heldout_template: str = "arrow", **kept):
    settings = FunctionVectorSettings(
        tasks=["antonym", "present_past", heldout_task], heldout_tasks=[heldout_task],
        templates=["qa", "input_output", heldout_template], heldout_templates=[heldout_template], n_prompts=4,
        n_shots=3, top=2, candidates=4, n_random=2, n_documents=4,
    )  # fmt: skip
    return function_vector_report(model, settings, induction_heads=[(1, 0)], **kept)


@pytest.fixture(scope="module")
def small_result(tiny_model):
    return _report(tiny_model, "comparative")


def test_heads_and_layer_are_chosen_without_the_heldout_tasks_and_templates(tiny_model, small_result):
    result, figures = small_result, small_result.extras
    assert result.chose == {"tasks": ["antonym", "present_past"], "templates": ["qa", "input_output"]}
    assert result.tested == {"tasks": ["comparative"], "templates": ["arrow"]}
    assert [(t.task, t.family) for t in figures.task_vectors] == [
        ("antonym", "discovery"), ("present_past", "discovery"), ("comparative", "held-out"),
    ]  # fmt: skip
    assert figures.aie_per_task.shape == (2, 3, 4)  # the discovery tasks only
    assert len(figures.layer_accuracy) == 3 and figures.fv_layer == max(
        range(3), key=figures.layer_accuracy.__getitem__
    )
    other = _report(tiny_model, "first_letter", "colon")  # other held-out tasks and templates: same choices
    chosen = other.extras
    assert other.tested["templates"] == ["colon"]
    assert chosen.fv_heads == figures.fv_heads and chosen.candidates_aie == figures.candidates_aie
    assert chosen.layer_accuracy == figures.layer_accuracy and chosen.fv_layer == figures.fv_layer
    for test in (AIE_TEST, VECTOR_TEST):
        assert other.verdict(test).discovery == result.verdict(test).discovery
    with pytest.raises(ValueError, match="every family"):  # a template either chooses or tests
        FunctionVectorSettings(templates=["qa", "arrow"], heldout_templates=["arrow", "qa"]).template_split()


def test_the_heldout_templates_alone_test_and_each_template_is_reported(small_result):
    result, figures = small_result, small_result.extras
    roles = {"qa": "discovery template", "input_output": "discovery template", "arrow": "held-out template"}
    aie, vector, *ablations = result.classes
    for found in [aie, vector, *ablations[::2]]:
        assert {s.name: s.kind for s in found.strata} == roles  # the held-out task in every template
        (tested,) = [s for s in found.strata if s.kind == "held-out template"]
        assert tested.n_prompts == found.heldout.n_prompts == 4  # 1 held-out task x 1 template x 4
        assert tested.beyond == pytest.approx(found.heldout.beyond, abs=1e-6)  # the test: arrow alone
        assert all(s.holds == (s.beyond_ci[0] > 0) for s in found.strata)  # by CI
        assert found.verdict in ("confirmed", "template-dependent", "unconfirmed")
        assert found.verdict == "unconfirmed" or found.heldout.beyond_ci[0] > 0
    assert [(row.template, row.family) for row in figures.template_vectors] == [
        ("qa", "discovery"), ("input_output", "discovery"), ("arrow", "held-out"),
    ]  # fmt: skip
    (arrow,) = [row for row in figures.template_vectors if row.family == "held-out"]
    (comparative,) = [task for task in figures.task_vectors if task.family == "held-out"]
    assert (arrow.zero_shot, arrow.with_fv, arrow.few_shot) == pytest.approx(
        (comparative.zero_shot, comparative.with_fv, comparative.few_shot), abs=1e-6
    )  # a held-out task is measured in the held-out templates only
    assert all(not s.strata for s in ablations[1::2])  # the ICL score: no templates


def test_a_heldout_template_without_the_effect_makes_it_template_dependent():
    helps = torch.linspace(0.2, 0.6, 12)  # the effect beyond random per prompt: clearly above 0
    around_zero = torch.linspace(-0.25, 0.35, 12)  # mean +0.05, its CI across 0
    beyond = torch.cat([helps, around_zero, around_zero])
    first, second, third = (torch.arange(36) // 12 == i for i in range(3))
    held, chose = TEMPLATE_KINDS
    strata = stratum_drops(
        torch.stack([beyond, torch.zeros_like(beyond)]),  # against one random set of no effect
        [(held, "qa", first), (held, "input_output", second), (chose, "arrow", third)],
        by_ci=TEMPLATE_KINDS,
    )
    assert [s.holds for s in strata] == [True, False, False]  # by CI, not by the mean alone
    rule = {held: "all"}  # the function vectors' rule (fv_pipeline._compare)
    assert class_verdict(True, strata, rule) == f"{held}-dependent"
    assert class_verdict(True, [strata[0], strata[2]], rule) == "confirmed"  # a discovery one: shown
    assert class_verdict(False, strata, rule) == "unconfirmed"


@pytest.mark.parametrize(("tasks", "unit"), [
    (["antonym"] * 16, "held-out prompts of the one held-out task (antonym) in held-out templates"),
    (["antonym", "country_capital", "synonym", "present_past"] * 4, "held-out tasks in held-out templates"),
])  # fmt: skip
def test_the_note_names_what_the_held_out_figures_generalise_to(tasks, unit):
    """One held-out task (`--heldout-tasks antonym`, or two --tasks): the CI resamples its prompts only,
    but the note said the class "holds on held-out tasks in held-out templates" (four held-out tasks:
    two or three are too few for a verdict)."""
    from circuits.evidence import HeadClass
    from circuits.icl.fv_pipeline import _compare

    generator = torch.Generator().manual_seed(0)
    effects = [torch.rand(3, 16, generator=generator) * torch.tensor([[0.2], [0.1], [0.1]]) for _ in range(2)]
    heldout, discovery = (effect + torch.tensor([[0.3], [0.0], [0.0]]) for effect in effects)
    found = HeadClass(name="FV heads", heads=[(5, 1)], draws=[[(5, 2)], [(5, 3)]])
    tested = torch.arange(16) < 8
    strata = [(TEMPLATE_KINDS[0], "arrow", tested), (TEMPLATE_KINDS[1], "qa", ~tested)]
    verdict = _compare("FV heads patched", "p(answer)", found, discovery, heldout, 0, (tested, strata, tasks))
    assert verdict.note.startswith(f"holds on {unit} (")


def test_effects_are_reported_on_heldout_tasks_beside_discovery_with_one_sign(small_result):
    result, figures = small_result, small_result.extras
    aie, vector, *ablations = result.classes
    assert (aie.name, vector.name) == (AIE_TEST, VECTOR_TEST)
    for found in result.classes:
        tested = found.heldout
        assert (found.verdict == "confirmed") <= (tested.beyond_ci[0] > 0) and len(found.random_effects) == 2
        assert tested.beyond_ci[0] <= tested.beyond <= tested.beyond_ci[1]
        assert tested.beyond == pytest.approx(tested.drop - tested.random_drop, abs=1e-6)
        assert found.note
    assert aie.heldout.n_prompts == 4 and aie.discovery.n_prompts == 16  # 2 x 2 x 4
    assert [found.discovery is None for found in ablations] == [False, True, False, True]
    heldout = [task for task in figures.task_vectors if task.family == "held-out"]
    gained = sum(task.with_fv - task.zero_shot for task in heldout) / len(heldout)
    assert vector.heldout.drop == pytest.approx(gained, abs=1e-6)  # with - without
    few_shot = sum(task.few_shot for task in heldout) / len(heldout)
    for found in ablations[::2]:  # few-shot accuracy: clean - ablated
        assert few_shot - 1 <= found.heldout.drop <= few_shot
    assert all(not set(draw) & set(figures.fv_heads) for draw in aie.random_sets)


def test_a_stopped_run_leaves_its_stages_and_resumes_to_the_same_result(tiny_model, small_result, tmp_path):
    path = tmp_path / "fv.json"
    settings = {"model": "tiny", "weights": weights_fingerprint(tiny_model), "heldout_templates": ["arrow"]}
    kept = function_vector_stages(find_induction_heads=False)
    assert kept == list(FV_STAGES)

    def stages():
        return resume_stages(path, "icl --fv", settings, kept, fv_stage_notes)

    first = []
    with pytest.raises(KeyboardInterrupt):
        _report(tiny_model, "comparative", stages=stop_after(stages(), FV_STAGES[1]),
                progress=lambda *call: first.append(call))  # fmt: skip
    aie = [(done, total) for stage, done, total in first if stage == FV_STAGES[0]]
    assert aie[0] == (0, 1) and {total for _, total in aie[1:]} == {1 + 4 + 1}  # one count: 16 discovery
    # prompts' one gradient pass, then the runs of the 4 candidates and a base
    assert [done for done, _ in aie[1:]] == sorted(done for done, _ in aie[1:]) and aie[-1][0] == aie[-1][1]
    partial = load_result(path)
    assert isinstance(partial, PartialResult) and partial.missing == list(FV_STAGES[2:])
    text = rendered(path, tmp_path)
    assert "partial result (2 of 4 stages)" in text and "Top heads by exact AIE" in text
    other = CliRunner().invoke(app, ["icl", "--fv", "--model", "toy-induction", "--save", str(path)])
    assert other.exit_code == 2 and "cannot resume" in other.output  # refused before any model loads
    calls = []
    resumed = _report(tiny_model, "comparative", stages=stages(), progress=lambda *call: calls.append(call))
    kept_from = [stage for stage, _, _ in calls if stage.endswith(f"kept from {path}")]
    assert kept_from == [f"{stage}: kept from {path}" for stage in FV_STAGES[:2]]  # not run again
    reported = [stage.split(": ")[0] for stage, _, _ in calls]
    assert set(reported) == {*FV_STAGES, MEANS_STAGE}  # what `interp icl --fv` announces is what runs
    assert reported[0] == MEANS_STAGE  # named as work before the AIE, not as the stage before it
    printer = ProgressPrinter("icl --fv", kept, lambda _: None, between=[MEANS_STAGE])
    for call in calls:
        printer(*call)
    assert printer.unplanned == []
    for stage in FV_STAGES[2:]:  # the long stages count their runs as they end, to the last
        counts = [(done, total) for name, done, total in calls if name == stage]
        dones, totals = [done for done, _ in counts], {total for _, total in counts[1:]}
        assert counts[0] == (0, 1) and dones == sorted(dones) and len(totals) == 1 and dones[-1] in totals
    classes = {tuple(found.heads): 1 + len(found.random_sets) for found in resumed.classes}  # its sets
    fv_sets, ablated = classes[tuple(resumed.extras.fv_heads)], sum(classes.values())
    per_group = (len(resumed.extras.fv_heads) + fv_sets + 1) + (fv_sets + 1) + (ablated + 1) * 4  # patched
    # heads, added vectors, ablated sets in 4 batches by length; each with the plain run
    assert [max(t for n, _, t in calls if n == stage) for stage in FV_STAGES[2:]] == [2 * per_group, ablated]
    assert without_timings(resumed) == without_timings(small_result)


def test_a_single_task_or_template_cannot_be_split(tiny_model):
    with pytest.raises(ValueError, match="two or more"):
        function_vector_report(tiny_model, FunctionVectorSettings(tasks=["antonym"]), induction_heads=())
    with pytest.raises(ValueError, match="two or more"):
        function_vector_report(tiny_model, FunctionVectorSettings(templates=["qa"]), induction_heads=())


def test_report_saves_and_renders_in_every_format(small_result, tmp_path):
    result, figures = small_result, small_result.extras
    assert figures.aie_attributed.shape == (3, 4) and len(figures.fv_heads) == 2
    assert set(figures.fv_heads) <= set(figures.candidates)
    names = [found.name for found in result.classes]
    assert names == [
        AIE_TEST, VECTOR_TEST, "FV heads ablated: few-shot accuracy", "FV heads ablated: ICL score",
        "induction heads ablated: few-shot accuracy", "induction heads ablated: ICL score",
    ]  # fmt: skip
    save_result(result, tmp_path / "fv.json")
    loaded = load_result(tmp_path / "fv.json")
    assert encode(loaded) == encode(result)
    page = render_html(finding_report(loaded))
    assert "Function-vector heads of" in page and page.count('class="interp-heatmap"') == 1
    console = Console(record=True, width=100)
    write_finding_report(loaded, "table", None, console)
    text = " ".join(console.export_text().split())
    assert text.startswith(f"Function-vector heads of {result.model} Ablating the")  # the finding leads
    chose = "chosen on the discovery tasks in the discovery templates: the"
    assert "chose: tasks antonym, present_past; templates qa, input_output" in text
    assert "tested: tasks comparative; templates arrow" in text
    assert text.index("lowers few-shot accuracy on held-out tasks in held-out templates") < text.index(chose)
    report = finding_report(loaded)
    what_chose = next(
        section.lines for section in report.sections if section.title == "What chose and what tested"
    )
    assert sum("present_past" in line for line in what_chose) == 1  # the families named once
    strata = next(section.table for section in report.sections if section.title.startswith("Per stratum"))
    per_template = {tuple(row[1:3]) for row in strata.rows}  # the effects per template, said there once
    assert {("held-out template", "arrow"), ("discovery template", "qa")} <= per_template
    assert "arrow (held out)" not in " ".join(report.headline)
    write_finding_report(loaded, "json", tmp_path / "summary.json", console)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["fv_heads"][0]["head"] == figures.fv_heads[0]
    assert summary["chose"] == {"tasks": ["antonym", "present_past"], "templates": ["qa", "input_output"]}
    assert summary["tested"] == {"tasks": ["comparative"], "templates": ["arrow"]}
    layer, head = (int(part) for part in figures.fv_heads[0][1:].split("H"))
    exact = summary["fv_heads"][0]  # the figures themselves, not read back from the table's text
    assert exact["aie_attributed"] == figures.aie_attributed[layer, head].item()
    assert exact["aie_heldout"] == figures.fv_heads_heldout_aie[0]
    assert [row["template"] for row in summary["template_vectors"]] == ["qa", "input_output", "arrow"]
    assert [found["name"] for found in summary["classes"]] == names
    write_finding_report(loaded, "markdown", tmp_path / "fv.md", console)
    assert "beyond random" in (tmp_path / "fv.md").read_text()
    outcome = CliRunner().invoke(app, ["render", str(tmp_path / "fv.json"), "--format", "markdown"])
    assert outcome.exit_code == 0 and "Function-vector heads" in outcome.output


def older_fv_file(finding, saved: Path, older: Path, comparisons: bool) -> None:
    """Save the function-vector finding `finding` to `saved` and rewrite it as files saved before
    2026-11-29 hold it (a FunctionVectorResult; with `comparisons`, each test as the function vectors' own
    record of it, a Comparison) into `older`."""
    save_result(finding, saved)
    document = json.loads(saved.read_text())
    stored, settings = document["result"]["fields"], finding.settings
    tests = stored["classes"]
    for node in tests if comparisons else []:
        older_test = dict(node["fields"])
        unit = dict(older_test.pop("details")["__items__"])["unit"]
        older_test["random_values"] = older_test.pop("random_effects")
        for name in ("sign", "per_prompt"):
            del older_test[name]
        node.update(__dataclass__="Comparison", fields={**older_test, "unit": unit})
    splits = {
        axis: {"__dataclass__": "FamilySplit", "fields": {
            "discovery": encode(tuple(finding.chose[axis])), "heldout": encode(tuple(finding.tested[axis]))
        }}
        for axis in ("tasks", "templates")
    }  # fmt: skip
    document["kind"] = "fv"
    document["result"] = {"__dataclass__": "FunctionVectorResult", "fields": {
        "model_name": finding.model, "provenance": finding.provenance, **stored["extras"]["fields"],
        "tasks": settings.task_names, "split": splits["tasks"], "templates": settings.template_names,
        "template_split": splits["templates"], "n_shots": settings.n_shots, "n_prompts": settings.n_prompts,
        "seed": settings.seed, "n_documents": settings.n_documents, "aie_test": tests[0],
        "vector_test": tests[1], "ablations": tests[2:], "timings": stored["timings"],
    }}  # fmt: skip
    older.write_text(json.dumps(document))


@pytest.mark.parametrize("comparisons", [False, True], ids=["ClassVerdict", "Comparison"])
def test_an_older_fv_file_reads_with_the_same_numbers_and_renders_the_same(
    small_result, comparisons, tmp_path
):
    """A FunctionVectorResult (saved before 2026-11-29), its tests as ClassVerdicts or, older, as the
    function vectors' own record (Comparison), reads as the Finding a fresh run makes: the same figures,
    tasks and templates, tests and settings (the held-out tasks and templates named; a Comparison holds
    no per-prompt effect); a file older still, without the tasks' split, is refused."""
    older_fv_file(small_result, tmp_path / "fv.json", tmp_path / "older.json", comparisons)
    read = load_result(tmp_path / "older.json")
    assert_same_finding_figures(read, small_result)
    assert read.settings == small_result.settings
    for found, judged in zip(read.classes, small_result.classes, strict=True):
        if comparisons:
            assert len(found.per_prompt) == 0 and len(judged.per_prompt) >= judged.heldout.n_prompts > 0
            found = dataclasses.replace(found, per_prompt=judged.per_prompt)
        assert encode(found) == encode(judged)
    assert render_markdown(finding_report(read)) == render_markdown(finding_report(small_result))
    document = json.loads((tmp_path / "older.json").read_text())
    del document["result"]["fields"]["split"]  # a file saved before tasks were held out
    (tmp_path / "oldest.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"run `interp icl[^`]*` again with --save"):
        load_result(tmp_path / "oldest.json")


def test_bad_input_says_what_to_pass(smollm2):
    with pytest.raises(ValueError, match="no tokenizer"):
        function_vector_report(interp.load_model("toy-induction"), induction_heads=())
    with pytest.raises(ValueError, match="too few for 40 shots"):
        settings = FunctionVectorSettings(tasks=["antonym", "present_past"], n_shots=40)
        function_vector_report(smollm2, settings, induction_heads=())
    with pytest.raises(ValueError, match="top must be an integer >= 1"):
        FunctionVectorSettings(top=0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tasks", "antonym,rhyme"], "unknown ICL task"),
        (["--late", "100"], "--late: options of the ICL score (interp icl without --fv)"),
        (["--top", "5", "--n-discovery", "4"], "--n-discovery, --top: options of the ICL score"),
        (["--format", "csv"], "unknown format"),
        (["--fv-heads", "10", "--candidates", "5"], "must be at least --fv-heads 10"),
        (
            ["--tasks", "antonym,comparative", "--heldout-tasks", "first_letter"],
            "not among the task's families",
        ),
        (["--tasks", "antonym"], "two or more"),
        (["--heldout-templates", "qa,input_output,arrow,colon"], "every family"),
        (["--heldout-templates", "qa,table"], "unknown prompt template"),
    ],
)
def test_cli_refuses_bad_options(options, message):
    outcome = CliRunner().invoke(app, ["icl", "--fv", "--model", "no-such-model", *options])
    assert outcome.exit_code == 2 and message in " ".join(outcome.output.split())


def test_the_report_says_when_no_layer_lets_the_vector_help(small_result):
    """Every layer at zero-shot accuracy 0 (as on Gemma 3 270M): the chosen layer is the first of a tie."""
    figures = small_result.extras
    tied = dataclasses.replace(figures, layer_accuracy=[0.0] * len(figures.layer_accuracy))
    assert "the first of a tie: at no layer does the vector raise" in " ".join(tied.headline(small_result))
    helped = dataclasses.replace(figures, layer_accuracy=[0.0, 0.5, 0.25], fv_layer=1)
    assert "Added at layer 1 (discovery tasks' zero-shot accuracy 0.50 there)." in " ".join(
        helped.headline(small_result)
    )


def test_a_template_of_too_few_prompts_is_reported_without_a_ci(tiny_model):
    """3 prompts of one held-out task in a template: too few for a CI, so its stratum has none and the
    report says so (it raised a TypeError at rendering, after the whole run)."""
    settings = FunctionVectorSettings(
        tasks=["antonym", "present_past", "comparative"], heldout_tasks=["comparative"],
        templates=["qa", "input_output", "arrow"], heldout_templates=["arrow"], n_prompts=3, n_shots=3, top=2,
        candidates=4, n_random=2, n_documents=4,
    )  # fmt: skip
    result = function_vector_report(tiny_model, settings, induction_heads=[(1, 0)])
    strata = result.verdict(AIE_TEST).strata
    assert strata and all(s.n_prompts == 3 and s.beyond_ci is None and s.holds is None for s in strata)
    console = Console(record=True, width=100)
    write_finding_report(result, "table", None, console)
    text = " ".join(console.export_text().split())
    assert "Per stratum and family" in text
    strata = next(s for s in finding_report(result).sections if s.title.startswith("Per stratum")).table
    arrow = [row for row in strata.rows if row[0] == AIE_TEST and row[2] == "arrow"]
    assert arrow and arrow[0][5:] == ["", TOO_FEW_PROMPTS, ""]  # no CI, no verdict, no test of the kind
