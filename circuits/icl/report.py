"""An ICLResult and a FunctionVectorResult as the one report structure (`circuits.sections`: terminal,
Markdown, a self-contained HTML page).

    write_icl_report(result, "html", "icl.html", Console())   # or "table", "json", "markdown"
    write_fv_report(result, "html", "fv.html", Console())     # interp icl --fv

Every format opens with the finding: the ICL score with its CI, then whether the induction heads
carry it beyond random heads of their layers on held-out documents, then the top heads by
attribution confirmed (or not) by exact ablation. The HTML page adds the loss per token, the
[layer, head] map of attributed changes, and the training run's curve when there is one.

The function-vector report opens with its finding: which ablation lowers few-shot accuracy and which
the ICL score (each class against random heads of its layers), whether the FV heads' AIE and the
function vector hold on the held-out tasks in the held-out prompt templates (each beside its
discovery figure and per template), and the overlap of the two classes; then what chose and what
tested (`fv_chose_lines`: the discovery word-pair tasks in the discovery templates chose the heads
and the vector's layer, the held-out tasks in the held-out templates tested). Its HTML page adds
the [layer, head] map of AIEs.
"""

from __future__ import annotations

import base64
import io
import math

from rich.console import Console

from circuits.icl.results import (
    FV_LEGEND,
    LEGEND,
    TEMPLATE_KINDS,
    Comparison,
    FunctionVectorResult,
    ICLResult,
)
from circuits.icl.training import plot_icl_over_training
from circuits.output import save_figure
from circuits.sections import Report, Section, Table, ci_text, layer_head_map, signed, write_sections
from interp.tasks.icl_tasks import ICL_TEMPLATES

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


TASK_COLUMNS = ("task", "family", "pairs", "few-shot", "zero-shot", "+ FV", "+ random heads")
TEMPLATE_COLUMNS = (
    "template",
    "prompt",
    "chose",
    "prompts",
    "few-shot",
    "zero-shot",
    "+ FV",
    "+ random heads",
    "FV beyond random",
    "FV heads ablated beyond random",
)
COMPARISON_COLUMNS = (
    "test",
    "unit",
    "held-out",
    "beyond random (held-out)",
    "verdict",
    "discovery beyond random",
)


def _share(value: float, interval: tuple[float, float] | None = None) -> str:
    text = f"{value:.2f}"
    return text if interval is None else f"{text} {ci_text(interval, 2, sign=False)}"


def _beyond(found: Comparison, family: str) -> str:
    """The effect beyond random on `family` ("heldout" or "discovery"), with its CI ("n/a": none)."""
    measured = getattr(found, family)
    return "n/a" if measured is None else f"{measured.beyond:+.3f} {ci_text(measured.beyond_ci)}"


def _per_template(found: Comparison) -> str:
    """The effect beyond random on the held-out tasks in each template, the held-out ones first, and
    where its CI does not lie above 0."""
    ordered = sorted(found.strata, key=lambda s: s.kind != TEMPLATE_KINDS[0])
    return "; ".join(
        f"{s.name} ({'held out' if s.kind == TEMPLATE_KINDS[0] else 'discovery template'}) {s.beyond:+.3f} "
        f"{ci_text(s.beyond_ci)}" + ("" if s.holds else ", does not hold")
        for s in ordered
    )


def comparison_line(found: Comparison) -> str:
    tested = found.heldout
    draws = ", ".join(f"{value:+.3f}" for value in found.random_values)
    where = "on held-out data" if not found.strata else "on held-out tasks in held-out templates"
    templates = f" Per template, held-out tasks: {_per_template(found)}." if found.strata else ""
    return (
        f"{found.name}: {tested.drop:+.3f} {found.unit} {ci_text(tested.drop_ci)} {where}; "
        f"random same-layer heads {draws}; beyond random {_beyond(found, 'heldout')} (n={tested.n_prompts}): "
        f"{found.verdict}; on discovery tasks and templates {_beyond(found, 'discovery')}: {found.note}."
        + templates
    )


def _mean_aie(result: FunctionVectorResult, labels: list[str]) -> float:
    """The mean attributed AIE of the heads `labels` ("L14H6"); NaN for none."""
    values = [result.aie_attributed[int(layer), int(head)].item() for layer, head in
              (label[1:].split("H") for label in labels)]  # fmt: skip
    return sum(values) / len(values) if values else math.nan


def _templates(names) -> str:
    """Template names with their prompts: 'qa "Q: x\\nA: y", ...'."""
    return ", ".join(f'{name} "{ICL_TEMPLATES[name].pattern}"' for name in names)


def fv_chose_lines(result: FunctionVectorResult) -> list[str]:
    """What chose and what tested: the discovery word-pair tasks in the discovery templates (the FV
    heads and the vector's layer), the held-out tasks in the held-out templates (every effect), where
    the induction heads come from, the prompts, the model."""
    split, templates = result.split, result.template_split
    return [
        f"chosen on the discovery word-pair tasks ({', '.join(split.discovery)}) in the discovery templates "
        f"({_templates(templates.discovery)}): the {len(result.candidates)} heads of largest attributed AIE, "
        f"the {len(result.fv_heads)} FV heads of largest exact AIE among them, and layer {result.fv_layer}, "
        "where the vector is added (the best zero-shot accuracy on their query pairs of every layer's)",
        f"tested on the held-out word-pair tasks ({', '.join(split.heldout)}) in the held-out templates "
        f"({_templates(templates.heldout)}): every effect in this report (the FV heads' AIE, the vector's "
        "zero-shot accuracy, few-shot accuracy under ablation), each beside the same measure on the "
        "discovery tasks in the discovery templates, and per template on the held-out tasks (held out by "
        "task only in a discovery template)",
        f"induction heads ({', '.join(result.induction_heads) or 'none'}): {result.induction_found_by}, not "
        "chosen on these tasks",
        f"{result.n_prompts} prompts of {result.n_shots} examples per task, template and half of its pairs "
        f"(seed {result.seed}); ICL score on {result.n_documents} Brown corpus texts",
        f"Model: {result.provenance}.",
    ]


def _where_added(result: FunctionVectorResult) -> str:
    """The vector's layer, and whether any layer let it raise the discovery tasks' zero-shot accuracy."""
    best = max(result.layer_accuracy, default=0.0)
    if best <= 0:
        return (
            f"Added at layer {result.fv_layer}, the first of a tie: at no layer does the vector raise the "
            "discovery tasks' zero-shot accuracy above 0."
        )
    return f"Added at layer {result.fv_layer} (discovery tasks' zero-shot accuracy {best:.2f} there)."


def fv_headline(result: FunctionVectorResult) -> list[str]:
    """The finding, in order: the ablations, the held-out tests, the overlap."""
    lines = []
    by_name = {found.name: found for found in result.ablations}
    for name in ("FV heads", "induction heads"):
        accuracy = by_name.get(f"{name} ablated: few-shot accuracy")
        score = by_name.get(f"{name} ablated: ICL score")
        if accuracy is None:
            continue
        lines.append(
            f"Ablating the {len(accuracy.heads)} {name} lowers few-shot accuracy on held-out tasks in "
            "held-out templates by "
            f"{accuracy.heldout.drop:+.3f} (beyond random {_beyond(accuracy, 'heldout')}: "
            f"{accuracy.verdict}; "
            f"{accuracy.note}) and the context's benefit (the ICL score, ablated - clean) by "
            f"{score.heldout.drop:+.3f} nats (beyond random {_beyond(score, 'heldout')}: {score.verdict})."
        )
    lines.append(comparison_line(result.aie_test))
    lines.append(comparison_line(result.vector_test) + f" {_where_added(result)}")
    overlap = ", ".join(result.overlap) or "none"
    every = result.aie_attributed.mean().item()
    lines.append(
        f"FV heads (top {len(result.fv_heads)} by AIE): {', '.join(result.fv_heads)}. Induction heads "
        f"({result.induction_found_by}): {', '.join(result.induction_heads) or 'none'}. Overlap: {overlap}. "
        f"Mean attributed AIE: FV heads {_mean_aie(result, result.fv_heads):+.4f}, induction heads "
        f"{_mean_aie(result, result.induction_heads):+.4f}, every head {every:+.4f}."
    )
    return lines


def _task_rows(result: FunctionVectorResult) -> list[list[str]]:
    return [
        [
            task.task,
            task.family,
            str(task.n_pairs),
            _share(task.few_shot),
            _share(task.zero_shot, task.zero_shot_ci),
            _share(task.with_fv, task.with_fv_ci),
            _share(task.with_random, task.with_random_ci),
        ]
        for task in result.task_vectors
    ]


def _template_rows(result: FunctionVectorResult) -> list[list[str]]:
    """Per template, the held-out tasks' accuracies and the FV's and the FV heads' ablation's effects
    beyond random there."""
    vector = {s.name: s for s in result.vector_test.strata}
    ablated = {s.name: s for s in result.ablations[0].strata}  # the FV heads' few-shot accuracy
    return [
        [row.template, ICL_TEMPLATES[row.template].pattern, "yes" if row.family == "discovery" else "no",
         str(row.n_prompts), _share(row.few_shot), _share(row.zero_shot), _share(row.with_fv),
         _share(row.with_random),
         f"{vector[row.template].beyond:+.3f} {ci_text(vector[row.template].beyond_ci)}",
         f"{ablated[row.template].beyond:+.3f} {ci_text(ablated[row.template].beyond_ci)}"]
        for row in result.template_vectors
    ]  # fmt: skip


def _comparison_rows(result: FunctionVectorResult) -> list[list[str]]:
    return [
        [found.name, found.unit, f"{found.heldout.drop:+.3f} {ci_text(found.heldout.drop_ci)}",
         _beyond(found, "heldout"), found.verdict, _beyond(found, "discovery")]
        for found in [result.aie_test, result.vector_test, *result.ablations]
    ]  # fmt: skip


def _fv_head_rows(result: FunctionVectorResult) -> list[list[str]]:
    return [
        [row["head"], f"{row['aie_attributed']:+.4f}", f"{row['aie_discovery']:+.4f}",
         f"{row['aie_heldout']:+.4f}", row["also"]]
        for row in result.fv_head_figures()
    ]  # fmt: skip


FV_HEAD_COLUMNS = ("FV head", "attributed AIE", "AIE (discovery)", "AIE (held-out)", "also")


def _written(result: FunctionVectorResult) -> list[str]:
    """What the function vector sums as each head's mean output, where the result records it."""
    return [f"A head's output in the function vector: {result.written}, averaged."] if result.written else []


def fv_sections(result: FunctionVectorResult) -> Report:
    """The report: what chose and what tested, the finding, the tests against random heads, zero-shot
    accuracy per task, the FV heads (with the [layer, head] map of AIEs)."""
    every_head = layer_head_map(
        result.aie_attributed,
        "Attributed average indirect effect (p(answer), discovery tasks, mean over them)",
        "positive: the head's mean output restores the task on shuffled-label prompts",
        signed=True,
        value_format="{:+.4f}",
    )
    sections = [
        Section(title="What chose and what tested", lines=fv_chose_lines(result)),
        Section(
            title="Tests against random same-layer heads",
            table=Table(
                columns=list(COMPARISON_COLUMNS),
                rows=_comparison_rows(result),
                right=["held-out", "beyond random (held-out)", "discovery beyond random"],
            ),
            notes=[FV_LEGEND, *_written(result)],
        ),  # fmt: skip
        Section(
            title="Per template: the held-out tasks' query pairs",
            table=Table(
                columns=list(TEMPLATE_COLUMNS), rows=_template_rows(result), right=list(TEMPLATE_COLUMNS[3:])
            ),
            notes=[
                "chose: the template is a discovery template (the held-out tasks in it are held out by "
                "task only); the others are the test. Beyond random: the vector's zero-shot gain and the FV "
                "heads' ablation's few-shot drop, each minus random same-layer heads', paired by prompt "
                "[95% CI]."
            ],
        ),
        Section(
            title="Zero-shot accuracy on each task's query pairs, in the templates that test it [95% CI]",
            table=Table(columns=list(TASK_COLUMNS), rows=_task_rows(result), right=list(TASK_COLUMNS[2:])),
        ),
        Section(
            title="FV heads",
            table=Table(
                columns=list(FV_HEAD_COLUMNS), rows=_fv_head_rows(result), right=list(FV_HEAD_COLUMNS[1:4])
            ),
            figures=[every_head],
        ),
    ]
    return Report(
        title=f"Function-vector heads of {result.model_name}",
        headline=fv_headline(result),
        sections=sections,
    )


def write_fv_report(result: FunctionVectorResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    write_sections(fv_sections(result), format, out, console, result, width=140)
