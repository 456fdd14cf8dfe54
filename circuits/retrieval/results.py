"""What `find_retrieval_circuit` finds, as a `circuits.finding.Finding` with `RetrievalFigures`, and how
they read: accuracy on every prompt set against chance, each class (mover, mention, query; the induction
heads) against random same-layer heads on held-out relations with its accuracy ablated and its overlap
with the induction heads, faithfulness, the heads found on the discovery prompts. Logit diff: logit(answer)
minus the largest other in-context candidate's logit (logits); accuracy: the share of prompts whose answer
ranks first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from circuits.evidence import EFFECT_SIGN, PARTIAL, faithfulness_verdict
from circuits.finding import ClassView, Extras, Finding
from circuits.sections import Section, Table, layer_head_map, percent_ci, signed, value_ci
from interp.viz import heatmap_grid, heatmap_html

# where END attends most -> the class it makes (the heads' columns END->value, END->name, END->query)
ATTENTION_TARGETS = {"VALUE": "mover", "NAME": "mention", "QUERY": "query"}
CLASS_MEANINGS = {
    "mover": "attends END -> the queried value and writes it (the lookup's copy)",
    "mention": "attends END -> the earlier mention of the queried name",
    "query": "attends END -> the queried name in the query",
    "induction": "the induction heads `interp heads` confirms (tested as a class, not found here)",
}
SWEEPS = {  # each path-patching sweep's receivers ("mover_queries": the name files have kept)
    "logits": "the logits",
    "mover_queries": "the queries at END of the heads step 1 classified (movers, mentions, queries)",
}
HEAD_COLUMNS = (
    "head", "sweep", "effect", "END->value", "END->name", "END->query", "direct", "class", "induction"
)  # fmt: skip
HEADS_LEGEND = (
    "effect: the drop of the mean logit diff (logits) when the head's path ('sweep') is patched from the "
    "corrupted run: exact (MLPs recomputed) for the heads EAP ranks first in the sweep, EAP's first-order "
    "estimate of the direct path for the others, which can be smaller (it leaves out the route through the "
    "MLPs); END->: mean attention from the last token; direct: the head's mean direct logit "
    "attribution at END along W_U[answer] - W_U[best other in-context value], in logits."
)
CLASS_DETAILS = (  # the classes' own columns (`ClassVerdict.details`), beside the standard ones
    ("accuracy ablated", lambda c: f"{100 * c.details['accuracy']:.0f}%"),
    ("random ablated", lambda c: f"{100 * c.details['random_accuracy']:.0f}%"),
    ("induction", lambda c: ", ".join(c.details["induction_overlap"]) or "-"),
)
ACCURACY_COLUMNS = ("prompts", "n", "accuracy", "chance", "mean logit diff")
LEGEND = (  # the families that chose and tested are those of "What chose and what tested"
    "Logit diff = logit(answer) - the largest logit of the other values stated in the prompt (logits); "
    "accuracy: the answer ranks first among them [95% bootstrap CI over prompts]; chance = mean of 1 / "
    "facts. The relation is the family: heads are found on the discovery prompts by path patching from "
    "prompts whose query names a stranger (EAP ranks the senders, the top ones are path-patched exactly) "
    "and classed by where the last token attends. Every class is then mean-ablated on the held-out prompts "
    f"against random heads of the same layers outside every class. Effects: {EFFECT_SIGN}; beyond random = "
    "the class's drop - the random sets' mean drop, paired by prompt; confirmed when its held-out CI lies "
    "above 0 and it is positive in every stratum (fact count, template, relation), or, in a kind of strata "
    "where it is not, those strata differ no more than chance (a permutation test, p >= 0.05); facts-, "
    "template- or relation-dependent when they differ beyond chance (p < 0.05; the first such kind); "
    "unconfirmed when its held-out CI reaches 0 or it is positive in no stratum of a kind. The same "
    "figure on the discovery prompts that chose the heads is shown beside it, never reported alone."
)


@dataclass(kw_only=True)
class RetrievalAccuracy:
    """Accuracy on a set of prompts with its 95% bootstrap CI, and chance (the mean of 1 / candidates)."""

    prompts: str
    n_prompts: int
    accuracy: float
    ci: tuple[float, float]
    chance: float
    logit_diff: float


@dataclass(kw_only=True)
class RetrievalHead:
    """A head discovery selected: its path-patching drop (clean - patched, logits), its mean attention
    from END to the queried fact's name ("NAME"), value ("VALUE") and the query's name ("QUERY"), its
    direct logit attribution, its class (None: no matching attention pattern)."""

    head: str
    layer: int
    index: int
    sweep: str  # a key of `SWEEPS`
    effect: float
    attention: dict[str, float]
    direct: float
    cls: str | None


def _percent(a: RetrievalAccuracy) -> str:
    """An accuracy with its CI: "50% [38%, 61%]"."""
    return f"{100 * a.accuracy:.0f}% {percent_ci(a.ci)}"


def _accuracy(a: RetrievalAccuracy, against_chance: bool = False) -> str:
    text = (
        f"{a.prompts}: {_percent(a)} of {a.n_prompts} prompts "
        f"(chance {100 * a.chance:.0f}%; mean logit diff {signed(a.logit_diff)})"
    )
    if against_chance:
        text += ", above chance" if a.ci[0] > a.chance else ", not above chance"
    return text


@dataclass(kw_only=True)
class RetrievalFigures(Extras):
    """`find_retrieval_circuit`'s own figures. Its classes' strata: "facts", "template", "relation";
    details: "induction_overlap" (its heads confirmed as induction heads), "accuracy" and
    "random_accuracy" (held-out, the class or its random sets mean-ablated). The held-out logit diffs
    of the faithfulness are here (circuit, model, every head ablated). attribution:
    `direct_attribution_linearisation` ("" in results saved before it was recorded)."""

    file_width: ClassVar[int] = 160

    attribution: str
    discovery: RetrievalAccuracy
    heldout: RetrievalAccuracy
    heldout_by_facts: list[RetrievalAccuracy]
    question: RetrievalAccuracy  # the query asked as a question (measured only)
    two_hop: list[RetrievalAccuracy]  # two-hop prompts, statement and question (measured only)
    effects: dict[str, Tensor]  # sweep -> [layer, head] path-patching drop, logits (NaN: not patched)
    heads: list[RetrievalHead]
    induction_heads: list[str]
    circuit_logit_diff: float  # held out, means over prompts, logits
    model_logit_diff: float
    ablated_logit_diff: float
    circuit_accuracy: float

    def title(self, finding: Finding) -> str:
        return f"Retrieval from context in {finding.model}"

    def headline(self, finding: Finding) -> list[str]:
        """The finding, in order: accuracy against chance, each class, the induction overlap,
        faithfulness, the measured-only forms."""
        by_facts = "; ".join(
            f"{a.prompts.split(', ')[-1]} {_percent(a)} (chance {100 * a.chance:.0f}%)"
            for a in self.heldout_by_facts
        )
        lines = [
            f"Retrieval from context by {finding.model}: {_accuracy(self.heldout, True)}; "
            f"{_accuracy(self.discovery)}.",
            f"Held-out accuracy by fact count: {by_facts}.",
        ]
        if self.heldout.ci[0] <= self.heldout.chance:
            lines.append(
                "The held-out accuracy is not above chance: the classes below move the answer's logit on "
                "held-out prompts, but the behaviour they carry there is weak (see each fact count)."
            )
        for c in finding.classes:
            overlap = ", ".join(c.details["induction_overlap"]) or "none"
            overlap = "" if c.name == "induction" else f"; induction heads among them: {overlap}"
            lines.append(
                f"{c.name} ({', '.join(c.heads)}): {c.verdict} on held-out relations; ablated, they lower "
                f"the logit diff by {value_ci(c.heldout.beyond, c.heldout.beyond_ci)} logits more than "
                f"random heads there ({value_ci(c.discovery.beyond, c.discovery.beyond_ci)} on the discovery "
                f"prompts that chose them: {c.note}); accuracy ablated {100 * c.details['accuracy']:.0f}% vs "
                f"{100 * c.details['random_accuracy']:.0f}% with random heads{overlap}."
            )
        tested = {c.name for c in finding.classes}
        lines += [
            f"{name}: no head found (no selected head {CLASS_MEANINGS[name].split(' (')[0]})."
            for name in ATTENTION_TARGETS.values()
            if name not in tested
        ]
        found = {head for c in finding.classes if c.name != "induction" for head in c.heads}
        shared = sorted(found & set(self.induction_heads))
        summary = finding.faithfulness
        faithfulness = (  # with its CI and band, as the faithfulness section reads it
            "n/a" if summary is None
            else f"{value_ci(summary.ratio, summary.ratio_ci, 2)}, {faithfulness_verdict(summary)}"
        )  # fmt: skip
        lines += [
            f"Induction heads of `interp heads` ({', '.join(self.induction_heads) or 'none'}): "
            f"{len(shared)} of them among the {len(found)} classified retrieval heads "
            f"({', '.join(shared) or 'none'}).",
            f"Circuit faithfulness on held-out prompts: {faithfulness} (logit diff: circuit "
            f"{signed(self.circuit_logit_diff)}, model {signed(self.model_logit_diff)}, no heads "
            f"{signed(self.ablated_logit_diff)}; accuracy with the circuit alone "
            f"{100 * self.circuit_accuracy:.0f}%).",
        ]
        confirmed = [c.name for c in finding.classes if c.verdict == "confirmed"]
        if summary is not None and summary.ratio < PARTIAL and confirmed:
            lines.append(
                f"The confirmed classes ({', '.join(confirmed)}) are needed (ablated, they lower the logit "
                "diff beyond random heads) but not sufficient: kept alone, every other head ablated, the "
                "classified heads do not reproduce the model's logit diff."
            )
        lines += [
            f"Measured only (no circuit claimed): {_accuracy(a, True)}."
            for a in [self.question, *self.two_hop]
        ]
        return lines

    def chose_lines(self, finding: Finding) -> list[str]:
        settings = finding.settings
        return [
            f"Other names held out too; fact counts: {self.discovery.prompts.split(', ')[-1]} chose, "
            f"{self.heldout.prompts.split(', ')[-1]} tested. {settings.n_prompts} discovery prompts, "
            f"{settings.n_heldout} held-out prompts per fact count and template, {settings.n_random} random "
            f"same-layer sets per class (seed {settings.seed})."
        ]

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        meanings = [f"{name}: {meaning}" for name, meaning in CLASS_MEANINGS.items()]
        return ClassView(columns=CLASS_DETAILS, notes=[*meanings, LEGEND], digits=3)

    def faithfulness_kept(self, finding: Finding) -> str:
        return (
            "the circuit (every classified head) kept, every other head mean-ablated (each position's mean "
            "over the batch's corrupted prompts)"
        )

    def extra_sections(self, finding: Finding, wide: bool) -> list[Section]:
        """Accuracy on every prompt set; the heads found on the discovery prompts."""
        every = [self.discovery, self.heldout, *self.heldout_by_facts, self.question, *self.two_hop]
        accuracy_rows = [
            [a.prompts, str(a.n_prompts), _percent(a), f"{100 * a.chance:.0f}%", signed(a.logit_diff)]
            for a in every
        ]
        head_rows = [
            [h.head, h.sweep, signed(h.effect), *(f"{h.attention[t]:.2f}" for t in ATTENTION_TARGETS),
             signed(h.direct), h.cls or "unclassified", "yes" if h.head in self.induction_heads else "no"]
            for h in self.heads
        ]  # fmt: skip
        accuracy = Table(columns=list(ACCURACY_COLUMNS), rows=accuracy_rows, right=list(ACCURACY_COLUMNS[1:]))
        heads = Table(columns=list(HEAD_COLUMNS), rows=head_rows, right=list(HEAD_COLUMNS[2:7]))
        read_as = f" Read as {self.attribution}." if self.attribution else ""
        return [
            Section(title="Accuracy", table=accuracy),
            Section(
                title="Heads found on the discovery prompts",
                table=heads,
                notes=[HEADS_LEGEND + read_as],
                figures=self.figures(),
            ),
        ]

    def figures(self) -> list[str]:
        """END's attention per selected head; each sweep's path-patching drops [layer, head]."""
        figures = []
        if self.heads:
            figures.append(
                heatmap_html(
                    [[h.attention[target] for target in ATTENTION_TARGETS] for h in self.heads],
                    [f"{h.head} ({h.cls or 'unclassified'})" for h in self.heads],
                    ["value", "name", "query"],
                    "Attention from END (discovery prompts)",
                    signed=False,
                    limit=1.0,
                    axes=("head", "END attends to"),
                    caption="the queried value (mover), the name's mention (mention), the query's name "
                    "(query)",
                )
            )
        effects = [
            layer_head_map(
                grid,
                f"Path patching to {SWEEPS.get(sweep, sweep)}",
                "drop of the mean logit diff when the head's path is patched (clean - patched, logits; "
                "positive: the path helps): exact for the heads EAP ranks first, EAP's estimate for the "
                "others; grey: no sender",
                signed=True,
                value_format="{:+.2f}",
            )
            for sweep, grid in self.effects.items()
        ]
        return figures + ([heatmap_grid(effects)] if effects else [])
