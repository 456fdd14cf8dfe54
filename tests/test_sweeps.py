"""Checkpoint sweeps: head types over a training run's saved steps, in this process and on Ray."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import interp
from circuits.cli import app
from circuits.sweeps import checkpoint_head_sweep, plot_head_sweep, training_checkpoints


def test_checkpoint_sweep_shows_the_induction_head_forming(checkpointed_run, tmp_path):
    assert [step for step, _ in training_checkpoints(checkpointed_run)] == [200, 400, 600]
    frame = checkpoint_head_sweep(checkpointed_run, n_samples=8)
    assert list(frame[["step", "layer", "head"]].itertuples(index=False, name=None)) == [
        (step, layer, 0) for step in (200, 400, 600) for layer in (0, 1)
    ]
    induction = frame[frame["layer"] == 1].set_index("step")["induction"]
    previous = frame[frame["layer"] == 0].set_index("step")["previous_token"]
    # The induction head forms after step 300 (0.13 at 300, 0.73 at 450, 0.80 at 600 when this test
    # was written), while the layer-0 head's previous-token score grows (0.10 at 150 -> 0.20 at 600).
    assert induction[200] < 0.3 < 0.5 < induction[600]
    assert previous[600] > previous[200]
    figure = plot_head_sweep(frame, "induction", tmp_path / "induction.png", top=2)
    assert (tmp_path / "induction.png").stat().st_size > 1000
    lines = figure.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["L1H0", "L0H0"]
    assert list(lines[0].get_ydata()) == list(induction)  # steps in order


def test_checkpoint_sweep_on_ray_equals_this_process(ray_cluster, checkpointed_run, tmp_path):
    here = checkpoint_head_sweep(checkpointed_run, n_samples=8)
    on_ray = checkpoint_head_sweep(checkpointed_run, n_samples=8, ray="local", store=tmp_path)
    numeric = here.select_dtypes("number").columns
    assert list(on_ray.columns) == list(here.columns) and list(on_ray["types"]) == list(here["types"])
    assert (on_ray[numeric] - here[numeric]).abs().max().max() < 1e-6
    stored = sorted(p.name for p in tmp_path.glob("*/shard_*.json"))
    assert stored == [f"shard_0000{i}.json" for i in range(3)]  # JSON + safetensors, never pickles
    resumed = checkpoint_head_sweep(checkpointed_run, n_samples=8, store=tmp_path)  # read back
    pd.testing.assert_frame_equal(resumed, on_ray)


def test_a_resumed_sweep_reports_weights_written_again_in_any_layout_afresh(tmp_path):
    """A sweep resumed from its store after a source's weights were written again (here as sharded
    safetensors, which a check of model.safetensors alone missed) reports the new weights."""
    import transformers

    from circuits.heads import head_report
    from circuits.sweeps import head_sweep

    source, store = tmp_path / "model", tmp_path / "store"

    def save(seed: int) -> None:
        torch.manual_seed(seed)
        config = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=4, vocab_size=50257, n_positions=32, initializer_range=0.3
        )
        transformers.GPT2LMHeadModel(config).save_pretrained(source, max_shard_size="2MB")

    save(0)
    first = head_sweep([source], n_samples=4, causal=False, store=store)
    save(1)
    assert len(list(source.glob("model-*.safetensors"))) > 1
    resumed = head_sweep([source], n_samples=4, causal=False, store=store)
    report = head_report(interp.load_model(str(source)), n_samples=4, causal=False)
    fresh = report.extras.full_table(report)["previous_token"].to_numpy()
    assert abs(resumed["previous_token"].to_numpy() - fresh).max() < 1e-6
    assert abs(first["previous_token"].to_numpy() - fresh).max() > 1e-3


def assert_same_report(a, b, where: str = "report") -> None:
    """Equal structure and strings; numbers equal to 1e-6 (workers run torch on another thread count)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            if key not in ("timings", "timings_s"):  # seconds, not results
                assert_same_report(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_report(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= 1e-6, f"{where}: {a} != {b}"
    else:
        assert a == b, where


@pytest.mark.parametrize("command", ["heads", "ioi"])
def test_cli_ray_option_gives_the_local_report(ray_cluster, command, tmp_path):
    model = "toy-induction" if command == "heads" else "toy-ioi"
    reports = []
    for extra in ([], ["--ray", "local"]):
        out = tmp_path / f"{command}{len(extra)}.json"
        result = CliRunner().invoke(
            app, [command, "--model", model, "--format", "json", "--out", str(out), *extra]
        )
        assert result.exit_code == 0, result.output
        reports.append(json.loads(out.read_text()))
    assert_same_report(*reports)


def test_cli_ray_option_without_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    result = CliRunner().invoke(app, ["heads", "--model", "toy-induction", "--ray", "local"])
    assert result.exit_code == 2 and 'pip install "interp[ray]"' in " ".join(result.output.split())
