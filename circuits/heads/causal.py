"""Causal checks of induction and previous-token candidates, by mean ablation of a head's output z.

The checks run on the held-out probe (`Probes.held_out`): repeated sequences of the held-out token
family, fresh tokens and prefixes at the scores' repeat lengths, so the heads are chosen on one token
family (the scores) and their effects measured on another (no winner's curse). A head's z is
replaced by its mean over the held-out probe's sequences at each position, over the sequences that
are not padding there (the mean ablation of `interp.interventions.ablation`). Each effect is
measured two ways, because heads back each other up: alone, and with the other candidates of its
type already ablated (the IOI paper's minimality: what the head adds once its stand-ins are gone).
A head that its effect alone confirms, in every stratum, is not run with the others ablated (that
effect could only add to it; NaN, "–" in reports): the verdicts and strata are those of both
effects, with fewer runs.

  induction        loss increase on the second copies of the repeated sequences (nats)
  previous_token   drop of the mean induction score of the later induction heads (a fraction of
                   attention), from the confirmed induction heads (all candidates if none is confirmed)

A candidate's effect is significant if either way it exceeds CONFIRM_SE standard errors (over held-out
sequences) and MIN_EFFECT (a significant but negligible effect confirms nothing). The probe's repeat
lengths are strata: a stratum holds when either effect on its sequences exceeds MIN_EFFECT. The
attention score that chose a candidate is measured again on the held-out probe's clean run
(`held_out_scores`, the same statistic as the discovery score). Verdicts (HEAD_VERDICTS):
"confirmed" (significant, holding in most strata, and its held-out score over the type's threshold),
"score-not-held" (its held-out score below the threshold: the pattern that chose it does not carry
to new tokens, whatever its effect), "length-dependent" (significant, holding in half the strata or
fewer: a positional shortcut looks like this), "unconfirmed".

Sequential stopping (two looks): the sequences run in two halves, the first half of each repeat
length's first. After the first look, an effect whose upper bound, mean + FUTILITY_SE (3) standard
errors, is below MIN_EFFECT is futile: it is not measured on the second half, and is reported over the
first (`stopped_early`). A stopped effect is below MIN_EFFECT, so stopping never makes an effect
significant; an effect whose true value is at least MIN_EFFECT is stopped with probability at most
Phi(-3) = 0.13% (normal approximation of the mean; at most 0.27% per head, its two effects
together). Effects not stopped are over every sequence, as without stopping.

Runs: one clean run of the held-out probe serves both checks (`clean_run`). Every set of heads to ablate is
known before any is run, so the ablated runs go to interp's intervention engine together
(`interp.interventions.engine.read_site_sets`): each starts at its first ablated block from the
clean residual stream, runs that ablate the same heads in their first blocks compute those once,
the previous-token check stops after the last target's block and reads the clean patterns where no
ablation changed them, and the probe's rows run per repeat length, cut to the longest of them
(attention is causal: the padding after it changes nothing before it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

import torch
from jaxtyping import Float, Int
from torch import Tensor

import interp
from circuits.heads.probes import Probe, Probes
from circuits.heads.scores import HeadScores, pattern_scores, score_masks, type_score
from circuits.stages import StageResults
from interp.interventions.ablation import Ablation, Replacement, ablation_sites
from interp.interventions.engine import final_resid_hook, read_site_sets
from interp.types import Head, Progress, as_stage

CAUSAL_TYPES = ("induction", "previous_token")  # types with ablation checks
CONFIRM_SE = 2.0  # a causal effect is confirmed when effect > CONFIRM_SE * standard error ...
MIN_EFFECT = {"induction": 0.02, "previous_token": 0.02}  # ... and at least this large (nats; score)
FUTILITY_SE = 3.0  # after the first look, an effect below MIN_EFFECT by this many standard errors stops
FUTILITY_ERROR = NormalDist().cdf(-FUTILITY_SE)  # the chance an effect truly at MIN_EFFECT stops (0.13%)

HEAD_VERDICTS = ("confirmed", "score-not-held", "length-dependent", "unconfirmed")
INDUCTION_STAGE = "Ablating induction candidates"  # the stages progress(stage, done, total) reports
PREVIOUS_TOKEN_STAGE = "Ablating previous-token candidates"
CLEAN_RUN_STAGE = "Clean run of the held-out probe"  # before the checks; not kept (one forward pass)

Effect = tuple[float, float]
"""(mean, standard error) over probe sequences."""


@dataclass(kw_only=True)
class CausalEffects:
    """Per candidate head: the effect of ablating it alone, and with the other candidates ablated
    (what it adds once its stand-ins are gone); and the effect of ablating all candidates.
    by_stratum: stratum name ("L=13": the sequences of one repeat length) -> head -> (alone, with
    the others ablated) on that stratum's sequences."""

    alone: dict[Head, Effect]
    with_others_ablated: dict[Head, Effect]
    all_candidates: Effect
    min_effect: float  # an effect below this is negligible, however small its error
    by_stratum: dict[str, dict[Head, tuple[Effect, Effect]]] = field(default_factory=dict)
    stopped_early: dict[Head, list[str]] = field(default_factory=dict)  # head -> its effects ("alone",
    # "with_others_ablated") stopped as futile at the first look: over its sequences only
    held_out_scores: dict[Head, float] = field(default_factory=dict)  # head -> the attention score of its
    # type on the held-out probe (`held_out_scores`); a head without one is judged on its effects only
    score_threshold: float = math.nan  # the type's score threshold (the discovery scores')

    def __post_init__(self) -> None:
        if self.held_out_scores and math.isnan(self.score_threshold):  # every verdict would be score-not-held
            raise ValueError("held-out scores need their type's score_threshold to be judged against")

    def significant(self, head: Head) -> bool:
        """Either pooled effect exceeds CONFIRM_SE standard errors and min_effect."""
        return any(
            significant_effect(effects[head], self.min_effect)
            for effects in (self.alone, self.with_others_ablated)
            if head in effects
        )

    def holds_in(self, head: Head) -> list[str]:
        """The strata where either of the head's effects exceeds min_effect (one not measured, NaN,
        exceeds nothing)."""
        return [
            name
            for name, effects in self.by_stratum.items()
            if head in effects and any(effect[0] > self.min_effect for effect in effects[head])
        ]

    def verdict(self, head: Head) -> str:
        """One of HEAD_VERDICTS (see the module docstring); "" for a head that was not tested."""
        if head not in self.alone:
            return ""
        if head in self.held_out_scores and not self.held_out_scores[head] >= self.score_threshold:
            return "score-not-held"
        if not self.significant(head):
            return "unconfirmed"
        if self.by_stratum and 2 * len(self.holds_in(head)) <= len(self.by_stratum):
            return "length-dependent"
        return "confirmed"

    def confirmed(self, head: Head) -> bool:
        return self.verdict(head) == "confirmed"


def significant_effect(effect: Effect, min_effect: float) -> bool:
    """An effect (mean, standard error) exceeds CONFIRM_SE standard errors and min_effect (NaN: not
    measured, never significant)."""
    return effect[0] > max(CONFIRM_SE * effect[1], min_effect)


def _mean_se(values: Float[Tensor, " batch"]) -> Effect:
    values = values.double()
    se = float(values.std() / math.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), se


Measure = Callable[[list[list[Head]], Tensor, int, int], list[Float[Tensor, " rows"]]]
"""measure(head sets, rows, runs before, runs in all) -> per set, the measurement on each of the probe
sequences `rows` with those heads ablated (the counts, of sets times looks, are for progress)."""


def _futile(effect: Effect, min_effect: float) -> bool:
    """The effect's upper bound, mean + FUTILITY_SE standard errors, is below min_effect."""
    mean, se = effect
    return mean + FUTILITY_SE * se < min_effect


def _candidate_effects(
    heads: Sequence[Head],
    measure: Measure,
    sign: int,
    min_effect: float,
    looks: Sequence[Tensor],
    strata: dict[str, Tensor] | None = None,
) -> CausalEffects:
    """An effect is sign * (measurement with the heads ablated - measurement without them), for each
    head alone, all candidates, and each head on top of the other candidates, over all sequences and
    over each stratum's (`strata`: name -> row indices). The sets run look by look (`looks`: row
    indices, each sequence in one): no head, all of them and each alone first; a head its effect
    alone confirms, holding in every stratum, has the same verdict and strata whatever its effect with
    the others ablated (a second effect only adds ways to be significant and to hold), which is then
    not measured (NaN); the other candidates of each remaining head next. After each look but the
    last, a head's effect (alone, or with the others ablated) that is futile (`_futile`) is not
    measured in the later looks: it stays over the sequences measured so far (`stopped_early`).
    Within a call of `measure`, runs share their first blocks."""
    n_sequences = sum(len(rows) for rows in looks)
    measured: dict[frozenset[Head], Tensor] = {}  # per sequence (NaN where not measured)
    seen: dict[frozenset[Head], Tensor] = {}  # per sequence: measured (a NaN measured stays NaN)
    runs_done = 0

    def effect(ablated: Sequence[Head], baseline: Sequence[Head] = (), rows: Tensor | None = None) -> Effect:
        a, b = frozenset(ablated), frozenset(baseline)
        values, both = sign * (measured[a] - measured[b]), seen[a] & seen[b]
        if rows is not None:
            values, both = values[rows], both[rows]
        return _mean_se(values[both])

    def run_looks(
        sets: dict[frozenset[Head], list[Head]],
        effects: dict[frozenset[Head], Callable[[], Effect]],
        later: int,
    ) -> None:
        """Measure `sets` look by look, each set in `effects` until its effect is futile; `later`:
        sets to run after these (for progress)."""
        nonlocal runs_done
        active = dict(sets)
        for look, rows in enumerate(looks):
            total = runs_done + len(active) * (len(looks) - look) + later * len(looks)
            found = measure(list(active.values()), rows, runs_done, total)
            runs_done += len(active)
            for key, values in zip(active, found, strict=True):
                measured.setdefault(key, torch.full((n_sequences,), math.nan))[rows] = values
                seen.setdefault(key, torch.zeros(n_sequences, dtype=torch.bool))[rows] = True
            if look < len(looks) - 1:
                active = {
                    key: value
                    for key, value in active.items()
                    if key not in effects or not _futile(effects[key](), min_effect)
                }

    def others(head: Head) -> list[Head]:
        return sorted(h for h in heads if h != head)

    first = {frozenset(): [], frozenset(heads): sorted(heads)}
    alone_sets = {frozenset([head]): head for head in heads if frozenset([head]) not in first}
    first |= {key: [head] for key, head in alone_sets.items()}
    upper = len({frozenset(others(head)) for head in heads} - set(first)) if len(heads) > 1 else 0
    run_looks(first, {key: (lambda head=head: effect([head])) for key, head in alone_sets.items()}, upper)

    stratum_rows = strata or {}
    nan = (math.nan, math.nan)
    alone = CausalEffects(
        alone={head: effect([head]) for head in heads},
        with_others_ablated={},
        all_candidates=effect(heads),
        min_effect=min_effect,
        by_stratum={
            name: {head: (effect([head], rows=rows), nan) for head in heads}
            for name, rows in stratum_rows.items()
        },
    )
    undecided = [
        head
        for head in heads
        if alone.verdict(head) != "confirmed" or len(alone.holds_in(head)) < len(stratum_rows)
    ]
    second = {frozenset(others(head)): head for head in undecided if len(heads) > 1}
    second = {key: head for key, head in second.items() if key not in measured}
    run_looks(
        {key: others(head) for key, head in second.items()},
        {key: (lambda head=head: effect(heads, others(head))) for key, head in second.items()},
        0,
    )

    def with_others(head: Head, rows: Tensor | None = None) -> Effect:
        if head not in undecided:
            return nan
        return effect(heads, others(head), rows) if len(heads) > 1 else effect([head], rows=rows)

    def stopped(head: Head) -> list[str]:
        """Which of the head's effects are over fewer than all sequences (stopped early as futile)."""
        sets = {"alone": [[head], []], "with_others_ablated": [heads, others(head)] if len(heads) > 1 else []}
        return [
            name
            for name, used in sets.items()
            if (name == "alone" or head in undecided)
            and any(not bool(seen[frozenset(s)].all()) for s in used)
        ]

    return dataclasses.replace(
        alone,
        with_others_ablated={head: with_others(head) for head in undecided},
        by_stratum={
            name: {head: (effect([head], rows=rows), with_others(head, rows)) for head in heads}
            for name, rows in stratum_rows.items()
        },
        stopped_early={head: names for head in heads if (names := stopped(head))},
    )


def length_strata(probe: Probe) -> dict[str, Tensor]:
    """The repeated probe's rows per repeat length ("L=13" -> row indices), shortest first."""
    if probe.repeat_len is None:
        return {}
    return {
        f"L={length}": (probe.repeat_len == length).nonzero()[:, 0]
        for length in sorted(probe.repeat_len.unique().tolist())
    }


@dataclass
class CleanRun:
    """What the ablated runs of a probe start from and compare with, from one unablated run: the
    residual stream before the blocks whose heads are ablated, the mean of their hook_z over the
    probe's sequences per position, padding excluded (the mean ablation's values), attention
    patterns, and the residual stream after the last block (None where not asked for)."""

    tokens: Int[Tensor, "batch pos"]
    resid_pre: dict[int, Float[Tensor, "batch pos d_model"]]
    z_mean: dict[int, Float[Tensor, "1 pos head d_head"]]
    patterns: dict[int, Float[Tensor, "batch head q k"]]
    final: Float[Tensor, "batch pos d_model"] | None


@torch.inference_mode()
def clean_run(
    model: interp.HookedTransformer,
    probe: Probe,
    ablated_layers: Sequence[int],
    pattern_layers: Sequence[int] = (),
    final: bool = False,
) -> CleanRun:
    """One unablated run of `probe`, caching what ablations of heads in `ablated_layers` need."""
    layers = sorted(set(ablated_layers))
    names = [interp.act_name(kind, layer) for layer in layers for kind in ("resid_pre", "z")]
    names += [interp.act_name("pattern", layer) for layer in sorted(set(pattern_layers))]
    last = interp.act_name("resid_post", model.cfg.n_layers - 1)
    tokens = probe.tokens.to(model.device)
    _, cache = model.run_with_cache(tokens, names_filter=names + [last] * final, return_type=None)
    real = torch.arange(probe.tokens.shape[1]) < probe.lengths[:, None]  # [batch, pos]: not padding
    z_names = [interp.act_name("z", layer) for layer in layers]
    means = Replacement(
        model, z_names, Ablation("mean", reference={name: cache[name] for name in z_names}, mask=real)
    )
    return CleanRun(
        tokens=tokens,
        resid_pre={layer: cache["resid_pre", layer] for layer in layers},
        z_mean={layer: means.values(name, len(real)) for layer, name in zip(layers, z_names, strict=True)},
        patterns={layer: cache["pattern", layer] for layer in pattern_layers},
        final=cache[last] if final else None,
    )


def held_out_scores(
    probe: Probe, clean: CleanRun, heads: Sequence[Head], head_type: str
) -> dict[Head, float]:
    """Each head's `head_type` attention score on `probe` (`scores.type_score` of the clean run's
    patterns, which must hold the heads' layers): the discovery score's statistic on held-out tokens."""
    masks = {head_type: score_masks(probe.tokens, probe.lengths)[head_type]}  # the same for every layer
    found = {}
    for layer in sorted({layer for layer, _ in heads}):
        of_layer = [head for lh, head in heads if lh == layer]
        pattern = clean.patterns[layer][:, of_layer].float().cpu()  # [batch, head, q, k]
        per_sequence = pattern_scores(pattern, masks, probe.lengths)[head_type]  # [batch, head]
        score = type_score(head_type, per_sequence, probe.repeat_len)  # [head]
        found |= {(layer, head): float(value) for head, value in zip(of_layer, score, strict=True)}
    return found


def _repeat_kinds(probe: Probe) -> Int[Tensor, " batch"]:
    """Each sequence's repeat length (0 for all if the probe has none)."""
    if probe.repeat_len is None:
        return torch.zeros(len(probe.tokens), dtype=torch.long)
    return probe.repeat_len


def looks(probe: Probe) -> list[Tensor]:
    """The probe's rows in two looks (row indices): the first half of each repeat length's sequences,
    then the rest (one look if no repeat length has two sequences)."""
    kinds = _repeat_kinds(probe)
    first = torch.cat(
        [rows[: len(rows) // 2] for kind in kinds.unique() for rows in [(kinds == kind).nonzero()[:, 0]]]
    )
    is_first = torch.zeros(len(kinds), dtype=torch.bool)
    is_first[first] = True
    if not len(first):
        return [torch.arange(len(kinds))]
    return [is_first.nonzero()[:, 0], (~is_first).nonzero()[:, 0]]


def _row_groups(probe: Probe, rows: Tensor) -> list[tuple[Tensor, int]]:
    """(rows, width) per repeat length among `rows`: the rows run together, cut to the longest of them
    (right padding after it cannot change earlier positions: attention is causal)."""
    kinds = _repeat_kinds(probe)
    groups = []
    for kind in kinds[rows].unique().tolist():
        group = rows[kinds[rows] == kind]
        groups.append((group, int(probe.lengths[group].max())))
    return groups


def _ablated_reads(
    model: interp.HookedTransformer,
    clean: CleanRun,
    head_sets: Sequence[Sequence[Head]],
    rows: Tensor,
    width: int,
    reads: dict[str, Tensor],
    readout: Callable[[dict[str, Tensor]], Tensor],
    progress: Progress | None,
) -> list[Tensor]:
    """readout({name: activation}) of the hooks `reads` (name -> the clean run's value on `rows`, cut
    to `width`) with each set of heads mean-ablated, on `rows` of the probe cut to `width` positions."""
    names = {interp.act_name("z", layer): layer for layer in clean.z_mean}
    target = {
        interp.act_name("resid_pre", layer): resid[rows, :width] for layer, resid in clean.resid_pre.items()
    }
    return read_site_sets(
        model,
        clean.tokens[rows, :width],
        [ablation_sites(model, heads=heads) for heads in head_sets],
        list(reads),
        readout,
        {name: clean.z_mean[layer][:, :width] for name, layer in names.items()},
        target=target | reads,
        progress=progress,
    )


@torch.inference_mode()
def induction_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    heads: Sequence[Head],
    progress: Progress | None = None,
    clean: CleanRun | None = None,
) -> CausalEffects:
    """Loss increase on the second copies (nats) when candidate heads are mean-ablated: each alone,
    each with the other candidates ablated, all together. `clean`: the probe's clean run (with the
    candidates' layers and the final residual stream), if already made."""
    if clean is None:
        clean = clean_run(model, probe, [layer for layer, _ in heads], final=True)
    tokens = probe.tokens.to(model.device)
    second = probe.second_copy_predictions().to(model.device)  # [batch, pos - 1]
    n_groups = len(_row_groups(probe, torch.arange(len(tokens))))

    def measure(head_sets: list[list[Head]], look: Tensor, before: int, total: int) -> list[Tensor]:
        """Mean loss per sequence of `look` on its second copy (logits only where it is scored)."""
        values = torch.zeros(len(head_sets), len(tokens))
        final_name = final_resid_hook(model)
        if progress:
            progress(INDUCTION_STAGE, before * n_groups, total * n_groups)
        for g, (rows, width) in enumerate(_row_groups(probe, look)):
            device_rows = rows.to(model.device)
            scored = second[device_rows, : width - 1]
            r, pos = scored.nonzero(as_tuple=True)
            targets = tokens[device_rows][r, pos + 1]

            def loss(acts: dict[str, Tensor], scored=scored, r=r, pos=pos, targets=targets) -> Tensor:
                logits = model.unembed(model.ln_final(acts[final_name][r, pos][:, None]))[:, 0]
                per_token = torch.zeros(scored.shape, dtype=torch.float32, device=scored.device)
                per_token[r, pos] = torch.nn.functional.cross_entropy(
                    logits.float(), targets, reduction="none"
                )
                return (per_token.sum(-1) / scored.sum(-1)).float().cpu()

            reads = {final_name: clean.final[device_rows, :width]}
            step = as_stage(
                progress, INDUCTION_STAGE, before * n_groups + g * len(head_sets), total * n_groups
            )
            runs = _ablated_reads(model, clean, head_sets, device_rows, width, reads, loss, step)
            for i, value in enumerate(runs):
                values[i, rows] = value
        return list(values[:, look])

    return _candidate_effects(heads, measure, 1, MIN_EFFECT["induction"], looks(probe), length_strata(probe))


@torch.inference_mode()
def previous_token_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    heads: Sequence[Head],
    targets: Sequence[Head],
    progress: Progress | None = None,
    clean: CleanRun | None = None,
) -> CausalEffects:
    """Drop in the mean induction score of the `targets` (induction heads) in layers after the
    earliest candidate when candidates are mean-ablated: each alone, each with the other candidates
    ablated, all together. Candidates in or after the last target's layer are not tested. `clean`:
    the probe's clean run (with the candidates' layers and the targets' patterns), if already made."""
    heads = [head for head in heads if any(lt > head[0] for lt, _ in targets)]
    start = min((layer for layer, _ in heads), default=0)
    later = [target for target in targets if target[0] > start]
    if not heads or not later:
        return CausalEffects(
            alone={},
            with_others_ablated={},
            all_candidates=(float("nan"), float("nan")),
            min_effect=MIN_EFFECT["previous_token"],
        )
    target_layers = sorted({layer for layer, _ in later})
    if clean is None:
        clean = clean_run(model, probe, [layer for layer, _ in heads], target_layers)
    n_groups = len(_row_groups(probe, torch.arange(len(probe.tokens))))

    def measure(head_sets: list[list[Head]], look: Tensor, before: int, total: int) -> list[Tensor]:
        """Mean induction score of the later targets per sequence of `look`, with each set mean-ablated."""
        values = torch.zeros(len(head_sets), len(probe.tokens))
        if progress:
            progress(PREVIOUS_TOKEN_STAGE, before * n_groups, total * n_groups)
        for g, (rows, width) in enumerate(_row_groups(probe, look)):
            lengths = probe.lengths[rows]
            masks = {"induction": score_masks(probe.tokens[rows, :width], lengths)["induction"]}
            device_rows = rows.to(model.device)
            reads = {
                interp.act_name("pattern", layer): clean.patterns[layer][device_rows][:, :, :width, :width]
                for layer in target_layers
            }

            def score(patterns: dict[str, Tensor], masks=masks, lengths=lengths) -> Tensor:
                per_target = [
                    pattern_scores(
                        patterns[interp.act_name("pattern", lt)][:, ht : ht + 1].float().cpu(), masks, lengths
                    )["induction"][:, 0]
                    for lt, ht in later
                ]
                return torch.stack(per_target).mean(0)

            step = as_stage(
                progress, PREVIOUS_TOKEN_STAGE, before * n_groups + g * len(head_sets), total * n_groups
            )
            runs = _ablated_reads(model, clean, head_sets, device_rows, width, reads, score, step)
            for i, value in enumerate(runs):
                values[i, rows] = value
        return list(values[:, look])

    strata = length_strata(probe)
    return _candidate_effects(heads, measure, -1, MIN_EFFECT["previous_token"], looks(probe), strata)


def causal_checks(
    model: interp.HookedTransformer,
    probes: Probes,
    scores: HeadScores,
    max_candidates: int = 12,
    progress: Progress | None = None,
    stages: StageResults | None = None,
) -> dict[str, CausalEffects]:
    """Stage 4 of `head_report`: mean-ablate up to `max_candidates` induction candidates (highest
    scores first), then as many previous-token candidates, on the held-out probe (`probes.held_out`:
    a token family the scores never read). {} when no head is an induction candidate. stages: each
    check's effects kept as it finishes (INDUCTION_STAGE, then PREVIOUS_TOKEN_STAGE); a check already
    in it is not run again. progress: CLEAN_RUN_STAGE, then the two checks."""
    induction = scores.candidates("induction", max_candidates)
    if not induction:
        if progress is not None:
            for stage in (INDUCTION_STAGE, PREVIOUS_TOKEN_STAGE):
                progress(f"{stage}: no induction candidate", 0, 0)
        return {}
    previous_token = scores.candidates("previous_token", max_candidates)
    # One clean run for both checks: the targets of the previous-token check are induction candidates.
    layers = [layer for layer, _ in induction + previous_token]
    if progress is not None:
        progress(CLEAN_RUN_STAGE, 0, 1)
    clean = clean_run(model, probes.held_out, layers, layers, final=True)
    if progress is not None:
        progress(CLEAN_RUN_STAGE, 1, 1)
    stages = StageResults() if stages is None else stages
    induction_effects = with_held_out_scores(
        stages.run(
            INDUCTION_STAGE,
            lambda: induction_ablation_effects(model, probes.held_out, induction, progress, clean),
            progress,
        ),
        probes.held_out,
        clean,
        induction,
        "induction",
        scores.thresholds,
    )
    confirmed = [head for head in induction if induction_effects.confirmed(head)]
    previous_token_effects = stages.run(
        PREVIOUS_TOKEN_STAGE,
        lambda: previous_token_ablation_effects(
            model,
            probes.held_out,
            previous_token,
            confirmed or induction,
            progress,
            clean,
        ),
        progress,
    )
    return {
        "induction": induction_effects,
        "previous_token": with_held_out_scores(
            previous_token_effects,
            probes.held_out,
            clean,
            previous_token,
            "previous_token",
            scores.thresholds,
        ),
    }


def with_held_out_scores(
    effects: CausalEffects,
    probe: Probe,
    clean: CleanRun,
    heads: Sequence[Head],
    head_type: str,
    thresholds: dict[str, float],
) -> CausalEffects:
    """`effects` with the candidates' held-out scores (`held_out_scores`) and the type's threshold,
    which their verdicts then need cleared."""
    return dataclasses.replace(
        effects,
        held_out_scores=held_out_scores(probe, clean, heads, head_type),
        score_threshold=thresholds[head_type],
    )
