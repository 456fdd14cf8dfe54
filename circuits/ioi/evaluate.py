"""Evaluating an IOI circuit by mean ablation (the paper's section 4), and validating it on held-out
prompts.

F(X) is the mean logit difference when every head outside X is mean-ablated (mean over the ABC
distribution, per template and position: `MeanAblation`):
  faithfulness  (F(circuit) - F(empty)) / (F(model) - F(empty)), interp's one faithfulness
                (`interp.interventions.stats.faithfulness_ratio`, F(empty): every head ablated)
  recovered     F(circuit) / F(model): the fraction of the model's logit difference the circuit
                recovers, as Wang et al. report it (they call it faithfulness)
  completeness  for random subsets K of the circuit, |F(circuit \\ K) - F(model \\ K)| (small = complete)
  minimality    per head v, with K = the other heads of v's classes: F(C \\ K) - F(C \\ (K + v)),
                relative to F(C)

Validation on data the finder never saw (`validate_circuit`): held-out prompts from other templates
with other names, places and objects (`interp.tasks.ioi.ioi_dataset_for(..., split="heldout")`).
Per class, the drop of the logit diff when its heads are mean-ablated (clean - ablated,
`circuits.evidence.EFFECT_SIGN`; positive: the class helps) is compared with the drop when as many
random heads from the same layers (outside the circuit) are, with a bootstrap CI over prompts of the
drop beyond them, pooled and per stratum (name order, template), judged by
`circuits.evidence.judge_class`: whether the class holds in the class's direction (negative name
movers: a negative drop) and where (`DEPENDENT_KINDS`). The circuit's faithfulness and recovered
fraction are measured on the held-out prompts too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

import interp
from circuits.evidence import (
    HeadClass,
    faithfulness_by_stratum,
    head_class,
    judge_class,
)
from circuits.ioi.evidence import direct_logit_attributions
from circuits.ioi.patching import MeanAblation
from circuits.ioi.results import (
    CLASS_WRITES,
    ClassValidation,
    Evaluation,
    IOICircuitResult,
    Validation,
)
from interp.interventions.stats import (
    bootstrap,
    faithfulness_ratio,
    faithfulness_summary,
    heterogeneity,
)
from interp.tasks.ioi_prompts import IOIPrompts
from interp.types import Head, Progress, head_label


def _all_heads(model: interp.HookedTransformer) -> list[Head]:
    """Every (layer, head) of the model, layer by layer."""
    return [(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]


def _faithfulness(circuit: float, model: float, ablated: float) -> float:
    """`faithfulness_ratio` of the batch means F(circuit), F(model), F(empty)."""
    means = (torch.tensor([value], dtype=torch.float64) for value in (circuit, model, ablated))
    return float(faithfulness_ratio(*means))


def evaluate_circuit(
    result: IOICircuitResult,
    clean: IOIPrompts,
    mean_ablation: MeanAblation,
    n_subsets: int = 10,
    seed: int = 0,
    progress: Progress | None = None,
) -> Evaluation:
    """Faithfulness, recovered fraction, completeness and minimality of result's circuit on `clean`
    (see the module docstring); `n_subsets` random subsets K for completeness, drawn with `seed`.
    progress(stage, done, total): as the ablated runs finish."""
    model = mean_ablation.model
    every_head = _all_heads(model)
    circuit = result.heads

    def subtract(keep: Sequence[Head], heads: Sequence[Head]) -> list[Head]:
        return sorted(set(keep) - set(heads))

    # Completeness: knock K out of both the circuit and the model; a complete circuit is hurt alike.
    subsets = [heads for heads in result.circuit.values() if heads]
    generator = torch.Generator().manual_seed(seed)
    while len(subsets) < len([s for s in result.circuit.values() if s]) + n_subsets:
        chosen = torch.rand(len(circuit), generator=generator) < 0.5
        if chosen.any():
            subsets.append([head for head, keep in zip(circuit, chosen.tolist(), strict=True) if keep])
    # Minimality: what each head adds once its class-mates (which may stand in for it) are gone.
    mates = {
        head: {mate for heads in result.circuit.values() if head in heads for mate in heads} - {head}
        for head in circuit
    }
    unclassified = [(h.layer, h.head) for h in result.unclassified]
    keeps = [circuit, [], circuit + unclassified]
    keeps += [subtract(circuit, subset) for subset in subsets] + [subtract(every_head, s) for s in subsets]
    keeps += [subtract(circuit, mates[head]) for head in circuit]
    keeps += [subtract(circuit, mates[head] | {head}) for head in circuit]
    unique = list(dict.fromkeys(frozenset(keep) for keep in keeps))
    ablated = [sorted(set(every_head) - keep) for keep in unique]
    means = mean_ablation.logit_diffs_many(ablated, clean, progress).mean(1).tolist()
    measured = dict(zip(unique, means, strict=True))

    def F(keep: Sequence[Head]) -> float:
        """Mean logit diff with every head outside `keep` mean-ablated."""
        return measured[frozenset(keep)]

    f_model = result.baseline.logit_diff
    f_circuit = F(circuit)
    f_empty = F([])
    completeness = []
    for subset in subsets:
        without_circuit = F(subtract(circuit, subset))
        without_model = F(subtract(every_head, subset))
        completeness.append(
            {
                "heads": [list(head) for head in subset],
                "circuit_logit_diff": without_circuit,
                "model_logit_diff": without_model,
                "gap": abs(without_circuit - without_model) / f_model,
            }
        )
    minimality = {}
    for head in circuit:
        f_without_mates = F(subtract(circuit, mates[head]))
        f_without_head = F(subtract(circuit, mates[head] | {head}))
        minimality[head_label(*head)] = (f_without_mates - f_without_head) / f_circuit
    f_with_unclassified = F(circuit + unclassified) if unclassified else None
    return Evaluation(
        model_logit_diff=f_model,
        circuit_logit_diff=f_circuit,
        ablated_logit_diff=f_empty,
        faithfulness=_faithfulness(f_circuit, f_model, f_empty),
        recovered=f_circuit / f_model,
        faithfulness_with_unclassified=(
            None if f_with_unclassified is None else _faithfulness(f_with_unclassified, f_model, f_empty)
        ),
        recovered_with_unclassified=None if f_with_unclassified is None else f_with_unclassified / f_model,
        completeness=completeness,
        completeness_max_gap=max(c["gap"] for c in completeness),
        minimality=minimality,
    )


def validate_circuit(
    model: interp.HookedTransformer,
    result: IOICircuitResult,
    heldout: IOIPrompts,
    heldout_abc: IOIPrompts,
    description: str = "held-out prompts given by the caller",
    progress: Progress | None = None,
) -> Validation:
    """Confirm each class of result's circuit on held-out prompts (see the module docstring);
    `description` says in the report what was held out.

    1. per class, the head sets to ablate: the class and `n_random_draws` random sets (`ablation_plans`)
    2. every set mean-ablated on the held-out prompts, the runs together (`ablated_logit_diffs`)
    3. per class, its drop beyond the random sets', pooled and per stratum, a verdict (`class_validation`)
    4. the circuit's faithfulness and recovered fraction on the held-out prompts (`heldout_faithfulness`)

    progress(stage, done, total): as the ablated runs of step 2 finish."""
    ablation = MeanAblation(model, heldout_abc)
    dla = direct_logit_attributions(model, heldout)
    plans = ablation_plans(model, result)  # 1.
    ablated = ablated_logit_diffs(model, result, plans, ablation, heldout, progress)  # 2.
    classes = {
        name: class_validation(name, plan, result, ablated, dla, heldout) for name, plan in plans.items()
    }  # 3.
    return Validation(
        prompts=description,
        n_prompts=len(heldout),
        logit_diff=ablated([]).mean().item(),
        classes=classes,
        **heldout_faithfulness(model, result, ablated, heldout),  # 4.
    )


@dataclass(frozen=True)
class AblationPlan:
    """One class's ablated runs. base: the heads ablated in each of its runs and in its reference
    (the name movers not in the class, for the backup name movers, which act once those are gone;
    else none); found: the class and its random sets, each run with base ablated too."""

    base: list[Head]
    found: HeadClass

    @property
    def runs(self) -> list[list[Head]]:
        """base + the class, then base + each random set."""
        return [self.base + list(heads) for heads in self.found.sets]


def _outside_circuit(model: interp.HookedTransformer, result: IOICircuitResult) -> list[Head]:
    """Every head of the model not in the circuit, in (layer, head) order."""
    return sorted(set(_all_heads(model)) - set(result.heads))


def ablation_plans(model: interp.HookedTransformer, result: IOICircuitResult) -> dict[str, AblationPlan]:
    """1. class -> its `AblationPlan` (classes with heads only): `n_random_draws` random same-layer sets
    of heads outside the circuit (`circuits.evidence.head_class`, drawn with the result's seed)."""
    settings = result.settings
    outside = _outside_circuit(model, result)
    name_movers = result.circuit["name_mover"]
    plans = {}
    for name, heads in result.circuit.items():
        if not heads:
            continue
        base = [h for h in name_movers if h not in heads] if name == "backup_name_mover" else []
        sign = -1 if name == "negative_name_mover" else 1
        found = head_class(model, name, heads, settings.n_random_draws, settings.seed, sign, outside)
        plans[name] = AblationPlan(base=base, found=found)
    return plans


def ablated_logit_diffs(
    model: interp.HookedTransformer,
    result: IOICircuitResult,
    plans: dict[str, AblationPlan],
    ablation: MeanAblation,
    heldout: IOIPrompts,
    progress: Progress | None,
) -> Callable[[Sequence[Head]], Tensor]:
    """2. heads -> the held-out logit diff per prompt [batch] with those heads mean-ablated, for no
    head, every head outside the circuit, every head, and each plan's base and runs: every set
    measured in one `logit_diffs_many` (runs share the blocks before their first head)."""
    every_head = _all_heads(model)
    sets = [[], _outside_circuit(model, result), every_head]
    sets += [plan.base for plan in plans.values()] + [run for plan in plans.values() for run in plan.runs]
    unique = list(dict.fromkeys(tuple(sorted(heads)) for heads in sets))
    measured = dict(zip(unique, ablation.logit_diffs_many(unique, heldout, progress), strict=True))
    return lambda heads: measured[tuple(sorted(heads))]


DEPENDENT_KINDS = {"order": "all", "template": "most"}  # the verdict's strata (`class_verdict`)


def class_validation(
    name: str,
    plan: AblationPlan,
    result: IOICircuitResult,
    ablated: Callable[[Sequence[Head]], Tensor],
    dla: dict[str, Tensor],
    heldout: IOIPrompts,
) -> ClassValidation:
    """3. Class `name`'s drop of the held-out logit diff beyond its random sets' (relative to the
    clean logit diff, sign kept), with a bootstrap CI, pooled and per stratum (name order, by CI;
    template), judged by `circuits.evidence.judge_class`; its direct writes to the IO and S logits
    (`dla`: "IO", "S" -> [layer, head], on the held-out prompts) for the classes that write."""
    settings = result.settings
    heads = result.circuit[name]
    base = ablated([]).mean().item()
    reference = ablated(plan.base)
    drops = torch.stack([reference - ablated(run) for run in plan.runs]) / abs(base)  # [1 + draws, batch]
    writes = None
    writes_right = True
    if name in CLASS_WRITES:
        logit, write_sign = CLASS_WRITES[name]
        writes = {role: float(sum(dla[role][h] for h in heads) / len(heads)) for role in dla}
        writes_right = write_sign * writes[logit] > 0
    verdict = judge_class(
        plan.found, drops, strata=_strata(heldout), dependent_kinds=DEPENDENT_KINDS, by_ci=("order",),
        evidence_holds=writes_right and base > 0,  # nothing is confirmed where the model does not do IOI
        seed=settings.seed, n_boot=settings.n_bootstrap,
    )  # fmt: skip
    examples = _template_examples(heldout)
    for stratum in verdict.strata:
        stratum.example = examples.get(stratum.name)
    return ClassValidation(
        heads=verdict.heads,
        sign=verdict.sign,
        drop=verdict.heldout.drop,
        random_drop=verdict.heldout.random_drop,
        beyond=verdict.heldout.beyond,
        beyond_ci=verdict.heldout.beyond_ci,
        writes=writes,
        verdict=verdict.verdict,
        holds_in=[stratum.name for stratum in verdict.strata if stratum.holds],
        strata=verdict.strata,
        heterogeneity=heterogeneity(verdict.per_prompt, heldout.template.to(verdict.per_prompt.device)),
    )


def heldout_faithfulness(
    model: interp.HookedTransformer,
    result: IOICircuitResult,
    ablated: Callable[[Sequence[Head]], Tensor],
    heldout: IOIPrompts,
) -> dict[str, Any]:
    """4. The circuit's faithfulness on the held-out prompts, every head outside it mean-ablated, as
    `Validation`'s fields: the ratio of means (NaN where the model does as well with every head
    ablated: undefined there), the recovered fraction with its bootstrap CI, and the per-prompt
    error pooled and per name order and template (`faithfulness_summary`; None and no strata where
    undefined)."""
    settings = result.settings
    clean, nothing = ablated([]), ablated(_all_heads(model))  # each [batch]
    in_circuit = ablated(_outside_circuit(model, result))
    low, high = bootstrap(
        lambda samples: in_circuit[samples].mean(-1) / clean[samples].mean(-1),
        len(clean),
        settings.n_bootstrap,
        seed=settings.seed,
    )
    fields = {
        "faithfulness": float("nan"),
        "recovered": in_circuit.mean().item() / clean.mean().item(),
        "recovered_ci": (float(low), float(high)),
        "faithfulness_summary": None,
        "faithfulness_strata": [],
    }
    try:
        fields["faithfulness"] = float(faithfulness_ratio(in_circuit, clean, nothing))
        fields["faithfulness_summary"] = faithfulness_summary(
            in_circuit, clean, nothing, settings.n_bootstrap, settings.seed
        )
    except ValueError:
        return fields
    fields["faithfulness_strata"] = faithfulness_by_stratum(
        in_circuit, clean, nothing, _strata(heldout), settings.seed
    )
    return fields


def _strata(prompts: IOIPrompts) -> list[tuple[str, str, Tensor]]:
    """The held-out prompts by name order (ABBA, then BABA) and by template ("T3"), in template order."""
    abba = torch.tensor([order == "ABBA" for order in prompts.order])
    templates = [("template", f"T{t}", prompts.template == t) for t in prompts.template.unique().tolist()]
    return [("order", "ABBA", abba), ("order", "BABA", ~abba), *templates]


def _template_examples(prompts: IOIPrompts) -> dict[str, str]:
    """ "T3" -> the first prompt of template 3 (text IOI; {} without texts)."""
    if prompts.texts is None:
        return {}
    indexed = list(enumerate(prompts.template.tolist()))
    return {f"T{template}": prompts.texts[index] for index, template in reversed(indexed)}
