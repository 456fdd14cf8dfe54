"""A RetrievalResult as the one report structure (`circuits.sections`: terminal, Markdown, HTML). The
finding comes first: accuracy against chance, each class's verdict and
drop beyond random heads on held-out relations (beside the same figure on the discovery prompts), its
overlap with the induction heads of `interp heads`, the circuit's faithfulness; then the two-hop
measurement; then the relations that chose and those that tested."""

from __future__ import annotations

from rich.console import Console

from circuits.evidence import EFFECT_SIGN, MIN_STRATUM_PROMPTS, TOO_FEW_PROMPTS
from circuits.retrieval.results import (
    CLASS_MEANINGS,
    RETRIEVAL_CLASSES,
    RetrievalAccuracy,
    RetrievalResult,
)
from circuits.sections import (
    Report,
    Section,
    Table,
    ci_text,
    layer_head_map,
    percent_ci,
    signed,
    write_sections,
)
from interp.viz import heatmap_grid, heatmap_html

FORMATS = ("table", "json", "markdown", "html")


def legend(result: RetrievalResult) -> str:
    """What every figure means, with the relations that chose the heads and those that tested them."""
    chose, tested = result.relations.discovery, result.relations.heldout
    return (
        "Logit diff = logit(answer) - the largest logit of the other values stated in the prompt (logits); "
        "accuracy: the answer ranks first among them [95% bootstrap CI over prompts]; chance = mean of 1 / "
        "facts. The relation is the family: heads are found on discovery prompts (relations "
        f"{', '.join(chose)}; 4 facts; template {', '.join(result.templates['discovery'])})"
        " by path patching from prompts whose query names a stranger (EAP ranks the senders, the top ones "
        "are path-patched exactly) and classed by where the last token attends. Every class is then "
        "mean-ablated on held-out prompts (relations "
        f"{', '.join(tested)}; other names; {result.heldout.prompts.split(', ')[-1]}; templates "
        f"{', '.join(result.templates['heldout'])}) against random heads of the same layers. Effects: "
        f"{EFFECT_SIGN}; beyond random = the class's drop - the random sets' mean drop, paired by prompt; "
        "confirmed when its held-out CI lies above 0 and it is positive in every stratum (fact count, "
        "template, relation; one of fewer than "
        f"{MIN_STRATUM_PROMPTS} prompts has no CI and no verdict and does not count); facts-, template- or "
        "relation-dependent when only the pooled CI is (the first kind of stratum where it is not). The "
        "same figure on the "
        "discovery prompts that chose the heads is shown beside it, never reported alone. Faithfulness = "
        "(F(circuit) - F(no heads)) / (F(model) - F(no heads)), every head outside the circuit mean-ablated."
    )


def _accuracy(a: RetrievalAccuracy) -> str:
    return (
        f"{a.prompts}: {100 * a.accuracy:.0f}% {percent_ci(a.ci)} of {a.n_prompts} prompts "
        f"(chance {100 * a.chance:.0f}%; mean logit diff {signed(a.logit_diff)})"
    )


def _above_chance(a: RetrievalAccuracy) -> str:
    return "above chance" if a.ci[0] > a.chance else "not above chance"


def retrieval_headline(result: RetrievalResult) -> list[str]:
    """The finding, in order."""
    lines = [
        f"Retrieval from context by {result.model_name}: " + _accuracy(result.heldout)
        + f", {_above_chance(result.heldout)}; " + _accuracy(result.discovery) + ".",
    ]  # fmt: skip
    lines.append(_by_facts(result) + ".")
    if result.heldout.ci[0] <= result.heldout.chance:
        lines.append(
            "The held-out accuracy is not above chance: the classes below move the answer's logit on "
            "held-out prompts, but the behaviour they carry there is weak (see each fact count)."
        )
    for c in result.classes:
        overlap = (
            ""
            if c.name == "induction"
            else f"; induction heads among them: {', '.join(c.induction_overlap) or 'none'}"
        )
        lines.append(
            f"{c.name} ({', '.join(c.heads)}): {c.verdict} on held-out relations; ablated, they lower the "
            f"logit diff by {signed(c.heldout.beyond)} {ci_text(c.heldout.beyond_ci)} logits more than "
            f"random heads there ({signed(c.discovery.beyond)} {ci_text(c.discovery.beyond_ci)} on the "
            f"discovery prompts that chose them: {c.note}); accuracy ablated {100 * c.accuracy:.0f}% "
            f"vs {100 * c.random_accuracy:.0f}% with random heads{overlap}."
        )
    tested = {c.name for c in result.classes}
    for name in RETRIEVAL_CLASSES:
        if name not in tested:
            lines.append(f"{name}: no head found (no selected head {CLASS_MEANINGS[name].split(' (')[0]}).")
    found = {head for c in result.classes if c.name != "induction" for head in c.heads}
    shared = sorted(found & set(result.induction_heads))
    lines.append(
        f"Induction heads of `interp heads` ({', '.join(result.induction_heads) or 'none'}): "
        f"{len(shared)} of them among the {len(found)} classified retrieval heads "
        f"({', '.join(shared) or 'none'})."
    )
    lines.append(
        f"Circuit faithfulness on held-out prompts: {signed(result.faithfulness)} (logit diff: circuit "
        f"{signed(result.circuit_logit_diff)}, model {signed(result.model_logit_diff)}, no heads "
        f"{signed(result.ablated_logit_diff)}; accuracy with the circuit alone "
        f"{100 * result.circuit_accuracy:.0f}%)."
    )
    lines.append(
        "Measured only (no circuit claimed): "
        + _accuracy(result.question)
        + f", {_above_chance(result.question)}."
    )
    for a in result.two_hop:
        lines.append("Measured only (no circuit claimed): " + _accuracy(a) + f", {_above_chance(a)}.")
    return lines


def _by_facts(result: RetrievalResult) -> str:
    return "Held-out accuracy by fact count: " + "; ".join(
        f"{a.prompts.split(', ')[-1]} {100 * a.accuracy:.0f}% {percent_ci(a.ci)} "
        f"(chance {100 * a.chance:.0f}%)"
        for a in result.heldout_by_facts
    )


def _head_rows(result: RetrievalResult) -> list[list[str]]:
    return [
        [h.head, h.sweep, signed(h.effect), f"{h.attention['VALUE']:.2f}", f"{h.attention['NAME']:.2f}",
         f"{h.attention['QUERY']:.2f}", signed(h.direct), h.cls or "unclassified",
         "yes" if h.head in result.induction_heads else "no"]
        for h in result.heads
    ]  # fmt: skip


HEAD_COLUMNS = (
    "head",
    "sweep",
    "effect",
    "END->value",
    "END->name",
    "END->query",
    "direct",
    "class",
    "induction",
)


HEADS_LEGEND = (
    "effect: the drop of the mean logit diff (logits) when the head's path ('sweep') is patched from the "
    "corrupted run; END->: mean attention from the last token; direct: the head's mean direct logit "
    "attribution at END along W_U[answer] - W_U[best other in-context value], in logits."
)


def _stratum_rows(result: RetrievalResult) -> list[list[str]]:
    return [
        [c.name, s.name, str(s.n_prompts),
         signed(s.beyond) + ("" if s.beyond_ci is None else f" {ci_text(s.beyond_ci)}"),
         TOO_FEW_PROMPTS if s.holds is None else "yes" if s.holds else "no"]
        for c in result.classes
        for s in c.strata
    ]  # fmt: skip


STRATUM_COLUMNS = ("class", "stratum", "prompts", "beyond random", "holds")


CLASS_COLUMNS = (
    "class",
    "heads",
    "verdict",
    "beyond random, held out",
    "beyond random, discovery",
    "accuracy ablated",
    "random ablated",
    "induction",
)
ACCURACY_COLUMNS = ("prompts", "n", "accuracy", "chance", "mean logit diff")


def _class_rows(result: RetrievalResult) -> list[list[str]]:
    return [
        [c.name, ", ".join(c.heads), c.verdict, f"{signed(c.heldout.beyond)} {ci_text(c.heldout.beyond_ci)}",
         f"{signed(c.discovery.beyond)} {ci_text(c.discovery.beyond_ci)}",
         f"{100 * c.accuracy:.0f}%", f"{100 * c.random_accuracy:.0f}%", ", ".join(c.induction_overlap) or "-"]
        for c in result.classes
    ]  # fmt: skip


def _accuracy_rows(result: RetrievalResult) -> list[list[str]]:
    every = [result.discovery, result.heldout, *result.heldout_by_facts, result.question, *result.two_hop]
    return [
        [a.prompts, str(a.n_prompts), f"{100 * a.accuracy:.0f}% {percent_ci(a.ci)}", f"{100 * a.chance:.0f}%",
         signed(a.logit_diff)]
        for a in every
    ]  # fmt: skip


def retrieval_sections(result: RetrievalResult) -> Report:
    """The report: the finding, what chose and what tested, the classes with their verdicts, per
    held-out stratum, accuracy on every prompt set, the heads (with their attention from END and the
    path-patching effects of every head)."""
    figures = []
    if result.heads:
        targets = ("VALUE", "NAME", "QUERY")
        attention = [[h.attention[target] for target in targets] for h in result.heads]
        labels = [f"{h.head} ({h.cls or 'unclassified'})" for h in result.heads]
        figures.append(
            heatmap_html(
                attention,
                labels,
                ["value", "name", "query"],
                "Attention from END (discovery prompts)",
                signed=False,
                limit=1.0,
                row_axis="head",
                col_axis="END attends to",
                caption="the queried value (mover), the name's mention (mention), the query's name (query)",
            )
        )
    effects = [
        layer_head_map(
            grid,
            f"Path patching to {sweep}",
            "drop of the mean logit diff when the head's path is patched (clean - patched, logits; "
            "positive: the path helps): exact for the heads EAP ranks first, EAP's estimate for the "
            "others; grey: no sender",
            signed=True,
            value_format="{:+.2f}",
        )
        for sweep, grid in result.effects.items()
    ]
    if effects:
        figures.append(heatmap_grid(effects))
    sections = [
        Section(
            title="What chose and what tested",
            lines=[
                f"Relations {result.relations.describe()} (other names, fact counts and templates held out "
                "too).",
                f"Model: {result.provenance}.",
            ],
        ),
        Section(
            title="Each class against random heads, held-out prompts",
            table=Table(
                columns=list(CLASS_COLUMNS), rows=_class_rows(result), right=list(CLASS_COLUMNS[3:7])
            ),
            notes=[*(f"{name}: {meaning}" for name, meaning in CLASS_MEANINGS.items()), legend(result)],
        ),
        Section(
            title="Each class against random heads, per held-out stratum",
            table=Table(
                columns=list(STRATUM_COLUMNS), rows=_stratum_rows(result), right=["prompts", "beyond random"]
            ),
        ),
        Section(
            title="Accuracy",
            table=Table(
                columns=list(ACCURACY_COLUMNS), rows=_accuracy_rows(result), right=list(ACCURACY_COLUMNS[1:])
            ),
        ),
        Section(
            title="Heads found on the discovery prompts",
            table=Table(columns=list(HEAD_COLUMNS), rows=_head_rows(result), right=list(HEAD_COLUMNS[2:7])),
            notes=[HEADS_LEGEND + (f" Read as {result.attribution}." if result.attribution else "")],
            figures=figures,
        ),
    ]
    title = f"Retrieval from context in {result.model_name}"
    return Report(title=title, headline=retrieval_headline(result), sections=sections)


def write_retrieval_report(result: RetrievalResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    write_sections(retrieval_sections(result), format, out, console, result, width=160)
