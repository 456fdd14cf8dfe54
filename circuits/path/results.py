"""What `head_path` finds, as a `circuits.finding.Finding` (analysis "path") with `PathFigures`, and how
they read: the classes confirmed and the heads' faithfulness in the headline, the sizes of the split,
the classes' attention to each named position, the heads checked exactly. Every effect is a drop
(`circuits.evidence.EFFECT_SIGN`) of the task's metric."""

from __future__ import annotations

from dataclasses import dataclass, field

from circuits.evidence import EFFECT_SIGN, ClassVerdict, held_out_unit, resampled_words
from circuits.finding import ClassView, Extras, Finding
from circuits.sections import Section, Table, ci_text

ABLATION_WORDS = {
    "counterfactual": "each head's output from its pair's corrupted prompt",
    "mean": "each head's output averaged over the corrupted prompts real at each position",
    "zero": "each head's output set to zero",
    "resample": "each head's output from another pair's corrupted prompt",
}
RESAMPLED_HELD_OUT = {  # `resampled_words` of the held-out families, as the chose lines say it
    "families, then prompts": "the held-out families, then their prompts",
    "prompts within each family": "prompts within each held-out family",
    "prompts": "prompts",
}


@dataclass(kw_only=True)
class HeadDrop:
    """One head's drop on the discovery prompts: estimated (attribution) and exact (None: not run)."""

    head: str
    estimated: float
    exact: float | None = None
    exact_ci: tuple[float, float] | None = None


@dataclass(kw_only=True)
class PathFigures(Extras):
    """`head_path`'s own figures: the task, whether whole families were held out (`by_family`; False:
    the task had none, so prompts were held out), the split's sizes, the mean drop with every head
    ablated on the held-out prompts, every candidate head's drop on the discovery prompts, notes on how
    the positions were named. The finding's classes: details["attention"], the mean attention from the
    last token to each named position."""

    task: str
    by_family: bool
    n_discovery: int
    n_heldout: int
    all_heads_drop: float
    drops: list[HeadDrop]
    notes: list[str] = field(default_factory=list)

    def title(self, finding: Finding) -> str:
        return f"Heads of {finding.model} on {self.task}"

    def headline(self, finding: Finding) -> list[str]:
        confirmed = [c for c in finding.classes if c.verdict == "confirmed"]
        named = f" ({', '.join(c.name + ': ' + ' '.join(c.heads) for c in confirmed)})" if confirmed else ""
        faithfulness = finding.faithfulness
        kept = (
            f"keep faithfulness {faithfulness.ratio:.2f} {ci_text(faithfulness.ratio_ci, 2, sign=False)}"
            if faithfulness is not None
            else f"have no faithfulness (the metric moves {self.all_heads_drop:+.3g} with every head ablated)"
        )
        parts = [
            f"{len(confirmed)} of {len(finding.classes)} head classes confirmed on held-out "
            + self._tested_unit(finding)
            + named,
            f"the {sum(len(c.heads) for c in finding.classes)} heads alone {kept} on {self.n_heldout} "
            "held-out prompts",
        ]
        return ["; ".join(parts) + ".", *self.notes]

    def _tested(self, finding: Finding) -> list[str] | None:
        """The families that tested (None: no family column, each prompt held out alone)."""
        return [name for names in finding.tested.values() for name in names] if self.by_family else None

    def _tested_unit(self, finding: Finding) -> str:
        """What the held-out CIs cover (`held_out_unit`) of the families that tested."""
        return held_out_unit(self._tested(finding))

    def chose_lines(self, finding: Finding) -> list[str]:
        settings = finding.settings
        held = (
            f"{self.n_discovery} prompts chose, {self.n_heldout} of other families tested"
            if self.by_family
            else f"{self.n_discovery} prompts chose, {self.n_heldout} others tested (no family column: "
            "prompts are held out, not families)"
        )
        return [
            held,
            f"ablation: {settings.ablation} ({ABLATION_WORDS.get(settings.ablation, settings.ablation)})",
            f"effects: {EFFECT_SIGN}; 'beyond random' subtracts {settings.n_random} random same-layer "
            "sets of as many heads outside every class, paired by prompt; CIs: 95% bootstrap over "
            + RESAMPLED_HELD_OUT[resampled_words(self._tested(finding))]
            + " (beyond random: and over the random sets)",
            f"every head ablated: drop {self.all_heads_drop:+.2f} on the held-out prompts",
        ]

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        names = sorted({name for c in finding.classes for name in c.details["attention"]})
        return ClassView(columns=[(f"attn to {n}", _attention_cell(n)) for n in names])

    def faithfulness_kept(self, finding: Finding) -> str:
        n_heads = len({head for c in finding.classes for head in c.heads})
        return f"the {n_heads} heads of the classes kept, every other head ablated"

    def extra_sections(self, finding: Finding, wide: bool) -> list[Section]:
        ranked = sorted((d for d in self.drops if d.exact is not None), key=lambda d: -abs(d.exact))
        estimated = "heads of largest estimated drop (attribution patching), measured exactly"
        return [
            Section(
                title="Heads checked exactly (discovery families)",
                lines=[f"the {len(ranked)} {estimated}"],
                table=Table(
                    columns=["head", "estimated drop", "exact drop", "95% CI"],
                    rows=[
                        [d.head, f"{d.estimated:+.2f}", f"{d.exact:+.2f}", ci_text(d.exact_ci, 2)]
                        for d in ranked
                    ],
                ),
            )
        ]


def _attention_cell(name: str):
    def cell(c: ClassVerdict) -> str:
        return f"{c.details['attention'][name]:.2f}"

    return cell
