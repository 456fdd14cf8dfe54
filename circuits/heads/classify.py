"""Head types and the report holding them: a head has every type whose score clears its threshold
(SCORE_NAMES order); induction also needs the causal confirmation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor

from circuits.heads.causal import CAUSAL_TYPES, EFFECTS, CausalEffects, Effect, mean_se
from circuits.heads.scores import PATTERN_SCORES, SCORE_NAMES, HeadScores
from interp.types import Head


def head_types(row: dict[str, Any], thresholds: dict[str, float]) -> list[str]:
    """The types of one head (a row of `head_table`, its `<type>_confirmed` included)."""
    types = [name for name in SCORE_NAMES if row[name] >= thresholds[name]]
    if "induction" in types and not row["induction_confirmed"]:
        types.remove("induction")
    return types


def head_table(
    scores: HeadScores, weights: dict[str, Tensor], effects: dict[str, CausalEffects]
) -> pd.DataFrame:
    """Stage 5 of `head_report`: one row per (layer, head), the columns of `HeadReport`."""
    columns = scores.columns | weights
    n_layers, n_heads = columns[SCORE_NAMES[0]].shape
    nan = (math.nan, math.nan)
    untested = CausalEffects(alone={}, with_others_ablated={}, all_candidates=nan, min_effect=math.nan)
    rows = []
    for layer, head in np.ndindex(n_layers, n_heads):
        at = (layer, head)
        row: dict[str, Any] = {"layer": layer, "head": head}
        row.update({name: float(values[layer, head]) for name, values in columns.items()})
        row["skip_gram_pair"] = scores.skip_gram_pairs[layer * n_heads + head]
        for kind in CAUSAL_TYPES:
            found = effects.get(kind, untested)
            row[f"{kind}_effect"], row[f"{kind}_effect_se"] = found.alone.get(at, nan)
            row[f"{kind}_effect_with_others"], row[f"{kind}_effect_with_others_se"] = (
                found.with_others_ablated.get(at, nan)
            )
            row[f"{kind}_held_out_score"] = found.held_out_scores.get(at, math.nan)
            row[f"{kind}_confirmed"] = found.confirmed(at)
            row[f"{kind}_verdict"] = found.verdict(at)
            row[f"{kind}_holds_in"] = found.holds_in(at)
            row[f"{kind}_stopped_early"] = found.stopped_early.get(at, [])
            row.update(_beyond_random_cells(found, at, kind))
            for stratum, by_head in found.by_stratum.items():
                alone, with_others = by_head.get(at, (nan, nan))
                row[f"{kind}_effect[{stratum}]"], row[f"{kind}_effect_se[{stratum}]"] = alone
                row[f"{kind}_effect_with_others[{stratum}]"] = with_others[0]
                row[f"{kind}_effect_with_others_se[{stratum}]"] = with_others[1]
                for effect, suffix in zip(EFFECTS, SUFFIXES, strict=True):
                    judged = found.judged.get(at, {}).get(effect)
                    strata = {s.name: s.beyond for s in judged.strata} if judged else {}
                    row[f"{kind}_beyond_random{suffix}[{stratum}]"] = strata.get(stratum, math.nan)
        row["types"] = head_types(row, scores.thresholds)
        rows.append(row)
    return pd.DataFrame(rows)


SUFFIXES = ("", "_with_others")  # the table's column suffix of each of EFFECTS


def _beyond_random_cells(found: CausalEffects, head: Head, kind: str) -> dict[str, Any]:
    """The head's `kind` effects against random heads of its layer, per effect (EFFECTS: SUFFIXES): the
    random heads' mean, the effect beyond it with its SE and 95% CI (NaN: not measured); the random heads;
    the confirming effect ("" if none)."""
    judged = found.judged.get(head, {})
    cells: dict[str, Any] = {}
    for effect, suffix in zip(EFFECTS, SUFFIXES, strict=True):
        verdict = judged.get(effect)
        figures = verdict.heldout if verdict else None
        cells[f"{kind}_random_effect{suffix}"] = figures.random_drop if figures else math.nan
        cells[f"{kind}_beyond_random{suffix}"] = figures.beyond if figures else math.nan
        cells[f"{kind}_beyond_random{suffix}_se"] = mean_se(verdict.per_prompt)[1] if verdict else math.nan
        low, high = figures.beyond_ci if figures else (math.nan, math.nan)
        cells[f"{kind}_beyond_random{suffix}_ci_low"] = low
        cells[f"{kind}_beyond_random{suffix}_ci_high"] = high
    alone = judged.get("alone")
    cells[f"{kind}_random_heads"] = [label for draw in alone.random_sets for label in draw] if alone else []
    cells[f"{kind}_confirmed_by"] = found.confirmed_by(head) if found.confirmed(head) else ""
    return cells


@dataclass(kw_only=True)
class HeadReport:
    """Scores, types and causal effects of every head. `table`, one row per (layer, head): layer, head;
    each score of SCORE_NAMES (`_se`, `confidence_`, `_text`), induction_len<L>, fixed_offset_distance,
    skip_gram_pair ("t -> v"), copying, k_composition; per causal type (nats for induction, attention
    for previous_token; NaN: not tested): <type>_effect(_se) alone, <type>_effect_with_others(_se),
    _held_out_score, _verdict, _holds_in (strata), _stopped_early, _confirmed, _confirmed_by,
    _random_heads, _random_effect, _beyond_random (with _se, _ci_low, _ci_high; each of the last three
    also _with_others), and per repeat length <type>_effect[L=13], <type>_beyond_random[L=13]; types."""

    model_name: str
    table: pd.DataFrame
    settings: dict[str, Any]
    thresholds: dict[str, float]
    n_layers: int
    n_heads: int
    group_effects: dict[str, Effect] = field(default_factory=dict)  # type -> ablating all candidates
    str_tokens: dict[str, list[str]] = field(default_factory=dict)  # probe name -> first sequence's tokens
    patterns: dict[str, Tensor] = field(default_factory=dict)  # probe name -> [layer, head, q, k]
    provenance: str = ""  # interp.provenance(model): source, quantisation, parameters, dtype

    def score_grid(self, column: str) -> np.ndarray:
        """[layer, head] values of one column."""
        grid = np.full((self.n_layers, self.n_heads), np.nan)
        grid[self.table["layer"], self.table["head"]] = self.table[column].astype(float)
        return grid

    def heads_of_type(self, head_type: str) -> list[Head]:
        """(layer, head) of the heads classified as `head_type`, best score first."""
        rows = self.table[self.table["types"].apply(lambda types: head_type in types)]
        rows = rows.sort_values(head_type, ascending=False)
        return list(zip(rows["layer"].tolist(), rows["head"].tolist(), strict=True))

    def json_data(self) -> dict[str, Any]:
        """What `--format json` holds (`circuits.sections.result_json`, NaN as null): the settings,
        thresholds and group effects, and every head's scores, types and causal effects."""
        lengths = self.settings["induction_lengths"]
        heads = [
            {
                "layer": row["layer"],
                "head": row["head"],
                "scores": {name: row[name] for name in (*SCORE_NAMES, "copying", "k_composition")},
                "score_se": {name: row[f"{name}_se"] for name in SCORE_NAMES},
                "text_scores": {name: row.get(f"{name}_text") for name in PATTERN_SCORES},
                "induction_by_length": {str(n): row[f"induction_len{n}"] for n in lengths},
                "fixed_offset_distance": None if math.isnan(distance) else int(distance),
                "skip_gram_pair": row["skip_gram_pair"] or None,
                "types": list(row["types"]),
                "confidence": {name: row[f"confidence_{name}"] for name in SCORE_NAMES},
                "causal": {kind: _causal_data(row, kind) for kind in CAUSAL_TYPES},
            }
            for row in self.table.to_dict("records")
            for distance in [row["fixed_offset_distance"]]
        ]
        groups = {kind: {"effect": m, "se": se} for kind, (m, se) in self.group_effects.items()}
        return {
            "model": self.model_name,
            "settings": self.settings,
            "thresholds": self.thresholds,
            "group_effects": groups,
            "heads": heads,
        }


def _causal_data(row: dict[str, Any], kind: str) -> dict[str, Any]:
    """A head's `kind` causal check as JSON (older files lack some columns)."""

    def effects(key: str = "") -> dict[str, float]:
        return {
            "effect": row[f"{kind}_effect{key}"],
            "se": row[f"{kind}_effect_se{key}"],
            "effect_with_others_ablated": row[f"{kind}_effect_with_others{key}"],
            "se_with_others_ablated": row[f"{kind}_effect_with_others_se{key}"],
        }

    prefix = f"{kind}_effect["
    strata = [column[len(prefix) : -1] for column in row if column.startswith(prefix)]  # "L=13", ...
    return {
        **effects(),
        "confirmed": bool(row[f"{kind}_confirmed"]),
        "verdict": row.get(f"{kind}_verdict") or None,
        "holds_in": list(row.get(f"{kind}_holds_in", [])),
        "stopped_early": list(row.get(f"{kind}_stopped_early", [])),
        "random_heads": list(row.get(f"{kind}_random_heads", [])),
        "confirmed_by": row.get(f"{kind}_confirmed_by") or None,
        "beyond_random": {
            effect: _beyond_random_data(row, f"{kind}_beyond_random{suffix}", f"{kind}_random_effect{suffix}")
            for effect, suffix in zip(EFFECTS, SUFFIXES, strict=True)
        },
        "by_stratum": {
            stratum: {
                **effects(f"[{stratum}]"),
                "beyond_random": row.get(f"{kind}_beyond_random[{stratum}]"),
                "beyond_random_with_others_ablated": row.get(f"{kind}_beyond_random_with_others[{stratum}]"),
            }
            for stratum in strata
        },
    }


def _beyond_random_data(row: dict[str, Any], column: str, random: str) -> dict[str, Any] | None:
    """One effect against random heads of the head's layer (None: not measured, or a file saved
    before the random baseline)."""
    if math.isnan(row.get(column, math.nan)):
        return None
    return {
        "random_effect": row[random],
        "beyond": row[column],
        "se": row[f"{column}_se"],
        "ci": [row[f"{column}_ci_low"], row[f"{column}_ci_high"]],
    }
