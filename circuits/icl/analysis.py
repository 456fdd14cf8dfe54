"""`interp icl` as one library call: the ICL report of a model, the windows it leaves open taken from
the model's defaults, and for a training run's directory the score across its checkpoints."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import interp
from circuits.icl.pipeline import ICLSettings, icl_report
from circuits.icl.report import loss_curve_figure
from circuits.icl.results import ICLResult
from circuits.icl.sequences import Windows, default_windows
from circuits.icl.training import icl_over_training, plot_icl_over_training
from circuits.stages import StageResults
from interp.training import CHECKPOINTS
from interp.types import Head, Progress, as_stage

CHECKPOINTS_STAGE = "ICL and induction scores at each checkpoint"  # the work after icl_report's stages


def training_run(source: str | Path) -> Path | None:
    """The training run's directory a model source names (one with checkpoints), else None."""
    return Path(source) if (Path(source) / CHECKPOINTS).is_dir() else None


def icl_analysis(
    model: interp.HookedTransformer,
    settings: ICLSettings,
    windows: Sequence[int | None] = (None, None, None),
    source: str | Path = "",
    induction_heads: Sequence[Head] | None = None,
    plot: str | None = None,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> ICLResult:
    """`icl_report(model, settings)` with the settings' windows, else the (early, late, width)
    `windows` given and `default_windows(model)` for those None; for a training run's directory
    `source` (`training_run`), `result.training` across its checkpoints (stage CHECKPOINTS_STAGE).
    plot: also draw the run's curve, else the loss per token, to this file."""
    if settings.windows is None:
        defaults = default_windows(model)
        early, late, width = windows
        settings = dataclasses.replace(
            settings,
            windows=Windows(
                defaults.early if early is None else early,
                defaults.late if late is None else late,
                defaults.width if width is None else width,
            ),
        )
    result = icl_report(model, settings, induction_heads=induction_heads, progress=progress, stages=stages)
    run = training_run(source)
    if run is not None:
        step = as_stage(progress, CHECKPOINTS_STAGE)
        result.training = icl_over_training(
            run, settings.n_documents, settings.windows, settings.seed, progress=step
        )
    if plot is not None and run is not None:
        plot_icl_over_training(result.training, plot)
    elif plot is not None:
        loss_curve_figure(result, plot)
    return result
