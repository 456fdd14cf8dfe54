"""Head types from the scores and the causal evidence, and the report that holds them.

A head has every type whose score clears its threshold (SCORE_NAMES, in that order), except
induction, which also needs the causal confirmation (`causal`). previous_token, fixed_offset and
skip_gram are given on their patterns (a previous-token head need not feed an induction head), the
first with its causal effect as evidence.
"""

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
    """Stage 5 of `head_report`: one row per (layer, head) with every score, weight score and causal
    effect (NaN where not tested) and its types; the columns are described in `HeadReport`."""
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
    """The head's `kind` effects against random heads of its layer (`CausalEffects.judged`): per effect
    (EFFECTS, column suffixes SUFFIXES) the random heads' mean effect, the effect beyond it (paired per
    sequence), its standard error and 95% bootstrap CI over the sequences (NaN where not measured);
    the random heads; the effect that confirms the head ("" if none)."""
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
    """Scores, types and causal effects of every head; `table` has one row per (layer, head).

    Columns: layer, head; each score (SCORE_NAMES; `_se` standard errors; `_text` on natural text),
    induction_len<L> per repeat length, fixed_offset_distance (the offset d of fixed_offset),
    skip_gram_pair ("t -> v", the token pair behind skip_gram), copying, k_composition;
    confidence_<type> (bootstrap probability the score clears the threshold); for each causal type
    (induction, previous_token): <type>_effect(_se) ablating the head alone,
    <type>_effect_with_others(_se) ablating it with the other candidates already ablated (NaN when
    not tested), <type>_held_out_score (the type's attention score on the held-out probe, NaN when not
    a candidate), <type>_verdict (`CausalEffects.verdict`), <type>_holds_in (the
    repeat-length strata where an effect beyond random is positive), <type>_stopped_early (its effects,
    "alone" or "with_others_ablated", stopped as futile at the first look: over half the sequences),
    <type>_confirmed (the verdict is "confirmed"); against the random heads of its layer
    (<type>_random_heads, labels): <type>_random_effect(_with_others) (their mean effect, ablated alone;
    on top of all the candidates), <type>_beyond_random(_with_others) (the head's effect minus theirs,
    paired per sequence) with _se and its 95% bootstrap CI _ci_low, _ci_high, <type>_confirmed_by (the
    effect that confirms the head, "alone" or "with_others_ablated"; "" if none); and the same effects
    per repeat length, <type>_effect[L=13], <type>_beyond_random[L=13] and so on; types (list of type
    names). Units: nats (induction), a fraction of attention (previous_token).
    """

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
        """What `--format json` holds (`circuits.sections.result_json`): the settings, thresholds and
        group effects, and every head's scores, types and causal effects (NaN: null)."""
        lengths = self.settings["induction_lengths"]
        heads = []
        for row in self.table.to_dict("records"):
            heads.append(
                {
                    "layer": int(row["layer"]),
                    "head": int(row["head"]),
                    "scores": {
                        name: _float(row[name]) for name in (*SCORE_NAMES, "copying", "k_composition")
                    },
                    "score_se": {name: _float(row[f"{name}_se"]) for name in SCORE_NAMES},
                    "text_scores": {name: _float(row.get(f"{name}_text")) for name in PATTERN_SCORES},
                    "induction_by_length": {str(n): _float(row[f"induction_len{n}"]) for n in lengths},
                    "fixed_offset_distance": _int(row["fixed_offset_distance"]),
                    "skip_gram_pair": row["skip_gram_pair"] or None,
                    "types": list(row["types"]),
                    "confidence": {name: _float(row[f"confidence_{name}"]) for name in SCORE_NAMES},
                    "causal": {kind: _causal_data(row, kind) for kind in CAUSAL_TYPES},
                }
            )
        groups = {
            kind: {"effect": _float(m), "se": _float(se)} for kind, (m, se) in self.group_effects.items()
        }
        return {
            "model": self.model_name,
            "settings": self.settings,
            "thresholds": self.thresholds,
            "group_effects": groups,
            "heads": heads,
        }


def _causal_data(row: dict[str, Any], kind: str) -> dict[str, Any]:
    """A head's `kind` causal check as JSON (NaN: None)."""

    def effects(key: str = "") -> dict[str, float | None]:
        return {
            "effect": _float(row[f"{kind}_effect{key}"]),
            "se": _float(row[f"{kind}_effect_se{key}"]),
            "effect_with_others_ablated": _float(row[f"{kind}_effect_with_others{key}"]),
            "se_with_others_ablated": _float(row[f"{kind}_effect_with_others_se{key}"]),
        }

    return {
        **effects(),
        "confirmed": bool(row[f"{kind}_confirmed"]),
        "verdict": row.get(f"{kind}_verdict") or None,
        "holds_in": list(row.get(f"{kind}_holds_in", [])),
        "stopped_early": list(row.get(f"{kind}_stopped_early", [])),
        "random_heads": list(row.get(f"{kind}_random_heads", [])),
        "confirmed_by": row.get(f"{kind}_confirmed_by") or None,
        "beyond_random": {
            effect: _beyond_random_data(row, kind, suffix)
            for effect, suffix in zip(EFFECTS, SUFFIXES, strict=True)
        },
        "by_stratum": {
            stratum: {
                **effects(f"[{stratum}]"),
                "beyond_random": _float(row.get(f"{kind}_beyond_random[{stratum}]")),
                "beyond_random_with_others_ablated": _float(
                    row.get(f"{kind}_beyond_random_with_others[{stratum}]")
                ),
            }
            for stratum in _strata(row, kind)
        },
    }


def _beyond_random_data(row: dict[str, Any], kind: str, suffix: str) -> dict[str, Any] | None:
    """One effect against random heads of the head's layer, as JSON numbers (None: not measured, or a
    file saved before the random baseline)."""
    beyond = _float(row.get(f"{kind}_beyond_random{suffix}"))
    if beyond is None:
        return None
    return {
        "random_effect": _float(row[f"{kind}_random_effect{suffix}"]),
        "beyond": beyond,
        "se": _float(row[f"{kind}_beyond_random{suffix}_se"]),
        "ci": [
            _float(row[f"{kind}_beyond_random{suffix}_ci_low"]),
            _float(row[f"{kind}_beyond_random{suffix}_ci_high"]),
        ],
    }


def _strata(row: dict[str, Any], kind: str) -> list[str]:
    """The strata ("L=13", ...) a row has effects of `kind` for."""
    prefix = f"{kind}_effect["
    return [column[len(prefix) : -1] for column in row if column.startswith(prefix)]


def _float(value: Any) -> float | None:
    """JSON-safe float: NaN and missing become None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    value = _float(value)
    return None if value is None else int(value)
