"""Head types across several models or across a training run's checkpoints, as one table.

    frame = checkpoint_head_sweep("runs/induction")          # every runs/induction/checkpoints/step_*
    plot_head_sweep(frame, "induction", "induction.png")     # each head's score against the step
    frame = head_sweep(["toy-induction", "smollm2-135m"], ray="local")  # one Ray task per model

Each model or checkpoint is one shard of `interp.runtime.distributed.map_shards`: with `ray` the reports
run on Ray workers, with `store` a stopped sweep resumes from the reports it has finished.
The table has one row per (source, layer, head) and the columns of `HeadFigures.full_table` (the head
report's CSV).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import circuits
import interp
from circuits.heads import head_report
from circuits.output import pyplot, save_figure
from interp.io.source_code import source_key
from interp.runtime.distributed import RayCluster, map_shards, source_version
from interp.training import CHECKPOINTS
from interp.types import Progress


def _load_and_run(job: dict[str, Any]) -> Any:
    """job["fn"](model at job["source"] in job["dtype"], **job["options"]) on a worker (on its GPU if
    any), silently."""
    device = "cuda" if torch.cuda.is_available() else None
    model = interp.load_model(job["source"], device=device, dtype=getattr(torch, job["dtype"])).eval()
    return job["fn"](model, **job["options"])


def run_on_ray(
    fn: Callable[..., Any], source: str | Path, ray: str, dtype: str = "float32", **options: Any
) -> Any:
    """fn(load_model(source, dtype=torch.<dtype>), **options) as one task on a Ray cluster ("local",
    "auto" or an address), e.g. `run_on_ray(head_report, "smollm2-135m", "auto", n_samples=16)`.
    The task asks for a GPU when the cluster has one."""
    job = {"fn": fn, "source": str(source), "dtype": dtype, "options": options}
    return map_shards(_load_and_run, [job], ray=RayCluster(ray, num_gpus=_gpus_per_task(ray)))[0]


def _gpus_per_task(ray: str) -> float:
    from interp.runtime.distributed import connect, require_ray

    connect(ray)
    return 1.0 if require_ray().cluster_resources().get("GPU", 0) >= 1 else 0.0


def _report_table(shard: dict[str, Any]) -> pd.DataFrame:
    """The head report of one model as a table with a `source` column (runs on a worker)."""
    model = interp.load_model(shard["source"]).eval()
    report = head_report(model, **shard["options"])
    table = report.extras.full_table(report)
    table.insert(0, "source", shard["label"])
    return table


def head_sweep(
    sources: Sequence[str | Path],
    labels: Sequence[str] | None = None,
    n_samples: int = 16,
    seed: int = 0,
    causal: bool = True,
    ray: str | None = None,
    store: str | Path | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """`head_report` of every source (a model name or directory), concatenated: one row per
    (source, layer, head). labels name the sources in the `source` column (default: as given).
    ray, store, progress ("Shards", sources done, sources): see interp.runtime.distributed.map_shards."""
    labels = [str(s) for s in sources] if labels is None else list(labels)
    if len(labels) != len(sources):
        raise ValueError(f"{len(sources)} sources but {len(labels)} labels.")
    options = {"n_samples": n_samples, "seed": seed, "causal": causal}
    shards = [
        {"source": str(source), "label": label, "options": options}
        for source, label in zip(sources, labels, strict=True)
    ]
    code = source_key(circuits)  # (map_shards adds interp's)
    paths = [Path(s["source"]) for s in shards]  # a local model by where it is, a name as given
    versions = [(str(p.resolve()) if p.exists() else str(p), source_version(p)) for p in paths]
    job = ("head_sweep", code, versions, labels, options)
    tables = map_shards(_report_table, shards, ray=ray, store=store, job=job, progress=progress)
    return pd.concat(tables, ignore_index=True)


def training_checkpoints(run: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every checkpoint a training run saved (`interp train --checkpoint-every`)."""
    directory = Path(run) / CHECKPOINTS
    paths = sorted(directory.glob("step_*")) if directory.is_dir() else []
    found = [(_step(path), path) for path in paths if (path / "trainer_state.json").is_file()]
    if not found:
        raise ValueError(
            f"{run} has no checkpoints under {CHECKPOINTS}/; train with --checkpoint-every N "
            "(or pass the checkpoint directories themselves)."
        )
    return sorted(found)


def _step(checkpoint: Path) -> int:
    """The training step of a checkpoint directory (its trainer_state.json's)."""
    return int(json.loads((checkpoint / "trainer_state.json").read_text())["step"])


def checkpoint_head_sweep(
    run_or_checkpoints: str | Path | Sequence[str | Path],
    n_samples: int = 16,
    seed: int = 0,
    causal: bool = False,
    ray: str | None = None,
    store: str | Path | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Head scores and types at each saved step of a training run: one row per (step, layer, head).

    run_or_checkpoints: a training run's directory (its checkpoints/step_* are used) or a list of
    checkpoint directories (steps from their trainer_state.json). causal=False skips the ablation
    checks, which early checkpoints rarely pass; the scores are the same either way, but no head is
    typed induction without them (read the `induction` score against its threshold instead).
    """
    if isinstance(run_or_checkpoints, str | Path):
        checkpoints = training_checkpoints(run_or_checkpoints)
    else:
        checkpoints = sorted((_step(Path(path)), Path(path)) for path in run_or_checkpoints)
    paths = [path for _, path in checkpoints]
    frame = head_sweep(
        paths, [str(step) for step, _ in checkpoints], n_samples, seed, causal, ray, store, progress
    )
    frame.insert(0, "step", frame.pop("source").astype(int))
    return frame.sort_values(["step", "layer", "head"], ignore_index=True)


def plot_head_sweep(
    frame: pd.DataFrame, score: str = "induction", out: str | Path | None = None, top: int = 8
):
    """One line per head: `score` against the training step, for the `top` heads by final score.

    Returns the matplotlib Figure; with `out` (.png, .svg, .pdf) also writes it there.
    """
    plt = pyplot()
    if score not in frame:
        raise ValueError(f"no column {score!r}; choose one of {', '.join(map(str, frame.columns))}.")
    last = frame[frame["step"] == frame["step"].max()].nlargest(top, score)
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for layer, head in zip(last["layer"], last["head"], strict=True):
        rows = frame[(frame["layer"] == layer) & (frame["head"] == head)]
        axes.plot(rows["step"], rows[score], marker="o", markersize=3, label=f"L{layer}H{head}")
    axes.set_xlabel("training step")
    axes.set_ylabel(f"{score.replace('_', '-')} score")
    axes.legend(fontsize=7, ncols=2)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return save_figure(figure, out)
