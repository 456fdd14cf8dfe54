"""`function_vector_report`: function-vector heads (Todd et al. 2024) and their function vector, chosen on
discovery word-pair tasks in discovery templates and tested on held-out tasks in held-out templates; the
FV and the induction heads ablated (few-shot accuracy, the ICL score: Yin & Steinhardt 2025); each class
against random same-layer heads (`circuits.evidence.judge_class`). The steps:

  1. families   tasks and templates split (`split_families`); each task's pairs halved into
                demonstrations (the heads' mean outputs) and queries (where effects are measured)
  2. heads      AIE on the discovery demonstrations: attributed for every head, exact for the
                candidates; the FV heads are the top by exact AIE
  3. layer      where the vector most raises the discovery queries' zero-shot accuracy
  4. effects    on the discovery queries and the held-out tasks' queries in every template: the FV
                heads patched, the vector added, each class mean-ablated; tested on the held-out
                templates, beside discovery and per template (a discovery template: held out by task only)
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
    ClassVerdict,
    FamilySplit,
    HeadClass,
    Strata,
    head_class,
    head_labels,
    held_out_unit,
    judge_class,
    kept,
    label_strata,
    mean_ci,
    split_families,
    unclaimed_heads,
)
from circuits.finding import Finding
from circuits.heads.cache import INDUCTION_HEADS_STAGE, induction_heads_or_confirmed
from circuits.icl.function_vectors import (
    GRADIENT_PROMPTS,
    HeadMeans,
    TaskPrompts,
    attributed_indirect_effects,
    few_shot_accuracy,
    function_vector,
    head_indirect_effects,
    mean_head_outputs,
    n_length_batches,
    task_prompts,
    zero_shot_accuracy,
)
from circuits.icl.heads import ablated_icl_scores, ranked_heads
from circuits.icl.results import (
    AIE_TEST,
    TEMPLATE_KINDS,
    VECTOR_TEST,
    FunctionVectorFigures,
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
from interp.types import Head, Progress, as_stage, counted, head_label

FV_STAGES = (  # the stages function_vector_report reports and keeps, after the induction heads
    "AIE of every head (discovery tasks and templates)",
    "FV added at each layer (discovery tasks and templates, zero-shot prompts)",
    "Effects on discovery tasks and held-out tasks in every template (AIE, function vectors, ablations)",
    "Ablations (the ICL score)",
)
MEANS_STAGE = "Mean head outputs of the demonstrations"  # before the AIE; not kept (a run per group)
# (the held-out tasks' prompts that test [prompt] bool, each template's (kind, name, members), each
# prompt's task [prompt])
TemplateRows = tuple[Tensor, list[tuple[str, str, Tensor]], list[str]]
T = TypeVar("T")


@dataclass(kw_only=True)
class QueryEffects:
    """Per-prompt effects on the queries of one group of tasks, signed as `circuits.evidence.EFFECT_SIGN`;
    rows [set, batch] hold the class first, then its random sets."""

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
    progress: Progress | None = None,
) -> QueryEffects:
    """Every effect on the queries `prompts`, with `means` from the same groups' demonstrations;
    `classes[0]` is the FV heads. progress(stage, done, total): the runs made (`_effect_run_counts`)."""
    fv = classes[0]
    n_patched, n_vectors, n_ablated = _effect_run_counts(classes, len(prompts.clean))

    def part(offset: int) -> Progress | None:
        return as_stage(progress, FV_STAGES[2], offset, n_patched + n_vectors + n_ablated)

    head_sets = [[head] for head in fv.heads] + fv.sets
    patched = head_indirect_effects(model, prompts, means, head_sets, part(0))
    vectors = [function_vector(means, heads) for heads in fv.sets]
    additions = [(fv_layer, None), *((fv_layer, v) for v in vectors)]
    zero_shot = zero_shot_accuracy(model, prompts, additions, part(n_patched))
    few_shot, ablated = few_shot_accuracy(
        model, prompts, [heads for found in classes for heads in found.sets], part(n_patched + n_vectors)
    )
    drops = [few_shot - sets for sets in ablated.split([len(found.sets) for found in classes])]
    return QueryEffects(
        patched=patched[len(fv.heads) :],
        single_heads=patched[: len(fv.heads)],
        zero_shot=zero_shot,
        few_shot=few_shot,
        ablation_drops=drops,
    )


def _effects(
    model: interp.HookedTransformer,
    queries: dict[str, TaskPrompts],
    means: dict[str, HeadMeans],
    classes: Sequence[HeadClass],
    fv_layer: int,
    progress: Progress | None,
) -> dict[str, QueryEffects]:
    """Step 4: `_query_effects` of each group's queries (with its demonstrations' `means`), their runs
    counted together as `FV_STAGES[2]`."""
    runs = [sum(_effect_run_counts(classes, len(group.clean))) for group in queries.values()]
    return {
        group: _query_effects(model, group_queries, means[group], classes, fv_layer,
                              as_stage(progress, FV_STAGES[2], sum(runs[:i]), sum(runs)))
        for i, (group, group_queries) in enumerate(queries.items())
    }  # fmt: skip


def function_vector_stages(find_induction_heads: bool) -> list[str]:
    """The stages `function_vector_report` keeps, in order; the first only when it finds the induction
    heads (`induction_heads=None`)."""
    return ([INDUCTION_HEADS_STAGE] if find_induction_heads else []) + list(FV_STAGES)


def fv_stage_notes(stage: str, value: Any) -> list[str]:
    """A line on a finished stage (its kept `value`), for a partial result."""
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


def _template_rows(prompts: TaskPrompts, template_split: FamilySplit) -> TemplateRows:
    """Of the held-out tasks' queries in every template: those in the held-out templates (the test), each
    template's (kind one of `TEMPLATE_KINDS`) and each query's task (its family)."""
    templates, heldout = prompts.prompt_templates(), set(template_split.heldout)
    strata = [
        (TEMPLATE_KINDS[0] if name in heldout else TEMPLATE_KINDS[1], name, members)
        for _, name, members in label_strata("template", templates)
    ]
    tasks = [prompts.tasks[index] for index in prompts.task_index.tolist()]
    return torch.tensor([name in heldout for name in templates]), strata, tasks


def _compare(
    name: str, unit: str, found: HeadClass, discovery: Tensor | None, heldout: Tensor, seed: int,
    rows: TemplateRows | None = None,
) -> ClassVerdict:  # fmt: skip
    """A class's effects [1 + draws, prompt] (the class first) judged by `judge_class` as the test `name`
    in `unit` (details["unit"]): of `heldout`, the prompts `rows` marks test, its strata divide them per
    template, its tasks are their families (None: all test, no strata, each prompt its own family)."""
    tested, strata, tasks = (None, (), None) if rows is None else rows
    held = "tasks" if rows is None else held_out_unit(kept(tasks, tested), "task", "tasks")
    verdict = judge_class(  # template-dependent: pooled above 0, not in a held-out template, they differ
        found, heldout, discovery=discovery, seed=seed, unit=f"{held} in held-out templates", tested=tested,
        strata=Strata(strata, {TEMPLATE_KINDS[0]: "all"}, by_ci=TEMPLATE_KINDS, families=tasks),
    )  # fmt: skip
    verdict.name, verdict.details = name, {"unit": unit}
    if verdict.verdict == f"{TEMPLATE_KINDS[0]}-dependent":
        verdict.verdict = "template-dependent"
    return verdict


@dataclass(frozen=True, kw_only=True)
class FunctionVectorSettings:
    """The tasks and sizes of `function_vector_report`.

    tasks, templates: the word-pair tasks (`ICL_TASKS`) and prompt templates (`ICL_TEMPLATES`), the two
      family axes; heldout_tasks, heldout_templates: those that test (default: half, drawn with `seed`).
    n_prompts: few-shot prompts per task, template and half of its pairs, of `n_shots` examples each.
    top: FV heads, the largest exact AIEs among the `candidates` heads of largest attributed AIE (None:
      every head). n_random: random same-layer sets per class. n_documents: Brown texts of the ICL score.
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
        for name, least in {"n_prompts": 2, "n_shots": 2, "top": 1, "n_random": 1, "n_documents": 4}.items():
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
        return check_task_names(list(self.tasks))

    @property
    def template_names(self) -> list[str]:
        return check_template_names(list(self.templates))

    def family_split(self) -> FamilySplit:
        """Which tasks choose (discovery) and which test (held-out)."""
        return split_families(self.task_names, self.heldout_tasks, seed=self.seed)

    def template_split(self) -> FamilySplit:
        """Which templates choose (discovery) and which test (held-out)."""
        named = self.heldout_templates
        heldout = None if named is None else check_template_names(list(named))
        return split_families(self.template_names, heldout, seed=self.seed)


def _halved_pairs(model: interp.HookedTransformer, settings: FunctionVectorSettings):
    """Step 1: (each task's single-token pairs halved (`split_pairs`) into demonstrations and queries,
    their number per task); refused where a half has too few pairs."""
    pairs = {name: single_token_pairs(model, ICL_TASKS[name]) for name in settings.task_names}
    halves = {name: split_pairs(task_pairs, settings.seed) for name, task_pairs in pairs.items()}
    for name, (_, query_pairs) in halves.items():
        if len(query_pairs) <= settings.n_shots:
            raise ValueError(
                f"task {name} has {len(pairs[name])} pairs with single-token answers for this tokenizer, "
                f"too few for {settings.n_shots} shots in each half; pass a smaller n_shots"
            )
    return halves, {name: len(task_pairs) for name, task_pairs in pairs.items()}


def _head_aies(
    model: interp.HookedTransformer, discovery: TaskPrompts, means: HeadMeans, candidates: int | None,
    progress: Progress | None,
) -> tuple[Tensor, list[Head], Tensor]:  # fmt: skip
    """Step 2 on the discovery demonstrations: (AIE attributed per task [task, layer, head], the
    `candidates` heads of the largest mean over tasks, their exact AIE, mean over tasks [candidate])."""
    one_hot = torch.nn.functional.one_hot(discovery.task_index, len(discovery.tasks)).float()  # [batch, task]
    chunks = -(-len(discovery.answers) // GRADIENT_PROMPTS)  # progress: the gradient passes, then the runs
    every = model.cfg.n_layers * model.cfg.n_heads
    runs = 1 + (every if candidates is None else min(candidates, every))  # the candidates' and a base
    attributed = attributed_indirect_effects(
        model, discovery, means, as_stage(progress, "", 0, chunks + runs)
    )  # [batch, layer, head]
    aie_per_task = torch.einsum("bt,blh->tlh", one_hot, attributed) / one_hot.sum(0)[:, None, None]
    heads = ranked_heads(aie_per_task.mean(0))[:candidates]

    def after(stage: str, done: int, total: int) -> None:  # the runs, counted after the gradient passes
        progress(stage, chunks + done, chunks + total)

    exact = head_indirect_effects(
        model, discovery, means, [[head] for head in heads], None if progress is None else after
    )
    return aie_per_task, heads, ((exact @ one_hot) / one_hot.sum(0)).mean(1)  # exact: [candidate, batch]


def _tests(
    classes: Sequence[HeadClass],
    effects: dict[str, QueryEffects],
    rows: TemplateRows,
    icl: tuple[Tensor, Tensor],
    seed: int,
) -> list[ClassVerdict]:
    """Against random same-layer heads: the FV heads' AIE, the vector's zero-shot gain, then each class
    ablated on few-shot accuracy and on the ICL score (`icl`: clean [document], ablated [set, document])."""
    chosen, tested = effects["discovery"], effects["heldout"]
    fv, (clean_icl, ablated_icl) = classes[0], icl
    gained = [found.zero_shot[1:] - found.zero_shot[0] for found in (chosen, tested)]  # with - without
    tests = [
        _compare(AIE_TEST, "p(answer)", fv, chosen.patched, tested.patched, seed, rows),
        _compare(VECTOR_TEST, "accuracy", fv, *gained, seed, rows),
    ]
    per_class = ablated_icl.split([len(found.sets) for found in classes])
    for i, (found, ablated) in enumerate(zip(classes, per_class, strict=True)):
        context_drop = ablated - clean_icl  # -score: the context's benefit lost
        tests += [
            _compare(f"{found.name} ablated: few-shot accuracy", "accuracy", found,
                     chosen.ablation_drops[i], tested.ablation_drops[i], seed, rows),
            _compare(f"{found.name} ablated: ICL score", "nats", found, None, context_drop, seed),
        ]  # fmt: skip
    return tests


def _accuracies(measured: QueryEffects, rows: Tensor, seed: int) -> dict[str, Any]:
    """Few-shot and zero-shot accuracy (without, with the FV, with random vectors) of the prompts
    `rows` [batch] bool, with 95% CIs: `QueryAccuracy`'s fields."""
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
    split: FamilySplit, n_pairs: dict[str, int], queries: dict[str, TaskPrompts],
    effects: dict[str, QueryEffects], tested: Tensor, seed: int,
) -> list[TaskVector]:  # fmt: skip
    """Per task, the discovery ones first: its queries in the templates that test it (a discovery
    task's: the discovery templates; a held-out task's: the held-out ones, `tested`)."""
    tested = {"discovery": torch.ones(len(queries["discovery"].answers), dtype=torch.bool), "heldout": tested}
    return [
        TaskVector(
            task=task, description=ICL_TASKS[task].description, family=family, n_pairs=n_pairs[task],
            **_accuracies(effects[group], (queries[group].task_index == index) & tested[group], seed),
        )
        for group, family in (("discovery", "discovery"), ("heldout", "held-out"))
        for index, task in enumerate(getattr(split, group))
    ]  # fmt: skip


def _template_vectors(
    heldout: QueryEffects, strata: list[tuple[str, str, Tensor]], seed: int
) -> list[TemplateVector]:
    """Per template, the held-out tasks' queries in it."""
    return [
        TemplateVector(
            template=name, family="held-out" if kind == TEMPLATE_KINDS[0] else "discovery",
            n_prompts=int(members.sum()), **_accuracies(heldout, members, seed),
        )
        for kind, name, members in strata
    ]  # fmt: skip


def _prompts(
    model: interp.HookedTransformer, settings: FunctionVectorSettings, halves: dict, half: int
) -> dict[str, TaskPrompts]:
    """Prompts of `half` of the pairs (`halves`): the discovery tasks' in the discovery templates, the
    held-out tasks' in every template."""
    split, template_split = settings.family_split(), settings.template_split()
    templates = {"discovery": template_split.discovery, "heldout": tuple(settings.template_names)}
    return {
        group: task_prompts(model, {name: halves[name][half] for name in getattr(split, group)},
                            settings.n_prompts, settings.n_shots, settings.seed + half, templates[group])
        for group in ("discovery", "heldout")
    }  # fmt: skip


def _effect_run_counts(classes: Sequence[HeadClass], n_prompts: int) -> tuple[int, int, int]:
    """The runs `_query_effects` makes on a group of `n_prompts` queries: the FV heads patched (each,
    each set, and the unpatched run), their vectors added (and none), the few-shot prompts with each set
    ablated (and none) in each batch of `few_shot_accuracy`."""
    fv, batches = classes[0], n_length_batches(n_prompts)
    ablated = (sum(len(found.sets) for found in classes) + 1) * batches
    return len(fv.heads) + len(fv.sets) + 1, len(fv.sets) + 1, ablated


def _brown_icl_scores(
    model: interp.HookedTransformer,
    classes: Sequence[HeadClass],
    settings: FunctionVectorSettings,
    progress: Progress | None = None,
) -> tuple[Tensor, Tensor]:
    """Step 5: the ICL score of Brown corpus texts no choice saw, clean [document] and with each class
    and random set ablated [set, document] (each set's run a unit of `progress`)."""
    sequences = default_sequences(model, settings.n_documents, settings.seed)
    head_sets = [heads for found in classes for heads in found.sets]
    return ablated_icl_scores(  # without the clean run's per-token losses
        model, sequences.tokens, sequences.windows, head_sets, seed=settings.seed, progress=progress
    )[1:]


def function_vector_report(
    model: interp.HookedTransformer,
    settings: FunctionVectorSettings = FunctionVectorSettings(),
    *,
    induction_heads: Sequence[Head] | None = None,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> Finding:
    """Function-vector heads of `model` beside its induction heads, as the Finding "fv" (see the module
    docstring). induction_heads: default `confirmed_induction_heads(model)` (cached); () skips that
    class. stages: finished stages kept; those already there are not run again."""
    began, seed = time.perf_counter(), settings.seed
    stages = StageResults() if stages is None else stages
    split, template_split = settings.family_split(), settings.template_split()  # 1. families
    halves, n_pairs = _halved_pairs(model, settings)
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

    demonstrations, queries = (_prompts(model, settings, halves, half) for half in (0, 1))
    means = {
        group: mean_head_outputs(model, group_prompts)
        for group, group_prompts in counted(list(demonstrations.items()), progress, MEANS_STAGE)
    }
    aie_per_task, candidates, candidates_aie = step(  # 2. heads
        FV_STAGES[0],
        lambda heads_progress: _head_aies(
            model, demonstrations["discovery"], means["discovery"], settings.candidates, heads_progress
        ),
    )
    fv_heads = [candidates[i] for i in candidates_aie.argsort(descending=True).tolist()[: settings.top]]
    timed("AIE")
    vectors = function_vector(means["discovery"], fv_heads)  # 3. layer
    layer_accuracy = step(
        FV_STAGES[1],
        lambda _: zero_shot_accuracy(
            model, queries["discovery"], [(layer, vectors) for layer in range(model.cfg.n_layers)]
        ).mean(1),
    )
    layer = int(layer_accuracy.argmax())
    timed("layer")
    named = {"FV heads": fv_heads} | ({"induction heads": list(induction_heads)} if induction_heads else {})
    n_random, unclaimed = settings.n_random, unclaimed_heads(model, named.values())
    classes = [
        head_class(model, name, heads, n_random, seed, outside=unclaimed) for name, heads in named.items()
    ]
    # 4. effects
    effects = step(FV_STAGES[2], lambda said: _effects(model, queries, means, classes, layer, said))
    timed("effects")
    rows = _template_rows(queries["heldout"], template_split)
    icl = step(FV_STAGES[3], lambda said: _brown_icl_scores(model, classes, settings, said))  # 5. ICL score
    tests = _tests(classes, effects, rows, icl, seed)
    task_vectors = _task_vectors(split, n_pairs, queries, effects, rows[0], seed)
    timed("ICL score")
    timings["total"] = time.perf_counter() - began
    fv_labels, induction_labels = head_labels(fv_heads), head_labels(induction_heads)
    figures = FunctionVectorFigures(
        written=head_contribution_linearisation(model.cfg),
        aie_attributed=aie_per_task.mean(0),
        aie_per_task=aie_per_task,
        candidates=head_labels(candidates),
        candidates_aie=candidates_aie.tolist(),
        fv_heads=fv_labels,
        fv_heads_heldout_aie=effects["heldout"].single_heads[:, rows[0]].mean(1).tolist(),
        induction_heads=induction_labels,
        induction_found_by=found_by,
        overlap=[label for label in fv_labels if label in induction_labels],
        fv_layer=layer,
        layer_accuracy=layer_accuracy.tolist(),
        task_vectors=task_vectors,
        template_vectors=_template_vectors(effects["heldout"], rows[1], seed),
    )
    return Finding(
        analysis="fv",
        model=model.cfg.model_name,
        provenance=interp.provenance(model),
        settings=settings,
        chose={"tasks": list(split.discovery), "templates": list(template_split.discovery)},
        tested={"tasks": list(split.heldout), "templates": list(template_split.heldout)},
        classes=tests,
        timings=timings,
        extras=figures,
    )
