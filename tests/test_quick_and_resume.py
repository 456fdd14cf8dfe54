"""Early answers, kept: --save keeps each stage as it finishes, so a run stopped after stage k leaves a
partial result that `interp render` shows, and the same run resumed from it ends with the
uninterrupted run's result; --quick runs a smaller preset whose report says what it costs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.heads import head_report
from circuits.heads.pipeline import KEPT_STAGES as HEAD_STAGES
from circuits.icl import ICLSettings, icl_report
from circuits.icl.heads import ATTRIBUTION_STAGE
from circuits.icl.pipeline import icl_report_stages, icl_stage_notes
from circuits.ioi import find_ioi_circuit
from circuits.ioi.discover import KEPT_STAGES, ioi_stage_notes
from circuits.results_file import PartialResult, load_result, resume_stages, save_result, write_result_report
from circuits.stages import weights_fingerprint
from interp.catalog import QUICK_PRESETS
from interp.io.serialize import encode

ICL_OPTIONS = {"n_documents": 12, "seed": 0}
ROOT = Path(__file__).resolve().parents[1]
FILE_WAIT_S = 300.0  # the longest wait for a stage's file: generous, never a timing assertion
# `interp ARGS` that stops once its --save file holds STALL_AT stages (0: never): it waits there for
# the test's signal, so the signal always finds the run with exactly those stages kept.
STALLING_INTERP = """
import sys, time
import circuits.cli as cli
import circuits.results_file as results_file

stall_at, arguments = int(sys.argv[1]), sys.argv[2:]
save = results_file.save_result

def save_then_stall(result, path):
    save(result, path)
    if isinstance(result, results_file.PartialResult) and len(result.done) == stall_at:
        while True:
            time.sleep(0.1)

results_file.save_result = save_then_stall
cli.app(arguments)
"""


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


def test_a_heads_partial_run_of_the_same_options_before_the_held_out_rule_is_refused(tmp_path):
    """A partial `interp heads` file whose causal checks ran on the sequences that chose the heads (its
    settings without the held-out rule) is not resumed: its kept stages would mix the two rules."""
    path = tmp_path / "heads.json"
    options = {"model": "toy-induction", "n_samples": 4, "seed": 0, "dtype": "float32"}
    save_result(
        PartialResult(command="heads", settings=options, stages=list(HEAD_STAGES), done={}, notes={}), path
    )
    result = CliRunner().invoke(
        app, ["heads", "--model", "toy-induction", "--n-samples", "4", "--save", str(path)]
    )
    assert result.exit_code == 2 and "held_out None there" in " ".join(result.output.split())


@pytest.mark.parametrize("command", [["icl"], ["icl", "--fv"]], ids=" ".join)
def test_an_icl_partial_run_with_heads_confirmed_before_the_held_out_rule_is_refused(command, tmp_path):
    """A partial `interp icl` or `icl --fv` file whose induction heads `interp heads` confirmed on the
    sequences that chose them (no rule among its options) is not resumed: its kept heads would be
    another rule's."""
    path = tmp_path / "icl.json"
    options = {"model": "toy-induction", "induction_heads": None}
    save_result(
        PartialResult(command=" ".join(command), settings=options, stages=[], done={}, notes={}), path
    )
    result = CliRunner().invoke(app, [*command, "--model", "toy-induction", "--save", str(path)])
    assert result.exit_code == 2, result.output
    assert "induction_heads None there, 'confirmed by interp heads" in " ".join(result.output.split())


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


def test_interp_heads_interrupted_or_killed_resumes_from_its_file(tmp_path):
    """Real signals to a real `interp heads --save` process: Ctrl-C (SIGINT) after the first stage and
    SIGKILL after the second each leave a readable partial result, and each rerun resumes from it: the
    kept stages are not run again and the last rerun's report is the uninterrupted run's."""
    path, log = tmp_path / "heads.json", tmp_path / "interp.log"
    options = ["--model", "toy-induction", "--n-samples", "4", "--save", str(path)]
    command = ["heads", *options, "--format", "markdown", "--out", str(tmp_path / "heads.md")]
    env = os.environ | {"INTERP_CACHE": str(tmp_path / "cache")}

    def start(stall_at: int) -> subprocess.Popen:  # a new process, its output in `log`
        with log.open("w") as output:
            script = [sys.executable, "-c", STALLING_INTERP, str(stall_at), *command]
            return subprocess.Popen(script, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)

    def stop_once_kept(process: subprocess.Popen, n_stages: int, signal_number: int) -> int:
        deadline = time.monotonic() + FILE_WAIT_S
        while not (path.is_file() and len(getattr(load_result(path), "done", ())) == n_stages):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        process.send_signal(signal_number)
        return process.wait(FILE_WAIT_S)

    assert stop_once_kept(start(1), 1, signal.SIGINT) == 130, log.read_text()
    unwrapped = "".join(log.read_text().split())  # the console wraps long paths anywhere
    assert "".join(f"Stopped: {path} holds the stages done".split()) in unwrapped
    partial = load_result(path)
    assert list(partial.done) == [HEAD_STAGES[0]] and partial.missing == list(HEAD_STAGES[1:])
    assert "partial result (1 of 3 stages)" in rendered(path, tmp_path)
    other = CliRunner().invoke(app, ["heads", *options[:2], "--n-samples", "5", "--save", str(path)])
    assert other.exit_code == 2 and "n_samples 4 there, 5 now" in " ".join(other.output.split())

    assert stop_once_kept(start(2), 2, signal.SIGKILL) == -signal.SIGKILL
    lines = log.read_text()
    assert f"Attention scores (repeated): kept from {path}" in lines
    assert "Attention scores (repeated) ..." not in lines  # the kept stage did not run again
    assert list(load_result(path).done) == list(HEAD_STAGES[:2])  # written atomically: readable

    resumed = CliRunner().invoke(app, command, env={"INTERP_CACHE": str(tmp_path / "cache")})
    assert resumed.exit_code == 0, resumed.output
    assert f"Causal checks: {HEAD_STAGES[1]}: kept from {path}" in resumed.output
    assert "Attention scores (repeated) ..." not in resumed.output
    uninterrupted = head_report(interp.load_model("toy-induction"), n_samples=4)
    assert without_timings(load_result(path)) == without_timings(uninterrupted)
