"""Discovering the IOI circuit (Wang et al. 2022) by path patching backwards from the logits:
`find_ioi_circuit` measures the model on the clean prompts (baseline, attention, direct logit
attribution), runs the paper's steps in order (`circuits.ioi.steps`), each on the heads the previous
ones found, then evaluates the circuit and validates it on held-out prompts (`circuits.ioi.evaluate`).

The result is a `circuits.finding.Finding` ("ioi"): held-out validation's classes, faithfulness and
strata, the discovery's figures as `IOIFigures`. One class is not in the paper: S-suppression heads act
on the logits like name movers but attend END->S2 and write against S (SmolLM2's strongest direct head is
one; toy IOI models use them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import interp
from circuits.discovery import end_logits_and_cache
from circuits.evidence import check_apart, mean_ci
from circuits.finding import Finding
from circuits.ioi.evaluate import evaluate_circuit, validate_circuit
from circuits.ioi.evidence import ClassEvidence, measure_class_evidence
from circuits.ioi.patching import EAPRanking, MeanAblation, path_patching_effects
from circuits.ioi.results import (
    CLASSES,
    Baseline,
    Evaluation,
    ExamplePatterns,
    HeadEvidence,
    IOIFigures,
    Settings,
)
from circuits.ioi.steps import (
    PatchingPrompts,
    StepInputs,
    StepResult,
    find_backup_name_movers,
    find_induction_and_duplicate_token_heads,
    find_name_movers,
    find_previous_token_heads,
    find_s_inhibition_heads,
    patching_prompts,
    timed,
)
from circuits.ioi.task import drawn_families, prompt_families
from circuits.stages import StageResults
from interp.interventions.engine import cached_run, forward_logits
from interp.model.cache import direct_attribution_linearisation
from interp.tasks.ioi import heldout_description, ioi_dataset_for
from interp.tasks.ioi_prompts import IOIPrompts
from interp.types import Head, Progress, as_stage, head_label

THRESHOLDS = set(Settings.__dataclass_fields__) - {"n_prompts", "seed", "attribution", "corrupted"}


KEPT_STAGES = (  # the stages find_ioi_circuit reports and keeps in its StageResults: each step, the tests
    "path patching: name movers", "path patching: S-inhibition",
    "path patching: induction and duplicate-token", "path patching: previous-token",
    "path patching: backup name movers", "evaluation", "validation on held-out prompts",
)  # fmt: skip
BASELINE_STAGE = "baseline, attention and direct logit attribution"
EXAMPLE_STAGE = "example attention patterns"
BETWEEN_STAGES = (BASELINE_STAGE, EXAMPLE_STAGE)  # reported before and after them, not kept (quick)
HELDOUT_GIVEN = "held-out prompts given to find_ioi_circuit"  # what was held out, where the caller says


def ioi_stage_notes(stage: str, value: Any) -> list[str]:
    """A few lines on a kept stage's `value` (one of KEPT_STAGES), for a partial result."""
    if isinstance(value, StepResult):
        found = [
            f"{cls}: {', '.join(h.name for h in heads)}" for cls, heads in value.classes.items() if heads
        ]
        return found or ["No heads in this step's classes."]
    if isinstance(value, Evaluation):
        return [f"Discovery prompts: faithfulness {value.faithfulness:.2f}, recovered {value.recovered:.2f}."]
    verdicts = [f"{name}: {found.verdict}" for name, found in value.classes.items()]
    return [
        f"Held-out prompts: recovered {value.recovered:.0%} {value.recovered_ci_text(0)}; "
        f"{'; '.join(verdicts)}."
    ]


def find_ioi_circuit(
    model: interp.HookedTransformer,
    n_prompts: int = 64,
    seed: int = 0,
    progress: Progress | None = None,
    evaluate: bool = True,
    prompts: tuple[IOIPrompts, IOIPrompts] | None = None,
    heldout: tuple[IOIPrompts, IOIPrompts] | None = None,
    validate: bool = True,
    stages: StageResults | None = None,
    **thresholds: float,
) -> Finding:
    """Find the IOI circuit of `model` by path patching from the logits backwards (module docstring).

    prompts: (clean, abc) instead of ioi_dataset_for(model, n_prompts, seed). heldout: (clean, abc)
    to validate on; default the "heldout" split when `prompts` is None, else no validation.
    evaluate, validate: False skips that stage. progress(stage, done, total): each stage of
    KEPT_STAGES and BETWEEN_STAGES as it begins (0, 1) and ends (1, 1), a step's sweeps as its parts,
    a skipped sweep as (stage, 0, 0). stages: the kept stages' results, those already in it not run
    again. thresholds: `Settings` fields to override (THRESHOLDS); exact_candidates 0 path-patches
    every sender, else steps 1-4 path-patch the senders EAP ranks first (`EAPRanking`; into a
    grouped-query model's keys or values, by its estimate into each receiver's own copy) and step 5
    every sender. The finding's chose and tested: the families the prompts drew (`drawn_families`), or
    the templates of the prompts given.
    """
    start = time.perf_counter()
    clean, abc, settings = discovery_prompts(model, n_prompts, seed, prompts, thresholds)  # 1.
    description, families = HELDOUT_GIVEN, None
    if heldout is None and prompts is None:  # made now: a split too small is refused before any work
        heldout = ioi_dataset_for(model, n_prompts, seed, "heldout")[:2]
        description, families = heldout_description(model), drawn_families(model, "heldout", heldout[0])
    if heldout is not None:
        check_apart(clean.tokens, heldout[0].tokens, clean.positions["END"], heldout[0].positions["END"])
    timings = {"dataset": time.perf_counter() - start}
    measured = measure_prompts(model, clean, abc, settings, timings, progress)  # 2.
    stages = StageResults() if stages is None else stages
    steps = run_steps(model, measured, settings, stages, progress)  # 3.
    figures = _combine(measured, steps)
    chose = drawn_families(model, "discovery", clean) if prompts is None else prompt_families(clean)
    finding = Finding(
        analysis="ioi", model=model.cfg.model_name, provenance=interp.provenance(model), settings=settings,
        chose=chose, tested={},
        classes=[], timings=timings | {name: t for step in steps for name, t in step.timings.items()},
        extras=figures,
    )  # fmt: skip

    def kept(stage: str, compute: Callable[[Progress | None], Any]) -> Any:
        """compute(the stage's progress), timed, kept in `stages` as `stage` (not run again if there)."""

        def run() -> Any:
            with timed(stage, finding.timings, progress):
                return compute(as_stage(progress, stage))

        return stages.run(stage, run, progress)

    if evaluate and figures.heads:  # 4.
        n_subsets, ablation = settings.n_completeness_subsets, measured.mean_ablation
        figures.evaluation = kept(
            "evaluation",
            lambda step: evaluate_circuit(finding, clean, ablation, n_subsets, settings.seed, step),
        )
    if validate and heldout is not None and figures.heads:  # 5.
        tested, tested_abc = (p.to(model.device) for p in heldout)
        validation = kept(
            "validation on held-out prompts",
            lambda step: validate_circuit(model, finding, tested, tested_abc, description, step),
        )
        finding.tested = prompt_families(tested) if families is None else families
        finding.classes = list(validation.classes.values())
        finding.faithfulness = validation.faithfulness_summary
        finding.faithfulness_strata = validation.faithfulness_strata
        figures.heldout = validation.held_out()
    if figures.heads:
        with timed(EXAMPLE_STAGE, finding.timings, progress):
            figures.example = example_patterns(model, clean, figures.heads)  # 6.
    finding.timings["total"] = time.perf_counter() - start
    return finding


def check_sizes(model: interp.HookedTransformer, n_prompts: int, seed: int = 0) -> interp.HookedTransformer:
    """`model`, once both splits hold `n_prompts` distinct IOI prompts in its tokenizer (ValueError
    otherwise, naming the most there are): what `interp ioi` checks before it announces its stages."""
    for split in ("discovery", "heldout"):
        ioi_dataset_for(model, n_prompts, seed, split)
    return model


def discovery_prompts(
    model: interp.HookedTransformer,
    n_prompts: int,
    seed: int,
    prompts: tuple[IOIPrompts, IOIPrompts] | None,
    thresholds: dict[str, float],
) -> tuple[IOIPrompts, IOIPrompts, Settings]:
    """1. The (clean, abc) discovery prompts on the model's device and the run's Settings (unknown
    `thresholds` refused)."""
    unknown = set(thresholds) - THRESHOLDS
    if unknown:
        raise ValueError(f"unknown settings {sorted(unknown)}; choose from {', '.join(sorted(THRESHOLDS))}")
    if prompts is None:
        clean, abc, _ = ioi_dataset_for(model, n_prompts, seed)
    else:
        clean, abc = prompts
    settings = Settings(
        n_prompts=len(clean),
        seed=seed,
        attribution=direct_attribution_linearisation(model.cfg),
        **thresholds,
    )
    return clean.to(model.device), abc.to(model.device), settings


@dataclass
class Measurements:
    """What the steps read of the clean and ABC runs on the discovery prompts."""

    baseline: Baseline
    evidence: ClassEvidence
    patching: PatchingPrompts
    mean_ablation: MeanAblation


def measure_prompts(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    settings: Settings,
    timings: dict[str, float],
    progress: Progress | None,
) -> Measurements:
    """2. One clean run (baseline, attention, direct logit attribution) and one ABC run (the mean
    ablation's means); refused if the model's logit diff is not above 0 (no circuit to find)."""
    with timed(BASELINE_STAGE, timings, progress):
        clean_logits, clean_cache = end_logits_and_cache(model, clean)
        abc_logits, abc_cache = cached_run(
            model, abc.tokens, model.layer_hook_names("z"), logit_pos=clean.positions["END"]
        )
        mean_ablation = MeanAblation(model, abc, abc_cache)
        baseline = measure_baseline(
            model, clean, abc, settings.n_bootstrap, settings.seed, clean_logits, abc_logits
        )
        if baseline.logit_diff_ci[0] <= 0:
            low, high = baseline.logit_diff_ci
            raise ValueError(
                f"{model.cfg.model_name} does not do IOI on these prompts: mean logit diff "
                f"{baseline.logit_diff:.2f} (95% CI [{low:.2f}, {high:.2f}]) is not above 0, so there is "
                "no circuit to find. Use a model that prefers the indirect object (a toy model may need "
                "more training steps), or more prompts."
            )
        evidence = measure_class_evidence(model, clean, settings, clean_cache)
        patching = patching_prompts(model, clean, abc, settings.n_patching_prompts, clean_logits)
    return Measurements(baseline=baseline, evidence=evidence, patching=patching, mean_ablation=mean_ablation)


def run_steps(
    model: interp.HookedTransformer,
    measured: Measurements,
    settings: Settings,
    stages: StageResults,
    progress: Progress | None,
) -> list[StepResult]:
    """3. The paper's steps (circuits.ioi.steps), each kept in `stages` as KEPT_STAGES[0..4]; senders
    ranked by `EAPRanking(exact_candidates, half of min_effect)`, or all patched if exact_candidates is 0."""
    min_estimate = 0.5 * settings.min_effect * abs(measured.patching.logit_diff)
    exact = settings.exact_candidates
    sender_effects = EAPRanking(exact, min_estimate) if exact > 0 else path_patching_effects
    inputs = StepInputs(
        model=model, prompts=measured.patching, settings=settings, evidence=measured.evidence,
        sender_effects=sender_effects, progress=progress,
    )  # fmt: skip

    def kept_step(index: int, find: Callable[[StepInputs], StepResult]) -> StepResult:
        """find(the inputs, its sweeps reported as parts of the stage), kept as KEPT_STAGES[index]."""
        stage = KEPT_STAGES[index]
        step_inputs = dataclasses.replace(inputs, progress=_sweeps_of(progress, stage))

        def run() -> StepResult:
            with timed(stage, {}, progress):  # announced; each sweep of the step times itself
                return find(step_inputs)

        return stages.run(stage, run, progress)

    direct = kept_step(0, find_name_movers)
    name_movers = direct.heads("name_mover")
    s_inhibition = kept_step(
        1, lambda step: find_s_inhibition_heads(step, name_movers, direct.heads("s_suppression"))
    )
    values = kept_step(
        2, lambda step: find_induction_and_duplicate_token_heads(step, s_inhibition.heads("s_inhibition"))
    )
    keys = kept_step(3, lambda step: find_previous_token_heads(step, values.heads("induction")))
    steps = [direct, s_inhibition, values, keys]
    classified = {head for step in steps for heads in step.classes.values() for head in _heads(heads)}
    backup = kept_step(
        4,
        lambda step: find_backup_name_movers(
            step, name_movers, direct.effects["logits"], classified, measured.mean_ablation
        ),
    )
    return [*steps, backup]


def _sweeps_of(progress: Progress | None, stage: str) -> Progress | None:
    """`progress` for a step's sweeps, each reported as a part of the step's stage."""
    if progress is None:
        return None
    return lambda sweep, done, total: progress(
        f"{stage}: {sweep.removeprefix('path patching: ')}", done, total
    )


def _heads(found: Sequence[HeadEvidence]) -> list[Head]:
    return [(h.layer, h.head) for h in found]


def _combine(measured: Measurements, steps: Sequence[StepResult]) -> IOIFigures:
    """The discovery's figures from the steps' findings: a head joins a class once, with the evidence of
    the first step that put it there; unclassified only if no step classified it."""
    classes: dict[str, list[HeadEvidence]] = {name: [] for name in CLASSES}
    for step in steps:
        for cls, found in step.classes.items():
            classes[cls] += [h for h in found if (h.layer, h.head) not in _heads(classes[cls])]
    in_classes = {head for found in classes.values() for head in _heads(found)}
    unclassified: list[HeadEvidence] = []
    for h in (h for step in steps for h in step.unclassified):
        if (h.layer, h.head) not in in_classes | set(_heads(unclassified)):
            unclassified.append(h)
    evidence = measured.evidence
    thresholds = {f"attention {kind}": {"threshold": value} for kind, value in evidence.thresholds.items()}
    return IOIFigures(
        baseline=measured.baseline,
        class_heads=classes,
        unclassified=unclassified,
        effects={name: values for step in steps for name, values in step.effects.items()},
        path_patched=_path_patched(steps),
        attention=evidence.attention,
        thresholds=thresholds | {label: fig for step in steps for label, fig in step.thresholds.items()},
        own_kv_copies=True,
    )


def _path_patched(steps: Sequence[StepResult]) -> dict[str, Tensor]:
    """Per sweep, the senders path-patched [layer, head]; backup growth (step 5's drop minus step 1's)
    is path-patched where both are."""
    patched = {name: mask for step in steps for name, mask in step.path_patched.items()}
    if {"logits", "logits_without_name_movers"} <= patched.keys():
        patched["backup_growth"] = patched["logits_without_name_movers"] & patched["logits"]
    return patched


@torch.no_grad()
def measure_baseline(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    n_bootstrap: int = 1000,
    seed: int = 0,
    clean_logits: Tensor | None = None,
    abc_logits: Tensor | None = None,
) -> Baseline:
    """Logit difference and accuracy of the model on the clean prompts, with bootstrap intervals
    (clean_logits, abc_logits [batch, pos, d_vocab]: the runs' logits at END, if run already)."""
    end = clean.positions["END"].to(model.device)
    if clean_logits is None:
        clean_logits = forward_logits(model, clean.tokens.to(model.device), end)  # logits at END only
    diffs = clean.logit_diff(clean_logits).cpu()  # [batch]
    correct = (diffs > 0).float()
    rows = torch.arange(len(clean), device=clean_logits.device)
    top1 = clean_logits[rows, end].argmax(-1).cpu() == clean.io_token.cpu()
    if abc_logits is None:
        abc_logits = forward_logits(model, abc.tokens.to(model.device), end)
    abc_diffs = clean.logit_diff(abc_logits).cpu()
    return Baseline(
        logit_diff=diffs.mean().item(),
        logit_diff_ci=mean_ci(diffs, seed, n_bootstrap),
        accuracy=correct.mean().item(),
        accuracy_ci=mean_ci(correct, seed, n_bootstrap),
        top1_io=top1.float().mean().item(),
        abc_logit_diff=abc_diffs.mean().item(),
        n_prompts=len(clean),
    )


@torch.no_grad()
def example_patterns(
    model: interp.HookedTransformer, prompts: IOIPrompts, heads: Sequence[Head]
) -> ExamplePatterns:
    """The attention patterns of `heads` on the first prompt (up to its END)."""
    end = int(prompts.positions["END"][0]) + 1
    tokens = prompts.tokens[:1, :end].to(model.device)
    layers = sorted({layer for layer, _ in heads})
    _, cache = model.run_with_cache(
        tokens, names_filter=[interp.act_name("pattern", layer) for layer in layers], return_type=None
    )
    str_tokens = [f"<{t}>" for t in tokens[0].tolist()]
    if model.tokenizer is not None:
        str_tokens = model.to_str_tokens(tokens[0])
    elif prompts.texts is not None and len(words := prompts.texts[0].split()) <= end:
        # Toy task: one word per token, the text starting after BOS.
        str_tokens[end - len(words) :] = [f" {word}" for word in words]
    patterns = {head_label(layer, head): cache["pattern", layer][0, head].cpu() for layer, head in heads}
    return ExamplePatterns(str_tokens, patterns)
