"""Early answers, kept: --save keeps each stage as it finishes, so a run stopped after stage k leaves a
partial result that `interp render` shows, and the same run resumed from it ends with the
uninterrupted run's result; --quick runs a smaller preset whose report says what it costs."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import circuits.command as skeleton
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
from interp.catalog import QUICK_PRESETS
from interp.io.serialize import encode
from interp.model import weights_fingerprint

ICL_OPTIONS = {"n_documents": 12, "seed": 0}
PAIRS = Path(__file__).parents[1] / "docs" / "guide" / "data" / "agreement.csv"
ROOT = Path(__file__).resolve().parents[1]
FILE_WAIT_S = 300.0  # the longest wait for a stage's file: generous, never a timing assertion
# `interp ARGS` that stops once its progress has said "stage STALL_AT of N done" (0: never): it waits
# there for the test's signal, so the signal finds the run just after the user saw that stage done.
STALLING_INTERP = """
import sys, time
import circuits.cli as cli
import circuits.progress_printer as printer

stall_at, arguments = int(sys.argv[1]), sys.argv[2:]
line = printer.ProgressPrinter.line

def line_then_stall(self, text):
    line(self, text)
    if text.startswith(f"stage {stall_at} of ") and " done: " in text:
        while True:
            time.sleep(0.1)

printer.ProgressPrinter.line = line_then_stall
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
    with pytest.raises(ValueError, match="partial `interp icl` result, not one of `interp ioi`"):
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


def test_a_partial_run_made_by_other_code_is_refused(tmp_path):
    """A stopped run resumes only under the code that began it: its kept stages and the new ones would
    be two versions' (the sources of interp and circuits are part of the key)."""
    from circuits.heads.probes import HELD_OUT_RULE

    path = tmp_path / "heads.json"
    options = {"model": "toy-induction", "n_samples": 4, "seed": 0, "dtype": "float32"}
    weights = weights_fingerprint(interp.load_model("toy-induction"))
    made = options | {"held_out": HELD_OUT_RULE, "code": "0" * 16, "weights": weights}
    save_result(
        PartialResult(command="heads", settings=made, stages=list(HEAD_STAGES), done={}, notes={}), path
    )
    result = CliRunner().invoke(
        app, ["heads", "--model", "toy-induction", "--n-samples", "4", "--save", str(path)]
    )
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and f"code '{'0' * 16}' there" in said, said
    assert "the code of interp or circuits changed since" in said
    assert set(said.split("cannot resume (")[1].split(" there")[0].split()) == {"code", f"'{'0' * 16}'"}


def test_the_source_key_follows_every_file_of_the_packages(tmp_path, monkeypatch):
    import importlib

    from interp.io.source_code import source_key

    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "mod.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("pkg")
    before = source_key(module)
    assert source_key(module) == before
    (package / "sub" / "mod.py").write_text("x = 2\n")
    assert source_key(module) != before


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
    said = " ".join(result.output.split())
    assert "induction_heads None there, " in said and "confirmed by interp heads: " in said, said


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
    finding = load_result(path)
    assert type(finding).__name__ == "Finding" and finding.analysis == "icl"


def said_quick_note(output: str) -> str:
    """The --quick note a command said on stderr (its line "Quick preset: ..."), as its report carries
    it (lower case, no full stop)."""
    said = next(line for line in output.splitlines() if line.startswith("Quick preset: "))
    return "q" + said[1:-1]


def test_quick_runs_the_preset_and_says_the_sizes_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))  # interp heads keeps its induction heads
    saved, out = tmp_path / "heads.json", tmp_path / "heads.md"
    command = ["heads", "--model", "toy-induction", "--quick", "--format", "markdown", "--out", str(out)]
    result = CliRunner().invoke(app, [*command, "--save", str(saved)])
    assert result.exit_code == 0, result.output
    n_samples = load_result(saved).settings.n_samples
    assert n_samples == QUICK_PRESETS["heads"].options["n_samples"][0]
    note = said_quick_note(result.output)
    assert f"{n_samples} probe sequences per repeat length instead of 16" in note
    assert note in load_result(saved).provenance and note in out.read_text()
    other = tmp_path / "heads-4.json"
    given = CliRunner().invoke(app, [*command, "--n-samples", "4", "--save", str(other)])
    assert given.exit_code == 0 and load_result(other).settings.n_samples == 4  # a given option wins
    assert "nothing smaller (4 probe sequences per repeat length, as given)" in said_quick_note(given.output)
    default = tmp_path / "heads-16.json"  # given with the default's value: given all the same
    given = CliRunner().invoke(app, [*command, "--n-samples", "16", "--save", str(default)])
    assert given.exit_code == 0 and load_result(default).settings.n_samples == 16
    assert "nothing smaller (16 probe sequences per repeat length, as given)" in said_quick_note(given.output)
    refused = CliRunner().invoke(app, ["icl", "--fv", "--quick"])
    assert refused.exit_code == 2 and "--quick applies to the ICL score" in refused.output


def circuit_sizes(result) -> str:
    return (
        f"{result.task.n_prompts} prompt pairs find the circuit and {result.heldout_task.n_prompts} "
        "held-out ones test it"
    )


def icl_sizes(finding) -> str:
    n_discovery, n_heldout = len(finding.chose["documents"]), len(finding.tested["documents"])
    return (
        f"{n_discovery + n_heldout} documents ({n_discovery} rank the heads, {n_heldout} held out, "
        f"{finding.extras.n_ablated(finding)} ablated)"
    )


QUICK_RUNS = {  # a --quick run on a toy model -> (the sizes its result used, in the note's words, and more)
    "circuit --task ioi": (
        ["circuit", "--model", "toy-ioi", "--task", "ioi", "--method", "eap", "--edges", "10"],
        lambda result: [circuit_sizes(result) + ", instead of 64 and 64", "eap trains no edge mask"],
    ),
    "circuit --task induction": (
        ["circuit", "--model", "toy-induction", "--task", "induction", "--edges", "10"],
        lambda result: [circuit_sizes(result), "the edge mask trained 30 steps instead of 45"],
    ),
    "icl": (
        ["icl", "--model", "toy-induction"],
        lambda result: [
            icl_sizes(result) + " instead of 60 documents (12 rank the heads, 48 held out, 12 ablated)"
        ],
    ),
    "icl --n-documents 10": (  # its preset's 6 and 6 are cut to half of the 10, as without --quick
        ["icl", "--model", "toy-induction", "--n-documents", "10"],
        lambda result: [f"quick preset: nothing smaller ({icl_sizes(result)}, as without --quick)"],
    ),
    "ioi": (
        ["ioi", "--model", "toy-ioi"],
        lambda result: [
            f"{result.settings.n_prompts} prompts (and {result.extras.heldout.n_prompts} held out)"
        ],
    ),
}


@pytest.mark.parametrize("run", sorted(QUICK_RUNS))
def test_quick_says_the_sizes_each_task_kind_runs(run, tmp_path, monkeypatch):
    """What --quick says on stderr and in the report's model line are the sizes the saved result used."""
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    arguments, sizes = QUICK_RUNS[run]
    saved = tmp_path / "result.json"
    result = CliRunner().invoke(app, [*arguments, "--quick", "--save", str(saved)])
    assert result.exit_code == 0, result.output
    note, found = said_quick_note(result.output), load_result(saved)
    for words in sizes(found):
        assert words in note
    assert found.provenance.endswith(note)


def test_quick_on_a_prompt_pair_file_says_the_pairs_it_runs(tmp_path):
    """A file's pairs are all used whatever --n-prompts: --quick says the split of them that ran (not the
    preset's 16 prompt pairs), on families of unequal sizes."""
    rows = list(csv.DictReader(PAIRS.open()))
    by_family = {}
    for row in rows:
        by_family.setdefault(row["family"], []).append(row)
    chosen = [row for i, family in enumerate(list(by_family)[:5]) for row in by_family[family][: 2 * i + 2]]
    pairs = tmp_path / "pairs.csv"
    with pairs.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(chosen)
    saved = tmp_path / "circuit.json"
    arguments = ["circuit", "--task", str(pairs), "--method", "eap", "--edges", "10", "--metric", "prob"]
    result = CliRunner().invoke(app, [*arguments, "--quick", "--save", str(saved)])
    assert result.exit_code == 0, result.output
    note, found = said_quick_note(result.output), load_result(saved)
    assert found.task.n_prompts + found.heldout_task.n_prompts == len(chosen)
    assert found.task.n_prompts != found.heldout_task.n_prompts  # families of unequal sizes
    assert f"the file's pairs are all used: {circuit_sizes(found)}" in note
    assert "eap trains no edge mask" in note and "instead of" not in note
    assert found.provenance.endswith(note)


KILLED_RUNS = {  # command -> (its options on a toy model, the stages its progress numbers and --save keeps)
    "heads": (["--model", "toy-induction", "--n-samples", "4"], HEAD_STAGES),
    "ioi": (["--model", "toy-ioi", "--n-prompts", "16"], KEPT_STAGES),
}


@pytest.mark.parametrize("command", sorted(KILLED_RUNS))
def test_a_run_killed_after_each_stage_shows_done_resumes_without_running_it_again(command, tmp_path):
    """Real signals to real `interp heads|ioi --save` processes: the run is stopped just after its
    progress says "stage k of N done", for every k, alternately by Ctrl-C (SIGINT) and SIGKILL, and
    each stopped run is resumed by the next: its file holds stages 1..k, the resumed run says they are
    kept and starts none of them again, and the last run's result is the uninterrupted run's."""
    options, stages = KILLED_RUNS[command]
    path, log = tmp_path / f"{command}.json", tmp_path / "interp.log"
    arguments = [command, *options, "--save", str(path), "--format", "json", "--out", str(tmp_path / "out")]
    env = os.environ | {"INTERP_CACHE": str(tmp_path / "cache")}
    n = len(stages)

    def run(stall_at: int, signal_number: int | None = None) -> tuple[int, list[str]]:
        """The exit status and progress lines of a run stopped by `signal_number` once it says stage
        `stall_at` is done (none: a run to its end)."""
        with log.open("w") as output:
            script = [sys.executable, "-c", STALLING_INTERP, str(stall_at), *arguments]
            process = subprocess.Popen(script, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)
        if signal_number is not None:
            deadline = time.monotonic() + FILE_WAIT_S
            said = f"stage {stall_at} of {n} done: {stages[stall_at - 1]}, saved to {path}"
            while said not in log.read_text():
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            process.send_signal(signal_number)
        status = process.wait(FILE_WAIT_S)
        return status, log.read_text().splitlines()

    def started(lines: list[str], k: int) -> bool:
        """Whether the run began any work of stage k (a line "stage k of N: ... ...")."""
        return any(re.search(rf"\] stage {k} of {n}: .* \.\.\.$", line) for line in lines)

    for k in range(1, n + 1):
        signal_number = signal.SIGINT if k % 2 else signal.SIGKILL
        status, lines = run(k, signal_number)
        assert status == (130 if signal_number == signal.SIGINT else -signal.SIGKILL), "\n".join(lines)
        assert list(load_result(path).done) == list(stages[:k])  # written atomically: readable
        if signal_number == signal.SIGINT:  # the console wraps long paths anywhere
            stopped = "".join(f"Stopped: {path} holds the stages done".split())
            assert stopped in "".join("".join(lines).split())
        for j in range(1, k):  # kept by the runs before: not run again
            assert f"stage {j} of {n}: {stages[j - 1]}: kept from {path}" in "\n".join(lines)
            assert not started(lines, j), "\n".join(lines)
        assert started(lines, k)
    assert "partial result" in rendered(path, tmp_path)

    status, lines = run(0)
    assert status == 0, "\n".join(lines)
    assert not any(started(lines, k) for k in range(1, n + 1)), "\n".join(lines)
    model = interp.load_model(options[1])
    if command == "heads":
        uninterrupted = head_report(model, n_samples=4)
    else:
        uninterrupted = find_ioi_circuit(model, n_prompts=16)
    assert without_timings(load_result(path)) == without_timings(uninterrupted)


def test_a_run_stopped_before_its_first_stage_finished_says_nothing_was_saved(tmp_path, monkeypatch):
    """Ctrl-C (KeyboardInterrupt) in the first stage of `interp heads --save`: nothing is written, and the
    command says so and exits with 130 (it stopped without a word)."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("circuits.heads.pipeline.score_heads", interrupted)
    path = tmp_path / "heads.json"
    result = CliRunner().invoke(app, ["heads", "--model", "toy-induction", "--save", str(path)])
    assert result.exit_code == 130 and not path.exists(), result.output
    said = "".join(result.output.split())  # the console wraps long paths anywhere
    assert "".join(f"Stopped before its first stage finished: nothing was saved to {path}".split()) in said


def no_model_loads(monkeypatch) -> None:
    """Make any model load of the `interp` command fail the test: what is refused is refused first."""

    def load(model, dtype="float32"):
        raise AssertionError(f"the model {model} was loaded before --save was checked")

    monkeypatch.setattr(skeleton, "load", load)


SAVED_RUNS = {  # command -> (the options of a result on a toy model, an option that changes it, its key)
    "heads": (["heads", "--model", "toy-induction", "--n-samples", "4"], ["--seed", "1"],
              "seed 0 there, 1 now"),
    "hop": (["hop", "--model", "toy-hop", "--n-sequences", "16"], ["--seed", "1"], "seed 0 there, 1 now"),
    "patch": (
        ["patch", "--model", "toy-ioi", "--n-prompts", "4", "--component", "resid_pre"],
        ["--direction", "noise"],
        "direction 'denoise' there, 'noise' now",
    ),
    "circuit": (
        ["circuit", "--model", "toy-induction", "--task", "induction", "--method", "eap", "--edges", "10",
         "--n-prompts", "8"],
        ["--n-prompts", "10"],
        "n_prompts 8 there, 10 now",
    ),
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(SAVED_RUNS))
def test_save_never_replaces_a_result_of_other_settings(command, tmp_path, monkeypatch):
    """--save over a complete result of other options is refused before the model loads, naming the
    option and how to start afresh, and leaves the file as it was; so is --save over a file that is no
    result; so is a complete result of the same options (a run stopped mid-way would lose it)."""
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    arguments, other, difference = SAVED_RUNS[command]
    path = tmp_path / "result.json"
    first = CliRunner().invoke(app, [*arguments, "--save", str(path)])
    assert first.exit_code == 0, first.output
    saved = path.read_bytes()
    with monkeypatch.context() as patched:
        no_model_loads(patched)
        refused = CliRunner().invoke(app, [*arguments, *other, "--save", str(path)])
        text = " ".join(refused.output.split())
        assert refused.exit_code == 2 and difference in text, text
        unwrapped = "".join(refused.output.split())  # the console wraps long paths anywhere
        assert "".join(f"delete {path} or pass another --save path".split()) in unwrapped
        assert path.read_bytes() == saved
        notes = tmp_path / "notes.json"
        notes.write_text('{"my": "notes"}')
        kept = CliRunner().invoke(app, [*arguments, "--save", str(notes)])
        assert kept.exit_code == 2 and "is not a result file of interp" in " ".join(kept.output.split())
        assert notes.read_text() == '{"my": "notes"}'
    again = CliRunner().invoke(app, [*arguments, "--save", str(path)])  # refused once the weights are known
    said = " ".join(again.output.split())
    assert again.exit_code == 2 and "already holds this command's complete result" in said, said
    assert path.read_bytes() == saved


def test_save_refuses_a_result_of_other_weights_and_one_that_records_no_settings(tmp_path, monkeypatch):
    """The same options on another model's weights (a checkpoint directory trained again) are refused
    once the model loads, before any work; a result saved without its settings (an older interp's) is
    refused before."""
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    model, path = tmp_path / "model", tmp_path / "hop.json"
    for seed in ("0", "1"):
        trained = CliRunner().invoke(
            app, ["train", "--task", "hop", "--steps", "1", "--seed", seed, "--out", str(tmp_path / seed)]
        )
        assert trained.exit_code == 0, trained.output
    (tmp_path / "0").rename(model)
    arguments = ["hop", "--model", str(model), "--n-sequences", "16", "--save", str(path)]
    assert CliRunner().invoke(app, arguments).exit_code == 0
    saved = path.read_bytes()
    shutil.rmtree(model)
    (tmp_path / "1").rename(model)
    refused = CliRunner().invoke(app, arguments)
    said = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "weights '" in said and "there, '" in said, refused.output
    assert path.read_bytes() == saved
    save_result(load_result(path), path)  # as an older interp wrote it: no command, no settings
    with monkeypatch.context() as patched:
        no_model_loads(patched)
        older = CliRunner().invoke(app, arguments)
    assert older.exit_code == 2 and "settings it does not record" in " ".join(older.output.split())


def test_a_report_cut_short_by_a_closed_pipe_leaves_the_whole_result_saved(tmp_path):
    """`interp heads --save F | head`: once the reader has closed the pipe the report stops (rich exits
    with status 1); the result was saved before the report, whole (not as the stages done)."""
    saved = tmp_path / "heads.json"
    env = os.environ | {"INTERP_CACHE": str(tmp_path / "cache")}
    command = [
        sys.executable,
        "-c",
        "from circuits.cli import app; app()",
        "heads",
        "--model",
        "toy-induction",
    ]
    read, write = os.pipe()
    os.close(read)  # a reader that has gone: the report's first write finds the pipe closed
    try:
        status = subprocess.run(
            [*command, "--quick", "--save", str(saved)], cwd=ROOT, env=env, stdout=write,
            stderr=subprocess.DEVNULL, timeout=600,
        ).returncode  # fmt: skip
    finally:
        os.close(write)
    assert status == 1
    assert not isinstance(load_result(saved), PartialResult)


def test_two_commands_saving_to_one_path_at_once_the_second_is_refused(tmp_path):
    """Two `interp ... --save PATH` started together both pass the check of PATH (no file yet) before
    either has written; the second is refused while the first runs, instead of the two overwriting each
    other's result (the last to write wins, and `interp ioi` said "Wrote PATH" of what holds heads)."""
    path = tmp_path / "result.json"
    # the first command waits as its first stage begins: past its check of --save, nothing written yet
    waiting = STALLING_INTERP.replace(
        'f"stage {stall_at} of ") and " done: " in text', 'f"stage {stall_at} of ")'
    )
    env = {**os.environ, "INTERP_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        [sys.executable, "-c", waiting, "1", "heads", "--model", "toy-induction", "--save", str(path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        said = ""
        while "stage 1 of " not in said:
            said = first.stdout.readline()
            assert said or first.poll() is None, "the first command ended before its first stage"
        assert not path.exists()
        second = subprocess.run(
            [sys.executable, "-c", STALLING_INTERP, "0", "ioi", "--model", "toy-ioi", "--save", str(path)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=FILE_WAIT_S,
        )  # fmt: skip
    finally:
        first.kill()
        first.wait()
    output = " ".join((second.stdout + second.stderr).split())
    assert second.returncode == 2 and f"process {first.pid}" in output and "is saving to" in output, output
    assert not path.exists()
