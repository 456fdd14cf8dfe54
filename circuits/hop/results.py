"""What `hop_report` finds, as a `circuits.finding.Finding` with `HopFigures`, and how they read: the
held-out accuracy, each hop's heads as a class "hop j" against random heads (with the query's attention
as heat maps), what carries one hop's result to the next (`lookup_chain_figure` draws the chain).
Effects are in logits: the drop of the answer's logit minus the mean logit of the other symbols (clean -
ablated or patched; positive: the heads help)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jaxtyping import Float
from torch import Tensor

from circuits.evidence import ClassVerdict
from circuits.finding import ClassView, Extras, Finding
from circuits.output import pyplot, save_figure
from circuits.sections import (
    Section,
    ci_text,
    class_sections,
    held_out_drop,
    layer_head_map,
    random_effects_text,
    value_ci,
)
from interp.types import label_head
from interp.viz import heatmap_grid

LEGEND = (
    "Hop j lands on t_j, the token after the last occurrence, before where hop j-1 landed (hop 1: the "
    "query), of that position's token. Attention: the query's attention to t_j - 1 or t_j, held-out mean "
    "(sequences where either position is also another hop's left out). "
    "Drop: the drop of the answer's logit minus the other symbols' mean logit when the heads' outputs are "
    "mean-ablated at the query only (logits; [95% bootstrap CI over held-out sequences]); confirmed when it "
    "exceeds the drop of random heads of the same layers, none of another hop (the CI of the difference, "
    "over held-out sequences and the random sets, above 0) and the heads' "
    "mean attention is at least the threshold on held-out sequences too. Heads are chosen on the discovery "
    "half."
)
LOOKUP_COLUMNS = [
    ("layers", lambda c: ", ".join(map(str, c.details["layers"])) or "-"),
    ("attention", lambda c: ", ".join(f"{value:.2f}" for value in c.details["attention"]) or "-"),
    ("drop", lambda c: held_out_drop(c, 2)),
]  # each hop's own columns in the standard class table (`class_sections`)
PATH_LEGEND = (
    "Path patching, held-out sequences: hop j's heads output at the query their value on another held-out "
    "sequence (hop j lands elsewhere there), every other head frozen to the clean run, so the change reaches "
    "hop j+1's heads only through one route: their query (q), key (k) or value (v) input, or every head of "
    "the layers between the hops (via; from them on, everything is recomputed). Drop: the drop of the "
    "answer's logit minus the other symbols' mean logit (logits, [95% bootstrap CI]); the route carries hop "
    "j's result (confirmed) when the effect exceeds that of random heads of the senders' layers patched the "
    "same way (CI of the difference above 0)."
)
PATH_COLUMNS = [
    ("to", lambda p: f"hop {p.details['to_hop']}: {', '.join(p.details['receivers'])}"),
    ("route", lambda p: p.details["route"]),
    ("drop", lambda p: held_out_drop(p, 2)),
    ("random senders", lambda p: random_effects_text(p, 2)),
]  # each route's own columns in the standard class table (`class_sections`), its senders the class


def carries(path: ClassVerdict) -> bool:
    """Whether a path's route carries its hop's result: its drop beyond random senders has its CI above 0."""
    return path.verdict == "confirmed"


@dataclass(kw_only=True)
class HopFigures(Extras):
    """`hop_report`'s own figures, on the held-out half of the sequences (but `discovery_change`).
    The finding's classes are hop j's lookup (to t_j, seen from the query) as "hop j": its heads chosen
    on the discovery half (attention to t_j - 1 or t_j >= `min_attention`, ablated alone a drop whose CI
    lies above 0), judged as `LEGEND` says; "not found" (NaN figures) where none was chosen; details:
    "hop" (1..hops), "layers", "attention" (one per head), "side" (where its heads attend more: hop j's
    "occurrence" t_j - 1 or its "target" t_j; absent from files saved before it). paths: what carries
    hop j's result to hop j + 1's heads, each a class of hop j's heads against random senders of their
    layers (`PATH_LEGEND`); details "from_hop", "to_hop", "receivers" and "route" (the receivers' "q",
    "k" or "v", or "via L<a>[-L<b>]": every head between); it `carries` the result when confirmed."""

    hops: int
    accuracy: float  # held out: the answer is the top prediction at the query
    accuracy_ci: tuple[float, float]
    chance: float  # 1 / the symbols that can be the answer
    attention: Float[Tensor, "hops layer head"]  # held out: the query's attention to t_j - 1 or t_j
    discovery_change: Float[Tensor, "layer head"]  # each head ablated alone at the query
    example_tokens: list[int]  # one held-out sequence, for the figure
    example_path: list[int]  # the query, then each hop's target in it
    paths: list[ClassVerdict]  # hop j -> j + 1, for hops with heads in successive layers, in order

    def title(self, finding: Finding) -> str:
        return f"Hop induction in {finding.model}"

    def headline(self, finding: Finding) -> list[str]:
        """The finding: accuracy, each hop's heads, what carries each hop's result."""
        chain = [f"{c.name}: {', '.join(c.heads) or 'none'} ({c.verdict})" for c in finding.classes]
        return [
            f"{finding.model} answers {self.hops}-hop induction with accuracy {self.accuracy:.2f} "
            f"{ci_text(self.accuracy_ci, 2, sign=False)} on held-out sequences (chance {self.chance:.2f}).",
            "Lookup chain: " + "; ".join(chain) + ".",
            *(self.path_line(j) for j in sorted({path.details["from_hop"] for path in self.paths})),
        ]

    def path_line(self, from_hop: int) -> str:
        """What carries hop `from_hop`'s result to the next hop's heads: the routes that carry it first."""
        paths = [path for path in self.paths if path.details["from_hop"] == from_hop]

        def route(path: ClassVerdict) -> str:
            return f"{path.details['route']} {value_ci(path.heldout.beyond, path.heldout.beyond_ci, 2)}"

        found = "; ".join(route(path) for path in paths if carries(path)) or "no route beats random senders"
        others = ", ".join(route(path) for path in paths if not carries(path))
        return (
            f"Hop {from_hop} -> hop {from_hop + 1} (path patching {', '.join(paths[0].heads)} -> "
            f"{', '.join(paths[0].details['receivers'])}, beyond random senders): carried by {found}"
            + (f"; not by {others}" if others else "")
            + "."
        )

    def chose_lines(self, finding: Finding) -> list[str]:
        settings = finding.settings
        return [
            f"Sequences: {settings.n_sequences} from the task's eval stream (seed {settings.seed}), half to "
            f"choose heads (attention >= {settings.min_attention} and an ablation change whose 95% CI lies "
            "above 0), half to test them."
        ]

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        heatmaps = [
            layer_head_map(
                self.attention[j],
                f"Hop {j + 1}: the query's attention to t_{j + 1} - 1 or t_{j + 1} (held out)",
                f"hop {j + 1}'s heads: {', '.join(lookup.heads) or 'none'} ({lookup.verdict})",
                signed=False,
                limit=1.0,
            )
            for j, lookup in enumerate(finding.classes)
        ]
        return ClassView(columns=LOOKUP_COLUMNS, notes=[LEGEND], figures=[heatmap_grid(heatmaps)])

    def extra_sections(self, finding: Finding, wide: bool) -> list[Section]:
        """The paths as the standard class table of their senders (`PATH_COLUMNS`)."""
        if not self.paths:
            return []
        routes = class_sections(self.paths, ClassView(columns=PATH_COLUMNS))[0]
        title = "What carries each hop's result to the next hop's heads"
        return [Section(title=title, table=routes.table, notes=[PATH_LEGEND])]


def lookup_chain_figure(finding: Finding, out: str | Path | None = None):
    """The lookup chain of a hop finding: left, the query's held-out attention per hop [layer, head]
    (chosen heads outlined); right, a held-out sequence with each hop's lookup as an arrow from the query
    at its heads' layer to the position they attend to more (hop j's occurrence t_j - 1 or target t_j;
    dotted: not confirmed) and the routes carrying each hop's result to the next
    (path patching, beyond random senders, logits). Returns the matplotlib Figure; with `out` (.png,
    .svg, .pdf) writes it."""
    plt = pyplot()
    figures: HopFigures = finding.extras
    hops, n_layers, n_heads = figures.attention.shape
    colours = plt.get_cmap("tab10").colors
    figure = plt.figure(figsize=(2.2 * hops + 7, 3.2))
    grid = figure.add_gridspec(1, hops + 1, width_ratios=[1.0] * hops + [3.6])
    for j, lookup in enumerate(finding.classes):
        axes = figure.add_subplot(grid[0, j])
        axes.imshow(figures.attention[j].numpy(), vmin=0, vmax=1, cmap="Greys", origin="lower", aspect="auto")
        for label in lookup.heads:
            layer, head = label_head(label)
            axes.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, lw=2, ec=colours[j]))
        axes.set_title(f"hop {j + 1}: query's attention", fontsize=9, color=colours[j])
        axes.set(xticks=range(n_heads), yticks=range(n_layers))
        axes.set_xlabel("head", fontsize=8)
        if j == 0:
            axes.set_ylabel("layer", fontsize=8)
    axes = figure.add_subplot(grid[0, hops])
    tokens, path = figures.example_tokens, figures.example_path
    first = max(0, min(path) - 2)
    for position in range(first, len(tokens) - 1):
        axes.text(position, -0.6, str(tokens[position]), ha="center", va="center", fontsize=8,
                  fontweight="bold" if position in path else "normal")  # fmt: skip
    query = path[0]
    layers = [look.details["layers"] for look in finding.classes]
    heights = [sum(found) / len(found) if found else None for found in layers]
    for j, (lookup, height) in enumerate(zip(finding.classes, heights, strict=True)):
        path_arrow = {"arrowstyle": "->", "color": "grey", "connectionstyle": "arc3,rad=0.3"}
        axes.annotate("", xy=(path[j + 1], -0.3), xytext=(path[j], -0.3), arrowprops=path_arrow)
        if height is None:
            continue
        style = "-" if lookup.verdict == "confirmed" else ":"
        lookup_arrow = {"arrowstyle": "->", "color": colours[j], "linestyle": style, "lw": 1.8}
        side = lookup.details.get("side", "target")
        looked = path[j + 1] - (side == "occurrence")
        axes.annotate("", xy=(looked, height), xytext=(query, height), arrowprops=lookup_arrow)
        label = f"hop {j + 1}: {', '.join(lookup.heads)} (to the {side})"
        axes.text((query + looked) / 2, height + 0.12, label, ha="center", fontsize=8, color=colours[j])
        axes.plot([looked] * 2, [-0.35, height], color=colours[j], lw=0.6, alpha=0.5)
    for from_hop in sorted({found.details["from_hop"] for found in figures.paths}):
        low, high = heights[from_hop - 1], heights[from_hop]
        carrying = [p for p in figures.paths if p.details["from_hop"] == from_hop and carries(p)]
        label = "\n".join(f"{p.details['route']} {p.heldout.beyond:+.2f}" for p in carrying) or "no route"
        style = {"arrowstyle": "->", "color": "black", "lw": 1.2, "linestyle": "-" if carrying else ":"}
        axes.annotate("", xy=(query + 0.5, high), xytext=(query + 0.5, low), arrowprops=style)
        axes.text(query + 0.6, (low + high) / 2, label, fontsize=7, va="center")
    axes.set(xlim=(first - 1, len(tokens) + 0.5), ylim=(-1, n_layers), yticks=range(n_layers))
    axes.set_ylabel("layer of the lookup's heads", fontsize=8)
    axes.set_xlabel("position in a held-out sequence (the query is the last)", fontsize=8)
    axes.set_title(f"{finding.model}: the lookup chain (accuracy {figures.accuracy:.2f})", fontsize=9)
    figure.tight_layout()
    return save_figure(figure, out)
