"""An EdgeCircuitResult as the one report structure (`circuits.sections`), the HTML page with the circuit
and the faithfulness curve as inline SVG; its JSON: `EdgeCircuitResult.json_data`."""

from __future__ import annotations

import html
import math

from rich.console import Console

from circuits.edge_circuits.find import EdgeCircuitResult
from circuits.evidence import band_spanned, faithfulness_band, undetermined_faithfulness
from circuits.finding import finding_report
from circuits.sections import FORMATS as FORMATS  # the formats `interp render` offers
from circuits.sections import (
    Report,
    Section,
    Table,
    ci_text,
    faithfulness_section,
    write_sections,
)
from interp import edges, viz
from interp.interventions.stats import FAITHFUL_BAND, OVERSHOOT, PARTIAL, FaithfulnessSummary

READER_COLOURS = {"q": "#1f77b4", "k": "#2ca02c", "v": "#d62728", "": "#555555"}
TOP_ROWS = 25
FAITHFUL = 1 - FAITHFUL_BAND  # verdict thresholds on faithfulness (0.8, and PARTIAL's 0.5)
DENSE_EDGES = 300  # circuits with more edges are drawn fainter (circuit_svg)
MONOTONE_TOLERANCE = 0.05  # a fall of faithfulness as a size search grows the circuit that its report names
CURVE_COLUMNS = ("fraction asked for", "edges kept", "faithfulness", "95% CI", "random", "random edges kept")


def removal_note(result: EdgeCircuitResult) -> str:
    removal, n_edges = result.removal, int(result.circuit.sum())
    measured = (
        "measured for every edge (the circuit run without it)"
        if removal.n_measured >= n_edges
        else f"measured (the circuit run without the edge) for the {removal.n_measured} edges of largest "
        f"estimated effect{' on the discovery prompts' if removal.ranked_elsewhere else ''}, listed first; "
        "≈: a first-order estimate for the others (the metric's gradient with respect to the edge's mask "
        "at the circuit)"
    )
    return (
        "effect of removal: m(circuit without the edge) - m(circuit) on the held-out prompts, in the "
        f"metric's units ({result.task.metric_name}; the circuit's own {removal.circuit_metric:.3f}); "
        f"negative: the edge helps the circuit; {measured}. The order changes no edge of the circuit (the "
        "method's scores chose them; they only rank: --format json has them)."
    )


def faithfulness_advice(
    faithfulness: float, method: str, ablation: str, ci: tuple[float, float] = (math.nan, math.nan)
) -> str:
    """A verdict on a circuit's faithfulness (1: it does what the model does, 0: no more than everything
    ablated, above OVERSHOOT more), what its CI leaves open, and, below "faithful", what to try next."""
    return _advice(faithfulness, method, ablation) + band_spanned(ci)


def _advice(faithfulness: float, method: str, ablation: str) -> str:
    band = faithfulness_band(faithfulness)
    if band == "overshoots":
        return (
            f"overshoots (> {OVERSHOOT:g}): the circuit alone keeps more than the model, so edges left out "
            "work against the answer; try more edges"
        )
    if band == "within":
        return f"faithful (>= {FAITHFUL})"
    if band == "undefined":
        return "undefined: the metric is not finite (NaN/inf) on some prompts; check the metric and prompts"
    tries = ["more edges (--edges, --fraction, or --target to search for the size)"]
    if method != "prune":
        tries.append("--method prune (a mask learned from EAP-IG's ranks: fewer edges, same faithfulness)")
    if ablation != "mean":
        tries.append("--ablation mean")
    verdict = f"partial ({PARTIAL}-{FAITHFUL})" if band == "partial" else f"not faithful (< {PARTIAL})"
    return f"{verdict}; try " + "; ".join(tries)


def size_origin(result: EdgeCircuitResult) -> str:
    """Where the circuit's size came from (searched or given), and the top edges on no path input ->
    logits that it dropped."""
    n_kept, top = int(result.circuit.sum()), result.requested_edges
    dropped = f"the top {top} by |score| less {top - n_kept} on no path input -> logits"
    if result.target is None:
        return "requested" if n_kept == top else f"requested {top}: {dropped}"
    origin = f"smallest reaching faithfulness ≥ {result.target:g}"
    return origin if n_kept == top else f"{origin}: {dropped}"


def size_search_note(tried: dict[int, float], target: float) -> str:
    """The sizes a size search tried (the top n edges by |score|: discovery faithfulness) and the largest
    fall of faithfulness beyond `MONOTONE_TOLERANCE` to below `target` as the size grew, which its
    bisection assumes away (a fall that stays above the target moves no size it finds)."""
    sizes = sorted(tried)
    text = "size search on the discovery prompts (top n by |score|: faithfulness): " + ", ".join(
        f"{n}: {tried[n]:.2f}" for n in sizes
    )
    falls = [
        (tried[a] - tried[b], a, b) for i, a in enumerate(sizes) for b in sizes[i + 1 :] if tried[b] < target
    ]
    fall, smaller, larger = max(falls, default=(0.0, 0, 0))
    if fall <= MONOTONE_TOLERANCE:
        return text
    return text + (
        f"; not monotone ({tried[smaller]:.2f} at {smaller} edges, {tried[larger]:.2f} at {larger}): the "
        f"size first reaching {target:g} can move with the scores' rounding (on another CPU), and a smaller "
        "circuit may come close to it"
    )


def _ci_clause(circuit: dict, summary: FaithfulnessSummary) -> str:
    """The faithfulness's CI and what it resamples, opening the parenthesis the headline goes on in."""
    interval = ci_text(circuit["faithfulness_ci"], 3, sign=False)
    if interval == "(no CI)":
        few = f"{summary.n_families} held-out families" if summary.too_few_families else "a value not finite"
        return f"(no CI: {few}; "
    return f"{interval} (95% CI over {circuit['ci_resamples']}; "


def edge_headline(result: EdgeCircuitResult) -> list[str]:
    """The finding (the circuit and its faithfulness on prompts that did not find it), then its setting."""
    data = result.json_data(top=0)
    circuit, task, method = data["circuit"], data["task"], data["method"]
    summary = result.faithfulness.summary()
    steps = f", {method['steps']} steps" if method["name"].startswith("eap-ig") else ""
    held_out = "on the prompts that found it (a result saved before held-out prompts; unconfirmed)"
    if result.held_out:
        found = ci_text(circuit["discovery_faithfulness_ci"], 3, sign=False)
        found = f"{circuit['discovery_faithfulness']:.3f} {found} on the discovery prompts that found it"
        held_out = f"on held-out prompts ({found}: {circuit['held_out_note']})"
    lines = [
        f"circuit of {result.model} on {task['name']}: {circuit['n_edges']} edges ({size_origin(result)}), "
        f"{len(circuit['nodes'])} nodes, faithfulness {circuit['faithfulness']:.3f} "
        f"{_ci_clause(circuit, summary)}"
        f"per-prompt error {circuit['faithfulness_error']:.2f}, {circuit['faithfulness_within']:.0%} of "
        f"prompts within ±20%) {held_out}: "
        + (
            undetermined_faithfulness(summary)
            or faithfulness_advice(
                circuit["faithfulness"], method["name"], method["ablation"], circuit["faithfulness_ci"]
            )
        ),
        f"{result.provenance or result.model}. Its edge graph: {data['graph']['n_edges']:,} edges between "
        f"{data['graph']['n_nodes']} nodes",
        f"task {task['name']}: {task['n_prompts']} discovery prompt pairs"
        + ("" if task["n_heldout"] is None else f", {task['n_heldout']} held-out ({task['split']})")
        + f"; {task['metric']} clean {task['clean_metric']:.3f}, corrupted {task['corrupted_metric']:.3f}",
        f"method {method['name']}{steps}, {method['ablation']} ablation; scores in "
        f"{sum(result.seconds.values()):.1f} s in all ({result.seconds['scores']:.1f} s scoring"
        + (f", {result.seconds['curve']:.1f} s the curve" if "curve" in result.seconds else "")
        + (f", {result.seconds['effects']:.1f} s the edges' effects" if "effects" in result.seconds else "")
        + ")",
        *([] if not result.size_search else [size_search_note(result.size_search, result.target)]),
        result.score_convention(),
    ]
    curve = data["curve"]
    if curve is None:
        return [*lines, "faithfulness curve: not measured (--curve: MIB's 10 sizes, CPR and CMD)"]
    random = curve["random"]
    ranked = (
        f"edges ranked by signed score, as MIB's leaderboard; by |score|: {curve['cpr_abs']:.3f}"
        if result.scores.method in edges.METHODS
        else "edges in the method's rank order: its scores have no sign"
    )
    return [*lines, (
        f"faithfulness curve over {len(curve['fractions'])} sizes: CPR {curve['cpr']:.3f} ({ranked}), "
        f"CMD {curve['cmd']:.3f} (ranked by |score|)"
        + ("" if random is None else f" (random circuits: CPR {random['cpr']:.3f}, CMD {random['cmd']:.3f})")
    )]  # fmt: skip


def stability_note(result: EdgeCircuitResult) -> str:
    if result.frequency is None:
        return (
            "frequency: not measured (--bootstrap N: each edge's selection over N resamples of the prompts)"
        )
    return (
        f"frequency: the fraction of {result.n_boot} bootstrap resamples of the prompts whose "
        f"{result.requested_edges}-edge circuit holds the edge"
    )


def _node_positions(result: EdgeCircuitResult) -> tuple[dict[str, tuple[float, float]], float, float]:
    """x by layer (heads, then MLP), y by head; input left, logits right."""
    graph = result.graph
    col, row, margin = 46, 22, 30
    height = margin * 2 + (graph.n_heads + int(graph.has_mlp)) * row
    columns = 1 + int(graph.has_mlp)
    positions = {"input": (margin, height / 2)}
    for layer in range(graph.n_layers):
        x = margin + col * (1 + columns * layer)
        for head in range(graph.n_heads):
            positions[f"a{layer}.h{head}"] = (x, margin + head * row + row / 2)
        if graph.has_mlp:
            positions[f"m{layer}"] = (x + col, height / 2)
    width = margin * 2 + col * (2 + columns * graph.n_layers)
    positions["logits"] = (width - margin, height / 2)
    return positions, width, height


def _reader_point(result: EdgeCircuitResult, reader: str, positions) -> tuple[float, float]:
    node = reader.split("<")[0]
    if ".kv" in node:  # a key/value head: the middle of its group of query heads
        layer, kv = node[1:].split(".kv")
        group = result.graph.n_heads // result.graph.n_kv_heads
        ys = [positions[f"a{layer}.h{h}"][1] for h in range(int(kv) * group, (int(kv) + 1) * group)]
        return positions[f"a{layer}.h{int(kv) * group}"][0], sum(ys) / len(ys)
    return positions[node]


def circuit_svg(result: EdgeCircuitResult) -> str:
    """The circuit as an inline SVG: every node a dot (circuit nodes labelled), circuit edges as curves
    coloured by what they feed (query blue, key green, value red, MLP / logits grey), width ~ |score|,
    fainter beyond DENSE_EDGES edges (opacity ~ DENSE_EDGES / edges) so a dense circuit shows where
    its edges gather."""
    positions, width, height = _node_positions(result)
    in_circuit = set(result.nodes)
    rows = result.circuit_edges()
    biggest = max((abs(score) for _, _, score in rows), default=1.0) or 1.0
    opacity = 0.7 * min(1.0, max(0.1, DENSE_EDGES / max(1, len(rows))))
    parts = ['<svg class="edge-circuit" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="circuit">']
    for writer, reader, score in reversed(rows):
        (x0, y0), (x1, y1) = positions[writer], _reader_point(result, reader, positions)
        colour = READER_COLOURS[reader[-2] if reader.endswith(">") else ""]
        stroke, bend = 0.6 + 3.4 * abs(score) / biggest, (x1 - x0) / 2
        title = f"{writer}->{reader}: {score:+.4f}"
        parts.append(
            f'<path class="edge" d="M {x0:.1f} {y0:.1f} C {x0 + bend:.1f} {y0:.1f} {x1 - bend:.1f} {y1:.1f} '
            f'{x1:.1f} {y1:.1f}" fill="none" stroke="{colour}" stroke-width="{stroke:.2f}" '
            f'stroke-opacity="{opacity:.2f}"><title>{html.escape(title)}</title></path>'
        )
    for name, (x, y) in positions.items():
        kept = name in in_circuit or name in ("input", "logits")
        radius, fill = (6, "#222") if kept else (2.5, "#ccc")
        node = (
            f'<circle class="node" data-node="{name}" cx="{x:.1f}" cy="{y:.1f}" r="{radius}" fill="{fill}"/>'
        )
        label = (
            f'<text x="{x:.1f}" y="{y - 8:.1f}" font-size="10" text-anchor="middle" font-family="monospace">'
        )
        parts.append(node + (f"{label}{html.escape(name)}</text>" if kept else ""))
    return "".join(parts) + "</svg>"


def circuit_view(result: EdgeCircuitResult) -> str:
    """The circuit graph in a zoomable frame, its first view fitted to the circuit's nodes and the logits."""
    positions, width, height = _node_positions(result)
    shown = [positions[name] for name in (*result.nodes, "logits") if name != "input"]
    pad = 30
    left, right = min(x for x, _ in shown) - pad, max(x for x, _ in shown) + pad
    top, bottom = min(y for _, y in shown) - pad, max(y for _, y in shown) + pad
    return viz.zoomable_svg_html(
        circuit_svg(result), (left, top, right - left, bottom - top), (0, 0, width, height),
        height=int(min(max(height, 320), 600)),
    )  # fmt: skip


def curve_svg(result: EdgeCircuitResult) -> str:
    """Faithfulness against the fraction of edges asked for (MIB's sizes, log scale; each circuit keeps
    its connected edges, fewer), with its CI and random circuits asked for at the same sizes."""
    curve, (width, height, margin) = result.curve, (560, 320, 50)
    xs = [math.log10(f) for f in curve.fractions]
    series = {"circuit": curve.faithfulness.tolist()}
    if curve.random is not None:
        series["random"] = curve.random.faithfulness.tolist()
    low, high = (t.tolist() for t in curve.result.ci())
    values = [v for vs in series.values() for v in vs] + low + high + [0.0, 1.0]
    y_min, y_max = min(values), max(values)
    x_min, x_max = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1

    def px(x: float) -> float:
        return margin + (x - x_min) / (x_max - x_min) * (width - 2 * margin)

    def py(y: float) -> float:
        return height - margin - (y - y_min) / (y_max - y_min or 1) * (height - 2 * margin)

    def points(ys: list[float], order=lambda pairs: pairs) -> list[str]:
        return [f"{px(x):.1f},{py(y):.1f}" for x, y in order(list(zip(xs, ys, strict=True)))]

    band = " ".join(points(high) + points(low, reversed))
    parts = [
        f'<svg class="faithfulness-curve" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="faithfulness curve" '
        'font-family="sans-serif">',
        f'<line x1="{margin}" y1="{py(1):.1f}" x2="{width - margin}" '
        f'y2="{py(1):.1f}" stroke="#999" stroke-dasharray="3 3"/>',
        f'<line x1="{margin}" y1="{py(0):.1f}" x2="{width - margin}" y2="{py(0):.1f}" stroke="#999"/>',
        f'<polygon points="{band}" fill="#1f77b4" fill-opacity="0.15"/>',
    ]  # fmt: skip
    for name, colour in (("random", "#999999"), ("circuit", "#1f77b4")):
        if name in series:
            line = " ".join(points(series[name]))
            parts.append(
                f'<polyline class="curve-{name}" points="{line}" fill="none" stroke="{colour}" '
                'stroke-width="2"/>'
            )
            parts += [
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>'
                for x, y in zip(xs, series[name], strict=True)
            ]
    parts += [
        f'<text x="{px(x):.1f}" y="{height - margin + 16}" font-size="10" text-anchor="middle">'
        f"{fraction:.1%}</text>"
        for fraction, x in zip(curve.fractions, xs, strict=True)
    ] + [
        f'<text x="{margin - 6}" y="{py(y) + 3:.1f}" font-size="10" text-anchor="end">{y:.1f}</text>'
        for y in (0.0, 0.5, 1.0)
    ]
    random = "" if curve.random is None else f" · random CPR {curve.random_cpr:.3f}"
    ranking = "signed ranking" if result.scores.method in edges.METHODS else "rank order"
    parts.append(
        f'<text x="{width / 2}" y="{height - 10}" font-size="12" text-anchor="middle">fraction of edges '
        f'asked for</text><text x="14" y="{height / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {height / 2})">faithfulness</text><text x="{width - margin}" '
        f'y="{margin - 14}" font-size="11" text-anchor="end">'
        f"CPR {curve.cpr:.3f} ({ranking}) · CMD {curve.cmd:.3f} (|score| ranking){random}</text></svg>"
    )  # fmt: skip
    return "".join(parts)


def edges_against_heads(result: EdgeCircuitResult) -> list[str]:
    """Why the edge circuit keeps less of the metric than the head classes' heads alone (where it does):
    the two ratios ablate different things against different baselines."""
    heads = result.heads
    edges_kept = float(result.faithfulness.faithfulness[0])
    if heads is None or not heads.classes or heads.faithfulness is None:
        return []  # nothing to compare with
    if edges_kept >= heads.faithfulness.ratio:
        return []
    _, high = result.faithfulness.ci()  # as the report's CI of the edges' ratio
    no_ci = math.isnan(heads.faithfulness.ratio_ci[0]) or math.isnan(high[0])  # too few families for a CI
    if no_ci or heads.faithfulness.ratio_ci[0] <= float(high[0]):  # else the two CIs do not overlap
        why = "with no CI (too few prompts or families)" if no_ci else "their 95% CIs overlap:"
        return [
            f"the circuit's edges keep {edges_kept:.2f} of the metric, the heads alone "
            f"{heads.faithfulness.ratio:.2f}, but {why} no difference is shown"
        ]
    n_edges, n_heads = int(result.circuit.sum()), sum(len(c.heads) for c in heads.classes)
    every_edge = float(result.faithfulness.full.mean() - result.faithfulness.empty.mean())
    lines = [
        f"the circuit's {n_edges:,} edges keep {edges_kept:.2f} of the metric, the {n_heads} heads alone "
        f"{heads.faithfulness.ratio:.2f}: the two ratios ablate different things",
        f"the edges' ratio ablates every edge outside the circuit, the MLPs' and the embeddings' too, and is "
        f"relative to what ablating every edge removes ({every_edge:+.2f} on the held-out prompts)",
        "the heads' ratio ablates only the other heads' outputs (every MLP, the embeddings and every path "
        "between the components kept stay whole) and is relative to what ablating every head removes "
        f"({heads.extras.all_heads_drop:+.2f})",
        f"so the {n_edges:,} edges miss paths the heads' ratio never removes: through MLPs, from the "
        "embeddings, or between heads beyond the circuit's edges; a larger circuit (--edges, --target) "
        "keeps more of them",
    ]
    above = "the heads alone keep more than 1: the other heads, ablated together, had lowered the answer"
    return lines + ([above] if heads.faithfulness.ratio > 1 else [])


def edge_sections(result: EdgeCircuitResult, top: int | None = None) -> Report:
    """The report: the finding, the split, the circuit's graph, its faithfulness, its edges (the `top`
    strongest; None: every one), the faithfulness curve, the head classes."""
    lines = edge_headline(result)
    edges = result.circuit_edge_rows()[:top]
    kept = f"the circuit's {int(result.circuit.sum())} edges kept, every other edge ablated"
    by = "|score|" if result.removal is None else "|effect of removal|, measured first"
    shown = "every one, strongest first" if top is None else f"strongest {top} by {by}"
    value, notes = ("score", []) if result.removal is None else ("effect of removal", [removal_note(result)])
    cells = [
        [row.writer, row.reader, f"{row.score:+.4f}" if result.removal is None
         else ("" if row.removal_measured else "≈") + f"{row.removal_effect:+.3f}",
         "-" if row.frequency is None else f"{row.frequency:.2f}"]
        for row in edges
    ]  # fmt: skip
    caption = (
        "<p>Edges coloured by what they feed: query (blue), key (green), value (red), MLP or logits "
        f"(grey); width ~ |{value}|. Hover an edge for its {value}.</p>"
    )
    faithfulness = (
        "Faithfulness (held out)" if result.held_out else "Faithfulness (on the prompts that found it)"
    )
    columns = ["writer", "reader", value, "frequency"]
    sections = [
        Section(title="What chose and what tested", lines=lines[1:]),
        Section(title="Circuit", figures=[caption, circuit_view(result)]),
        faithfulness_section(result.faithfulness.summary(), result.faithfulness_strata(), kept, faithfulness),
        Section(
            title=f"Circuit edges ({shown})", notes=[*notes, stability_note(result)],
            table=Table(columns=columns, rows=cells, right=columns[2:]),
        ),
    ]  # fmt: skip
    if result.curve is not None:
        curve = result.curve
        low, high = curve.result.ci()
        random = curve.random.faithfulness.tolist() if curve.random is not None else None
        random_edges = curve.random_n_edges or [None] * len(curve.fractions)
        columns = list(CURVE_COLUMNS)
        rows = [
            [f"{fraction:.1%}", str(curve.n_edges[i]), f"{float(curve.faithfulness[i]):.3f}",
             ci_text((float(low[i]), float(high[i])), 3, sign=False),
             "" if random is None else f"{random[i]:.3f}",
             "" if random_edges[i] is None else str(random_edges[i])]
            for i, fraction in enumerate(curve.fractions)
        ]  # fmt: skip
        title = "Faithfulness curve (top-|score| circuits, everything else ablated)"
        table = Table(columns=columns, rows=rows, right=columns)
        sections.append(Section(title=title, table=table, figures=[curve_svg(result)]))
    if result.heads is not None:
        heads = finding_report(result.heads)
        sections += [
            Section(title=heads.title, lines=heads.headline + edges_against_heads(result)),
            *heads.sections,
        ]
    title = f"Edge circuit of {result.model} on {result.task.name}"
    return Report(title=title, headline=lines[:1], sections=sections)


def write_edge_report(result: EdgeCircuitResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to `out`, or to the console; the "table" format lists the TOP_ROWS
    strongest edges, the others every one."""
    top = TOP_ROWS if format == "table" else None
    write_sections(edge_sections(result, top), format, out, console, result, width=140)
