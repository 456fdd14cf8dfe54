"""`find_ioi_circuit`'s finding (with `IOIFigures`) and how it reads. Every effect is a drop: path
patching's relative to the clean logit diff logit(IO) - logit(S) at END ((clean - patched) / clean; +0.3:
the path lowers it by 30%, it helps), held-out validation's when a class is mean-ablated; attention is a
mean probability, logit diffs in logits."""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, ClassVar

from torch import Tensor

from circuits.evidence import EFFECT_SIGN, ClassVerdict, StratumFaithfulness, held_out_unit
from circuits.finding import ClassView, Extras, Finding
from circuits.sections import Section, Table, ci_text, layer_head_map, percent_ci, signed
from interp.interventions.stats import MIN_FAMILIES, FaithfulnessSummary, too_few_families
from interp.types import Head, head_label
from interp.viz import attention_patterns_html

# Each class, in report order, and the attention it shows: (query position, key position) of IOI roles.
CLASS_ATTENTION = {
    "name_mover": ("END", "IO"), "negative_name_mover": ("END", "IO"), "s_inhibition": ("END", "S2"),
    "s_suppression": ("END", "S2"), "induction": ("S2", "S1+1"), "duplicate_token": ("S2", "S1"),
    "previous_token": ("S1+1", "S1"), "backup_name_mover": ("END", "IO"),
}  # fmt: skip
CLASSES = tuple(CLASS_ATTENTION)
CLASS_KIND = {cls: "->".join(pair) for cls, pair in CLASS_ATTENTION.items()}  # "name_mover" -> "END->IO"
ATTENTION_KINDS = {"->".join(pair): pair for pair in CLASS_ATTENTION.values()}  # "END->IO" -> ("END", "IO")
# How each class that writes to the logits must write: (logit, sign of its direct attribution).
CLASS_WRITES = {"name_mover": ("IO", 1), "backup_name_mover": ("IO", 1), "negative_name_mover": ("IO", -1),
                "s_suppression": ("S", -1)}  # fmt: skip


@dataclass(kw_only=True)
class Settings:
    """What the discovery was run with (the finding's settings; all of it goes into the JSON report)."""

    n_prompts: int
    seed: int
    attribution: str = ""  # how direct logit attribution linearises the norms ("": saved before)
    corrupted: str = "ABC"
    n_patching_prompts: int = 16
    effect_z: float = 3.0
    min_effect: float = 0.02
    min_share: float = 0.1
    attention_z: float = 3.0
    min_attention: float = 0.1
    large_attention: float = 0.3
    n_bootstrap: int = 1000
    n_completeness_subsets: int = 10
    n_random_draws: int = 5  # random head sets per class in held-out validation
    exact_candidates: int = 16  # senders EAP ranks first that are path-patched in steps 1-4 (`EAPRanking`:
    # all where a step has at most EXHAUSTIVE_RATIO per candidate; 0: all in every step; step 5: all)


@dataclass(kw_only=True)
class Baseline:
    """The model on the clean IOI prompts; *_ci are 95% bootstrap intervals over prompts."""

    logit_diff: float
    logit_diff_ci: tuple[float, float]
    accuracy: float  # fraction of prompts where logit(IO) > logit(S)
    accuracy_ci: tuple[float, float]
    top1_io: float  # fraction of prompts whose top prediction is IO
    abc_logit_diff: float  # the clean answers' logit diff on the ABC prompts
    n_prompts: int


@dataclass(kw_only=True)
class HeadEvidence:
    """One head in the circuit: why it was selected."""

    layer: int
    head: int
    effect: float  # relative drop of the logit diff when its path is patched from ABC (+: it helps)
    z: float  # robust z-score of `effect` among the step's senders
    step: str  # the path-patching sweep that found it
    attention: dict[str, float]  # mean attention for each of ATTENTION_KINDS
    direct_logit_attribution: dict[str, float]  # "IO", "S": mean direct effect on each logit at END

    @property
    def name(self) -> str:
        return head_label(self.layer, self.head)


@dataclass(kw_only=True)
class Evaluation:
    """The paper's section 4, with F(X) = mean logit diff when every head outside X is mean-ablated."""

    model_logit_diff: float  # F(model): no head ablated
    circuit_logit_diff: float  # F(circuit)
    ablated_logit_diff: float  # F(empty): every head mean-ablated
    faithfulness: float  # (F(circuit) - F(empty)) / (F(model) - F(empty)) (interp.interventions.stats)
    recovered: float  # F(circuit) / F(model), as Wang et al. report it
    faithfulness_with_unclassified: float | None  # the same with the unclassified heads kept too
    recovered_with_unclassified: float | None
    completeness: list[dict]  # per subset K: heads, circuit_logit_diff, model_logit_diff, gap
    completeness_max_gap: float  # max |F(C \ K) - F(M \ K)|, relative to F(model)
    minimality: dict[str, float]  # "L9H6" -> (F(C \ K) - F(C \ (K + v))) / F(C)


@dataclass(kw_only=True)
class HeldOut:
    """The circuit on held-out prompts the finder never used, beside its classes (`Validation`)."""

    prompts: str  # what was held out
    n_prompts: int
    logit_diff: float  # unablated
    faithfulness: float  # as Evaluation.faithfulness, on the held-out prompts (NaN: undefined there)
    recovered: float  # F(circuit) / F(model) on the held-out prompts
    recovered_ci: tuple[float, float]  # 95% bootstrap over templates, then prompts (2 or 3: within each)
    n_templates: int = 0  # the held-out templates (0: saved before it was kept)

    def recovered_ci_text(self, digits: int, brackets: bool = False) -> str:
        """The recovered fraction's CI as a clause: "(95% CI 40% to 77%)" (or "[40%, 77%]"), or why it has
        none."""
        low, high = self.recovered_ci
        if math.isnan(low) or math.isnan(high):
            return (
                f"(no CI: {self.n_templates} held-out templates, too few for one)"
                if too_few_families(self.n_templates)  # saved before 2026-12-04
                else "(no CI)"
            )
        if brackets:
            return f"(95% CI {percent_ci(self.recovered_ci, digits)})"
        return f"(95% CI {low:.{digits}%} to {high:.{digits}%})"


@dataclass(kw_only=True)
class Validation(HeldOut):
    """What `validate_circuit` measures on held-out prompts (the rest beside the finding's classes is
    `IOIFigures.heldout`). A class's details: for writers to the logits, "writes" (mean direct logit
    attribution to "IO" and "S" at END, in logits); a writer writing the wrong way is unconfirmed. Files
    saved before 2026-12-01 also hold "heterogeneity" (Cochran's Q over templates: "Q", "df", "p", "I2"),
    which `ClassVerdict.differ_p` replaced."""

    classes: dict[str, ClassVerdict]  # non-empty classes only, by name (`validate_circuit`)
    faithfulness_summary: FaithfulnessSummary | None = None  # with its per-prompt error (None: saved before)
    faithfulness_strata: list[StratumFaithfulness] = field(default_factory=list)  # per order and template

    def held_out(self) -> HeldOut:
        """Its figures beside the classes, faithfulness and strata."""
        return HeldOut(**{name: getattr(self, name) for name in HeldOut.__dataclass_fields__})


@dataclass
class ExamplePatterns:
    """tokens: [pos] strings of one clean prompt; patterns: "L9H6" -> [query_pos, key_pos] attention."""

    tokens: list[str]
    patterns: dict[str, Tensor]


CLASS_TITLES = {
    "name_mover": "Name movers", "negative_name_mover": "Negative name movers",
    "backup_name_mover": "Backup name movers", "s_inhibition": "S-inhibition",
    "s_suppression": "S-suppression", "induction": "Induction", "duplicate_token": "Duplicate-token",
    "previous_token": "Previous-token",
}  # fmt: skip
STEP_TITLES = {
    "logits": "heads -> logits (direct path)",
    "name_mover_queries": "heads -> name movers' queries at END",
    "s_suppression_queries": "heads -> S-suppression heads' queries at END",
    "s_inhibition_values": "heads -> S-inhibition heads' own values at S2",
    "induction_keys": "heads -> induction heads' own keys at S1+1",
    "logits_without_name_movers": "heads -> logits, name movers mean-ablated",
    "backup_growth": "growth of the direct effect when name movers are ablated",
}
SHARED_KV_STEP_TITLES = {  # files saved before steps 3 and 4 patched each receiver's own copy
    "s_inhibition_values": "heads -> S-inhibition values at S2 (grouped-query: their key/value heads')",
    "induction_keys": "heads -> induction keys at S1+1 (grouped-query: their key/value heads')",
}
VERDICT_WORDS = {  # a held-out verdict -> how the headline says it
    "confirmed": "confirmed on held-out prompts",
    "order-dependent": "order-dependent (hold in one name order only)",
    "template-dependent": "template-dependent (hold in few templates)",
    "unconfirmed": "unconfirmed on held-out prompts",
}
HEADLINE_UNCLASSIFIED = 3  # unclassified heads the headline names, largest |effect| first
UNCONFIRMED_MARK = "*"  # after a class held-out validation did not confirm (the headline says why)
UNCONFIRMED_NOTE = f"{UNCONFIRMED_MARK} not confirmed on held-out prompts: see the first lines."
CLASS_LEGEND = (
    "Held out, a class's drop is (clean - mean-ablated logit diff) / the unablated held-out logit diff "
    "(0.10: 10%) when its heads, or as many random heads from the same layers outside the circuit, are "
    "mean-ablated; positive: the class helps predict IO (negative name movers: negative)."
)
HOLDS = (
    "its CI excludes 0 the class's way (a name order: ABBA, IO named first, or BABA) or its mean points "
    "that way (a template); a class is confirmed when it holds pooled, in both orders and in most templates, "
    "or where those fall short, the orders (templates) differ no more than chance"
)
HEAD_COLUMNS = ("class", "head", "effect", "z", "attention", "found by", "writes IO, S")
LEGEND = (
    "Signs and units. logit diff = logit(IO) - logit(S) at END, in logits. effect = (clean - patched "
    "mean logit diff) / clean mean logit diff, in %, when the head's output is path-patched from the ABC "
    "run along its step's path ('found by'): positive, the head helps predict IO (name movers, "
    "S-inhibition); negative, it works against IO (negative name movers). z: robust z-score of the "
    "effect among the step's senders ((effect - median) / 1.4826 MAD; most senders' effects are near 0, "
    "so a head that matters scores in the tens or hundreds: a rank, not a probability). attention: mean "
    "attention probability (0 to 1) from the class's query position to its key position. writes IO, S: "
    "the head's direct logit attribution, its mean direct contribution to the IO and S logits at END, in "
    "logits (name movers: IO +; negative name movers: IO -; S-suppression: S -)."
)


def _z(z: float) -> str:
    """A robust z: one decimal below 10, whole numbers beyond (a head that matters scores in the tens)."""
    return f"{z:+.1f}" if abs(z) < 10 else f"{z:+.0f}"


def _count(n: int, noun: str) -> str:
    """ "1 head", "5 heads"."""
    return f"{n} {noun}{'s' * (n != 1)}"


def _by_size(heads: list[HeadEvidence]) -> list[HeadEvidence]:
    return sorted(heads, key=lambda h: -abs(h.effect))


def _effects(heads: list[HeadEvidence]) -> str:
    """ "L29H1 +29.9%, L29H0 -22.5%": heads with their path-patching effects."""
    return ", ".join(f"{h.name} {h.effect:+.1%}" for h in heads)


def _summed(heads: list[HeadEvidence]) -> str:
    """ "L29H0 -22.5%, L24H5 -8.6%: -31.1% together"."""
    return f"{_effects(heads)}: {sum(h.effect for h in heads):+.1%} together"


def _where(c: ClassVerdict) -> str:
    """Where a class holds, and how sure it is that the strata differ: "BABA only; the orders differ,
    p 0.002" (order-dependent), "3 of 12 templates; ..." (template-dependent)."""
    kind = "order" if c.verdict == "order-dependent" else "template"
    if kind == "order":
        where = " and ".join(s.name for s in c.strata if s.kind == "order" and s.holds) + " only"
    else:
        templates = [s for s in c.strata if s.kind == "template" and s.holds is not None]
        where = f"{sum(s.holds for s in templates)} of {len(templates)} templates"
    return where if kind not in c.differ_p else f"{where}; the {kind}s differ, p {c.differ_p[kind]:.1g}"


def _drops(c: ClassVerdict) -> str:
    return f"{signed(c.heldout.drop)}, {signed(c.heldout.random_drop)}"


def _io_s(logits: dict[str, float]) -> str:
    """ "+1.23, -0.45": figures on the IO and S logits, in logits."""
    return f"{logits['IO']:+.2f}, {logits['S']:+.2f}"


def _writes(c: ClassVerdict) -> str:
    written = c.details.get("writes")
    return "" if written is None else _io_s(written)


# IOI's columns of the class table (`sections.class_sections`): title, cell, legend; narrower: writes only.
CLASS_DETAILS = (
    ("drop, random", _drops, "the class's and the random sets' mean drops"),
    ("writes IO, S", _writes, "the writers' mean direct logit attribution to IO and S at END, in logits"),
)
NARROW_DETAILS = ("writes IO, S",)


def unconfirmed(finding: Finding) -> list[str]:
    """The classes held-out validation did not confirm."""
    return [found.name for found in finding.classes if found.verdict != "confirmed"]


@dataclass(kw_only=True)
class IOIFigures(Extras):
    """`find_ioi_circuit`'s own figures. class_heads: class name -> the heads path patching put in it
    (every class of CLASSES), strongest effect first; unclassified: causal outliers without the
    matching attention; effects: sweep -> [layer, head] relative drops (NaN: not a sender);
    path_patched: sweep -> the senders path-patched [layer, head] (the others keep EAP's estimate; a
    sweep missing: not recorded, as in files saved before 2026-12-02); attention: kind -> [layer, head]
    mean attention on clean prompts; thresholds: sweep or attention kind -> threshold figures;
    evaluation: the circuit on the discovery prompts (None: not evaluated); heldout: validation's
    figures beside its classes (None: not validated); example: attention of the circuit's heads on
    one clean prompt."""

    wide_terminal: ClassVar[int] = 120  # columns from which the terminal table shows how each head was found

    baseline: Baseline
    class_heads: dict[str, list[HeadEvidence]]
    unclassified: list[HeadEvidence]
    effects: dict[str, Tensor]
    attention: dict[str, Tensor]
    thresholds: dict[str, dict[str, float]]
    evaluation: Evaluation | None = None
    heldout: HeldOut | None = None
    example: ExamplePatterns | None = None
    own_kv_copies: bool = False  # steps 3 and 4 patched each receiver's own key/value copy (older files: not)
    path_patched: dict[str, Tensor] = field(default_factory=dict)

    def step_title(self, step: str) -> str:
        """A sweep's title; in a file saved before steps 3 and 4 patched each receiver's own copy of
        its value or key, those steps say what they patched on a grouped-query model."""
        titles = STEP_TITLES if self.own_kv_copies else STEP_TITLES | SHARED_KV_STEP_TITLES
        return titles.get(step, step)

    @property
    def circuit(self) -> dict[str, list[Head]]:
        return {name: [(h.layer, h.head) for h in heads] for name, heads in self.class_heads.items()}

    @property
    def heads(self) -> list[Head]:
        return sorted({head for heads in self.circuit.values() for head in heads})

    def title(self, finding: Finding) -> str:
        return f"IOI circuit of {finding.model}"

    def headline(self, finding: Finding) -> list[str]:
        """The circuit's size and what it recovers, its classes by held-out verdict, the unclassified
        heads."""
        e, v = self.evaluation, self.heldout
        n_classes = sum(1 for heads in self.class_heads.values() if heads)
        lines = [f"IOI circuit of {finding.model}: {len(self.heads)} heads in {n_classes} classes"]
        if v is not None:
            lines[0] += (
                f"; on {v.n_prompts} held-out prompts{self.held_out_scope(finding)} it recovers "
                f"{v.recovered:.0%} of the logit diff {v.recovered_ci_text(0)}."
            )
            for verdict, words in VERDICT_WORDS.items():
                named = [
                    c.name if verdict == "confirmed" else f"{c.name} ({c.unconfirmed_because or _where(c)})"
                    for c in finding.classes
                    if c.verdict == verdict
                ]
                if named:
                    lines.append(f"{words[0].upper()}{words[1:]}: {', '.join(named)}.")
        elif e is not None:
            lines[0] += (
                f"; it recovers {e.recovered:.0%} of the logit diff (not validated on held-out prompts)."
            )
        else:
            lines[0] += " (neither evaluated nor validated)."
        if self.unclassified:
            largest = _by_size(self.unclassified)
            named, more = largest[:HEADLINE_UNCLASSIFIED], len(largest) - HEADLINE_UNCLASSIFIED
            lines.append(
                f"Not among the {len(self.heads)} heads: {_count(len(largest), 'unclassified head')}, "
                f"selected by path patching but attending as no class does: {'the largest ' * (more > 0)}"
                f"{_effects(named)}" + (f" and {more} more" if more > 0 else "") + " (path-patching effect)."
            )
        return lines

    def chose_lines(self, finding: Finding) -> list[str]:
        """The prompts and rules that chose the heads, the held-out prompts that tested them, the sign."""
        s, v = finding.settings, self.heldout
        heldout = [] if v is None else [
            f"held out: {v.n_prompts} prompts from {v.prompts}: logit diff {v.logit_diff:.3f}, recovered "
            f"{v.recovered:.1%} {v.recovered_ci_text(1, brackets=True)}, faithfulness {v.faithfulness:.1%}"
            + ("; CIs over the prompts within each held-out template: the verdicts are about these "
               "templates' prompts, not new templates" if self.held_out_scope(finding) else "")
        ]  # fmt: skip
        return [
            f"chosen on {s.n_prompts} discovery prompts (seed {s.seed}; path-patching effects on the first "
            f"{min(s.n_patching_prompts, s.n_prompts)}), corrupted distribution {s.corrupted}",
            f"selection: |effect| >= {s.min_effect:.0%} and (|robust z| >= {s.effect_z} or >= "
            f"{s.min_share:.0%} of the step's summed effect in its direction); attention >= min(max(median + "
            f"{s.attention_z} robust SD, {s.min_attention}), {s.large_attention})",
            *heldout,
            f"effects: {EFFECT_SIGN} (path patching: the run with the head's path patched from "
            f"{s.corrupted}; relative to the clean logit diff, in %)",
        ]

    def held_out_scope(self, finding: Finding) -> str:
        """ " of the 2 held-out templates (T3, T4)" where 1 to 3 templates tested and the CIs resampled
        their prompts within each (`held_out_unit`), else "" (4 or more; or a file saved before the
        templates were counted, or before 2026-12-04, whose CI over 2 or 3 templates is none)."""
        v = self.heldout
        if v is None or not 0 < v.n_templates < MIN_FAMILIES or math.isnan(v.recovered_ci[0]):
            return ""
        templates = finding.tested["templates"]
        return " of " + held_out_unit(templates, "template", "templates").removeprefix("prompts of ")

    def class_view(self, finding: Finding, wide: bool) -> ClassView:
        """IOI's columns (narrower: the writes only), its legend, and an example prompt of each template
        under the strata."""
        details = [column for column in CLASS_DETAILS if wide or column[0] in NARROW_DETAILS]
        first = finding.classes[0].strata if finding.classes else []
        return ClassView(
            columns=[(title, cell) for title, cell, _ in details],
            holds=HOLDS,
            digits=3,
            notes=[" ".join([CLASS_LEGEND, *(f"{title}: {words}." for title, _, words in details)])],
            strata_notes=[f"{s.name}: {s.example}" for s in first if s.kind == "template" and s.example],
        )

    def faithfulness_kept(self, finding: Finding) -> str:
        return f"the circuit's {len(self.heads)} heads kept, every other head mean-ablated"

    def discovery_sections(self, finding: Finding, wide: bool) -> list[Section]:
        """The circuit's diagram, the model and the circuit on the discovery prompts, the heads' table
        (`wide`: with the step that found each)."""
        validated = self.heldout is not None
        dashed = "Dashed: a class held-out validation did not confirm (its verdict in italics)."
        attribution = finding.settings.attribution
        return [
            Section(
                title="Circuit",
                figures=[ioi_circuit_diagram(finding), *([f"<p>{dashed}</p>"] if validated else [])],
            ),
            Section(title="The model and the circuit on the discovery prompts", lines=self._circuit_lines()),
            Section(
                title="Heads of the circuit",
                table=self._head_table(finding, wide),
                notes=[
                    *([UNCONFIRMED_NOTE] if validated and unconfirmed(finding) else []),
                    LEGEND,
                    *([f"Direct logit attribution: {attribution}."] if attribution else []),
                ],
            ),
        ]

    def extra_sections(self, finding: Finding, wide: bool) -> list[Section]:
        """Minimality, then the HTML page's heat maps and attention patterns."""
        sections = []
        e = self.evaluation
        if e is not None and e.minimality:
            minimality = ", ".join(f"{head} {value:+.1%}" for head, value in e.minimality.items())
            line = f"drop of the circuit's logit diff without the head (class-mates removed): {minimality}"
            if e.circuit_logit_diff <= 0:  # a share of a logit diff at or below 0 has no sign to read
                line = (
                    f"not defined: the circuit's logit diff is {e.circuit_logit_diff:+.3f} (it does not do "
                    "the task), so a drop has no share of it"
                )
            sections.append(Section(title="Minimality", lines=[line]))
        effects, attention, patterns = self._figures()
        return [
            *sections,
            Section(title="Path-patching effects", figures=effects),
            Section(title="Attention evidence", figures=attention),
            Section(title="Attention patterns", figures=patterns),
        ]

    def json_fields(self, finding: Finding) -> dict[str, Any]:
        """Every field (the heads labelled, class_heads as "heads"), the circuit as [layer, head] pairs
        per class, the logit diff, and on the discovery prompts the share recovered and faithfulness."""
        e = self.evaluation
        labelled = ("class_heads", "unclassified")  # written below with the heads labelled
        return {
            **{name: value for name, value in vars(self).items() if name not in labelled},
            "logit_diff": self.baseline.logit_diff,
            "circuit": self.circuit,
            "heads": {name: [_labelled(h) for h in heads] for name, heads in self.class_heads.items()},
            "unclassified": [_labelled(h) for h in self.unclassified],
            "recovered": None if e is None else e.recovered,
            "discovery_faithfulness": None if e is None else e.faithfulness,
        }

    def _circuit_lines(self) -> list[str]:
        """The model on the discovery prompts, and how much of it the circuit recovers there."""
        b, e = self.baseline, self.evaluation
        lines = [
            f"logit diff (IO - S) {b.logit_diff:.3f} (95% CI {ci_text(b.logit_diff_ci, 2, sign=False)}), "
            f"accuracy {b.accuracy:.1%} (95% CI {percent_ci(b.accuracy_ci, 1)}), top-1 = IO {b.top1_io:.1%}, "
            f"ABC logit diff {b.abc_logit_diff:.3f}",
        ]
        if e is not None:
            lines.append(
                f"recovered {e.recovered:.1%} of the logit diff (circuit {e.circuit_logit_diff:.3f} / model "
                f"{e.model_logit_diff:.3f}), faithfulness {e.faithfulness:.1%} (all heads ablated "
                f"{e.ablated_logit_diff:.3f})"
            )
            lines += [*self._unclassified_lines(), self._completeness_line()]
        return lines

    def _unclassified_lines(self) -> list[str]:
        """The unclassified heads and what keeping them with the circuit does to what it recovers, and why."""
        e, heads = self.evaluation, _by_size(self.unclassified)
        if not heads or e.recovered_with_unclassified is None:
            return []
        before, after = e.recovered, e.recovered_with_unclassified
        lowers = after < before
        helping, against = [h for h in heads if h.effect > 0], [h for h in heads if h.effect < 0]
        net = sum(h.effect for h in heads)
        change = (
            f"keeping {'it' if len(heads) == 1 else 'them'} with the circuit "
            f"{'lowers' if lowers else 'raises'} what it recovers from {before:.1%} to {after:.1%} "
            f"(faithfulness {e.faithfulness:.1%} to {e.faithfulness_with_unclassified:.1%})"
        )
        if lowers != (net < 0):
            reason = (
                f"though their path-patching effects sum to {net:+.1%}: effects measured one head at a time "
                "in the whole model need not add up once every other head is mean-ablated"
            )
        elif not (helping and against):
            reason = ("every one " if len(heads) > 1 else "it ") + (
                "works against IO" if lowers else "helps predict IO"
            )
        else:
            weigh = "outweigh" if lowers else "weigh less than"
            reason = f"those that work against IO ({_summed(against)}) {weigh} those that help "
            reason += f"({_summed(helping)})"
        return [
            f"unclassified: {_count(len(heads), 'head')} selected by path patching whose attention fits no "
            f"class, not counted in the circuit: {_effects(heads)} (path-patching effect; negative: the head "
            f"works against IO); {change}: {reason}"
        ]

    def _completeness_line(self) -> str:
        """Completeness (Wang et al.'s) in words: its largest gap, the subset with it, which way it goes."""
        e = self.evaluation
        gaps = [c["gap"] for c in e.completeness]
        worst = max(e.completeness, key=lambda c: c["gap"])
        heads = sorted(tuple(head) for head in worst["heads"])
        names = ", ".join(head_label(*head) for head in heads)
        classes = [cls for cls, members in self.circuit.items() if members and sorted(members) == heads]
        subset = f"the {classes[0]} class ({names})" if classes else f"{len(heads)} of its heads ({names})"
        circuit, model = worst["circuit_logit_diff"], worst["model_logit_diff"]
        way = (
            "heads outside the circuit make up for K in the model, and the circuit lacks them"
            if model > circuit
            else "heads outside the circuit work against IO once K is gone"
        )
        n_classes = sum(1 for members in self.circuit.values() if members)
        return (
            "completeness (Wang et al.): knocking a subset K of the circuit's heads out of the circuit and "
            "out of the whole model should hurt both alike; the gap |F(C\\K) - F(M\\K)| / F(M) (F: the logit "
            f"diff with the heads outside the set mean-ablated; 0: alike) over {len(gaps)} subsets (each of "
            f"the {n_classes} classes and {len(gaps) - n_classes} random subsets) is {max(gaps):.1%} at most "
            f"(median {statistics.median(gaps):.1%}); the largest for K = {subset}: without it the circuit "
            f"keeps a logit diff of {circuit:.3f}, the model {model:.3f}: {way}"
        )

    def _head_table(self, finding: Finding, wide: bool) -> Table:
        """The circuit's heads, then the unclassified ones; `wide`: with the step that found each."""
        doubted = unconfirmed(finding) if self.heldout is not None else []
        labelled = [
            (f"{cls}{UNCONFIRMED_MARK}" if cls in doubted else cls, CLASS_KIND[cls], h)
            for cls in CLASSES
            for h in self.class_heads[cls]
        ]
        labelled += [("unclassified", max(h.attention, key=h.attention.get), h) for h in self.unclassified]
        columns = [column for column in HEAD_COLUMNS if wide or column != "found by"]
        rows = []
        for cls, kind, h in labelled:
            cells = [cls, h.name, f"{h.effect:+.1%}", _z(h.z), f"{kind} {h.attention[kind]:.2f}", h.step,
                     _io_s(h.direct_logit_attribution)]  # fmt: skip
            rows.append([cell for column, cell in zip(HEAD_COLUMNS, cells, strict=True) if column in columns])
        return Table(columns=columns, rows=rows, right=["effect", "z"])

    def _estimates_note(self, step: str) -> str:
        """What a step's heat map says of the senders that keep EAP's estimate."""
        if step not in self.path_patched:
            return ESTIMATES_NOT_RECORDED
        estimated = ~self.path_patched[step] & self.effects[step].isfinite()
        return ESTIMATED_CELLS if estimated.any() else "every sender path-patched"

    def _figures(self) -> tuple[list[str], list[str], list[str]]:
        """The HTML page's figures: path-patching effects and attention as [layer, head] heat maps, and
        the attention patterns of each class's heads on the example prompt."""
        caption = (
            "drop of the logit diff when the sender's path is patched from the ABC run ((clean - patched) / "
            "clean, %; positive: the head helps predict IO); grey: not a sender in that step; "
        )
        effects = [
            layer_head_map(
                values * 100,
                f"{self.step_title(step)} (%)",
                caption + self._estimates_note(step),
                signed=True,
                value_format="{:.1f}",
                approximate=None if step not in self.path_patched else ~self.path_patched[step],
            )
            for step, values in self.effects.items()
            if values.isfinite().any()
        ]
        attention = [
            layer_head_map(values, f"attention {kind}", "mean attention on the clean prompts", signed=False)
            for kind, values in self.attention.items()
        ]
        patterns = []
        example = self.example
        if example is not None:
            patterns.append(f"<p>Example prompt: {html.escape(''.join(example.tokens))}</p>")
            for cls in CLASSES:
                names = [h.name for h in self.class_heads[cls] if h.name in example.patterns]
                if not names:
                    continue
                title = f"{CLASS_TITLES[cls]}: expected {' -> '.join(CLASS_ATTENTION[cls])}"
                patterns += [
                    f"<h3 class='ioi-pattern-class'>{html.escape(title)}</h3>",
                    attention_patterns_html(example.tokens, [example.patterns[n] for n in names], names),
                ]
        return effects, attention, patterns


ESTIMATED_CELLS = (
    "~italic: EAP's linear estimate of a sender that was not path-patched (EAP ranked it below those "
    "path-patched and its estimate was under half the least effect a head is selected on)"
)
ESTIMATES_NOT_RECORDED = (
    "this result does not record which senders were path-patched: with EAP ranking (exact_candidates > 0), "
    "those outside the ones it ranked first keep EAP's estimate"
)


def _labelled(evidence: HeadEvidence) -> dict[str, Any]:
    return {**vars(evidence), "name": evidence.name}


# Columns of the diagram, left (early layers) to right (logits), and the paths between classes.
_COLUMNS = (("previous_token",), ("duplicate_token", "induction"), ("s_inhibition",),
            ("name_mover", "backup_name_mover", "negative_name_mover", "s_suppression"))  # fmt: skip
_EDGES = (
    ("previous_token", "induction", "K"), ("induction", "s_inhibition", "V"),
    ("duplicate_token", "s_inhibition", "V"), ("s_inhibition", "name_mover", "Q"),
    ("s_inhibition", "backup_name_mover", "Q"), ("s_inhibition", "s_suppression", "Q"),
    ("name_mover", "logits", ""),
    ("backup_name_mover", "logits", ""), ("negative_name_mover", "logits", ""),
    ("s_suppression", "logits", ""),
)  # fmt: skip
_COLOURS = {
    "name_mover": "#2e7d32", "backup_name_mover": "#81c784", "negative_name_mover": "#c62828",
    "s_inhibition": "#6a1b9a", "s_suppression": "#ad1457", "induction": "#1565c0",
    "duplicate_token": "#00838f", "previous_token": "#ef6c00", "logits": "#424242",
}  # fmt: skip


HEADS_PER_LINE = 3  # head labels per line of a diagram box ("L23H10, L23H11, L23H12" fits its width)
LINES_PER_BOX = 3  # lines of heads a box lists; more heads are counted ("+4 more")


def _box_lines(heads: list[str]) -> list[str]:
    shown = heads[: HEADS_PER_LINE * LINES_PER_BOX]
    lines = [", ".join(shown[i : i + HEADS_PER_LINE]) for i in range(0, len(shown), HEADS_PER_LINE)]
    if len(heads) > len(shown):
        lines.append(f"+{len(heads) - len(shown)} more")
    return lines


def ioi_circuit_diagram(finding: Finding) -> str:
    """An inline SVG of the circuit: a box per class (dashed: not confirmed), arrows for the paths (K:
    into keys, V: into values, Q: into queries; unlabelled: direct to the logits)."""
    figures: IOIFigures = finding.extras
    verdicts = {c.name: c.verdict for c in finding.classes}
    texts = {
        cls: (_box_lines([h.name for h in figures.class_heads[cls]]) or ["none found"])
        + ([verdicts[cls]] if cls in verdicts else [])
        for cls in CLASSES
    }
    box_w, gap_x, gap_y, margin, line_h = 180, 60, 26, 20, 16
    box_h = 34 + line_h * max(len(lines) for lines in texts.values())
    boxes = {}
    columns = [*_COLUMNS, ("logits",)]
    height = max(len(c) for c in columns) * (box_h + gap_y) + 2 * margin
    for col, classes in enumerate(columns):
        top = (height - len(classes) * (box_h + gap_y) + gap_y) / 2
        for row, cls in enumerate(classes):
            boxes[cls] = (margin + col * (box_w + gap_x), top + row * (box_h + gap_y))
    width = margin * 2 + len(columns) * box_w + (len(columns) - 1) * gap_x
    parts = [
        f'<svg class="ioi-circuit" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="IOI circuit diagram">',
        '<defs><marker id="ioi-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>',
    ]
    for source, target, label in _EDGES:
        (x0, y0), (x1, y1) = boxes[source], boxes[target]
        found = figures.class_heads.get(source) and (target == "logits" or figures.class_heads.get(target))
        style = "" if found else ' stroke-dasharray="4 4" opacity="0.4"'
        ax, ay, bx, by = x0 + box_w, y0 + box_h / 2, x1, y1 + box_h / 2
        parts.append(
            f'<line x1="{ax}" y1="{ay}" x2="{bx}" y2="{by}" stroke="#555" stroke-width="1.5" '
            f'marker-end="url(#ioi-arrow)"{style}/>'
        )
        if label:
            parts.append(
                f'<text x="{(ax + bx) / 2}" y="{(ay + by) / 2 - 4}" font-size="12" text-anchor="middle" '
                f'font-family="sans-serif" fill="#333">{label}</text>'
            )
    for cls, (x, y) in boxes.items():
        title = "logits (IO - S)" if cls == "logits" else CLASS_TITLES[cls]
        found = cls == "logits" or bool(figures.class_heads[cls])
        colour, opacity = _COLOURS[cls], 0.15 if found else 0.04
        dashed = ' stroke-dasharray="6 4"' if verdicts.get(cls, "confirmed") != "confirmed" else ""
        lines = "".join(
            f'<text x="{x + box_w / 2}" y="{y + 44 + i * line_h}" font-size="12" text-anchor="middle" '
            + (
                f'font-family="sans-serif" font-style="italic" fill="{colour}"'
                if cls in verdicts and i == len(texts[cls]) - 1
                else 'font-family="monospace" fill="#222"'
            )
            + f">{html.escape(line)}</text>"
            for i, line in enumerate([] if cls == "logits" else texts[cls])
        )
        parts.append(
            f'<g class="ioi-class" data-class="{cls}" data-verdict="{verdicts.get(cls, "")}">'
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="8" fill="{colour}" '
            f'fill-opacity="{opacity}" stroke="{colour}"{dashed}/>'
            f'<text x="{x + box_w / 2}" y="{y + 22}" font-size="13" font-weight="bold" text-anchor="middle" '
            f'font-family="sans-serif" fill="{colour}">{html.escape(title)}</text>{lines}</g>'
        )
    parts.append("</svg>")
    return "".join(parts)
