"""`find_retrieval_circuit`: the heads that retrieve a fact from context (`interp.tasks.retrieval`).

The relation is the family (`circuits.evidence.split_families`): heads and thresholds are chosen on
discovery relations (discovery names, 4 facts, one template); every reported effect is measured on
held-out relations, names and fact counts, in the discovery template and a held-out one (reported per
template: only the held-out one's stratum is new in form). Corrupted prompts name a stranger in the query.
Steps: 0 prompts; 1 heads -> logits and 2 heads -> the queries at END of the heads step 1 classified
(every class's, the movers' and the others'; the sweep "mover_queries") (EAP ranks the senders,
the `n_exact` first and every one estimated at least half of `min_effect` are path-patched exactly,
and only these can be selected); 3 each class (and the induction heads of `interp heads`)
mean-ablated against random same-layer heads (`circuits.evidence.judge_class`), with the circuit's
faithfulness (`evidence.held_out_faithfulness`); 4 each prompt set's accuracy against chance. The result is a
`circuits.finding.Finding` whose extras are `RetrievalFigures`. Effects are drops (`EFFECT_SIGN`, logits).
Selected heads (`select_heads`) are classed by where END attends: the queried name's mention
("mention"), its value ("mover", which must also write the answer: direct attribution > 0) or the
query's name ("query").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

import interp
from circuits.discovery import eap_drops, end_logits_and_cache, exact_candidates
from circuits.evidence import (
    ClassVerdict,
    FamilySplit,
    HeadClass,
    Strata,
    every_head,
    head_class,
    head_labels,
    held_out_faithfulness,
    judge_class,
    label_strata,
    mean_ci,
    select_heads,
    split_families,
    unclaimed_heads,
)
from circuits.finding import Finding
from circuits.heads.cache import confirmed_induction_heads
from circuits.retrieval.results import ATTENTION_TARGETS, RetrievalAccuracy, RetrievalFigures, RetrievalHead
from interp import edges
from interp.interventions.ablation import Ablation, Replacement, ablated_metrics
from interp.interventions.engine import RunOptions, forward_logits
from interp.interventions.path_patching import PathPatcher
from interp.model.cache import direct_attribution_linearisation
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
from interp.types import Head, Progress, counted, head_label

# The stages find_retrieval_circuit reports after the induction heads ("Path patching: heads -> ..." are
# stages of "Path patching").
RETRIEVAL_STAGES = ("Edge attribution (EAP)", "Path patching", "Ablations")  # parts: held-out, discovery
COUNT_MINIMUMS = {"n_prompts": 2, "n_heldout": 2, "n_exact": 0, "n_random": 1, "n_two_hop": 2}


def _quiet(stage: str, done: int, total: int) -> None:
    """The progress callback of a run without one."""


@dataclass(frozen=True, kw_only=True)
class RetrievalSettings:
    """The sizes and thresholds of `find_retrieval_circuit` (as `interp retrieval`'s options). n_exact:
    senders path-patched exactly per step, besides every one EAP estimates at min_effect / 2 or more;
    effect_z, min_effect, min_share: `select_heads`; min_attention: the least attention from END that
    classes a head; seed: the prompts, the random sets and the bootstrap."""

    n_prompts: int = 24
    n_heldout: int = 24
    n_exact: int = 12
    n_random: int = 4
    n_two_hop: int = 40
    effect_z: float = 3.0
    min_effect: float = 0.05
    min_share: float = 0.1
    min_attention: float = 0.1
    heldout_facts: Sequence[int] = HELDOUT_FACT_COUNTS
    heldout_relations: Sequence[str] = HELDOUT_RELATIONS
    seed: int = 0

    def __post_init__(self) -> None:
        for name, low in COUNT_MINIMUMS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not self.heldout_facts:
            raise ValueError("heldout_facts is empty: give the held-out fact counts, e.g. (2, 3, 6, 8)")
        counts = list(self.heldout_facts)
        if len(set(counts)) < len(counts) or not all(isinstance(n, int) and 2 <= n <= 8 for n in counts):
            raise ValueError(
                f"heldout_facts must be distinct fact counts in 2..8, got {counts}: a count given twice "
                "draws the same prompts twice (twice the prompts, half the CI's width)"
            )

    def recorded(self) -> dict[str, float | int]:
        """The sizes and thresholds `interp retrieval --save` records with its options."""
        names = [*COUNT_MINIMUMS, "effect_z", "min_effect", "min_share", "min_attention"]
        return {name: getattr(self, name) for name in names}


@dataclass(frozen=True, kw_only=True)
class RetrievalPromptSets:
    """discovery (4 facts); heldout: a batch per held-out fact count and template; question and
    two_hop (form -> prompts): measured only; relations: those each side could state."""

    discovery: RetrievalPrompts
    heldout: list[RetrievalPrompts]
    question: RetrievalPrompts
    two_hop: dict[str, RetrievalPrompts]
    relations: FamilySplit


@dataclass(frozen=True, kw_only=True)
class DiscoveryEvidence:
    """What both path-patching steps read on the discovery prompts (`attention_and_direct`'s figures)."""

    prompts: RetrievalPrompts
    scores: edges.EdgeScores
    patcher: PathPatcher
    attention: dict[str, Tensor]
    direct: Tensor


def accuracy(description: str, diffs: Tensor, n_candidates: Tensor | int, seed: int = 0) -> RetrievalAccuracy:
    """Accuracy (logit diff > 0: the answer first among the candidates) of per-prompt logit diffs
    [batch] with its bootstrap CI; chance is the mean of 1 / candidates."""
    right = (diffs > 0).double()
    chance = (1 / torch.as_tensor(n_candidates, dtype=torch.float64)).mean()
    return RetrievalAccuracy(
        prompts=description, n_prompts=len(diffs), accuracy=right.mean().item(), ci=mean_ci(right, seed),
        chance=float(chance), logit_diff=diffs.mean().item(),
    )  # fmt: skip


@torch.no_grad()
def attention_and_direct(
    model: interp.HookedTransformer, prompts: RetrievalPrompts
) -> tuple[dict[str, Tensor], Tensor]:
    """({"VALUE", "NAME", "QUERY"} -> [layer, head] mean attention from END there, [layer, head] mean
    direct logit attribution at END along W_U[answer] - W_U[best other candidate], through the final
    norm at its scale in the run)."""
    cfg = model.cfg
    logits, cache = end_logits_and_cache(model, prompts)  # logits at END only
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
    stack = cache.stack_head_contributions(pos=end, apply_ln=True)  # [layer * head, batch, d_model]
    direct = (stack * direction).sum(-1).mean(-1).view(cfg.n_layers, cfg.n_heads).float().cpu()
    return attention, direct


def _fact_counts(batches: Sequence[RetrievalPrompts]) -> Tensor:
    """[prompt] each prompt's fact count, the batches concatenated."""
    return torch.cat([torch.full((len(p),), p.n_facts) for p in batches])


def _relations(batches: Sequence[RetrievalPrompts]) -> list[str]:
    """[prompt] each prompt's relation, the batches concatenated: the families the CIs resample."""
    return [relation for p in batches for relation in p.relation]


def _strata(heldout: Sequence[RetrievalPrompts]) -> list[tuple[str, str, Tensor]]:
    """The held-out prompts (batches concatenated) by fact count, template and relation."""
    facts = _fact_counts(heldout)
    templates = [f"template {p.template}" for p in heldout for _ in range(len(p))]
    relations = _relations(heldout)
    by_facts = [("facts", f"{n} facts", facts == n) for n in facts.unique().tolist()]
    return by_facts + label_strata("template", templates) + label_strata("relation", relations)


def _ablated_runs(
    model: interp.HookedTransformer,
    head_sets: Sequence[tuple[Head, ...]],
    batches: Sequence[RetrievalPrompts],
    stage: str,
    progress: Progress | None,
) -> dict[tuple[Head, ...], Tensor]:
    """head set -> [prompt] the logit diffs with it mean-ablated (per position, over the prompts'
    corrupted runs), the batches concatenated."""
    parts = []
    for prompts in counted(batches, progress, stage):
        mean = Ablation("mean", reference=prompts.corrupted.to(model.device))
        replacement = Replacement(model, model.layer_hook_names("z"), mean)
        end, candidates = prompts.positions["END"].to(model.device), prompts.candidates.to(model.device)
        with torch.no_grad():
            values = ablated_metrics(
                model, prompts.tokens.to(model.device), prompts.logit_diff, head_sets, replacement,
                options=RunOptions(logit_pos=end, logit_tokens=candidates),
            )  # fmt: skip
        parts.append(values.float().cpu())
    return dict(zip(head_sets, torch.cat(parts, 1), strict=True))


DEPENDENT_KINDS = {"facts": "all", "template": "all", "relation": "all"}  # the verdict's strata


def _judged(
    found: HeadClass,
    ablated: dict[str, dict[tuple[Head, ...], Tensor]],
    strata: list[tuple[str, str, Tensor]],
    induction: Sequence[Head],
    seed: int,
    relations: Sequence[str],
) -> ClassVerdict:
    """One class judged against its random sets (`judge_class`; the held-out `relations` [prompt] its
    families), with its details (`RetrievalFigures`); `ablated`: "heldout" and "discovery" head set ->
    [prompt] ablated logit diffs, () the clean run's."""

    def drops(side: str) -> Tensor:  # [1 + draws, prompt] clean - ablated, the class first
        return torch.stack([ablated[side][()] - ablated[side][tuple(sorted(heads))] for heads in found.sets])

    verdict = judge_class(
        found, drops("heldout"), discovery=drops("discovery"),
        strata=Strata(strata, DEPENDENT_KINDS, families=relations), seed=seed,
    )  # fmt: skip
    measured = ablated["heldout"]
    random_right = torch.stack([measured[tuple(sorted(draw))] > 0 for draw in found.draws]).double()
    verdict.details = {
        "induction_overlap": head_labels([head for head in found.heads if head in set(induction)]),
        "accuracy": (measured[tuple(sorted(found.heads))] > 0).double().mean().item(),
        "random_accuracy": random_right.mean().item(),
    }
    return verdict


def validate_classes(
    model: interp.HookedTransformer,
    classes: dict[str, list[Head]],
    circuit: Sequence[Head],
    prompt_sets: dict[str, Sequence[RetrievalPrompts]],
    induction: Sequence[Head],
    n_random: int,
    seed: int,
    progress: Progress | None = None,
) -> tuple[list[ClassVerdict], dict[str, Tensor]]:
    """Step 3: each class against `n_random` random same-layer sets on the "discovery" and "heldout"
    batches of `prompt_sets`; the held-out batches' logit diffs [prompt] (concatenated) of the model
    ("model"), of the circuit alone (every head outside it mean-ablated: "circuit") and with every head
    mean-ablated ("ablated")."""
    every = every_head(model)
    unclaimed = unclaimed_heads(model, classes.values())
    found = [
        head_class(model, name, heads, n_random, seed, outside=unclaimed) for name, heads in classes.items()
    ]
    outside = tuple(unclaimed_heads(model, [circuit]))
    per_class = [tuple(sorted(heads)) for each in found for heads in each.sets]
    tested = list(dict.fromkeys([(), outside, tuple(every), *per_class]))  # on held-out prompts
    chose = list(dict.fromkeys([(), *per_class]))  # on the discovery prompts
    ablated = {  # progress: parts of the stage "Ablations"
        group: _ablated_runs(model, sets, prompt_sets[group], f"Ablations: {name} prompts", progress)
        for group, name, sets in (("heldout", "held-out", tested), ("discovery", "discovery", chose))
    }
    strata = _strata(prompt_sets["heldout"])
    relations = _relations(prompt_sets["heldout"])
    validations = [_judged(each, ablated, strata, induction, seed, relations) for each in found]
    runs = {"model": (), "circuit": outside, "ablated": tuple(every)}
    return validations, {name: ablated["heldout"][heads] for name, heads in runs.items()}


def make_prompt_sets(model: interp.HookedTransformer, settings: RetrievalSettings) -> RetrievalPromptSets:
    """Step 0: the relations split into discovery and held-out (`split_families`), and every prompt."""
    seed = settings.seed
    relations = split_families(list(RELATIONS), heldout=settings.heldout_relations)
    discovery = make_retrieval_prompts(
        model, settings.n_prompts, DISCOVERY_FACT_COUNTS[0], "discovery", seed,
        relations=relations.discovery, template=DISCOVERY_TEMPLATES[0],
    )  # fmt: skip
    heldout = [
        make_retrieval_prompts(
            model, settings.n_heldout, n, "heldout", seed + 1, relations=relations.heldout, template=template
        )
        for n in settings.heldout_facts
        for template in HELDOUT_TEMPLATES
    ]
    relations = FamilySplit(  # the relations this tokenizer could state
        tuple(dict.fromkeys(discovery.relation)), tuple(dict.fromkeys(r for p in heldout for r in p.relation))
    )
    question = make_retrieval_prompts(
        model, settings.n_heldout, DISCOVERY_FACT_COUNTS[0], "discovery", seed + 2, "question",
        relations.discovery,
    )  # fmt: skip
    two_hop = {
        form: make_two_hop_prompts(model, settings.n_two_hop, 4, seed + 3, form)
        for form in ("statement", "question")
    }
    return RetrievalPromptSets(
        discovery=discovery, heldout=heldout, question=question, two_hop=two_hop, relations=relations
    )


def edge_scores(
    model: interp.HookedTransformer, discovery: RetrievalPrompts, progress: Progress | None
) -> edges.EdgeScores:
    """Edge attribution (EAP) of the discovery prompts at END: what ranks each step's senders."""
    say = progress or _quiet
    say("Edge attribution (EAP)", 0, 1)
    tokens, corrupted = discovery.tokens.to(model.device), discovery.corrupted.to(model.device)
    end = {"END": discovery.positions["END"].to(model.device)}
    scores = edges.edge_attribution_by_position(
        model, tokens, corrupted, discovery.logit_diff, end, "eap", batch_size=8
    )["END"]
    say("Edge attribution (EAP)", 1, 1)
    return scores


def discovery_evidence(
    model: interp.HookedTransformer, discovery: RetrievalPrompts, scores: edges.EdgeScores
) -> DiscoveryEvidence:
    """The EAP `scores`, END's attention, the heads' direct attribution, the patcher both steps share."""
    attention, direct = attention_and_direct(model, discovery)
    tokens, corrupted = discovery.tokens.to(model.device), discovery.corrupted.to(model.device)
    end, candidates = discovery.positions["END"].to(model.device), discovery.candidates.to(model.device)
    options = RunOptions(logit_pos=end, logit_tokens=candidates)
    patcher = PathPatcher(model, tokens, corrupted, options)
    return DiscoveryEvidence(
        prompts=discovery, scores=scores, patcher=patcher, attention=attention, direct=direct
    )


def path_patching_step(
    model: interp.HookedTransformer,
    evidence: DiscoveryEvidence,
    receivers: Sequence[Head] | None,
    sweep: str,
    settings: RetrievalSettings,
) -> tuple[Tensor, list[RetrievalHead]]:
    """One step back from the logits: ([layer, head] drop of the mean logit diff (clean - patched,
    logits) when each head's path to `receivers` (queries at END; None: the logits) is patched, the
    selected heads). Exact for `exact_candidates`, EAP's estimate for the other senders (never
    selected), NaN for non-senders. A selected head's class: where END attends most, if at least
    `min_attention` (a mover must also have direct attribution > 0)."""
    prompts = evidence.prompts
    senders = [head for head in every_head(model, receivers) if head not in (receivers or [])]
    readers = ["logits"] if receivers is None else [f"a{layer}.h{head}<q>" for layer, head in receivers]
    effects = eap_drops(model, evidence.scores, senders, readers)
    exact = exact_candidates(effects, senders, settings.n_exact, settings.min_effect / 2)
    if exact:
        patched = evidence.patcher(
            prompts.logit_diff,
            receivers="logits" if receivers is None else [(layer, head, "q") for layer, head in receivers],
            senders=exact,
            receiver_pos=None if receivers is None else prompts.positions["END"].to(model.device),
        )
        drop = patched.target.mean() - patched.values.mean(-1)
        for head, value in zip(exact, drop.tolist(), strict=True):
            effects[head] = value
    selected, _, _ = select_heads(effects, 1, settings.effect_z, settings.min_effect, settings.min_share)
    found = []
    for layer, head in selected:
        shares = {target: float(values[layer, head]) for target, values in evidence.attention.items()}
        target = max(shares, key=shares.get)
        cls = ATTENTION_TARGETS[target]
        direct = float(evidence.direct[layer, head])
        if shares[target] < settings.min_attention or (cls == "mover" and direct <= 0):
            cls = None
        found.append(RetrievalHead(
            head=head_label(layer, head), layer=layer, index=head, sweep=sweep,
            effect=float(effects[layer, head]), attention=shares, direct=direct, cls=cls,
        ))  # fmt: skip
    return effects, found


def accuracies(
    model: interp.HookedTransformer,
    prompts: RetrievalPromptSets,
    heldout_clean: Tensor,
    settings: RetrievalSettings,
) -> dict[str, RetrievalAccuracy | list[RetrievalAccuracy]]:
    """Step 4: each prompt set's clean accuracy against chance (`RetrievalFigures`' fields);
    heldout_clean: [prompt] the held-out batches' clean logit diffs, concatenated."""
    seed, counts = settings.seed, settings.heldout_facts
    facts = _fact_counts(prompts.heldout)

    @torch.no_grad()
    def clean(description: str, some: RetrievalPrompts) -> RetrievalAccuracy:  # 4 candidates each
        logits = forward_logits(model, some.tokens.to(model.device), -1)  # at the last position only
        return accuracy(description, some.logit_diff(logits).float().cpu(), 4, seed)

    return {
        "discovery": clean("discovery, 4 facts", prompts.discovery),
        "heldout": accuracy(f"held-out, {'/'.join(map(str, counts))} facts", heldout_clean, facts, seed),
        "heldout_by_facts": [
            accuracy(f"held-out, {n} facts", heldout_clean[facts == n], n, seed) for n in counts
        ],
        "question": clean("question form, 4 facts", prompts.question),
        "two_hop": [clean(f"two-hop, {form}, 4 people", p) for form, p in prompts.two_hop.items()],
    }


def find_retrieval_circuit(
    model: interp.HookedTransformer,
    settings: RetrievalSettings = RetrievalSettings(),
    *,
    induction_heads: Sequence[Head] | None = None,
    progress: Progress | None = None,
) -> Finding:
    """The retrieval circuit of `model` as a Finding with `RetrievalFigures` (see the module docstring).
    induction_heads: the class to compare with (default: `confirmed_induction_heads(model)`, cached)."""
    timings: dict[str, float] = {}
    began, say = time.perf_counter(), progress or _quiet

    def stage(name: str) -> None:
        timings[name] = time.perf_counter() - began - sum(timings.values())

    if induction_heads is None:
        induction_heads = confirmed_induction_heads(model, progress=progress)
    induction_heads = [tuple(head) for head in induction_heads]
    stage("induction heads")
    prompts = make_prompt_sets(model, settings)  # 0. prompts
    stage("prompts")
    scores = edge_scores(model, prompts.discovery, progress)
    stage("edge attribution")
    say("Path patching: heads -> logits", 0, 1)  # 1. heads -> logits
    evidence = discovery_evidence(model, prompts.discovery, scores)
    logits, found = path_patching_step(model, evidence, None, "logits", settings)
    effects = {"logits": logits}
    stage("heads -> logits")
    receivers = [(h.layer, h.index) for h in found if h.cls is not None]  # 2. heads -> their queries at END
    if receivers and max(layer for layer, _ in receivers) > 0:
        say("Path patching: heads -> the classified heads' queries", 0, 1)
        effects["mover_queries"], into_queries = path_patching_step(
            model, evidence, receivers, "mover_queries", settings
        )
        known = {h.head for h in found}  # heads step 1 found are not classified again
        found += [h for h in into_queries if h.head not in known]
    stage("heads -> queries")
    classes: dict[str, list[Head]] = {}  # 3. each class (heads in the order found) and the induction heads
    for h in found:
        if h.cls is not None:
            classes.setdefault(h.cls, []).append((h.layer, h.index))
    circuit = sorted({head for heads in classes.values() for head in heads})
    tested = classes | ({"induction": list(induction_heads)} if induction_heads else {})
    validations, diffs = validate_classes(
        model, tested, circuit, {"discovery": [prompts.discovery], "heldout": prompts.heldout},
        induction_heads, settings.n_random, settings.seed, progress,
    )  # fmt: skip
    faithfulness, faithfulness_strata = held_out_faithfulness(
        diffs["circuit"], diffs["model"], diffs["ablated"], _strata(prompts.heldout), settings.seed,
        families=_relations(prompts.heldout),
    )  # fmt: skip
    stage("validation")
    measured = accuracies(model, prompts, diffs["model"], settings)  # 4. accuracy
    stage("accuracy")
    kept = diffs["circuit"]
    figures = RetrievalFigures(  # the means in float64, as the faithfulness beside them
        attribution=direct_attribution_linearisation(model.cfg),
        effects=effects,
        heads=found,
        induction_heads=head_labels(induction_heads),
        circuit_logit_diff=kept.double().mean().item(),
        model_logit_diff=diffs["model"].double().mean().item(),
        ablated_logit_diff=diffs["ablated"].double().mean().item(),
        circuit_accuracy=(kept > 0).double().mean().item(),
        **measured,
    )
    relations = prompts.relations
    return Finding(
        analysis="retrieval",
        model=model.cfg.model_name,
        provenance=interp.provenance(model),
        settings=settings,
        chose={"relations": list(relations.discovery), "templates": list(DISCOVERY_TEMPLATES)},
        tested={"relations": list(relations.heldout), "templates": list(HELDOUT_TEMPLATES)},
        classes=validations,
        faithfulness=faithfulness,
        faithfulness_strata=faithfulness_strata,
        timings=timings,
        extras=figures,
    )
