"""An IOI circuit by mean ablation (the paper's section 4) on the discovery prompts, and validated on
held-out prompts. F(X): the mean logit diff with every head outside X mean-ablated (`MeanAblation`).

  faithfulness  (F(circuit) - F(empty)) / (F(model) - F(empty))  (`interp.interventions.stats`)
  recovered     F(circuit) / F(model), as Wang et al. report it (they call it faithfulness)
  completeness  |F(circuit \\ K) - F(model \\ K)| / F(model) for each class and random subsets K
  minimality    per head v, K its class-mates: (F(C \\ K) - F(C \\ (K + v))) / F(C)

Validation (`validate_circuit`): on held-out templates, names, places and objects, each class's drop
(clean - mean-ablated, relative to the held-out logit diff; `circuits.evidence.EFFECT_SIGN`) against
random same-layer heads outside the circuit, pooled and per name order ("ABBA": IO first, "BABA")
and template ("T3"), judged by `circuits.evidence.judge_class`; the circuit's faithfulness there too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

import interp
from circuits.evidence import (
    ClassVerdict,
    HeadClass,
    Strata,
    every_head,
    head_class,
    held_out_faithfulness,
    judge_class,
    label_strata,
    unclaimed_heads,
)
from circuits.finding import Finding
from circuits.ioi.evidence import direct_logit_attributions
from circuits.ioi.patching import MeanAblation
from circuits.ioi.results import CLASS_WRITES, Evaluation, Validation
from interp.interventions.stats import bootstrap, faithfulness_ratio
from interp.tasks.ioi_prompts import IOIPrompts
from interp.types import Head, Progress, head_label

DEPENDENT_KINDS = {"order": "all", "template": "most"}  # the verdict's strata (`class_verdict`)


def _faithfulness(circuit: float, model: float, ablated: float) -> float:
    """`faithfulness_ratio` of the batch means F(circuit), F(model), F(empty)."""
    means = (torch.tensor([value], dtype=torch.float64) for value in (circuit, model, ablated))
    return float(faithfulness_ratio(*means))


def evaluate_circuit(
    finding: Finding,
    clean: IOIPrompts,
    mean_ablation: MeanAblation,
    n_subsets: int = 10,
    seed: int = 0,
    progress: Progress | None = None,
) -> Evaluation:
    """Faithfulness, recovered fraction, completeness (`n_subsets` random subsets drawn with `seed`
    besides the classes) and minimality of the IOI finding's circuit (`IOIFigures.circuit`) on `clean`;
    every F in one batch of runs."""
    result = finding.extras
    all_heads = every_head(mean_ablation.model)
    circuit = result.heads

    def subtract(keep: Sequence[Head], heads: Sequence[Head]) -> list[Head]:
        return sorted(set(keep) - set(heads))

    subsets = [heads for heads in result.circuit.values() if heads]
    n_classes = len(subsets)
    generator = torch.Generator().manual_seed(seed)
    drawn = {frozenset(heads) for heads in subsets}  # each K once: a repeat would count twice in the median
    n_random = min(n_subsets, 2 ** len(circuit) - 1 - len(drawn))
    while len(subsets) < n_classes + n_random:
        chosen = torch.rand(len(circuit), generator=generator) < 0.5
        subset = [head for head, keep in zip(circuit, chosen.tolist(), strict=True) if keep]
        if subset and frozenset(subset) not in drawn:
            drawn.add(frozenset(subset))
            subsets.append(subset)
    mates = {  # minimality: what each head adds once its class-mates (which may stand in for it) are gone
        head: {mate for heads in result.circuit.values() if head in heads for mate in heads} - {head}
        for head in circuit
    }
    unclassified = [(h.layer, h.head) for h in result.unclassified]
    keeps = [circuit, [], circuit + unclassified]
    keeps += [subtract(circuit, subset) for subset in subsets] + [subtract(all_heads, s) for s in subsets]
    keeps += [subtract(circuit, mates[head]) for head in circuit]
    keeps += [subtract(circuit, mates[head] | {head}) for head in circuit]
    unique = list(dict.fromkeys(frozenset(keep) for keep in keeps))
    ablated = [sorted(set(all_heads) - keep) for keep in unique]
    means = mean_ablation.logit_diffs_many(ablated, clean, progress).mean(1).tolist()
    measured = dict(zip(unique, means, strict=True))

    def F(keep: Sequence[Head]) -> float:
        return measured[frozenset(keep)]

    f_model, f_circuit, f_empty = result.baseline.logit_diff, F(circuit), F([])
    completeness = [
        {
            "heads": [list(head) for head in subset],
            "circuit_logit_diff": F(subtract(circuit, subset)),
            "model_logit_diff": F(subtract(all_heads, subset)),
            "gap": abs(F(subtract(circuit, subset)) - F(subtract(all_heads, subset))) / f_model,
        }
        for subset in subsets
    ]
    minimality = {  # relative to F(circuit); undefined (NaN) where the circuit does not do the task
        head_label(*head): (F(subtract(circuit, mates[head])) - F(subtract(circuit, mates[head] | {head})))
        / f_circuit
        if f_circuit > 0
        else math.nan
        for head in circuit
    }
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
    finding: Finding,
    heldout: IOIPrompts,
    heldout_abc: IOIPrompts,
    description: str = "held-out prompts given by the caller",
    progress: Progress | None = None,
) -> Validation:
    """Each class of the IOI finding's circuit (`IOIFigures.circuit`) on held-out prompts (see the
    module docstring); `description` says in the report what was held out. Every ablated run (each
    class with its random sets, the backup name movers with the other name movers ablated in each run
    and in its reference) is made in one `logit_diffs_many`."""
    settings, result = finding.settings, finding.extras
    outside = unclaimed_heads(model, result.circuit.values())
    selected = [(h.layer, h.head) for h in result.unclassified]  # chosen by discovery, in no class
    pool = unclaimed_heads(model, [*result.circuit.values(), selected])  # random heads: none of these
    name_movers = result.circuit["name_mover"]
    classes: dict[str, tuple[list[Head], HeadClass]] = {}  # class -> (base ablated in its runs, the class)
    for name, heads in result.circuit.items():
        if heads:
            base = [h for h in name_movers if h not in heads] if name == "backup_name_mover" else []
            sign = -1 if name == "negative_name_mover" else 1
            found = head_class(model, name, heads, settings.n_random_draws, settings.seed, sign, pool)
            classes[name] = (base, found)
    sets = [[], outside, every_head(model)] + [base for base, _ in classes.values()]
    sets += [base + list(heads) for base, found in classes.values() for heads in found.sets]
    unique = list(dict.fromkeys(tuple(sorted(heads)) for heads in sets))
    runs = MeanAblation(model, heldout_abc).logit_diffs_many(unique, heldout, progress)
    measured = dict(zip(unique, runs, strict=True))

    def ablated(heads: Sequence[Head]) -> Tensor:  # the held-out logit diff per prompt [batch]
        return measured[tuple(sorted(heads))]

    dla = direct_logit_attributions(model, heldout)
    return Validation(
        prompts=description,
        n_prompts=len(heldout),
        logit_diff=ablated([]).mean().item(),
        classes={
            name: _class_verdict(base, found, finding, ablated, dla, heldout)
            for name, (base, found) in classes.items()
        },
        **_heldout_faithfulness(finding, ablated(outside), ablated([]), ablated(every_head(model)), heldout),
    )


def _class_verdict(
    base: list[Head],
    found: HeadClass,
    finding: Finding,
    ablated: Callable[[Sequence[Head]], Tensor],
    dla: dict[str, Tensor],
    heldout: IOIPrompts,
) -> ClassVerdict:
    """A class's drop beyond its random sets' (its runs and reference with `base` ablated, relative to
    the held-out logit diff), judged pooled and per name order (by CI) and template; its details (see
    `Validation`): the writers' direct writes to IO and S (`dla`: "IO",
    "S" -> [layer, head] on the held-out prompts)."""
    settings = finding.settings
    clean = ablated([]).mean().item()
    reference = ablated(base)
    drops = torch.stack([reference - ablated(base + list(heads)) for heads in found.sets]) / abs(clean)
    writes, writes_right = None, True
    if found.name in CLASS_WRITES:
        logit, write_sign = CLASS_WRITES[found.name]
        heads = finding.extras.circuit[found.name]
        writes = {role: float(sum(dla[role][h] for h in heads) / len(heads)) for role in dla}
        writes_right = write_sign * writes[logit] > 0
    verdict = judge_class(
        found, drops, strata=Strata(_strata(heldout), DEPENDENT_KINDS, ("order",), _templates(heldout)),
        evidence_holds=writes_right and clean > 0,  # nothing is confirmed where the model does not do IOI
        seed=settings.seed, n_boot=settings.n_bootstrap,
    )  # fmt: skip
    if heldout.texts is not None:  # each template's first prompt
        examples = {t: heldout.texts[i] for i, t in reversed(list(enumerate(_templates(heldout))))}
        for stratum in verdict.strata:
            stratum.example = examples.get(stratum.name)
    if writes is not None:
        verdict.details = {"writes": writes}
    return verdict


def _heldout_faithfulness(
    finding: Finding, in_circuit: Tensor, clean: Tensor, nothing: Tensor, heldout: IOIPrompts
) -> dict[str, Any]:
    """`Validation`'s faithfulness fields from the logit diff per prompt [batch] with the circuit alone,
    no head and every head ablated: the recovered fraction with its CI; the faithfulness pooled and per
    stratum (NaN, None and no strata where the model does as well with every head ablated)."""
    settings = finding.settings
    templates = _templates(heldout)  # the families the CIs resample
    low, high = bootstrap(
        lambda samples: in_circuit[samples].mean(-1) / clean[samples].mean(-1),
        len(clean),
        settings.n_bootstrap,
        seed=settings.seed,
        defined=bool(torch.isfinite(in_circuit).all() and torch.isfinite(clean).all()),
        families=templates,
    )
    summary, strata = held_out_faithfulness(
        in_circuit, clean, nothing, _strata(heldout), settings.seed, settings.n_bootstrap, templates
    )
    return {
        "faithfulness": math.nan if summary is None else summary.ratio,
        "recovered": in_circuit.mean().item() / clean.mean().item(),
        "recovered_ci": (float(low), float(high)),
        "n_templates": len(set(templates)),
        "faithfulness_summary": summary,
        "faithfulness_strata": strata,
    }


def _templates(prompts: IOIPrompts) -> list[str]:
    """Each prompt's template, "T3" [prompt]: the families the CIs resample."""
    return [f"T{t}" for t in prompts.template.tolist()]


def _strata(prompts: IOIPrompts) -> list[tuple[str, str, Tensor]]:
    """The held-out prompts by name order (ABBA, then BABA) and by template ("T3"), in template order."""
    templates = label_strata("template", _templates(prompts))
    orders = sorted(label_strata("order", prompts.order), key=lambda stratum: stratum[1])  # ABBA, BABA
    return orders + sorted(templates, key=lambda stratum: int(stratum[1][1:]))
