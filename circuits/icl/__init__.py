"""In-context learning: the ICL score (Olsson et al. 2022) and the heads that carry it.

    finding = icl_report(model, ICLSettings(n_documents=120, top=5))   # every step: pipeline.py
    sequences = default_sequences(model, 16)                            # documents, windows: sequences.py
    attributions, losses = head_attributions(model, sequences.tokens, sequences.windows)  # heads.py
    curve = icl_over_training("runs/induction")                         # the phase change: training.py
    fv = function_vector_report(model)   # function-vector heads beside induction heads: fv_pipeline.py

Both return a `circuits.finding.Finding` whose extras (`ICLFigures`, `FunctionVectorFigures`: results.py)
hold their own figures and read themselves into the one report; each module's docstring gives its units.
"""

from circuits.icl.function_vectors import (
    TaskPrompts,
    attributed_indirect_effects,
    few_shot_accuracy,
    function_vector,
    head_indirect_effects,
    mean_head_outputs,
    task_prompts,
    zero_shot_accuracy,
)
from circuits.icl.fv_pipeline import FunctionVectorSettings, function_vector_report
from circuits.icl.heads import ablated_icl_scores, head_attributions
from circuits.icl.pipeline import DocumentSplit, ICLSettings, icl_analysis, icl_report, training_run
from circuits.icl.results import FunctionVectorFigures, ICLFigures, loss_curve_figure
from circuits.icl.score import ICLScore
from circuits.icl.sequences import ICLSequences, Windows, default_sequences
from circuits.icl.training import TrainingCurve, icl_over_training, plot_icl_over_training

__all__ = [
    "DocumentSplit", "FunctionVectorFigures", "FunctionVectorSettings", "ICLFigures", "ICLScore",
    "ICLSequences", "ICLSettings", "TaskPrompts", "TrainingCurve", "Windows", "ablated_icl_scores",
    "attributed_indirect_effects", "default_sequences", "few_shot_accuracy", "function_vector",
    "function_vector_report", "head_attributions", "head_indirect_effects", "icl_analysis",
    "icl_over_training", "icl_report", "loss_curve_figure", "mean_head_outputs", "plot_icl_over_training",
    "task_prompts", "training_run", "zero_shot_accuracy",
]  # fmt: skip
