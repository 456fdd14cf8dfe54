"""Retrieval from context: the heads that answer "The pet of John is" from the facts stated before it.

    finding = find_retrieval_circuit(model)       # discovery, held-out validation   find.py
    finding = find_retrieval_circuit(model, RetrievalSettings(n_prompts=48, seed=1))   # other settings
    write_finding_report(finding, "table", None, console)        # circuits.finding's one report

The prompts come from `interp.tasks.retrieval`; the result is a `circuits.finding.Finding` whose
extras, `RetrievalFigures` (`results.py`), say what each figure of its own means.
"""

from circuits.retrieval.find import RetrievalSettings, accuracy, find_retrieval_circuit
from circuits.retrieval.results import RetrievalAccuracy, RetrievalFigures, RetrievalHead

__all__ = [
    "RetrievalAccuracy",
    "RetrievalFigures",
    "RetrievalHead",
    "RetrievalSettings",
    "accuracy",
    "find_retrieval_circuit",
]
