"""An ICLResult and a FunctionVectorResult as `circuits.sections` reports (terminal, JSON, Markdown, HTML).

    write_icl_report(result, "html", "icl.html", Console())   # or "table", "json", "markdown"
    write_fv_report(result, "html", "fv.html", Console())     # interp icl --fv

Each opens with its finding; the HTML page adds the figures: the [layer, head] map of attributed
changes (or AIEs), the loss per token and the training run's curve.
"""

from __future__ import annotations

import base64
import io
import math

from rich.console import Console

from circuits.evidence import ClassVerdict
from circuits.icl.results import (
    FV_LEGEND,
    LEGEND,
    TEMPLATE_KINDS,
    FunctionVectorResult,
    ICLResult,
)
from circuits.icl.training import plot_icl_over_training
from circuits.output import pyplot, save_figure
from circuits.sections import (
    Report,
    Section,
    Table,
    ci_text,
    class_sections,
    layer_head_map,
    signed,
    value_ci,
    write_sections,
)
from interp.tasks.icl_tasks import ICL_TEMPLATES

FORMATS = ("table", "json", "markdown", "html")


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
        draws = ", ".join(f"{change:+.3f}" for change in found.random_effects)
        distinct = len({tuple(heads) for heads in found.random_sets})
        same_layers, found_by = found.details["random_same_layers"], found.details["found_by"]
        kind = "random same-layer sets" if same_layers else "random sets (from other layers too)"
        pooled = found.heldout
        change, beyond = value_ci(pooled.drop, pooled.drop_ci), value_ci(pooled.beyond, pooled.beyond_ci)
        lines.append(
            f"{found.name.capitalize()} heads ({len(found.heads)} {found_by}): ablating them changes the ICL "
            f"score of {n_ablated} held-out documents by {change}; {kind} ({draws}; {distinct} distinct); "
            f"beyond random {beyond}: {found.verdict}."
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
        f"Documents: {every.n_documents} from {result.source} "
        f"(every one: {value_ci(every.score, every.ci)}); "
        f"{result.discovery.n_documents} discovery documents rank the heads (ICL score "
        f"{result.discovery.score:+.3f}), {tested.n_documents} held-out documents test them: each "
        f"scored, the first {n_ablated} ablated ({result.ablation} ablation of each head's z)."
    )
    return lines


def _png(figure) -> str:
    """A matplotlib figure as an inline <img>."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return f'<img alt="" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def loss_curve_figure(result: ICLResult, out: str | None = None):
    """The mean loss per token (log-scaled token axis) with its 95% band and the windows shaded; with
    `out` (.png, .svg, .pdf) also written there."""
    plt = pyplot()

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
    """The report: the finding, what chose and what tested, the classes against random heads
    (`class_sections`), the top heads, the loss per token and across training; `figures` (they need
    matplotlib) for HTML."""
    lines = icl_headline(result)
    every_head = layer_head_map(
        result.attributions,
        "Attributed change of the ICL score when the head is ablated (nats)",
        "discovery documents; positive: the head helps the model use its context",
        signed=True,
        value_format="{:+.3f}",
    )
    classes = class_sections(
        result.classes,
        details=[
            ("change", lambda c: value_ci(c.heldout.drop, c.heldout.drop_ci)),
            ("random sets of their layers", lambda c: ", ".join(f"{x:+.3f}" for x in c.random_effects)),
        ],
        effect="change",
        digits=3,
    )
    heads = Table(
        columns=["head", "attributed", "exact (held-out)", "verdict"],
        rows=[[h.head, signed(h.attributed), value_ci(h.exact, h.exact_ci), h.verdict] for h in result.heads],
        right=["attributed", "exact (held-out)"],
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
        *classes,
        Section(
            title="Top heads by attribution, confirmed by exact ablation",
            table=heads,
            notes=[LEGEND],
            figures=[every_head] if figures else [],
        ),
        Section(
            title="Loss per token",
            lines=[f"Loss by token (nats, mean over documents): {bins}"],
            figures=[_png(loss_curve_figure(result))] if figures else [],
        ),
    ]
    curve = result.training
    if curve is not None:
        best = curve.induction.groupby("step")["induction"].max()
        cells = ", ".join(
            f"{step}: {score:+.2f} (ind {best.get(step, float('nan')):.2f})"
            for step, score in zip(curve.steps, curve.scores, strict=True)
        )
        sections.append(
            Section(
                title="Across training",
                lines=[f"Across training (step: ICL score, highest induction score): {cells}."],
                figures=[_png(plot_icl_over_training(curve))] if figures else [],
            )
        )
    return Report(title=f"In-context learning of {result.model_name}", headline=lines[:-1], sections=sections)


def write_icl_report(result: ICLResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    report = icl_sections(result, figures=format == "html")
    write_sections(report, format, out, console, result, width=140)


def _share(value: float, interval: tuple[float, float] | None = None) -> str:
    text = f"{value:.2f}"
    return text if interval is None else f"{text} {ci_text(interval, 2, sign=False)}"


def _beyond(found: ClassVerdict, family: str) -> str:
    """The effect beyond random on `family` ("heldout" or "discovery"), with its CI ("n/a": none)."""
    measured = getattr(found, family)
    return "n/a" if measured is None else value_ci(measured.beyond, measured.beyond_ci)


def _test_line(found: ClassVerdict) -> str:
    """A test of the headline: held out, against its random sets, beside discovery, per template."""
    tested = found.heldout
    draws = ", ".join(f"{value:+.3f}" for value in found.random_effects)
    where = "on held-out data" if not found.strata else "on held-out tasks in held-out templates"
    ordered = sorted(found.strata, key=lambda s: s.kind != TEMPLATE_KINDS[0])  # the held-out ones first
    per_template = "; ".join(
        f"{s.name} ({'held out' if s.kind == TEMPLATE_KINDS[0] else 'discovery template'}) "
        f"{value_ci(s.beyond, s.beyond_ci)}" + (", does not hold" if s.holds is False else "")
        for s in ordered
    )
    return (
        f"{found.name}: {tested.drop:+.3f} {found.details['unit']} {ci_text(tested.drop_ci)} {where}; "
        f"random same-layer heads {draws}; beyond random {_beyond(found, 'heldout')} (n={tested.n_prompts}): "
        f"{found.verdict}; on discovery tasks and templates {_beyond(found, 'discovery')}: {found.note}."
        + (f" Per template, held-out tasks: {per_template}." if found.strata else "")
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
    """What chose (the discovery tasks in the discovery templates) and what tested (the held-out tasks in
    the held-out templates), the induction heads' source, the prompts, the model."""
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
            f"held-out templates by {accuracy.heldout.drop:+.3f} (beyond random "
            f"{_beyond(accuracy, 'heldout')}: {accuracy.verdict}; {accuracy.note}) and the context's benefit "
            f"(the ICL score, ablated - clean) by {score.heldout.drop:+.3f} nats (beyond random "
            f"{_beyond(score, 'heldout')}: {score.verdict})."
        )
    best = max(result.layer_accuracy, default=0.0)
    where = (
        f"Added at layer {result.fv_layer} (discovery tasks' zero-shot accuracy {best:.2f} there)."
        if best > 0
        else f"Added at layer {result.fv_layer}, the first of a tie: at no layer does the vector raise the "
        "discovery tasks' zero-shot accuracy above 0."
    )
    lines += [_test_line(result.aie_test), f"{_test_line(result.vector_test)} {where}"]
    lines.append(
        f"FV heads (top {len(result.fv_heads)} by AIE): {', '.join(result.fv_heads)}. Induction heads "
        f"({result.induction_found_by}): {', '.join(result.induction_heads) or 'none'}. Overlap: "
        f"{', '.join(result.overlap) or 'none'}. Mean attributed AIE: FV heads "
        f"{_mean_aie(result, result.fv_heads):+.4f}, induction heads "
        f"{_mean_aie(result, result.induction_heads):+.4f}, every head "
        f"{result.aie_attributed.mean().item():+.4f}."
    )
    return lines


def fv_sections(result: FunctionVectorResult) -> Report:
    """The report: what chose and what tested, the finding, the tests against random heads and their
    strata per template (`class_sections`), accuracy per template and per task, the FV heads (with the
    [layer, head] map of AIEs)."""
    written = (
        [f"A head's output in the function vector: {result.written}, averaged."] if result.written else []
    )
    every_head = layer_head_map(
        result.aie_attributed,
        "Attributed average indirect effect (p(answer), discovery tasks, mean over them)",
        "positive: the head's mean output restores the task on shuffled-label prompts",
        signed=True,
        value_format="{:+.4f}",
    )
    tests, strata = class_sections(
        [result.aie_test, result.vector_test, *result.ablations],
        details=[
            ("unit", lambda c: c.details["unit"]),
            ("held-out", lambda c: value_ci(c.heldout.drop, c.heldout.drop_ci)),
        ],
        effect="effect",
        holds="its CI lies above 0",
        digits=3,
    )
    tests.notes = [FV_LEGEND, *written]
    template_columns = ["template", "prompt", "chose", "prompts", "few-shot", "zero-shot", "+ FV",
                        "+ random heads"]  # fmt: skip
    templates = Table(
        columns=template_columns,
        rows=[[row.template, ICL_TEMPLATES[row.template].pattern,
               "yes" if row.family == "discovery" else "no", str(row.n_prompts),
               *map(_share, (row.few_shot, row.zero_shot, row.with_fv, row.with_random))]
              for row in result.template_vectors],
        right=template_columns[3:],
    )  # fmt: skip
    task_columns = ["task", "family", "pairs", "few-shot", "zero-shot", "+ FV", "+ random heads"]
    tasks = Table(
        columns=task_columns,
        rows=[[task.task, task.family, str(task.n_pairs), _share(task.few_shot),
               _share(task.zero_shot, task.zero_shot_ci), _share(task.with_fv, task.with_fv_ci),
               _share(task.with_random, task.with_random_ci)] for task in result.task_vectors],
        right=task_columns[2:],
    )  # fmt: skip
    head_columns = ["FV head", "attributed AIE", "AIE (discovery)", "AIE (held-out)", "also"]
    fv_heads = Table(
        columns=head_columns,
        rows=[[row["head"], f"{row['aie_attributed']:+.4f}", f"{row['aie_discovery']:+.4f}",
               f"{row['aie_heldout']:+.4f}", row["also"]] for row in result.fv_head_figures()],
        right=head_columns[1:4],
    )  # fmt: skip
    sections = [
        Section(title="What chose and what tested", lines=fv_chose_lines(result)),
        tests,
        strata,
        Section(
            title="Per template: the held-out tasks' query pairs",
            table=templates,
            notes=[
                "chose: the template is a discovery template (the held-out tasks in it are held out by "
                "task only); the others are the test. Each test's effect beyond random per template: "
                "'Per stratum and family (held out)'."
            ],
        ),
        Section(
            title="Zero-shot accuracy on each task's query pairs, in the templates that test it [95% CI]",
            table=tasks,
        ),
        Section(title="FV heads", table=fv_heads, figures=[every_head]),
    ]
    return Report(
        title=f"Function-vector heads of {result.model_name}", headline=fv_headline(result), sections=sections
    )


def write_fv_report(result: FunctionVectorResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    write_sections(fv_sections(result), format, out, console, result, width=140)
