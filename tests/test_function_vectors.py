"""Function-vector heads: the word-pair tasks, AIE and the vector's addition against hand-made hooks on
SmolLM2, and the whole report on a small random model with SmolLM2's tokenizer."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.icl import (
    FunctionVectorSettings,
    few_shot_accuracy,
    function_vector,
    function_vector_report,
    head_indirect_effects,
    mean_head_outputs,
    task_prompts,
    zero_shot_accuracy,
)
from circuits.icl.fv_pipeline import FV_STAGES, function_vector_stages, fv_stage_notes
from circuits.icl.fv_report import fv_sections, summary_lines, write_fv_report
from circuits.results_file import PartialResult, load_result, resume_stages, save_result
from circuits.sections import render_html
from circuits.stages import weights_fingerprint
from interp.tasks.icl_tasks import (
    ICL_TASKS,
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
        check_task_names(["antonym", "synonym"])


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


@pytest.fixture(scope="module")
def tiny_model(smollm2):
    """A random 3-layer model with SmolLM2's tokenizer (so: Brown documents too)."""
    torch.manual_seed(0)
    config = tiny_config(n_layers=3, d_model=32, n_heads=4, d_vocab=smollm2.cfg.d_vocab, n_ctx=600)
    return interp.HookedTransformer(config, tokenizer=smollm2.tokenizer)


def _report(model, heldout_task: str, **kept):
    settings = FunctionVectorSettings(
        tasks=["antonym", "present_past", heldout_task], heldout_tasks=[heldout_task], n_prompts=4,
        n_shots=3, top=2, candidates=4, n_random=2, n_documents=4,
    )  # fmt: skip
    return function_vector_report(model, settings, induction_heads=[(1, 0)], **kept)


@pytest.fixture(scope="module")
def small_result(tiny_model):
    return _report(tiny_model, "comparative")


def test_heads_and_layer_are_chosen_without_the_heldout_tasks(tiny_model, small_result):
    result = small_result
    assert result.split.discovery == ("antonym", "present_past") and result.split.heldout == ("comparative",)
    assert [(t.task, t.family) for t in result.task_vectors] == [
        ("antonym", "discovery"), ("present_past", "discovery"), ("comparative", "held-out"),
    ]  # fmt: skip
    assert result.aie_per_task.shape == (2, 3, 4)  # the discovery tasks only
    assert len(result.layer_accuracy) == 3 and result.fv_layer == max(
        range(3), key=result.layer_accuracy.__getitem__
    )
    other = _report(tiny_model, "first_letter")  # other held-out families: the same choices
    assert other.fv_heads == result.fv_heads and other.candidates_aie == result.candidates_aie
    assert other.layer_accuracy == result.layer_accuracy and other.fv_layer == result.fv_layer
    assert other.aie_test.discovery == result.aie_test.discovery


def test_effects_are_reported_on_heldout_tasks_beside_discovery_with_one_sign(small_result):
    result = small_result
    for found in [result.aie_test, result.vector_test, *result.ablations]:
        tested = found.heldout
        assert found.verdict == tested.verdict and len(found.random_values) == 2
        assert tested.beyond_ci[0] <= tested.beyond <= tested.beyond_ci[1]
        assert tested.beyond == pytest.approx(tested.drop - tested.random_drop, abs=1e-6)
        assert found.note
    assert result.aie_test.heldout.n_prompts == 4 and result.aie_test.discovery.n_prompts == 8
    assert [found.discovery is None for found in result.ablations] == [False, True, False, True]
    heldout = [task for task in result.task_vectors if task.family == "held-out"]
    gained = sum(task.with_fv - task.zero_shot for task in heldout) / len(heldout)
    assert result.vector_test.heldout.drop == pytest.approx(gained, abs=1e-6)  # with - without
    few_shot = sum(task.few_shot for task in heldout) / len(heldout)
    for found in result.ablations[::2]:  # few-shot accuracy: clean - ablated
        assert few_shot - 1 <= found.heldout.drop <= few_shot
    assert all(not set(draw) & set(result.fv_heads) for draw in result.aie_test.random_sets)


def test_a_stopped_run_leaves_its_stages_and_resumes_to_the_same_result(tiny_model, small_result, tmp_path):
    path = tmp_path / "fv.json"
    settings = {"model": "tiny", "weights": weights_fingerprint(tiny_model), "heldout_tasks": ["comparative"]}
    kept = function_vector_stages(find_induction_heads=False)
    assert kept == list(FV_STAGES)

    def stages():
        return resume_stages(path, "icl --fv", settings, kept, fv_stage_notes)

    with pytest.raises(KeyboardInterrupt):
        _report(tiny_model, "comparative", stages=stop_after(stages(), FV_STAGES[1]))
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
    reported = {stage.split(": ")[0] for stage, _, _ in calls}
    assert reported == set(FV_STAGES)  # what `interp icl --fv` announces is what runs
    assert without_timings(resumed) == without_timings(small_result)


def test_a_single_task_cannot_be_split(tiny_model):
    with pytest.raises(ValueError, match="two or more"):
        function_vector_report(tiny_model, FunctionVectorSettings(tasks=["antonym"]), induction_heads=())


def test_report_saves_and_renders_in_every_format(small_result, tmp_path):
    result = small_result
    assert result.aie_attributed.shape == (3, 4) and len(result.fv_heads) == 2
    assert set(result.fv_heads) <= set(result.candidates)
    names = [found.name for found in result.ablations]
    assert names == [
        "FV heads ablated: few-shot accuracy", "FV heads ablated: ICL score",
        "induction heads ablated: few-shot accuracy", "induction heads ablated: ICL score",
    ]  # fmt: skip
    save_result(result, tmp_path / "fv.json")
    loaded = load_result(tmp_path / "fv.json")
    assert loaded.fv_heads == result.fv_heads and torch.equal(loaded.aie_attributed, result.aie_attributed)
    assert loaded.split == result.split and loaded.ablations == result.ablations
    document = json.loads((tmp_path / "fv.json").read_text())
    del document["result"]["fields"]["split"]  # a file saved before tasks were held out
    (tmp_path / "old.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="save it again with this version's --save"):
        load_result(tmp_path / "old.json")
    page = render_html(fv_sections(loaded))
    assert "Function-vector heads of" in page and page.count('class="interp-heatmap"') == 1
    console = Console(record=True, width=100)
    write_fv_report(loaded, "table", None, console)
    text = " ".join(console.export_text().split())
    assert text.startswith(f"Function-vector heads of {result.model_name} Ablating the")  # the finding leads
    chose = "chosen on the discovery word-pair tasks (antonym, present_past)"
    assert "tested on the held-out word-pair tasks (comparative)" in text
    assert text.index("lowers few-shot accuracy on held-out tasks") < text.index(chose)
    write_fv_report(loaded, "json", tmp_path / "summary.json", console)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["fv_heads"][0]["head"] == result.fv_heads[0] and summary["heldout_tasks"] == [
        "comparative"
    ]
    write_fv_report(loaded, "markdown", tmp_path / "fv.md", console)
    assert "beyond random" in (tmp_path / "fv.md").read_text()
    outcome = CliRunner().invoke(app, ["render", str(tmp_path / "fv.json"), "--format", "markdown"])
    assert outcome.exit_code == 0 and "Function-vector heads" in outcome.output


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
        (["--tasks", "antonym,synonym"], "unknown ICL task"),
        (["--late", "100"], "apply to the ICL score, not to --fv"),
        (["--format", "csv"], "unknown format"),
        (["--fv-heads", "10", "--candidates", "5"], "must be at least --fv-heads 10"),
        (
            ["--tasks", "antonym,comparative", "--heldout-tasks", "first_letter"],
            "not among the task's families",
        ),
        (["--tasks", "antonym"], "two or more"),
    ],
)
def test_cli_refuses_bad_options(options, message):
    outcome = CliRunner().invoke(app, ["icl", "--fv", "--model", "no-such-model", *options])
    assert outcome.exit_code == 2 and message in " ".join(outcome.output.split())


def test_the_report_says_when_no_layer_lets_the_vector_help(small_result):
    """Every layer at zero-shot accuracy 0 (as on Gemma 3 270M): the chosen layer is the first of a tie."""
    tied = dataclasses.replace(small_result, layer_accuracy=[0.0] * len(small_result.layer_accuracy))
    assert "the first of a tie: at no layer does the vector raise" in " ".join(summary_lines(tied))
    helped = dataclasses.replace(small_result, layer_accuracy=[0.0, 0.5, 0.25], fv_layer=1)
    assert "Added at layer 1 (discovery tasks' zero-shot accuracy 0.50 there)." in " ".join(
        summary_lines(helped)
    )
