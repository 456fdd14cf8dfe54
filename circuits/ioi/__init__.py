"""Indirect object identification (Wang et al. 2022): the IOI circuit of a model, found by path
patching backwards from the logits, evaluated and validated on held-out prompts.

    from circuits.ioi import find_ioi_circuit
    finding = find_ioi_circuit(model, n_prompts=64, seed=0)  # a circuits.finding.Finding
    finding.classes, finding.extras.circuit                    # held-out verdicts; IOIFigures
"""

from circuits.ioi.discover import find_ioi_circuit, measure_baseline
from circuits.ioi.evaluate import evaluate_circuit, validate_circuit
from circuits.ioi.patching import EAPRanking, MeanAblation, SenderEffects, path_patching_effects
from circuits.ioi.results import (
    CLASSES,
    Baseline,
    Evaluation,
    ExamplePatterns,
    HeadEvidence,
    HeldOut,
    IOIFigures,
    Settings,
    Validation,
)
from interp.tasks.ioi import ioi_dataset_for, make_ioi_dataset, single_token_names
from interp.tasks.ioi_templates import BABA_TEMPLATES, NAMES, OBJECTS, PLACES

__all__ = [
    "BABA_TEMPLATES", "CLASSES", "NAMES", "OBJECTS", "PLACES", "Baseline", "EAPRanking", "Evaluation",
    "ExamplePatterns", "HeadEvidence", "HeldOut", "IOIFigures", "MeanAblation", "SenderEffects", "Settings",
    "Validation", "evaluate_circuit", "find_ioi_circuit", "ioi_dataset_for", "make_ioi_dataset",
    "measure_baseline", "path_patching_effects", "single_token_names", "validate_circuit",
]  # fmt: skip
