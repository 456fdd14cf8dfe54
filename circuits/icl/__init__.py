"""In-context learning: the ICL score (Olsson et al. 2022) and the heads that carry it.

    result = icl_report(model)      # the score, every head by attribution, exact checks (pipeline.py)

    sequences = default_sequences(model, 16)                       # documents, windows   sequences.py
    attributions, losses = head_attributions(model, sequences.tokens, sequences.windows)  # heads.py
    curve = icl_over_training("runs/induction")                    # the phase change     training.py

`circuits.icl.report` renders an ICLResult (terminal, JSON, Markdown, HTML). Each module's
docstring defines what it measures, with its units.
"""

from circuits.icl.heads import (
    ICL_ABLATIONS,
    ablated_icl_scores,
    confirmed_induction_heads,
    head_attributions,
    random_same_layer_sets,
)
from circuits.icl.pipeline import icl_report
from circuits.icl.results import ClassEffect, HeadEffect, ICLResult, TrainingCurve
from circuits.icl.score import ICLScore, icl_scores, summarise, token_losses
from circuits.icl.sequences import ICLSequences, Windows, default_sequences, default_windows
from circuits.icl.training import icl_over_training, plot_icl_over_training

__all__ = [
    "ICL_ABLATIONS",
    "ClassEffect",
    "HeadEffect",
    "ICLResult",
    "ICLScore",
    "ICLSequences",
    "TrainingCurve",
    "Windows",
    "ablated_icl_scores",
    "confirmed_induction_heads",
    "default_sequences",
    "default_windows",
    "head_attributions",
    "icl_over_training",
    "icl_report",
    "icl_scores",
    "plot_icl_over_training",
    "random_same_layer_sets",
    "summarise",
    "token_losses",
]
