"""Rendering a `HeadReport`: terminal table (rich), CSV, JSON, Markdown and a self-contained HTML page."""

from __future__ import annotations

import functools
import html
import io
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from circuits.heads import SCORE_NAMES, HeadReport
from interp import viz

FORMATS = ("table", "csv", "json", "markdown", "html")
WEIGHT_SCORES = ("copying", "k_composition")
SHORT = {
    "previous_token": "prev",
    "induction": "ind",
    "duplicate_token": "dup",
    "current_token": "cur",
    "first_token": "first",
    "broad": "broad",
    "copying": "copy",
    "k_composition": "kcomp",
}
TOP_HEADS_SHOWN = 3  # attention patterns per type in the HTML page


def _number(value: float, digits: int = 2) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def _effect(row, kind: str) -> str:
    effect, se = row[f"{kind}_effect"], row[f"{kind}_effect_se"]
    if math.isnan(effect):
        return ""
    mark = " ✓" if row[f"{kind}_confirmed"] else ""
    return f"{effect:.3f} ± {se:.3f}{mark}"


def _type_label(row) -> str:
    labels = []
    for name in row["types"]:
        confirmed = name in ("induction", "previous_token") and row[f"{name}_confirmed"]
        labels.append(name + (" ✓" if confirmed else ""))
    return ", ".join(labels)


def classified_rows(report: HeadReport):
    """Rows of heads with at least one type (first_token-only sinks excluded: they are most heads)."""
    table = report.table
    keep = table["types"].apply(lambda types: bool(set(types) - {"first_token"}))
    return table[keep]


def type_summary(report: HeadReport) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """(type, number of heads, heads best first) for each type."""
    return [(name, len(heads), heads) for name in SCORE_NAMES for heads in [report.heads_of_type(name)]]


def group_line(report: HeadReport) -> str:
    """One sentence on the joint ablation of all induction candidates ("" if none was run)."""
    if "induction" not in report.group_effects:
        return ""
    effect, se = report.group_effects["induction"]
    n = int(report.table["induction_effect"].notna().sum())
    return (
        f"Ablating all {n} induction candidates together raises the loss on repeated tokens "
        f"by {effect:.3f} ± {se:.3f} nats."
    )


def _columns() -> list[str]:
    scores = [SHORT[name] for name in (*SCORE_NAMES, *WEIGHT_SCORES)]
    return ["head", "types", *scores, "Δloss", "Δind"]


def _cells(row) -> list[str]:
    scores = [_number(row[name]) for name in (*SCORE_NAMES, *WEIGHT_SCORES)]
    head = f"L{row['layer']}H{row['head']}"
    return [head, _type_label(row), *scores, _effect(row, "induction"), _effect(row, "previous_token")]


# ---------------------------------------------------------------------------------------------
# Terminal


def print_table(report: HeadReport, console: Console | None = None) -> None:
    """Classified heads and a summary per type, as rich tables."""
    console = console or Console()
    table = Table(title=f"Attention head types of {report.model_name}", header_style="bold")
    for column in _columns():
        table.add_column(column, justify="left" if column in ("head", "types") else "right", overflow="fold")
    for row in classified_rows(report).to_dict("records"):
        table.add_row(*_cells(row))
    console.print(table)
    summary = Table(title="Summary per type", header_style="bold")
    summary.add_column("type")
    summary.add_column("threshold", justify="right")
    summary.add_column("heads", justify="right")
    summary.add_column("top heads")
    for name, count, heads in type_summary(report):
        top = ", ".join(f"L{layer}H{head}" for layer, head in heads[:8]) + (" …" if count > 8 else "")
        summary.add_row(name, f"{report.thresholds[name]:.2f}", str(count), top)
    console.print(summary)
    if group_line(report):
        console.print(group_line(report))
    console.print(
        "✓ = confirmed by mean ablation (effect > 2 std errors). Δloss: loss increase on repeated tokens; "
        "Δind: drop of later induction heads' score. Every score is in --format csv/json."
    )


# ---------------------------------------------------------------------------------------------
# Files


def to_csv(report: HeadReport) -> str:
    table = report.table.copy()
    table["types"] = table["types"].apply(";".join)
    return table.to_csv(index=False)


def to_markdown(report: HeadReport) -> str:
    lines = [f"# Attention head types of {report.model_name}", ""]
    lines += ["| type | threshold | heads | top heads |", "| --- | ---: | ---: | --- |"]
    for name, count, heads in type_summary(report):
        top = ", ".join(f"L{layer}H{head}" for layer, head in heads[:8])
        lines.append(f"| {name} | {report.thresholds[name]:.2f} | {count} | {top} |")
    columns = _columns()
    lines += ["", "| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for row in classified_rows(report).to_dict("records"):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in _cells(row)) + " |")
    settings = ", ".join(f"{key}={value}" for key, value in report.settings.items() if key != "natural_text")
    lines += ["", group_line(report), "", f"Settings: {settings}.", ""]
    return "\n".join(lines)


def to_html(report: HeadReport) -> str:
    """One self-contained page: summary, heat maps of every score, attention patterns of top heads."""
    layers = [str(layer) for layer in range(report.n_layers)]
    heads = [str(head) for head in range(report.n_heads)]
    sections = [_html_summary(report)]
    for name in (*SCORE_NAMES, *WEIGHT_SCORES):
        limit = 1.0 if name in SCORE_NAMES else None
        sections.append(viz.heatmap_html(report.score_grid(name), layers, heads, title=name, limit=limit))
    shown = [(name, head) for name in SCORE_NAMES for head in report.heads_of_type(name)[:TOP_HEADS_SHOWN]]
    for probe, str_tokens in report.str_tokens.items() if shown else ():
        pattern = report.patterns[probe]
        title = f"Attention patterns of the top heads of each type ({probe} probe)"
        sections.append(f"<h2>{html.escape(title)}</h2>")
        stacked = pattern[[layer for _, (layer, _) in shown], [head for _, (_, head) in shown]]
        names = [f"{name} L{layer}H{head}" for name, (layer, head) in shown]
        sections.append(viz.attention_patterns_html(str_tokens, stacked, names))
    return viz.html_page(f"Attention head types of {report.model_name}", sections)


def _html_summary(report: HeadReport) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{report.thresholds[name]:.2f}</td><td>{count}</td>"
        f"<td>{html.escape(', '.join(f'L{layer}H{head}' for layer, head in heads[:8]))}</td></tr>"
        for name, count, heads in type_summary(report)
    )
    settings = html.escape(", ".join(f"{k}={v}" for k, v in report.settings.items() if k != "natural_text"))
    head_rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in _cells(row)) + "</tr>"
        for row in classified_rows(report).to_dict("records")
    )
    header = "".join(f"<th>{html.escape(column)}</th>" for column in _columns())
    return (
        f"<p>Settings: {settings}</p><p>{html.escape(group_line(report))}</p>"
        '<table class="interp-summary"><thead><tr><th>type</th><th>threshold</th><th>heads</th>'
        f"<th>top heads</th></tr></thead><tbody>{rows}</tbody></table>"
        f'<h2>Classified heads</h2><table class="interp-heads"><thead><tr>{header}</tr></thead>'
        f"<tbody>{head_rows}</tbody></table>"
    )


def render(report: HeadReport, format: str) -> str:
    """The report as text in one of FORMATS other than "table"."""
    renderers = {"csv": to_csv, "json": HeadReport.to_json, "markdown": to_markdown, "html": to_html}
    if format not in renderers:
        raise ValueError(f"Unknown format {format!r}; choose one of {', '.join(FORMATS)}.")
    return renderers[format](report)


def write_output(
    format: str,
    formats: Sequence[str],
    out: str | Path | None,
    console: Console,
    table: Callable[[Console], None],
    text: Callable[[str], str],
    width: int = 200,
) -> None:
    """Print a report, or write it to `out` atomically: `table(console)` draws the "table" format,
    `text(format)` renders the others. HTML needs `out`."""
    if format not in formats:
        raise ValueError(f"Unknown format {format!r}; choose one of {', '.join(formats)}.")
    if format == "html" and out is None:
        raise ValueError("--format html needs --out FILE.html.")
    if format == "table" and out is None:
        table(console)
    elif format == "table":
        buffer = Console(file=io.StringIO(), width=width)
        table(buffer)
        viz.write_text(out, buffer.file.getvalue())
    elif out is None:
        console.print(text(format), markup=False, highlight=False, emoji=False, soft_wrap=True)
    else:
        viz.write_text(out, text(format))


def write_report(report: HeadReport, format: str, out: str | Path | None, console: Console) -> None:
    """Print (table, or text formats without `out`) or write the report to `out`."""
    table = functools.partial(print_table, report)
    write_output(format, FORMATS, out, console, table, lambda fmt: render(report, fmt))
