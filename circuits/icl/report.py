"""An ICLResult as the one report structure (`circuits.sections`: terminal, Markdown, a self-contained
HTML page).

    write_icl_report(result, "html", "icl.html", Console())   # or "table", "json", "markdown"

Every format opens with the finding: the ICL score with its CI, then whether the induction heads
carry it beyond random heads of their layers on held-out documents, then the top heads by
attribution confirmed (or not) by exact ablation. The HTML page adds the loss per token, the
[layer, head] map of attributed changes, and the training run's curve when there is one.
"""

from __future__ import annotations

import base64
import io

from rich.console import Console

from circuits.icl.results import LEGEND, ICLResult
from circuits.icl.training import plot_icl_over_training
from circuits.output import save_figure
from circuits.sections import Report, Section, Table, ci_text, layer_head_map, signed, write_sections

FORMATS = ("table", "json", "markdown", "html")
HEAD_COLUMNS = ("head", "attributed", "exact (held-out)", "verdict")


def icl_headline(result: ICLResult) -> list[str]:
    """The finding, in order: the held-out score, each class against random heads, the documents."""
    tested, every = result.heldout, result.score
    lines = [
        f"ICL score of {result.model_name} on {tested.n_documents} held-out documents: {tested.score:+.3f} "
        f"nats {ci_text(tested.ci)} (loss at {result.windows.describe()}: {tested.late_loss:.3f} - "
        f"{tested.early_loss:.3f}; negative: later tokens are predicted better, from their context); "
        f"that the model uses its context is {result.headline_verdict()}."
    ]
    n_ablated = tested.n_documents if result.n_ablated is None else result.n_ablated
    for found in result.classes:
        draws = ", ".join(f"{change:+.3f}" for change in found.random_changes)
        distinct = len({tuple(heads) for heads in found.random_sets})
        kind = "random same-layer sets" if found.random_same_layers else "random sets (from other layers too)"
        lines.append(
            f"{found.name.capitalize()} heads ({len(found.heads)} {found.found_by}): ablating them changes "
            f"the ICL score of {n_ablated} held-out documents by {found.change:+.3f} "
            f"{ci_text(found.change_ci)}; {kind} "
            f"({draws}; {distinct} distinct); beyond random {found.difference:+.3f} "
            f"{ci_text(found.difference_ci)}: {found.verdict}."
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
        f"{ci_text(every.ci)}); {result.discovery.n_documents} discovery documents rank the heads (ICL "
        f"score {result.discovery.score:+.3f}), {tested.n_documents} held-out documents test them: each "
        f"scored, the first {n_ablated} ablated ({result.ablation} ablation of each head's z)."
    )
    return lines


def _head_rows(result: ICLResult) -> list[list[str]]:
    return [
        [h.head, signed(h.attributed), f"{signed(h.exact)} {ci_text(h.exact_ci)}", h.verdict]
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
    lines = icl_headline(result)
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
                f"{c.change:+.3f} {ci_text(c.change_ci)}",
                ", ".join(f"{x:+.3f}" for x in c.random_changes),
                f"{c.difference:+.3f} {ci_text(c.difference_ci)}",
                c.verdict,
            ]
            for c in result.classes
        ],  # fmt: skip
        right=["change", "beyond random"],
    )
    bins = " | ".join(f"{label}: {loss:.2f}" for label, loss in result.loss_bins())
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
    write_sections(report, format, out, console, result, width=140)
