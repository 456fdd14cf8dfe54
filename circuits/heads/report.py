"""A `HeadReport` as a `circuits.sections.Report` (terminal, Markdown, HTML with heat maps and attention
viewers) and its data (CSV, JSON); heads written as `interp.types.head_label` does ("L9H6")."""

from __future__ import annotations

import html
import math
from collections import Counter
from pathlib import Path

from rich.console import Console

from circuits.evidence import head_labels
from circuits.heads.causal import CAUSAL_TYPES, EFFECTS, FUTILITY_ERROR, FUTILITY_SE, MIN_EFFECT
from circuits.heads.classify import HeadReport
from circuits.heads.scores import SCORE_NAMES
from circuits.output import safe_csv
from circuits.sections import Report, Section, Table, layer_head_map, value_ci, write_sections
from interp import viz
from interp.types import Head, head_label

FORMATS = ("table", "csv", "json", "markdown", "html")
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
    "copying": "sum(eig) / sum(|eig|) of the full OV circuit W_E W_V W_O W_U, from the weights: +1, "
    "attending to a token raises that token's logit (the head copies it); −1, lowers it (the head "
    "suppresses it); 0, neither",
    "k_composition": "how much of the head's key side reads what an earlier previous-token head writes "
    "(max over those heads, from the weights); grey: no earlier previous-token head",
}
LEGEND = (
    "Units and signs. Attention scores are fractions of a query's attention (0 to 1; broad: normalised "
    "entropy, 0 to 1); copying lies in [−1, +1] (+1: copies the attended token, −1: suppresses it); "
    "k_composition in [0, 1]. Causal effects are mean ablations of the head's output on the held-out "
    "sequences, as alone / with the other candidates of its type ablated (–: not measured, the head is "
    "confirmed alone at every repeat length): "
    "Δloss = ablated − clean loss on the repeated tokens, in nats (positive: the head helps predict "
    "the repeat); Δind = clean − ablated induction score of the later induction heads, a fraction of "
    'attention (positive: the head feeds them). beyond random, "+0.40 [+0.35, +0.45] (0.05)": the '
    "confirming effect (else the effect alone) minus the mean effect of random heads of the head's "
    "layer over neither checked type's threshold (ablated alone; on top of all the candidates for the effect "
    "with the others ablated), paired per held-out sequence, its 95% bootstrap CI over the sequences, "
    "and that mean in "
    "parentheses. score: the "
    "attention score that chose the head, on the discovery token family → the same score on the "
    "held-out family (held out: that score of its induction type, else its previous-token type). ✓: "
    "confirmed by ablation: an effect (alone or with the others ablated) is beyond random, its CI "
    "excluding 0, by at least 0.02 over all the held-out sequences; beyond random at more than half of "
    "the probe's repeat lengths (else: length-dependent, not confirmed); and the held-out score clears "
    f"the type's threshold (else: score not held out, not confirmed). ✓{WITH_OTHERS_MARK}: confirmed "
    "only with the other candidates of its type ablated (alone its effect is not beyond random: the "
    "others stand in for it). The table's order: beyond/SE, the confirming effect beyond random / its "
    "standard error over the sequences (--format csv/json have both). "
    "†: stopped early as futile (sequential stopping in two looks): on the first half of each repeat "
    f"length's sequences the effect beyond random + {FUTILITY_SE:g} standard errors was below 0.02, so "
    "it was not run on the second half and is over the first; an effect truly at least 0.02 beyond "
    f"random is stopped so with probability at most {FUTILITY_ERROR:.2%} (normal approximation), and "
    "stopping never confirms a head."
)
WIDE_TERMINAL = 184  # columns from which the terminal table shows every score
FILE_WIDTH = 200  # the columns of the table format written to a file


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


def classified_rows(report: HeadReport):
    """Rows of heads with a type besides first_token (sinks: most heads)."""
    return report.table[report.table["types"].apply(lambda types: bool(set(types) - {"first_token"}))]


def type_summary(report: HeadReport) -> list[tuple[str, int, list[Head]]]:
    """(type, number of heads, heads best first) for each type."""
    return [(name, len(heads), heads) for name in SCORE_NAMES for heads in [report.heads_of_type(name)]]


def headline(report: HeadReport) -> str:
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
    return (
        f"{report.model_name}: confirmed by ablation{against}: {', '.join(found)}; "
        f"{_heads(unconfirmed, 'more')} typed by their attention scores alone (not confirmed)"
        + (f", {sinks} of them first_token only." if sinks else ".")
    )


def _heads(n: int, adjective: str = "") -> str:
    """ "1 more head", "5 more heads"."""
    return f"{n} {adjective + ' ' if adjective else ''}head{'s' * (n != 1)}"


def first_token_only_rows(report: HeadReport):
    """Heads whose one type is first_token (attention sinks)."""
    return report.table[report.table["types"].apply(lambda types: list(types) == ["first_token"])]


def unconfirmed_typed_rows(report: HeadReport):
    """Heads with a type (first_token included), none confirmed by ablation."""
    return report.table[report.table["types"].apply(len) > 0].drop(confirmed_rows(report).index)


def unlisted_note(report: HeadReport, all_heads: bool) -> str:
    """What the heads table leaves out ("" if nothing): the unconfirmed typed heads per type, or with
    `all_heads` the first_token-only ones."""
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


def group_line(report: HeadReport) -> str:
    """One sentence on the joint ablation of all induction candidates ("" if none was run)."""
    if "induction" not in report.group_effects:
        return ""
    effect, se = report.group_effects["induction"]
    n = int(report.table["induction_effect"].notna().sum())
    line = (
        f"Ablating all {n} induction candidates together raises the loss on repeated tokens "
        f"by {effect:.3f} ± {se:.3f} nats."
    )
    dependent = [
        f"{head_label(row['layer'], row['head'])} {kind} "
        f"(holds at {', '.join(row[f'{kind}_holds_in']) or 'no repeat length'})"
        for row in report.table.to_dict("records")
        for kind in CAUSAL_TYPES
        if row.get(f"{kind}_verdict") == "length-dependent"
    ]
    if dependent:
        line += (
            " Significant pooled but length-dependent (the effect holds at half the repeat lengths or "
            f"fewer, not confirmed): {'; '.join(dependent)}."
        )
    return line


def chose_lines(report: HeadReport) -> list[str]:
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
        *random_heads_lines(report),
        "effects: Δloss = ablated − clean loss on the repeated tokens (nats); Δind = clean − ablated "
        "induction score of the later induction heads (positive: the head helps).",
    ]


def random_heads_lines(report: HeadReport) -> list[str]:
    """The random heads each candidate layer's effects are compared with, per type."""
    table = report.table
    lines = []
    for kind in CAUSAL_TYPES:
        column = f"{kind}_random_heads"
        if column not in table:  # a file saved before the random baseline
            return []
        by_layer = {}
        for row in table.to_dict("records"):
            if row[column]:
                by_layer.setdefault(row["layer"], row[column])
        if not by_layer:
            continue
        listed = "; ".join(f"L{layer}: {', '.join(heads)}" for layer, heads in sorted(by_layer.items()))
        elsewhere = [f"L{layer}" for layer, heads in sorted(by_layer.items())
                     if any(not label.startswith(f"L{layer}H") for label in heads)]  # fmt: skip
        their = "its" if len(elsewhere) == 1 else "their"
        moved = (
            f" {', '.join(elsewhere)} had no such head left, so {their} random heads come from other layers."
        )
        lines.append(
            f"{kind.replace('_', '-')} candidates against random heads: each effect is compared with "
            f"{report.settings['n_random']} random heads of the candidate's layer over neither the induction "
            f"nor the previous-token threshold (drawn once per layer, seed {report.settings['seed']} + the "
            f"layer), paired per held-out sequence, 95% bootstrap CI; {listed}."
            + (moved if elsewhere else "")
        )
    return lines


def held_out_score_lines(report: HeadReport) -> list[str]:
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


def _score_columns(report: HeadReport) -> dict[str, str]:
    """The wide table's score columns: header -> the table's column."""
    lengths = {f"ind@{n}": f"induction_len{n}" for n in report.settings["induction_lengths"]}
    names = [*(name for name in SCORE_NAMES if name != "induction"), *WEIGHT_SCORES]
    return lengths | {SHORT[name]: name for name in names}


def _cells(report: HeadReport, row) -> list[str]:
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
    """ "+0.40 [+0.35, +0.45] (0.05)": the confirming effect of the head's strongest confirmed type
    (`evidence`), else its effect alone as the first type it was a candidate of, beyond random heads of
    its layer, with its 95% CI and the random heads' mean effect ("" where none)."""
    confirmed = [kind for kind in CAUSAL_TYPES if row[f"{kind}_confirmed"]]
    measured = [kind for kind in CAUSAL_TYPES if not math.isnan(row.get(f"{kind}_beyond_random", math.nan))]
    if confirmed:
        kind = max(confirmed, key=lambda kind: _evidence_of(row, kind))
        suffix = "_with_others" if confirmed_with_others_only(row, kind) else ""
    elif measured:
        kind, suffix = measured[0], ""
    else:
        return ""
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
    """Confirmed as `kind` by its effect with the others ablated, not alone (in a file saved before the
    random baseline: its effect alone not over 2 standard errors and MIN_EFFECT)."""
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


def confirmed_rows(report: HeadReport):
    """Typed heads confirmed by ablation, the strongest `evidence` first."""
    rows = classified_rows(report).copy()  # one block: the table's many columns were added one by one
    rows = rows.assign(_evidence=[evidence(row) for row in rows.to_dict("records")])
    return rows[rows["_evidence"] > -math.inf].sort_values("_evidence", ascending=False)


def ranked_rows(report: HeadReport):
    """Every typed head: the confirmed first (`confirmed_rows`), then by layer."""
    typed, confirmed = classified_rows(report), confirmed_rows(report).index
    return typed.loc[[*confirmed, *typed.index.drop(confirmed)]]


def to_csv(report: HeadReport) -> str:
    table = report.table.copy()
    table["types"] = table["types"].apply(";".join)
    return safe_csv(table)


def _scale(name: str, report: HeadReport) -> str:
    if name == "copying":
        return "colour: blue −1, white 0, red +1 (centred on 0, symmetric)"
    if name == "k_composition":
        return "colour: white 0 to red at this model's largest value"
    return f"colour: white 0 to red 1; typed at ≥ {report.thresholds[name]:.2f}"


def _heatmaps(report: HeadReport) -> str:
    """Every score's [layer, head] heat map, captioned with its meaning and scale."""
    maps = [
        layer_head_map(report.score_grid(name), name, f"{CAPTIONS[name]}. {_scale(name, report)}.",
                       signed=name == "copying", limit=1.0 if name in (*SCORE_NAMES, "copying") else None)
        for name in (*SCORE_NAMES, *WEIGHT_SCORES)
    ]  # fmt: skip
    return viz.heatmap_grid(maps, min_width=max(260, 44 * report.n_heads + 60))  # a column ~44 px


def viewer_heads(report: HeadReport) -> list[tuple[str, Head]]:
    """(type, head) of the attention viewers: up to TOP_HEADS_SHOWN per type, the confirmed first."""
    table = report.table.set_index(["layer", "head"])
    shown = []
    for name in SCORE_NAMES:
        heads = report.heads_of_type(name)
        if name in CAUSAL_TYPES:
            heads = sorted(heads, key=lambda head: not table.loc[head, f"{name}_confirmed"])
        shown += [(name, head) for head in heads[:TOP_HEADS_SHOWN]]
    return shown


def _probe_of(name: str, report: HeadReport) -> str:
    """The probe a type shows on: its pattern is what the type predicts there."""
    if name == "fixed_offset" or (name == "skip_gram" and "text" not in report.patterns):
        return "random"
    return "text" if name == "skip_gram" else "repeated"


def _viewers(report: HeadReport) -> list[str]:
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


def heads_sections(report: HeadReport, wide: bool = True, all_heads: bool = True) -> Report:
    """The report: the heads (every typed one with `all_heads`, else the confirmed; every score column
    when `wide`), the summary per type, the heat maps and attention viewers (HTML only)."""
    shown = 8 if wide else 5
    summary = Table(
        columns=["type", "threshold", "heads", "top heads"],
        rows=[
            [name, f"{report.thresholds[name]:.2f}", str(count),
             ", ".join(head_labels(heads[:shown])) + (" …" if count > shown else "")]
            for name, count, heads in type_summary(report)
        ],
        right=["threshold", "heads"],
    )  # fmt: skip
    settings = ", ".join(f"{key}={value}" for key, value in report.settings.items() if key != "natural_text")
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
    sections = [
        Section(title="What chose and what tested", lines=chose_lines(report)),
        Section(
            title="Summary per type", lines=[line for line in [group_line(report)] if line], table=summary
        ),
        Section(title="Model and settings", lines=[f"Model: {report.provenance}.", f"Settings: {settings}."]),
        heads,
        Section(title="Scores of every head", figures=[_heatmaps(report)]),
        Section(title="Attention of each typed head", figures=_viewers(report)),
    ]
    return Report(
        title=f"Attention head types of {report.model_name}", headline=[headline(report)], sections=sections
    )


def write_report(
    report: HeadReport, format: str, out: str | Path | None, console: Console | None,
    wide: bool | None = None, all_heads: bool = False,
) -> None:  # fmt: skip
    """Print, or write to `out`, the report in `format`; the table format is wide when `wide` (default:
    with WIDE_TERMINAL columns or more) and fits, else compact."""
    width = FILE_WIDTH if out is not None else console.width
    fits = width >= WIDE_TERMINAL
    if format == "table" and wide and not fits:
        console.print(
            f"--wide needs {WIDE_TERMINAL} columns and this terminal has {width}: showing the compact table. "
            "Widen the terminal, or use --format csv or markdown for every score."
        )
    terminal = heads_sections(report, wide=fits if wide is None else wide and fits, all_heads=all_heads)
    data = {"csv": lambda: to_csv(report)}
    write_sections(heads_sections(report), format, out, console, report, data, terminal, FILE_WIDTH)
