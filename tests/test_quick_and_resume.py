"""Early answers, kept: --save keeps each stage as it finishes, so a run stopped after stage k leaves a
partial result that `interp render` shows, and the same run resumed from it ends with the
uninterrupted run's result; --quick runs a smaller preset whose report says what it costs."""

from __future__ import annotations

import pytest
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.icl import ICLSettings, icl_report
from circuits.icl.heads import ATTRIBUTION_STAGE, weights_fingerprint
from circuits.icl.pipeline import icl_report_stages, icl_stage_notes
from circuits.ioi import find_ioi_circuit
from circuits.ioi.discover import KEPT_STAGES, ioi_stage_notes
from circuits.results_file import PartialResult, load_result, resume_stages, write_result_report
from interp.catalog import QUICK_PRESETS
from interp.io.serialize import encode

ICL_OPTIONS = {"n_documents": 12, "seed": 0}


def stop_after(stages, last: str):
    """`stages` (a StageResults writing its file) made to stop the run (KeyboardInterrupt, as Ctrl-C)
    once `last` is kept."""
    keep = stages.on_done

    def keep_then_stop(stage, value):
        keep(stage, value)
        if stage == last:
            raise KeyboardInterrupt

    stages.on_done = keep_then_stop
    return stages


def without_timings(result) -> dict:
    """The result as stored, but for its timings (seconds differ between runs)."""
    document = encode(result, drop_callables=True)

    def strip(node):
        if isinstance(node, dict):
            return {key: strip(value) for key, value in node.items() if key != "timings"}
        if isinstance(node, list):
            return [strip(value) for value in node]
        return node

    return strip(document)


def rendered(path, tmp_path) -> str:
    out = tmp_path / "partial.md"
    write_result_report(load_result(path), "markdown", out, Console(file=None))
    return out.read_text()


@pytest.fixture(scope="module")
def toy() -> interp.HookedTransformer:
    return interp.load_model("toy-induction")


def icl_settings(model, **settings) -> dict:
    return {"model": model.cfg.model_name, "weights": weights_fingerprint(model)} | ICL_OPTIONS | settings


def icl_stages(model, path, **settings):
    return resume_stages(
        path, "icl", icl_settings(model, **settings), icl_report_stages(True), icl_stage_notes
    )


def test_a_stopped_icl_run_leaves_its_stages_and_resumes_to_the_same_result(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))  # the induction heads found afresh
    path = tmp_path / "icl.json"
    with pytest.raises(KeyboardInterrupt):
        icl_report(
            toy, ICLSettings(**ICL_OPTIONS), stages=stop_after(icl_stages(toy, path), ATTRIBUTION_STAGE)
        )
    partial = load_result(path)
    assert isinstance(partial, PartialResult)
    assert list(partial.done) == icl_report_stages(True)[:2]
    assert partial.missing == icl_report_stages(True)[2:]
    text = rendered(path, tmp_path)
    assert "partial result (2 of 4 stages)" in text and "Missing stages: Exact ablations" in text
    assert "Top heads by attribution" in text

    calls = []
    resumed = icl_report(
        toy,
        ICLSettings(**ICL_OPTIONS),
        stages=icl_stages(toy, path),
        progress=lambda *call: calls.append(call),
    )
    kept = [stage for stage, _, _ in calls if stage.endswith(f"kept from {path}")]
    assert len(kept) == 2  # the induction heads and the attribution were not run again
    uninterrupted = icl_report(toy, ICLSettings(**ICL_OPTIONS))
    assert without_timings(resumed) == without_timings(uninterrupted)
    assert load_result(path).missing == []  # every stage kept: a third run would only assemble


def test_a_partial_run_of_other_settings_or_another_command_is_refused(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "icl.json"
    with pytest.raises(KeyboardInterrupt):
        icl_report(
            toy,
            ICLSettings(**ICL_OPTIONS),
            stages=stop_after(icl_stages(toy, path), icl_report_stages(True)[0]),
        )
    with pytest.raises(ValueError, match="seed 0 there, 1 now"):
        icl_stages(toy, path, seed=1)
    with pytest.raises(ValueError, match="partial `interp icl` run"):
        resume_stages(path, "ioi", icl_settings(toy), list(KEPT_STAGES), ioi_stage_notes)
    result = CliRunner().invoke(app, ["icl", "--model", "toy-induction", "--seed", "1", "--save", str(path)])
    assert result.exit_code == 2 and "cannot resume" in result.output


def test_a_stopped_ioi_run_resumes_to_the_same_circuit(tmp_path):
    model = interp.load_model("toy-ioi")
    path = tmp_path / "ioi.json"
    settings = {"model": model.cfg.model_name, "weights": weights_fingerprint(model), "n_prompts": 16}

    def stages():
        return resume_stages(path, "ioi", settings, list(KEPT_STAGES), ioi_stage_notes)

    with pytest.raises(KeyboardInterrupt):
        find_ioi_circuit(model, n_prompts=16, stages=stop_after(stages(), KEPT_STAGES[1]))
    assert load_result(path).missing == list(KEPT_STAGES[2:])
    text = rendered(path, tmp_path)
    assert "partial result (2 of 7 stages)" in text and "name_mover" in text
    resumed = find_ioi_circuit(model, n_prompts=16, stages=stages())
    assert without_timings(resumed) == without_timings(find_ioi_circuit(model, n_prompts=16))


def test_interp_icl_save_resumes_and_ends_with_the_full_result(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "icl.json"
    command = ["icl", "--model", "toy-induction", "--n-documents", "12", "--save", str(path)]
    first = CliRunner().invoke(app, command)
    assert first.exit_code == 0, first.output
    assert type(load_result(path)).__name__ == "ICLResult"


def test_quick_runs_the_preset_and_its_report_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))  # interp heads keeps its induction heads
    saved, out = tmp_path / "heads.json", tmp_path / "heads.md"
    command = ["heads", "--model", "toy-induction", "--quick", "--format", "markdown", "--out", str(out)]
    result = CliRunner().invoke(app, [*command, "--save", str(saved)])
    assert result.exit_code == 0, result.output
    preset = QUICK_PRESETS["heads"]
    assert load_result(saved).settings["n_samples"] == preset.options["n_samples"][0]
    assert preset.note in out.read_text() and preset.note in load_result(saved).provenance
    given = CliRunner().invoke(app, [*command, "--n-samples", "4", "--save", str(saved)])
    assert given.exit_code == 0 and load_result(saved).settings["n_samples"] == 4  # a given option wins
    refused = CliRunner().invoke(app, ["icl", "--fv", "--quick"])
    assert refused.exit_code == 2 and "--quick applies to the ICL score" in refused.output
