"""The phase change: the ICL score (on the same sequences) and `interp heads`'s induction scores at every
checkpoint of a training run (`icl_over_training`), drawn against the step (`plot_icl_over_training`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import interp
from circuits.icl.score import icl_score, token_losses
from circuits.icl.sequences import Windows, default_sequences
from circuits.output import pyplot, save_figure
from circuits.sweeps import checkpoint_head_sweep, training_checkpoints
from interp.types import Progress


@dataclass(kw_only=True)
class TrainingCurve:
    """The ICL score and every head's induction score at each saved step of a training run."""

    steps: list[int]
    scores: list[float]
    ci: list[tuple[float, float]]
    induction: pd.DataFrame  # step, layer, head, induction

    def json_fields(self) -> dict[str, Any]:
        """Its figures as the ICL report's JSON holds them (induction: [step, layer, head, induction])."""
        return {"steps": self.steps, "icl_scores": self.scores, "ci": self.ci, "induction": self.induction}


@torch.inference_mode()
def icl_over_training(
    run: str | Path,
    n_documents: int = 16,
    windows: Windows | None = None,
    seed: int = 0,
    n_samples: int = 16,
    progress: Progress | None = None,
) -> TrainingCurve:
    """The ICL score (95% CI over `n_documents` sequences) and every head's induction score (`n_samples`
    probe sequences per repeat length) at each checkpoint of the training run `run`."""
    steps, scores, cis = [], [], []
    for step, path in training_checkpoints(run):
        model = interp.load_model(path)
        sequences = default_sequences(model, n_documents, seed, windows)
        final = model(sequences.tokens, stop_at_layer=model.cfg.n_layers)
        found = icl_score(token_losses(model, final, sequences.tokens), sequences.windows, seed)
        steps.append(step)
        scores.append(found.score)
        cis.append(found.ci)
    frame = checkpoint_head_sweep(run, n_samples=n_samples, seed=seed, progress=progress)
    return TrainingCurve(
        steps=steps, scores=scores, ci=cis, induction=frame[["step", "layer", "head", "induction"]].copy()
    )


def plot_icl_over_training(curve: TrainingCurve, out: str | Path | None = None, top: int = 4):
    """The ICL score (left axis, with its CI) and the induction score of the `top` heads by final score
    (right axis) against the training step: a matplotlib Figure, also written to `out` if given."""
    plt = pyplot()
    figure, score_axes = plt.subplots(figsize=(6.5, 3.6))
    low, high = zip(*curve.ci, strict=True)
    score_axes.fill_between(curve.steps, low, high, color="black", alpha=0.12, linewidth=0)
    score_axes.plot(curve.steps, curve.scores, color="black", marker="o", markersize=3, label="ICL score")
    score_axes.set_xlabel("training step")
    score_axes.set_ylabel("ICL score (nats; late - early loss)")
    induction_axes = score_axes.twinx()
    frame = curve.induction
    last = frame[frame["step"] == frame["step"].max()].nlargest(top, "induction")
    for layer, head in zip(last["layer"], last["head"], strict=True):
        rows = frame[(frame["layer"] == layer) & (frame["head"] == head)].sort_values("step")
        induction_axes.plot(
            rows["step"], rows["induction"], linestyle="--", marker=".", label=f"L{layer}H{head} induction"
        )
    induction_axes.set_ylabel("induction score (attention)")
    induction_axes.set_ylim(0, 1)
    lines = score_axes.get_legend_handles_labels()
    more = induction_axes.get_legend_handles_labels()
    score_axes.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="center right")
    score_axes.grid(alpha=0.3)
    score_axes.set_title("In-context learning and induction heads across training", fontsize=10)
    figure.tight_layout()
    return save_figure(figure, out)
