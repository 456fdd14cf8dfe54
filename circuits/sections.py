"""One report structure: a headline and sections of lines, a table, notes and figures, rendered once
to the terminal, Markdown and HTML; and one JSON of any result (`result_json`).

    report = Report(title="...", headline=["..."], sections=[Section(title="Classes", table=Table(...))])
    write_sections(report, "markdown", out=None, console=console, result=result)

An analysis builds a `Report` from its result (what chose, what tested, the classes with their
verdicts, the per-stratum table, faithfulness, the figures) and every format shows the same content;
figures (heat maps, SVGs: HTML fragments) show on the HTML page only. The JSON holds the result's
numbers, never text made of them. The standard sections are here: the classes judged by
`circuits.evidence.judge_class` with their verdicts and their per-stratum and per-family table
(`class_sections`, every analysis's) and faithfulness (`faithfulness_section`); `circuits.finding`
builds the one report of a `Finding` from them.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from circuits.evidence import (
    CI_TAIL,
    DEPENDENCE_ALPHA,
    MIN_STRATUM_PROMPTS,
    P_RESAMPLES,
    TOO_FEW_FAMILIES,
    TOO_FEW_PROMPTS,
    ClassVerdict,
    StratumDrop,
    StratumFaithfulness,
    ci_verdict,
    faithfulness_verdict,
    holm,
    too_few,
)
from circuits.output import check_format
from interp.interventions.stats import FaithfulnessSummary
from interp.io.files import write_text_atomic
from interp.io.serialize import plain
from interp.viz import heatmap_html, html_page, html_table

FORMATS = ("table", "json", "markdown", "html")


@dataclass(kw_only=True)
class Table:
    """Rows of cells (text), under `columns`; the columns named in `right` (numbers) align right."""

    columns: list[str]
    rows: list[list[str]]
    right: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Section:
    """A titled part of a report: lines of text, an optional table, notes under it (legends, hints:
    dim on a terminal), and figures (HTML fragments: the HTML page only)."""

    title: str
    lines: list[str] = field(default_factory=list)
    table: Table | None = None
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class Report:
    title: str
    headline: list[str]
    sections: list[Section]


def signed(value: float, digits: int = 3) -> str:
    """A signed figure as reports write it: "+0.123" ("n/a" for NaN: a figure that could not be had);
    a value that is not 0 never reads "+0.00": more decimals (up to 6) until it shows (below 1e-6 it does)."""
    if math.isnan(value):
        return "n/a"
    shown = next((d for d in range(digits, 7) if round(value, d) != 0), digits)  # below 1e-6: as 0
    return f"{value:+.{shown}f}"


def ci_text(
    interval: tuple[float, float], digits: int = 3, sign: bool = True, apart_from: float | None = None
) -> str:
    """A confidence interval as reports write it: "[-0.012, +0.345]" (each bound as `signed`), or
    without signs "[0.01, 0.35]"; "(no CI)" for NaN bounds (one prompt, or an undefined statistic).
    apart_from: a value the interval is read against (a patch's unpatched 1): where the interval excludes
    it, more decimals (up to 6) until neither bound reads as it (0.9997 as "0.9997", not "1.000")."""
    low, high = interval
    if math.isnan(low) or math.isnan(high):
        return "(no CI)"
    if apart_from is not None and not low <= apart_from <= high:
        digits = next(
            (d for d in range(digits, 7) if apart_from not in (round(low, d), round(high, d))), digits
        )
    if sign:
        return f"[{signed(low, digits)}, {signed(high, digits)}]"
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def value_ci(value: float, interval: tuple[float, float] | None, digits: int = 3) -> str:
    """A signed figure with its CI: "+0.123 [+0.010, +0.250]"; with no CI (a stratum of too few
    prompts) "+0.123 (too few prompts)"."""
    shown_ci = f"({TOO_FEW_PROMPTS})" if interval is None else ci_text(interval, digits)
    return f"{signed(value, digits)} {shown_ci}"


def held_out_drop(found: ClassVerdict, digits: int = 3) -> str:
    """A class's held-out drop with its CI: "+0.123 [+0.010, +0.250]"."""
    return value_ci(found.heldout.drop, found.heldout.drop_ci, digits)


def random_effects_text(found: ClassVerdict, digits: int = 3) -> str:
    """A class's random sets' held-out effects: "+0.012, -0.003, ..."."""
    return ", ".join(f"{effect:+.{digits}f}" for effect in found.random_effects)


def percent_ci(interval: tuple[float, float], digits: int = 0) -> str:
    """A CI of a fraction in %, the unit of the value it goes with: "[12%, 34%]"; "(no CI)" for NaN bounds."""
    if any(math.isnan(bound) for bound in interval):
        return "(no CI)"
    return f"[{interval[0]:.{digits}%}, {interval[1]:.{digits}%}]"


def text_sections(report: Report) -> list[Section]:
    """The sections with text to show (those of figures only show on the HTML page)."""
    return [s for s in report.sections if s.lines or s.notes or (s.table is not None and s.table.rows)]


def layer_head_map(grid, title: str, caption: str, **options) -> str:
    """A figure: the heat map of `grid` [n_layers, n_heads] (HTML); options: those of
    `interp.viz.heatmap_html` (signed, limit, value_format)."""
    layers, heads = (list(map(str, range(n))) for n in grid.shape)
    return heatmap_html(grid, layers, heads, title, caption=caption, **options)


def print_report(report: Report, console: Console) -> None:
    """The report on a terminal (rich)."""
    console.print(Text(report.title, style="bold"))
    for line in report.headline:
        console.print(line, markup=False, highlight=False)
    for section in text_sections(report):
        console.print(Text("\n" + section.title, style="bold"))
        for line in section.lines:
            console.print(line, markup=False, highlight=False)
        if section.table is not None and section.table.rows:
            table = RichTable()
            for column in section.table.columns:
                justify = "right" if column in section.table.right else "left"
                table.add_column(Text(column), justify=justify, overflow="fold")  # long cells wrap, never cut
            for row in section.table.rows:
                table.add_row(*map(Text, row))  # text, not markup: "[CI]" is shown as it is
            console.print(table)
        for note in section.notes:
            console.print(note, style="dim", markup=False, highlight=False)


def markdown_text(text: str) -> str:
    """Text as Markdown shows it literally: '<' as an entity outside `code spans` (a reader "a3.h2<v>",
    a family named "<script>" or "<b>" is text, not HTML), and '&' where it would begin one ("&amp;");
    newlines as spaces (a line or table row stays one). A code span shows its text as it is."""
    text = text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    parts = text.split("`")  # odd parts are inside code spans (an unpaired ` last: escaped as text)
    inside = len(parts) % 2 == 1

    def escaped(part: str) -> str:
        return re.sub(r"&(?=#?\w+;)", "&amp;", part).replace("<", "&lt;")

    return "`".join(
        part if i % 2 and (inside or i < len(parts) - 1) else escaped(part) for i, part in enumerate(parts)
    )


def _markdown_table(table: Table) -> list[str]:
    def cell(text: str) -> str:
        return markdown_text(text).replace("|", "\\|")

    return [
        "| " + " | ".join(map(cell, table.columns)) + " |",
        "|" + "".join("---:|" if column in table.right else "---|" for column in table.columns),
        *("| " + " | ".join(map(cell, row)) + " |" for row in table.rows),
    ]


def render_markdown(report: Report) -> str:
    text = markdown_text
    lines = [f"# {text(report.title)}", "", *(f"{text(line)}  " for line in report.headline)]
    for section in text_sections(report):
        lines += ["", f"## {text(section.title)}"]
        if section.lines:
            lines += ["", *(f"- {text(line)}" for line in section.lines)]
        if section.table is not None and section.table.rows:
            lines += ["", *_markdown_table(section.table)]
        for note in section.notes:
            lines += ["", text(note)]
    return "\n".join(lines) + "\n"


def render_html(report: Report) -> str:
    """The report as an offline HTML page: the headline, then every section with its figures."""
    parts = ["<p>" + "<br>".join(html.escape(line) for line in report.headline) + "</p>"]
    for section in report.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.lines:
            parts.append(
                "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in section.lines) + "</ul>"
            )
        if section.table is not None and section.table.rows:
            parts.append(html_table(section.table.columns, section.table.rows))
        parts += [f'<p class="legend">{html.escape(note)}</p>' for note in section.notes]
        parts += section.figures
    return html_page(report.title, parts)


def result_json(result: Any) -> str:
    """The `--format json` output of any command's result: `result.json_data()` where its type has one
    (figures derived from its fields, a schema of its own), else every field of the result, as plain
    JSON (`interp.io.serialize.plain`): numbers stay numbers (a CI is [low, high]), tensors are
    nested lists, NaN and infinities null. `--save` writes the full result instead, to be read back."""
    data = result.json_data() if hasattr(result, "json_data") else result
    return json.dumps(plain(data), indent=2, allow_nan=False)


def write_sections(
    report: Report, format: str, out: str | Path | None, console: Console, result: Any,
    data: Mapping[str, Callable[[], str]] | None = None, width: int = 160,
) -> None:  # fmt: skip
    """Render `report` in `format` to the file `out` (atomically), or to the console when out is None;
    the "json" format is `result_json(result)`. data: formats an analysis writes as its own data
    ({"csv": ...}); width: the columns of the "table" format written to a file."""
    renderers = {"json": lambda: result_json(result), "markdown": lambda: render_markdown(report),
                 "html": lambda: render_html(report), **(data or {})}  # fmt: skip
    check_format(format, ("table", *renderers), out)
    if format == "table":
        target = console if out is None else Console(file=io.StringIO(), width=width)
        print_report(report, target)
        if out is not None:
            write_text_atomic(out, target.file.getvalue())
    elif out is None:
        console.print(renderers[format](), markup=False, highlight=False, emoji=False, soft_wrap=True)
    else:
        text = renderers[format]()
        write_text_atomic(out, text if text.endswith("\n") else text + "\n")  # a text file ends its last line


def faithfulness_section(
    summary: FaithfulnessSummary,
    strata: Sequence[StratumFaithfulness],
    what: str,
    title: str = "Faithfulness (held out)",
) -> Section:
    """The one faithfulness section: the ratio of means with its CI beside the per-prompt error and the
    share of prompts within ±20%, pooled and per stratum ("too few prompts" where a stratum has
    fewer than `MIN_STRATUM_PROMPTS`), and the verdict (an overshoot named). `what`: what was kept
    and what ablated, in words."""
    rows = [["all", "pooled", *_faithfulness_cells(summary.n_prompts, summary)]]
    rows += [[s.kind, s.name, *_faithfulness_cells(s.n_prompts, s.summary)] for s in strata]
    return Section(
        title=title,
        lines=[f"{what}: {faithfulness_verdict(summary, strata)}"],
        table=Table(
            columns=["kind", "name", "prompts", "faithfulness", "95% CI", "per-prompt error", "within ±20%"],
            rows=rows,
            right=["prompts", "faithfulness", "per-prompt error", "within ±20%"],
        ),
        notes=[
            "faithfulness = (m(kept) - m(all ablated)) / (m(model) - m(all ablated)), means over prompts; "
            "per-prompt error = mean |m(kept) - m(model)| / |m(model) - m(all ablated)| (0: exact); within "
            "±20%: the share of prompts whose own faithfulness is within 1 ± 0.2",
        ],
    )


def _faithfulness_cells(n_prompts: int, summary: FaithfulnessSummary | None) -> list[str]:
    if summary is None:
        reason = TOO_FEW_PROMPTS if n_prompts < MIN_STRATUM_PROMPTS else "undefined (no effect to keep)"
        return [str(n_prompts), reason, "", "", ""]

    def shown(value: float, spec: str) -> str:  # NaN: a figure an older file does not hold
        return "n/a" if math.isnan(value) else format(value, spec)

    interval = ci_text(summary.ratio_ci, 2, sign=False)
    if math.isnan(summary.ratio_ci[0]):  # 2 or 3 families resampled first, or a figure an older file lacks
        interval = TOO_FEW_FAMILIES if summary.too_few_families else "n/a"
    return [str(n_prompts), shown(summary.ratio, ".2f"), interval, shown(summary.error, ".2f"),
            shown(summary.within, ".0%")]  # fmt: skip


@dataclass(kw_only=True)
class ClassView:
    """How an analysis's classes read in the standard class sections (`class_sections`): its own
    columns (title, the cell of a class), what a class's figure is ("drop", "gain"), when a stratum
    holds (`evidence.Strata.by_ci`), the figures' decimals, the legend and figures under the classes'
    table, the notes under the strata's."""

    columns: Sequence[tuple[str, Callable[[ClassVerdict], str]]] = ()
    effect: str = "drop"
    holds: str = "its mean beyond random points the class's way"
    digits: int = 2
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    strata_notes: list[str] = field(default_factory=list)


OTHER_LAYERS = "; its random sets take heads from other layers too (its layers have too few others)"
ONE_RANDOM_SET = "; its random sets are all the same heads (its layers have no others to draw from)"
SHORT_RANDOM_SETS = (
    "; unconfirmed whatever its effect: its random sets have fewer heads than it (the model has too few "
    "heads outside the classes to draw from)"
)


def _class_line(found: ClassVerdict) -> str:
    """A class's verdict and note, why it is unconfirmed where its pooled effect is beyond random (a kind
    of strata none of which holds alone, or the analysis's other evidence), and what its random sets
    could not be: all of its layers, or more than one set of heads."""
    line = f"{found.name}: {found.verdict}; {found.note}"
    pooled = found.has_ci and ci_verdict(found.heldout.beyond_ci, found.sign) == "confirmed"
    enough = not found.too_few and not found.random_sets_short  # else: the note says why
    if pooled and enough and found.verdict == "unconfirmed":
        line += f" (unconfirmed: {found.unconfirmed_because})"
    return (
        line
        + ("" if found.random_same_layers or found.no_random_heads else OTHER_LAYERS)
        + (ONE_RANDOM_SET if found.one_random_set else "")
        + (SHORT_RANDOM_SETS if found.random_sets_short and not found.no_random_heads else "")
    )


NO_P_VALUES = (
    "This file holds no p-values (saved before 2026-12-02): rerun its command for Holm's correction."
)


@dataclass(kw_only=True)
class Correction:
    """Holm's correction over a report's judged classes (`evidence.holm`): the classes judged (with a
    held-out CI), those confirmed (or <kind>-dependent), and of those the ones it drops and the ones
    whose resamples cannot tell; held: None for a file without p-values."""

    judged: list[ClassVerdict]
    claimed: list[ClassVerdict]
    lost: list[ClassVerdict]
    unsure: list[ClassVerdict]
    held: list[bool | None] | None  # per judged class (`evidence.holm`)

    @classmethod
    def of(cls, classes: Sequence[ClassVerdict]) -> Correction:
        """The correction over `classes` (a report's, in its order)."""
        judged = [c for c in classes if c.has_ci]
        held = holm(judged)
        claims = [c.verdict == "confirmed" or c.verdict.endswith("-dependent") for c in judged]
        per_class = [True] * len(judged) if held is None else held  # no p-values: none dropped, none unsure
        outcome = list(zip(judged, claims, per_class, strict=True))
        claimed = [c for c, claim, _ in outcome if claim]
        lost = [c for c, claim, holds in outcome if claim and holds is False]
        unsure = [c for c, claim, holds in outcome if claim and holds is None]
        return cls(judged=judged, claimed=claimed, lost=lost, unsure=unsure, held=held)

    def dropped(self) -> str:
        """ "not A (p 0.016); the resamples cannot tell for B (p < 0.0097)": the claimed classes it
        drops and those it cannot tell ("" where none)."""
        parts = [f"not {', '.join(f'{c.name} (p {c.p:.2g})' for c in self.lost)}"] if self.lost else []
        if self.unsure:
            parts.append(
                "the resamples cannot tell for " + ", ".join(f"{c.name} (p < {c.p:.2g})" for c in self.unsure)
            )
        return "; ".join(parts)


def correction_headline(classes: Sequence[ClassVerdict]) -> list[str]:
    """The headline's line where Holm's correction over two or more classes drops a confirmed class or
    cannot tell (none otherwise: the classes section has the correction in full)."""
    correction = Correction.of(classes)
    if len(correction.judged) < 2 or not correction.dropped():
        return []
    return [f"Corrected for the {len(correction.judged)} classes judged (Holm): {correction.dropped()}."]


def multiplicity_lines(classes: Sequence[ClassVerdict]) -> list[str]:
    """Where two or more classes have a held-out CI: that each is judged alone, how many of them chance
    alone could confirm, and which of those confirmed keep their pooled effect after Holm's correction
    over them (`evidence.holm`; a file without p-values says so)."""
    correction = Correction.of(classes)
    judged, claimed = correction.judged, correction.claimed
    if len(judged) < 2:
        return []
    chance = (
        f"{len(judged)} classes judged, each alone: one with no effect beyond random heads has its 95% CI "
        f"beyond 0 in its direction at most about {CI_TAIL:.1%} of the time, so up to about "
        f"{CI_TAIL * len(judged):.1f} of them could be confirmed by chance if none had an effect."
    )
    if correction.held is None:
        return [f"{chance} {NO_P_VALUES}"]
    kept = len(claimed) - len(correction.lost) - len(correction.unsure)
    if not claimed:
        outcome = "no class is confirmed (or <kind>-dependent), so there is none to correct"
    elif kept == len(claimed):
        outcome = "every class confirmed (or <kind>-dependent) keeps its pooled effect beyond random heads"
    else:
        outcome = (f"{kept} of the {len(claimed)} classes confirmed (or <kind>-dependent) keep their pooled "
                   f"effect beyond random heads; {correction.dropped()}")  # fmt: skip
        if correction.unsure:
            outcome += (
                ": none of their resamples lay on the other side of 0, and with so few held-out units the "
                "least p they can show is above the correction's threshold"
            )
    return [
        f"{chance} Holm's correction over the {len(judged)} (familywise error at most {CI_TAIL:.1%}, "
        f"one-sided as each CI; p: the column): {outcome}."
    ]


def _p_cell(found: ClassVerdict) -> str:
    """A class's p: "0.012", "< 0.0017" where it is only a bound, "n/a" where the file holds none."""
    return "n/a" if math.isnan(found.p) else f"{'< ' * found.p_bound}{found.p:.2g}"


def split_verdict_lines(classes: Sequence[ClassVerdict], digits: int) -> list[str]:
    """A line naming the classes whose p and 95% CI fall on two sides of the 95% level: in files saved
    before both came from `evidence.beyond_p`'s resamples, an effect at the level's edge; since, one
    within a resample of it."""
    split = [
        c for c in classes
        if c.has_ci and not math.isnan(c.p) and not c.too_few
        and (ci_verdict(c.heldout.beyond_ci, c.sign) == "confirmed") != (c.p < CI_TAIL)
    ]  # fmt: skip
    if not split:
        return []
    named = ", ".join(f"{c.name} (CI {ci_text(c.heldout.beyond_ci, digits)}, p {_p_cell(c)})" for c in split)
    return [
        f"p and the 95% CI fall on two sides of the 95% level for {named}: an effect at the level's edge "
        f"(within a resample of it, or in a file saved before both came from the same {P_RESAMPLES:,} "
        "resamples); the verdict follows the CI."
    ]


def _few_families(found: ClassVerdict) -> bool:
    """Whether the class or one of its strata has no verdict for its 2 or 3 families resampled first (a
    file saved before 2026-12-04: `evidence.too_few`)."""
    return any(too_few(x.n_prompts, x.n_families) == TOO_FEW_FAMILIES for x in [found.heldout, *found.strata])


def _holds_cell(stratum: StratumDrop) -> str:
    """Whether a stratum holds: yes, no, or why it has no verdict (too few prompts, or a figure that
    is not finite: no baseline, a NaN effect)."""
    if stratum.holds is None:
        return too_few(stratum.n_prompts, stratum.n_families) or "undefined"
    return "yes" if stratum.holds else "no"


UNTESTED = "not tested"  # a "<kind>-dependent" verdict of a file saved before the dependence test


def _untested(found: ClassVerdict) -> bool:
    """Whether `found` is "<kind>-dependent" without a p for the kind (saved before 2026-12-01's test)."""
    kind = found.verdict.removesuffix("-dependent")
    return found.verdict.endswith("-dependent") and kind not in found.differ_p


def _kind_differs(found: ClassVerdict) -> list[str]:
    """Per stratum of `found`: its kind's `differ_p` on the kind's first stratum ("not tested" for the
    kind of a verdict judged before the test), else ""."""
    to_show = {kind: f"{p:.2g}" for kind, p in found.differ_p.items()}  # kind -> its cell, until shown
    if _untested(found):
        to_show[found.verdict.removesuffix("-dependent")] = UNTESTED
    return [to_show.pop(stratum.kind, "") for stratum in found.strata]  # on each kind's first stratum only


def class_sections(classes: Sequence[ClassVerdict], view: ClassView) -> list[Section]:
    """The standard sections of classes judged by `circuits.evidence.judge_class`, as `view` reads them:
    each class with its verdict (its effect beyond random same-layer sets held out, with the CI, beside
    the same figure on the prompts that chose it) and the per-stratum and per-family table. Where no
    class has a figure on the prompts that chose it, the table has no column for it."""
    details, digits = view.columns, view.digits
    chose = any(c.discovery is not None for c in classes)
    beyond = f"{view.effect} beyond random"
    figures = [f"{beyond} (chose)", "held out"] if chose else [f"{beyond} (held out)"]

    def chosen(c: ClassVerdict) -> list[str]:  # its cell of the "(chose)" column, where there is one
        if not chose:
            return []
        return ["held out only" if c.discovery is None else signed(c.discovery.beyond, digits)]

    table = Table(
        columns=["class", "heads", *[title for title, _ in details], *figures, "95% CI", "p", "verdict"],
        rows=[
            [c.name, " ".join(c.heads), *[cell(c) for _, cell in details], *chosen(c),
             signed(c.heldout.beyond, digits), ci_text(c.heldout.beyond_ci, digits),
             _p_cell(c), c.verdict]
            for c in classes
        ],
    )  # fmt: skip
    head_classes = Section(
        title="Head classes (held out)",
        lines=[_class_line(c) for c in classes]
        + split_verdict_lines(classes, digits)
        + multiplicity_lines(classes)
        or ["no head was kept"],
        table=table,
        notes=view.notes,
        figures=view.figures,
    )
    strata = Section(
        title="Per stratum and family (held out)",
        lines=[
            f"a stratum holds when {view.holds}; one of fewer than {MIN_STRATUM_PROMPTS} prompts has no CI "
            f"and no verdict ('{TOO_FEW_PROMPTS}') and does not count in the class's verdict; kind differs: "
            "the permutation p that the kind's strata share one effect (a class is <kind>-dependent only "
            f"below {DEPENDENCE_ALPHA})"
        ]
        + (
            ["no class was kept, so none is judged per stratum or family"] if not classes
            else [] if any(c.strata for c in classes)
            else ["no strata or families: each class is judged pooled"]
        )  # fmt: skip
        + (
            [f"a class or stratum whose prompts are of 2 or 3 families, resampled first (a file saved before "
             f"2026-12-04), has no CI and no verdict either ('{TOO_FEW_FAMILIES}'): the least p so few "
             f"families can show is above {CI_TAIL}, and the range of their resamples is narrower than a 95% "
             "CI of so few; now their prompts are resampled within each family, the verdict about them"]
            if any(_few_families(c) for c in classes) else []
        )  # fmt: skip
        + (
            [f"{', '.join(c.name for c in classes if _untested(c))}: judged before the dependence test (a "
             f"file saved before 2026-12-01; '{UNTESTED}'): <kind>-dependent there means a stratum of the "
             "kind fell short, whether or not the strata differ"]
            if any(_untested(c) for c in classes) else []
        ),  # fmt: skip
        table=Table(
            columns=["class", "kind", "name", "prompts", beyond, "95% CI", "holds", "kind differs, p"],
            rows=[
                [c.name, s.kind, s.name, str(s.n_prompts), signed(s.beyond, digits),
                 "" if s.beyond_ci is None else ci_text(s.beyond_ci, digits),
                 _holds_cell(s), differs]
                for c in classes
                for s, differs in zip(c.strata, _kind_differs(c), strict=True)
            ],
        ),
        notes=view.strata_notes,
    )  # fmt: skip
    return [head_classes, strata]
