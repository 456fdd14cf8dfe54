"""`head_report`'s finding ("heads", with `HeadFigures`) and its renderings: terminal, Markdown, HTML
(heat maps, attention viewers), CSV and JSON. Its classes are the candidates' judged effects
(`head_classes`); the table's columns copying them are joined back on reading (`HeadFigures.full_table`)."""

from __future__ import annotations

import dataclasses
import html
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from circuits.evidence import (
    HELD_OUT_ONLY,
    BeyondRandom,
    ClassVerdict,
    StratumDrop,
    class_verdict,
    head_labels,
    holm,
)
from circuits.finding import ClassView, Extras, Finding
from circuits.heads.causal import (
    CAUSAL_TYPES,
    EFFECTS,
    FUTILITY_SE,
    LENGTH_RULE,
    MIN_EFFECT,
    CausalEffects,
    Effect,
    mean_se,
)
from circuits.heads.probes import HELD_OUT_SEED_OFFSET
from circuits.heads.scores import PATTERN_SCORES, SCORE_NAMES
from circuits.output import safe_csv
from circuits.sections import Section, Table, layer_head_map, value_ci
from interp import viz
from interp.types import Head, head_label

FORMATS = ("table", "csv", "json", "markdown", "html")
TOKEN_AXIS = "token family"  # the axis of the finding's chose and tested: the probes' token families
WEIGHT_SCORES = ("copying", "k_composition")
SHORT = {
    "previous_token": "prev",
    "induction": "ind",
    "duplicate_token": "dup",
    "current_token": "cur",
    "first_token": "first",
    "broad": "broad",
    "fixed_offset": "offset",
    "skip_gram": "skip",
    "copying": "copy",
    "k_composition": "kcomp",
}
UNCONFIRMED_LABELS = {"length-dependent": "length-dependent", "score-not-held": "score not held out"}
WITH_OTHERS_MARK = "*"  # after ✓: confirmed only with the other candidates of its type ablated
TOP_HEADS_SHOWN = 3  # attention viewers per type in the HTML page (confirmed heads first)
CAPTIONS = {  # what each heat map's cell means
    "previous_token": "fraction of a query's attention on the previous token",
    "induction": "fraction of a query's attention on the token after an earlier copy of itself "
    "(lowest over the repeat lengths); typed only when confirmed by ablation",
    "duplicate_token": "fraction of a query's attention on earlier copies of its own token",
    "current_token": "fraction of a query's attention on itself",
    "first_token": "fraction of a query's attention on position 0",
    "broad": "normalised entropy of a query's attention (1: uniform over the prefix)",
    "fixed_offset": "fraction of a query's attention on the token d back, at the head's best offset d ≥ 2 "
    "(random tokens)",
    "skip_gram": "attention from a query token to one specific earlier token at varying distances "
    "(natural text)",
    "copying": "sum(eig) / sum(|eig|) of the full OV circuit W_E W_V W_O W_U, from the weights (logits "
    "against their mean over the vocabulary): +1, attending to a token raises that token's logit (the "
    "head copies it); −1, lowers it (the head suppresses it); 0, neither",
    "k_composition": "how much of the head's key side reads what an earlier previous-token head writes "
    "(max over those heads, from the weights); grey: no earlier previous-token head",
}
LEGEND = (
    "Units and signs. Attention scores are fractions of a query's attention (0 to 1; broad: normalised "
    "entropy, 0 to 1); copying lies in [−1, +1] (+1: copies the attended token, −1: suppresses it); "
    "k_composition in [0, 1]. Causal effects are mean ablations of the head's output on the held-out "
    "sequences, as alone / with the other candidates of its type ablated (–: not measured, the head is "
    "confirmed alone at every repeat length): Δloss = ablated − clean loss on the repeated tokens, in nats "
    "(positive: the head helps predict the repeat); Δind = clean − ablated induction score of the later "
    'induction heads, a fraction of attention (positive: the head feeds them). beyond random, "+0.40 [+0.35, '
    '+0.45] (0.05)": the confirming effect (else the effect alone) minus the mean effect of random heads of '
    "the head's layer over neither checked type's threshold (from other layers where its layer has none "
    "left; ablated alone; in the head's place, on top of "
    "the other candidates, for the effect with the others ablated), paired per held-out sequence, its 95% "
    "bootstrap CI over the sequences and the random heads, and that mean in parentheses. score: the "
    "attention score that chose "
    "the head, on the discovery token family → the same score on the held-out family (held out: that score "
    "of its induction type, else its previous-token type). ✓: confirmed by ablation, by the rule of the "
    "Settings' causal_method (else the type shows why not: length-dependent, or score not held out). "
    f"✓{WITH_OTHERS_MARK}: confirmed only with the other candidates of its type ablated (alone its effect is "
    "not beyond random: the others stand in for it). The table's order: beyond/SE, the confirming effect "
    "beyond random / its standard error over the sequences and the random heads, as its CI resamples them "
    "(files saved before 2026-11-29: over the sequences only; --format csv/json have both). †: stopped "
    "early as futile after the first half of each repeat length's "
    "sequences (the sequential stopping of the Settings): its effect beyond random paired per sequence, plus "
    f"{FUTILITY_SE:g} standard errors over those sequences alone (not beyond/SE's), was below the least "
    f"confirming effect ({MIN_EFFECT['induction']:g}); the effect is over that half; stopping never confirms "
    "a head."
)
WIDE_TERMINAL = 184  # columns from which the terminal table shows every score
FILE_WIDTH = 200  # the columns of the table format written to a file


def class_name(kind: str, head: str, effect: str) -> str:
    """ "induction L1H4", "previous_token L0H2 with others ablated"."""
    return f"{kind} {head}" + ("" if effect == "alone" else " with others ablated")


def head_classes(effects: dict[str, CausalEffects]) -> list[ClassVerdict]:
    """Each candidate's judged effects as the finding's classes (details "type", "effect"); verdict
    score-not-held where the head's held-out score is below threshold, else `CausalEffects.effect_verdict`."""
    classes = []
    for kind in CAUSAL_TYPES:
        found = effects.get(kind)
        for head, judged in ({} if found is None else found.judged).items():
            held = found.verdict(head) != "score-not-held"
            for effect in (name for name in EFFECTS if name in judged):
                verdict = found.effect_verdict(head, effect) if held else "score-not-held"
                classes.append(dataclasses.replace(
                    judged[effect], name=class_name(kind, head_label(*head), effect), verdict=verdict,
                    details={"type": kind, "effect": effect},
                ))  # fmt: skip
    return classes


SUFFIXES = dict(zip(EFFECTS, ("", "_with_others"), strict=True))  # each effect's column suffix


def class_columns(table: pd.DataFrame) -> list[str]:
    """The columns of a full head table that copy the classes' figures (`HeadFigures.full_table` joins
    them back)."""
    names = [name for kind in CAUSAL_TYPES for name in _class_cells(kind, {}, {})]
    beyond = {f"{kind}_beyond_random{suffix}[" for kind in CAUSAL_TYPES for suffix in SUFFIXES.values()}
    strata = [column for column in table.columns if column[: column.find("[") + 1] in beyond]
    return [name for name in names if name in table] + strata


def older_head_classes(table: pd.DataFrame, n_samples: int) -> list[ClassVerdict]:
    """The classes of a head table saved whole (before 2026-11-29; none before the random baseline), as
    `head_classes` names and judges them. What the table lacks is NaN (CIs of drops and strata) or empty
    (random heads' effects, per-sequence figures); the SE beyond random goes under details "beyond_se"."""
    scored = []  # (the head's score of its type, its class)
    for row in table.to_dict("records"):
        label = head_label(row["layer"], row["head"])
        for kind in (kind for kind in CAUSAL_TYPES if f"{kind}_confirmed_by" in row):
            strata = [c[len(f"{kind}_effect[") : -1] for c in row if c.startswith(f"{kind}_effect[")]
            for effect, suffix in SUFFIXES.items():
                column = f"{kind}_beyond_random{suffix}"
                if math.isnan(row[column]):
                    continue
                per_length = n_samples // 2 if effect in row[f"{kind}_stopped_early"] else n_samples
                by_length = [
                    StratumDrop(kind="length", name=name, n_prompts=per_length, beyond=beyond,
                                beyond_ci=(math.nan, math.nan), holds=beyond > 0)
                    for name in strata
                    for beyond in [row[f"{column}[{name}]"]]
                ]  # fmt: skip
                ci = (row[f"{column}_ci_low"], row[f"{column}_ci_high"])
                verdict = class_verdict(ci[0] > 0, by_length, LENGTH_RULE)
                if row[f"{kind}_verdict"] == "score-not-held":
                    verdict = "score-not-held"
                elif row[column] < MIN_EFFECT[kind]:
                    verdict = "unconfirmed"
                heldout = BeyondRandom(
                    n_prompts=per_length * len(strata), drop=row[f"{kind}_effect{suffix}"],
                    drop_ci=(math.nan, math.nan), random_drop=row[f"{kind}_random_effect{suffix}"],
                    beyond=row[column], beyond_ci=ci,
                )  # fmt: skip
                scored.append((row[kind], ClassVerdict(
                    name=class_name(kind, label, effect), heads=[label], sign=1,
                    random_sets=[[head] for head in row[f"{kind}_random_heads"]], random_effects=[],
                    heldout=heldout, discovery=None, strata=by_length, verdict=verdict, note=HELD_OUT_ONLY,
                    per_prompt=torch.zeros(0), details={"type": kind, "effect": effect,
                                                        "beyond_se": row[f"{column}_se"]},
                )))  # fmt: skip
    order = sorted(scored, key=lambda pair: (CAUSAL_TYPES.index(pair[1].details["type"]), -pair[0]))
    return [found for _, found in order]  # as `head_classes`: each type's candidates highest score first


def beyond_se(found: ClassVerdict) -> float:
    """The SE of a class's effect beyond random, from the two sources its CI resamples: the held-out
    sequences and the random heads (their effects' spread over their number), as the CI's width says
    (older files: "beyond_se", the sequences' only)."""
    if "beyond_se" in found.details:
        return found.details["beyond_se"]
    sequences = mean_se(found.per_prompt)[1]
    randoms = torch.tensor(found.random_effects, dtype=torch.float64)
    spread = float(randoms.var() / len(randoms)) if len(randoms) > 1 else 0.0
    return math.sqrt(sequences**2 + spread)


HOLM_CELLS = {True: "holds", False: "does not hold", None: "cannot tell"}  # `evidence.holm`'s outcomes


def _class_cells(
    kind: str, classes: dict[str, ClassVerdict], corrected: dict[str, bool | None]
) -> dict[str, Any]:
    """A head's `kind` columns copied from its classes (effect -> class; NaN, [] or "" where not
    measured), with Holm's outcome of each (effect -> `evidence.holm`'s; none, so "", in a file without
    p-values)."""
    cells: dict[str, Any] = {}
    for effect, suffix in SUFFIXES.items():
        found, column = classes.get(effect), f"{kind}_beyond_random{suffix}"
        figures = found.heldout if found else None
        cells[f"{kind}_random_effect{suffix}"] = figures.random_drop if figures else math.nan
        cells[column] = figures.beyond if figures else math.nan
        cells[f"{column}_se"] = beyond_se(found) if found else math.nan
        low, high = figures.beyond_ci if figures else (math.nan, math.nan)
        cells[f"{column}_ci_low"], cells[f"{column}_ci_high"] = low, high
        cells[f"{column}_p"] = found.p if found else math.nan
        cells[f"{column}_p_bound"] = bool(found and found.p_bound)
        judged = found is not None and found.has_ci and effect in corrected
        cells[f"{column}_holm"] = HOLM_CELLS[corrected[effect]] if judged else ""
    alone = classes.get("alone")
    cells[f"{kind}_random_heads"] = [label for draw in alone.random_sets for label in draw] if alone else []
    return cells


def _stratum_cells(kind: str, stratum: str, classes: dict[str, ClassVerdict]) -> dict[str, float]:
    cells = {}
    for effect, suffix in SUFFIXES.items():
        found = classes.get(effect)
        beyond = {s.name: s.beyond for s in found.strata} if found else {}
        cells[f"{kind}_beyond_random{suffix}[{stratum}]"] = beyond.get(stratum, math.nan)
    return cells


class HeadGrid:
    """Reads of `table` (one row per (layer, head)) shared by `HeadFigures` and `HeadRows`."""

    table: pd.DataFrame
    n_layers: int
    n_heads: int

    def score_grid(self, column: str) -> np.ndarray:
        """[layer, head] values of one column of `table`."""
        grid = np.full((self.n_layers, self.n_heads), np.nan)
        grid[self.table["layer"], self.table["head"]] = self.table[column].astype(float)
        return grid

    def heads_of_type(self, head_type: str) -> list[Head]:
        """(layer, head) of the heads classified as `head_type`, best score first."""
        rows = self.table[self.table["types"].apply(lambda types: head_type in types)]
        rows = rows.sort_values(head_type, ascending=False)
        return list(zip(rows["layer"].tolist(), rows["head"].tolist(), strict=True))


@dataclass(kw_only=True)
class HeadFigures(HeadGrid, Extras):
    """`head_report`'s own figures. chose / tested: the token families (even ids choose, odd ids test).
    table, one row per (layer, head): layer, head; each score of SCORE_NAMES (`_se`, `confidence_`,
    `_text`), induction_len<L>, fixed_offset_distance, skip_gram_pair ("t -> v"), copying,
    k_composition; per causal type (nats for induction, attention for previous_token; NaN: not tested):
    <type>_effect(_se) alone, <type>_effect_with_others(_se), _held_out_score, _confirmed, _verdict,
    _holds_in (strata), _stopped_early, _confirmed_by, and per repeat length <type>_effect[L=13] (the
    same four); types. checks: how the causal checks ran, as recorded."""

    table: pd.DataFrame
    thresholds: dict[str, float]
    n_layers: int
    n_heads: int
    induction_lengths: list[int]  # the repeated probes' repeat lengths (the strata)
    max_prefix: int  # the longest random prefix before a repeat
    has_bos: bool
    skip_gram_probe: str  # the probe skip-grams are scored on ("text", or "random" without a tokenizer)
    checks: dict[str, Any]
    group_effects: dict[str, Effect] = field(default_factory=dict)  # type -> ablating all candidates
    str_tokens: dict[str, list[str]] = field(default_factory=dict)  # probe -> its first sequence's tokens
    patterns: dict[str, Tensor] = field(default_factory=dict)  # probe name -> [layer, head, q, k]

    wide_terminal: ClassVar[int] = WIDE_TERMINAL
    file_width: ClassVar[int] = FILE_WIDTH
    formats: ClassVar[tuple[str, ...]] = FORMATS
    terminal_options: ClassVar[dict[str, Any]] = {"all_heads": False}  # the terminal: the confirmed heads

    def full_table(self, finding: Finding) -> pd.DataFrame:
        """`table` with the classes' columns joined in place (after <type>_stopped_early and after each
        stratum's effects): every column of the CSV. Files saved before the random baseline have none."""
        table = self.table
        by_head: dict[tuple[str, str], dict[str, ClassVerdict]] = defaultdict(dict)
        corrected: dict[tuple[str, str], dict[str, bool | None]] = defaultdict(dict)  # Holm's, where p-values
        held = holm(finding.classes)
        for i, found in enumerate(finding.classes):
            key, effect = (found.details["type"], found.heads[0]), found.details["effect"]
            by_head[key][effect] = found
            if held is not None:
                corrected[key][effect] = held[i]
        labels = head_labels(zip(table["layer"], table["head"], strict=True))
        order, joined = [], []  # every column in order; the classes' columns, a frame per place
        for column in table.columns:
            order.append(column)
            for kind in (kind for kind in CAUSAL_TYPES if f"{kind}_confirmed_by" in table):
                prefix = f"{kind}_effect_with_others_se["
                if column == f"{kind}_stopped_early":
                    cells = [
                        _class_cells(kind, by_head[kind, label], corrected[kind, label]) for label in labels
                    ]
                elif column.startswith(prefix):
                    stratum = column[len(prefix) : -1]
                    cells = [_stratum_cells(kind, stratum, by_head[kind, label]) for label in labels]
                else:
                    continue
                joined.append(pd.DataFrame(cells, index=table.index))
                order += list(cells[0])
        return pd.concat([table, *joined], axis=1)[order]

    def settings_record(self, finding: Finding) -> dict[str, Any]:
        """The settings, probe lengths, token families and check rules (JSON and the Settings line)."""
        s, chose, tested = finding.settings, finding.chose[TOKEN_AXIS][0], finding.tested[TOKEN_AXIS][0]
        record = {
            "n_samples": s.n_samples, "seed": s.seed, "seq_len": s.seq_len,
            "induction_lengths": self.induction_lengths, "max_prefix": self.max_prefix,
            "has_bos": self.has_bos,
            "natural_text": s.natural_text, "skip_gram_probe": self.skip_gram_probe, "causal": s.causal,
            "max_candidates": s.max_candidates,
        }  # fmt: skip
        if chose != tested:  # files saved before the causal checks ran on a held-out family: the same
            record |= {"discovery_tokens": chose, "held_out_tokens": tested,
                       "held_out_seed": s.seed + HELD_OUT_SEED_OFFSET}  # fmt: skip
        for name, value in self.checks.items():
            record[name] = value
            if name == "causal_method" and "induction_confirmed_by" in self.table:  # the random baseline's
                record["n_random"] = s.n_random
        return record

    def rows(self, finding: Finding) -> HeadRows:
        """What the report reads: the full table (`full_table`) and the figures beside it."""
        return HeadRows(
            model_name=finding.model, table=self.full_table(finding),
            settings=self.settings_record(finding), thresholds=self.thresholds, n_layers=self.n_layers,
            n_heads=self.n_heads, group_effects=self.group_effects, str_tokens=self.str_tokens,
            patterns=self.patterns,
        )  # fmt: skip

    def title(self, finding: Finding) -> str:
        return f"Attention head types of {finding.model}"

    def headline(self, finding: Finding) -> list[str]:
        return [headline(self.rows(finding))]

    def chose_lines(self, finding: Finding) -> list[str]:
        return chose_lines(self.rows(finding))

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        """Each class's random heads, and their mean drop when `wide`."""
        heads = ("random heads", lambda c: " ".join(label for draw in c.random_sets for label in draw))
        random = ("random heads' drop", lambda c: f"{c.heldout.random_drop:.2f}")
        before = "induction_confirmed_by" not in self.table  # a file saved before the random baseline
        notes = [BEFORE_RANDOM_BASELINE if before else CLASS_LEGEND]
        return ClassView(columns=[heads, random] if wide else [heads], holds=STRATUM_HOLDS, notes=notes)

    def discovery_sections(self, finding: Finding, wide: bool, all_heads: bool = True) -> list[Section]:
        """The summary per type, the settings and the heads (as `head_sections`)."""
        rows = self.rows(finding)
        summary, heads = head_sections(rows, wide, all_heads)
        shown = {key: value for key, value in rows.settings.items() if key != "natural_text"}
        settings = ", ".join(f"{key}={value}" for key, value in shown.items())
        return [summary, Section(title="Settings", lines=[f"Settings: {settings}."]), heads]

    def extra_sections(self, finding: Finding, wide: bool, **options: Any) -> list[Section]:
        """The heat maps and the attention viewers (the HTML page only)."""
        rows = self.rows(finding)
        return [
            Section(title="Scores of every head", figures=[_heatmaps(rows)]),
            Section(title="Attention of each typed head", figures=_viewers(rows)),
        ]

    def data(self, finding: Finding) -> dict[str, Callable[[], str]]:
        return {"csv": lambda: to_csv(self.rows(finding))}

    def json_fields(self, finding: Finding) -> dict[str, Any]:
        """`--format json` (NaN as null): settings, thresholds, group effects, and every head's row."""
        heads = [
            {
                "layer": row["layer"],
                "head": row["head"],
                "scores": {name: row[name] for name in (*SCORE_NAMES, *WEIGHT_SCORES)},
                "score_se": {name: row[f"{name}_se"] for name in SCORE_NAMES},
                "text_scores": {name: row.get(f"{name}_text") for name in PATTERN_SCORES},
                "induction_by_length": {str(n): row[f"induction_len{n}"] for n in self.induction_lengths},
                "fixed_offset_distance": None if math.isnan(distance) else int(distance),
                "skip_gram_pair": row["skip_gram_pair"] or None,
                "types": list(row["types"]),
                "confidence": {name: row[f"confidence_{name}"] for name in SCORE_NAMES},
                "causal": {kind: _causal_data(row, kind) for kind in CAUSAL_TYPES},
            }
            for row in self.full_table(finding).to_dict("records")
            for distance in [row["fixed_offset_distance"]]
        ]
        return {
            "model": finding.model,
            "settings": self.settings_record(finding) | {"batch_size": finding.settings.batch_size},
            "thresholds": self.thresholds,
            "group_effects": {kind: {"effect": m, "se": se} for kind, (m, se) in self.group_effects.items()},
            "heads": heads,
        }


BEFORE_RANDOM_BASELINE = (
    "This file was saved before the effects were judged against random heads of their layers: it holds no "
    "judged class; the heads' table shows its effects and verdicts as it was saved."
)
STRATUM_HOLDS = (
    "its mean beyond random is positive (a confirmed effect holds at most repeat lengths, or the lengths "
    "differ no more than chance)"
)
CLASS_LEGEND = (
    "Each class is one candidate's effect on the held-out sequences, alone or with the other candidates of "
    "its type ablated, against random heads of its layer (see the legend of the heads' table): induction, "
    "Δloss in nats; previous_token, Δind, a fraction of attention. Its verdict is the effect's: confirmed, "
    "length-dependent (positive at half the lengths or fewer, the lengths differing beyond chance), "
    "unconfirmed (its CI reaches 0 or it is beyond random by less than 0.02), or "
    "score-not-held (the head's attention score on the held-out family is below its type's threshold). "
    "Its random heads: drawn once per layer (seed + the layer) from the heads over neither checked type's "
    "threshold, from other layers where its layer has none left."
)


@dataclass(kw_only=True)
class HeadRows(HeadGrid):
    """What the head report reads of a finding (`HeadFigures.rows`)."""

    model_name: str
    table: pd.DataFrame
    settings: dict[str, Any]
    thresholds: dict[str, float]
    n_layers: int
    n_heads: int
    group_effects: dict[str, Effect]
    str_tokens: dict[str, list[str]]
    patterns: dict[str, Tensor]


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
        "held_out_score": row.get(f"{kind}_held_out_score"),  # its type's score on the held-out probe
        "holds_in": list(row.get(f"{kind}_holds_in", [])),
        "stopped_early": list(row.get(f"{kind}_stopped_early", [])),
        "random_heads": list(row.get(f"{kind}_random_heads", [])),
        "confirmed_by": row.get(f"{kind}_confirmed_by") or None,
        "beyond_random": {
            effect: _beyond_random_data(row, f"{kind}_beyond_random{suffix}", f"{kind}_random_effect{suffix}")
            for effect, suffix in SUFFIXES.items()
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
    """One effect against random heads (None: not measured, or saved before the random baseline)."""
    if math.isnan(row.get(column, math.nan)):
        return None
    return {
        "random_effect": row[random],
        "beyond": row[column],
        "se": row[f"{column}_se"],
        "ci": [row[f"{column}_ci_low"], row[f"{column}_ci_high"]],
    }


def _number(value: float) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.2f}"


def _type_label(row, name: str) -> str:
    """A type as shown: "induction ✓" (confirmed), "fixed_offset 18" (offset), "skip_gram a->b"."""
    if name in CAUSAL_TYPES and row[f"{name}_confirmed"]:
        return f"{name} ✓" + (WITH_OTHERS_MARK if confirmed_with_others_only(row, name) else "")
    if name in CAUSAL_TYPES and row.get(f"{name}_verdict") in UNCONFIRMED_LABELS:
        return f"{name} ({UNCONFIRMED_LABELS[row[f'{name}_verdict']]})"
    if name == "fixed_offset":
        return f"{name} {int(row['fixed_offset_distance'])}"
    if name == "skip_gram":
        return f"{name} {row['skip_gram_pair']}"
    return name


def _types(row) -> str:
    return ", ".join(_type_label(row, name) for name in row["types"])


def classified_rows(report: HeadRows):
    """Rows of heads with a type besides first_token (sinks: most heads)."""
    return report.table[report.table["types"].apply(lambda types: bool(set(types) - {"first_token"}))]


UNSCORED = {"skip_gram": "needs a query token in 4 or more probe sequences: pass --n-samples 4 or more"}


def type_summary(report: HeadRows) -> list[tuple[str, int, list[Head]]]:
    """(type, number of heads, heads best first) for each type."""
    return [(name, len(heads), heads) for name in SCORE_NAMES for heads in [report.heads_of_type(name)]]


def headline(report: HeadRows) -> str:
    """One sentence: the confirmed heads of each causal type, and how many more are typed by score alone."""
    rows = classified_rows(report).to_dict("records")
    found = []
    for kind in CAUSAL_TYPES:
        heads = [head_label(row["layer"], row["head"]) for row in rows if row.get(f"{kind}_confirmed")]
        listed = f" ({', '.join(heads[:4])}{' …' if len(heads) > 4 else ''})" if heads else ""
        found.append(f"{len(heads)} {kind} heads{listed}")
    unconfirmed, sinks = len(unconfirmed_typed_rows(report)), len(first_token_only_rows(report))
    causal = report.settings.get("n_random") and report.settings["causal"]
    against = " beyond random heads of their layers" if causal else ""
    table, threshold = report.table, report.thresholds["induction"]
    unchecked = (  # over the threshold but never ablated: not typed induction (files before verdicts: none)
        table[(table["induction"] >= threshold) & (table["induction_verdict"] == "")]
        if "induction_verdict" in table
        else table.iloc[:0]
    )
    labels = ", ".join(head_labels(zip(unchecked["layer"], unchecked["head"], strict=True)))
    return (
        f"{report.model_name}: confirmed by ablation{against}: {', '.join(found)}; "
        f"{_heads(unconfirmed, 'more')} typed by their attention scores alone (not confirmed)"
        + (f", {sinks} of them first_token only." if sinks else ".")
        + (
            f" {_heads(len(unchecked))} over the induction threshold not causally checked (causal=False, or "
            f"beyond max_candidates), so not typed induction: {labels}."
            if len(unchecked)
            else ""
        )
    )


def _heads(n: int, adjective: str = "") -> str:
    """ "1 more head", "5 more heads"."""
    return f"{n} {adjective + ' ' if adjective else ''}head{'s' * (n != 1)}"


def first_token_only_rows(report: HeadRows):
    """Heads whose one type is first_token (attention sinks)."""
    return report.table[report.table["types"].apply(lambda types: list(types) == ["first_token"])]


def unconfirmed_typed_rows(report: HeadRows):
    """Heads with a type (first_token included), none confirmed by ablation."""
    return report.table[report.table["types"].apply(len) > 0].drop(confirmed_rows(report).index)


def unlisted_note(report: HeadRows, all_heads: bool) -> str:
    """What the heads table leaves out ("" if nothing)."""
    sinks = len(first_token_only_rows(report))
    where = "the first_token heat map of the HTML page and --format csv/json have them"
    if all_heads:
        return (
            f"Not listed: {_heads(sinks)} typed first_token only (attention sinks); {where}." if sinks else ""
        )
    unconfirmed = unconfirmed_typed_rows(report)
    if unconfirmed.empty:
        return ""
    counts = Counter(name for types in unconfirmed["types"] for name in types)
    per_type = ", ".join(f"{count} {name}" for name, count in counts.most_common())
    note = (
        f"{_heads(len(unconfirmed), 'more typed')}, not confirmed by ablation (typed by their scores; a head "
        f"may have several types): {per_type}."
    )
    if not sinks:
        return f"{note} --all lists them."
    return (
        f"{note} --all lists the {len(unconfirmed) - sinks} with a type besides first_token; the {sinks} "
        f"typed first_token only (attention sinks) are not listed: {where}."
    )


def group_line(report: HeadRows) -> str:
    """One sentence on the joint ablation of all induction candidates ("" if none was run)."""
    if "induction" not in report.group_effects:
        return ""
    effect, se = report.group_effects["induction"]
    n = int(report.table["induction_effect"].notna().sum())
    return (
        f"Ablating all {n} induction candidates together raises the loss on repeated tokens "
        f"by {effect:.3f} ± {se:.3f} nats."
    )


def chose_lines(report: HeadRows) -> list[str]:
    """What chose the candidates (scores, discovery family) and what tested them (held-out family)."""
    s = report.settings
    lengths = "/".join(map(str, s["induction_lengths"]))
    chose = (
        f"chosen: up to {s['max_candidates']} induction and {s['max_candidates']} previous-token candidates "
        f"(over the threshold, highest score first) by their attention scores on {s['n_samples']} repeated "
        f"sequences per repeat length ({lengths} tokens)"
    )
    others = (
        "The unrepeated random sequences (any token but the BOS)"
        + (" and natural text" if s["natural_text"] else "")
        + " type other heads and choose no candidate."
    )
    if "held_out_tokens" not in s:  # a file saved before the causal checks ran on a held-out family
        return [
            f"{chose} of random tokens, seed {s['seed']}. {others}",
            "tested: on the same repeated sequences (this file was saved before the causal checks ran on a "
            "held-out token family: its effects are measured on the sequences that chose the heads).",
        ]
    chose = f"{chose} of the discovery family: random {s['discovery_tokens']}, seed {s['seed']}. {others}"
    if not s["causal"]:
        return [chose, "tested: no causal check was run (causal=False)."]
    return [
        chose,
        f"tested: every causal effect, verdict and held-out score on {s['n_samples']} fresh repeated "
        f"sequences per repeat length (the same lengths, the strata) of the held-out family: random "
        f"{s['held_out_tokens']}, seed {s['held_out_seed']}. Nothing that chose the candidates read them, "
        "and they share no token with the sequences that chose them but the BOS (neither holds a special "
        "token).",
        *held_out_score_lines(report),
    ]


def held_out_score_lines(report: HeadRows) -> list[str]:
    """The candidates' scores on the discovery family -> the held-out family, and those falling below."""
    table = report.table
    lines = []
    for kind in CAUSAL_TYPES:
        column = f"{kind}_held_out_score"
        if column not in table:  # a file saved before the scores were measured held out
            return []
        rows = table[table[column].notna()]
        if rows.empty:
            continue
        threshold = report.thresholds[kind]
        below = rows[~(rows[column] >= threshold)]
        chosen, tested = rows[kind].mean(), rows[column].mean()
        lowest = rows.loc[rows[column].idxmin()]
        closest = f"{head_label(lowest['layer'], lowest['head'])} {lowest[kind]:.3f} → {lowest[column]:.3f}"
        fate = f"every one clears the threshold there (the lowest: {closest})" if below.empty else (
            f"{len(below)} fall below it there, so not confirmed: " + ", ".join(
                f"{head_label(row['layer'], row['head'])} {row[kind]:.2f} → {row[column]:.2f}"
                for row in below.to_dict("records")
            )
        )  # fmt: skip
        lines.append(
            f"{kind.replace('_', '-')} scores held out: the {len(rows)} candidates' mean {chosen:.3f} on the "
            f"discovery family → {tested:.3f} on the held-out family (threshold {threshold:.3f}); {fate}."
        )
    return lines


def _score_columns(report: HeadRows) -> dict[str, str]:
    """The wide table's score columns: header -> the table's column."""
    lengths = {f"ind@{n}": f"induction_len{n}" for n in report.settings["induction_lengths"]}
    names = [*(name for name in SCORE_NAMES if name != "induction"), *WEIGHT_SCORES]
    return lengths | {SHORT[name]: name for name in names}


def _cells(report: HeadRows, row) -> list[str]:
    effects = [
        "" if math.isnan(row[f"{kind}_effect"]) else _effect_pair(row, kind, "/") for kind in CAUSAL_TYPES
    ]
    scores = [row.get(f"{kind}_held_out_score", math.nan) for kind in CAUSAL_TYPES]
    held_out = next((score for score in scores if not math.isnan(score)), math.nan)  # its first candidacy's
    return [head_label(row["layer"], row["head"]), _types(row),
            *(_number(row[name]) for name in _score_columns(report).values()), _number(held_out), *effects,
            _beyond_cell(row)]  # fmt: skip


def _effect_pair(row, kind: str, separator: str) -> str:
    """ "0.12/0.05": the effect alone / with the others ablated ("–": not measured; "†": stopped early)."""
    stopped = row.get(f"{kind}_stopped_early", [])
    values = zip(EFFECTS, (row[f"{kind}_effect"], row[f"{kind}_effect_with_others"]), strict=True)
    return separator.join(
        _number(value) + "†" * (name in stopped and not math.isnan(value)) for name, value in values
    )


BEYOND_COLUMN = "beyond random"  # cells: "+0.40 [+0.35, +0.45] (0.05)": its 95% CI, (random)


def _beyond_cell(row) -> str:
    """ "+0.40 [+0.35, +0.45] (0.05)": the strongest confirming effect (else the first effect alone)
    beyond random, its 95% CI, and the random heads' mean effect ("" where none)."""
    confirmed = [kind for kind in CAUSAL_TYPES if row[f"{kind}_confirmed"]]
    measured = [kind for kind in CAUSAL_TYPES if not math.isnan(row.get(f"{kind}_beyond_random", math.nan))]
    if not confirmed and not measured:
        return ""
    kind = max(confirmed, key=lambda kind: _evidence_of(row, kind)) if confirmed else measured[0]
    suffix = "_with_others" if confirmed_with_others_only(row, kind) else ""
    column = f"{kind}_beyond_random{suffix}"
    if math.isnan(row.get(column, math.nan)):  # a file saved before the random baseline
        return ""
    interval = (row[f"{column}_ci_low"], row[f"{column}_ci_high"])
    return f"{value_ci(row[column], interval, 2)} ({row[f'{kind}_random_effect{suffix}']:.2f})"


def _compact_cells(row) -> list[str]:
    """head, types, its main type's score, the causal effects, `_beyond_cell`."""
    main = next((name for name in row["types"] if name not in ("first_token", "broad")), row["types"][0])
    effect = ""
    for kind, unit in (("induction", "Δloss"), ("previous_token", "Δind")):
        if kind in row["types"] and not math.isnan(row[f"{kind}_effect"]):
            effect = f"{unit} " + _effect_pair(row, kind, " / ")
            break
    held_out = row.get(f"{main}_held_out_score", math.nan)
    return [
        head_label(row["layer"], row["head"]),
        _types(row),
        f"{SHORT[main]} {row[main]:.2f}" + ("" if math.isnan(held_out) else f" → {held_out:.2f}"),
        effect,
        _beyond_cell(row),
    ]


SAVED_BEFORE_RANDOM_SE = 2.0  # files saved before the random baseline confirmed an effect > 2 standard errors


def confirmed_with_others_only(row, kind: str) -> bool:
    """Confirmed as `kind` only with the others ablated (older files: effect alone ≤ 2 SE or MIN_EFFECT)."""
    if not row[f"{kind}_confirmed"]:
        return False
    if f"{kind}_confirmed_by" in row:
        return row[f"{kind}_confirmed_by"] == "with_others_ablated"
    effect, se = row[f"{kind}_effect"], row[f"{kind}_effect_se"]
    return not effect > max(SAVED_BEFORE_RANDOM_SE * se, MIN_EFFECT[kind])


def _evidence_of(row, kind: str) -> float:
    """The confirming effect of `kind` beyond random (older files: the effect) / its standard error."""
    suffix = "_with_others" if confirmed_with_others_only(row, kind) else ""
    column = f"{kind}_beyond_random{suffix}" if f"{kind}_confirmed_by" in row else f"{kind}_effect{suffix}"
    return row[column] / row[f"{column}_se"]


def evidence(row) -> float:
    """The strongest `_evidence_of` over the head's confirmed types (-inf: none)."""
    return max(
        (_evidence_of(row, kind) for kind in CAUSAL_TYPES if row[f"{kind}_confirmed"]), default=-math.inf
    )


def confirmed_rows(report: HeadRows):
    """Typed heads confirmed by ablation, the strongest `evidence` first."""
    rows = classified_rows(report).copy()  # one block: the table's many columns were added one by one
    rows = rows.assign(_evidence=[evidence(row) for row in rows.to_dict("records")])
    return rows[rows["_evidence"] > -math.inf].sort_values("_evidence", ascending=False)


def ranked_rows(report: HeadRows):
    """Every typed head: the confirmed first (`confirmed_rows`), then by layer."""
    typed, confirmed = classified_rows(report), confirmed_rows(report).index
    return typed.loc[[*confirmed, *typed.index.drop(confirmed)]]


def to_csv(report: HeadRows) -> str:
    table = report.table.copy()
    table["types"] = table["types"].apply(";".join)
    return safe_csv(table)


SIGNED_SCORES = ("copying", "skip_gram")  # scores that can be negative: drawn on a scale centred on 0


def _scale(name: str, report: HeadRows) -> str:
    if name == "copying":
        return "colour: blue −1, white 0, red +1 (centred on 0, symmetric)"
    if name in SIGNED_SCORES:
        return f"colour: blue −1, white 0, red +1; typed at ≥ {report.thresholds[name]:.2f}"
    if name == "k_composition":
        return "colour: white 0 to red at this model's largest value"
    return f"colour: white 0 to red 1; typed at ≥ {report.thresholds[name]:.2f}"


def _heatmaps(report: HeadRows) -> str:
    """Every score's [layer, head] heat map, captioned with its meaning and scale."""
    maps = [
        layer_head_map(report.score_grid(name), name, f"{CAPTIONS[name]}. {_scale(name, report)}.",
                       signed=name in SIGNED_SCORES, limit=1.0 if name in (*SCORE_NAMES, "copying") else None)
        for name in (*SCORE_NAMES, *WEIGHT_SCORES)
    ]  # fmt: skip
    return viz.heatmap_grid(maps, min_width=max(260, 44 * report.n_heads + 60))  # a column ~44 px


def viewer_heads(report: HeadRows) -> list[tuple[str, Head]]:
    """(type, head) of the attention viewers: up to TOP_HEADS_SHOWN per type, the confirmed first."""
    table = report.table.set_index(["layer", "head"])
    shown = []
    for name in SCORE_NAMES:
        heads = report.heads_of_type(name)
        if name in CAUSAL_TYPES:
            heads = sorted(heads, key=lambda head: not table.loc[head, f"{name}_confirmed"])
        shown += [(name, head) for head in heads[:TOP_HEADS_SHOWN]]
    return shown


def _probe_of(name: str, report: HeadRows) -> str:
    """The probe a type shows on: its pattern is what the type predicts there."""
    if name == "fixed_offset" or (name == "skip_gram" and "text" not in report.patterns):
        return "random"
    return "text" if name == "skip_gram" else "repeated"


def _viewers(report: HeadRows) -> list[str]:
    shown = viewer_heads(report)
    if not shown:
        return []
    table = report.table.set_index(["layer", "head"])
    cards = []
    for name, (layer, head) in shown:
        probe = _probe_of(name, report)
        if probe not in report.patterns:  # a report saved without its patterns: no viewer to draw
            continue
        label = head_label(layer, head)
        confirmed = name in CAUSAL_TYPES and table.loc[(layer, head), f"{name}_confirmed"]
        title = f"{name} {label}" + (" ✓" if confirmed else "") + f" ({probe} probe)"
        pattern = report.patterns[probe][layer, head][None]
        cards.append(
            '<figure class="head-viewer" style="min-width: 0; overflow-x: auto;">'
            f"<figcaption>{html.escape(title)}: {name} score "
            f"{table.loc[(layer, head), name]:.2f}</figcaption>"
            f"{viz.attention_patterns_html(report.str_tokens[probe], pattern, [f'{name} {label}'])}</figure>"
        )
    intro = (
        f"<p class='note'>Up to {TOP_HEADS_SHOWN} heads per type "
        "(confirmed by ablation first), each on the first sequence of the probe its type is scored on. "
        "Hover a token to see where it attends.</p>"
    )
    grid = "display: grid; gap: 8px 24px; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr));"
    return [intro, f'<div class="head-viewers" style="{grid}">{"".join(cards)}</div>']


def head_sections(report: HeadRows, wide: bool = True, all_heads: bool = True) -> list[Section]:
    """The summary per type and the heads (every typed one with `all_heads`, else the confirmed; every
    score column when `wide`)."""
    shown = 8 if wide else 5
    summary = Table(
        columns=["type", "threshold", "heads", "top heads"],
        rows=[
            [name, f"{report.thresholds[name]:.2f}", str(count),
             ", ".join(head_labels(heads[:shown])) + (" …" if count > shown else "")]
            if name not in report.table or report.table[name].notna().any()
            else [name, "–", "not scored", UNSCORED.get(name, "no head could be scored on these probes")]
            for name, count, heads in type_summary(report)
        ],
        right=["threshold", "heads"],
    )  # fmt: skip
    rows = ranked_rows(report) if all_heads else confirmed_rows(report)
    title = (
        "Every typed head: confirmed by ablation first (by beyond/SE), then by layer"
        if all_heads
        else "Heads confirmed by ablation, by beyond/SE (the confirming effect beyond random heads / its "
        "standard error)"
    )
    effect = "causal effect alone / with the others ablated (nats / score)"
    wide_columns = ["head", "types", *_score_columns(report), "held out", "Δloss", "Δind", BEYOND_COLUMN]
    columns = wide_columns if wide else ["head", "types", "score", effect, BEYOND_COLUMN]
    hints = [note for note in [unlisted_note(report, all_heads)] if note]
    hints.append(
        ("" if wide else "--wide shows every score; ") + "--format csv/json has standard errors too."
    )
    heads = Section(
        title=title,
        table=Table(
            columns=columns,
            rows=[_cells(report, row) if wide else _compact_cells(row) for row in rows.to_dict("records")],
            right=[column for column in columns if column not in ("head", "types")],
        ),
        notes=[LEGEND, *hints],
    )  # fmt: skip
    summary_lines = [line for line in [group_line(report)] if line]
    return [Section(title="Summary per type", lines=summary_lines, table=summary), heads]
