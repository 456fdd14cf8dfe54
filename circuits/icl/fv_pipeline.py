"""`function_vector_report`: function-vector heads (Todd et al. 2024) found by AIE on discovery pairs of
word-pair tasks, their function vectors tested on zero-shot prompts of held-out pairs, and both head
classes, FV and induction, ablated: which lowers few-shot accuracy and which the ICL score (Yin &
Steinhardt 2025), each against random same-layer heads."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

import interp
from circuits.evidence import head_labels, mean_ci, random_same_layer_sets
from circuits.icl.function_vectors import (
    attributed_indirect_effects,
    few_shot_accuracy,
    function_vector,
    head_indirect_effects,
    mean_head_outputs,
    task_prompts,
    zero_shot_accuracy,
)
from circuits.icl.heads import ablated_icl_scores, confirmed_induction_heads
from circuits.icl.results import Comparison, FunctionVectorResult, TaskVector
from circuits.icl.sequences import default_sequences
from interp.checks import check_count, check_heads
from interp.tasks.icl_tasks import ICL_TASKS, check_task_names, single_token_pairs, split_pairs
from interp.types import Head, Progress, as_stage


def compare(
    name: str,
    unit: str,
    heads: Sequence[Head],
    draws: Sequence[Sequence[Head]],
    expected: str,
    values: torch.Tensor,
    random_values: torch.Tensor,
    seed: int,
) -> Comparison:
    """A class's effect per prompt [n] against its random sets' [draw, n]."""
    difference = values - random_values.mean(0)
    ci = mean_ci(difference, seed)
    beyond = ci[0] > 0 if expected == "+" else ci[1] < 0
    return Comparison(
        name=name,
        unit=unit,
        heads=head_labels(heads),
        random_sets=[head_labels(draw) for draw in draws],
        expected=expected,
        value=values.mean().item(),
        value_ci=mean_ci(values, seed),
        random_values=random_values.mean(1).tolist(),
        difference=difference.mean().item(),
        difference_ci=ci,
        n=len(values),
        verdict="confirmed" if beyond else "unconfirmed",
    )


def function_vector_report(
    model: interp.HookedTransformer,
    tasks: Sequence[str] = tuple(ICL_TASKS),
    *,
    n_prompts: int = 12,
    n_shots: int = 5,
    top: int = 10,
    candidates: int | None = 30,
    n_random: int = 4,
    n_documents: int = 8,
    induction_heads: Sequence[Head] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> FunctionVectorResult:
    """Function-vector heads of `model` beside its induction heads.

    tasks: word-pair tasks of `interp.tasks.icl_tasks.ICL_TASKS`; each task's single-token pairs are
      split into discovery and held-out halves (`split_pairs`).
    n_prompts: few-shot prompts per task in each half, of `n_shots` examples each.
    candidates: the heads whose AIE is computed exactly on the discovery prompts: the largest
      attributed AIEs (None, or as many as the model has: every head, one patched run each).
    top: FV heads: the largest exact AIEs among the candidates (mean over tasks).
    n_random: random same-layer sets each class is compared with.
    n_documents: Brown corpus documents the ICL score is measured on (for the ablations).
    induction_heads: default `confirmed_induction_heads(model)` (cached); () skips that class.
    """
    began = time.perf_counter()
    tasks = check_task_names(list(tasks))
    for name, value, least in [("n_prompts", n_prompts, 2), ("n_shots", n_shots, 2), ("top", top, 1),
                               ("n_random", n_random, 1), ("n_documents", n_documents, 4)]:  # fmt: skip
        check_count(value, name, least)
    if candidates is not None:
        check_count(candidates, "candidates", top)
    pairs = {name: single_token_pairs(model, ICL_TASKS[name]) for name in tasks}
    halves = {name: split_pairs(task_pairs, seed) for name, task_pairs in pairs.items()}
    for name, (_, heldout_pairs) in halves.items():
        if len(heldout_pairs) <= n_shots:
            raise ValueError(
                f"task {name} has {len(pairs[name])} pairs with single-token answers for this tokenizer, "
                f"too few for {n_shots} shots in each half; pass a smaller n_shots"
            )
    found_by = "given"
    if induction_heads is None:
        induction_heads = confirmed_induction_heads(model, progress=progress)
        found_by = "confirmed by interp heads"
    induction_heads = check_heads(model.cfg, induction_heads)
    timings = {"induction heads": time.perf_counter() - began}

    def stage(name: str, step: str) -> None:
        timings[name] = time.perf_counter() - began - sum(timings.values())
        if progress is not None:
            progress(step, 0, 1)

    cfg = model.cfg
    discovery = task_prompts(
        model, {name: half[0] for name, half in halves.items()}, n_prompts, n_shots, seed
    )
    heldout = task_prompts(
        model, {name: half[1] for name, half in halves.items()}, n_prompts, n_shots, seed + 1
    )
    means = mean_head_outputs(model, discovery)  # [task, layer, head, d_head]
    attributed = attributed_indirect_effects(model, discovery, means)  # [batch, layer, head]
    one_hot = torch.nn.functional.one_hot(discovery.task_index, len(tasks)).float()  # [batch, task]
    aie_per_task = torch.einsum("bt,blh->tlh", one_hot, attributed) / one_hot.sum(0)[:, None, None]
    aie = aie_per_task.mean(0)
    n_heads = cfg.n_layers * cfg.n_heads
    ranked = aie.flatten().argsort(descending=True)[: n_heads if candidates is None else candidates].tolist()
    candidate_heads = [(index // cfg.n_heads, index % cfg.n_heads) for index in ranked]
    stage("attribution", "Exact AIE of the candidates (discovery prompts)")
    exact = head_indirect_effects(
        model, discovery, means, [[head] for head in candidate_heads], as_stage(progress, "Exact AIE")
    )  # [candidate, batch]
    exact_aie = ((exact @ one_hot) / one_hot.sum(0)).mean(1)  # mean over tasks
    order = exact_aie.argsort(descending=True).tolist()
    fv_heads = [candidate_heads[i] for i in order[:top]]
    vectors = function_vector(model, means, fv_heads)  # [task, d_model]

    stage("exact AIE", "FV added at each layer (discovery zero-shot prompts)")
    layer_accuracy = zero_shot_accuracy(model, discovery, [(layer, vectors) for layer in range(cfg.n_layers)])
    layer_accuracy = layer_accuracy.mean(1)
    fv_layer = int(layer_accuracy.argmax())

    stage("layer", "Held-out tests: AIE, function vectors")
    fv_draws = random_same_layer_sets(model, fv_heads, n_random, seed)
    heldout_effects = head_indirect_effects(
        model, heldout, means, [[head] for head in fv_heads] + [fv_heads, *fv_draws]
    )
    aie_test = compare(
        "FV heads: AIE on held-out prompts", "p(answer)", fv_heads, fv_draws, "+",
        heldout_effects[top], heldout_effects[top + 1 :], seed,
    )  # fmt: skip
    random_vectors = [function_vector(model, means, draw) for draw in fv_draws]
    additions = [(fv_layer, None), (fv_layer, vectors), *((fv_layer, vector) for vector in random_vectors)]
    accuracy = zero_shot_accuracy(model, heldout, additions)  # [run, batch]: none, FV, random ...
    vector_test = compare(
        "Function vector: zero-shot accuracy (held-out pairs)", "accuracy", fv_heads, fv_draws, "+",
        accuracy[1], accuracy[2:], seed,
    )  # fmt: skip

    stage("held-out", "Ablations: few-shot accuracy and the ICL score")
    induction_draws = (
        random_same_layer_sets(model, induction_heads, n_random, seed) if induction_heads else []
    )
    classes = [("FV heads", fv_heads, fv_draws)]
    if induction_heads:
        classes.append(("induction heads", induction_heads, induction_draws))
    head_sets = [heads for _, class_heads, draws in classes for heads in [class_heads, *draws]]
    few_shot, ablated = few_shot_accuracy(model, heldout, head_sets)
    sequences = default_sequences(model, n_documents, seed)
    _, clean_icl, ablated_icl = ablated_icl_scores(
        model, sequences.tokens, sequences.windows, head_sets, seed=seed
    )
    ablations = []
    for i, (name, class_heads, draws) in enumerate(classes):
        at = i * (n_random + 1)
        accuracy_change = ablated[at : at + n_random + 1] - few_shot
        icl_change = ablated_icl[at : at + n_random + 1] - clean_icl
        ablations += [
            compare(f"{name} ablated: few-shot accuracy", "accuracy", class_heads, draws, "-",
                    accuracy_change[0], accuracy_change[1:], seed),
            compare(f"{name} ablated: ICL score", "nats", class_heads, draws, "+",
                    icl_change[0], icl_change[1:], seed),
        ]  # fmt: skip

    task_vectors = []
    for index, name in enumerate(tasks):
        rows = heldout.task_index == index
        runs = accuracy[:, rows]
        task_vectors.append(
            TaskVector(
                task=name,
                description=ICL_TASKS[name].description,
                n_pairs=len(pairs[name]),
                few_shot=few_shot[rows].mean().item(),
                zero_shot=runs[0].mean().item(),
                zero_shot_ci=mean_ci(runs[0], seed),
                with_fv=runs[1].mean().item(),
                with_fv_ci=mean_ci(runs[1], seed),
                with_random=runs[2:].mean().item(),
                with_random_ci=mean_ci(runs[2:].mean(0), seed),
            )
        )
    stage("ablations", "done")
    timings["total"] = time.perf_counter() - began
    fv_labels, induction_labels = head_labels(fv_heads), head_labels(induction_heads)
    return FunctionVectorResult(
        model_name=cfg.model_name,
        provenance=interp.provenance(model),
        tasks=tasks,
        n_shots=n_shots,
        n_prompts=n_prompts,
        seed=seed,
        aie_attributed=aie,
        aie_per_task=aie_per_task,
        candidates=head_labels(candidate_heads),
        candidates_aie=exact_aie.tolist(),
        fv_heads=fv_labels,
        fv_heads_heldout_aie=heldout_effects[:top].mean(1).tolist(),
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
