"""`function_vector_report`: function-vector heads (Todd et al. 2024) and their function vector, chosen on
discovery word-pair tasks in discovery prompt templates and tested on held-out tasks in held-out
templates, and both head classes, FV and induction, ablated: which lowers few-shot accuracy and which
the ICL score (Yin & Steinhardt 2025), each against random same-layer heads (`circuits.evidence`).

The steps:
  1. families   the tasks and, apart, the templates split into discovery and held-out
                (`split_families`, with the settings' seed); each task's pairs halved into a
                demonstration half (few-shot prompts whose mean head outputs make the vector of the
                task in one template) and a query half (the prompts every effect is measured on)
  2. heads      AIE on the discovery tasks' demonstration prompts in the discovery templates:
                attributed for every head, exact for the candidates; the FV heads are the top by exact AIE
  3. layer      the layer where the vector most raises zero-shot accuracy on the discovery tasks'
                queries in the discovery templates
  4. effects    on the queries of the discovery tasks in the discovery templates and, apart, of the
                held-out tasks in every template: the FV heads patched together, the function vector,
                each class mean-ablated; each against random same-layer sets
                (`circuits.evidence.judge_class`); the test is the held-out tasks in the held-out
                templates, reported beside the discovery figure and per template (the held-out tasks in
                a discovery template are held out by task only)
  5. ICL score  each class mean-ablated on Brown corpus texts (never used for any choice)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor

import interp
from circuits.evidence import (
    FamilySplit,
    HeadClass,
    head_class,
    head_labels,
    judge_class,
    label_strata,
    mean_ci,
    split_families,
)
from circuits.heads.cache import INDUCTION_HEADS_STAGE, induction_heads_or_confirmed
from circuits.icl.function_vectors import (
    HeadMeans,
    TaskPrompts,
    attributed_indirect_effects,
    few_shot_accuracy,
    function_vector,
    head_indirect_effects,
    mean_head_outputs,
    task_prompts,
    zero_shot_accuracy,
)
from circuits.icl.heads import ablated_icl_scores
from circuits.icl.results import (
    TEMPLATE_KINDS,
    Comparison,
    FunctionVectorResult,
    TaskVector,
    TemplateVector,
)
from circuits.icl.sequences import default_sequences
from circuits.stages import StageResults
from interp.checks import check_count
from interp.model.cache import head_contribution_linearisation
from interp.tasks.icl_tasks import (
    ICL_TASKS,
    ICL_TEMPLATES,
    check_task_names,
    check_template_names,
    single_token_pairs,
    split_pairs,
)
from interp.types import Head, Progress, as_stage, head_label

FV_STAGES = (  # the stages function_vector_report reports and keeps, after the induction heads
    "AIE of every head (discovery tasks and templates)",
    "FV added at each layer (discovery tasks and templates, zero-shot prompts)",
    "Effects on discovery tasks and held-out tasks in every template (AIE, function vectors, ablations)",
    "Ablations (the ICL score)",
)
HELD_OUT_UNIT = "tasks in held-out templates"  # what `held_out_note` calls the held-out families

T = TypeVar("T")


@dataclass(kw_only=True)
class QueryEffects:
    """Per-prompt effects on the queries of one group of tasks (discovery or held-out, in their
    templates), each [set, batch] with the class first and its random sets after; signed as
    `circuits.evidence.EFFECT_SIGN`."""

    patched: Tensor  # p(answer) gained on shuffled-label prompts, FV heads patched together
    single_heads: Tensor  # the same, each FV head alone [head, batch]
    zero_shot: Tensor  # accuracy of the zero-shot prompts: [plain, + FV, + random vectors ..., batch]
    few_shot: Tensor  # few-shot accuracy of the clean prompts [batch]
    ablation_drops: list[Tensor]  # per class: few-shot accuracy, clean - ablated [set, batch]


def _query_effects(
    model: interp.HookedTransformer,
    prompts: TaskPrompts,
    means: HeadMeans,
    classes: Sequence[HeadClass],
    fv_layer: int,
) -> QueryEffects:
    """Every effect on `prompts` (queries) with the heads' mean outputs `means` of the same groups'
    demonstrations (a task in one template); `classes[0]` is the FV heads."""
    fv = classes[0]
    patched = head_indirect_effects(model, prompts, means, [[head] for head in fv.heads] + fv.sets)
    vectors = [function_vector(means, heads) for heads in fv.sets]
    zero_shot = zero_shot_accuracy(model, prompts, [(fv_layer, None), *((fv_layer, v) for v in vectors)])
    few_shot, ablated = few_shot_accuracy(
        model, prompts, [heads for found in classes for heads in found.sets]
    )
    drops, at = [], 0
    for found in classes:
        drops.append(few_shot - ablated[at : at + len(found.sets)])
        at += len(found.sets)
    return QueryEffects(
        patched=patched[len(fv.heads) :],
        single_heads=patched[: len(fv.heads)],
        zero_shot=zero_shot,
        few_shot=few_shot,
        ablation_drops=drops,
    )


def function_vector_stages(find_induction_heads: bool) -> list[str]:
    """The stages `function_vector_report` reports and keeps (`StageResults`), in order; the first only
    when it finds the induction heads (`induction_heads=None`)."""
    return ([INDUCTION_HEADS_STAGE] if find_induction_heads else []) + list(FV_STAGES)


def fv_stage_notes(stage: str, value: Any) -> list[str]:
    """A line on a finished stage of `function_vector_report` (its kept `value`), for a partial result."""
    if stage == INDUCTION_HEADS_STAGE:
        return [f"Induction heads: {', '.join(head_labels(value)) or 'none'}."]
    if stage == FV_STAGES[0]:
        _, candidates, exact_aie = value
        order = exact_aie.argsort(descending=True)[:3].tolist()
        top = [f"{head_label(*candidates[i])} ({exact_aie[i]:+.3f})" for i in order]
        return [f"Top heads by exact AIE (p(answer)) of {len(candidates)} candidates: {', '.join(top)}."]
    if stage == FV_STAGES[1]:
        return [f"Zero-shot accuracy with the FV at each layer: {', '.join(f'{a:.2f}' for a in value)}."]
    if stage == FV_STAGES[2]:
        return [f"Effects measured on the {' and '.join(value)} queries."]
    _, ablated = value
    return [f"{len(ablated)} sets of heads ablated on the ICL score."]


@dataclass(frozen=True, kw_only=True)
class HeldOutRows:
    """The held-out tasks' queries (in every template) as the tests read them: `tested` [prompt], those
    in the held-out templates (the test); `strata`, the prompts of each template (`stratum_drops`'s
    kind: one of `TEMPLATE_KINDS`)."""

    tested: Tensor
    strata: list[tuple[str, str, Tensor]]


def held_out_rows(prompts: TaskPrompts, template_split: FamilySplit) -> HeldOutRows:
    """`HeldOutRows` of the held-out tasks' `prompts`, by the templates' `template_split`."""
    templates = prompts.prompt_templates()
    heldout = set(template_split.heldout)
    strata = [
        (TEMPLATE_KINDS[0] if name in heldout else TEMPLATE_KINDS[1], name, members)
        for _, name, members in label_strata("template", templates)
    ]
    return HeldOutRows(tested=torch.tensor([name in heldout for name in templates]), strata=strata)


def _compare(
    name: str,
    unit: str,
    found: HeadClass,
    discovery: Tensor | None,
    heldout: Tensor,
    seed: int,
    rows: HeldOutRows | None = None,
) -> Comparison:
    """A class's effects [1 + draws, prompt] (the class first) on the discovery and the held-out
    families, judged by `circuits.evidence.judge_class`: of `heldout`, the `rows.tested` prompts test
    and `rows.strata` divide them per template (None: every prompt tests, no strata)."""
    verdict = judge_class(  # template-dependent: pooled above 0, but not each held-out template's CI
        found, heldout, discovery=discovery, seed=seed, unit=HELD_OUT_UNIT,
        strata=() if rows is None else rows.strata, tested=None if rows is None else rows.tested,
        by_ci=TEMPLATE_KINDS, dependent_kinds={TEMPLATE_KINDS[0]: "all"},
    )  # fmt: skip
    note, dependent = verdict.note, f"{TEMPLATE_KINDS[0]}-dependent"
    if verdict.verdict == dependent:
        failing = [s.name for s in verdict.strata if s.kind == TEMPLATE_KINDS[0] and s.holds is False]
        note += f"; does not hold in the held-out template(s) {', '.join(failing)} alone"
    return Comparison(
        name=name,
        unit=unit,
        heads=verdict.heads,
        random_sets=verdict.random_sets,
        random_values=verdict.random_effects,
        discovery=verdict.discovery,
        heldout=verdict.heldout,
        strata=verdict.strata,
        verdict="template-dependent"
        if verdict.verdict == f"{TEMPLATE_KINDS[0]}-dependent"
        else verdict.verdict,
        note=note,
    )


@dataclass(frozen=True, kw_only=True)
class FunctionVectorSettings:
    """The tasks and sizes of `function_vector_report`.

    tasks: word-pair tasks of `interp.tasks.icl_tasks.ICL_TASKS`, the families.
    heldout_tasks: the tasks that test (default: half of `tasks`, drawn with `seed`); the others choose
      the heads and the layer.
    templates: prompt templates of `interp.tasks.icl_tasks.ICL_TEMPLATES`, the second family axis (a
      few-shot prompt and its zero-shot prompt share one).
    heldout_templates: the templates that test (default: half of `templates`, drawn with `seed`); the
      discovery tasks in the others choose the heads and the layer, and the held-out tasks in these test.
    n_prompts: few-shot prompts per task, template and half of its pairs, of `n_shots` examples each.
    top: FV heads: the largest exact AIEs among the candidates (mean over discovery tasks).
    candidates: the heads whose AIE is computed exactly on the discovery tasks: the largest attributed
      AIEs (None, or as many as the model has: every head, one patched run each).
    n_random: random same-layer sets each class is compared with.
    n_documents: Brown corpus documents the ICL score is measured on (for the ablations).
    seed: the split, the prompts, the random sets and the bootstrap.
    """

    tasks: Sequence[str] = tuple(ICL_TASKS)
    heldout_tasks: Sequence[str] | None = None
    templates: Sequence[str] = tuple(ICL_TEMPLATES)
    heldout_templates: Sequence[str] | None = None
    n_prompts: int = 8
    n_shots: int = 5
    top: int = 10
    candidates: int | None = 30
    n_random: int = 4
    n_documents: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        for name, least in [
            ("n_prompts", 2),
            ("n_shots", 2),
            ("top", 1),
            ("n_random", 1),
            ("n_documents", 4),
        ]:
            check_count(getattr(self, name), name, least)
        if self.candidates is not None:
            if isinstance(self.candidates, int) and self.candidates < self.top:
                raise ValueError(
                    f"--candidates {self.candidates} must be at least --fv-heads {self.top} (the candidates "
                    "the top heads are chosen from)."
                )
            check_count(self.candidates, "candidates", self.top)
        self.family_split()  # the task and template names and splits, before any model loads
        self.template_split()

    @property
    def task_names(self) -> list[str]:
        """The tasks, checked against ICL_TASKS, in order."""
        return check_task_names(list(self.tasks))

    @property
    def template_names(self) -> list[str]:
        """The templates, checked against ICL_TEMPLATES, in order."""
        return check_template_names(list(self.templates))

    def family_split(self) -> FamilySplit:
        """Which tasks choose (discovery) and which test (held-out): `split_families`."""
        return split_families(self.task_names, self.heldout_tasks, seed=self.seed)

    def template_split(self) -> FamilySplit:
        """Which templates choose (discovery) and which test (held-out): `split_families`."""
        named = self.heldout_templates
        heldout = None if named is None else check_template_names(list(named))
        return split_families(self.template_names, heldout, seed=self.seed)


@dataclass(frozen=True, kw_only=True)
class TaskFamilies:
    """Step 1: the tasks split, the templates split, and each task's single-token pairs halved
    (`split_pairs`) into a demonstration half (0) and a query half (1)."""

    tasks: list[str]
    split: FamilySplit
    templates: list[str]
    template_split: FamilySplit
    halves: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]]
    n_pairs: dict[str, int]  # each task's single-token pairs

    def prompts(
        self, model: interp.HookedTransformer, half: int, settings: FunctionVectorSettings
    ) -> dict[str, TaskPrompts]:
        """The few-shot prompts of `half` of the tasks' pairs: "discovery", the discovery tasks' in the
        discovery templates; "heldout", the held-out tasks' in every template (the held-out templates
        test; the discovery ones show the held-out tasks held out by task only)."""
        templates = {"discovery": self.template_split.discovery, "heldout": tuple(self.templates)}
        return {
            group: task_prompts(
                model,
                {name: self.halves[name][half] for name in getattr(self.split, group)},
                settings.n_prompts,
                settings.n_shots,
                settings.seed + half,
                templates[group],
            )
            for group in ("discovery", "heldout")
        }


@dataclass(frozen=True, kw_only=True)
class HeadChoice:
    """Step 2, on the discovery tasks' demonstrations: AIE attributed per task [task, layer, head], the
    candidates and their exact AIE [candidate] (mean over tasks), the FV heads: the top by exact AIE."""

    aie_per_task: Tensor
    candidates: list[Head]
    candidates_aie: Tensor
    fv_heads: list[Head]

    @property
    def aie(self) -> Tensor:
        """AIE attributed [layer, head], mean over the discovery tasks."""
        return self.aie_per_task.mean(0)


def _accuracies(measured: QueryEffects, rows: Tensor, seed: int) -> dict[str, Any]:
    """Few-shot and zero-shot accuracy (without, with the FV, with random vectors) of the prompts
    `rows` [batch] bool, with 95% CIs: the fields `TaskVector` and `TemplateVector` share."""
    runs = measured.zero_shot[:, rows]
    return {
        "few_shot": measured.few_shot[rows].mean().item(),
        "zero_shot": runs[0].mean().item(),
        "zero_shot_ci": mean_ci(runs[0], seed),
        "with_fv": runs[1].mean().item(),
        "with_fv_ci": mean_ci(runs[1], seed),
        "with_random": runs[2:].mean().item(),
        "with_random_ci": mean_ci(runs[2:].mean(0), seed),
    }


def _task_vectors(
    families: TaskFamilies,
    queries: dict[str, TaskPrompts],
    effects: dict[str, QueryEffects],
    rows: HeldOutRows,
    seed: int,
) -> list[TaskVector]:
    """One row per task, the discovery tasks first: zero-shot accuracy without, with the FV, with
    random vectors, on its queries in the templates that test it (a discovery task's: the discovery
    templates; a held-out task's: the held-out templates)."""
    every = torch.ones(len(queries["discovery"].answers), dtype=torch.bool)
    tested = {"discovery": every, "heldout": rows.tested}
    vectors = []
    for group, family in (("discovery", "discovery"), ("heldout", "held-out")):
        prompts = queries[group]
        for index, task in enumerate(getattr(families.split, group)):
            vectors.append(
                TaskVector(
                    task=task,
                    description=ICL_TASKS[task].description,
                    family=family,
                    n_pairs=families.n_pairs[task],
                    **_accuracies(effects[group], (prompts.task_index == index) & tested[group], seed),
                )
            )
    return vectors


def _template_vectors(heldout: QueryEffects, rows: HeldOutRows, seed: int) -> list[TemplateVector]:
    """One row per template: the held-out tasks' queries in it, pooled over the tasks."""
    return [
        TemplateVector(
            template=name,
            family="held-out" if kind == TEMPLATE_KINDS[0] else "discovery",
            n_prompts=int(members.sum()),
            **_accuracies(heldout, members, seed),
        )
        for kind, name, members in rows.strata
    ]


def task_families(model: interp.HookedTransformer, settings: FunctionVectorSettings) -> TaskFamilies:
    """Step 1: the tasks split, the templates split, each task's pairs halved; refused where a half has
    too few pairs."""
    tasks, split = settings.task_names, settings.family_split()
    templates, template_split = settings.template_names, settings.template_split()
    pairs = {name: single_token_pairs(model, ICL_TASKS[name]) for name in tasks}
    halves = {name: split_pairs(task_pairs, settings.seed) for name, task_pairs in pairs.items()}
    for name, (_, query_pairs) in halves.items():
        if len(query_pairs) <= settings.n_shots:
            raise ValueError(
                f"task {name} has {len(pairs[name])} pairs with single-token answers for this tokenizer, "
                f"too few for {settings.n_shots} shots in each half; pass a smaller n_shots"
            )
    n_pairs = {name: len(task_pairs) for name, task_pairs in pairs.items()}
    return TaskFamilies(
        tasks=tasks, split=split, templates=templates, template_split=template_split, halves=halves,
        n_pairs=n_pairs,
    )  # fmt: skip


def attributed_candidates(
    model: interp.HookedTransformer,
    discovery: TaskPrompts,
    means: HeadMeans,
    n_tasks: int,
    candidates: int | None,
) -> tuple[Tensor, list[Head]]:
    """Step 2a: (AIE attributed per task [task, layer, head], the `candidates` heads of the largest mean
    over tasks) on the `n_tasks` discovery tasks' demonstrations (in the discovery templates)."""
    cfg = model.cfg
    attributed = attributed_indirect_effects(model, discovery, means)  # [batch, layer, head]
    one_hot = torch.nn.functional.one_hot(discovery.task_index, n_tasks).float()  # [batch, task]
    aie_per_task = torch.einsum("bt,blh->tlh", one_hot, attributed) / one_hot.sum(0)[:, None, None]
    n_heads = cfg.n_layers * cfg.n_heads
    ranked = aie_per_task.mean(0).flatten().argsort(descending=True)
    ranked = ranked[: n_heads if candidates is None else candidates].tolist()
    return aie_per_task, [(index // cfg.n_heads, index % cfg.n_heads) for index in ranked]


def exact_aie(
    model: interp.HookedTransformer,
    discovery: TaskPrompts,
    means: HeadMeans,
    candidates: Sequence[Head],
    n_tasks: int,
    progress: Progress | None,
) -> Tensor:
    """Step 2b: each candidate's exact AIE on the `n_tasks` discovery tasks' demonstrations (in the
    discovery templates), mean over tasks [candidate]."""
    one_hot = torch.nn.functional.one_hot(discovery.task_index, n_tasks).float()  # [batch, task]
    exact = head_indirect_effects(model, discovery, means, [[head] for head in candidates], progress)
    return ((exact @ one_hot) / one_hot.sum(0)).mean(1)  # exact: [candidate, batch]


def choose_fv_heads(
    aie_per_task: Tensor, candidates: list[Head], candidates_aie: Tensor, top: int
) -> HeadChoice:
    """Step 2c: the FV heads, the `top` candidates by exact AIE."""
    fv_heads = [candidates[i] for i in candidates_aie.argsort(descending=True).tolist()[:top]]
    return HeadChoice(
        aie_per_task=aie_per_task, candidates=candidates, candidates_aie=candidates_aie, fv_heads=fv_heads
    )


def layer_accuracies(
    model: interp.HookedTransformer, queries: TaskPrompts, means: HeadMeans, fv_heads: Sequence[Head]
) -> Tensor:
    """Step 3: zero-shot accuracy of the discovery tasks' queries in the discovery templates with the
    function vector added at each layer [layer]; the FV's layer is the most accurate."""
    vectors = function_vector(means, fv_heads)  # [group, d_model]
    runs = [(layer, vectors) for layer in range(model.cfg.n_layers)]
    return zero_shot_accuracy(model, queries, runs).mean(1)


def head_classes(
    model: interp.HookedTransformer,
    fv_heads: list[Head],
    induction_heads: Sequence[Head],
    settings: FunctionVectorSettings,
) -> list[HeadClass]:
    """The FV heads, then the induction heads (if any), each with its random same-layer sets."""
    names = {"FV heads": fv_heads} | ({"induction heads": list(induction_heads)} if induction_heads else {})
    return [head_class(model, name, heads, settings.n_random, settings.seed) for name, heads in names.items()]


def query_effects(
    model: interp.HookedTransformer,
    queries: dict[str, TaskPrompts],
    means: dict[str, HeadMeans],
    classes: Sequence[HeadClass],
    layer: int,
) -> dict[str, QueryEffects]:
    """Step 4a: every effect on the discovery tasks' queries in the discovery templates and, apart, on
    the held-out tasks' in every template ("discovery", "heldout" -> `QueryEffects`), the function
    vector added at `layer`."""
    return {group: _query_effects(model, queries[group], means[group], classes, layer) for group in queries}


def effect_tests(
    classes: Sequence[HeadClass], effects: dict[str, QueryEffects], rows: HeldOutRows, seed: int
) -> tuple[Comparison, Comparison]:
    """Step 4b: the FV heads' AIE and the function vector's zero-shot gain, each against random
    same-layer heads: on the held-out tasks in the held-out templates (`rows`), beside discovery and
    per template."""
    chosen, tested = effects["discovery"], effects["heldout"]
    aie_test = _compare("FV heads: AIE", "p(answer)", classes[0], chosen.patched, tested.patched, seed, rows)
    vector_test = _compare(
        "Function vector: zero-shot accuracy gained", "accuracy", classes[0],
        chosen.zero_shot[1:] - chosen.zero_shot[0], tested.zero_shot[1:] - tested.zero_shot[0], seed, rows,
    )  # fmt: skip
    return aie_test, vector_test


def icl_scores(
    model: interp.HookedTransformer, classes: Sequence[HeadClass], settings: FunctionVectorSettings
) -> tuple[Tensor, Tensor]:
    """Step 5a: the ICL score of each Brown corpus document that no choice saw, clean [document] and
    with each class and random set ablated [set, document]."""
    sequences = default_sequences(model, settings.n_documents, settings.seed)
    head_sets = [heads for found in classes for heads in found.sets]
    _, clean, ablated = ablated_icl_scores(
        model, sequences.tokens, sequences.windows, head_sets, seed=settings.seed
    )
    return clean, ablated


def ablation_tests(
    classes: Sequence[HeadClass],
    effects: dict[str, QueryEffects],
    rows: HeldOutRows,
    scores: tuple[Tensor, Tensor],
    seed: int,
) -> list[Comparison]:
    """Step 5b: each class ablated against its random sets: few-shot accuracy (the discovery and
    held-out queries' drops, `effects`; the held-out tasks in the held-out templates test, `rows`) and
    the ICL score (`icl_scores`)."""
    chosen, tested = effects["discovery"], effects["heldout"]
    clean_icl, ablated_icl = scores
    ablations, at = [], 0
    for i, found in enumerate(classes):
        context_drop = ablated_icl[at : at + len(found.sets)] - clean_icl  # -score: the context's benefit
        at += len(found.sets)
        ablations += [
            _compare(f"{found.name} ablated: few-shot accuracy", "accuracy", found,
                     chosen.ablation_drops[i], tested.ablation_drops[i], seed, rows),
            _compare(f"{found.name} ablated: ICL score", "nats", found, None, context_drop, seed),
        ]  # fmt: skip
    return ablations


def function_vector_report(
    model: interp.HookedTransformer,
    settings: FunctionVectorSettings = FunctionVectorSettings(),
    *,
    induction_heads: Sequence[Head] | None = None,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> FunctionVectorResult:
    """Function-vector heads of `model` beside its induction heads, on the tasks and with the sizes of
    `settings` (the steps: the module docstring). induction_heads: default
    `confirmed_induction_heads(model)` (cached); () skips that class. stages: each stage's result
    (`function_vector_stages`) kept as it finishes; the stages already in it (a resumed run's, made
    with the same settings) are not run again."""
    began, seed = time.perf_counter(), settings.seed
    stages = StageResults() if stages is None else stages
    families = task_families(model, settings)  # 1. families
    induction_heads, found_by = induction_heads_or_confirmed(model, induction_heads, stages, progress)
    timings = {"induction heads": time.perf_counter() - began}

    def timed(name: str) -> None:
        timings[name] = time.perf_counter() - began - sum(timings.values())

    def step(stage: str, compute: Callable[[Progress | None], T]) -> T:
        """compute(the stage's progress), reported as `stage` as it begins, or the stage's kept value."""

        def begun() -> T:
            if progress is not None:
                progress(stage, 0, 1)
            return compute(as_stage(progress, stage))

        return stages.run(stage, begun, progress)

    demonstrations, queries = families.prompts(model, 0, settings), families.prompts(model, 1, settings)
    means = {group: mean_head_outputs(model, prompts) for group, prompts in demonstrations.items()}
    discovery, n_discovery = demonstrations["discovery"], len(families.split.discovery)

    def head_effects(heads_progress: Progress | None) -> tuple[Tensor, list[Head], Tensor]:
        """Steps 2a and 2b: AIE attributed per task, the candidates, their exact AIE."""
        aie_per_task, candidates = attributed_candidates(
            model, discovery, means["discovery"], n_discovery, settings.candidates
        )
        exact = exact_aie(model, discovery, means["discovery"], candidates, n_discovery, heads_progress)
        return aie_per_task, candidates, exact

    chosen_heads = choose_fv_heads(*step(FV_STAGES[0], head_effects), settings.top)  # 2. heads
    timed("AIE")
    layer_accuracy = step(  # 3. layer
        FV_STAGES[1],
        lambda _: layer_accuracies(model, queries["discovery"], means["discovery"], chosen_heads.fv_heads),
    )
    layer = int(layer_accuracy.argmax())
    timed("layer")
    classes = head_classes(model, chosen_heads.fv_heads, induction_heads, settings)  # 4. effects
    effects = step(FV_STAGES[2], lambda _: query_effects(model, queries, means, classes, layer))
    timed("effects")
    rows = held_out_rows(queries["heldout"], families.template_split)
    aie_test, vector_test = effect_tests(classes, effects, rows, seed)
    scores = step(FV_STAGES[3], lambda _: icl_scores(model, classes, settings))  # 5. the ICL score
    ablations = ablation_tests(classes, effects, rows, scores, seed)
    task_vectors = _task_vectors(families, queries, effects, rows, seed)
    timed("ICL score")
    if progress is not None:
        progress(FV_STAGES[3], 1, 1)
    timings["total"] = time.perf_counter() - began
    fv_labels, induction_labels = head_labels(chosen_heads.fv_heads), head_labels(induction_heads)
    return FunctionVectorResult(
        model_name=model.cfg.model_name,
        provenance=interp.provenance(model),
        written=head_contribution_linearisation(model.cfg),
        tasks=families.tasks,
        split=families.split,
        templates=families.templates,
        template_split=families.template_split,
        n_shots=settings.n_shots,
        n_prompts=settings.n_prompts,
        seed=seed,
        aie_attributed=chosen_heads.aie,
        aie_per_task=chosen_heads.aie_per_task,
        candidates=head_labels(chosen_heads.candidates),
        candidates_aie=chosen_heads.candidates_aie.tolist(),
        fv_heads=fv_labels,
        fv_heads_heldout_aie=effects["heldout"].single_heads[:, rows.tested].mean(1).tolist(),
        induction_heads=induction_labels,
        induction_found_by=found_by,
        overlap=[label for label in fv_labels if label in induction_labels],
        fv_layer=layer,
        layer_accuracy=layer_accuracy.tolist(),
        aie_test=aie_test,
        vector_test=vector_test,
        task_vectors=task_vectors,
        template_vectors=_template_vectors(effects["heldout"], rows, seed),
        ablations=ablations,
        n_documents=settings.n_documents,
        timings=timings,
    )
