"""One report structure: a headline and sections of lines and tables, rendered once to the terminal,
JSON, Markdown and HTML.

    report = Report(title="...", headline=["..."], sections=[Section(title="Classes", table=Table(...))])
    write_sections(report, "markdown", out=None, console=console)

An analysis builds a `Report` from its result (what chose, what tested, the classes with their
verdicts, the per-stratum table, faithfulness) and every format shows the same content.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from circuits.output import write_output
from interp.viz import html_page, html_table

FORMATS = ("table", "json", "markdown", "html")


@dataclass(kw_only=True)
class Table:
    """Rows of cells (text), under `columns`."""

    columns: list[str]
    rows: list[list[str]]


@dataclass(kw_only=True)
class Section:
    """A titled part of a report: lines of text, then an optional table."""

    title: str
    lines: list[str] = field(default_factory=list)
    table: Table | None = None


@dataclass(kw_only=True)
class Report:
    title: str
    headline: list[str]
    sections: list[Section]


def print_report(report: Report, console: Console) -> None:
    """The report on a terminal (rich)."""
    console.print(f"[bold]{report.title}[/bold]", highlight=False)
    for line in report.headline:
        console.print(line, markup=False, highlight=False)
    for section in report.sections:
        console.print(f"\n[bold]{section.title}[/bold]", highlight=False)
        for line in section.lines:
            console.print(line, markup=False, highlight=False)
        if section.table is not None and section.table.rows:
            table = RichTable(*section.table.columns)
            for row in section.table.rows:
                table.add_row(*row)
            console.print(table)


def _markdown_table(table: Table) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    return [
        "| " + " | ".join(map(cell, table.columns)) + " |",
        "|" + "---|" * len(table.columns),
        *("| " + " | ".join(map(cell, row)) + " |" for row in table.rows),
    ]


def render_markdown(report: Report) -> str:
    lines = [f"# {report.title}", "", *report.headline]
    for section in report.sections:
        lines += ["", f"## {section.title}", ""]
        lines += [f"{line}  " for line in section.lines]
        if section.table is not None and section.table.rows:
            lines += ["", *_markdown_table(section.table)]
    return "\n".join(lines) + "\n"


def html_fragments(report: Report) -> list[str]:
    """The report's headline and sections as HTML fragments (for a page of its own or another's)."""
    parts = ["<p>" + "<br>".join(html.escape(line) for line in report.headline) + "</p>"]
    for section in report.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.lines:
            parts.append(
                "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in section.lines) + "</ul>"
            )
        if section.table is not None and section.table.rows:
            parts.append(html_table(section.table.columns, section.table.rows))
    return parts


def render_html(report: Report, extra: Sequence[str] = ()) -> str:
    """The report as an offline HTML page; `extra`: more HTML sections (e.g. a figure) at the end."""
    return html_page(report.title, [*html_fragments(report), *extra])


def render_json(report: Report) -> str:
    return json.dumps(asdict(report), indent=2, allow_nan=False)


def write_sections(report: Report, format: str, out: str | Path | None, console: Console) -> None:
    """Render `report` in `format` to the file `out` (atomically), or to the console when out is None."""
    renderers = {"json": render_json, "markdown": render_markdown, "html": render_html}
    write_output(
        format, FORMATS, out, console, lambda c: print_report(report, c), lambda f: renderers[f](report), 160
    )
