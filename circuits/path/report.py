"""The path's result as the one report structure (`circuits.sections`): headline, what chose and what
tested, classes with verdicts, the per-stratum and per-family table, faithfulness, the heads' drops."""

from __future__ import annotations

from circuits.evidence import MIN_STRATUM_PROMPTS, TOO_FEW_PROMPTS
from circuits.path.steps import PathResult
from circuits.sections import Report, Section, Table, ci_text, faithfulness_section

ABLATION_WORDS = {
    "counterfactual": "each head's output from its pair's corrupted prompt",
    "mean": "each head's output averaged over the corrupted prompts real at each position",
    "zero": "each head's output set to zero",
    "resample": "each head's output from another pair's corrupted prompt",
}


def path_headline(result: PathResult) -> list[str]:
    confirmed = [c for c in result.classes if c.verdict == "confirmed"]
    parts = [
        f"{len(confirmed)} of {len(result.classes)} head classes confirmed on held-out "
        + ("families" if result.by_family else "prompts")
        + (f" ({', '.join(c.name + ': ' + ' '.join(c.heads) for c in confirmed)})" if confirmed else ""),
        f"the {sum(len(c.heads) for c in result.classes)} heads alone keep faithfulness "
        f"{result.faithfulness:.2f} {ci_text(result.faithfulness_ci, 2, sign=False)} on {result.n_heldout} "
        "held-out prompts",
    ]
    return ["; ".join(parts) + ".", *result.notes]


def path_sections(result: PathResult) -> list[Section]:
    settings = result.settings
    chose = Section(
        title="What chose and what tested",
        lines=[
            *(
                [
                    f"chosen on {result.n_discovery} prompts of {len(result.chose)} families: "
                    + ", ".join(result.chose),
                    f"tested on {result.n_heldout} prompts of {len(result.tested)} other families: "
                    + ", ".join(result.tested),
                ]
                if result.by_family
                else [
                    f"chosen on {result.n_discovery} prompts, tested on {result.n_heldout} others (no family "
                    "column: prompts are held out, not families)"
                ]
            ),
            f"ablation: {settings.ablation} ({ABLATION_WORDS.get(settings.ablation, settings.ablation)})",
            f"effects: {result.sign_rule}; 'beyond random' subtracts {settings.n_random} random same-layer "
            "sets of as many heads, paired by prompt; CIs: 95% bootstrap over prompts",
            f"every head ablated: drop {result.all_heads_drop:+.2f} on the held-out prompts",
        ],
    )
    names = sorted({name for c in result.classes for name in c.attention})
    classes = Section(
        title="Head classes (held out)",
        lines=[f"{c.name}: {c.verdict}; {c.note}" for c in result.classes] or ["no head was kept"],
        table=Table(
            columns=[
                "class",
                "heads",
                *[f"attn to {n}" for n in names],
                "drop beyond random (chose)",
                "held out",
                "95% CI",
                "verdict",
            ],
            rows=[
                [
                    c.name,
                    " ".join(c.heads),
                    *[f"{c.attention[n]:.2f}" for n in names],
                    f"{c.discovery.beyond:+.2f}",
                    f"{c.heldout.beyond:+.2f}",
                    ci_text(c.heldout.beyond_ci, 2),
                    c.verdict,
                ]
                for c in result.classes
            ],
        ),  # fmt: skip
    )
    strata = Section(
        title="Per stratum and family (held out)",
        lines=[
            "a stratum holds when its mean drop beyond random points the class's way; one of fewer than "
            f"{MIN_STRATUM_PROMPTS} prompts has no CI and no verdict ('{TOO_FEW_PROMPTS}') and does not "
            "count in the class's verdict"
        ]
        + (
            []
            if any(c.strata for c in result.classes)
            else ["the prompts have no stratum or family column: each class is judged on them pooled"]
        ),
        table=Table(
            columns=["class", "kind", "name", "prompts", "beyond random", "95% CI", "holds"],
            rows=[
                [
                    c.name,
                    s.kind,
                    s.name,
                    str(s.n_prompts),
                    f"{s.beyond:+.2f}",
                    "" if s.beyond_ci is None else ci_text(s.beyond_ci, 2),
                    TOO_FEW_PROMPTS if s.holds is None else "yes" if s.holds else "no",
                ]
                for c in result.classes
                for s in c.strata
            ],
        ),  # fmt: skip
    )
    ranked = sorted((d for d in result.drops if d.exact is not None), key=lambda d: -abs(d.exact))
    heads = Section(
        title="Heads checked exactly (discovery families)",
        lines=[f"the {len(ranked)} heads of largest estimated drop (attribution patching), measured exactly"],
        table=Table(
            columns=["head", "estimated drop", "exact drop", "95% CI"],
            rows=[[d.head, f"{d.estimated:+.2f}", f"{d.exact:+.2f}", ci_text(d.exact_ci, 2)] for d in ranked],
        ),
    )
    sections = [chose, classes, strata]
    if result.faithfulness_summary is not None:
        n_heads = len({head for c in result.classes for head in c.heads})
        what = f"the {n_heads} heads of the classes kept, every other head ablated"
        sections.append(faithfulness_section(result.faithfulness_summary, result.faithfulness_strata, what))
    return [*sections, heads]


def path_report(result: PathResult) -> Report:
    return Report(
        title=f"Heads of {result.model} on {result.task}",
        headline=path_headline(result),
        sections=path_sections(result),
    )
