"""`find_retrieval_circuit`: the heads that retrieve a fact from context, found on discovery prompts
and tested on held-out ones (`interp.tasks.retrieval`).

The relation is the family (`circuits.evidence.split_families`): heads and thresholds are chosen on
the discovery relations only (discovery names, 4 facts), and every reported effect is measured on the
held-out relations (`HELDOUT_RELATIONS` by default), with other names, 2, 3, 6 and 8 facts and both
fact templates (one of them never seen in discovery). The corrupted prompts name a stranger in the
query (nothing to retrieve). The steps (`RetrievalSettings` holds their sizes and thresholds):
  0. prompts                  the relations split; discovery, held-out, question and two-hop prompts
  1. heads -> logits          each head's direct path patched from the corrupted run; edge
                              attribution (EAP) ranks every head, the `n_exact` first are
                              path-patched exactly (the others keep the estimate)
  2. heads -> movers' queries the same into the queries at END of step 1's classified heads
  3. validation               each class mean-ablated (per position, over the corrupted prompts of
                              its fact count and template) against random same-layer heads, per
                              prompt, pooled and per stratum (fact count, template, relation), beside
                              the same figure on the discovery prompts that chose the heads
                              (`circuits.evidence.judge_class`); the induction heads of
                              `interp heads` tested the same way; the circuit's faithfulness
                              (`faithfulness_ratio`) with every head outside it mean-ablated
  4. accuracy                 each prompt set's clean accuracy against chance (the question and
                              two-hop forms measured only)
Selected heads (a drop above zero that stands out: `circuits.evidence.select_heads`; every effect
has the sign of `circuits.evidence.EFFECT_SIGN`, drop = clean - patched or ablated, positive: the heads
help) are classed by where END attends, among the queried fact's name ("mention"), its value
("mover", which must also write the answer: positive direct logit attribution) and the query's name
("query").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

import interp
from circuits.evidence import (
    FamilySplit,
    HeadClass,
    head_class,
    judge_class,
    label_strata,
    mean_ci,
    select_heads,
    split_families,
)
from circuits.heads.cache import confirmed_induction_heads
from circuits.retrieval.results import (
    RetrievalAccuracy,
    RetrievalClass,
    RetrievalHead,
    RetrievalResult,
)
from interp import edges
from interp.interventions.ablation import Ablation, Replacement, ablated_metrics
from interp.interventions.engine import forward_logits
from interp.interventions.path_patching import PathPatcher
from interp.interventions.stats import faithfulness_ratio
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
from interp.types import Head, Progress, head_label

ATTENTION_TARGETS = {"VALUE": "mover", "NAME": "mention", "QUERY": "query"}
# The stages find_retrieval_circuit reports after the induction heads (circuits.heads.cache), in order
# ("Path patching: heads -> ..." are stages of "Path patching").
RETRIEVAL_STAGES = ("Edge attribution (EAP)", "Path patching", "Held-out ablations")
COUNT_MINIMUMS = {"n_prompts": 2, "n_heldout": 2, "n_exact": 0, "n_random": 1, "n_two_hop": 2}


@dataclass(frozen=True, kw_only=True)
class RetrievalSettings:
    """The sizes and choices of `find_retrieval_circuit` (see the module docstring).

    n_prompts: discovery prompts (4 facts); n_heldout: held-out prompts per fact count and template;
    n_exact: senders path-patched exactly per step (the rest keep their EAP estimate); n_random:
    random same-layer sets per class; n_two_hop: two-hop prompts per query form (measured only);
    effect_z, min_effect, min_share: the selection (`circuits.evidence.select_heads`);
    min_attention: the least mean attention from END that puts a selected head in a class;
    heldout_facts: the held-out fact counts (each a stratum; 4 is the discovery prompts');
    heldout_relations: the relations held out (the family; every other relation of RELATIONS chooses);
    seed: the prompts, the random sets and the bootstrap.
    """

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

    def recorded(self) -> dict[str, float | int]:
        """The sizes and thresholds a result records (`RetrievalResult.settings`)."""
        names = [*COUNT_MINIMUMS, "effect_z", "min_effect", "min_share", "min_attention"]
        return {name: getattr(self, name) for name in names}


@dataclass(frozen=True, kw_only=True)
class RetrievalPromptSets:
    """The finder's prompts: `discovery` (4 facts, the discovery relations and template), `heldout`
    (a batch per held-out fact count and template, the held-out relations), `question` and
    `two_hop` (form -> prompts; both measured only), and the relations each side could state."""

    discovery: RetrievalPrompts
    heldout: list[RetrievalPrompts]
    question: RetrievalPrompts
    two_hop: dict[str, RetrievalPrompts]
    relations: FamilySplit


@dataclass(frozen=True, kw_only=True)
class DiscoveryEvidence:
    """What both path-patching steps read on the discovery prompts: the EAP scores that rank the
    senders, the patcher of the clean and corrupted runs, and `attention_and_direct`'s figures."""

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
        prompts=description,
        n_prompts=len(diffs),
        accuracy=right.mean().item(),
        ci=mean_ci(right, seed),
        chance=float(chance),
        logit_diff=diffs.mean().item(),
    )


@torch.no_grad()
def clean_logit_diffs(model: interp.HookedTransformer, prompts: RetrievalPrompts) -> Tensor:
    """[batch] the clean run's logit diffs (logits; made only at the last position, which they read)."""
    return prompts.logit_diff(forward_logits(model, prompts.tokens.to(model.device), -1)).float().cpu()


@torch.no_grad()
def attention_and_direct(
    model: interp.HookedTransformer, prompts: RetrievalPrompts
) -> tuple[dict[str, Tensor], Tensor]:
    """({"VALUE", "NAME", "QUERY"} -> [layer, head] mean attention from END to that position, [layer,
    head] mean direct logit attribution at END on the direction W_U[answer] - W_U[best other
    candidate], through the final norm (and a post-norm model's ln1_post) at its scale in the run)."""
    cfg = model.cfg
    final = interp.act_name("resid_post", cfg.n_layers - 1)
    names = [
        *model.layer_hook_names("pattern"),
        *model.head_contribution_hook_names(),
        interp.act_name("scale"),
        final,
    ]
    tokens = prompts.tokens.to(model.device)
    _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    rows = torch.arange(len(prompts), device=model.device)
    end = prompts.positions["END"].to(model.device)
    logits = forward_logits(model, cache[final], end, start_at_layer=cfg.n_layers)  # at END only
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
    mean = Ablation("mean", reference=prompts.corrupted.to(model.device))
    replacement = Replacement(model, model.layer_hook_names("z"), mean)
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


DEPENDENT_KINDS = {"facts": "all", "template": "all", "relation": "all"}  # the verdict's strata


def _class_check(
    found: HeadClass,
    ablated: dict[str, dict[tuple[Head, ...], Tensor]],
    heldout: Sequence[RetrievalPrompts],
    induction: Sequence[Head],
    seed: int,
) -> RetrievalClass:
    """One class against its random same-layer sets (`circuits.evidence.judge_class`): `ablated` holds
    "heldout" and "discovery" head set -> [prompt] ablated logit diffs, () the clean run's; strata of
    the `heldout` batches."""

    def drops(side: str) -> Tensor:
        """[1 + draws, prompt] clean - ablated logit diff (EFFECT_SIGN), the class first."""
        return torch.stack([ablated[side][()] - ablated[side][tuple(sorted(heads))] for heads in found.sets])

    verdict = judge_class(
        found, drops("heldout"), discovery=drops("discovery"), strata=_strata(heldout),
        dependent_kinds=DEPENDENT_KINDS, seed=seed,
    )  # fmt: skip
    measured = ablated["heldout"]
    random_right = torch.stack([measured[tuple(sorted(draw))] > 0 for draw in found.draws]).double()
    return RetrievalClass(
        name=found.name,
        heads=verdict.heads,
        induction_overlap=[head_label(*head) for head in found.heads if head in set(induction)],
        discovery=verdict.discovery,
        heldout=verdict.heldout,
        note=verdict.note,
        accuracy=(measured[tuple(sorted(found.heads))] > 0).double().mean().item(),
        random_accuracy=random_right.mean().item(),
        random_sets=verdict.random_sets,
        strata=verdict.strata,
        verdict=verdict.verdict,
    )


def _faithfulness_figures(clean: Tensor, kept: Tensor, nothing: Tensor) -> dict[str, float]:
    """The circuit's figures from [prompt] logit diffs: clean, with only the circuit kept, with every
    head ablated."""
    try:
        faithfulness = float(faithfulness_ratio(kept, clean, nothing))
    except ValueError:  # the model does as well with every head ablated
        faithfulness = float("nan")
    return {
        "faithfulness": faithfulness,
        "circuit_logit_diff": kept.mean().item(),
        "model_logit_diff": clean.mean().item(),
        "ablated_logit_diff": nothing.mean().item(),
        "circuit_accuracy": (kept > 0).double().mean().item(),
    }


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
    found = [head_class(model, name, heads, n_random, seed) for name, heads in classes.items()]
    outside = sorted(set(every_head) - set(circuit))
    per_class = [tuple(sorted(heads)) for each in found for heads in each.sets]
    held_sets = list(dict.fromkeys([(), tuple(outside), tuple(every_head), *per_class]))
    found_sets = list(dict.fromkeys([(), *per_class]))
    ablated = {
        "heldout": _ablated_runs(model, held_sets, prompt_sets["heldout"], "Held-out ablations", progress),
        "discovery": _ablated_runs(
            model, found_sets, prompt_sets["discovery"], "Discovery ablations", progress
        ),
    }
    validations = [_class_check(each, ablated, prompt_sets["heldout"], induction, seed) for each in found]
    heldout = ablated["heldout"]
    clean = heldout[()]
    return (
        validations,
        _faithfulness_figures(clean, heldout[tuple(outside)], heldout[tuple(every_head)]),
        clean,
    )


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
    if progress is not None:
        progress("Edge attribution (EAP)", 0, 1)
    tokens, corrupted = discovery.tokens.to(model.device), discovery.corrupted.to(model.device)
    end = {"END": discovery.positions["END"].to(model.device)}
    scores = edges.edge_attribution_by_position(
        model, tokens, corrupted, discovery.logit_diff, end, "eap", batch_size=8
    )["END"]
    if progress is not None:
        progress("Edge attribution (EAP)", 1, 1)
    return scores


def discovery_evidence(
    model: interp.HookedTransformer, discovery: RetrievalPrompts, scores: edges.EdgeScores
) -> DiscoveryEvidence:
    """The EAP `scores`, END's attention and the heads' direct logit attribution, and the patcher
    both path-patching steps share."""
    attention, direct = attention_and_direct(model, discovery)
    tokens, corrupted = discovery.tokens.to(model.device), discovery.corrupted.to(model.device)
    patcher = PathPatcher(model, tokens, corrupted, logit_pos=discovery.positions["END"].to(model.device))
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
    """([layer, head] each sender's drop into `receivers` (None: the logits), the selected heads
    classified) of one step of the walk back from the logits."""
    effects = ranked_path_patching(
        model, evidence.prompts, evidence.patcher, evidence.scores, receivers, settings.n_exact
    )
    selected, _, _ = select_heads(effects, 1, settings.effect_z, settings.min_effect, settings.min_share)
    classified = classify(
        selected, sweep, effects, evidence.attention, evidence.direct, settings.min_attention
    )
    return effects, classified


def heads_into_queries(
    model: interp.HookedTransformer,
    evidence: DiscoveryEvidence,
    found: list[RetrievalHead],
    settings: RetrievalSettings,
    progress: Progress | None,
) -> tuple[Tensor | None, list[RetrievalHead]]:
    """Step 2: the heads into the queries at END of step 1's classified heads (None and no heads
    where those sit in layer 0 or none was classified); heads step 1 found are not classified again."""
    receivers = [(h.layer, h.index) for h in found if h.cls is not None]
    if not receivers or max(layer for layer, _ in receivers) == 0:
        return None, []
    if progress is not None:
        progress("Path patching: heads -> movers' queries", 0, 1)
    effects, classified = path_patching_step(model, evidence, receivers, "mover_queries", settings)
    known = {(h.layer, h.index) for h in found}
    return effects, [h for h in classified if (h.layer, h.index) not in known]


def head_classes(found: Sequence[RetrievalHead]) -> dict[str, list[Head]]:
    """Class -> its heads, in the order found (unclassified heads left out)."""
    classes: dict[str, list[Head]] = {}
    for head in found:
        if head.cls is not None:
            classes.setdefault(head.cls, []).append((head.layer, head.index))
    return classes


def accuracies(
    model: interp.HookedTransformer,
    prompts: RetrievalPromptSets,
    heldout_clean: Tensor,
    settings: RetrievalSettings,
) -> dict[str, RetrievalAccuracy | list[RetrievalAccuracy]]:
    """Step 4: the clean accuracy of each prompt set against chance (`RetrievalResult`'s fields);
    heldout_clean: [prompt] the held-out batches' clean logit diffs, concatenated."""
    seed, heldout_facts = settings.seed, settings.heldout_facts
    facts = torch.cat([torch.full((len(p),), p.n_facts) for p in prompts.heldout])
    return {
        "discovery": accuracy("discovery, 4 facts", clean_logit_diffs(model, prompts.discovery), 4, seed),
        "heldout": accuracy(
            f"held-out, {'/'.join(map(str, heldout_facts))} facts", heldout_clean, facts, seed
        ),
        "heldout_by_facts": [
            accuracy(f"held-out, {n} facts", heldout_clean[facts == n], n, seed) for n in heldout_facts
        ],
        "question": accuracy("question form, 4 facts", clean_logit_diffs(model, prompts.question), 4, seed),
        "two_hop": [
            accuracy(f"two-hop, {form}, 4 people", clean_logit_diffs(model, hop_prompts), 4, seed)
            for form, hop_prompts in prompts.two_hop.items()
        ],
    }


def find_retrieval_circuit(
    model: interp.HookedTransformer,
    settings: RetrievalSettings = RetrievalSettings(),
    *,
    induction_heads: Sequence[Head] | None = None,
    progress: Progress | None = None,
) -> RetrievalResult:
    """Find and validate the retrieval circuit of `model` (see the module docstring), with the sizes
    and thresholds of `settings`. induction_heads: the class to compare with (default:
    `confirmed_induction_heads(model)`, cached)."""
    timings: dict[str, float] = {}
    began = time.perf_counter()

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
    if progress is not None:  # 1. heads -> logits
        progress("Path patching: heads -> logits", 0, 1)
    evidence = discovery_evidence(model, prompts.discovery, scores)
    effects, found = path_patching_step(model, evidence, None, "logits", settings)
    effects = {"logits": effects}
    stage("heads -> logits")
    into_queries, new = heads_into_queries(model, evidence, found, settings, progress)  # 2.
    if into_queries is not None:
        effects["mover_queries"] = into_queries
    found += new
    stage("heads -> queries")
    classes = head_classes(found)  # 3. each class and the induction heads on held-out prompts
    circuit = sorted({head for heads in classes.values() for head in heads})
    tested = classes | ({"induction": list(induction_heads)} if induction_heads else {})
    validations, figures, heldout_clean = validate_classes(
        model, tested, circuit, {"discovery": [prompts.discovery], "heldout": prompts.heldout},
        induction_heads, settings.n_random, settings.seed, progress,
    )  # fmt: skip
    stage("validation")
    measured = accuracies(model, prompts, heldout_clean, settings)  # 4. accuracy
    stage("accuracy")
    return RetrievalResult(
        model_name=model.cfg.model_name,
        provenance=interp.provenance(model),
        attribution=direct_attribution_linearisation(model.cfg),
        seed=settings.seed,
        settings=settings.recorded(),
        relations=prompts.relations,
        templates={"discovery": list(DISCOVERY_TEMPLATES), "heldout": list(HELDOUT_TEMPLATES)},
        effects=effects,
        heads=found,
        induction_heads=[head_label(*head) for head in induction_heads],
        classes=validations,
        timings=timings,
        **measured,
        **figures,
    )
