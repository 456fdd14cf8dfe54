"""Head types: score every attention head on probe inputs, confirm candidates causally, classify.

    report = head_report(model)   # the whole pipeline (pipeline.py), or its stages one at a time:

    probes = make_probes(model)                                    # 1. probe sequences     probes.py
    scores = score_heads(model, probes)                            # 2. attention scores    scores.py
    weights = weight_scores(model, scores.candidates("previous_token", 12))  # 3. weights  weights.py
    effects = causal_checks(model, probes, scores)                 # 4. mean ablation       causal.py
    table = head_table(scores, weights, effects)                   # 5. head types          classify.py
    report.classes, report.extras.table                            # the Finding            results.py

Candidates are chosen on one token family (even ids) and tested on another (odd ids).
`confirmed_induction_heads(model)` (cache.py) keeps the confirmed induction heads per model for the
ICL, function-vector and retrieval analyses; `head_report` returns a `circuits.finding.Finding` whose
extras, `HeadFigures` (results.py), hold every head's scores and types and read themselves into its report.
"""

from circuits.heads.cache import confirmed_induction_heads, remember_induction_heads
from circuits.heads.causal import CAUSAL_TYPES, CausalEffects, causal_checks
from circuits.heads.classify import head_table
from circuits.heads.pipeline import HeadSettings, confirmed_induction, head_report
from circuits.heads.probes import NATURAL_TEXT, Probe, Probes, make_probes
from circuits.heads.results import HeadFigures
from circuits.heads.scores import PATTERN_SCORES, SCORE_NAMES, HeadScores, score_heads
from circuits.heads.weights import weight_scores

__all__ = [
    "CAUSAL_TYPES",
    "NATURAL_TEXT",
    "PATTERN_SCORES",
    "SCORE_NAMES",
    "CausalEffects",
    "HeadFigures",
    "HeadScores",
    "HeadSettings",
    "Probe",
    "Probes",
    "causal_checks",
    "head_table",
    "confirmed_induction",
    "confirmed_induction_heads",
    "head_report",
    "make_probes",
    "remember_induction_heads",
    "score_heads",
    "weight_scores",
]
