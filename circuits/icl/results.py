"""What `icl_report` and `function_vector_report` find, as `circuits.finding.Finding`s with `ICLFigures`
and `FunctionVectorFigures`, and how they read. Signs follow `circuits.evidence.EFFECT_SIGN` (positive:
the heads help); a change of the ICL score is ablated - clean, in nats: the drop of the context's benefit
(-score) when the heads are ablated."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxtyping import Float
from torch import Tensor

from circuits.evidence import EFFECT_SIGN, MIN_STRATUM_PROMPTS, TOO_FEW_PROMPTS, ClassVerdict
from circuits.finding import ClassView, Extras, Finding
from circuits.icl.score import ICLScore
from circuits.icl.training import TrainingCurve, plot_icl_over_training
from circuits.output import pyplot, save_figure
from circuits.sections import (
    Section,
    Table,
    ci_text,
    held_out_drop,
    layer_head_map,
    random_effects_text,
    signed,
    value_ci,
)
from interp.tasks.corpus import BROWN_SOURCE, N_BROWN_TEXTS
from interp.tasks.icl_tasks import ICL_TEMPLATES
from interp.types import label_head

_CHANGE = (
    "Change = ICL score with the head(s) ablated - without (nats): the drop of the context's benefit "
    "(-score), as circuits.evidence signs every effect; positive: without them the model uses its context "
    "less. Attributed: a first-order estimate on the discovery documents; exact: the "
    "ablated run on the held-out documents, which no head was chosen on; [95% bootstrap CI over documents]. "
    "A class is confirmed when its change exceeds that of random heads from the same layers (CI of the "
    "difference above 0); "
)
LEGEND = _CHANGE + "each top head is a class of one, against random heads of its layer."  # in its JSON too
BEFORE_TOP_CLASSES = _CHANGE + "a head when its exact change is above 0."  # files saved before that
TOP_FOUND_BY = "top by attribution on the discovery documents"  # a top head's class's details["found_by"]
FV_LEGEND = (  # the function-vector report's legend, in its JSON too
    "The word-pair tasks and the prompt templates are the families: the discovery tasks in the discovery "
    "templates choose the FV heads (AIE) and the layer the vector is added at; every effect is reported on "
    "the held-out tasks in the held-out templates, beside the same measure on the discovery tasks in the "
    "discovery templates, and per template on the held-out tasks (in a discovery template they are held "
    "out by task only). Each task's pairs are halved: few-shot prompts of one half give the heads' mean "
    "outputs (per task and template), prompts of the other, the same pairs in every template, are tested. "
    "AIE: p(answer) on a prompt whose examples' answers are "
    "shuffled, with the head's output at the last token set to its mean over clean few-shot prompts of the "
    "task, minus without (Todd et al. 2024); attributed: its first-order estimate for every head, exact for "
    "the top candidates. The function vector sums the FV heads' mean outputs as written to the residual "
    "stream (z @ W_O; on a post-norm model, through ln1_post at each prompt's scale) and is added to the "
    "residual stream at the last token of zero-shot prompts. Ablation: each head's z set to its mean over "
    "every position. Effects: "
    + EFFECT_SIGN
    + " (few-shot accuracy: clean - ablated; ICL score: ablated - clean nats, the context's benefit lost; "
    "patches and vectors: with - without). Each class against random heads from the same layers outside "
    "both classes, paired by prompt (or Brown corpus text, for the ICL score): [95% bootstrap CI; beyond "
    "random, over the prompts and the random sets]; confirmed when the CI of the effect beyond random lies "
    "above 0 on the held-out tasks in the held-out templates and in each held-out template alone, or, where "
    "a template's does not, the held-out templates differ no more than chance (a permutation test, p >= "
    "0.05); template-dependent when the pooled CI lies above 0 and they differ beyond chance (p < 0.05); "
    "unconfirmed when the pooled CI reaches 0 or no held-out template's lies above 0."
)
TEMPLATE_KINDS = ("held-out template", "discovery template")  # the kinds of the FV tests' strata

AIE_TEST = "FV heads: AIE"  # the FV heads patched together into shuffled-label prompts
VECTOR_TEST = "Function vector: zero-shot accuracy gained"  # the vector against random heads' vectors


@dataclass(kw_only=True)
class HeadEffect:
    """One head ablated alone: its attributed change of the ICL score (discovery documents) and its exact
    change (held-out documents, 95% bootstrap CI); its verdict is its class's, against random heads of its
    layer (files saved before: "confirmed" when that CI lies above 0)."""

    head: str  # "L20H1"
    layer: int
    index: int  # the head's index in its layer
    attributed: float
    exact: float
    exact_ci: tuple[float, float]
    verdict: str


def _beyond(found: ClassVerdict, family: str) -> str:
    """The effect beyond random on `family` ("heldout" or "discovery"), with its CI ("n/a": none)."""
    measured = getattr(found, family)
    return "n/a" if measured is None else value_ci(measured.beyond, measured.beyond_ci)


def random_kind(found: ClassVerdict, noun: str) -> str:
    """ "random same-layer sets", or "random sets (from other layers too)" where a layer ran out of heads."""
    if found.random_same_layers:
        return f"random same-layer {noun}"
    return f"random {noun} (from other layers too)"


def _png(draw: Callable[[], Any], what: str) -> str:
    """The matplotlib figure `draw()` makes as an inline <img> (the HTML page's); where matplotlib is not
    installed (interp does not require it), a line saying that the figure of `what` needs it."""
    try:
        plt = pyplot()
    except ImportError as missing:
        return f'<p class="legend">The figure of {what}: {missing}.</p>'
    figure, buffer = draw(), io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return f'<img alt="" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


@dataclass(kw_only=True)
class ICLFigures(Extras):
    """`icl_report`'s own figures. chose / tested: the documents that rank the heads and those held out;
    the class: the induction heads ablated on the first `n_ablated` held-out documents, details
    "found_by" and "attributed" (its heads' summed attributed changes on discovery documents)."""

    source: str  # what the documents are
    score: ICLScore  # every document
    discovery: ICLScore
    heldout: ICLScore  # the headline
    loss_curve: Float[Tensor, " pos_minus_1"]  # mean loss of token t at [t - 1], every document
    loss_curve_se: Float[Tensor, " pos_minus_1"]  # its standard error over documents
    attributions: Float[Tensor, "layer head"]  # mean attributed change over the discovery documents
    heads: list[HeadEffect]  # the top heads by attribution, each ablated alone on the ablated documents
    training: TrainingCurve | None = None  # across a training run's checkpoints

    def n_ablated(self, finding: Finding) -> int:
        """The held-out documents the exact ablations ran on (the first ones)."""
        settings = finding.settings
        return settings.split.sizes(settings.n_documents)[1]

    def headline_verdict(self) -> str:
        """Whether the held-out score's CI lies below 0, and if not, how many documents would settle it."""
        tested = self.heldout
        low, high = tested.ci
        if tested.n_documents < MIN_STRATUM_PROMPTS:  # a CI of so few documents is the range of their values
            n, least = tested.n_documents, MIN_STRATUM_PROMPTS
            return f"no verdict: {n} held-out documents, {TOO_FEW_PROMPTS} (at least {least})"
        if high < 0:
            return f"established: its 95% CI over the {tested.n_documents} held-out documents lies below 0"
        if tested.score >= 0:
            return f"not established: no sign on these {tested.n_documents} held-out documents that it does"
        needed = math.ceil(1.5 * tested.n_documents * ((high - low) / 2 / -tested.score) ** 2)
        total = self.discovery.n_documents + needed
        if self.source == BROWN_SOURCE and total > N_BROWN_TEXTS:  # more than the shipped corpus holds
            return (
                f"not established at {tested.n_documents} held-out documents (the CI reaches 0); about "
                f"{needed} would settle it, more than the {N_BROWN_TEXTS} shipped texts hold: pass "
                f"--n-documents {N_BROWN_TEXTS} (all of them), or documents of your own (ICLSequences)"
            )
        return (
            f"not established at {tested.n_documents} held-out documents (the CI reaches 0); about {needed} "
            f"would settle it: pass --n-documents {total} (n_documents)"
        )

    def loss_bins(self) -> list[tuple[str, float]]:
        """The mean loss per token in doubling ranges of tokens: ("1", 9.8), ("2-3", 5.0), ("4-7", ...)..."""
        curve = self.loss_curve
        bins, start = [], 1
        while start <= len(curve):
            end = min(2 * start - 1, len(curve))
            label = str(start) if start == end else f"{start}-{end}"
            bins.append((label, curve[start - 1 : end].mean().item()))
            start *= 2
        return bins

    def title(self, finding: Finding) -> str:
        return f"In-context learning of {finding.model}"

    def headline(self, finding: Finding) -> list[str]:
        """The finding, in order: the held-out score, each class against random heads, the top heads."""
        tested, windows = self.heldout, finding.settings.windows
        lines = [
            f"ICL score of {finding.model} on {tested.n_documents} held-out documents: {tested.score:+.3f} "
            f"nats {ci_text(tested.ci)} (loss at {windows.describe()}: {tested.late_loss:.3f} - "
            f"{tested.early_loss:.3f}; negative: later tokens are predicted better, from their context); "
            f"that the model uses its context is {self.headline_verdict()}."
        ]
        n_ablated = self.n_ablated(finding)
        tested_classes = [found for found in finding.classes if found.details["found_by"] != TOP_FOUND_BY]
        for found in tested_classes:  # the top heads: one line, below
            distinct = len({tuple(heads) for heads in found.random_sets})
            lines.append(
                f"{found.name.capitalize()} heads ({len(found.heads)} {found.details['found_by']}): ablating "
                f"them changes the ICL score of {n_ablated} held-out documents by {held_out_drop(found)}; "
                f"{random_kind(found, 'sets')} ({random_effects_text(found)}; {distinct} distinct); beyond "
                f"random {_beyond(found, 'heldout')}: {found.verdict}."
            )
        if not tested_classes:
            lines.append(
                "No class tested: interp heads confirms no induction head in this model (or none was given)."
            )
        confirmed = [h.head for h in self.heads if h.verdict == "confirmed"]
        how = "beyond random heads of its layer" if self._top_classes(finding) else "by exact ablation"
        lines.append(
            f"Top {len(self.heads)} heads by attribution: {len(confirmed)} confirmed {how} on held-out "
            f"documents ({', '.join(confirmed) or 'none'})."
        )
        return lines

    def _top_classes(self, finding: Finding) -> bool:
        """Whether the top heads are classes judged against random heads (not in files saved before)."""
        return any(found.details["found_by"] == TOP_FOUND_BY for found in finding.classes) or not self.heads

    def legend(self, finding: Finding) -> str:
        """The legend (in files saved before the top heads were classes: their verdicts' rule then)."""
        return LEGEND if self._top_classes(finding) else BEFORE_TOP_CLASSES

    def chose_lines(self, finding: Finding) -> list[str]:
        every, tested = self.score, self.heldout
        return [
            f"Documents: {every.n_documents} from {self.source} "
            f"(every one: {value_ci(every.score, every.ci)}); {self.discovery.n_documents} discovery "
            f"documents rank the heads (ICL score {self.discovery.score:+.3f}), {tested.n_documents} "
            f"held-out documents test them: each scored, the first {self.n_ablated(finding)} ablated "
            f"({finding.settings.ablation} ablation of each head's z)."
        ]

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        columns = [("change", held_out_drop), ("random sets of their layers", random_effects_text)]
        return ClassView(columns=columns, effect="change", digits=3)

    def extra_sections(self, finding: Finding, wide: bool) -> list[Section]:
        """The top heads (with the [layer, head] map of attributed changes), the loss per token and
        across training, each with its figure (the HTML page's)."""
        every_head = layer_head_map(
            self.attributions,
            "Attributed change of the ICL score when the head is ablated (nats)",
            "discovery documents; positive: the head helps the model use its context",
            signed=True,
            value_format="{:+.3f}",
        )
        heads = Table(
            columns=["head", "attributed", "exact (held-out)", "verdict"],
            rows=[
                [h.head, signed(h.attributed), value_ci(h.exact, h.exact_ci), h.verdict] for h in self.heads
            ],
            right=["attributed", "exact (held-out)"],
        )
        bins = " | ".join(f"{label}: {loss:.2f}" for label, loss in self.loss_bins())
        sections = [
            Section(
                title="Top heads by attribution, "
                + ("each ablated alone" if self._top_classes(finding) else "confirmed by exact ablation"),
                table=heads,
                notes=[self.legend(finding)],
                figures=[every_head],
            ),
            Section(
                title="Loss per token",
                lines=[f"Loss by token (nats, mean over documents): {bins}"],
                figures=[_png(lambda: loss_curve_figure(finding), "the loss per token")],
            ),
        ]
        curve = self.training
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
                    figures=[_png(lambda: plot_icl_over_training(curve), "the ICL score across training")],
                )
            )
        return sections

    def json_fields(self, finding: Finding) -> dict[str, Any]:
        """Every figure, each score with its number of documents (the held-out one with the ablated
        documents'), `loss_bins`, the training run's scores, the legend."""

        def score(found: ICLScore, **more: Any) -> dict[str, Any]:
            return {**vars(found), "n_documents": found.n_documents, **more}

        return {
            "documents": self.source,
            "icl_score": score(self.score),
            "discovery": score(self.discovery),
            "heldout": score(self.heldout, n_ablated=self.n_ablated(finding)),
            **{name: getattr(self, name) for name in ("loss_curve", "loss_curve_se", "attributions")},
            "heads": self.heads,
            "loss_by_token": dict(self.loss_bins()),
            "training": None if self.training is None else self.training.json_fields(),
            "legend": self.legend(finding),
        }


def loss_curve_figure(finding: Finding, out: str | Path | None = None):
    """The mean loss per token of an ICL finding (log-scaled token axis) with its 95% band and the
    windows shaded; with `out` (.png, .svg, .pdf) also written there."""
    plt = pyplot()
    figures: ICLFigures = finding.extras
    windows = finding.settings.windows
    tokens = range(1, len(figures.loss_curve) + 1)
    mean, se = figures.loss_curve.numpy(), figures.loss_curve_se.numpy()
    figure, axes = plt.subplots(figsize=(6.5, 3.2))
    axes.fill_between(tokens, mean - 1.96 * se, mean + 1.96 * se, color="C0", alpha=0.2, linewidth=0)
    axes.plot(tokens, mean, color="C0", linewidth=1)
    for centre in (windows.early, windows.late):
        window = windows.tokens(centre)
        axes.axvspan(window[0], window[-1], color="C1", alpha=0.15)
    axes.set_xscale("log")
    axes.set_xlabel("token (position in the document)")
    axes.set_ylabel("loss (nats)")
    axes.set_title(
        f"Loss per token, mean over {figures.score.n_documents} documents (windows shaded)", fontsize=10
    )
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return save_figure(figure, out)


@dataclass(kw_only=True)
class QueryAccuracy:
    """Queries' few-shot accuracy, and zero-shot accuracy without the vector, with it and with random
    same-layer heads' (mean over the sets), 95% CIs over prompts."""

    few_shot: float
    zero_shot: float
    zero_shot_ci: tuple[float, float]
    with_fv: float
    with_fv_ci: tuple[float, float]
    with_random: float
    with_random_ci: tuple[float, float]


@dataclass(kw_only=True)
class TaskVector(QueryAccuracy):
    """One task's queries in the templates that test it. `family`: "discovery" (in the discovery
    templates) or "held-out" (the held-out ones)."""

    task: str
    description: str
    family: str
    n_pairs: int  # single-token pairs (demonstration + query halves)


@dataclass(kw_only=True)
class TemplateVector(QueryAccuracy):
    """The held-out tasks' queries in one template; `family`: whether the template chose ("discovery")
    or tests ("held-out")."""

    template: str  # a name of interp.tasks.icl_tasks.ICL_TEMPLATES
    family: str
    n_prompts: int


def _share(value: float, interval: tuple[float, float] | None = None) -> str:
    text = f"{value:.2f}"
    return text if interval is None else f"{text} {ci_text(interval, 2, sign=False)}"


def _test_line(found: ClassVerdict) -> str:
    """A test of the headline: held out, against its random sets, beside discovery (per template: the
    standard per-stratum table)."""
    tested = found.heldout
    where = "on held-out data" if not found.strata else "on held-out tasks in held-out templates"
    return (
        f"{found.name}: {tested.drop:+.3f} {found.details['unit']} {ci_text(tested.drop_ci)} {where}; "
        f"{random_kind(found, 'heads')} {random_effects_text(found)}; beyond random "
        f"{_beyond(found, 'heldout')} (n={tested.n_prompts}): "
        f"{found.verdict}; on discovery tasks and templates {_beyond(found, 'discovery')}: {found.note}."
    )


@dataclass(kw_only=True)
class FunctionVectorFigures(Extras):
    """`function_vector_report`'s own figures (`FV_LEGEND`). Its classes: `AIE_TEST`, `VECTOR_TEST`, then
    "{FV, induction} heads ablated: {few-shot accuracy, ICL score}"; details["unit"]: "p(answer)",
    "accuracy" or "nats"; strata per template on the held-out tasks (`TEMPLATE_KINDS`)."""

    aie_attributed: Float[Tensor, "layer head"]  # every head's AIE to first order (discovery, p(answer))
    aie_per_task: Float[Tensor, "task layer head"]  # the same per discovery task (its discovery templates)
    candidates: list[str]  # the top heads by attributed AIE
    candidates_aie: list[float]  # their exact AIE (discovery tasks and templates, mean over tasks)
    fv_heads: list[str]  # top candidates by exact AIE, strongest first
    fv_heads_heldout_aie: list[float]  # each alone, on the held-out tasks' queries in held-out templates
    induction_heads: list[str]
    induction_found_by: str
    overlap: list[str]  # heads in both classes
    fv_layer: int  # where the vector is added: the best layer on the discovery tasks' queries
    layer_accuracy: list[float]  # discovery prompts' zero-shot accuracy with the FV added at each layer
    task_vectors: list[TaskVector]  # discovery tasks, then held-out tasks (in the templates that test)
    template_vectors: list[TemplateVector]  # the held-out tasks in each template
    # what each head's mean output written to the residual stream is (interp.model.cache's
    # head_contribution_linearisation); "" in results saved before it was recorded
    written: str = ""

    def fv_head_figures(self) -> list[dict[str, Any]]:
        """Each FV head, strongest first: its attributed AIE, its exact AIE on the discovery tasks and
        alone on the held-out ones, and "induction" in `also` where it is an induction head too."""
        exact = dict(zip(self.candidates, self.candidates_aie, strict=True))
        rows = []
        for label, heldout in zip(self.fv_heads, self.fv_heads_heldout_aie, strict=True):
            layer, head = label_head(label)
            rows.append({
                "head": label, "aie_attributed": self.aie_attributed[layer, head].item(),
                "aie_discovery": exact[label], "aie_heldout": heldout,
                "also": "induction" if label in self.induction_heads else "",
            })  # fmt: skip
        return rows

    def mean_aie(self, labels: list[str]) -> float:
        """The mean attributed AIE of the heads `labels` ("L14H6"); NaN for none."""
        values = [self.aie_attributed[label_head(label)].item() for label in labels]
        return sum(values) / len(values) if values else math.nan

    def title(self, finding: Finding) -> str:
        return f"Function-vector heads of {finding.model}"

    def headline(self, finding: Finding) -> list[str]:
        """The finding, in order: the ablations, the held-out tests, the overlap."""
        lines = []
        by_name = {found.name: found for found in finding.classes}
        for name in ("FV heads", "induction heads"):
            accuracy = by_name.get(f"{name} ablated: few-shot accuracy")
            score = by_name.get(f"{name} ablated: ICL score")
            if accuracy is None:
                continue
            lines.append(
                f"Ablating the {len(accuracy.heads)} {name} lowers few-shot accuracy on held-out tasks in "
                f"held-out templates by {accuracy.heldout.drop:+.3f} (beyond random "
                f"{_beyond(accuracy, 'heldout')}: {accuracy.verdict}; {accuracy.note}) and the context's "
                f"benefit (the ICL score, ablated - clean) by {score.heldout.drop:+.3f} nats (beyond random "
                f"{_beyond(score, 'heldout')}: {score.verdict})."
            )
        best = max(self.layer_accuracy, default=0.0)
        where = (
            f"Added at layer {self.fv_layer} (discovery tasks' zero-shot accuracy {best:.2f} there)."
            if best > 0
            else f"Added at layer {self.fv_layer}, the first of a tie: at no layer does the vector raise the "
            "discovery tasks' zero-shot accuracy above 0."
        )
        lines += [_test_line(by_name[AIE_TEST]), f"{_test_line(by_name[VECTOR_TEST])} {where}"]
        lines.append(
            f"FV heads (top {len(self.fv_heads)} by AIE): {', '.join(self.fv_heads)}. Induction heads "
            f"({self.induction_found_by}): {', '.join(self.induction_heads) or 'none'}. Overlap: "
            f"{', '.join(self.overlap) or 'none'}. Mean attributed AIE: FV heads "
            f"{self.mean_aie(self.fv_heads):+.4f}, induction heads "
            f"{self.mean_aie(self.induction_heads):+.4f}, every head "
            f"{self.aie_attributed.mean().item():+.4f}."
        )
        return lines

    def chose_lines(self, finding: Finding) -> list[str]:
        """What the discovery tasks in the discovery templates chose (the tasks and templates: the lines
        above; what every effect is measured on: `FV_LEGEND`), the induction heads' source, the prompts."""
        settings = finding.settings
        return [
            f"chosen on the discovery tasks in the discovery templates: the {len(self.candidates)} heads of "
            f"largest attributed AIE, the {len(self.fv_heads)} FV heads of largest exact AIE among them, and "
            f"layer {self.fv_layer}, where the vector is added (the best zero-shot accuracy on their query "
            "pairs of every layer's)",
            f"induction heads: {self.induction_found_by}, not chosen on these tasks",
            f"{settings.n_prompts} prompts of {settings.n_shots} examples per task, template and half of its "
            f"pairs (seed {settings.seed}); ICL score on {settings.n_documents} Brown corpus texts",
        ]

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        written = self.written and f"A head's output in the function vector: {self.written}, averaged."
        return ClassView(
            columns=[("unit", lambda c: c.details["unit"]), ("held-out", held_out_drop)],
            effect="effect",
            holds="its CI lies above 0",
            digits=3,
            notes=[FV_LEGEND, *filter(None, [written])],
        )

    def extra_sections(self, finding: Finding, wide: bool) -> list[Section]:
        """Accuracy per template and per task, the FV heads (with the [layer, head] map of AIEs)."""
        every_head = layer_head_map(
            self.aie_attributed,
            "Attributed average indirect effect (p(answer), discovery tasks, mean over them)",
            "positive: the head's mean output restores the task on shuffled-label prompts",
            signed=True,
            value_format="{:+.4f}",
        )
        template_columns = ["template", "prompt", "chose", "prompts", "few-shot", "zero-shot", "+ FV",
                            "+ random heads"]  # fmt: skip
        templates = Table(
            columns=template_columns,
            rows=[[row.template, ICL_TEMPLATES[row.template].pattern,
                   "yes" if row.family == "discovery" else "no", str(row.n_prompts),
                   *map(_share, (row.few_shot, row.zero_shot, row.with_fv, row.with_random))]
                  for row in self.template_vectors],
            right=template_columns[3:],
        )  # fmt: skip
        task_columns = ["task", "family", "pairs", "few-shot", "zero-shot", "+ FV", "+ random heads"]
        tasks = Table(
            columns=task_columns,
            rows=[[task.task, task.family, str(task.n_pairs), _share(task.few_shot),
                   _share(task.zero_shot, task.zero_shot_ci), _share(task.with_fv, task.with_fv_ci),
                   _share(task.with_random, task.with_random_ci)] for task in self.task_vectors],
            right=task_columns[2:],
        )  # fmt: skip
        head_columns = ["FV head", "attributed AIE", "AIE (discovery)", "AIE (held-out)", "also"]
        fv_heads = Table(
            columns=head_columns,
            rows=[[row["head"], f"{row['aie_attributed']:+.4f}", f"{row['aie_discovery']:+.4f}",
                   f"{row['aie_heldout']:+.4f}", row["also"]] for row in self.fv_head_figures()],
            right=head_columns[1:4],
        )  # fmt: skip
        return [
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

    def json_fields(self, finding: Finding) -> dict[str, Any]:
        """Every figure, `fv_head_figures` as "fv_heads", each template's pattern, the legend."""
        renamed = ("fv_heads", "layer_accuracy")
        return {
            **{name: value for name, value in vars(self).items() if name not in renamed},
            "templates": {name: ICL_TEMPLATES[name].pattern for name in finding.settings.template_names},
            "fv_heads": self.fv_head_figures(),
            "layer_accuracy_discovery": self.layer_accuracy,
            "legend": FV_LEGEND,
        }
