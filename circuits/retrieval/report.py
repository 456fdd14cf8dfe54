"""A RetrievalResult as the one report structure (`circuits.sections`): the headline (accuracy against
chance, each class's verdict and drop beyond random heads on held-out relations beside the discovery
figure, its overlap with the induction heads, faithfulness, the measured-only forms), the standard
class sections (`class_sections`, with accuracy ablated and the induction overlap as the classes' own
columns), accuracy on every prompt set and the heads found."""

from __future__ import annotations

from rich.console import Console

from circuits.evidence import EFFECT_SIGN
from circuits.retrieval.results import CLASS_MEANINGS, RETRIEVAL_CLASSES, RetrievalAccuracy, RetrievalResult
from circuits.sections import FORMATS as FORMATS  # the formats `interp render` offers
from circuits.sections import (
    Report,
    Section,
    Table,
    class_sections,
    layer_head_map,
    percent_ci,
    signed,
    value_ci,
    write_sections,
)
from interp.viz import heatmap_grid, heatmap_html

HEAD_COLUMNS = (
    "head", "sweep", "effect", "END->value", "END->name", "END->query", "direct", "class", "induction"
)  # fmt: skip
HEADS_LEGEND = (
    "effect: the drop of the mean logit diff (logits) when the head's path ('sweep') is patched from the "
    "corrupted run; END->: mean attention from the last token; direct: the head's mean direct logit "
    "attribution at END along W_U[answer] - W_U[best other in-context value], in logits."
)
CLASS_DETAILS = (  # the classes' own columns (`ClassVerdict.details`), beside the standard ones
    ("accuracy ablated", lambda c: f"{100 * c.details['accuracy']:.0f}%"),
    ("random ablated", lambda c: f"{100 * c.details['random_accuracy']:.0f}%"),
    ("induction", lambda c: ", ".join(c.details["induction_overlap"]) or "-"),
)
ACCURACY_COLUMNS = ("prompts", "n", "accuracy", "chance", "mean logit diff")


def legend(result: RetrievalResult) -> str:
    """What every figure means, with the relations that chose the heads and those that tested them."""
    chose, tested = result.relations.discovery, result.relations.heldout
    return (
        "Logit diff = logit(answer) - the largest logit of the other values stated in the prompt (logits); "
        "accuracy: the answer ranks first among them [95% bootstrap CI over prompts]; chance = mean of 1 / "
        "facts. The relation is the family: heads are found on discovery prompts (relations "
        f"{', '.join(chose)}; 4 facts; template {', '.join(result.templates['discovery'])}) by path "
        "patching from prompts whose query names a stranger (EAP ranks the senders, the top ones are "
        "path-patched exactly) and classed by where the last token attends. Every class is then "
        f"mean-ablated on held-out prompts (relations {', '.join(tested)}; other names; "
        f"{result.heldout.prompts.split(', ')[-1]}; templates {', '.join(result.templates['heldout'])}) "
        f"against random heads of the same layers. Effects: {EFFECT_SIGN}; beyond random = the class's "
        "drop - the random sets' mean drop, paired by prompt; confirmed when its held-out CI lies above 0 "
        "and it is positive in every stratum (fact count, template, relation); facts-, template- or "
        "relation-dependent when only the pooled CI is (the first kind of stratum where it is not). The "
        "same figure on the discovery prompts that chose the heads is shown beside it, never reported "
        "alone. Faithfulness = (F(circuit) - F(no heads)) / (F(model) - F(no heads)), every head outside "
        "the circuit mean-ablated."
    )


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


def retrieval_headline(result: RetrievalResult) -> list[str]:
    """The finding, in order."""
    by_facts = "; ".join(
        f"{a.prompts.split(', ')[-1]} {_percent(a)} (chance {100 * a.chance:.0f}%)"
        for a in result.heldout_by_facts
    )
    lines = [
        f"Retrieval from context by {result.model_name}: {_accuracy(result.heldout, True)}; "
        f"{_accuracy(result.discovery)}.",
        f"Held-out accuracy by fact count: {by_facts}.",
    ]
    if result.heldout.ci[0] <= result.heldout.chance:
        lines.append(
            "The held-out accuracy is not above chance: the classes below move the answer's logit on "
            "held-out prompts, but the behaviour they carry there is weak (see each fact count)."
        )
    for c in result.classes:
        overlap = ", ".join(c.details["induction_overlap"]) or "none"
        overlap = "" if c.name == "induction" else f"; induction heads among them: {overlap}"
        lines.append(
            f"{c.name} ({', '.join(c.heads)}): {c.verdict} on held-out relations; ablated, they lower the "
            f"logit diff by {value_ci(c.heldout.beyond, c.heldout.beyond_ci)} logits more than random heads "
            f"there ({value_ci(c.discovery.beyond, c.discovery.beyond_ci)} on the discovery prompts that "
            f"chose them: {c.note}); accuracy ablated {100 * c.details['accuracy']:.0f}% vs "
            f"{100 * c.details['random_accuracy']:.0f}% with random heads{overlap}."
        )
    tested = {c.name for c in result.classes}
    lines += [
        f"{name}: no head found (no selected head {CLASS_MEANINGS[name].split(' (')[0]})."
        for name in RETRIEVAL_CLASSES
        if name not in tested
    ]
    found = {head for c in result.classes if c.name != "induction" for head in c.heads}
    shared = sorted(found & set(result.induction_heads))
    lines += [
        f"Induction heads of `interp heads` ({', '.join(result.induction_heads) or 'none'}): "
        f"{len(shared)} of them among the {len(found)} classified retrieval heads "
        f"({', '.join(shared) or 'none'}).",
        f"Circuit faithfulness on held-out prompts: {signed(result.faithfulness)} (logit diff: circuit "
        f"{signed(result.circuit_logit_diff)}, model {signed(result.model_logit_diff)}, no heads "
        f"{signed(result.ablated_logit_diff)}; accuracy with the circuit alone "
        f"{100 * result.circuit_accuracy:.0f}%).",
    ]
    lines += [
        f"Measured only (no circuit claimed): {_accuracy(a, True)}."
        for a in [result.question, *result.two_hop]
    ]
    return lines


def _figures(result: RetrievalResult) -> list[str]:
    """END's attention per selected head; each sweep's path-patching drops [layer, head]."""
    figures = []
    if result.heads:
        figures.append(
            heatmap_html(
                [[h.attention[target] for target in ("VALUE", "NAME", "QUERY")] for h in result.heads],
                [f"{h.head} ({h.cls or 'unclassified'})" for h in result.heads],
                ["value", "name", "query"],
                "Attention from END (discovery prompts)",
                signed=False,
                limit=1.0,
                axes=("head", "END attends to"),
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
    return figures + ([heatmap_grid(effects)] if effects else [])


def retrieval_sections(result: RetrievalResult) -> Report:
    """The report: the finding, what chose and what tested, the classes with their verdicts, per
    held-out stratum, accuracy on every prompt set, the heads found."""
    classes, strata = class_sections(result.classes, details=CLASS_DETAILS, digits=3)
    classes.notes = [*(f"{name}: {meaning}" for name, meaning in CLASS_MEANINGS.items()), legend(result)]
    every = [result.discovery, result.heldout, *result.heldout_by_facts, result.question, *result.two_hop]
    accuracy_rows = [
        [a.prompts, str(a.n_prompts), _percent(a), f"{100 * a.chance:.0f}%", signed(a.logit_diff)]
        for a in every
    ]
    head_rows = [
        [h.head, h.sweep, signed(h.effect), *(f"{h.attention[t]:.2f}" for t in ("VALUE", "NAME", "QUERY")),
         signed(h.direct), h.cls or "unclassified", "yes" if h.head in result.induction_heads else "no"]
        for h in result.heads
    ]  # fmt: skip
    sections = [
        Section(
            title="What chose and what tested",
            lines=[
                f"Relations {result.relations.describe()} (other names, fact counts and templates held out "
                "too).",
                f"Model: {result.provenance}.",
            ],
        ),
        classes,
        strata,
        Section(
            title="Accuracy",
            table=Table(columns=list(ACCURACY_COLUMNS), rows=accuracy_rows, right=list(ACCURACY_COLUMNS[1:])),
        ),
        Section(
            title="Heads found on the discovery prompts",
            table=Table(columns=list(HEAD_COLUMNS), rows=head_rows, right=list(HEAD_COLUMNS[2:7])),
            notes=[HEADS_LEGEND + (f" Read as {result.attribution}." if result.attribution else "")],
            figures=_figures(result),
        ),
    ]
    title = f"Retrieval from context in {result.model_name}"
    return Report(title=title, headline=retrieval_headline(result), sections=sections)


def write_retrieval_report(result: RetrievalResult, format: str, out: str | None, console: Console) -> None:
    """Render `result` in `format` to the file `out`, or to the console when out is None."""
    write_sections(retrieval_sections(result), format, out, console, result, width=160)
