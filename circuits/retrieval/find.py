"""`find_retrieval_circuit`: the heads that retrieve a fact from context, found on discovery prompts
and tested on held-out ones (`interp.tasks.retrieval`).

Discovery (discovery relations and names, 4 facts), walking back from the logits as `interp ioi`
does; the corrupted prompts name a stranger in the query (nothing to retrieve):
  1. heads -> logits          each head's direct path patched from the corrupted run; edge
                              attribution (EAP) ranks every head, the `n_exact` first are
                              path-patched exactly (the others keep the estimate)
  2. heads -> movers' queries the same into the queries at END of step 1's classified heads
Selected heads (a drop above zero that stands out: `circuits.ioi.evidence.select_heads`; every effect
has the sign of `circuits.evidence.EFFECT_SIGN`, drop = clean - patched or ablated, positive: the heads
help) are classed by where END attends, among the queried fact's name ("mention"), its value
("mover", which must also write the answer: positive direct logit attribution) and the query's name
("query").

The relation is the family (`circuits.evidence.split_families`): heads and thresholds are chosen on
the discovery relations only, and every reported effect is measured on the held-out relations
(`HELDOUT_RELATIONS` by default), with other names, 2, 3, 6 and 8 facts and both fact templates
(one of them never seen in discovery): each class mean-ablated (per position, over the corrupted
prompts of its fact count and template) against random same-layer heads, per prompt, pooled
(`circuits.evidence.beyond_random`) and per stratum (fact count, template, relation), beside the same
figure on the discovery prompts that chose the heads (`held_out_note`); the induction heads of
`interp heads` are tested the same way; the circuit's faithfulness (`faithfulness_ratio`) with every
head outside it mean-ablated.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

import interp
from circuits.evidence import (
    FamilySplit,
    beyond_random,
    held_out_note,
    label_strata,
    mean_ci,
    random_same_layer_sets,
    split_families,
    stratum_drops,
)
from circuits.icl.heads import confirmed_induction_heads
from circuits.ioi.evidence import select_heads
from circuits.retrieval.results import (
    RetrievalAccuracy,
    RetrievalClass,
    RetrievalHead,
    RetrievalResult,
)
from interp import edges
from interp.interventions.ablation import Replacement, ablated_metrics
from interp.interventions.path_patching import PathPatcher
from interp.interventions.stats import faithfulness_ratio
from interp.tasks.retrieval import (
    DISCOVERY_FACT_COUNTS,
    DISCOVERY_TEMPLATES,
    HELDOUT_FACT_COUNTS,
    HELDOUT_RELATIONS,
    HELDOUT_TEMPLATES,
    RELATIONS,
    RetrievalPrompts,
    make_retrieval_prompts,
    make_two_hop_prompts,
)
from interp.types import Head, Progress, head_label

ATTENTION_TARGETS = {"VALUE": "mover", "NAME": "mention", "QUERY": "query"}


def accuracy(description: str, diffs: Tensor, n_candidates: Tensor | int, seed: int = 0) -> RetrievalAccuracy:
    """Accuracy (logit diff > 0: the answer first among the candidates) of per-prompt logit diffs
    [batch] with its bootstrap CI; chance is the mean of 1 / candidates."""
    right = (diffs > 0).double()
    chance = (1 / torch.as_tensor(n_candidates, dtype=torch.float64)).mean()
    return RetrievalAccuracy(
        prompts=description,
        n_prompts=len(diffs),
        accuracy=right.mean().item(),
        ci=mean_ci(right, seed),
        chance=float(chance),
        logit_diff=diffs.mean().item(),
    )


@torch.no_grad()
def clean_logit_diffs(model: interp.HookedTransformer, prompts: RetrievalPrompts) -> Tensor:
    """[batch] the clean run's logit diffs (logits)."""
    return prompts.logit_diff(model(prompts.tokens.to(model.device))).float().cpu()


@torch.no_grad()
def attention_and_direct(
    model: interp.HookedTransformer, prompts: RetrievalPrompts
) -> tuple[dict[str, Tensor], Tensor]:
    """({"VALUE", "NAME", "QUERY"} -> [layer, head] mean attention from END to that position, [layer,
    head] mean direct logit attribution at END on the direction W_U[answer] - W_U[best other
    candidate], through the final norm's scale)."""
    cfg = model.cfg
    names = [*model.layer_hook_names("pattern"), *model.layer_hook_names("z"), interp.act_name("scale")]
    tokens = prompts.tokens.to(model.device)
    logits, cache = model.run_with_cache(tokens, names_filter=names)
    rows = torch.arange(len(prompts), device=model.device)
    end = prompts.positions["END"].to(model.device)
    attention = {}
    for target in ATTENTION_TARGETS:
        keys = prompts.positions[target].to(model.device)
        per_layer = [
            cache[interp.act_name("pattern", layer)][rows, :, end, keys] for layer in range(cfg.n_layers)
        ]
        attention[target] = torch.stack(per_layer).mean(1).float().cpu()  # [layer, head]
    candidate = prompts.candidate_logits(logits)
    queried = prompts.queried.to(model.device)
    best_other = candidate.scatter(1, queried[:, None], float("-inf")).argmax(1)
    other = prompts.candidates.to(model.device)[rows, best_other]
    direction = (model.W_U[:, prompts.answer.to(model.device)] - model.W_U[:, other]).T  # [batch, d_model]
    stack = cache.stack_head_results(pos=end, apply_ln=True)  # [layer * head, batch, d_model]
    direct = (stack * direction).sum(-1).mean(-1).view(cfg.n_layers, cfg.n_heads).float().cpu()
    return attention, direct


def ranked_path_patching(
    model: interp.HookedTransformer,
    prompts: RetrievalPrompts,
    patcher: PathPatcher,
    scores: edges.EdgeScores,
    receivers: Sequence[Head] | None,
    n_exact: int,
) -> Tensor:
    """[layer, head] the drop of the mean logit diff (logits; clean - patched, EFFECT_SIGN: positive,
    the path helps) when each head's path to `receivers` (their queries at END; None: the logits) is
    patched from the corrupted run: exact path patching for the `n_exact` heads EAP ranks first by
    |estimate|, the EAP estimate for the others, NaN for heads that are no senders (at or after the
    last receiver's layer, or receivers)."""
    cfg = model.cfg
    graph = scores.graph
    last = cfg.n_layers if receivers is None else max(layer for layer, _ in receivers)
    senders = [(layer, head) for layer in range(last) for head in range(cfg.n_heads)]
    senders = [head for head in senders if head not in (receivers or [])]
    readers = ["logits"] if receivers is None else [f"a{layer}.h{head}<q>" for layer, head in receivers]
    columns = [graph.readers.index(name) for name in readers]
    effects = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))
    for layer, head in senders:
        effects[layer, head] = -scores.scores[graph.writers.index(f"a{layer}.h{head}"), columns].sum()
    exact = sorted(senders, key=lambda head: -abs(float(effects[head])))[:n_exact]
    if exact:
        end = prompts.positions["END"].to(model.device)
        patched = patcher(
            prompts.logit_diff,
            receivers="logits" if receivers is None else [(layer, head, "q") for layer, head in receivers],
            senders=exact,
            receiver_pos=None if receivers is None else end,
            logit_tokens=prompts.candidates.to(model.device),
        )
        drop = patched.target.mean() - patched.values.mean(-1)
        for head, value in zip(exact, drop.tolist(), strict=True):
            effects[head] = value
    return effects


def classify(
    heads: Sequence[Head],
    sweep: str,
    effects: Tensor,
    attention: dict[str, Tensor],
    direct: Tensor,
    min_attention: float = 0.1,
) -> list[RetrievalHead]:
    """Each head's class: where END attends most among the queried name, its value and the query's
    name, if that attention is at least `min_attention` (a "mover" must also write the answer:
    direct attribution > 0); None otherwise."""
    found = []
    for layer, head in heads:
        shares = {target: float(values[layer, head]) for target, values in attention.items()}
        target = max(shares, key=shares.get)
        cls = ATTENTION_TARGETS[target]
        if shares[target] < min_attention or (cls == "mover" and direct[layer, head] <= 0):
            cls = None
        found.append(
            RetrievalHead(
                head=head_label(layer, head),
                layer=layer,
                index=head,
                sweep=sweep,
                effect=float(effects[layer, head]),
                attention=shares,
                direct=float(direct[layer, head]),
                cls=cls,
            )
        )
    return found


def ablated_logit_diffs(
    model: interp.HookedTransformer, prompts: RetrievalPrompts, head_sets: Sequence[Sequence[Head]]
) -> Tensor:
    """[set, batch] the logit diffs with each set's heads mean-ablated (per position, over the
    prompts' corrupted runs)."""
    tokens = prompts.tokens.to(model.device)
    replacement = Replacement(model, model.layer_hook_names("z"), "mean", prompts.corrupted.to(model.device))
    end = prompts.positions["END"].to(model.device)
    with torch.no_grad():
        values = ablated_metrics(
            model, tokens, prompts.logit_diff, head_sets, replacement, logit_pos=end,
            logit_tokens=prompts.candidates.to(model.device),
        )  # fmt: skip
    return values.float().cpu()


def _strata(heldout: Sequence[RetrievalPrompts]) -> list[tuple[str, str, Tensor]]:
    """The held-out prompts (batches concatenated) by fact count, template and relation."""
    facts = torch.cat([torch.full((len(p),), p.n_facts) for p in heldout])
    templates = [f"template {p.template}" for p in heldout for _ in range(len(p))]
    relations = [relation for p in heldout for relation in p.relation]
    by_facts = [("facts", f"{n} facts", facts == n) for n in facts.unique().tolist()]
    return by_facts + label_strata("template", templates) + label_strata("relation", relations)


def _ablated_runs(
    model: interp.HookedTransformer,
    head_sets: Sequence[tuple[Head, ...]],
    batches: Sequence[RetrievalPrompts],
    stage: str,
    progress: Progress | None,
) -> dict[tuple[Head, ...], Tensor]:
    """head set -> [prompt] the logit diffs with it mean-ablated, the batches concatenated."""
    parts = []
    for done, prompts in enumerate(batches):
        if progress is not None:
            progress(stage, done, len(batches))
        parts.append(ablated_logit_diffs(model, prompts, head_sets))
    if progress is not None:
        progress(stage, len(batches), len(batches))
    return dict(zip(head_sets, torch.cat(parts, 1), strict=True))


def validate_classes(
    model: interp.HookedTransformer,
    classes: dict[str, list[Head]],
    circuit: Sequence[Head],
    prompt_sets: dict[str, Sequence[RetrievalPrompts]],
    induction: Sequence[Head],
    n_random: int,
    seed: int,
    progress: Progress | None = None,
) -> tuple[list[RetrievalClass], dict[str, float], Tensor]:
    """Each class (and `induction`) against `n_random` random same-layer sets, on the "discovery"
    batches of `prompt_sets` (the prompts that chose the heads, shown beside) and on its "heldout"
    batches (the figures reported, per stratum); the circuit's faithfulness on the held-out batches
    (see the module docstring), and their clean logit diffs [prompt], concatenated."""
    every_head = [(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    plans = {
        name: [heads, *random_same_layer_sets(model, heads, n_random, seed)]
        for name, heads in classes.items()
    }
    outside = sorted(set(every_head) - set(circuit))
    per_class = [tuple(sorted(heads)) for runs in plans.values() for heads in runs]
    held_sets = list(dict.fromkeys([(), tuple(outside), tuple(every_head), *per_class]))
    heldout = _ablated_runs(model, held_sets, prompt_sets["heldout"], "Held-out ablations", progress)
    found_sets = list(dict.fromkeys([(), *per_class]))
    found = _ablated_runs(model, found_sets, prompt_sets["discovery"], "Discovery ablations", progress)

    def drops(measured: dict[tuple[Head, ...], Tensor], heads: Sequence[Head]) -> Tensor:
        """[prompt] clean - ablated logit diff (EFFECT_SIGN)."""
        return measured[()] - measured[tuple(sorted(heads))]

    validations = []
    for name, (heads, *draws) in plans.items():
        random_drops = torch.stack([drops(heldout, draw) for draw in draws])  # [draw, prompt]
        on_heldout = beyond_random(drops(heldout, heads), random_drops, seed)
        on_discovery = beyond_random(
            drops(found, heads), torch.stack([drops(found, draw) for draw in draws]), seed
        )
        difference = drops(heldout, heads) - random_drops.mean(0)
        strata = stratum_drops(difference, _strata(prompt_sets["heldout"]), seed=seed)
        verdict = "unconfirmed"
        if on_heldout.verdict == "confirmed":
            verdict = "confirmed" if all(s.holds for s in strata) else "stratum-dependent"
        ablated = heldout[tuple(sorted(heads))]
        random_right = torch.stack([heldout[tuple(sorted(draw))] > 0 for draw in draws]).double()
        validations.append(
            RetrievalClass(
                name=name,
                heads=[head_label(*head) for head in heads],
                induction_overlap=[head_label(*head) for head in heads if head in set(induction)],
                discovery=on_discovery,
                heldout=on_heldout,
                note=held_out_note(on_discovery.beyond, on_heldout.beyond, on_heldout.beyond_ci),
                accuracy=(ablated > 0).double().mean().item(),
                random_accuracy=random_right.mean().item(),
                random_sets=[[head_label(*head) for head in draw] for draw in draws],
                strata=strata,
                verdict=verdict,
            )
        )
    clean, kept, nothing = heldout[()], heldout[tuple(outside)], heldout[tuple(every_head)]
    try:
        faithfulness = float(faithfulness_ratio(kept, clean, nothing))
    except ValueError:  # the model does as well with every head ablated
        faithfulness = float("nan")
    figures = {
        "faithfulness": faithfulness,
        "circuit_logit_diff": kept.mean().item(),
        "model_logit_diff": clean.mean().item(),
        "ablated_logit_diff": nothing.mean().item(),
        "circuit_accuracy": (kept > 0).double().mean().item(),
    }
    return validations, figures, clean


def find_retrieval_circuit(
    model: interp.HookedTransformer,
    *,
    n_prompts: int = 24,
    n_heldout: int = 24,
    n_exact: int = 12,
    n_random: int = 4,
    n_two_hop: int = 40,
    effect_z: float = 3.0,
    min_effect: float = 0.05,
    min_share: float = 0.1,
    min_attention: float = 0.1,
    heldout_facts: Sequence[int] = HELDOUT_FACT_COUNTS,
    heldout_relations: Sequence[str] = HELDOUT_RELATIONS,
    induction_heads: Sequence[Head] | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> RetrievalResult:
    """Find and validate the retrieval circuit of `model` (see the module docstring).

    n_prompts: discovery prompts (4 facts); n_heldout: held-out prompts per fact count and template;
    n_exact: senders path-patched exactly per step (the rest keep their EAP estimate); n_random:
    random same-layer sets per class; n_two_hop: two-hop prompts per query form (measured only);
    effect_z, min_effect, min_share: the selection (`circuits.ioi.evidence.select_heads`);
    min_attention: the least mean attention from END that puts a selected head in a class;
    heldout_facts: the held-out fact counts (each a stratum; 4 is the discovery prompts');
    heldout_relations: the relations held out (the family; every other relation of RELATIONS chooses);
    induction_heads: the class to compare with (default: `confirmed_induction_heads(model)`, cached).
    """
    counts = {"n_prompts": (n_prompts, 2), "n_heldout": (n_heldout, 2), "n_exact": (n_exact, 0)}
    counts |= {"n_random": (n_random, 1), "n_two_hop": (n_two_hop, 2)}
    for name, (value, low) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    timings: dict[str, float] = {}
    began = time.perf_counter()

    def stage(name: str) -> None:
        timings[name] = time.perf_counter() - began - sum(timings.values())

    if induction_heads is None:
        induction_heads = confirmed_induction_heads(model, progress=progress)
    induction_heads = [tuple(head) for head in induction_heads]
    stage("induction heads")
    if not heldout_facts:
        raise ValueError("heldout_facts is empty: give the held-out fact counts, e.g. (2, 3, 6, 8)")
    relations = split_families(list(RELATIONS), heldout=heldout_relations)
    discovery = make_retrieval_prompts(
        model, n_prompts, DISCOVERY_FACT_COUNTS[0], "discovery", seed, relations=relations.discovery,
        template=DISCOVERY_TEMPLATES[0],
    )  # fmt: skip
    heldout = [
        make_retrieval_prompts(
            model, n_heldout, n, "heldout", seed + 1, relations=relations.heldout, template=template
        )
        for n in heldout_facts
        for template in HELDOUT_TEMPLATES
    ]
    relations = FamilySplit(  # the relations this tokenizer could state
        tuple(dict.fromkeys(discovery.relation)), tuple(dict.fromkeys(r for p in heldout for r in p.relation))
    )
    question = make_retrieval_prompts(
        model, n_heldout, DISCOVERY_FACT_COUNTS[0], "discovery", seed + 2, "question", relations.discovery
    )
    two_hop = {
        form: make_two_hop_prompts(model, n_two_hop, 4, seed + 3, form) for form in ("statement", "question")
    }
    stage("prompts")

    if progress is not None:
        progress("Edge attribution (EAP)", 0, 1)
    tokens, corrupted = discovery.tokens.to(model.device), discovery.corrupted.to(model.device)
    end = discovery.positions["END"].to(model.device)
    scores = edges.edge_attribution_by_position(
        model, tokens, corrupted, discovery.logit_diff, {"END": end}, "eap", batch_size=8
    )["END"]
    if progress is not None:
        progress("Edge attribution (EAP)", 1, 1)
    stage("edge attribution")
    attention, direct = attention_and_direct(model, discovery)
    patcher = PathPatcher(model, tokens, corrupted, logit_pos=end)
    if progress is not None:
        progress("Path patching: heads -> logits", 0, 1)
    effects = {"logits": ranked_path_patching(model, discovery, patcher, scores, None, n_exact)}
    selected, _, _ = select_heads(effects["logits"], 1, effect_z, min_effect, min_share)
    found = classify(selected, "logits", effects["logits"], attention, direct, min_attention)
    stage("heads -> logits")
    receivers = [(h.layer, h.index) for h in found if h.cls is not None]
    if receivers and max(layer for layer, _ in receivers) > 0:
        if progress is not None:
            progress("Path patching: heads -> movers' queries", 0, 1)
        effects["mover_queries"] = ranked_path_patching(model, discovery, patcher, scores, receivers, n_exact)
        selected, _, _ = select_heads(effects["mover_queries"], 1, effect_z, min_effect, min_share)
        known = {(h.layer, h.index) for h in found}
        new = [head for head in selected if head not in known]
        found += classify(new, "mover_queries", effects["mover_queries"], attention, direct, min_attention)
    stage("heads -> queries")

    classes: dict[str, list[Head]] = {}
    for head in found:
        if head.cls is not None:
            classes.setdefault(head.cls, []).append((head.layer, head.index))
    circuit = sorted({head for heads in classes.values() for head in heads})
    tested = dict(classes)
    if induction_heads:
        tested["induction"] = list(induction_heads)
    validations, figures, heldout_clean = validate_classes(
        model, tested, circuit, {"discovery": [discovery], "heldout": heldout}, induction_heads, n_random,
        seed, progress,
    )  # fmt: skip
    stage("validation")

    facts = torch.cat([torch.full((len(p),), p.n_facts) for p in heldout])
    by_facts = [accuracy(f"held-out, {n} facts", heldout_clean[facts == n], n, seed) for n in heldout_facts]
    two_hop_accuracy = []
    for form, prompts in two_hop.items():
        with torch.no_grad():
            diffs = prompts.logit_diff(model(prompts.tokens.to(model.device))).float().cpu()
        two_hop_accuracy.append(accuracy(f"two-hop, {form}, 4 people", diffs, 4, seed))
    stage("accuracy")
    settings = {name: value for name, (value, _) in counts.items()}
    settings |= {"effect_z": effect_z, "min_effect": min_effect, "min_share": min_share}
    settings |= {"min_attention": min_attention}
    return RetrievalResult(
        model_name=model.cfg.model_name,
        provenance=interp.provenance(model),
        seed=seed,
        settings=settings,
        relations=relations,
        templates={"discovery": list(DISCOVERY_TEMPLATES), "heldout": list(HELDOUT_TEMPLATES)},
        discovery=accuracy("discovery, 4 facts", clean_logit_diffs(model, discovery), 4, seed),
        heldout=accuracy(f"held-out, {'/'.join(map(str, heldout_facts))} facts", heldout_clean, facts, seed),
        heldout_by_facts=by_facts,
        question=accuracy("question form, 4 facts", clean_logit_diffs(model, question), 4, seed),
        two_hop=two_hop_accuracy,
        effects=effects,
        heads=found,
        induction_heads=[head_label(*head) for head in induction_heads],
        classes=validations,
        timings=timings,
        **figures,
    )
