"""Function-vector heads (Todd et al. 2024): the heads whose output at the last token carries the task
a few-shot prompt demonstrates, and the function vector they sum to.

  group        a task asked in one prompt template (`ICL_TEMPLATES`): one mean output, one vector
  mean output  a head's z at the last token of a group's clean prompts, averaged (`HeadMeans.z`), and
               what it writes to the residual stream there (`HeadMeans.written`: z_h W_O[h]; post-norm:
               through ln1_post at each prompt's scale)
  AIE          p(answer) on a corrupted prompt (the examples' answers shuffled) with the head's z at the
               last token set to its group's mean, minus without: exact (`head_indirect_effects`) or to
               first order for every head (`attributed_indirect_effects`)
  FV           a group's mean written outputs of the FV heads summed (`function_vector`), added to
               hook_resid_pre of one layer at the last token of zero-shot prompts (`zero_shot_accuracy`)

Ablations set a head's z at every position to its mean over every real position (`few_shot_accuracy`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from jaxtyping import Float, Int
from torch import Tensor

import interp
from circuits.icl.heads import ablated_z
from interp.interventions.ablation import ablation_sites
from interp.interventions.engine import (
    Intervention,
    RunOptions,
    Site,
    cached_run,
    read_with_grad,
    run_site_sets,
    start_names,
)
from interp.interventions.metrics import accuracy_metric, prob_metric
from interp.model.tokens import index_tokens
from interp.tasks.icl_tasks import DEFAULT_TEMPLATE, answer_token, check_template_names, few_shot_prompts
from interp.types import Head, Progress, as_stage


@dataclass(kw_only=True)
class TaskPrompts:
    """Few-shot prompts of several tasks in one or more templates, in one batch padded on the model's
    `default_padding_side`; a group is a task in one template (`group_index`, task-major)."""

    tasks: list[str]
    templates: list[str]  # names of interp.tasks.icl_tasks.ICL_TEMPLATES
    task_index: Int[Tensor, " batch"]  # into tasks
    template_index: Int[Tensor, " batch"]  # into templates
    clean: Int[Tensor, "batch pos"]  # n_shots solved pairs, then the query
    clean_last: Int[Tensor, " batch"]
    corrupted: Int[Tensor, "batch pos_c"]  # the same with the answers shuffled among the examples
    corrupted_last: Int[Tensor, " batch"]
    zero_shot: Int[Tensor, "batch pos_z"]  # the query alone
    zero_shot_last: Int[Tensor, " batch"]
    answers: Int[Tensor, " batch"]  # the token of " answer"

    @property
    def n_groups(self) -> int:
        return len(self.tasks) * len(self.templates)

    @property
    def group_index(self) -> Int[Tensor, " batch"]:
        """Each prompt's group, task-major: task_index * len(templates) + template_index."""
        return self.task_index * len(self.templates) + self.template_index

    def prompt_templates(self) -> list[str]:
        """Each prompt's template name [batch]."""
        return [self.templates[index] for index in self.template_index.tolist()]


def task_prompts(
    model: interp.HookedTransformer,
    pairs: dict[str, Sequence[tuple[str, str]]],
    n_prompts: int,
    n_shots: int,
    seed: int = 0,
    templates: Sequence[str] = (DEFAULT_TEMPLATE,),
) -> TaskPrompts:
    """`n_prompts` few-shot prompts of each task (name -> its single-token pairs) in each of `templates`
    (names of ICL_TEMPLATES), drawn with `seed`: a task's prompts hold the same pairs in every template."""
    templates = check_template_names(templates)
    generator = torch.Generator().manual_seed(seed)
    texts: dict[str, list[str]] = {"clean": [], "corrupted": [], "zero_shot": []}
    task_index, template_index, answers = [], [], []
    for index, task_pairs in enumerate(pairs.values()):
        drawn = generator.get_state()
        for template_at, template in enumerate(templates):
            generator.set_state(drawn)  # the same draws in each template
            prompts = few_shot_prompts(task_pairs, n_prompts, n_shots, generator, template)
            for kind in texts:
                texts[kind] += getattr(prompts, kind)
            task_index += [index] * n_prompts
            template_index += [template_at] * n_prompts
            answers += [answer_token(model, answer) for answer in prompts.answers]

    tokens = {}  # each kind's tokens and last positions, by their fields' names
    for kind, kind_texts in texts.items():
        tokens[kind], tokens[f"{kind}_last"] = model.to_tokens(kind_texts), model.last_positions(kind_texts)
    return TaskPrompts(
        tasks=list(pairs),
        templates=templates,
        task_index=torch.tensor(task_index),
        template_index=torch.tensor(template_index),
        answers=torch.tensor(answers),
        **tokens,
    )


@dataclass(frozen=True)
class HeadMeans:
    """Each head's output at the last token of a group's clean prompts, averaged over them: `z`, what the
    AIE patches in at hook_z, and `written`, what the function vector sums
    (`ActivationCache.stack_head_contributions`; post-norm: ln1_post frozen at each prompt's scale)."""

    z: Float[Tensor, "group layer head d_head"]
    written: Float[Tensor, "group layer head d_model"]


@torch.inference_mode()
def mean_head_outputs(model: interp.HookedTransformer, prompts: TaskPrompts) -> HeadMeans:
    """Each head's z and written output at the last token of the clean prompts, per group (one run)."""
    cfg = model.cfg
    names = model.layer_hook_names("z")
    _, cached = cached_run(model, prompts.clean, model.head_contribution_hook_names(), logits=False)
    rows, last = torch.arange(len(prompts.clean)), prompts.clean_last
    z = torch.stack([cached[name][rows, last] for name in names], 1)  # [b, l, h, d_head]
    written = interp.ActivationCache(cached, model).stack_head_contributions(pos=last.to(z.device))
    written = written.unflatten(0, (cfg.n_layers, cfg.n_heads)).permute(2, 0, 1, 3)  # [b, l, h, d_model]
    one_hot = torch.nn.functional.one_hot(prompts.group_index, prompts.n_groups).to(z.dtype)  # [b, group]
    counts = one_hot.sum(0)[:, None, None, None]
    return HeadMeans(
        z=torch.einsum("bg,blhd->glhd", one_hot, z) / counts,
        written=torch.einsum("bg,blhd->glhd", one_hot, written) / counts,
    )


def per_prompt(means: HeadMeans, prompts: TaskPrompts, layer: int) -> Tensor:
    """Each prompt's group's mean z of block `layer`, as a source for hook_z: [batch, 1, head, d_head]."""
    return means.z[prompts.group_index, layer][:, None].to(prompts.corrupted.device)


GRADIENT_PROMPTS = 32
"""Prompts per forward and backward pass of `attributed_indirect_effects`, whose memory grows with them
(the backward pass keeps every activation: 6.5 GB for SmolLM2's 160 discovery prompts at once)."""


def attributed_indirect_effects(
    model: interp.HookedTransformer, prompts: TaskPrompts, means: HeadMeans, progress: Progress | None = None
) -> Float[Tensor, "batch layer head"]:
    """Every head's indirect effect on each corrupted prompt to first order (a forward and backward
    pass per `GRADIENT_PROMPTS` prompts, each a unit of `progress`): (mean z - z) . d p(answer) / dz at
    the last token."""
    names = model.layer_hook_names("z")
    effects = []
    chunks = torch.arange(len(prompts.answers)).split(GRADIENT_PROMPTS)
    for done, rows in enumerate(chunks):
        if progress is not None:
            progress("first-order AIE", done, len(chunks))
        here, last = torch.arange(len(rows)), prompts.corrupted_last[rows]
        with read_with_grad(model, names) as kept:
            resid = model(index_tokens(prompts.corrupted, rows), stop_at_layer=model.cfg.n_layers)[here, last]
            probs = model.unembed(model.ln_final(resid[:, None]))[:, 0].float().softmax(-1)
            answer_probs = probs[here, prompts.answers[rows].to(probs.device)]
            grads = torch.autograd.grad(answer_probs.sum(), [kept[name] for name in names])
        mean_z = means.z[prompts.group_index[rows]].to(resid.device)  # [rows, layer, head, d_head]
        per_layer = [  # [rows, head] each
            ((mean_z[:, layer] - kept[name].detach()[here, last]) * grad[here, last]).sum(-1)
            for layer, (name, grad) in enumerate(zip(names, grads, strict=True))
        ]
        effects.append(torch.stack(per_layer, 1).detach().float().cpu())
    return torch.cat(effects)


@torch.inference_mode()
def head_indirect_effects(
    model: interp.HookedTransformer,
    prompts: TaskPrompts,
    means: HeadMeans,
    head_sets: Sequence[Sequence[Head]],
    progress: Progress | None = None,
) -> Float[Tensor, "n_sets batch"]:
    """Each set of heads' indirect effect on each corrupted prompt: p(answer) with the heads' z at the
    last token set to their group's mean, minus without; one patched run per set on interp's engine."""
    tokens, last = prompts.corrupted, prompts.corrupted_last
    layers = {layer for heads in head_sets for layer, _ in heads}
    sources = {interp.act_name("z", layer): per_prompt(means, prompts, layer) for layer in layers}
    _, target = cached_run(model, tokens, start_names(model, keys_values=True), logits=False)
    metric = prob_metric(prompts.answers, pos=last)
    runs = [[replace(site, pos=last) for site in ablation_sites(model, heads=heads)] for heads in head_sets]
    options = RunOptions(logit_pos=last, progress=progress)
    values = run_site_sets(model, tokens, [*runs, []], sources, metric, target=target, options=options)
    return values[:-1] - values[-1]


def function_vector(means: HeadMeans, heads: Sequence[Head]) -> Float[Tensor, "group d_model"]:
    """The sum over `heads` of their mean output written to the residual stream (`HeadMeans.written`)."""
    return sum(means.written[:, layer, head] for layer, head in heads)


@torch.inference_mode()
def zero_shot_accuracy(
    model: interp.HookedTransformer,
    prompts: TaskPrompts,
    additions: Sequence[tuple[int, Float[Tensor, "group d_model"] | None]],
    progress: Progress | None = None,
) -> Float[Tensor, "n_runs batch"]:
    """Top-1 accuracy (0/1 per prompt) of the zero-shot prompts, one run per (layer, vectors): each
    prompt's group's vector added to hook_resid_pre of `layer` at its last token (None: nothing)."""
    tokens, last = prompts.zero_shot, prompts.zero_shot_last
    runs = []
    for layer, vectors in additions:
        if vectors is None:
            runs.append([])
            continue
        added = vectors[prompts.group_index][:, None].to(tokens.device)  # [batch, 1, d_model]

        def add(resid: Tensor, added: Tensor = added) -> Tensor:
            return resid + added

        runs.append([Intervention(Site(interp.act_name("resid_pre", layer), pos=last), add)])
    _, target = cached_run(model, tokens, start_names(model, keys_values=True), logits=False)
    metric = accuracy_metric(prompts.answers, pos=last)
    options = RunOptions(logit_pos=last, progress=progress)
    return run_site_sets(model, tokens, runs, None, metric, target=target, options=options)


ABLATED_STAGE = "few-shot prompts with heads ablated"  # `few_shot_accuracy`'s runs, batch by batch
LENGTH_BATCHES = 4
"""Batches of similar length that `few_shot_accuracy` runs its prompts in: a batch is as wide as its
longest prompt, so fewer of its positions are padding (SmolLM2's 320 held-out few-shot prompts: 32% of
one batch's positions, 6% of four's)."""


def length_batches(
    model: interp.HookedTransformer, tokens: Int[Tensor, "batch pos"], last: Int[Tensor, " batch"]
) -> list[tuple[Int[Tensor, " rows"], slice]]:
    """The prompts in up to `LENGTH_BATCHES` batches by length (shortest first): each batch's rows
    (ascending) and the positions from its earliest first real token to its latest last one."""
    first, last = model.first_positions(tokens), last.cpu()
    batches = []
    for rows in (last - first).argsort(stable=True).tensor_split(n_length_batches(len(tokens))):
        rows = rows.sort().values
        batches.append((rows, slice(int(first[rows].min()), int(last[rows].max()) + 1)))
    return batches


def n_length_batches(n_prompts: int) -> int:
    """How many batches `length_batches` makes of n prompts."""
    return min(LENGTH_BATCHES, n_prompts)


@torch.inference_mode()
def few_shot_accuracy(
    model: interp.HookedTransformer,
    prompts: TaskPrompts,
    head_sets: Sequence[Sequence[Head]],
    progress: Progress | None = None,
) -> tuple[Float[Tensor, " batch"], Float[Tensor, "n_sets batch"]]:
    """(top-1 accuracy (0/1) of the clean few-shot prompts, the same with each set of heads' z set to
    its mean over every real position of the prompts), run in batches of similar length
    (`length_batches`; each set's run on a batch a unit of `progress`)."""
    tokens, last = prompts.clean, prompts.clean_last
    layers = sorted({layer for heads in head_sets for layer, _ in heads})
    names = [interp.act_name("z", layer) for layer in layers]
    batches = [(rows, columns, index_tokens(tokens, (rows, columns))) for rows, columns in length_batches(
        model, tokens, last)]  # fmt: skip
    targets = [
        cached_run(model, part, [*start_names(model), *names], logits=False)[1] for *_, part in batches
    ]
    z, real = {name: [] for name in names}, []  # every batch's z, and where it is real
    for (rows, columns, part), target in zip(batches, targets, strict=True):
        positions = torch.arange(columns.start, columns.stop)
        real.append((positions >= model.first_positions(part)[:, None] + columns.start) & (
            positions <= last[rows, None].cpu()))  # fmt: skip
        for name in names:
            z[name].append(target[name].flatten(0, 1)[:, None])  # [rows * pos, 1, head, d_head]
    real = torch.cat([mask.flatten() for mask in real])[:, None]  # [rows * pos, 1]
    means = ablated_z(model, {name: torch.cat(parts) for name, parts in z.items()}, "mean", real=real)
    runs = [[], *(ablation_sites(model, heads=heads) for heads in head_sets)]
    values = torch.empty(len(runs), len(tokens))
    for done, ((rows, columns, part), target) in enumerate(zip(batches, targets, strict=True)):
        at = last[rows] - columns.start
        metric = accuracy_metric(prompts.answers[rows], pos=at)
        counted = as_stage(progress, ABLATED_STAGE, done * len(runs), len(batches) * len(runs))
        options = RunOptions(logit_pos=at, progress=counted)
        values[:, rows] = run_site_sets(model, part, runs, means, metric, target=target, options=options)
    return values[0], values[1:]
