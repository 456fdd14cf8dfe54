"""A HopResult as the one report structure (`circuits.sections`) and the lookup-chain figure: the held-out
accuracy, each hop's heads against random heads, then what carries one hop's result to the next."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.console import Console

from circuits.hop.results import HopPath, HopResult
from circuits.output import pyplot, save_figure
from circuits.sections import FORMATS as FORMATS  # the formats `interp render` offers
from circuits.sections import (
    Report,
    Section,
    Table,
    ci_text,
    class_sections,
    layer_head_map,
    value_ci,
    write_sections,
)
from interp.viz import heatmap_grid

LEGEND = (
    "Hop j lands on t_j, the token after the last occurrence, before where hop j-1 landed (hop 1: the "
    "query), of that position's token. Attention: the query's attention to t_j - 1 or t_j, held-out mean. "
    "Drop: the drop of the answer's logit minus the other symbols' mean logit when the heads' outputs are "
    "mean-ablated at the query only (logits; [95% bootstrap CI over held-out sequences]); confirmed when it "
    "exceeds the drop of random heads of the same layers (CI of the difference above 0) and the heads' "
    "mean attention is at least the threshold on held-out sequences too. Heads are chosen on the discovery "
    "half."
)
LOOKUP_COLUMNS = [
    ("layers", lambda c: ", ".join(map(str, c.details["layers"])) or "-"),
    ("attention", lambda c: ", ".join(f"{value:.2f}" for value in c.details["attention"]) or "-"),
    ("drop", lambda c: value_ci(c.heldout.drop, c.heldout.drop_ci, 2)),
]  # each hop's own columns in the standard class table (`class_sections`)
PATH_LEGEND = (
    "Path patching, held-out sequences: hop j's heads output at the query their value on another held-out "
    "sequence (hop j lands elsewhere there), every other head frozen to the clean run, so the change reaches "
    "hop j+1's heads only through one route: their query (q), key (k) or value (v) input, or every head of "
    "the layers between the hops (via; from them on, everything is recomputed). Effect: the drop of the "
    "answer's logit minus the other symbols' mean logit (logits, [95% bootstrap CI]); the route carries hop "
    "j's result when the effect exceeds that of random heads of the senders' layers patched the same way (CI "
    "of the difference above 0)."
)
PATH_COLUMNS = (
    "hops", "senders -> receivers", "route", "effect", "random senders", "beyond random", "carries"
)  # fmt: skip


def hop_headline(result: HopResult) -> list[str]:
    """The finding: accuracy, each hop's heads, what carries each hop's result; last, the sequences."""
    chain = [f"{look.name}: {', '.join(look.heads) or 'none'} ({look.verdict})" for look in result.lookups]
    return [
        f"{result.model_name} answers {result.hops}-hop induction with accuracy {result.accuracy:.2f} "
        f"{ci_text(result.accuracy_ci, 2, sign=False)} on held-out sequences (chance {result.chance:.2f}).",
        "Lookup chain: " + "; ".join(chain) + ".",
        *(path_line(result, j) for j in sorted({path.from_hop for path in result.paths})),
        f"Sequences: {result.n_sequences} from the task's eval stream (seed {result.seed}), half to choose "
        f"heads (attention >= {result.min_attention} and a positive ablation change), half to test them.",
    ]


def path_line(result: HopResult, from_hop: int) -> str:
    """What carries hop `from_hop`'s result to the next hop's heads: the routes that carry it first."""
    paths = [path for path in result.paths if path.from_hop == from_hop]

    def route(path: HopPath) -> str:
        return f"{path.route} {value_ci(path.difference, path.difference_ci, 2)}"

    found = "; ".join(route(path) for path in paths if path.carries) or "no route beats random senders"
    others = ", ".join(route(path) for path in paths if not path.carries)
    return (
        f"Hop {from_hop} -> hop {from_hop + 1} (path patching {', '.join(paths[0].senders)} -> "
        f"{', '.join(paths[0].receivers)}, beyond random senders): carried by {found}"
        + (f"; not by {others}" if others else "")
        + "."
    )


def hop_sections(result: HopResult) -> Report:
    """The report: the finding, what chose and what tested, each hop's heads as the standard classes
    (`class_sections`, with the heat maps of the query's attention), what carries each hop's result to
    the next."""
    lines = hop_headline(result)
    heatmaps = [
        layer_head_map(
            result.attention[j],
            f"Hop {j + 1}: the query's attention to t_{j + 1} - 1 or t_{j + 1} (held out)",
            f"hop {j + 1}'s heads: {', '.join(lookup.heads) or 'none'} ({lookup.verdict})",
            signed=False,
            limit=1.0,
        )
        for j, lookup in enumerate(result.lookups)
    ]
    path_rows = [
        [f"{p.from_hop} -> {p.to_hop}", f"{', '.join(p.senders)} -> {', '.join(p.receivers)}", p.route,
         value_ci(p.effect, p.effect_ci, 2), ", ".join(f"{e:+.2f}" for e in p.random_effects),
         value_ci(p.difference, p.difference_ci, 2), "yes" if p.carries else "no"]
        for p in result.paths
    ]  # fmt: skip
    classes, strata = class_sections(result.lookups, details=LOOKUP_COLUMNS)
    sections = [
        Section(title="What chose and what tested", lines=[lines[-1], f"Model: {result.provenance}."]),
        replace(classes, notes=[LEGEND], figures=[heatmap_grid(heatmaps)]),
        strata,
    ]
    if result.paths:
        sections.append(
            Section(
                title="What carries each hop's result to the next hop's heads",
                table=Table(columns=list(PATH_COLUMNS), rows=path_rows),
                notes=[PATH_LEGEND],
            )
        )
    return Report(title=f"Hop induction in {result.model_name}", headline=lines[:-1], sections=sections)


def write_hop_report(result: HopResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    write_sections(hop_sections(result), format, out, console, result, width=140)


def lookup_chain_figure(result: HopResult, out: str | Path | None = None):
    """The lookup chain: left, the query's held-out attention per hop [layer, head] (chosen heads
    outlined); right, a held-out sequence with each hop's lookup as an arrow from the query at its heads'
    layer (dotted: not confirmed) and the routes carrying each hop's result to the next (path patching,
    beyond random senders, logits). Returns the matplotlib Figure; with `out` (.png, .svg, .pdf) writes it."""
    plt = pyplot()
    hops, n_layers, n_heads = result.attention.shape
    colours = plt.get_cmap("tab10").colors
    figure = plt.figure(figsize=(2.2 * hops + 7, 3.2))
    grid = figure.add_gridspec(1, hops + 1, width_ratios=[1.0] * hops + [3.6])
    for j, lookup in enumerate(result.lookups):
        axes = figure.add_subplot(grid[0, j])
        axes.imshow(result.attention[j].numpy(), vmin=0, vmax=1, cmap="Greys", origin="lower", aspect="auto")
        for label in lookup.heads:
            layer, head = (int(part) for part in label[1:].split("H"))
            axes.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, lw=2, ec=colours[j]))
        axes.set_title(f"hop {j + 1}: query's attention", fontsize=9, color=colours[j])
        axes.set(xticks=range(n_heads), yticks=range(n_layers))
        axes.set_xlabel("head", fontsize=8)
        if j == 0:
            axes.set_ylabel("layer", fontsize=8)
    axes = figure.add_subplot(grid[0, hops])
    tokens, path = result.example_tokens, result.example_path
    first = max(0, min(path) - 2)
    for position in range(first, len(tokens) - 1):
        axes.text(position, -0.6, str(tokens[position]), ha="center", va="center", fontsize=8,
                  fontweight="bold" if position in path else "normal")  # fmt: skip
    query = path[0]
    layers = [look.details["layers"] for look in result.lookups]
    heights = [sum(found) / len(found) if found else None for found in layers]
    for j, (lookup, height) in enumerate(zip(result.lookups, heights, strict=True)):
        path_arrow = {"arrowstyle": "->", "color": "grey", "connectionstyle": "arc3,rad=0.3"}
        axes.annotate("", xy=(path[j + 1], -0.3), xytext=(path[j], -0.3), arrowprops=path_arrow)
        if height is None:
            continue
        style = "-" if lookup.verdict == "confirmed" else ":"
        lookup_arrow = {"arrowstyle": "->", "color": colours[j], "linestyle": style, "lw": 1.8}
        axes.annotate("", xy=(path[j + 1], height), xytext=(query, height), arrowprops=lookup_arrow)
        axes.text((query + path[j + 1]) / 2, height + 0.12, f"hop {j + 1}: {', '.join(lookup.heads)}",
                  ha="center", fontsize=8, color=colours[j])  # fmt: skip
        axes.plot([path[j + 1]] * 2, [-0.35, height], color=colours[j], lw=0.6, alpha=0.5)
    for from_hop in sorted({found.from_hop for found in result.paths}):
        low, high = heights[from_hop - 1], heights[from_hop]
        carrying = [found for found in result.paths if found.from_hop == from_hop and found.carries]
        label = "\n".join(f"{found.route} {found.difference:+.2f}" for found in carrying) or "no route"
        style = {"arrowstyle": "->", "color": "black", "lw": 1.2, "linestyle": "-" if carrying else ":"}
        axes.annotate("", xy=(query + 0.5, high), xytext=(query + 0.5, low), arrowprops=style)
        axes.text(query + 0.6, (low + high) / 2, label, fontsize=7, va="center")
    axes.set(xlim=(first - 1, len(tokens) + 0.5), ylim=(-1, n_layers), yticks=range(n_layers))
    axes.set_ylabel("layer of the lookup's heads", fontsize=8)
    axes.set_xlabel("position in a held-out sequence (the query is the last)", fontsize=8)
    axes.set_title(f"{result.model_name}: the lookup chain (accuracy {result.accuracy:.2f})", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, out)
