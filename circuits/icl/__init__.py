"""In-context learning: the ICL score (Olsson et al. 2022) and the heads that carry it.

    result = icl_report(model)      # the score, every head by attribution, exact checks (pipeline.py)
    result = icl_report(model, ICLSettings(n_documents=120, top=5))           # other settings

    sequences = default_sequences(model, 16)                       # documents, windows   sequences.py
    attributions, losses = head_attributions(model, sequences.tokens, sequences.windows)  # heads.py
    curve = icl_over_training("runs/induction")                    # the phase change     training.py
    fv = function_vector_report(model)   # function-vector heads beside induction heads  fv_pipeline.py

`circuits.icl.report` renders an ICLResult and a FunctionVectorResult (terminal, JSON, Markdown,
HTML). Each module's docstring defines what it measures, with its units.
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
from circuits.icl.heads import (
    ICL_ABLATIONS,
    ablated_icl_scores,
    head_attributions,
)
from circuits.icl.pipeline import DocumentSplit, ICLSettings, document_losses, icl_report
from circuits.icl.results import (
    ClassEffect,
    Comparison,
    FunctionVectorResult,
    HeadEffect,
    ICLResult,
    TaskVector,
    TrainingCurve,
)
from circuits.icl.score import ICLScore, icl_score, icl_scores, token_losses
from circuits.icl.sequences import ICLSequences, Windows, default_sequences, default_windows
from circuits.icl.training import icl_over_training, plot_icl_over_training

__all__ = [
    "ICL_ABLATIONS",
    "ClassEffect",
    "DocumentSplit",
    "Comparison",
    "FunctionVectorResult",
    "FunctionVectorSettings",
    "HeadEffect",
    "ICLResult",
    "ICLScore",
    "ICLSettings",
    "ICLSequences",
    "TaskPrompts",
    "TaskVector",
    "TrainingCurve",
    "Windows",
    "ablated_icl_scores",
    "attributed_indirect_effects",
    "default_sequences",
    "default_windows",
    "document_losses",
    "few_shot_accuracy",
    "function_vector",
    "function_vector_report",
    "head_indirect_effects",
    "head_attributions",
    "icl_over_training",
    "icl_report",
    "icl_score",
    "icl_scores",
    "mean_head_outputs",
    "plot_icl_over_training",
    "task_prompts",
    "token_losses",
    "zero_shot_accuracy",
]
