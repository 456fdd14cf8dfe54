"""Rendering an IOICircuitResult: rich table, Markdown, JSON and a self-contained HTML page.

    result = find_ioi_circuit(model)
    print(render_markdown(result))
    write_ioi_report(result, "html", "ioi.html", Console())  # or "table", "json", "markdown"

The HTML page (offline: no network requests) has an inline-SVG diagram of the circuit (classes and
the paths between them), the path-patching effects as [layer, head] heat maps, and circuitsvis
attention patterns of each class's heads on an example prompt.
"""

from __future__ import annotations

import functools
import html
import json
import math

from rich import box
from rich.console import Console
from rich.table import Table

from circuits.ioi.results import CLASS_ATTENTION, CLASS_KIND, CLASSES, IOICircuitResult
from circuits.output import write_output
from interp.viz import attention_patterns_html, heatmap_html, html_page

CLASS_TITLES = {
    "name_mover": "Name movers",
    "negative_name_mover": "Negative name movers",
    "backup_name_mover": "Backup name movers",
    "s_inhibition": "S-inhibition",
    "s_suppression": "S-suppression",
    "induction": "Induction",
    "duplicate_token": "Duplicate-token",
    "previous_token": "Previous-token",
}
STEP_TITLES = {
    "logits": "heads -> logits (direct path)",
    "name_mover_queries": "heads -> name movers' queries at END",
    "s_suppression_queries": "heads -> S-suppression heads' queries at END",
    "s_inhibition_values": "heads -> S-inhibition values at S2",
    "induction_keys": "heads -> induction keys at S1+1",
    "logits_without_name_movers": "heads -> logits, name movers mean-ablated",
    "backup_growth": "growth of the direct effect when name movers are ablated",
}


def render_json(result: IOICircuitResult) -> str:
    """Strict JSON: NaN (a figure that could not be computed) becomes null."""
    return json.dumps(_without_nan(result.to_json()), indent=2, allow_nan=False)


def _without_nan(value):
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nan(item) for item in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def _ci(interval: tuple[float, float]) -> str:
    return f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def _percent_ci(interval: tuple[float, float]) -> str:
    """A CI of a fraction in %, the unit of the value it goes with."""
    return f"[{interval[0]:.1%}, {interval[1]:.1%}]"


def _z(z: float) -> str:
    """A robust z for people: one decimal below 10, whole numbers beyond (most senders' effects are
    near 0, so the MAD is small and a head that matters scores in the tens or hundreds)."""
    return f"{z:+.1f}" if abs(z) < 10 else f"{z:+.0f}"


VERDICT_WORDS = {  # a held-out verdict -> how the headline says it
    "confirmed": "confirmed on held-out prompts",
    "order-dependent": "order-dependent (hold in one name order only)",
    "template-dependent": "template-dependent (hold in few templates)",
    "unconfirmed": "unconfirmed (no larger effect than random heads)",
}


def _headline(result: IOICircuitResult) -> list[str]:
    """What was found, first: the circuit's size and how much it recovers, then its classes grouped
    by their held-out verdict (with the strata where the order-dependent ones hold)."""
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
    return lines


def _summary_lines(result: IOICircuitResult) -> list[str]:
    b, s = result.baseline, result.settings
    lines = [
        f"model {s.provenance or s.model}, {s.n_prompts} prompts (seed {s.seed}), corrupted distribution "
        f"{s.corrupted}",
        f"logit diff (IO - S) {b.logit_diff:.3f} (95% CI {_ci(b.logit_diff_ci)}), "
        f"accuracy {b.accuracy:.1%} (95% CI {_percent_ci(b.accuracy_ci)}), top-1 = IO {b.top1_io:.1%}, "
        f"ABC logit diff {b.abc_logit_diff:.3f}",
        f"selection: |effect| >= {s.min_effect:.0%} and (robust z >= {s.effect_z} or >= {s.min_share:.0%} of "
        f"the step's summed effect); attention >= min(max(median + {s.attention_z} robust SD, "
        f"{s.min_attention}), {s.large_attention})",
    ]
    e = result.evaluation
    if e is not None:
        with_unclassified = (
            f" ({e.recovered_with_unclassified:.1%} and {e.faithfulness_with_unclassified:.1%} with the "
            "unclassified heads)"
            if e.recovered_with_unclassified is not None
            else ""
        )
        lines.append(
            f"recovered {e.recovered:.1%} of the logit diff (circuit {e.circuit_logit_diff:.3f} / model "
            f"{e.model_logit_diff:.3f}), faithfulness {e.faithfulness:.1%} (all heads ablated "
            f"{e.ablated_logit_diff:.3f}){with_unclassified}; completeness: max "
            f"|F(C\\K) - F(M\\K)| / F(M) = {e.completeness_max_gap:.1%} over {len(e.completeness)} subsets"
        )
    return lines


def _validation_lines(result: IOICircuitResult) -> list[str]:
    """One line on the held-out set and how much of the logit diff the circuit keeps there ([] without
    validation; each class's verdict is in the headline)."""
    v = result.validation
    if v is None:
        return []
    return [
        f"held out: {v.n_prompts} prompts from {v.prompts}: logit diff {v.logit_diff:.3f}, recovered "
        f"{v.recovered:.1%} (95% CI {_percent_ci(v.recovered_ci)}), faithfulness {v.faithfulness:.1%}"
    ]


def _validation_rows(result: IOICircuitResult):
    """(class, heads, class drop, random drop, drop beyond random with CI, writes, verdict) per class."""
    v = result.validation
    for cls, c in v.classes.items() if v is not None else ():
        writes = "" if c.writes is None else f"IO {c.writes['IO']:+.2f} S {c.writes['S']:+.2f}"
        low, high = c.beyond_ci
        beyond = f"{c.beyond:+.0%} [{low * 100:+.0f}, {high * 100:+.0f}]"
        verdict = c.verdict if c.verdict in ("confirmed", "unconfirmed") else f"{c.verdict}: {_where(c)}"
        yield (
            cls,
            ", ".join(c.heads),
            f"{c.drop:+.1%}",
            f"{c.random_drop:+.1%}",
            beyond,
            writes,
            verdict,
        )


VALIDATION_COLUMNS = ("class", "heads", "drop", "random", "beyond random % (95% CI)", "writes", "held out")
STRATA_COLUMNS = ("class", "ABBA % (95% CI)", "BABA % (95% CI)", "templates", "heterogeneity I^2, p")
NARROW_HEADERS = {
    "beyond random % (95% CI)": "beyond (95% CI)",
    "heterogeneity I^2, p": "I^2, p",
}  # < 120 columns
STRATA_LEGEND = (
    "Per stratum: the class's drop beyond random heads (as 'beyond random') on the held-out prompts "
    "of each name order (ABBA: IO named first) and of each template. Positive = ablating the class "
    "lowers the logit diff more than random heads do (negative for negative name movers); x: the "
    "order where it does not hold. A class "
    "is confirmed when it holds in both orders (CI beyond 0) and in most templates (mean in its "
    "direction); heterogeneity: Cochran's Q over templates (I^2: share of the spread between "
    "templates beyond chance)."
)


def _where(c) -> str:
    """Where a class holds, in words: the name order of an order-dependent class ("BABA only"), the
    share of templates of a template-dependent one ("3 of 12 templates")."""
    if c.verdict == "order-dependent":
        return " and ".join(s.name for s in c.strata if s.kind == "order" and s.holds) + " only"
    templates = [s for s in c.strata if s.kind == "template"]
    return f"{sum(s.holds for s in templates)} of {len(templates)} templates"


def _strata_rows(result: IOICircuitResult):
    """(class, ABBA, BABA, templates that hold, heterogeneity) per validated class."""
    v = result.validation
    for cls, c in v.classes.items() if v is not None else ():
        orders = {s.name: s for s in c.strata if s.kind == "order"}
        templates = [s for s in c.strata if s.kind == "template"]
        cells = [
            "n/a"
            if name not in orders
            else f"{orders[name].beyond:+.0%} [{orders[name].beyond_ci[0] * 100:+.0f}, "
            f"{orders[name].beyond_ci[1] * 100:+.0f}]{'' if orders[name].holds else ' x'}"
            for name in ("ABBA", "BABA")
        ]
        held = [s.name for s in templates if s.holds]
        failed = [s.name for s in templates if not s.holds]
        listed = (
            f": {' '.join(held)}"
            if len(held) <= len(failed)
            else f", not {' '.join(failed)}"
            if failed
            else ""
        )
        q, df, p, i2 = c.heterogeneity
        spread = "n/a" if df == 0 else f"{i2:.0%}, p {p:.1g}"
        yield (cls, *cells, f"{len(held)} of {len(templates)}{listed}", spread)


def _template_lines(result: IOICircuitResult) -> list[str]:
    """ "T3: <a prompt of template 3>" per held-out template (text IOI)."""
    v = result.validation
    if v is None or not v.classes:
        return []
    first = next(iter(v.classes.values()))
    return [f"{s.name}: {s.example}" for s in first.strata if s.kind == "template" and s.example]


WIDE_TERMINAL = 120  # columns from which the terminal table shows how each head was found


UNCONFIRMED_MARK = "*"  # after a class held-out validation did not confirm (the headline says why)
UNCONFIRMED_NOTE = f"{UNCONFIRMED_MARK} not confirmed on held-out prompts: see the first lines."


def _class_label(result: IOICircuitResult, cls: str) -> str:
    """The class name, marked when held-out validation did not confirm it."""
    v = result.validation
    return f"{cls}{UNCONFIRMED_MARK}" if v is not None and cls in v.unconfirmed else cls


def _head_rows(result: IOICircuitResult):
    """(class, head name, effect, z, attention kind, attention, step, writes) per circuit head."""

    def writes(h) -> str:
        dla = h.direct_logit_attribution
        return f"{dla['IO']:+.2f}, {dla['S']:+.2f}"

    for cls in CLASSES:
        kind = CLASS_KIND[cls]
        for h in result.classes[cls]:
            yield _class_label(result, cls), h.name, h.effect, h.z, kind, h.attention[kind], h.step, writes(h)
    for h in result.unclassified:
        kind = max(h.attention, key=h.attention.get)
        yield "unclassified", h.name, h.effect, h.z, kind, h.attention[kind], h.step, writes(h)


HEAD_COLUMNS = ("class", "head", "effect", "z", "attention", "found by", "writes IO, S")
LEGEND = (
    "Signs and units. logit diff = logit(IO) - logit(S) at END, in logits. effect = (patched - clean "
    "mean logit diff) / clean mean logit diff, in %, when the head's output is path-patched from the ABC "
    "run along its step's path ('found by'): negative, the head helps predict IO (name movers, "
    "S-inhibition); positive, it works against IO (negative name movers). z: robust z-score of the "
    "effect among the step's senders ((effect - median) / 1.4826 MAD; most senders' effects are near 0, "
    "so a head that matters scores in the tens or hundreds: a rank, not a probability). attention: mean "
    "attention probability (0 to 1) from the class's query position to its key position. writes IO, S: "
    "the head's direct logit attribution, its mean direct contribution to the IO and S logits at END, in "
    "logits (name movers: IO +; negative name movers: IO -; S-suppression: S -)."
)
VALIDATION_LEGEND = (
    "Held-out validation: drop and random = drop of the mean logit diff (clean - ablated) when the class "
    "(or as many random heads from the same layers) is mean-ablated, relative to the unablated held-out "
    "logit diff, in %; beyond random = drop - random (positive: ablating the class lowers the logit diff "
    "more than random heads do; negative name movers: negative); writes: mean direct logit attribution "
    "to IO and S, in logits."
)


def render_table(result: IOICircuitResult, console: Console) -> None:
    for line in _headline(result):
        console.print(line, style="bold", markup=False)
    for line in _summary_lines(result) + _validation_lines(result):
        console.print(line, markup=False)
    wide = console.width >= WIDE_TERMINAL  # narrower: no "found by" column; cells wrap between words
    table = Table(title="IOI circuit", box=box.SIMPLE_HEAD)
    columns = [c for c in HEAD_COLUMNS if wide or c != "found by"]
    for column in columns:
        table.add_column(column, justify="right" if column in ("effect", "z") else "left",
                         no_wrap=True)  # fmt: skip
    for cls, name, effect, z, kind, attention, step, writes in _head_rows(result):
        cells = [cls, name, f"{effect:+.1%}", _z(z), f"{kind} {attention:.2f}", step, writes]
        table.add_row(*(cell for cell, column in zip(cells, HEAD_COLUMNS, strict=True) if column in columns))
    console.print(table)
    if result.validation is not None and result.validation.unconfirmed:
        console.print(UNCONFIRMED_NOTE, markup=False)
    console.print(LEGEND, style="dim", markup=False)
    if result.validation is not None:
        validation = Table(
            title="Held-out validation: each class vs as many random heads", box=box.SIMPLE_HEAD
        )
        # narrower: the drop beyond random only, and the heads last, where they can wrap
        order = (
            VALIDATION_COLUMNS
            if wide
            else ("class", "beyond random % (95% CI)", "writes", "held out", "heads")
        )
        for column in order:  # the class and the figures whole; the verdict and heads wrap
            validation.add_column(
                column if wide else NARROW_HEADERS.get(column, column),
                no_wrap=column not in ("heads", "held out", "writes"),
                min_width={"heads": 6, "held out": 16}.get(column),
            )
        for row in _validation_rows(result):
            cells = dict(zip(VALIDATION_COLUMNS, row, strict=True))
            cells["writes"] = cells["writes"].replace(" S ", " S " if wide else "\nS ")
            validation.add_row(*(cells[column] for column in order))
        console.print(validation)
        console.print(VALIDATION_LEGEND, style="dim", markup=False)
        strata = Table(title="Held-out validation per name order and template", box=box.SIMPLE_HEAD)
        for column in STRATA_COLUMNS:  # the class and the figures whole; templates and spread wrap
            strata.add_column(
                column if wide else NARROW_HEADERS.get(column, column),
                no_wrap=column == "class" or "CI" in column,
                min_width={"templates": 9, "heterogeneity I^2, p": 7}.get(column),
            )
        for row in _strata_rows(result):
            strata.add_row(*row)
        console.print(strata)
        console.print(STRATA_LEGEND, style="dim")
        for line in _template_lines(result):
            console.print(line, style="dim", markup=False)
    e = result.evaluation
    if e is not None and e.minimality:
        minimality = ", ".join(f"{head} {value:+.1%}" for head, value in e.minimality.items())
        console.print(
            f"minimality (drop when removing the head, its class-mates already removed): {minimality}"
        )


def render_markdown(result: IOICircuitResult) -> str:
    lines = _summary_lines(result) + _validation_lines(result)
    out = ["# IOI circuit", "", *(f"**{line}**  " for line in _headline(result)), ""]
    out += [f"- {line}" for line in lines] + [""]
    out += ["| " + " | ".join(HEAD_COLUMNS) + " |", "|---|---|---:|---:|---|---|---|"]
    for cls, name, effect, z, kind, attention, step, writes in _head_rows(result):
        out.append(
            f"| {cls} | {name} | {effect:+.1%} | {_z(z)} | {kind} {attention:.2f} | {step} | {writes} |"
        )
    if result.validation is not None and result.validation.unconfirmed:
        out += ["", UNCONFIRMED_NOTE]
    out += ["", LEGEND]
    if result.validation is not None:
        out += ["", "Held-out validation (mean-ablating each class vs as many random heads):", ""]
        out += ["| " + " | ".join(VALIDATION_COLUMNS) + " |", "|" + "---|" * len(VALIDATION_COLUMNS)]
        out += ["| " + " | ".join(row) + " |" for row in _validation_rows(result)]
        out += ["", VALIDATION_LEGEND]
        out += ["", "Per name order and template:", ""]
        out += ["| " + " | ".join(STRATA_COLUMNS) + " |", "|" + "---|" * len(STRATA_COLUMNS)]
        out += ["| " + " | ".join(row) + " |" for row in _strata_rows(result)]
        out += ["", STRATA_LEGEND, ""] + [f"- {line}" for line in _template_lines(result)]
    e = result.evaluation
    if e is not None and e.minimality:
        out += [
            "",
            "Minimality (drop of the circuit's logit diff when removing the head, class-mates removed):",
            "",
        ]
        out += [f"- {head}: {value:+.1%}" for head, value in e.minimality.items()]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# HTML

# Columns of the diagram, left (early layers) to right (logits), and the paths between classes.
_COLUMNS = (("previous_token",), ("duplicate_token", "induction"), ("s_inhibition",),
            ("name_mover", "backup_name_mover", "negative_name_mover", "s_suppression"))  # fmt: skip
_EDGES = (
    ("previous_token", "induction", "K"),
    ("induction", "s_inhibition", "V"),
    ("duplicate_token", "s_inhibition", "V"),
    ("s_inhibition", "name_mover", "Q"),
    ("s_inhibition", "backup_name_mover", "Q"),
    ("name_mover", "logits", ""),
    ("backup_name_mover", "logits", ""),
    ("negative_name_mover", "logits", ""),
    ("s_suppression", "logits", ""),
)
_COLOURS = {
    "name_mover": "#2e7d32",
    "backup_name_mover": "#81c784",
    "negative_name_mover": "#c62828",
    "s_inhibition": "#6a1b9a",
    "s_suppression": "#ad1457",
    "induction": "#1565c0",
    "duplicate_token": "#00838f",
    "previous_token": "#ef6c00",
    "logits": "#424242",
}


HEADS_PER_LINE = 3  # head labels per line of a diagram box ("L23H10, L23H11, L23H12" fits its width)
LINES_PER_BOX = 3  # lines of heads a box lists; more heads are counted ("+4 more")


def _box_lines(heads: list[str]) -> list[str]:
    """A class's heads as the lines of its diagram box ([] for none)."""
    shown = heads[: HEADS_PER_LINE * LINES_PER_BOX]
    lines = [", ".join(shown[i : i + HEADS_PER_LINE]) for i in range(0, len(shown), HEADS_PER_LINE)]
    if len(heads) > len(shown):
        lines.append(f"+{len(heads) - len(shown)} more")
    return lines


def circuit_svg(result: IOICircuitResult) -> str:
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


def render_html(result: IOICircuitResult) -> str:
    """The full report as one self-contained HTML page."""
    sections = [
        "<p class='ioi-headline'><b>"
        + "<br>".join(html.escape(line) for line in _headline(result))
        + "</b></p>",
        circuit_svg(result),
        "<p>Dashed: a class held-out validation did not confirm (its verdict in italics).</p>"
        if result.validation is not None
        else "",
        "<h2>Summary</h2><ul>"
        + "".join(
            f"<li>{html.escape(line)}</li>" for line in _summary_lines(result) + _validation_lines(result)
        )
        + "</ul><h2>Heads</h2>",
        "<table class='ioi-heads' style='border-collapse: collapse; font: 13px monospace;'><tr>"
        + "".join(f"<th>{html.escape(column)}</th>" for column in HEAD_COLUMNS)
        + "</tr>"
        + "".join(
            f"<tr><td>{html.escape(cls)}</td><td>{name}</td><td>{effect:+.1%}</td><td>{html.escape(_z(z))}</td>"
            f"<td>{html.escape(kind)} {attention:.2f}</td><td>{html.escape(step)}</td>"
            f"<td>{html.escape(writes)}</td></tr>"
            for cls, name, effect, z, kind, attention, step, writes in _head_rows(result)
        )
        + "</table>",
        f"<p class='legend ioi-legend'>{html.escape(LEGEND)}</p>",
    ]
    if result.validation is not None:
        sections.append(
            "<h2>Held-out validation</h2><table class='ioi-validation' style='border-collapse: collapse; "
            "font: 13px monospace;'><tr>"
            + "".join(f"<th>{html.escape(column)}</th>" for column in VALIDATION_COLUMNS)
            + "</tr>"
            + "".join(
                "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                for row in _validation_rows(result)
            )
            + "</table>"
            + f"<p class='legend'>{html.escape(VALIDATION_LEGEND)}</p>"
            + "<h3>Per name order and template</h3><table class='ioi-strata'><tr>"
            + "".join(f"<th>{html.escape(column)}</th>" for column in STRATA_COLUMNS)
            + "</tr>"
            + "".join(
                "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                for row in _strata_rows(result)
            )
            + "</table>"
            + f"<p>{html.escape(STRATA_LEGEND)}</p><ul>"
            + "".join(f"<li>{html.escape(line)}</li>" for line in _template_lines(result))
            + "</ul>"
        )
    n_layers, n_heads = next(iter(result.attention.values())).shape
    layers, heads = [str(i) for i in range(n_layers)], [str(i) for i in range(n_heads)]
    sections.append(
        "<h2>Path-patching effects</h2><p>Relative change of the logit diff when a sender's path is "
        "patched from the ABC run (grey: not a sender in that step).</p>"
    )
    for step, values in result.effects.items():
        if not values.isfinite().any():
            continue
        sections.append(heatmap_html(values * 100, layers, heads, f"{STEP_TITLES.get(step, step)} (%)",
                                     signed=True, value_format="{:.1f}"))  # fmt: skip
    sections.append(
        "<h2>Attention evidence</h2><p>Mean attention between IOI positions on the clean prompts.</p>"
    )
    for kind, values in result.attention.items():
        sections.append(heatmap_html(values, layers, heads, f"attention {kind}", signed=False))
    example = result.example
    if example is not None:
        sections.append(
            f"<h2>Attention patterns</h2><p>Example prompt: {html.escape(''.join(example.tokens))}</p>"
        )
        for cls in CLASSES:
            names = [h.name for h in result.classes[cls] if h.name in example.patterns]
            if not names:
                continue
            query, key = CLASS_ATTENTION[cls]
            title = f"{CLASS_TITLES[cls]}: expected {query} -> {key}"
            sections.append(f"<h3 class='ioi-pattern-class'>{html.escape(title)}</h3>")
            sections.append(
                attention_patterns_html(example.tokens, [example.patterns[n] for n in names], names)
            )
    return html_page(f"IOI circuit of {result.settings.model}", sections)


FORMATS = ("table", "json", "markdown", "html")


def write_ioi_report(result: IOICircuitResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    renderers = {"json": render_json, "markdown": render_markdown, "html": render_html}
    table = functools.partial(render_table, result)
    write_output(format, FORMATS, out, console, table, lambda fmt: renderers[fmt](result), width=140)
