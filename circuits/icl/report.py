"""An ICLResult as the one report structure (`circuits.sections`: terminal, Markdown, a self-contained
HTML page) and its JSON data.

    write_icl_report(result, "html", "icl.html", Console())   # or "table", "json", "markdown"

Every format opens with the finding: the ICL score with its CI, then whether the induction heads
carry it beyond random heads of their layers on held-out documents, then the top heads by
attribution confirmed (or not) by exact ablation. The HTML page adds the loss per token, the
[layer, head] map of attributed changes, and the training run's curve when there is one.
"""

from __future__ import annotations

import base64
import io
import json
import math
from typing import Any

from rich.console import Console

from circuits.icl.results import ICLResult
from circuits.icl.training import plot_icl_over_training
from circuits.output import save_figure
from circuits.sections import Report, Section, Table, layer_head_map, write_sections

FORMATS = ("table", "json", "markdown", "html")
LEGEND = (
    "Change = ICL score with the head(s) ablated - without (nats): the drop of the context's benefit "
    "(-score), as circuits.evidence signs every effect; positive: without them the model uses its context "
    "less. Attributed: a first-order estimate on the discovery documents; exact: the "
    "ablated run on the held-out documents, which no head was chosen on; [95% bootstrap CI over documents]. "
    "A class is confirmed when its change exceeds that of random heads from the same layers (CI of the "
    "difference above 0); a head when its exact change is above 0."
)
HEAD_COLUMNS = ("head", "attributed", "exact (held-out)", "verdict")


def format_signed(value: float) -> str:
    """A value as reports write it: "+0.123" ("n/a" for NaN)."""
    return "n/a" if math.isnan(value) else f"{value:+.3f}"


def format_ci(interval: tuple[float, float]) -> str:
    """A confidence interval as reports write it: "[-0.012, +0.345]"."""
    return f"[{format_signed(interval[0])}, {format_signed(interval[1])}]"


def headline_verdict(result: ICLResult) -> str:
    """Whether the held-out ICL score establishes that the model uses its context (its CI below 0),
    and if not, how many documents would."""
    tested = result.heldout
    low, high = tested.ci
    if high < 0:
        return f"established: its 95% CI over the {tested.n_documents} held-out documents lies below 0"
    if tested.score >= 0:
        return f"not established: no sign on these {tested.n_documents} held-out documents that it does"
    needed = math.ceil(1.5 * tested.n_documents * ((high - low) / 2 / -tested.score) ** 2)
    return (
        f"not established at {tested.n_documents} held-out documents (the CI reaches 0); about {needed} "
        f"would settle it: pass --n-documents {result.discovery.n_documents + needed} (n_documents)"
    )


def summary_lines(result: ICLResult) -> list[str]:
    """The finding, in order: the held-out score, each class against random heads, the documents."""
    tested, every = result.heldout, result.score
    lines = [
        f"ICL score of {result.model_name} on {tested.n_documents} held-out documents: {tested.score:+.3f} "
        f"nats {format_ci(tested.ci)} (loss at {result.windows.describe()}: {tested.late_loss:.3f} - "
        f"{tested.early_loss:.3f}; negative: later tokens are predicted better, from their context); "
        f"that the model uses its context is {headline_verdict(result)}."
    ]
    n_ablated = tested.n_documents if result.n_ablated is None else result.n_ablated
    for found in result.classes:
        draws = ", ".join(f"{change:+.3f}" for change in found.random_changes)
        distinct = len({tuple(heads) for heads in found.random_sets})
        kind = "random same-layer sets" if found.random_same_layers else "random sets (from other layers too)"
        lines.append(
            f"{found.name.capitalize()} heads ({len(found.heads)} {found.found_by}): ablating them changes "
            f"the ICL score of {n_ablated} held-out documents by {found.change:+.3f} "
            f"{format_ci(found.change_ci)}; {kind} "
            f"({draws}; {distinct} distinct); beyond random {found.difference:+.3f} "
            f"{format_ci(found.difference_ci)}: {found.verdict}."
        )
    if not result.classes:
        lines.append(
            "No class tested: interp heads confirms no induction head in this model (or none was given)."
        )
    confirmed = [h.head for h in result.heads if h.verdict == "confirmed"]
    lines.append(
        f"Top {len(result.heads)} heads by attribution: {len(confirmed)} confirmed by exact ablation on "
        f"held-out documents ({', '.join(confirmed) or 'none'})."
    )
    lines.append(
        f"Documents: {every.n_documents} from {result.source} (every one: {every.score:+.3f} "
        f"{format_ci(every.ci)}); {result.discovery.n_documents} discovery documents rank the heads (ICL "
        f"score {result.discovery.score:+.3f}), {tested.n_documents} held-out documents test them: each "
        f"scored, the first {n_ablated} ablated ({result.ablation} ablation of each head's z)."
    )
    return lines


def loss_bins(result: ICLResult) -> list[tuple[str, float]]:
    """The mean loss per token in doubling ranges of tokens: ("1", 9.8), ("2-3", 5.0), ("4-7", ...), ..."""
    curve = result.loss_curve
    bins, start = [], 1
    while start <= len(curve):
        end = min(2 * start - 1, len(curve))
        label = str(start) if start == end else f"{start}-{end}"
        bins.append((label, curve[start - 1 : end].mean().item()))
        start *= 2
    return bins


def _head_rows(result: ICLResult) -> list[list[str]]:
    return [
        [h.head, format_signed(h.attributed), f"{format_signed(h.exact)} {format_ci(h.exact_ci)}", h.verdict]
        for h in result.heads
    ]


def _training_lines(result: ICLResult) -> list[str]:
    curve = result.training
    if curve is None:
        return []
    best = curve.induction.groupby("step")["induction"].max()
    cells = ", ".join(
        f"{step}: {score:+.2f} (ind {best.get(step, float('nan')):.2f})"
        for step, score in zip(curve.steps, curve.scores, strict=True)
    )
    return [f"Across training (step: ICL score, highest induction score): {cells}."]


def to_dict(result: ICLResult) -> dict[str, Any]:
    """The report's figures as plain JSON data (`--save` writes the full result instead)."""

    def score(found) -> dict[str, Any]:
        return {
            "score": found.score, "ci": list(found.ci), "early_loss": found.early_loss,
            "late_loss": found.late_loss, "n_documents": found.n_documents,
        }  # fmt: skip

    return {
        "model": result.model_name,
        "provenance": result.provenance,
        "documents": result.source,
        "windows": {
            "early": result.windows.early,
            "late": result.windows.late,
            "width": result.windows.width,
        },
        "ablation": result.ablation,
        "icl_score": score(result.score),
        "discovery": score(result.discovery) | {"documents": result.discovery_names},
        "heldout": score(result.heldout)
        | {
            "documents": result.heldout_names,
            "n_ablated": result.n_ablated,
            "headline": headline_verdict(result),
        },
        "classes": [vars(found) for found in result.classes],
        "heads": [vars(head) for head in result.heads],
        "loss_by_token": dict(loss_bins(result)),
        "training": None
        if result.training is None
        else {"steps": result.training.steps, "icl_scores": result.training.scores, "ci": result.training.ci},
        "legend": LEGEND,
    }


def render_json(result: ICLResult) -> str:
    return json.dumps(to_dict(result), indent=2, allow_nan=False)


def _png(figure) -> str:
    """A matplotlib figure as an inline <img>."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="" src="data:image/png;base64,{data}">'


def loss_curve_figure(result: ICLResult, out: str | None = None):
    """The mean loss per token (log-scaled token axis) with its 95% band and the windows shaded; with
    `out` (.png, .svg, .pdf) also written there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tokens = range(1, len(result.loss_curve) + 1)
    mean, se = result.loss_curve.numpy(), result.loss_curve_se.numpy()
    figure, axes = plt.subplots(figsize=(6.5, 3.2))
    axes.fill_between(tokens, mean - 1.96 * se, mean + 1.96 * se, color="C0", alpha=0.2, linewidth=0)
    axes.plot(tokens, mean, color="C0", linewidth=1)
    for centre in (result.windows.early, result.windows.late):
        window = result.windows.tokens(centre)
        axes.axvspan(window[0], window[-1], color="C1", alpha=0.15)
    axes.set_xscale("log")
    axes.set_xlabel("token (position in the document)")
    axes.set_ylabel("loss (nats)")
    axes.set_title(
        f"Loss per token, mean over {result.score.n_documents} documents (windows shaded)", fontsize=10
    )
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return save_figure(figure, out)


def icl_sections(result: ICLResult, figures: bool = True) -> Report:
    """The report: the finding, what chose and what tested, the classes against random heads, the top
    heads, the loss per token and across training; figures (the loss curve, the training curve, the
    [layer, head] map of attributed changes) unless `figures` is False (they need matplotlib)."""
    lines = summary_lines(result)
    every_head = layer_head_map(
        result.attributions,
        "Attributed change of the ICL score when the head is ablated (nats)",
        "discovery documents; positive: the head helps the model use its context",
        signed=True,
        value_format="{:+.3f}",
    )
    classes = Table(
        columns=["class", "heads", "change", "random sets of their layers", "beyond random", "verdict"],
        rows=[
            [
                c.name,
                ", ".join(c.heads),
                f"{c.change:+.3f} {format_ci(c.change_ci)}",
                ", ".join(f"{x:+.3f}" for x in c.random_changes),
                f"{c.difference:+.3f} {format_ci(c.difference_ci)}",
                c.verdict,
            ]
            for c in result.classes
        ],  # fmt: skip
        right=["change", "beyond random"],
    )
    bins = " | ".join(f"{label}: {loss:.2f}" for label, loss in loss_bins(result))
    sections = [
        Section(
            title="What chose and what tested",
            lines=[
                lines[-1],
                f"Model: {result.provenance}.",
                f"Discovery documents: {', '.join(result.discovery_names)}.",
                f"Held-out documents: {', '.join(result.heldout_names)}.",
            ],
        ),
        Section(title="Classes against random heads (held-out documents)", table=classes),
        Section(
            title="Top heads by attribution, confirmed by exact ablation",
            table=Table(columns=list(HEAD_COLUMNS), rows=_head_rows(result), right=list(HEAD_COLUMNS[1:3])),
            notes=[LEGEND],
            figures=[every_head] if figures else [],
        ),
        Section(
            title="Loss per token",
            lines=[f"Loss by token (nats, mean over documents): {bins}"],
            figures=[_png(loss_curve_figure(result))] if figures else [],
        ),
    ]
    if result.training is not None:
        sections.append(
            Section(
                title="Across training",
                lines=_training_lines(result),
                figures=[_png(plot_icl_over_training(result.training))] if figures else [],
            )
        )
    return Report(title=f"In-context learning of {result.model_name}", headline=lines[:-1], sections=sections)


def write_icl_report(result: ICLResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    report = icl_sections(result, figures=format == "html")
    write_sections(report, format, out, console, {"json": lambda: render_json(result)}, width=140)
