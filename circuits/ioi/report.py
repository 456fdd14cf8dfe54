"""An IOICircuitResult as the one report (`circuits.sections`: terminal, Markdown, HTML; JSON:
`IOICircuitResult.json_data`): the finding first, then what chose and what tested, the heads, each
class against random heads (pooled, per name order and template: the standard sections,
`circuits.sections.class_sections`), minimality; the HTML page adds the circuit's diagram
(`ioi_circuit_diagram`), heat maps and attention patterns."""

from __future__ import annotations

import html
import statistics

from rich.console import Console

from circuits.evidence import EFFECT_SIGN, ClassVerdict
from circuits.ioi.results import CLASS_ATTENTION, CLASS_KIND, CLASSES, HeadEvidence, IOICircuitResult
from circuits.sections import FORMATS as FORMATS  # the formats `interp render` offers
from circuits.sections import (
    Report,
    Section,
    Table,
    ci_text,
    class_sections,
    faithfulness_section,
    layer_head_map,
    percent_ci,
    signed,
    write_sections,
)
from interp.types import head_label
from interp.viz import attention_patterns_html

CLASS_TITLES = {
    "name_mover": "Name movers", "negative_name_mover": "Negative name movers",
    "backup_name_mover": "Backup name movers", "s_inhibition": "S-inhibition",
    "s_suppression": "S-suppression", "induction": "Induction", "duplicate_token": "Duplicate-token",
    "previous_token": "Previous-token",
}  # fmt: skip
STEP_TITLES = {
    "logits": "heads -> logits (direct path)",
    "name_mover_queries": "heads -> name movers' queries at END",
    "s_suppression_queries": "heads -> S-suppression heads' queries at END",
    "s_inhibition_values": "heads -> S-inhibition values at S2",
    "induction_keys": "heads -> induction keys at S1+1",
    "logits_without_name_movers": "heads -> logits, name movers mean-ablated",
    "backup_growth": "growth of the direct effect when name movers are ablated",
}
VERDICT_WORDS = {  # a held-out verdict -> how the headline says it
    "confirmed": "confirmed on held-out prompts",
    "order-dependent": "order-dependent (hold in one name order only)",
    "template-dependent": "template-dependent (hold in few templates)",
    "unconfirmed": "unconfirmed (no larger effect than random heads)",
}
HEADLINE_UNCLASSIFIED = 3  # unclassified heads the headline names, largest |effect| first
UNCONFIRMED_MARK = "*"  # after a class held-out validation did not confirm (the headline says why)
UNCONFIRMED_NOTE = f"{UNCONFIRMED_MARK} not confirmed on held-out prompts: see the first lines."
WIDE_TERMINAL = 120  # columns from which the terminal table shows how each head was found
FILE_WIDTH = 140  # columns of the "table" format written to a file


def _z(z: float) -> str:
    """A robust z: one decimal below 10, whole numbers beyond (a head that matters scores in the tens)."""
    return f"{z:+.1f}" if abs(z) < 10 else f"{z:+.0f}"


def _count(n: int, noun: str) -> str:
    """ "1 head", "5 heads"."""
    return f"{n} {noun}{'s' * (n != 1)}"


def _by_size(heads: list[HeadEvidence]) -> list[HeadEvidence]:
    return sorted(heads, key=lambda h: -abs(h.effect))


def _effects(heads: list[HeadEvidence]) -> str:
    """ "L29H1 +29.9%, L29H0 -22.5%": heads with their path-patching effects."""
    return ", ".join(f"{h.name} {h.effect:+.1%}" for h in heads)


def _summed(heads: list[HeadEvidence]) -> str:
    """ "L29H0 -22.5%, L24H5 -8.6%: -31.1% together" ("none" for no head)."""
    return f"{_effects(heads)}: {sum(h.effect for h in heads):+.1%} together" if heads else "none"


def _where(c: ClassVerdict) -> str:
    """Where a class holds: "BABA only" (order-dependent), "3 of 12 templates" (template-dependent)."""
    if c.verdict == "order-dependent":
        return " and ".join(s.name for s in c.strata if s.kind == "order" and s.holds) + " only"
    templates = [s for s in c.strata if s.kind == "template" and s.holds is not None]
    return f"{sum(s.holds for s in templates)} of {len(templates)} templates"


def _headline(result: IOICircuitResult) -> list[str]:
    """The circuit's size and what it recovers, its classes by held-out verdict, the unclassified heads."""
    s, e, v = result.settings, result.evaluation, result.validation
    n_classes = sum(1 for heads in result.classes.values() if heads)
    lines = [f"IOI circuit of {s.model}: {len(result.heads)} heads in {n_classes} classes"]
    if v is not None:
        lines[0] += (
            f"; on {v.n_prompts} held-out prompts it recovers {v.recovered:.0%} of the logit diff "
            f"(95% CI {v.recovered_ci[0]:.0%} to {v.recovered_ci[1]:.0%})."
        )
        for verdict, words in VERDICT_WORDS.items():
            named = [
                cls if verdict in ("confirmed", "unconfirmed") else f"{cls} ({_where(c)})"
                for cls, c in v.classes.items()
                if c.verdict == verdict
            ]
            if named:
                lines.append(f"{words[0].upper()}{words[1:]}: {', '.join(named)}.")
    elif e is not None:
        lines[0] += f"; it recovers {e.recovered:.0%} of the logit diff (not validated on held-out prompts)."
    else:
        lines[0] += " (neither evaluated nor validated)."
    if result.unclassified:
        largest = _by_size(result.unclassified)
        named, more = largest[:HEADLINE_UNCLASSIFIED], len(largest) - HEADLINE_UNCLASSIFIED
        lines.append(
            f"Not among the {len(result.heads)} heads: {_count(len(largest), 'unclassified head')}, selected "
            f"by path patching but attending as no class does: {'the largest ' * (more > 0)}{_effects(named)}"
            + (f" and {more} more" if more > 0 else "")
            + " (path-patching effect)."
        )
    return lines


def _chose_lines(result: IOICircuitResult) -> list[str]:
    """The prompts and rules that chose the heads, the held-out prompts that tested them, the sign."""
    s, v = result.settings, result.validation
    heldout = [] if v is None else [
        f"held out: {v.n_prompts} prompts from {v.prompts}: logit diff {v.logit_diff:.3f}, recovered "
        f"{v.recovered:.1%} (95% CI {percent_ci(v.recovered_ci, 1)}), faithfulness {v.faithfulness:.1%}"
    ]  # fmt: skip
    return [
        f"chosen on {s.n_prompts} discovery prompts (seed {s.seed}), corrupted distribution {s.corrupted}",
        f"selection: |effect| >= {s.min_effect:.0%} and (|robust z| >= {s.effect_z} or >= {s.min_share:.0%} "
        f"of the step's summed effect in its direction); attention >= min(max(median + {s.attention_z} "
        f"robust SD, {s.min_attention}), {s.large_attention})",
        *heldout,
        f"effects: {EFFECT_SIGN} (path patching: the run with the head's path patched from "
        f"{s.corrupted}; relative to the clean logit diff, in %)",
        f"Model: {s.provenance or s.model}.",
    ]


def _circuit_lines(result: IOICircuitResult) -> list[str]:
    """The model on the discovery prompts, and how much of it the circuit recovers there."""
    b, e = result.baseline, result.evaluation
    lines = [
        f"logit diff (IO - S) {b.logit_diff:.3f} (95% CI {ci_text(b.logit_diff_ci, 2, sign=False)}), "
        f"accuracy {b.accuracy:.1%} (95% CI {percent_ci(b.accuracy_ci, 1)}), top-1 = IO {b.top1_io:.1%}, "
        f"ABC logit diff {b.abc_logit_diff:.3f}",
    ]
    if e is not None:
        lines.append(
            f"recovered {e.recovered:.1%} of the logit diff (circuit {e.circuit_logit_diff:.3f} / model "
            f"{e.model_logit_diff:.3f}), faithfulness {e.faithfulness:.1%} (all heads ablated "
            f"{e.ablated_logit_diff:.3f})"
        )
        lines += [*_unclassified_lines(result), _completeness_line(result)]
    return lines


def _unclassified_lines(result: IOICircuitResult) -> list[str]:
    """The unclassified heads and what keeping them with the circuit does to what it recovers, and why."""
    e, heads = result.evaluation, _by_size(result.unclassified)
    if not heads or e.recovered_with_unclassified is None:
        return []
    before, after = e.recovered, e.recovered_with_unclassified
    lowers = after < before
    helping, against = [h for h in heads if h.effect > 0], [h for h in heads if h.effect < 0]
    net = sum(h.effect for h in heads)
    change = (
        f"keeping {'it' if len(heads) == 1 else 'them'} with the circuit {'lowers' if lowers else 'raises'} "
        f"what it recovers from {before:.1%} to {after:.1%} (faithfulness {e.faithfulness:.1%} to "
        f"{e.faithfulness_with_unclassified:.1%})"
    )
    if lowers != (net < 0):
        reason = (
            f"though their path-patching effects sum to {net:+.1%}: effects measured one head at a time in "
            "the whole model need not add up once every other head is mean-ablated"
        )
    elif not (helping and against):
        reason = ("every one " if len(heads) > 1 else "it ") + (
            "works against IO" if lowers else "helps predict IO"
        )
    else:
        weigh = "outweigh" if lowers else "weigh less than"
        reason = f"those that work against IO ({_summed(against)}) {weigh} those that help "
        reason += f"({_summed(helping)})"
    return [
        f"unclassified: {_count(len(heads), 'head')} selected by path patching whose attention fits no "
        f"class, not counted in the circuit: {_effects(heads)} (path-patching effect; negative: the head "
        f"works against IO); {change}: {reason}"
    ]


def _completeness_line(result: IOICircuitResult) -> str:
    """Completeness (Wang et al.'s) in words: its largest gap, the subset with it, which way it goes."""
    e = result.evaluation
    gaps = [c["gap"] for c in e.completeness]
    worst = max(e.completeness, key=lambda c: c["gap"])
    heads = sorted(tuple(head) for head in worst["heads"])
    names = ", ".join(head_label(*head) for head in heads)
    classes = [cls for cls, members in result.circuit.items() if members and sorted(members) == heads]
    subset = f"the {classes[0]} class ({names})" if classes else f"{len(heads)} of its heads ({names})"
    circuit, model = worst["circuit_logit_diff"], worst["model_logit_diff"]
    way = (
        "heads outside the circuit make up for K in the model, and the circuit lacks them"
        if model > circuit
        else "heads outside the circuit work against IO once K is gone"
    )
    n_classes = sum(1 for members in result.circuit.values() if members)
    return (
        "completeness (Wang et al.): knocking a subset K of the circuit's heads out of the circuit and out "
        "of the whole model should hurt both alike; the gap |F(C\\K) - F(M\\K)| / F(M) (F: the logit diff "
        f"with the heads outside the set mean-ablated; 0: alike) over {len(gaps)} subsets (each of the "
        f"{n_classes} classes and {len(gaps) - n_classes} random subsets) is {max(gaps):.1%} at most "
        f"(median {statistics.median(gaps):.1%}); the largest for K = {subset}: without it the circuit keeps "
        f"a logit diff of {circuit:.3f}, the model {model:.3f}: {way}"
    )


CLASS_LEGEND = (
    "Held out, a class's drop is (clean - mean-ablated logit diff) / the unablated held-out logit diff "
    "(0.10: 10%) when its heads, or as many random heads from the same layers outside the circuit, are "
    "mean-ablated; positive: the class helps predict IO (negative name movers: negative)."
)
HOLDS = (
    "its CI excludes 0 the class's way (a name order: ABBA, IO named first, or BABA) or its mean points "
    "that way (a template); a class is confirmed when it holds pooled, in both orders and in most templates"
)


def _drops(c: ClassVerdict) -> str:
    return f"{signed(c.heldout.drop)}, {signed(c.heldout.random_drop)}"


def _writes(c: ClassVerdict) -> str:
    written = c.details.get("writes")
    return "" if written is None else f"{written['IO']:+.2f}, {written['S']:+.2f}"


def _spread(c: ClassVerdict) -> str:
    figures = c.details["heterogeneity"]
    return "n/a" if figures["df"] == 0 else f"{figures['I2']:.0%}, p {figures['p']:.1g}"


# IOI's columns of the class table (`sections.class_sections`): title, cell, legend; narrower: writes only.
CLASS_DETAILS = (
    ("drop, random", _drops, "the class's and the random sets' mean drops"),
    ("writes IO, S", _writes, "the writers' mean direct logit attribution to IO and S at END, in logits"),
    (
        "I^2, p",
        _spread,
        "Cochran's Q over templates (I^2: the share of the spread between templates beyond chance)",
    ),
)
NARROW_DETAILS = ("writes IO, S",)


def _class_sections(result: IOICircuitResult, wide: bool) -> list[Section]:
    """The held-out classes (`sections.class_sections`), with an example prompt of each template."""
    classes = list(result.validation.classes.values())
    details = [column for column in CLASS_DETAILS if wide or column[0] in NARROW_DETAILS]
    cells = [(title, cell) for title, cell, _ in details]
    pooled, strata = class_sections(classes, details=cells, holds=HOLDS, digits=3)
    pooled.notes.append(" ".join([CLASS_LEGEND, *(f"{title}: {words}." for title, _, words in details)]))
    first = classes[0].strata if classes else []
    strata.notes += [f"{s.name}: {s.example}" for s in first if s.kind == "template" and s.example]
    return [pooled, strata]


# Columns of the diagram, left (early layers) to right (logits), and the paths between classes.
_COLUMNS = (("previous_token",), ("duplicate_token", "induction"), ("s_inhibition",),
            ("name_mover", "backup_name_mover", "negative_name_mover", "s_suppression"))  # fmt: skip
_EDGES = (
    ("previous_token", "induction", "K"), ("induction", "s_inhibition", "V"),
    ("duplicate_token", "s_inhibition", "V"), ("s_inhibition", "name_mover", "Q"),
    ("s_inhibition", "backup_name_mover", "Q"), ("name_mover", "logits", ""),
    ("backup_name_mover", "logits", ""), ("negative_name_mover", "logits", ""),
    ("s_suppression", "logits", ""),
)  # fmt: skip
_COLOURS = {
    "name_mover": "#2e7d32", "backup_name_mover": "#81c784", "negative_name_mover": "#c62828",
    "s_inhibition": "#6a1b9a", "s_suppression": "#ad1457", "induction": "#1565c0",
    "duplicate_token": "#00838f", "previous_token": "#ef6c00", "logits": "#424242",
}  # fmt: skip


HEADS_PER_LINE = 3  # head labels per line of a diagram box ("L23H10, L23H11, L23H12" fits its width)
LINES_PER_BOX = 3  # lines of heads a box lists; more heads are counted ("+4 more")


def _box_lines(heads: list[str]) -> list[str]:
    shown = heads[: HEADS_PER_LINE * LINES_PER_BOX]
    lines = [", ".join(shown[i : i + HEADS_PER_LINE]) for i in range(0, len(shown), HEADS_PER_LINE)]
    if len(heads) > len(shown):
        lines.append(f"+{len(heads) - len(shown)} more")
    return lines


def ioi_circuit_diagram(result: IOICircuitResult) -> str:
    """An inline SVG of the circuit: one box per class listing its heads (and, after held-out
    validation, its verdict: a class not confirmed has a dashed border), arrows for the paths
    (K: into keys, V: into values, Q: into queries; unlabelled: direct to the logits)."""
    v = result.validation
    verdicts = {} if v is None else {cls: c.verdict for cls, c in v.classes.items()}
    texts = {
        cls: (_box_lines([h.name for h in result.classes[cls]]) or ["none found"])
        + ([verdicts[cls]] if cls in verdicts else [])
        for cls in CLASSES
    }
    box_w, gap_x, gap_y, margin, line_h = 180, 60, 26, 20, 16
    box_h = 34 + line_h * max(len(lines) for lines in texts.values())
    boxes = {}
    columns = [*_COLUMNS, ("logits",)]
    height = max(len(c) for c in columns) * (box_h + gap_y) + 2 * margin
    for col, classes in enumerate(columns):
        top = (height - len(classes) * (box_h + gap_y) + gap_y) / 2
        for row, cls in enumerate(classes):
            boxes[cls] = (margin + col * (box_w + gap_x), top + row * (box_h + gap_y))
    width = margin * 2 + len(columns) * box_w + (len(columns) - 1) * gap_x
    parts = [
        f'<svg class="ioi-circuit" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="IOI circuit diagram">',
        '<defs><marker id="ioi-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
    ]
    for source, target, label in _EDGES:
        (x0, y0), (x1, y1) = boxes[source], boxes[target]
        found = result.classes.get(source) and (target == "logits" or result.classes.get(target))
        style = "" if found else ' stroke-dasharray="4 4" opacity="0.4"'
        ax, ay, bx, by = x0 + box_w, y0 + box_h / 2, x1, y1 + box_h / 2
        parts.append(
            f'<line x1="{ax}" y1="{ay}" x2="{bx}" y2="{by}" stroke="#555" stroke-width="1.5" '
            f'marker-end="url(#ioi-arrow)"{style}/>'
        )
        if label:
            parts.append(
                f'<text x="{(ax + bx) / 2}" y="{(ay + by) / 2 - 4}" font-size="12" text-anchor="middle" '
                f'font-family="sans-serif" fill="#333">{label}</text>'
            )
    for cls, (x, y) in boxes.items():
        title = "logits (IO - S)" if cls == "logits" else CLASS_TITLES[cls]
        found = cls == "logits" or bool(result.classes[cls])
        colour, opacity = _COLOURS[cls], 0.15 if found else 0.04
        dashed = ' stroke-dasharray="6 4"' if verdicts.get(cls, "confirmed") != "confirmed" else ""
        lines = "".join(
            f'<text x="{x + box_w / 2}" y="{y + 44 + i * line_h}" font-size="12" text-anchor="middle" '
            + (
                f'font-family="sans-serif" font-style="italic" fill="{colour}"'
                if cls in verdicts and i == len(texts[cls]) - 1
                else 'font-family="monospace" fill="#222"'
            )
            + f">{html.escape(line)}</text>"
            for i, line in enumerate([] if cls == "logits" else texts[cls])
        )
        parts.append(
            f'<g class="ioi-class" data-class="{cls}" data-verdict="{verdicts.get(cls, "")}">'
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="8" fill="{colour}" '
            f'fill-opacity="{opacity}" stroke="{colour}"{dashed}/>'
            f'<text x="{x + box_w / 2}" y="{y + 22}" font-size="13" font-weight="bold" text-anchor="middle" '
            f'font-family="sans-serif" fill="{colour}">{html.escape(title)}</text>{lines}</g>'
        )
    parts.append("</svg>")
    return "".join(parts)


HEAD_COLUMNS = ("class", "head", "effect", "z", "attention", "found by", "writes IO, S")
LEGEND = (
    "Signs and units. logit diff = logit(IO) - logit(S) at END, in logits. effect = (clean - patched "
    "mean logit diff) / clean mean logit diff, in %, when the head's output is path-patched from the ABC "
    "run along its step's path ('found by'): positive, the head helps predict IO (name movers, "
    "S-inhibition); negative, it works against IO (negative name movers). z: robust z-score of the "
    "effect among the step's senders ((effect - median) / 1.4826 MAD; most senders' effects are near 0, "
    "so a head that matters scores in the tens or hundreds: a rank, not a probability). attention: mean "
    "attention probability (0 to 1) from the class's query position to its key position. writes IO, S: "
    "the head's direct logit attribution, its mean direct contribution to the IO and S logits at END, in "
    "logits (name movers: IO +; negative name movers: IO -; S-suppression: S -)."
)


def _head_table(result: IOICircuitResult, wide: bool) -> Table:
    """The circuit's heads, then the unclassified ones; `wide`: with the step that found each."""
    v = result.validation
    labelled = [
        (f"{cls}{UNCONFIRMED_MARK}" if v is not None and cls in v.unconfirmed else cls, CLASS_KIND[cls], h)
        for cls in CLASSES
        for h in result.classes[cls]
    ]
    labelled += [("unclassified", max(h.attention, key=h.attention.get), h) for h in result.unclassified]
    rows = []
    for cls, kind, h in labelled:
        dla = h.direct_logit_attribution
        cells = [cls, h.name, f"{h.effect:+.1%}", _z(h.z), f"{kind} {h.attention[kind]:.2f}", h.step,
                 f"{dla['IO']:+.2f}, {dla['S']:+.2f}"]  # fmt: skip
        rows.append(
            [cell for cell, column in zip(cells, HEAD_COLUMNS, strict=True) if wide or column != "found by"]
        )
    return Table(
        columns=[c for c in HEAD_COLUMNS if wide or c != "found by"], rows=rows, right=["effect", "z"]
    )


def _figures(result: IOICircuitResult) -> tuple[list[str], list[str], list[str]]:
    """The HTML page's figures: path-patching effects and attention as [layer, head] heat maps, and
    the attention patterns of each class's heads on the example prompt."""
    effects = [
        layer_head_map(
            values * 100,
            f"{STEP_TITLES.get(step, step)} (%)",
            "drop of the logit diff when the sender's path is patched from the ABC run ((clean - patched) "
            "/ clean, %; positive: the head helps predict IO); grey: not a sender in that step",
            signed=True,
            value_format="{:.1f}",
        )
        for step, values in result.effects.items()
        if values.isfinite().any()
    ]
    attention = [
        layer_head_map(values, f"attention {kind}", "mean attention on the clean prompts", signed=False)
        for kind, values in result.attention.items()
    ]
    patterns = []
    example = result.example
    if example is not None:
        patterns.append(f"<p>Example prompt: {html.escape(''.join(example.tokens))}</p>")
        for cls in CLASSES:
            names = [h.name for h in result.classes[cls] if h.name in example.patterns]
            if not names:
                continue
            query, key = CLASS_ATTENTION[cls]
            title = f"{CLASS_TITLES[cls]}: expected {query} -> {key}"
            patterns.append(f"<h3 class='ioi-pattern-class'>{html.escape(title)}</h3>")
            patterns.append(
                attention_patterns_html(example.tokens, [example.patterns[n] for n in names], names)
            )
    return effects, attention, patterns


def ioi_sections(result: IOICircuitResult, wide: bool = True) -> Report:
    """The report (see the module docstring). `wide`: every column; narrower (a terminal under
    WIDE_TERMINAL columns): the heads without the step that found them, the classes without their drops
    and spread over templates (`NARROW_DETAILS`)."""
    v, e = result.validation, result.evaluation
    dashed = "Dashed: a class held-out validation did not confirm (its verdict in italics)."
    attribution = result.settings.attribution
    sections = [
        Section(title="What chose and what tested", lines=_chose_lines(result)),
        Section(
            title="Circuit",
            figures=[ioi_circuit_diagram(result), *([f"<p>{dashed}</p>"] if v is not None else [])],
        ),
        Section(title="The model and the circuit on the discovery prompts", lines=_circuit_lines(result)),
        Section(
            title="Heads of the circuit",
            table=_head_table(result, wide),
            notes=[
                *([UNCONFIRMED_NOTE] if v is not None and v.unconfirmed else []),
                LEGEND,
                *([f"Direct logit attribution: {attribution}."] if attribution else []),
            ],
        ),
    ]
    if v is not None:
        sections += _class_sections(result, wide)
        if v.faithfulness_summary is not None:
            kept = f"the circuit's {len(result.heads)} heads kept, every other head mean-ablated"
            sections.append(faithfulness_section(v.faithfulness_summary, v.faithfulness_strata, kept))
    if e is not None and e.minimality:
        minimality = ", ".join(f"{head} {value:+.1%}" for head, value in e.minimality.items())
        line = f"drop of the circuit's logit diff without the head (class-mates removed): {minimality}"
        sections.append(Section(title="Minimality", lines=[line]))
    effects, attention, patterns = _figures(result)
    sections += [
        Section(title="Path-patching effects", figures=effects),
        Section(title="Attention evidence", figures=attention),
        Section(title="Attention patterns", figures=patterns),
    ]
    return Report(
        title=f"IOI circuit of {result.settings.model}", headline=_headline(result), sections=sections
    )


def write_ioi_report(result: IOICircuitResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    width = FILE_WIDTH if out is not None or console is None else console.width
    terminal = ioi_sections(result, wide=width >= WIDE_TERMINAL)
    write_sections(ioi_sections(result), format, out, console, result, terminal=terminal, width=FILE_WIDTH)
