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
drop beyond them, pooled and per stratum (`circuits.evidence.stratum_drops`: name order, template);
`stratified_verdict` says whether the class holds in the class's direction (negative name movers:
a negative drop) and where. The circuit's faithfulness and
recovered fraction are measured on the held-out prompts too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

import interp
from circuits.evidence import StratumDrop, ci_verdict, mean_ci, stratum_drops
from circuits.ioi.evidence import direct_logit_attributions
from circuits.ioi.patching import MeanAblation
from circuits.ioi.results import (
    CLASS_WRITES,
    ClassValidation,
    Evaluation,
    IOICircuitResult,
    Validation,
)
from interp.interventions.stats import bootstrap, faithfulness_ratio, heterogeneity
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
    `description` says in the report what was held out. progress(stage, done, total): as the
    ablated runs finish."""
    settings = result.settings
    ablation = MeanAblation(model, heldout_abc)
    circuit = set(result.heads)
    every_head = _all_heads(model)
    generator = torch.Generator().manual_seed(settings.seed)
    dla = direct_logit_attributions(model, heldout)
    name_movers = result.circuit["name_mover"]

    def random_heads(heads: Sequence[Head]) -> list[Head]:
        """A random head outside the circuit per head of `heads`, from its layer where the layer has
        one left, else from any layer (fewer heads when the circuit leaves fewer)."""
        chosen: list[Head] = []
        outside = [head for head in every_head if head not in circuit]
        for layer, _ in heads:
            for pool in ([h for h in outside if h[0] == layer], outside):
                pool = [h for h in pool if h not in chosen]
                if pool:
                    chosen.append(pool[int(torch.randint(len(pool), (1,), generator=generator))])
                    break
        return chosen

    # Every ablated run first, measured together (runs share the blocks before their first head).
    plans = {}
    for name, heads in result.circuit.items():
        if not heads:
            continue
        # Backup name movers act once the name movers are gone: measure them on top of that.
        base_ablated = [h for h in name_movers if h not in heads] if name == "backup_name_mover" else []
        draws = [base_ablated + random_heads(heads) for _ in range(settings.n_random_draws)]
        plans[name] = (base_ablated, [base_ablated + list(heads)] + draws)
    outside_circuit = sorted(set(every_head) - circuit)
    sets = [[], outside_circuit, every_head]
    sets += [base for base, _ in plans.values()] + [run for _, runs in plans.values() for run in runs]
    unique = list(dict.fromkeys(tuple(sorted(heads)) for heads in sets))
    measured = dict(zip(unique, ablation.logit_diffs_many(unique, heldout, progress), strict=True))  # [batch]

    def ablated(heads: Sequence[Head]) -> Tensor:
        return measured[tuple(sorted(heads))]

    clean = ablated([])
    base = clean.mean().item()
    examples = _template_examples(heldout)
    classes = {}
    for name, (base_ablated, runs) in plans.items():
        heads = result.circuit[name]
        reference = ablated(base_ablated)
        drop = reference - ablated(runs[0])  # [batch]
        random_drop = torch.stack([reference - ablated(run) for run in runs[1:]]).mean(0)  # [batch]
        sign = -1 if name == "negative_name_mover" else 1
        beyond = (drop - random_drop) / abs(base)  # relative to the size of the logit diff, sign kept
        ci = mean_ci(beyond, settings.seed, settings.n_bootstrap)
        writes = None
        writes_right = True
        if name in CLASS_WRITES:
            logit, write_sign = CLASS_WRITES[name]
            writes = {role: float(sum(dla[role][h] for h in heads) / len(heads)) for role in dla}
            writes_right = write_sign * writes[logit] > 0
        # nothing is confirmed on prompts where the model does not do IOI
        pooled_holds = ci_verdict(ci, sign) == "confirmed" and writes_right and base > 0
        strata = stratum_drops(
            beyond, _strata(heldout), sign, by_ci=("order",), seed=settings.seed, n_boot=settings.n_bootstrap
        )
        for stratum in strata:
            stratum.example = examples.get(stratum.name)
        verdict, holds_in = stratified_verdict(pooled_holds, strata)
        classes[name] = ClassValidation(
            heads=[head_label(layer, head) for layer, head in heads],
            sign=sign,
            drop=drop.mean().item() / abs(base),
            random_drop=random_drop.mean().item() / abs(base),
            beyond=beyond.mean().item(),
            beyond_ci=ci,
            writes=writes,
            verdict=verdict,
            holds_in=holds_in,
            strata=strata,
            heterogeneity=heterogeneity(beyond, heldout.template.to(beyond.device)),
        )
    in_circuit, nothing = ablated(outside_circuit), ablated(every_head)  # each [batch]
    low, high = bootstrap(
        lambda samples: in_circuit[samples].mean(-1) / clean[samples].mean(-1),
        len(clean),
        settings.n_bootstrap,
        seed=settings.seed,
    )
    try:
        faithfulness = float(faithfulness_ratio(in_circuit, clean, nothing))
    except ValueError:  # the model does as well with every head ablated: undefined on these prompts
        faithfulness = float("nan")
    return Validation(
        prompts=description,
        n_prompts=len(heldout),
        logit_diff=base,
        faithfulness=faithfulness,
        recovered=in_circuit.mean().item() / base,
        recovered_ci=(float(low), float(high)),
        classes=classes,
    )


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


def stratified_verdict(pooled_holds: bool, strata: Sequence[StratumDrop]) -> tuple[str, list[str]]:
    """(verdict, the strata where the class holds): "unconfirmed" unless the pooled effect holds and
    at least one order does; "order-dependent" when only one name order holds; "template-dependent"
    when it holds in at most half of the templates; else "confirmed"."""
    holds_in = [stratum.name for stratum in strata if stratum.holds]
    orders = [stratum for stratum in strata if stratum.kind == "order"]
    templates = [stratum for stratum in strata if stratum.kind == "template"]
    if not pooled_holds or not any(stratum.holds for stratum in orders):
        return "unconfirmed", holds_in
    if not all(stratum.holds for stratum in orders):
        return "order-dependent", holds_in
    if 2 * sum(stratum.holds for stratum in templates) <= len(templates):
        return "template-dependent", holds_in
    return "confirmed", holds_in
