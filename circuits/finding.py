"""The one result of every analysis that judges head classes, and its one report.

    finding = hop_report(model)                      # IOI, retrieval, ICL, function vectors, hop
    finding.classes                                  # each class as `evidence.judge_class` judged it
    write_finding_report(finding, "markdown", None, console)

A `Finding` holds what every analysis reports the same way: the model, what chose and what tested,
the classes judged against random same-layer heads on held-out families, faithfulness, timings; and
the analysis's own figures in `extras`, an `Extras` that also says how they read (its title,
headline, the classes' own columns, its own sections: the IOI diagram, the hop chain, heat maps).
The report is the standard sections in one order, the analysis's sections after them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rich.console import Console

from circuits.evidence import EFFECT_SIGN, ClassVerdict, StratumFaithfulness, holm
from circuits.sections import (
    FORMATS,
    ClassView,
    Report,
    Section,
    class_sections,
    correction_headline,
    faithfulness_section,
    write_sections,
)
from interp.interventions.stats import FaithfulnessSummary

# an analysis -> the command that runs it, where they differ
ANALYSIS_COMMANDS = {"fv": "icl --fv", "path": "circuit"}


class Extras:
    """An analysis's own figures (a dataclass subclassing this) and how its report reads them. Each
    method has the finding the extras belong to. wide_terminal: the terminal columns from which the
    "table" format shows the wide report; file_width: the columns of the "table" format in a file;
    formats: those its finding renders to (`data` makes those beyond `sections.FORMATS`);
    terminal_options: the defaults of its own options of the "table" format (`write_finding_report`)."""

    wide_terminal: ClassVar[int] = 0
    file_width: ClassVar[int] = 140
    formats: ClassVar[tuple[str, ...]] = FORMATS
    terminal_options: ClassVar[dict[str, Any]] = {}

    def title(self, finding: Finding) -> str:
        raise NotImplementedError

    def headline(self, finding: Finding) -> list[str]:
        raise NotImplementedError

    def chose_lines(self, finding: Finding) -> list[str]:
        """Lines of "What chose and what tested" after the families: the sizes, the seed's draws."""
        return []

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        """`wide`: every column; narrower for a terminal under `wide_terminal` columns."""
        return ClassView()

    def faithfulness_kept(self, finding: Finding) -> str:
        """What the faithfulness kept and what it ablated, in words."""
        return "the classes' heads kept, every other head ablated"

    def discovery_sections(self, finding: Finding, wide: bool, **options: Any) -> list[Section]:
        """The analysis's own sections on what discovery found, before the held-out classes. options:
        its own terminal options (`write_finding_report`'s), in the terminal report only."""
        return []

    def extra_sections(self, finding: Finding, wide: bool, **options: Any) -> list[Section]:
        """The analysis's own sections after the standard ones (options: as `discovery_sections`)."""
        return []

    def data(self, finding: Finding) -> dict[str, Callable[[], str]]:
        """Its own data formats beyond `sections.FORMATS` (those of `formats`): {"csv": text maker}."""
        return {}

    def json_fields(self, finding: Finding) -> dict[str, Any]:
        """What `--format json` holds of the extras: every field (and figures derived from them)."""
        return dict(vars(self))


@dataclass(kw_only=True)
class Finding:
    """An analysis's result. chose / tested: each axis of families ("relations", "templates", "tasks",
    "documents", "sequences") -> the families that chose the heads and those that tested them;
    classes: in report order; faithfulness: held out, with its strata (None: the analysis has none);
    extras: its own figures."""

    analysis: str  # "ioi", "retrieval", "icl", "fv", "hop", "path" (the head classes of `interp circuit`)
    model: str
    provenance: str  # interp.provenance(model)
    settings: Any  # the analysis's settings (its seed among them)
    chose: dict[str, list[str]]
    tested: dict[str, list[str]]
    classes: list[ClassVerdict]
    faithfulness: FaithfulnessSummary | None = None
    faithfulness_strata: list[StratumFaithfulness] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    extras: Extras

    @property
    def command(self) -> str:
        """The `interp` command that makes it ("hop", "icl --fv", ...)."""
        return ANALYSIS_COMMANDS.get(self.analysis, self.analysis)

    def verdict(self, name: str) -> ClassVerdict:
        """The class `name` (KeyError naming the classes there where it has none)."""
        for found in self.classes:
            if found.name == name:
                return found
        raise KeyError(f"no class {name!r}; the classes are {', '.join(c.name for c in self.classes)}")

    def json_data(self) -> dict[str, Any]:
        """What `--format json` holds: every standard field, the effects' sign, whether each class's pooled
        effect beyond random survives Holm's correction over them (`evidence.holm`, in the order of
        "classes": true, false, null where its resamples cannot tell; null for the whole in a file
        without p-values), the extras' fields."""
        standard = {name: value for name, value in vars(self).items() if name != "extras"}
        corrected = holm(self.classes)
        return {**standard, "effect_sign": EFFECT_SIGN, "holm": corrected, **self.extras.json_fields(self)}

    def family_lines(self) -> list[str]:
        """ "chose: templates T0, T1; names ..." and "tested: ...": the families of each side by axis."""
        return [
            f"{side}: "
            + ("; ".join(f"{axis} {', '.join(names)}" for axis, names in split.items()) or "none named")
            for side, split in (("chose", self.chose), ("tested", self.tested))
        ]


def finding_report(finding: Finding, wide: bool = True, **options: Any) -> Report:
    """The report: the analysis's headline (and the classes Holm's correction drops, where it drops any:
    `correction_headline`), what chose and what tested, the analysis's sections on what discovery found,
    the standard sections (the classes with their verdicts, the per-stratum and per-family table,
    faithfulness where the analysis measures it), then the analysis's own sections. `wide`: every column
    (see `Extras.class_view`); options: the analysis's own, which its sections take
    (`Extras.discovery_sections`)."""
    extras = finding.extras
    chose = Section(
        title="What chose and what tested",
        lines=[
            *finding.family_lines(),
            *extras.chose_lines(finding),
            f"Model: {finding.provenance}.",
        ],
    )
    held_out = class_sections(finding.classes, extras.class_view(finding, wide))
    if finding.faithfulness is not None:
        kept = extras.faithfulness_kept(finding)
        held_out.append(faithfulness_section(finding.faithfulness, finding.faithfulness_strata, kept))
    return Report(
        title=extras.title(finding),
        headline=[*extras.headline(finding), *correction_headline(finding.classes)],
        sections=[
            chose,
            *extras.discovery_sections(finding, wide, **options),
            *held_out,
            *extras.extra_sections(finding, wide, **options),
        ],
    )


def write_finding_report(
    finding: Finding, format: str, out: str | Path | None, console: Console, wide: bool | None = None,
    **options: Any,
) -> None:  # fmt: skip
    """Render `finding` in `format` (one of its extras' `formats`) to the file `out`, or to the console
    when out is None. The "table" format is wide where it has the extras' `wide_terminal` columns (a
    file: `file_width`), else narrower; wide=True asks for it (said where it does not fit), False
    refuses it. options: the analysis's own options of that report (`interp heads --all`; default: the
    extras' `terminal_options`)."""
    extras = finding.extras
    width = extras.file_width if out is not None or console is None else console.width
    fits = width >= extras.wide_terminal
    if format == "table" and wide and not fits:
        others = ", ".join(name for name in extras.formats if name != "table")
        console.print(
            f"--wide needs {extras.wide_terminal} columns and this terminal has {width}: showing the compact "
            f"table. Widen the terminal, or use --format {others} for every column."
        )
    if format == "table":  # the terminal's report only: the other formats render the full one
        options = {**extras.terminal_options, **options}
        report = finding_report(finding, wide=fits if wide is None else wide and fits, **options)
    else:
        report = finding_report(finding)
    write_sections(report, format, out, console, finding, extras.data(finding), width=extras.file_width)
