"""Rendering a HopResult: terminal, JSON and Markdown, and the lookup-chain figure.

    write_hop_report(result, "markdown", "hop.md", Console())   # or "table", "json"
    lookup_chain_figure(result, "hop.png")

Every format opens with the finding: the held-out accuracy, then each hop's heads (their layers,
attention to the hop's target, and the ablation change against random heads).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from circuits.hop.results import HopResult
from circuits.icl.training import save_figure
from circuits.output import write_output

FORMATS = ("table", "json", "markdown")
LEGEND = (
    "Hop j lands on t_j, the token after the last occurrence, before where hop j-1 landed (hop 1: the "
    "query), of that position's token. Attention: the query's attention to t_j - 1 or t_j, held-out mean. "
    "Change: the drop of the answer's logit minus the other symbols' mean logit when the heads' outputs are "
    "mean-ablated at the query only (logits; [95% bootstrap CI over held-out sequences]); confirmed when "
    "it exceeds the change of random heads of the same layers (CI of the difference above 0) and the "
    "heads' mean attention is at least the threshold on held-out sequences too. Heads are chosen on the "
    "discovery half."
)
COLUMNS = ("hop", "heads", "layers", "attention", "change", "beyond random", "verdict")


def _signed(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"


def _ci(interval: tuple[float, float]) -> str:
    return f"[{_signed(interval[0])}, {_signed(interval[1])}]"


def summary_lines(result: HopResult) -> list[str]:
    """The finding: accuracy, then the layer of each hop's lookup."""
    low, high = result.accuracy_ci
    lines = [
        f"{result.model_name} answers {result.hops}-hop induction with accuracy {result.accuracy:.2f} "
        f"[{low:.2f}, {high:.2f}] on held-out sequences (chance {result.chance:.2f})."
    ]
    chain = [
        f"hop {lookup.hop}: " + (", ".join(lookup.heads) if lookup.heads else "none") + f" ({lookup.verdict})"
        for lookup in result.lookups
    ]
    lines.append("Lookup chain: " + "; ".join(chain) + ".")
    lines.append(
        f"Sequences: {result.n_sequences} from the task's eval stream (seed {result.seed}), half to choose "
        f"heads (attention >= {result.min_attention} and a positive ablation change), half to test them."
    )
    return lines


def _rows(result: HopResult) -> list[tuple[str, ...]]:
    return [
        (
            str(lookup.hop),
            ", ".join(lookup.heads) or "-",
            ", ".join(map(str, lookup.layers)) or "-",
            ", ".join(f"{value:.2f}" for value in lookup.attention) or "-",
            f"{_signed(lookup.change)} {_ci(lookup.change_ci)}",
            f"{_signed(lookup.difference)} {_ci(lookup.difference_ci)}",
            lookup.verdict,
        )
        for lookup in result.lookups
    ]


def render_table(result: HopResult, console: Console) -> None:
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)
    table = Table(title="Each hop's heads, tested on held-out sequences", box=box.SIMPLE_HEAD)
    for column in COLUMNS:  # long cells wrap at a space or comma, never cut
        table.add_column(column, overflow="fold", min_width=len(column) if column != "beyond random" else 6)
    for row in _rows(result):
        table.add_row(*row)
    console.print(table)
    console.print(LEGEND, style="dim", markup=False)
    console.print(f"Model: {result.provenance}.", style="dim", markup=False)


def to_dict(result: HopResult) -> dict[str, Any]:
    """The report's figures as plain JSON data (`--save` writes the full result instead)."""

    def plain(value: float) -> float | None:
        return None if math.isnan(value) else value

    return {
        "model": result.model_name,
        "hops": result.hops,
        "accuracy": result.accuracy,
        "accuracy_ci": list(result.accuracy_ci),
        "chance": result.chance,
        "lookups": [
            {
                "hop": lookup.hop,
                "heads": lookup.heads,
                "layers": lookup.layers,
                "attention": lookup.attention,
                "change": plain(lookup.change),
                "change_ci": [plain(v) for v in lookup.change_ci],
                "difference": plain(lookup.difference),
                "difference_ci": [plain(v) for v in lookup.difference_ci],
                "verdict": lookup.verdict,
            }  # fmt: skip
            for lookup in result.lookups
        ],
        "provenance": result.provenance,
    }


def render_markdown(result: HopResult) -> str:
    out = [f"# Hop induction in {result.model_name}", ""] + [f"- {line}" for line in summary_lines(result)]
    out += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(row) + " |" for row in _rows(result)]
    out += ["", LEGEND, "", f"Model: {result.provenance}."]
    return "\n".join(out) + "\n"


def write_hop_report(result: HopResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    renderers = {
        "json": lambda: json.dumps(to_dict(result), indent=2),
        "markdown": lambda: render_markdown(result),
    }
    table = functools.partial(render_table, result)
    write_output(format, FORMATS, out, console, table, lambda fmt: renderers[fmt](), width=140)


def lookup_chain_figure(result: HopResult, out: str | Path | None = None):
    """The lookup chain: left, the query's held-out attention to each hop's occurrence or target for
    every [layer, head] (chosen heads outlined); right, one held-out sequence with the path of the hops
    (grey) and each hop's lookup drawn from the query as an arrow at the height of the layer of its
    heads (dotted: not confirmed). Returns the matplotlib Figure; with `out` (.png, .svg, .pdf) also
    writes it there."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError("Plotting needs matplotlib: pip install matplotlib") from error
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
        axes.set_xticks(range(n_heads))
        axes.set_yticks(range(n_layers))
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
    for j, lookup in enumerate(result.lookups):
        path_arrow = {"arrowstyle": "->", "color": "grey", "connectionstyle": "arc3,rad=0.3"}
        axes.annotate("", xy=(path[j + 1], -0.3), xytext=(path[j], -0.3), arrowprops=path_arrow)
        if not lookup.layers:
            continue
        height = sum(lookup.layers) / len(lookup.layers)
        style = "-" if lookup.verdict == "confirmed" else ":"
        lookup_arrow = {"arrowstyle": "->", "color": colours[j], "linestyle": style, "lw": 1.8}
        axes.annotate("", xy=(path[j + 1], height), xytext=(query, height), arrowprops=lookup_arrow)
        axes.text((query + path[j + 1]) / 2, height + 0.12, f"hop {j + 1}: {', '.join(lookup.heads)}",
                  ha="center", fontsize=8, color=colours[j])  # fmt: skip
        axes.plot([path[j + 1]] * 2, [-0.35, height], color=colours[j], lw=0.6, alpha=0.5)
    axes.set_xlim(first - 1, len(tokens) - 1)
    axes.set_ylim(-1, n_layers)
    axes.set_yticks(range(n_layers))
    axes.set_ylabel("layer of the lookup's heads", fontsize=8)
    axes.set_xlabel("position in a held-out sequence (the query is the last)", fontsize=8)
    axes.set_title(f"{result.model_name}: the lookup chain (accuracy {result.accuracy:.2f})", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, out)
