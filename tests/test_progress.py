"""The `interp` command's progress: stages announced and run, a line at least every heartbeat without
a terminal, time left only once stable; expected times in --help and the README; early stopping."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.progress_printer import ESTIMATE_AFTER_ITEMS, ESTIMATE_AFTER_S, ProgressPrinter
from interp.catalog import EXPECTED_TIMES, QUICK_PRESETS, expected_time_text, quick_time_text

ROOT = Path(__file__).resolve().parents[1]
HEARTBEAT_S = 1.0  # the heartbeat the subprocess runs with
SLEEP_S = 5.0  # a slow forward pass: longer than any gap the heartbeat allows

SLOW_COMMAND = """
import sys, time
import interp
import circuits.cli as cli
import circuits.command as skeleton
import circuits.progress_printer as printer

printer.HEARTBEAT_S = {heartbeat}
model = interp.load_model("toy-induction")
slept = []

staged, line = [], printer.ProgressPrinter.line

def noted(self, text):  # the stages have begun once a line starts one
    staged.append(text.startswith("stage "))
    return line(self, text)

printer.ProgressPrinter.line = noted

def slow(activation, hook):
    if any(staged) and len(slept) < 2:  # two slow passes inside the command's stages
        slept.append(time.sleep({sleep}))
    return activation

model.add_hook("blocks.1.hook_resid_post", slow)
skeleton.load = lambda name, dtype="float32": model
cli.app(["circuit", "--model", "toy-induction", "--task", "induction", "--method", "eap", "--edges", "10",
         "--n-prompts", "8"])
"""


def test_a_log_gets_a_line_at_least_every_heartbeat_and_the_announced_stages_run():
    """Without a terminal, a real toy model whose forward passes sleep: no silence longer than the
    heartbeat (plus the timer's tick and scheduling slack), and the stages announced are those run."""
    script = SLOW_COMMAND.format(heartbeat=HEARTBEAT_S, sleep=SLEEP_S)
    command = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    arrivals = []
    for line in command.stderr:
        arrivals.append((time.monotonic(), line.rstrip()))
    assert command.wait() == 0, "\n".join(line for _, line in arrivals)
    lines = [line for _, line in arrivals if line.startswith("[circuit")]
    plan = re.search(r"\d+ stages: (.*?)(?: \(Expected time|$)", lines[0])
    announced = [item.split(". ", 1)[1] for item in plan.group(1).split(", ")]
    started = [re.search(r"stage \d+ of \d+: (.*) \.\.\.$", line) for line in lines]
    assert [match.group(1) for match in started if match] == announced
    assert not any("extra stage" in line for line in lines)
    times = [when for when, line in arrivals if line.startswith("[circuit")]
    assert times[-1] - times[0] > 2 * SLEEP_S  # the slow passes ran within the stages
    assert max(b - a for a, b in zip(times[:-1], times[1:], strict=True)) < HEARTBEAT_S + 3.0
    assert any("(still working)" in line for line in lines)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_left_appears_only_once_the_rate_is_stable_and_is_never_frozen():
    clock, lines = Clock(), []
    printer = ProgressPrinter("test", ["Work"], lines.append, clock)
    printer("Work", 0, 100)
    for done in range(1, ESTIMATE_AFTER_ITEMS):  # too few units
        clock.now += 20.0
        printer("Work", done, 100)
        assert "left" not in printer.status("Work", clock.now)
    clock.now = 0.0
    printer = ProgressPrinter("test", ["Work"], lines.append, clock)
    printer("Work", 0, 100)
    for done in range(1, 20):  # many units, too little time
        clock.now += (ESTIMATE_AFTER_S - 1) / 20
        printer("Work", done, 100)
        assert "left" not in printer.status("Work", clock.now)
    for done in range(20, 40):  # the same rate, long enough: an estimate
        clock.now += 1.0
        printer("Work", done, 100)
    shown = printer.status("Work", clock.now)
    assert "left" in shown
    clock.now += 30.0  # a slow unit: the estimate is recomputed from the time now, elapsed too
    later = printer.status("Work", clock.now)
    assert "left" in later and later != shown
    left = [float(re.search(r"about (\d+) s left", text).group(1)) for text in (shown, later)]
    assert left[1] > left[0]
    printer("Work", 40, 100)  # after the slow unit the projections disagree: no estimate
    assert "left" not in printer.status("Work", clock.now)


def test_a_stage_that_finds_less_to_do_says_what_it_counted_at_first():
    """`interp heads` counts every run of both looks, then stops the futile effects after the first
    (540 runs, then 288): the count says it went down, rather than seeming to jump ahead."""
    clock, lines = Clock(), []
    printer = ProgressPrinter("test", ["Work"], lines.append, clock)
    printer("Work", 0, 540)
    clock.now += 6.0
    printer("Work", 216, 540)
    assert "216/540," in lines[-1]
    clock.now += 6.0
    printer("Work", 251, 288)
    assert "251/288 (down from 540)," in lines[-1]


def test_the_heartbeat_repeats_the_current_stage_with_its_elapsed_time():
    clock, lines = Clock(), []
    printer = ProgressPrinter("test", ["Load", "Work"], lines.append, clock)
    printer("Work", 0, 1)
    for second in (3.0, 12.0, 25.0):
        clock.now = second
        printer.heartbeat()
    beats = [line for line in lines if "still working" in line]
    assert len(beats) == 2 and "stage 2 of 2: Work" in beats[0]
    assert [int(re.search(r"(\d+) s in this stage", line).group(1)) for line in beats] == [12, 25]


def test_work_between_stages_is_named_by_where_it_falls_and_each_saved_stage_is_said_done():
    clock, lines = Clock(), []
    printer = ProgressPrinter("test", ["A", "B"], lines.append, clock, between=["prep"], saved_to="r.json")
    assert "2 stages, each saved to r.json as it finishes: 1. A, 2. B" in lines[0]
    printer("prep", 0, 1)
    assert lines[-1].endswith("] before stage 1: prep ...")
    printer("A: first part", 0, 2)
    assert lines[-1].endswith("] stage 1 of 2: A: first part ...")
    printer.saved("A")
    assert lines[-1].endswith("] stage 1 of 2 done: A, saved to r.json")
    clock.now = 20.0  # the heartbeat no longer says stage 1 is still working: it is done and saved
    printer.heartbeat()
    assert lines[-1].endswith("] after stage 1 of 2: still working")
    printer("prep: again", 0, 1)
    assert lines[-1].endswith("] after stage 1: prep: again ...")
    printer("other", 0, 1)
    assert lines[-1].endswith("] extra stage: other ...") and printer.unplanned == ["other"]


def _planned(stages: list[str], calls: list[tuple[str, int, int]], between=()) -> list[str]:
    """The planned stages the calls reported, in order (asserting none is outside the plan and the
    work `between` them)."""
    printer = ProgressPrinter("test", stages, lambda _: None, between=between)
    for call in calls:
        printer(*call)
    assert printer.unplanned == []
    return printer.seen


def test_the_planned_stages_are_the_stages_reported(tmp_path):
    from circuits.edge_circuits import EdgeCircuitSettings, edge_task, find_edge_circuit
    from circuits.edge_circuits.find import edge_circuit_stages
    from circuits.heads import head_report
    from circuits.heads.pipeline import BETWEEN_STAGES, KEPT_STAGES
    from circuits.ioi import find_ioi_circuit
    from circuits.ioi.discover import BETWEEN_STAGES as IOI_BETWEEN
    from circuits.ioi.discover import KEPT_STAGES as IOI_STAGES
    from interp.training import TRAIN_STAGE, ToyModelSettings, train_toy_model

    model = interp.load_model("toy-induction")
    calls = []
    head_report(model, n_samples=4, progress=lambda *call: calls.append(call))
    assert _planned(list(KEPT_STAGES), calls, BETWEEN_STAGES) == list(KEPT_STAGES)
    calls = []
    find_ioi_circuit(interp.load_model("toy-ioi"), n_prompts=16, progress=lambda *call: calls.append(call))
    assert _planned(list(IOI_STAGES), calls, IOI_BETWEEN) == list(IOI_STAGES)
    task = edge_task(model, "induction", 8, 0, "logit_diff")
    for method, size in [("prune", None), ("eap", 10)]:
        reported = []
        find_edge_circuit(
            model,
            task,
            EdgeCircuitSettings(method=method, n_edges=size, curve_fractions=None, prune_steps=5),
            progress=lambda *call, into=reported: into.append(call),
        )
        stages = edge_circuit_stages(method, size is None, curve=False)
        assert _planned(stages, reported) == stages
    calls = []
    settings = ToyModelSettings(task="hop", n_heads=2, d_model=16, steps=2)
    train_toy_model(settings, tmp_path / "hop", progress=lambda *call: calls.append(call))
    assert _planned([TRAIN_STAGE], calls) == [TRAIN_STAGE]


def test_the_size_search_reports_its_progress():
    from circuits.edge_circuits import edge_task
    from circuits.edge_circuits.find import SIZE_SEARCH_STAGE, smallest_faithful_size
    from interp.edges import edge_attribution

    model = interp.load_model("toy-induction")
    task = edge_task(model, "induction", 8, 0, "logit_diff")
    scores = edge_attribution(model, task.clean, task.corrupted, task.metric, "eap")
    calls = []
    smallest_faithful_size(model, task, scores, 0.8, progress=lambda *call: calls.append(call))
    assert {stage for stage, _, _ in calls} == {SIZE_SEARCH_STAGE}
    assert calls[-1][1] >= 1 and all(done <= total for _, done, total in calls)


def test_interp_icl_reuses_the_head_report_of_interp_heads(tmp_path, monkeypatch):
    from circuits.heads.cache import INDUCTION_HEADS_STAGE, confirmed_induction_heads

    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    result = CliRunner().invoke(app, ["heads", "--model", "toy-induction"])
    assert result.exit_code == 0, result.output
    calls = []
    heads = confirmed_induction_heads(interp.load_model("toy-induction"), progress=lambda *c: calls.append(c))
    assert heads and len(calls) == 1
    stage, done, total = calls[0]
    assert stage.startswith(f"{INDUCTION_HEADS_STAGE}: reusing the head report cached at {tmp_path}")
    assert (done, total) == (0, 0)


@pytest.mark.parametrize("command", sorted(EXPECTED_TIMES))
def test_expected_times_are_in_help_and_the_readme(command):
    text = " ".join(CliRunner().invoke(app, [command, "--help"]).output.replace("│", " ").split())
    assert " ".join(expected_time_text(command).split()) in text
    assert expected_time_text(command) in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("command", sorted(QUICK_PRESETS))
def test_quick_presets_are_in_help_and_the_readme(command):
    text = " ".join(CliRunner().invoke(app, [command, "--help"]).output.replace("│", " ").split())
    assert " ".join(QUICK_PRESETS[command].text().split()) in text
    assert quick_time_text(command) in (ROOT / "README.md").read_text()


def test_training_stops_early_on_a_held_out_accuracy_plateau(tmp_path):
    from interp.training import TRAIN_STAGE, ToyModelSettings, TrainingLog, train_toy_model

    log = TrainingLog(evals=[{"accuracy": a} for a in (0.1, 0.5, 0.9, 0.95, 0.95, 0.951)])
    assert log.on_plateau(patience=2, above=0.9) and not log.on_plateau(patience=2, above=0.96)
    assert not log.on_plateau(patience=4, above=0.0)  # 0.95 beat the best before it by 0.05
    calls = []
    settings = ToyModelSettings(task="hop", n_heads=2, d_model=16, steps=400, hops=1)
    _, log = train_toy_model(
        settings, tmp_path / "run", eval_every=5, stop_patience=2, stop_above=0.0,
        progress=lambda *call: calls.append(call),
    )  # fmt: skip
    assert log.stopped_early is not None and log.stopped_early < 400
    assert len(log.train_loss) == log.stopped_early == log.evals[-1]["step"]
    assert calls[-1][0].startswith(f"{TRAIN_STAGE}: stopped early")
    again, resumed = train_toy_model(
        settings, tmp_path / "run", eval_every=5, stop_patience=2, stop_above=0.0
    )
    assert len(resumed.train_loss) == log.stopped_early  # a rerun resumes, and stays stopped


def test_the_hop_task_gets_a_layer_more_than_its_hops(tmp_path):
    from interp.catalog import default_layers

    result = CliRunner().invoke(app, ["train", "--task", "hop", "--steps", "1", "--out", str(tmp_path / "h")])
    assert result.exit_code == 0, result.output
    assert interp.load_model(str(tmp_path / "h")).cfg.n_layers == default_layers("hop") == 3
    assert default_layers("hop", 1) == 2 and default_layers("induction") == 2


def test_a_quick_run_s_plan_quotes_the_quick_preset_s_time(capsys):
    """`interp heads --quick` on the default model: the plan says the preset's measured time, not the
    full run's; on another model, whose quick run was not measured, no time."""
    import circuits.command as skeleton

    with skeleton.stage_bars("heads", ["a stage"], model=interp.catalog.DEFAULT_MODEL, quick=True):
        pass
    plan = " ".join(capsys.readouterr().err.split())
    assert QUICK_PRESETS["heads"].time.text() in plan and expected_time_text("heads") not in plan
    with skeleton.stage_bars("heads", ["a stage"], model="toy-induction", quick=True):
        pass
    assert "Expected time" not in capsys.readouterr().err
