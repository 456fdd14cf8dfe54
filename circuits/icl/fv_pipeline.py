"""`function_vector_report`: function-vector heads (Todd et al. 2024) and their function vector, chosen on
discovery word-pair tasks and tested on held-out tasks, and both head classes, FV and induction,
ablated: which lowers few-shot accuracy and which the ICL score (Yin & Steinhardt 2025), each against
random same-layer heads (`circuits.evidence`).

The steps:
  1. families   the tasks split into discovery and held-out (`split_families`); each task's pairs
                halved into a demonstration half (few-shot prompts whose mean head outputs make the
                task's vector) and a query half (the prompts every effect is measured on)
  2. heads      AIE on the discovery tasks' demonstration prompts: attributed for every head, exact for
                the candidates; the FV heads are the top by exact AIE
  3. layer      the layer where the vector most raises zero-shot accuracy on the discovery tasks' queries
  4. effects    on the queries of the discovery tasks and, apart, of the held-out tasks: the FV heads
                patched together, the function vector, each class mean-ablated; each against random
                same-layer sets (`beyond_random`), the held-out figure reported beside the discovery one
  5. ICL score  each class mean-ablated on Brown corpus texts (never used for any choice)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import interp
from circuits.evidence import (
    beyond_random,
    head_labels,
    held_out_note,
    mean_ci,
    random_same_layer_sets,
    split_families,
)
from circuits.icl.function_vectors import (
    TaskPrompts,
    attributed_indirect_effects,
    few_shot_accuracy,
    function_vector,
    head_indirect_effects,
    mean_head_outputs,
    task_prompts,
    zero_shot_accuracy,
)
from circuits.icl.heads import INDUCTION_HEADS_STAGE, ablated_icl_scores, confirmed_induction_heads
from circuits.icl.results import Comparison, FunctionVectorResult, TaskVector
from circuits.icl.sequences import default_sequences
from circuits.stages import StageResults
from interp.checks import check_count, check_heads
from interp.tasks.icl_tasks import ICL_TASKS, check_task_names, single_token_pairs, split_pairs
from interp.types import Head, Progress, as_stage, head_label

FV_STAGES = (  # the stages function_vector_report reports and keeps, after the induction heads
    "AIE of every head (discovery tasks)",
    "FV added at each layer (discovery tasks' zero-shot prompts)",
    "Effects on discovery and held-out tasks (AIE, function vectors, ablations)",
    "Ablations (the ICL score)",
)


@dataclass(kw_only=True)
class HeadClass:
    """A class of heads and its random same-layer sets."""

    name: str  # "FV heads"
    heads: list[Head]
    draws: list[list[Head]]

    @property
    def sets(self) -> list[list[Head]]:
        """The class, then its random sets."""
        return [self.heads, *self.draws]


@dataclass(kw_only=True)
class QueryEffects:
    """Per-prompt effects on the queries of one group of tasks (discovery or held-out), each [set, batch]
    with the class first and its random sets after; signed as `circuits.evidence.EFFECT_SIGN`."""

    patched: Tensor  # p(answer) gained on shuffled-label prompts, FV heads patched together
    single_heads: Tensor  # the same, each FV head alone [head, batch]
    zero_shot: Tensor  # accuracy of the zero-shot prompts: [plain, + FV, + random vectors ..., batch]
    few_shot: Tensor  # few-shot accuracy of the clean prompts [batch]
    ablation_drops: list[Tensor]  # per class: few-shot accuracy, clean - ablated [set, batch]


def _query_effects(
    model: interp.HookedTransformer,
    prompts: TaskPrompts,
    means: Tensor,
    classes: Sequence[HeadClass],
    fv_layer: int,
) -> QueryEffects:
    """Every effect on `prompts` (queries) with the heads' mean outputs `means` [task, layer, head,
    d_head] of the same tasks' demonstrations; `classes[0]` is the FV heads."""
    fv = classes[0]
    patched = head_indirect_effects(model, prompts, means, [[head] for head in fv.heads] + fv.sets)
    vectors = [function_vector(model, means, heads) for heads in fv.sets]
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
        return [f"Effects measured on the {' and '.join(value)} tasks' queries."]
    _, ablated = value
    return [f"{len(ablated)} sets of heads ablated on the ICL score."]


def _compare(
    name: str, unit: str, found: HeadClass, discovery: Tensor | None, heldout: Tensor, seed: int
) -> Comparison:
    """A class's effects [1 + draws, prompt] (the class first) on discovery and held-out families."""
    tested = beyond_random(heldout[0], heldout[1:], seed)
    chosen = None if discovery is None else beyond_random(discovery[0], discovery[1:], seed)
    if chosen is None:
        note = "measured on held-out data only (none of it chose the heads)"
    else:
        note = held_out_note(chosen.beyond, tested.beyond, tested.beyond_ci)
    return Comparison(
        name=name,
        unit=unit,
        heads=head_labels(found.heads),
        random_sets=[head_labels(draw) for draw in found.draws],
        random_values=heldout[1:].mean(1).tolist(),
        discovery=chosen,
        heldout=tested,
        note=note,
    )


def _task_vectors(
    tasks: Sequence[str],
    family: str,
    prompts: TaskPrompts,
    effects: QueryEffects,
    n_pairs: dict[str, int],
    seed: int,
) -> list[TaskVector]:
    """One row per task of `prompts`: zero-shot accuracy without, with the FV, with random vectors."""
    rows = []
    for index, task in enumerate(tasks):
        runs = effects.zero_shot[:, prompts.task_index == index]
        rows.append(
            TaskVector(
                task=task,
                description=ICL_TASKS[task].description,
                family=family,
                n_pairs=n_pairs[task],
                few_shot=effects.few_shot[prompts.task_index == index].mean().item(),
                zero_shot=runs[0].mean().item(),
                zero_shot_ci=mean_ci(runs[0], seed),
                with_fv=runs[1].mean().item(),
                with_fv_ci=mean_ci(runs[1], seed),
                with_random=runs[2:].mean().item(),
                with_random_ci=mean_ci(runs[2:].mean(0), seed),
            )
        )
    return rows


def function_vector_report(
    model: interp.HookedTransformer,
    tasks: Sequence[str] = tuple(ICL_TASKS),
    *,
    heldout_tasks: Sequence[str] | None = None,
    n_prompts: int = 12,
    n_shots: int = 5,
    top: int = 10,
    candidates: int | None = 30,
    n_random: int = 4,
    n_documents: int = 8,
    induction_heads: Sequence[Head] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> FunctionVectorResult:
    """Function-vector heads of `model` beside its induction heads.

    tasks: word-pair tasks of `interp.tasks.icl_tasks.ICL_TASKS`, the families.
    heldout_tasks: the tasks that test (default: half of `tasks`, drawn with `seed`); the others choose
      the heads and the layer.
    n_prompts: few-shot prompts per task and half of its pairs, of `n_shots` examples each.
    candidates: the heads whose AIE is computed exactly on the discovery tasks: the largest attributed
      AIEs (None, or as many as the model has: every head, one patched run each).
    top: FV heads: the largest exact AIEs among the candidates (mean over discovery tasks).
    n_random: random same-layer sets each class is compared with.
    n_documents: Brown corpus documents the ICL score is measured on (for the ablations).
    induction_heads: default `confirmed_induction_heads(model)` (cached); () skips that class.
    stages: each stage's result (`function_vector_stages`) kept as it finishes; the stages already in
      it (a resumed run's, made with the same settings) are not run again.
    """
    began = time.perf_counter()
    tasks = check_task_names(list(tasks))
    for name, value, least in [("n_prompts", n_prompts, 2), ("n_shots", n_shots, 2), ("top", top, 1),
                               ("n_random", n_random, 1), ("n_documents", n_documents, 4)]:  # fmt: skip
        check_count(value, name, least)
    if candidates is not None:
        check_count(candidates, "candidates", top)
    # 1. families: discovery and held-out tasks; each task's demonstration and query halves
    split = split_families(tasks, heldout_tasks, seed=seed)
    pairs = {name: single_token_pairs(model, ICL_TASKS[name]) for name in tasks}
    halves = {name: split_pairs(task_pairs, seed) for name, task_pairs in pairs.items()}
    for name, (_, query_pairs) in halves.items():
        if len(query_pairs) <= n_shots:
            raise ValueError(
                f"task {name} has {len(pairs[name])} pairs with single-token answers for this tokenizer, "
                f"too few for {n_shots} shots in each half; pass a smaller n_shots"
            )
    stages = StageResults() if stages is None else stages
    found_by = "given"
    if induction_heads is None:
        induction_heads = stages.run(
            INDUCTION_HEADS_STAGE, lambda: confirmed_induction_heads(model, progress=progress), progress
        )
        induction_heads = [tuple(head) for head in induction_heads]
        found_by = "confirmed by interp heads"
    induction_heads = check_heads(model.cfg, induction_heads)
    timings = {"induction heads": time.perf_counter() - began}

    def timed(name: str) -> None:
        timings[name] = time.perf_counter() - began - sum(timings.values())

    def reported(stage: str) -> Progress | None:
        if progress is not None:
            progress(stage, 0, 1)
        return as_stage(progress, stage)

    def prompts_of(group: Sequence[str], half: int) -> TaskPrompts:
        chosen = {name: halves[name][half] for name in group}
        return task_prompts(model, chosen, n_prompts, n_shots, seed + half)

    cfg = model.cfg
    demonstrations = {group: prompts_of(names, 0) for group, names in vars(split).items()}
    queries = {group: prompts_of(names, 1) for group, names in vars(split).items()}
    means = {group: mean_head_outputs(model, prompts) for group, prompts in demonstrations.items()}

    # 2. heads, on the discovery tasks' demonstrations
    discovery, discovery_means = demonstrations["discovery"], means["discovery"]
    one_hot = torch.nn.functional.one_hot(discovery.task_index, len(split.discovery)).float()  # [batch, task]

    def head_effects() -> tuple[Tensor, list[Head], Tensor]:
        """AIE attributed per discovery task [task, layer, head], the candidates, their exact AIE."""
        step = reported(FV_STAGES[0])
        attributed = attributed_indirect_effects(model, discovery, discovery_means)  # [batch, layer, head]
        per_task = torch.einsum("bt,blh->tlh", one_hot, attributed) / one_hot.sum(0)[:, None, None]
        n_heads = cfg.n_layers * cfg.n_heads
        ranked = per_task.mean(0).flatten().argsort(descending=True)
        ranked = ranked[: n_heads if candidates is None else candidates].tolist()
        chosen = [(index // cfg.n_heads, index % cfg.n_heads) for index in ranked]
        exact = head_indirect_effects(model, discovery, discovery_means, [[head] for head in chosen], step)
        return per_task, chosen, ((exact @ one_hot) / one_hot.sum(0)).mean(1)  # exact: [candidate, batch]

    aie_per_task, candidate_heads, exact_aie = stages.run(FV_STAGES[0], head_effects, progress)
    aie = aie_per_task.mean(0)
    fv_heads = [candidate_heads[i] for i in exact_aie.argsort(descending=True).tolist()[:top]]
    timed("AIE")

    # 3. layer, on the discovery tasks' queries
    def layer_accuracies() -> Tensor:
        """Zero-shot accuracy of the discovery tasks' queries with the FV added at each layer [layer]."""
        reported(FV_STAGES[1])
        vectors = function_vector(model, discovery_means, fv_heads)  # [task, d_model]
        runs = [(layer, vectors) for layer in range(cfg.n_layers)]
        return zero_shot_accuracy(model, queries["discovery"], runs).mean(1)

    layer_accuracy = stages.run(FV_STAGES[1], layer_accuracies, progress)
    fv_layer = int(layer_accuracy.argmax())
    timed("layer")

    # 4. effects on the discovery tasks' queries and on the held-out tasks'
    classes = [
        HeadClass(
            name="FV heads", heads=fv_heads, draws=random_same_layer_sets(model, fv_heads, n_random, seed)
        )
    ]
    if induction_heads:
        draws = random_same_layer_sets(model, induction_heads, n_random, seed)
        classes.append(HeadClass(name="induction heads", heads=list(induction_heads), draws=draws))

    def query_effects() -> dict[str, QueryEffects]:
        reported(FV_STAGES[2])
        return {
            group: _query_effects(model, queries[group], means[group], classes, fv_layer) for group in queries
        }

    effects = stages.run(FV_STAGES[2], query_effects, progress)
    timed("effects")
    chosen, tested = effects["discovery"], effects["heldout"]
    fv = classes[0]
    aie_test = _compare("FV heads: AIE", "p(answer)", fv, chosen.patched, tested.patched, seed)
    vector_test = _compare(
        "Function vector: zero-shot accuracy gained", "accuracy", fv,
        chosen.zero_shot[1:] - chosen.zero_shot[0], tested.zero_shot[1:] - tested.zero_shot[0], seed,
    )  # fmt: skip

    # 5. the ICL score, on documents no choice saw
    def icl_scores() -> tuple[Tensor, Tensor]:
        """The ICL score of each document, clean [document] and with each set ablated [set, document]."""
        reported(FV_STAGES[3])
        sequences = default_sequences(model, n_documents, seed)
        head_sets = [heads for found in classes for heads in found.sets]
        _, clean, ablated = ablated_icl_scores(
            model, sequences.tokens, sequences.windows, head_sets, seed=seed
        )
        return clean, ablated

    clean_icl, ablated_icl = stages.run(FV_STAGES[3], icl_scores, progress)
    ablations, at = [], 0
    for i, found in enumerate(classes):
        context_drop = ablated_icl[at : at + len(found.sets)] - clean_icl  # -score: the context's benefit
        at += len(found.sets)
        ablations += [
            _compare(f"{found.name} ablated: few-shot accuracy", "accuracy", found,
                     chosen.ablation_drops[i], tested.ablation_drops[i], seed),
            _compare(f"{found.name} ablated: ICL score", "nats", found, None, context_drop, seed),
        ]  # fmt: skip

    n_pairs = {name: len(task_pairs) for name, task_pairs in pairs.items()}
    task_vectors = [
        *_task_vectors(split.discovery, "discovery", queries["discovery"], chosen, n_pairs, seed),
        *_task_vectors(split.heldout, "held-out", queries["heldout"], tested, n_pairs, seed),
    ]
    timed("ICL score")
    if progress is not None:
        progress(FV_STAGES[3], 1, 1)
    timings["total"] = time.perf_counter() - began
    fv_labels, induction_labels = head_labels(fv_heads), head_labels(induction_heads)
    return FunctionVectorResult(
        model_name=cfg.model_name,
        provenance=interp.provenance(model),
        tasks=tasks,
        split=split,
        n_shots=n_shots,
        n_prompts=n_prompts,
        seed=seed,
        aie_attributed=aie,
        aie_per_task=aie_per_task,
        candidates=head_labels(candidate_heads),
        candidates_aie=exact_aie.tolist(),
        fv_heads=fv_labels,
        fv_heads_heldout_aie=tested.single_heads.mean(1).tolist(),
        induction_heads=induction_labels,
        induction_found_by=found_by,
        overlap=[label for label in fv_labels if label in induction_labels],
        fv_layer=fv_layer,
        layer_accuracy=layer_accuracy.tolist(),
        aie_test=aie_test,
        vector_test=vector_test,
        task_vectors=task_vectors,
        ablations=ablations,
        n_documents=n_documents,
        timings=timings,
    )
