"""Discovering the IOI circuit (Wang et al. 2022) by path patching, and evaluating it.

    result = find_ioi_circuit(model, n_prompts=64, seed=0)
    result.circuit            # {"name_mover": [(9, 9), ...], "s_inhibition": [...], ...}
    result.to_json()

Discovery walks back from the logits, as the paper does. Every step path-patches each sender head's
output from the ABC run (three unrelated names) into the clean run, through one path only, and
measures the relative change of the logit difference logit(IO) - logit(S) at END:

  1. heads -> logits (direct path)                 : name movers (-), negative name movers (+),
                                                     S-suppression heads (-)
  2. heads -> name movers' queries at END,
     then heads -> S-suppression heads' queries   : S-inhibition heads (two sweeps: a head can be
                                                     both an S-suppression receiver and a sender)
  3. heads -> S-inhibition heads' values at S2     : induction and duplicate-token heads
  4. heads -> induction heads' keys at S1+1        : previous-token heads
  5. heads -> logits again, name movers mean-ablated: backup name movers (direct effect grows)

A head is selected when its effect, in the step's direction, is at least `min_effect` (relative
change) and either an outlier among all the senders of that step (robust z-score
(effect - median) / (1.4826 MAD) beyond `effect_z`) or at least `min_share` of the summed effect of
all senders in that direction (in a toy model with a few heads, which share the work, the median
and MAD are no reference for what is large). Each class is cross-checked with the attention
pattern the paper describes (name movers END->IO, S-inhibition END->S2, induction S2->S1+1,
duplicate-token S2->S1, previous-token S1+1->S1): the head's mean attention there must clear an
adaptive threshold too (median + `attention_z` robust SDs over all heads, at least
`min_attention`; `large_attention` always suffices). Heads with a causal effect but no matching
attention are reported as `unclassified`.

One class is not in the paper: S-suppression heads act directly on the logits like name movers but
attend END->S2 and write against S (copy suppression of the subject, the mirror image of the
negative name movers' suppression of IO). SmolLM2's strongest direct head is one, and toy models
trained on IOI solve it with them. A head may hold several roles: an S-suppression head that also
steers the name movers' queries is an S-inhibition head too.

Heads that act on the logits directly must also write the way their class says (direct logit
attribution at END through the final norm, mean over prompts): a name mover raises IO's logit, a
negative name mover lowers it, an S-suppression head lowers S's logit.

Validation on data the finder never saw (`validate_circuit`): held-out prompts from other templates
with other names, places and objects (circuits.ioi.dataset.HELDOUT_*; for toy models the toy
templates and names that discovery did not use). Per class, mean-ablating its heads is compared
with mean-ablating as many random heads from the same layers (outside the circuit), with a
bootstrap CI over prompts of the difference; a class is confirmed when that CI excludes zero in
the class's direction and its writers still write that way on the held-out prompts, else it is
reported as unconfirmed. The circuit's faithfulness is measured on the held-out prompts too.

Evaluation (the paper's section 4), with F(X) = mean logit difference when every head outside X is
mean-ablated (mean over the ABC distribution, per position):
  faithfulness  F(circuit) / F(model)
  completeness  for random subsets K of the circuit, |F(circuit \\ K) - F(model \\ K)| (small = complete)
  minimality    per head v, with K = the other heads of v's classes: F(C \\ K) - F(C \\ (K + v)),
                relative to F(C)

Path patching runs one patched forward pass per sender head, the cost of the whole discovery, so it
uses the first `n_patching_prompts` prompts; the baseline, attention and evaluation use all of them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

import interp
from circuits.ioi.dataset import TOY_IOI_MODEL, ioi_dataset_for
from interp import edges
from interp.interventions.ablation import Replacement, ablated_metrics, ablation_sites
from interp.interventions.engine import Site, forward_logits, site_mask
from interp.interventions.path_patching import path_patching
from interp.tasks import IOIPrompts

Head = tuple[int, int]  # (layer, head)

CLASSES = (
    "name_mover",
    "negative_name_mover",
    "s_inhibition",
    "s_suppression",
    "induction",
    "duplicate_token",
    "previous_token",
    "backup_name_mover",
)
# The attention each class shows in the paper: (query position, key position) of the IOI roles.
CLASS_ATTENTION = {
    "name_mover": ("END", "IO"),
    "negative_name_mover": ("END", "IO"),
    "backup_name_mover": ("END", "IO"),
    "s_inhibition": ("END", "S2"),
    "s_suppression": ("END", "S2"),
    "induction": ("S2", "S1+1"),
    "duplicate_token": ("S2", "S1"),
    "previous_token": ("S1+1", "S1"),
}
CLASS_KIND = {cls: "->".join(pair) for cls, pair in CLASS_ATTENTION.items()}  # "name_mover" -> "END->IO"
ATTENTION_KINDS = {"->".join(pair): pair for pair in CLASS_ATTENTION.values()}  # "END->IO" -> ("END", "IO")
# The paper's path-patching steps: (name, receiver classes, receiver input, receiver position).
STEPS = (
    ("logits", (), None, "END"),
    ("name_mover_queries", ("name_mover",), "q", "END"),
    ("s_suppression_queries", ("s_suppression",), "q", "END"),
    ("s_inhibition_values", ("s_inhibition",), "v", "S2"),
    ("induction_keys", ("induction",), "k", "S1+1"),
)


@dataclass
class Settings:
    """What the discovery was run with (all of it goes into the JSON report)."""

    model: str
    n_prompts: int
    seed: int
    corrupted: str = "ABC"
    n_patching_prompts: int = 16
    effect_z: float = 3.0
    min_effect: float = 0.02
    min_share: float = 0.1
    attention_z: float = 3.0
    min_attention: float = 0.1
    large_attention: float = 0.3
    n_bootstrap: int = 1000
    n_completeness_subsets: int = 10
    n_random_draws: int = 5  # random head sets per class in held-out validation
    # Path-patch only the senders edge attribution ranks first (0: every sender), and every sender
    # whose estimate is at least half of min_effect.
    exact_candidates: int = 16


@dataclass
class Baseline:
    """The model on the clean IOI prompts; *_ci are 95% bootstrap intervals over prompts."""

    logit_diff: float
    logit_diff_ci: tuple[float, float]
    accuracy: float  # fraction of prompts where logit(IO) > logit(S)
    accuracy_ci: tuple[float, float]
    top1_io: float  # fraction of prompts whose top prediction is IO
    abc_logit_diff: float  # the clean answers' logit diff on the ABC prompts
    n_prompts: int


@dataclass
class HeadEvidence:
    """One head in the circuit: why it was selected."""

    layer: int
    head: int
    effect: float  # relative change of the logit diff when its path is patched from ABC
    z: float  # robust z-score of `effect` among the step's senders
    step: str  # the path-patching step that found it
    attention: dict[str, float]  # mean attention for each of ATTENTION_KINDS
    direct_logit_attribution: dict[str, float]  # "IO", "S": mean direct effect on each logit at END

    @property
    def name(self) -> str:
        return f"{self.layer}.{self.head}"


@dataclass
class Evaluation:
    model_logit_diff: float  # F(model): no head ablated
    circuit_logit_diff: float  # F(circuit)
    ablated_logit_diff: float  # F(empty): every head mean-ablated
    faithfulness: float  # F(circuit) / F(model)
    faithfulness_with_unclassified: float | None  # the same with the unclassified heads kept too
    completeness: list[dict]  # per subset K: heads, circuit_logit_diff, model_logit_diff, gap
    completeness_max_gap: float  # max |F(C \ K) - F(M \ K)|, relative to F(model)
    minimality: dict[str, float]  # "L.H" -> (F(C \ K) - F(C \ (K + v))) / F(C)


@dataclass
class ClassValidation:
    """One class on held-out prompts. Effects are changes of the mean logit diff when heads are
    mean-ablated, relative to the size of the unablated held-out logit diff; sign: the class's
    direction. No class is confirmed where the model does not do IOI (held-out logit diff <= 0)."""

    heads: list[str]
    sign: int  # -1: ablating the class should lower the logit diff (+1: raise it)
    effect: float  # ablating the class
    random_effect: float  # ablating as many random heads from the same layers (mean over draws)
    difference: float  # effect - random_effect
    difference_ci: tuple[float, float]  # 95% bootstrap over prompts
    writes: dict[str, float] | None  # writer classes: mean direct logit attribution "IO", "S" on held-out
    confirmed: bool


@dataclass
class Validation:
    """The circuit on held-out prompts the finder never used (see the module docstring)."""

    prompts: str  # what was held out
    n_prompts: int
    logit_diff: float  # unablated
    faithfulness: float  # F(circuit) / F(model) on the held-out prompts
    faithfulness_ci: tuple[float, float]
    classes: dict[str, ClassValidation]  # non-empty classes only

    @property
    def unconfirmed(self) -> list[str]:
        return [name for name, found in self.classes.items() if not found.confirmed]


@dataclass
class ExamplePatterns:
    """tokens: [pos] strings of one clean prompt; patterns: "L.H" -> [query_pos, key_pos] attention."""

    tokens: list[str]
    patterns: dict[str, Tensor]


@dataclass
class IOICircuitResult:
    settings: Settings
    baseline: Baseline
    classes: dict[str, list[HeadEvidence]]  # class name -> heads, strongest effect first
    unclassified: list[HeadEvidence]  # causal outliers without the matching attention
    effects: dict[str, Tensor]  # step -> [layer, head] relative effects (NaN: not a sender)
    attention: dict[str, Tensor]  # kind -> [layer, head] mean attention on clean prompts
    thresholds: dict[str, dict[str, float]]  # step or attention kind -> threshold figures
    evaluation: Evaluation | None
    validation: Validation | None = None  # held-out confirmation of each class
    example: ExamplePatterns | None = None  # attention of the circuit's heads on one clean prompt
    timings: dict[str, float] = field(default_factory=dict)  # seconds per stage

    @property
    def circuit(self) -> dict[str, list[Head]]:
        return {name: [(h.layer, h.head) for h in heads] for name, heads in self.classes.items()}

    @property
    def heads(self) -> list[Head]:
        return sorted({head for heads in self.circuit.values() for head in heads})

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable summary (the `interp ioi --format json` output)."""
        return {
            "settings": asdict(self.settings),
            "logit_diff": self.baseline.logit_diff,
            "baseline": asdict(self.baseline),
            "circuit": {name: [list(head) for head in heads] for name, heads in self.circuit.items()},
            "heads": {name: [_evidence_json(h) for h in heads] for name, heads in self.classes.items()},
            "unclassified": [_evidence_json(h) for h in self.unclassified],
            "faithfulness": None if self.evaluation is None else self.evaluation.faithfulness,
            "evaluation": None if self.evaluation is None else asdict(self.evaluation),
            "validation": None if self.validation is None else asdict(self.validation),
            "thresholds": self.thresholds,
            "timings_s": self.timings,
        }


def _evidence_json(evidence: HeadEvidence) -> dict[str, Any]:
    return {**asdict(evidence), "name": evidence.name}


# ---------------------------------------------------------------------------------------------
# Baseline


def bootstrap_ci(values: Tensor, n_resamples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean of values [n]."""
    values = values.detach().float().cpu()
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(len(values), (n_resamples, len(values)), generator=generator)
    means = values[index].mean(1)  # [n_resamples]
    low, high = torch.quantile(means, torch.tensor([0.025, 0.975])).tolist()
    return low, high


@torch.no_grad()
def measure_baseline(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    n_bootstrap: int = 1000,
    seed: int = 0,
    clean_logits: Tensor | None = None,
) -> Baseline:
    """Logit difference and accuracy of the model on the clean prompts, with bootstrap intervals
    (clean_logits [batch, pos, d_vocab]: the clean run's, if it was run already)."""
    end = clean.positions["END"].to(model.device)
    if clean_logits is None:
        clean_logits = forward_logits(model, clean.tokens.to(model.device), end)  # logits at END only
    diffs = clean.logit_diff(clean_logits).cpu()  # [batch]
    correct = (diffs > 0).float()
    rows = torch.arange(len(clean), device=clean_logits.device)
    top1 = clean_logits[rows, end].argmax(-1).cpu() == clean.io_token
    abc_diffs = clean.logit_diff(forward_logits(model, abc.tokens.to(model.device), end)).cpu()
    return Baseline(
        logit_diff=diffs.mean().item(),
        logit_diff_ci=bootstrap_ci(diffs, n_bootstrap, seed),
        accuracy=correct.mean().item(),
        accuracy_ci=bootstrap_ci(correct, n_bootstrap, seed),
        top1_io=top1.float().mean().item(),
        abc_logit_diff=abc_diffs.mean().item(),
        n_prompts=len(clean),
    )


# ---------------------------------------------------------------------------------------------
# Attention evidence and thresholds


@torch.no_grad()
def clean_run(model: interp.HookedTransformer, prompts: IOIPrompts) -> tuple[Tensor, interp.ActivationCache]:
    """One run on `prompts` with what the discovery reads of it: logits and a cache of every
    layer's attention pattern and z and the final norm's scale."""
    names = [interp.act_name(kind, layer) for layer in range(model.cfg.n_layers) for kind in ("pattern", "z")]
    return model.run_with_cache(
        prompts.tokens.to(model.device), names_filter=names + [interp.act_name("scale")]
    )


@torch.no_grad()
def attention_evidence(
    model: interp.HookedTransformer, prompts: IOIPrompts, cache: interp.ActivationCache | None = None
) -> dict[str, Tensor]:
    """Mean attention of every head between IOI roles: kind ("END->IO", ...) -> [layer, head].
    cache: `clean_run(model, prompts)`'s, if it was run already."""
    if cache is None:
        names = [interp.act_name("pattern", layer) for layer in range(model.cfg.n_layers)]
        _, cache = model.run_with_cache(prompts.tokens.to(model.device), names_filter=names, return_type=None)
    rows = torch.arange(len(prompts))
    evidence = {}
    for kind, (query, key) in ATTENTION_KINDS.items():
        q, k = prompts.positions[query], prompts.positions[key]
        evidence[kind] = torch.stack(
            [cache["pattern", layer].cpu()[rows, :, q, k].mean(0) for layer in range(model.cfg.n_layers)]
        )  # [layer, head]
    return evidence


@torch.no_grad()
def direct_logit_attributions(
    model: interp.HookedTransformer, prompts: IOIPrompts, cache: interp.ActivationCache | None = None
) -> dict[str, Tensor]:
    """Each head's direct effect on the IO and S logits at END, through the final norm (its scale
    taken from the run): {"IO": [layer, head], "S": [layer, head]}, means over prompts.
    cache: `clean_run(model, prompts)`'s, if it was run already."""
    cfg = model.cfg
    if cache is None:
        names = [interp.act_name("z", layer) for layer in range(cfg.n_layers)] + [interp.act_name("scale")]
        _, cache = model.run_with_cache(prompts.tokens.to(model.device), names_filter=names)
    end = prompts.positions["END"].to(model.device)
    stack = cache.stack_head_results(pos=end, apply_ln=True)  # [layer * head, batch, d_model]
    attributions = {}
    for role, tokens in (("IO", prompts.io_token), ("S", prompts.s_token)):
        directions = model.W_U[:, tokens.to(model.device)].T  # [batch, d_model]
        per_prompt = (stack * directions).sum(-1)  # [layer * head, batch]
        attributions[role] = per_prompt.mean(-1).view(cfg.n_layers, cfg.n_heads).float().cpu()
    return attributions


HELDOUT_DESCRIPTION = {  # by whether the model is a toy IOI model
    False: "held-out templates, names, places and objects (circuits.ioi.dataset.HELDOUT_*)",
    True: "held-out toy templates and names (not used by discovery)",
}
# How each class that writes to the logits must write: (logit, sign of its direct attribution).
CLASS_WRITES = {
    "name_mover": ("IO", 1),
    "backup_name_mover": ("IO", 1),
    "negative_name_mover": ("IO", -1),
    "s_suppression": ("S", -1),
}


def median_mad(values: Tensor) -> tuple[Tensor, Tensor]:
    """Median and median absolute deviation of the finite entries of `values`."""
    finite = values[values.isfinite()]
    median = finite.median()
    return median, (finite - median).abs().median()


def robust_z(values: Tensor) -> Tensor:
    """(x - median) / (1.4826 MAD) over the finite entries; NaN stays NaN.

    1.4826 MAD estimates the standard deviation of normal data, and unlike it ignores the outliers
    we are looking for. A zero MAD (most values equal) falls back to the mean absolute deviation.
    """
    median, mad = median_mad(values)
    spread = 1.4826 * mad
    if spread <= 1e-12:
        finite = values[values.isfinite()]
        spread = (finite - median).abs().mean().clamp_min(1e-12)
    return (values - median) / spread


def attention_threshold(scores: Tensor, z: float, floor: float, ceiling: float) -> float:
    """Attention a head needs to count as showing a pattern: median + z robust SDs over all heads,
    at least `floor`; at most `ceiling` (a head that puts that much attention there shows it)."""
    median, mad = median_mad(scores)
    return min(max((median + z * 1.4826 * mad).item(), floor), max(ceiling, floor))


def select_heads(
    effects: Tensor, sign: int, effect_z: float, min_effect: float, min_share: float
) -> tuple[list[Head], Tensor, dict[str, float]]:
    """Heads whose effect [layer, head] in direction `sign` (-1: patching lowers the logit diff) is
    at least `min_effect` and either an outlier (robust z >= effect_z) or at least `min_share` of
    the summed effect of all heads in that direction. Returns the heads (strongest first), the
    robust z-scores and the threshold figures."""
    z = robust_z(effects)
    signed = (sign * effects).nan_to_num(nan=0.0)
    share = signed / signed.clamp_min(0).sum().clamp_min(1e-12)
    chosen = ((sign * z >= effect_z) | (share >= min_share)) & (signed >= min_effect)
    heads = [tuple(map(int, index)) for index in chosen.nonzero()]
    heads.sort(key=lambda head: -sign * effects[head].item())
    median, mad = median_mad(effects)
    figures = {
        "median": median.item(),
        "mad": mad.item(),
        "effect_z": effect_z,
        "min_effect": min_effect,
        "min_share": min_share,
    }
    return heads, z, figures


# ---------------------------------------------------------------------------------------------
# Discovery


def find_ioi_circuit(
    model: interp.HookedTransformer,
    n_prompts: int = 64,
    seed: int = 0,
    progress: bool = True,
    evaluate: bool = True,
    prompts: tuple[IOIPrompts, IOIPrompts] | None = None,
    heldout: tuple[IOIPrompts, IOIPrompts] | None = None,
    validate: bool = True,
    **thresholds: float,
) -> IOICircuitResult:
    """Find the IOI circuit of `model` by path patching from the logits backwards; see the module doc.

    prompts: (clean, abc) IOIPrompts to use instead of ioi_dataset_for(model, n_prompts, seed)
    (the paper's templates; the toy task's for a model trained by `interp train --task ioi`).
    heldout: (clean, abc) prompts the discovery never sees, to confirm each class on; default
    ioi_dataset_for(model, n_prompts, seed, "heldout") when `prompts` is None, else no validation.
    validate: False skips the held-out validation.
    thresholds: override Settings fields effect_z, min_effect, min_share, attention_z,
    min_attention, large_attention, n_bootstrap, n_completeness_subsets.
    """
    unknown = set(thresholds) - (
        set(Settings.__dataclass_fields__) - {"model", "n_prompts", "seed", "corrupted"}
    )
    if unknown:
        raise ValueError(
            f"unknown settings {sorted(unknown)}; choose from effect_z, min_effect, min_share, "
            "attention_z, min_attention, large_attention, n_bootstrap, n_completeness_subsets, "
            "n_random_draws"
        )
    log = _logger(progress)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    if prompts is None:
        clean, abc, _ = ioi_dataset_for(model, n_prompts, seed)
    else:
        clean, abc = prompts
    settings = Settings(model=model.cfg.model_name, n_prompts=len(clean), seed=seed, **thresholds)
    clean, abc = clean.to(model.device), abc.to(model.device)
    timings["dataset"] = time.perf_counter() - start

    def stage(name: str) -> Callable[[], None]:
        began = time.perf_counter()
        log(f"{name} ...")
        return lambda: timings.__setitem__(name, time.perf_counter() - began)

    done = stage("baseline, attention and direct logit attribution")
    clean_logits, clean_cache = clean_run(model, clean)
    baseline = measure_baseline(model, clean, abc, settings.n_bootstrap, seed, clean_logits)
    if baseline.logit_diff_ci[0] <= 0:
        low, high = baseline.logit_diff_ci
        raise ValueError(
            f"{settings.model} does not do IOI on these prompts: mean logit diff {baseline.logit_diff:.2f} "
            f"(95% CI [{low:.2f}, {high:.2f}]) is not above 0, so there is no circuit to find. Use a model "
            "that prefers the indirect object (a toy model may need more training steps), or more prompts."
        )
    attention = attention_evidence(model, clean, clean_cache)
    attention_thresholds = {
        kind: attention_threshold(
            scores, settings.attention_z, settings.min_attention, settings.large_attention
        )
        for kind, scores in attention.items()
    }
    n_patch = min(settings.n_patching_prompts, len(clean))
    patch_clean, patch_abc = clean[:n_patch], abc[:n_patch]
    patch_diff = clean.logit_diff(clean_logits)[:n_patch].mean().item()  # the patching prompts' logit diff
    dla = direct_logit_attributions(model, clean, clean_cache)
    del clean_logits, clean_cache
    done()

    def attends(head: Head, cls: str) -> bool:
        """The head shows the class's attention pattern and, for writers, writes the class's way."""
        if attention[CLASS_KIND[cls]][head].item() < attention_thresholds[CLASS_KIND[cls]]:
            return False
        logit, sign = CLASS_WRITES.get(cls, (None, 0))
        return logit is None or sign * dla[logit][head].item() > 0

    classes: dict[str, list[HeadEvidence]] = {name: [] for name in CLASSES}
    unclassified: list[HeadEvidence] = []
    effects: dict[str, Tensor] = {}
    thresholds_out: dict[str, dict[str, float]] = {
        f"attention {kind}": {"threshold": value} for kind, value in attention_thresholds.items()
    }

    def evidence(head: Head, step: str, z: Tensor) -> HeadEvidence:
        return HeadEvidence(
            layer=head[0],
            head=head[1],
            effect=effects[step][head].item(),
            z=z[head].item(),
            step=step,
            attention={kind: scores[head].item() for kind, scores in attention.items()},
            direct_logit_attribution={logit: values[head].item() for logit, values in dla.items()},
        )

    def assign(heads: list[Head], step: str, z: Tensor, choose: Callable[[Head], str | None]) -> None:
        """Put each head into the class `choose` names (a head may hold roles in several classes)."""
        for head in heads:
            cls = choose(head)
            if cls is None:
                unclassified.append(evidence(head, step, z))
            elif head not in {(h.layer, h.head) for h in classes[cls]}:
                classes[cls].append(evidence(head, step, z))

    def select(values: Tensor, sign: int, label: str) -> tuple[list[Head], Tensor]:
        heads, z, figures = select_heads(
            values, sign, settings.effect_z, settings.min_effect, settings.min_share
        )
        thresholds_out[label] = figures
        return heads, z

    # 1. Direct effects on the logits: name movers and S-suppression heads lower the logit diff
    # when patched, negative name movers raise it.
    done = stage("path patching: heads -> logits")

    attribution: dict[str, edges.EdgeScores] = {}

    def sweep(*args, ranked_by_attribution: bool = True, **kwargs) -> Tensor:
        """Path-patching effects of the senders; with exact_candidates, only the senders EAP ranks
        first are patched (EAP runs once, for every step's receivers and positions)."""
        if settings.exact_candidates <= 0:
            return path_patching_effects(model, patch_clean, patch_abc, *args, **kwargs)
        if ranked_by_attribution and not attribution:
            attribution.update(ioi_edge_attribution(model, patch_clean, patch_abc))
        return ranked_path_patching_effects(
            model,
            patch_clean,
            patch_abc,
            *args,
            n_exact=settings.exact_candidates,
            min_estimate=0.5 * settings.min_effect * abs(patch_diff),
            attribution=attribution if ranked_by_attribution else None,
            **kwargs,
        )

    effects["logits"] = sweep(None) / patch_diff
    done()
    heads, z = select(effects["logits"], -1, "logits (name_mover, s_suppression)")
    writers = ("name_mover", "s_suppression")
    assign(heads, "logits", z, lambda head: _strongest(writers, head, attends, attention))
    heads, z = select(effects["logits"], 1, "logits (negative_name_mover)")
    negative = ("negative_name_mover",)
    assign(heads, "logits", z, lambda head: _strongest(negative, head, attends, attention))

    # 2-4. Walk back through queries, values and keys.
    for step, receiver_classes, receiver_input, position in STEPS[1:]:
        receivers = [(h.layer, h.head) for cls in receiver_classes for h in classes[cls]]
        if not receivers or max(layer for layer, _ in receivers) == 0:  # no heads before layer 0
            log(f"no {' / '.join(receiver_classes)} heads after layer 0: skipping {step}")
            continue
        done = stage(f"path patching: heads -> {step}")
        change = sweep(receivers, receiver_input, position)
        effects[step] = change / patch_diff
        done()
        heads, z = select(effects[step], -1, step)
        assign(heads, step, z, lambda head, step=step: _classify(step, head, attends, attention))

    # 5. Backup name movers: direct effects again with the name movers mean-ablated.
    mean_ablation = MeanAblation(model, abc)
    name_movers = [(h.layer, h.head) for h in classes["name_mover"]]
    # Only heads after the first name mover's layer can react to the name movers' ablation.
    first_layer = min(name_movers)[0] if name_movers else model.cfg.n_layers
    senders = [(layer, head) for layer in range(first_layer + 1, model.cfg.n_layers)
               for head in range(model.cfg.n_heads) if (layer, head) not in name_movers]  # fmt: skip
    if senders:
        done = stage("path patching: heads -> logits, name movers ablated")
        ablated = sweep(
            None, senders=senders, ranked_by_attribution=False, ablated=(mean_ablation, name_movers)
        )
        ablated = ablated / patch_diff
        done()
        effects["logits_without_name_movers"] = ablated
        growth = ablated - effects["logits"]  # more negative: the head's direct effect grew
        effects["backup_growth"] = growth
        heads, z = select(growth, -1, "backup_growth")
        taken = {(h.layer, h.head) for found in classes.values() for h in found}
        heads = [head for head in heads if head not in taken]
        assign(
            heads,
            "backup_growth",
            z,
            lambda head: "backup_name_mover" if attends(head, "name_mover") else None,
        )

    in_classes = {(h.layer, h.head) for found in classes.values() for h in found}
    seen: set[Head] = set()
    for h in list(unclassified):
        if (h.layer, h.head) in in_classes | seen:
            unclassified.remove(h)
        seen.add((h.layer, h.head))
    result = IOICircuitResult(
        settings=settings,
        baseline=baseline,
        classes=classes,
        unclassified=unclassified,
        effects=effects,
        attention=attention,
        thresholds=thresholds_out,
        evaluation=None,
        timings=timings,
    )
    if evaluate and result.heads:
        done = stage("evaluation")
        n_subsets = settings.n_completeness_subsets
        result.evaluation = evaluate_circuit(result, clean, mean_ablation, n_subsets, seed)
        done()
    description = "held-out prompts given to find_ioi_circuit"
    if heldout is None and prompts is None:
        heldout = ioi_dataset_for(model, n_prompts, seed, split="heldout")[:2]
        description = HELDOUT_DESCRIPTION[model.cfg.model_name == TOY_IOI_MODEL]
    if validate and heldout is not None and result.heads:
        done = stage("validation on held-out prompts")
        clean_heldout, abc_heldout = (p.to(model.device) for p in heldout)
        result.validation = validate_circuit(model, result, clean_heldout, abc_heldout, description)
        done()
    if result.heads:
        done = stage("example attention patterns")
        result.example = example_patterns(model, clean, result.heads)
        done()
    timings["total"] = time.perf_counter() - start
    log(f"done in {timings['total']:.1f} s")
    return result


def _classify(
    step: str, head: Head, attends: Callable[[Head, str], bool], attention: dict[str, Tensor]
) -> str | None:
    """The class of a head found at `step`, from its attention pattern (None: no matching pattern)."""
    candidates = {
        "name_mover_queries": ("s_inhibition",),
        "s_suppression_queries": ("s_inhibition",),
        "s_inhibition_values": ("induction", "duplicate_token"),
        "induction_keys": ("previous_token",),
    }[step]
    return _strongest(candidates, head, attends, attention)


def _strongest(
    candidates: Sequence[str], head: Head, attends: Callable[[Head, str], bool], attention: dict[str, Tensor]
) -> str | None:
    """The candidate class whose attention pattern the head shows most strongly (None: none)."""
    shown = [cls for cls in candidates if attends(head, cls)]
    return max(shown, key=lambda cls: attention[CLASS_KIND[cls]][head].item(), default=None)


def _logger(progress: bool) -> Callable[[str], None]:
    if not progress:
        return lambda message: None
    began = time.perf_counter()

    def log(message: str) -> None:
        print(f"[ioi {time.perf_counter() - began:6.1f}s] {message}", file=sys.stderr, flush=True)

    return log


@torch.no_grad()
def example_patterns(
    model: interp.HookedTransformer, prompts: IOIPrompts, heads: Sequence[Head]
) -> ExamplePatterns:
    """The attention patterns of `heads` on the first prompt (up to its END)."""
    end = int(prompts.positions["END"][0]) + 1
    tokens = prompts.tokens[:1, :end].to(model.device)
    layers = sorted({layer for layer, _ in heads})
    _, cache = model.run_with_cache(
        tokens, names_filter=[interp.act_name("pattern", layer) for layer in layers], return_type=None
    )
    str_tokens = [f"<{t}>" for t in tokens[0].tolist()]
    if model.tokenizer is not None:
        str_tokens = model.to_str_tokens(tokens[0])
    elif prompts.texts is not None and len(words := prompts.texts[0].split()) <= end:
        # Toy task: one word per token, the text starting after BOS.
        str_tokens[end - len(words) :] = [f" {word}" for word in words]
    patterns = {f"{layer}.{head}": cache["pattern", layer][0, head].cpu() for layer, head in heads}
    return ExamplePatterns(str_tokens, patterns)


# ---------------------------------------------------------------------------------------------
# Evaluation


def evaluate_circuit(
    result: IOICircuitResult,
    clean: IOIPrompts,
    mean_ablation: MeanAblation,
    n_subsets: int = 10,
    seed: int = 0,
) -> Evaluation:
    """Faithfulness, completeness and minimality of result's circuit (see the module docstring)."""
    model = mean_ablation.model
    all_heads = _all_heads(model)
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
    keeps += [subtract(circuit, subset) for subset in subsets] + [subtract(all_heads, s) for s in subsets]
    keeps += [subtract(circuit, mates[head]) for head in circuit]
    keeps += [subtract(circuit, mates[head] | {head}) for head in circuit]
    unique = list(dict.fromkeys(frozenset(keep) for keep in keeps))
    ablated = [sorted(set(all_heads) - keep) for keep in unique]
    means = mean_ablation.logit_diffs_many(ablated, clean).mean(1).tolist()
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
        without_model = F(subtract(all_heads, subset))
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
        minimality[f"{head[0]}.{head[1]}"] = (f_without_mates - f_without_head) / f_circuit
    return Evaluation(
        model_logit_diff=f_model,
        circuit_logit_diff=f_circuit,
        ablated_logit_diff=f_empty,
        faithfulness=f_circuit / f_model,
        faithfulness_with_unclassified=(F(circuit + unclassified) / f_model if unclassified else None),
        completeness=completeness,
        completeness_max_gap=max(c["gap"] for c in completeness),
        minimality=minimality,
    )


# ---------------------------------------------------------------------------------------------
# Validation on held-out prompts


def validate_circuit(
    model: interp.HookedTransformer,
    result: IOICircuitResult,
    heldout: IOIPrompts,
    heldout_abc: IOIPrompts,
    description: str = "held-out prompts given by the caller",
) -> Validation:
    """Confirm each class of result's circuit on held-out prompts (see the module docstring);
    `description` says in the report what was held out."""
    settings = result.settings
    ablation = MeanAblation(model, heldout_abc)
    circuit = set(result.heads)
    generator = torch.Generator().manual_seed(settings.seed)
    dla = direct_logit_attributions(model, heldout)
    name_movers = result.circuit["name_mover"]

    def random_heads(heads: Sequence[Head]) -> list[Head]:
        """A random head outside the circuit per head of `heads`, from its layer where the layer has
        one left, else from any layer (fewer heads when the circuit leaves fewer)."""
        chosen: list[Head] = []
        outside = [head for head in _all_heads(model) if head not in circuit]
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
    sets = [[], sorted(set(_all_heads(model)) - circuit)]
    sets += [base for base, _ in plans.values()] + [run for _, runs in plans.values() for run in runs]
    unique = list(dict.fromkeys(tuple(sorted(heads)) for heads in sets))
    measured = dict(zip(unique, ablation.logit_diffs_many(unique, heldout), strict=True))  # each [batch]

    def ablated(heads: Sequence[Head]) -> Tensor:
        return measured[tuple(sorted(heads))]

    clean = ablated([])
    base = clean.mean().item()
    classes = {}
    for name, (base_ablated, runs) in plans.items():
        heads = result.circuit[name]
        reference = ablated(base_ablated)
        effect = ablated(runs[0]) - reference  # [batch]
        draws = torch.stack([ablated(run) - reference for run in runs[1:]]).mean(0)  # [batch]
        sign = 1 if name == "negative_name_mover" else -1
        difference = (effect - draws) / abs(base)  # relative to the size of the logit diff, sign kept
        low, high = bootstrap_ci(difference, settings.n_bootstrap, settings.seed)
        writes = None
        writes_right = True
        if name in CLASS_WRITES:
            logit, write_sign = CLASS_WRITES[name]
            writes = {role: float(sum(dla[role][h] for h in heads) / len(heads)) for role in dla}
            writes_right = write_sign * writes[logit] > 0
        classes[name] = ClassValidation(
            heads=[f"{layer}.{head}" for layer, head in heads],
            sign=sign,
            effect=effect.mean().item() / abs(base),
            random_effect=draws.mean().item() / abs(base),
            difference=difference.mean().item(),
            difference_ci=(low, high),
            writes=writes,
            # nothing is confirmed on prompts where the model does not do IOI
            confirmed=bool((low > 0 if sign > 0 else high < 0) and writes_right and base > 0),
        )
    in_circuit = ablated(sorted(set(_all_heads(model)) - circuit))  # [batch]
    index = torch.randint(len(clean), (settings.n_bootstrap, len(clean)), generator=generator)
    ratios = in_circuit[index].mean(1) / clean[index].mean(1)
    low, high = torch.quantile(ratios, torch.tensor([0.025, 0.975])).tolist()
    return Validation(
        prompts=description,
        n_prompts=len(heldout),
        logit_diff=base,
        faithfulness=in_circuit.mean().item() / base,
        faithfulness_ci=(low, high),
        classes=classes,
    )


def _all_heads(model: interp.HookedTransformer) -> list[Head]:
    return [(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]


# ---------------------------------------------------------------------------------------------
# Interventions (interp.interventions.patching, interp.interventions.ablation)


def path_patching_effects(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    receivers: Sequence[Head] | None,
    receiver_input: str | None = None,
    position: str = "END",
    senders: Sequence[Head] | None = None,
    ablated: tuple[MeanAblation, Sequence[Head]] | None = None,
) -> Tensor:
    """Change of the mean logit diff (in logits) when each head's output is patched from the ABC
    run along its paths to the receivers: [layer, head] (NaN: not a sender).

    receivers: None for the logits (direct path), else heads whose `receiver_input` ("q", "k" or
    "v") at IOI position `position` receive the patched paths. Senders: every head before the
    last receiver (or `senders`), except the receivers themselves. ablated: (mean ablation, heads)
    mean-ablated in every run. Prompts of each length run cut to that length (`by_length`).
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if senders is None:
        last = n_layers if receivers is None else max(layer for layer, _ in receivers)
        senders = [(layer, head) for layer in range(last) for head in range(n_heads)]
    sweep_senders = list(senders)
    to = "logits" if receivers is None else [(layer, head, receiver_input) for layer, head in receivers]

    def patch(group: IOIPrompts, group_abc: IOIPrompts) -> Tensor:
        """[n_senders + 1, batch]: each sender's patched logit diff, then the clean one."""
        hooks = [] if ablated is None else ablated[0].hooks(ablated[1], group)
        with model.hooks(fwd_hooks=hooks):
            patched = path_patching(
                model,
                group.tokens,
                group_abc.tokens,
                group.logit_diff,
                receivers=to,
                senders=sweep_senders,
                receiver_pos=None if receivers is None else group.positions[position],
                logit_pos=group.positions["END"],
            )
        return torch.cat([patched.values, patched.target[None]])

    values = by_length(clean, abc, patch)
    change = values[:-1].mean(-1) - values[-1].mean()  # [n_senders]
    effects = torch.full((n_layers, n_heads), float("nan"))
    effects[tuple(torch.tensor(sweep_senders).mT)] = change
    for layer, head in receivers or []:
        effects[layer, head] = float("nan")
    return effects


def by_length(
    clean: IOIPrompts, abc: IOIPrompts | None, run: Callable[[IOIPrompts, IOIPrompts | None], Tensor]
) -> Tensor:
    """run(prompts, abc prompts) [..., n] on each group of prompts of one length, cut to that length
    (no padding is computed), reassembled in the prompts' order: [..., batch]."""
    parts = []
    for rows in clean.length_groups():
        width = int(clean.positions["END"][rows[0]]) + 1
        group_abc = None if abc is None else abc[rows].truncated(width)
        parts.append((rows, run(clean[rows].truncated(width), group_abc).cpu()))
    out = torch.empty(*parts[0][1].shape[:-1], len(clean))
    for rows, value in parts:
        out[..., rows] = value
    return out


def ranked_path_patching_effects(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    receivers: Sequence[Head] | None,
    receiver_input: str | None = None,
    position: str = "END",
    senders: Sequence[Head] | None = None,
    n_exact: int = 16,
    attribution: dict[str, edges.EdgeScores] | None = None,
    ablated: tuple[MeanAblation, Sequence[Head]] | None = None,
    min_estimate: float = float("inf"),
) -> Tensor:
    """`path_patching_effects`, path-patching only the `n_exact` senders that edge attribution (EAP,
    interp.edges) ranks first by |estimated effect|, and any other sender whose |estimate| is at
    least `min_estimate` (logits); the other senders keep the estimate.

    The estimate of a sender is the sum of its edges' EAP scores into the receivers' `receiver_input`
    (key and value inputs: the receivers' key/value heads) read at `position`, or into the logits.
    attribution: `ioi_edge_attribution(model, clean, abc)`, computed once for every step (default:
    computed here, with the `ablated` heads mean-ablated).
    """
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    given = senders
    receivers = list(receivers or [])
    if senders is None:
        last = n_layers if not receivers else max(layer for layer, _ in receivers)
        senders = [(layer, head) for layer in range(last) for head in range(n_heads)]
    senders = [head for head in senders if head not in receivers]
    if len(senders) <= n_exact:  # every sender is a candidate: the exhaustive sweep
        return path_patching_effects(
            model, clean, abc, receivers or None, receiver_input, position, given, ablated
        )
    key = position if receivers else "all"
    if attribution is None:
        hooks = [] if ablated is None else ablated[0].hooks(ablated[1], clean)
        with model.hooks(fwd_hooks=hooks):
            attribution = ioi_edge_attribution(model, clean, abc, {key: position if receivers else None})
    scores = attribution[key]
    graph = scores.graph
    if receivers:
        group = n_heads // model.cfg.n_kv_heads
        kv = "h" if group == 1 else "kv"
        names = {
            f"a{layer}.h{head}<q>"
            if receiver_input == "q"
            else f"a{layer}.{kv}{head // group}<{receiver_input}>"
            for layer, head in receivers
        }
    else:
        names = {"logits"}
    columns = [graph.readers.index(name) for name in sorted(names)]
    estimate = torch.full((n_layers, n_heads), float("nan"))
    for layer, head in senders:
        estimate[layer, head] = scores.scores[graph.writers.index(f"a{layer}.h{head}"), columns].sum()
    ranked = sorted(senders, key=lambda head: -abs(float(estimate[head])))
    n_large = sum(abs(float(estimate[head])) >= min_estimate for head in senders)
    ranked = ranked[: max(n_exact, n_large)]
    exact = path_patching_effects(
        model, clean, abc, receivers or None, receiver_input, position, ranked, ablated
    )
    confirmed = ~exact.isnan()
    estimate[confirmed] = exact[confirmed]
    return estimate


def ioi_edge_attribution(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    positions: dict[str, str | None] | None = None,
) -> dict[str, edges.EdgeScores]:
    """EAP scores of every edge for the logit diff at END, from one backward pass, per reader position:
    key -> scores of what readers read at that IOI position (None: everywhere). Default keys: "all"
    and every role position ("END", "S2", ...)."""
    if positions is None:
        positions = {"all": None} | {role: role for role in clean.positions}
    metric = edges.logit_diff_metric(clean.io_token, clean.s_token, clean.positions["END"])
    reader_positions = {key: role and clean.positions[role] for key, role in positions.items()}
    return edges.edge_attribution_by_position(
        model, clean.tokens, abc.tokens, metric, reader_positions, "eap", batch_size=len(clean)
    )


class MeanAblation:
    """Mean ablation of heads over the ABC distribution, one mean per template and position
    (as the paper), computed once: `hooks(heads)` are fwd_hooks that ablate `heads`."""

    def __init__(self, model: interp.HookedTransformer, abc: IOIPrompts):
        self.model = model
        names = [interp.act_name("z", layer) for layer in range(model.cfg.n_layers)]
        self.replacement = Replacement(model, names, "mean", abc.tokens, reference_groups=abc.template)

    def hooks(self, heads: Sequence[Head], prompts: IOIPrompts) -> list:
        """fwd_hooks for a run on `prompts` (their templates pick the means), or on copies of them
        stacked along the batch (as path patching runs them)."""

        def make_hook(site: Site):
            value = self.replacement.values(site.name, len(prompts), prompts.template)

            def hook(z: Tensor, hook) -> Tensor:  # z: [batch, pos, head, d_head]
                # Path patching stacks copies of the batch ([n_copies * batch, ...]): repeat the means.
                # Prompts cut to their length take the means of their first positions.
                copies = z.shape[0] // value.shape[0] if value.shape[0] > 1 else 1
                means = value[:, : z.shape[1]].to(z.device, z.dtype)
                stacked = means.repeat(copies, *[1] * (value.ndim - 1))
                return torch.where(site_mask(site, z.shape, z.device), stacked, z)

            return hook

        return [(site.name, make_hook(site)) for site in ablation_sites(self.model, heads=heads)]

    def logit_diffs_many(self, head_sets: Sequence[Sequence[Head]], prompts: IOIPrompts) -> Tensor:
        """Logit diff per prompt [n_sets, batch] (CPU) with each set of heads mean-ablated; sets that
        ablate the same heads in the first layers share those layers' computation."""
        return by_length(
            prompts,
            None,
            lambda group, _: ablated_metrics(
                self.model,
                group.tokens,
                group.logit_diff,
                head_sets,
                self.replacement,
                groups=group.template,
                logit_pos=group.positions["END"],
            ),
        )

    def logit_diffs(self, ablate: Sequence[Head], prompts: IOIPrompts) -> Tensor:
        """Logit diff per prompt [batch] (CPU) with the heads `ablate` mean-ablated."""
        return self.logit_diffs_many([ablate], prompts)[0]

    def logit_diff(self, ablate: Sequence[Head], prompts: IOIPrompts) -> float:
        """Mean logit diff on `prompts` with the heads `ablate` mean-ablated."""
        return self.logit_diffs(ablate, prompts).mean().item()
