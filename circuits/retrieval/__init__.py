"""Retrieval from context: the heads that answer "The pet of John is" from the facts stated before it.

    result = find_retrieval_circuit(model)        # discovery, held-out validation   find.py
    result = find_retrieval_circuit(model, RetrievalSettings(n_prompts=48, seed=1))   # other settings
    write_retrieval_report(result, "table", None, console)                     # report.py

The prompts come from `interp.tasks.retrieval`; `results.py` says what each figure means.
"""

from circuits.retrieval.find import RetrievalSettings, accuracy, find_retrieval_circuit
from circuits.retrieval.results import RetrievalAccuracy, RetrievalHead, RetrievalResult

__all__ = [
    "RetrievalAccuracy",
    "RetrievalHead",
    "RetrievalResult",
    "RetrievalSettings",
    "accuracy",
    "find_retrieval_circuit",
]
