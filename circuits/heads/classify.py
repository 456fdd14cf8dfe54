"""Head types: a head has every type whose score clears its threshold (SCORE_NAMES order); induction
also needs the causal confirmation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor

from circuits.heads.causal import CAUSAL_TYPES, CausalEffects
from circuits.heads.scores import SCORE_NAMES, HeadScores


def head_types(row: dict[str, Any], thresholds: dict[str, float]) -> list[str]:
    """The types of one head (a row of `head_table`, its `<type>_confirmed` included)."""
    types = [name for name in SCORE_NAMES if row[name] >= thresholds[name]]
    if "induction" in types and not row["induction_confirmed"]:
        types.remove("induction")
    return types


def head_table(
    scores: HeadScores, weights: dict[str, Tensor], effects: dict[str, CausalEffects]
) -> pd.DataFrame:
    """Stage 5 of `head_report`: one row per (layer, head), the columns of `HeadFigures.table` (the
    figures of the effects' classes are the finding's classes, `results.head_classes`)."""
    columns = scores.columns | weights
    n_layers, n_heads = columns[SCORE_NAMES[0]].shape
    nan = (math.nan, math.nan)
    rows = []
    for layer, head in np.ndindex(n_layers, n_heads):
        at = (layer, head)
        row: dict[str, Any] = {"layer": layer, "head": head}
        row.update({name: float(values[layer, head]) for name, values in columns.items()})
        row["skip_gram_pair"] = scores.skip_gram_pairs[layer * n_heads + head]
        for kind in CAUSAL_TYPES:
            found = effects.get(kind, CausalEffects())
            row[f"{kind}_effect"], row[f"{kind}_effect_se"] = found.alone.get(at, nan)
            row[f"{kind}_effect_with_others"], row[f"{kind}_effect_with_others_se"] = (
                found.with_others_ablated.get(at, nan)
            )
            row[f"{kind}_held_out_score"] = found.held_out_scores.get(at, math.nan)
            row[f"{kind}_confirmed"] = found.confirmed(at)
            row[f"{kind}_verdict"] = found.verdict(at)
            row[f"{kind}_holds_in"] = found.holds_in(at)
            row[f"{kind}_stopped_early"] = found.stopped_early.get(at, [])
            row[f"{kind}_confirmed_by"] = found.confirmed_by(at) if found.confirmed(at) else ""
            for stratum, by_head in found.by_stratum.items():
                alone, with_others = by_head.get(at, (nan, nan))
                row[f"{kind}_effect[{stratum}]"], row[f"{kind}_effect_se[{stratum}]"] = alone
                row[f"{kind}_effect_with_others[{stratum}]"] = with_others[0]
                row[f"{kind}_effect_with_others_se[{stratum}]"] = with_others[1]
        row["types"] = head_types(row, scores.thresholds)
        rows.append(row)
    return pd.DataFrame(rows)
