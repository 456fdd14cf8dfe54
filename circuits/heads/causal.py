"""Causal checks on the held-out probe: each candidate's z mean-ablated (per position, the mean over other
sequences of the held-out family: `Probes.reference`), alone and with
the other candidates of its type ablated, judged against random heads of its layer (of other layers
where its layer has none left; for a previous-token candidate only layers before the induction heads its
check reads, whose patterns a head there can move) by
`circuits.evidence.judge_class` (paired per sequence; strata: repeat lengths). Effects (positive: the
head helps): induction, the loss increase on the second copies (nats); previous_token, the drop of the
later induction heads' mean induction score (attention; those after its layer). Two looks: after the
first half of each repeat length's sequences, an effect beyond random + FUTILITY_SE standard errors
below MIN_EFFECT stops.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

import interp
from circuits.evidence import ClassVerdict, HeadClass, Strata, beyond_per_prompt, head_class, judge_class
from circuits.heads.probes import Probe, Probes
from circuits.heads.scores import HeadScores, pattern_scores, score_masks, type_score
from circuits.stages import StageResults
from interp.interventions.ablation import Ablation, Replacement, ablation_sites
from interp.interventions.engine import RunOptions, final_resid_hook, read_site_sets
from interp.types import Head, Progress, as_stage, head_label

CAUSAL_TYPES = ("induction", "previous_token")  # types with ablation checks
EFFECTS = ("alone", "with_others_ablated")  # a candidate's two effects, in the order they confirm it
N_RANDOM = 5  # random heads drawn per layer with candidates (as IOI's n_random_draws)
MIN_EFFECT = {"induction": 0.02, "previous_token": 0.02}  # the least confirming effect beyond random
LENGTH_RULE = {"length": "most"}  # a confirmed effect holds beyond random at most repeat lengths
CAUSAL_BOOTSTRAP = 1000  # resamples of a causal check's CIs (`judge_class`'s)
FUTILITY_SE = 3.0  # after the first look, an effect below MIN_EFFECT by this many standard errors stops

INDUCTION_STAGE = "Ablating induction candidates and random heads"  # progress stages
PREVIOUS_TOKEN_STAGE = "Ablating previous-token candidates and random heads"
CLEAN_RUN_STAGE = "Clean run of the held-out probe"  # before the checks; not kept (one forward pass)

Effect = tuple[float, float]  # (mean, standard error) over probe sequences


@dataclass(kw_only=True)
class CausalEffects:
    """Per candidate: its effect alone and with the other candidates ablated; all candidates' together.
    by_stratum: "L=13" -> head -> (alone, with others); judged: head -> effect (EFFECTS) -> its verdict
    against the random heads of its layer. The defaults: no candidate tested."""

    alone: dict[Head, Effect] = field(default_factory=dict)
    with_others_ablated: dict[Head, Effect] = field(default_factory=dict)
    all_candidates: Effect = (math.nan, math.nan)
    min_effect: float = math.nan  # an effect beyond random below this is negligible, however small its CI
    by_stratum: dict[str, dict[Head, tuple[Effect, Effect]]] = field(default_factory=dict)
    stopped_early: dict[Head, list[str]] = field(default_factory=dict)  # head -> effects stopped as futile
    held_out_scores: dict[Head, float] = field(default_factory=dict)  # head -> its type's held-out score
    score_threshold: float = math.nan  # the type's score threshold
    judged: dict[Head, dict[str, ClassVerdict]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.held_out_scores and math.isnan(self.score_threshold):  # every verdict would be score-not-held
            raise ValueError("held-out scores need their type's score_threshold to be judged against")

    def effect_verdict(self, head: Head, effect: str) -> str:
        """The judge's verdict of one effect (EFFECTS), "unconfirmed" below min_effect ("": not measured)."""
        judged = self.judged.get(head, {}).get(effect)
        if judged is None:
            return ""
        return judged.verdict if judged.heldout.beyond >= self.min_effect else "unconfirmed"

    def confirmed_by(self, head: Head) -> str:
        """The first of the head's effects (EFFECTS) that confirms it ("" if none)."""
        return next((name for name in EFFECTS if self.effect_verdict(head, name) == "confirmed"), "")

    def holds_in(self, head: Head) -> list[str]:
        """The strata where either of the head's effects beyond random is positive."""
        held = {s.name for judged in self.judged.get(head, {}).values() for s in judged.strata if s.holds}
        return [name for name in self.by_stratum if name in held]

    def verdict(self, head: Head) -> str:
        """The head's verdict: confirmed, score-not-held, length-dependent, unconfirmed ("": not tested)."""
        if head not in self.alone:
            return ""
        if head in self.held_out_scores and not self.held_out_scores[head] >= self.score_threshold:
            return "score-not-held"
        verdicts = {self.effect_verdict(head, name) for name in EFFECTS}
        return next((v for v in ("confirmed", "length-dependent") if v in verdicts), "unconfirmed")

    def confirmed(self, head: Head) -> bool:
        return self.verdict(head) == "confirmed"


def mean_se(values: Float[Tensor, " batch"]) -> Effect:
    """(mean, standard error) in float64 (NaN standard error for one value)."""
    values = values.double()
    se = float(values.std() / math.sqrt(len(values))) if len(values) > 1 else float("nan")
    return float(values.mean()), se


def random_head_classes(
    model: interp.HookedTransformer,
    heads: Sequence[Head],
    typed: Sequence[Head] = (),
    n_random: int = N_RANDOM,
    seed: int = 0,
    below: Callable[[int], int] | None = None,
) -> dict[Head, HeadClass]:
    """Each candidate as a class of one head with `n_random` random heads of its layer (drawn once per
    layer with seed + layer, from heads neither candidates nor `typed`; other layers' if none is left,
    only layers before `below(layer)` where given: a random head there can move what the check reads,
    as the candidate can)."""
    if n_random < 1:
        raise ValueError(
            f"n_random must be >= 1 (the random heads a candidate is compared with), got {n_random}"
        )
    excluded = {tuple(head) for head in [*heads, *typed]}
    outside = [head for head in np.ndindex(model.cfg.n_layers, model.cfg.n_heads) if head not in excluded]
    draws: dict[int, list[list[Head]]] = {}
    for head in heads:
        if head[0] not in draws:
            pool = outside if below is None else [h for h in outside if h[0] < below(head[0])]
            found = head_class(model, f"L{head[0]}", [head], n_random, seed + head[0], outside=pool)
            draws[head[0]] = found.draws
    return {head: HeadClass(name=head_label(*head), heads=[head], draws=draws[head[0]]) for head in heads}


def ablated_layers(classes: Mapping[Head, HeadClass]) -> list[int]:
    """The layers whose heads the checks of `classes` ablate (candidates' and random heads')."""
    return sorted({layer for found in classes.values() for heads in found.sets for layer, _ in heads})


Measure = Callable[[list[list[Head]], Tensor, int, int], list[Float[Tensor, " rows *target"]]]
"""measure(head sets, rows, runs before, runs in all) -> per set, the measurement per sequence of
`rows` with those heads ablated, or per sequence and target [rows, target] (the counts are for
progress)."""

Targets = Callable[[Head | None], Tensor]
"""targets(candidate) -> which of a measurement's targets [target] bool its effects average over (None:
the effect of every candidate together)."""


Key = frozenset[Head]  # a set of heads ablated together


@dataclass
class _Runs:
    """The ablated runs of one check, look by look (`looks`: row indices). measured: per set of heads,
    the measurement per sequence [sequence] or per sequence and target [sequence, target] (NaN where
    not measured); seen: where it was; targets: the targets a candidate's effects average over."""

    classes: Mapping[Head, HeadClass]
    measure: Measure
    sign: int
    min_effect: float
    looks: Sequence[Tensor]
    strata: dict[str, Tensor]
    seed: int
    targets: Targets | None = None
    measured: dict[Key, Tensor] = field(default_factory=dict)
    seen: dict[Key, Tensor] = field(default_factory=dict)
    runs_done: int = 0

    def __post_init__(self) -> None:
        self.heads = list(self.classes)
        self.everything = frozenset(self.heads)
        self.n_sequences = sum(len(rows) for rows in self.looks)

    def values(
        self, ablated: Sequence[Head], baseline: Sequence[Head] = (), of: Head | None = None
    ) -> tuple[Tensor, Tensor]:
        """sign * (measured with `ablated` - with `baseline`) per sequence, over the targets of
        candidate `of` where there are targets, and where both were measured."""
        a, b = frozenset(ablated), frozenset(baseline)
        change = self.measured[a] - self.measured[b]
        if change.ndim == 2:
            change = change[:, self.targets(of)].mean(-1)
        return self.sign * change, self.seen[a] & self.seen[b]

    def effect(
        self,
        ablated: Sequence[Head],
        baseline: Sequence[Head] = (),
        rows: Tensor | None = None,
        of: Head | None = None,
    ) -> Effect:
        found, both = self.values(ablated, baseline, of)
        if rows is not None:
            found, both = found[rows], both[rows]
        return mean_se(found[both])

    def others(self, head: Head) -> list[Head]:
        return sorted(h for h in self.heads if h != head)

    def effect_sets(self, head: Head, name: str) -> list[tuple[list[Head], list[Head]]]:
        """(ablated, baseline) of the head's effect `name` (EFFECTS), then of each of its random heads'
        (the rows of its class's `sets`); with one candidate, ablating the others is ablating none."""
        draws, heads = self.classes[head].draws, self.heads
        if name == "alone" or len(heads) == 1:
            return [([head], []), *[(draw, []) for draw in draws]]
        others = self.others(head)  # the class and each random head on top of the same other candidates
        return [(heads, others), *[(sorted({*others, *draw}), others) for draw in draws]]

    def effects_of(self, head: Head, name: str) -> tuple[Tensor, Tensor]:
        """The head's effect and its random heads' [1 + draws, sequence] where all were measured, and
        that mask [sequence]."""
        rows = [self.values(ablated, baseline, head) for ablated, baseline in self.effect_sets(head, name)]
        both = torch.stack([mask for _, mask in rows]).all(0)
        return torch.stack([found for found, _ in rows])[:, both], both

    def futile(self, head: Head, name: str) -> bool:
        """The effect beyond random + FUTILITY_SE standard errors is below min_effect."""
        mean, se = mean_se(beyond_per_prompt(self.effects_of(head, name)[0]))
        return mean + FUTILITY_SE * se < self.min_effect

    def judge(self, head: Head, name: str) -> ClassVerdict:
        found, both = self.effects_of(head, name)
        members = []
        for stratum, rows in self.strata.items():
            mask = torch.zeros(self.n_sequences, dtype=torch.bool)
            mask[rows] = True
            members.append(("length", stratum, mask[both]))
        return judge_class(
            self.classes[head], found, strata=Strata(members, LENGTH_RULE), unit="sequences", seed=self.seed,
            n_boot=CAUSAL_BOOTSTRAP,
        )  # fmt: skip

    def run(
        self,
        sets: dict[Key, list[Head]],
        futility: dict[Key, Callable[[], bool]],
        needs: dict[Key, set[Key]],
        later: int,
    ) -> None:
        """Measure `sets` look by look; after each look but the last, drop the futile sets of `futility`
        and the random sets (in `needs`' values) no remaining one needs; `later`: sets after these."""
        looks, active = self.looks, dict(sets)
        baselines = {frozenset(), self.everything}  # always run
        randoms = set().union(*needs.values()) - set(futility) - baselines
        for look, rows in enumerate(looks):
            total = self.runs_done + len(active) * (len(looks) - look) + later * len(looks)
            found = self.measure(list(active.values()), rows, self.runs_done, total)
            self.runs_done += len(active)
            for key, value in zip(active, found, strict=True):
                empty = torch.full((self.n_sequences, *value.shape[1:]), math.nan)
                self.measured.setdefault(key, empty)[rows] = value
                self.seen.setdefault(key, torch.zeros(self.n_sequences, dtype=torch.bool))[rows] = True
            if look < len(looks) - 1:
                going = {key for key in active if key in futility and not futility[key]()}
                needed = set().union(*(needs.get(key, set()) for key in going))
                active = {
                    key: value
                    for key, value in active.items()
                    if key in going or (key not in futility and (key not in randoms or key in needed))
                }


def _candidate_effects(
    classes: Mapping[Head, HeadClass],
    measure: Measure,
    sign: int,
    min_effect: float,
    looks: Sequence[Tensor],
    strata: dict[str, Tensor] | None = None,
    seed: int = 0,
    targets: Targets | None = None,
) -> CausalEffects:
    """Each candidate's effects, sign * (ablated - clean measurement), alone and on top of the other
    candidates, judged against its random heads. First the heads alone; then, for heads not confirmed
    alone at every stratum, with the others ablated; futile effects stop after the first look.
    targets: which of the measurement's targets each candidate's effects average over."""
    runs = _Runs(classes, measure, sign, min_effect, looks, strata or {}, seed, targets)
    heads, everything, stratum_rows, others = runs.heads, runs.everything, runs.strata, runs.others
    first = {frozenset(): [], everything: sorted(heads)}
    alone_keys = {frozenset([head]): head for head in heads if frozenset([head]) not in first}
    first |= {key: [head] for key, head in alone_keys.items()}
    first |= {frozenset(draw): sorted(draw) for found in classes.values() for draw in found.draws}
    alone_needs = {key: {frozenset(draw) for draw in classes[head].draws} for key, head in alone_keys.items()}
    with_others_randoms = {
        frozenset([*others(h), *draw]) for h, found in classes.items() for draw in found.draws
    }
    upper = len({frozenset(others(head)) for head in heads} | with_others_randoms) if len(heads) > 1 else 0
    runs.run(first, {key: (lambda head=head: runs.futile(head, "alone")) for key, head in alone_keys.items()},
             alone_needs, upper)  # fmt: skip

    nan = (math.nan, math.nan)
    alone = CausalEffects(
        alone={head: runs.effect([head], of=head) for head in heads},
        all_candidates=runs.effect(heads),
        min_effect=min_effect,
        by_stratum={name: {} for name in stratum_rows},  # its names: `holds_in`'s order
        judged={head: {"alone": runs.judge(head, "alone")} for head in heads},
    )
    undecided = [
        head
        for head in heads
        if alone.verdict(head) != "confirmed" or len(alone.holds_in(head)) < len(stratum_rows)
    ]
    # the effects alone as judged, on the sequences the first looks measured (a set the second run
    # measures again whole, one head's others in a pair of candidates, does not change them)
    whole = {key: bool(seen.all()) for key, seen in runs.seen.items()}
    alone_by_stratum = {
        name: {head: runs.effect([head], rows=rows, of=head) for head in heads}
        for name, rows in stratum_rows.items()
    }
    second = {frozenset(others(head)): head for head in undecided if len(heads) > 1}
    second = {key: head for key, head in second.items() if not whole.get(key, False)}
    randoms = {  # each random head on top of the same other candidates as the head it is compared with
        frozenset([*others(head), *draw]): sorted({*others(head), *draw})
        for head in undecided
        if len(heads) > 1
        for draw in classes[head].draws
    }
    runs.run(
        {key: others(head) for key, head in second.items()}
        | {key: value for key, value in randoms.items() if not whole.get(key, False)},
        {key: (lambda head=head: runs.futile(head, "with_others_ablated")) for key, head in second.items()},
        {key: {key | frozenset(draw) for draw in classes[head].draws} for key, head in second.items()},
        0,
    )

    def with_others(head: Head, rows: Tensor | None = None) -> Effect:
        if head not in undecided:
            return nan
        if len(heads) == 1:
            return runs.effect([head], rows=rows, of=head)
        return runs.effect(heads, others(head), rows, of=head)

    def stopped(head: Head) -> list[str]:
        """Which of the head's effects are over fewer than all sequences (stopped early as futile)."""
        alone_cut = not (whole[frozenset([head])] and whole[frozenset()])
        with_sets = [heads, others(head)] if len(heads) > 1 else []
        with_cut = head in undecided and any(not bool(runs.seen[frozenset(s)].all()) for s in with_sets)
        return ["alone"] * alone_cut + ["with_others_ablated"] * with_cut

    return dataclasses.replace(
        alone,
        with_others_ablated={head: with_others(head) for head in undecided},
        by_stratum={
            name: {head: (alone_by_stratum[name][head], with_others(head, rows)) for head in heads}
            for name, rows in stratum_rows.items()
        },
        stopped_early={head: names for head in heads if (names := stopped(head))},
        judged={
            head: alone.judged[head]
            | ({"with_others_ablated": runs.judge(head, "with_others_ablated")} if head in undecided else {})
            for head in heads
        },  # fmt: skip
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
    """One unablated run of a probe: the ablated layers' resid_pre and mean z per position (over real
    sequences), patterns, the final residual stream (or None)."""

    tokens: Int[Tensor, "batch pos"]
    resid_pre: dict[int, Float[Tensor, "batch pos d_model"]]
    z_mean: dict[int, Float[Tensor, "1 pos head d_head"]]
    patterns: dict[int, Float[Tensor, "batch head q k"]]
    final: Float[Tensor, "batch pos d_model"] | None


@torch.inference_mode()
def clean_run_for_ablations(
    model: interp.HookedTransformer,
    probe: Probe,
    reference: Probe | None,
    ablated_layers: Sequence[int],
    pattern_layers: Sequence[int] = (),
    final: bool = False,
) -> CleanRun:
    """One unablated run of `probe`, caching what ablating heads of `ablated_layers` needs: their z's mean
    per position over the sequences of `reference` real there (`Probes.reference`: not `probe`'s own, of
    which an ablated head would keep a share: 1/4 of its output where 4 sequences reach a position)."""
    if reference is None:
        raise ValueError("give the sequences ablated heads' means are taken over: reference=probes.reference")
    layers = sorted(set(ablated_layers))
    z_names = [interp.act_name("z", layer) for layer in layers]
    names = [interp.act_name("resid_pre", layer) for layer in layers]
    names += [interp.act_name("pattern", layer) for layer in sorted(set(pattern_layers))]
    last = interp.act_name("resid_post", model.cfg.n_layers - 1)
    tokens = probe.tokens.to(model.device)
    _, cache = model.run_with_cache(tokens, names_filter=names + [last] * final, return_type=None)
    real = torch.arange(reference.tokens.shape[1]) < reference.lengths[:, None]  # [batch, pos]: not padding
    sums, counts = {}, torch.zeros(1, real.shape[1], 1, 1)  # name -> [1, pos, head, d_head]; [1, pos, 1, 1]
    for rows in torch.arange(len(real)).split(len(probe.tokens)):  # as many sequences a run as the probe
        tokens_of_rows = reference.tokens[rows].to(model.device)
        _, run = model.run_with_cache(tokens_of_rows, names_filter=z_names, return_type=None)
        ablation = Ablation("mean", reference={name: run[name] for name in z_names}, mask=real[rows])
        batch_means = Replacement(model, z_names, ablation)
        count = real[rows].sum(0)[None, :, None, None]
        for name in z_names:  # each batch's mean by its count (where none of its sequences is real: 0)
            mean = batch_means.values(name, len(rows)).double().cpu()
            sums[name] = sums.get(name, 0) + torch.where(count > 0, mean * count, 0)
        counts += count
    dtype = next(model.parameters()).dtype
    means = {name: (total / counts).to(dtype=dtype, device=model.device) for name, total in sums.items()}
    return CleanRun(
        tokens=tokens,
        resid_pre={layer: cache["resid_pre", layer] for layer in layers},
        z_mean={layer: means[name] for layer, name in zip(layers, z_names, strict=True)},
        patterns={layer: cache["pattern", layer] for layer in pattern_layers},
        final=cache[last] if final else None,
    )


def _repeat_kinds(probe: Probe) -> Int[Tensor, " batch"]:
    """Each sequence's repeat length (0 for all if the probe has none)."""
    if probe.repeat_len is None:
        return torch.zeros(len(probe.tokens), dtype=torch.long)
    return probe.repeat_len


def looks(probe: Probe) -> list[Tensor]:
    """The probe's rows in two looks: the first half of each repeat length's sequences, then the rest."""
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
    """(rows, width) per repeat length among `rows`, cut to their longest (right padding is causal-safe)."""
    kinds = _repeat_kinds(probe)
    groups = []
    for kind in kinds[rows].unique().tolist():
        group = rows[kinds[rows] == kind]
        groups.append((group, int(probe.lengths[group].max())))
    return groups


Readout = Callable[[Tensor, Tensor, int], tuple[dict[str, Tensor], Callable[[dict[str, Tensor]], Tensor]]]
"""readout(rows, rows on the device, width) -> (hook name -> its clean value on those rows cut to width,
{name: activation} -> the measurement per row)."""


def _measure(
    model: interp.HookedTransformer,
    probe: Probe,
    clean: CleanRun,
    stage: str,
    progress: Progress | None,
    readout: Readout,
) -> Measure:
    """The `Measure` of a check: each set of heads mean-ablated on a look's rows, per repeat length,
    from the clean run at the first ablated block."""
    n_groups = len(_row_groups(probe, torch.arange(len(probe.tokens))))
    z_names = {interp.act_name("z", layer): layer for layer in clean.z_mean}

    def measure(head_sets: list[list[Head]], look: Tensor, before: int, total: int) -> list[Tensor]:
        values: Tensor | None = None  # [set, sequence, *target]
        if progress:
            progress(stage, before * n_groups, total * n_groups)
        for g, (rows, width) in enumerate(_row_groups(probe, look)):
            device_rows = rows.to(model.device)
            reads, read = readout(rows, device_rows, width)
            starts = {interp.act_name("resid_pre", layer): resid[device_rows, :width]
                      for layer, resid in clean.resid_pre.items()}  # fmt: skip
            runs = read_site_sets(
                model,
                clean.tokens[device_rows, :width],
                [ablation_sites(model, heads=heads) for heads in head_sets],
                list(reads),
                read,
                {name: clean.z_mean[layer][:, :width] for name, layer in z_names.items()},
                target=starts | reads,
                options=RunOptions(
                    progress=as_stage(
                        progress, stage, before * n_groups + g * len(head_sets), total * n_groups
                    )
                ),
            )
            for i, value in enumerate(runs):
                if values is None:
                    values = torch.zeros(len(head_sets), len(probe.tokens), *value.shape[1:])
                values[i, rows] = value
        return [] if values is None else list(values[:, look])  # None: no set to measure

    return measure


@torch.inference_mode()
def induction_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    classes: Mapping[Head, HeadClass],
    progress: Progress | None = None,
    clean: CleanRun | None = None,
    seed: int = 0,
    reference: Probe | None = None,
) -> CausalEffects:
    """Loss increase on the second copies (nats) with the candidates of `classes` (`random_head_classes`)
    mean-ablated, each judged against its random heads. `clean`: the probe's clean run (`ablated_layers`,
    final stream), if made; else made with the means over `reference` (`clean_run_for_ablations`)."""
    if clean is None:
        clean = clean_run_for_ablations(model, probe, reference, ablated_layers(classes), final=True)
    tokens = probe.tokens.to(model.device)
    second = probe.second_copy_predictions().to(model.device)  # [batch, pos - 1]
    final_name = final_resid_hook(model)

    def readout(rows: Tensor, device_rows: Tensor, width: int):
        """Mean loss per sequence on its second copy (logits only where it is scored)."""
        scored = second[device_rows, : width - 1]
        r, pos = scored.nonzero(as_tuple=True)
        targets = tokens[device_rows][r, pos + 1]

        def loss(acts: dict[str, Tensor]) -> Tensor:
            logits = model.unembed(model.ln_final(acts[final_name][r, pos][:, None]))[:, 0]
            per_token = torch.zeros(scored.shape, dtype=torch.float32, device=scored.device)
            per_token[r, pos] = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
            return (per_token.sum(-1) / scored.sum(-1)).float().cpu()

        return {final_name: clean.final[device_rows, :width]}, loss

    measure = _measure(model, probe, clean, INDUCTION_STAGE, progress, readout)
    strata = length_strata(probe)
    return _candidate_effects(classes, measure, 1, MIN_EFFECT["induction"], looks(probe), strata, seed)


@torch.inference_mode()
def previous_token_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    classes: Mapping[Head, HeadClass],
    targets: Sequence[Head],
    progress: Progress | None = None,
    clean: CleanRun | None = None,
    seed: int = 0,
    reference: Probe | None = None,
) -> CausalEffects:
    """Drop in the mean induction score of the `targets` after each candidate's layer with the
    candidates of `classes` (`random_head_classes`) mean-ablated, each judged against its random heads
    (every candidate together: the targets after the earliest); candidates at or after the last
    target's layer are not tested. `clean`: the probe's clean run (`ablated_layers`, targets'
    patterns), if made; else made with the means over `reference` (`clean_run_for_ablations`)."""
    classes = {head: found for head, found in classes.items() if any(lt > head[0] for lt, _ in targets)}
    start = min((layer for layer, _ in classes), default=0)
    later = [target for target in targets if target[0] > start]
    if not classes or not later:
        return CausalEffects(min_effect=MIN_EFFECT["previous_token"])
    target_layers = sorted({layer for layer, _ in later})
    if clean is None:
        clean = clean_run_for_ablations(model, probe, reference, ablated_layers(classes), target_layers)

    def readout(rows: Tensor, device_rows: Tensor, width: int):
        """Mean induction score of the later targets per sequence."""
        lengths = probe.lengths[rows]
        masks = {"induction": score_masks(probe.tokens[rows, :width], lengths)["induction"]}

        def score(patterns: dict[str, Tensor]) -> Tensor:  # [rows, target]
            per_target = [
                pattern_scores(
                    patterns[interp.act_name("pattern", lt)][:, ht : ht + 1].float().cpu(), masks, lengths
                )["induction"][:, 0]
                for lt, ht in later
            ]
            return torch.stack(per_target, -1)

        reads = {
            interp.act_name("pattern", layer): clean.patterns[layer][device_rows][:, :, :width, :width]
            for layer in target_layers
        }
        return reads, score

    def after(candidate: Head | None) -> Tensor:
        layer = start if candidate is None else candidate[0]
        return torch.tensor([target_layer > layer for target_layer, _ in later])

    measure = _measure(model, probe, clean, PREVIOUS_TOKEN_STAGE, progress, readout)
    strata = length_strata(probe)
    min_effect = MIN_EFFECT["previous_token"]
    return _candidate_effects(classes, measure, -1, min_effect, looks(probe), strata, seed, after)


def never_random(scores: HeadScores) -> list[Head]:
    """The heads no random set holds: every head over either checked type's threshold (an induction
    head is not compared with previous-token heads, nor the reverse)."""
    return sorted({head for kind in CAUSAL_TYPES for head in scores.candidates(kind)})


def causal_checks(
    model: interp.HookedTransformer,
    probes: Probes,
    scores: HeadScores,
    max_candidates: int = 12,
    progress: Progress | None = None,
    stages: StageResults | None = None,
    n_random: int = N_RANDOM,
    seed: int = 0,
) -> dict[str, CausalEffects]:
    """Stage 4 of `head_report`: up to `max_candidates` induction, then previous-token candidates
    mean-ablated on `probes.held_out`, each against `n_random` random heads of its layer over neither
    type's threshold ({} without induction candidates). stages: each check kept as it finishes."""
    induction = scores.candidates("induction", max_candidates)
    if not induction:
        if progress is not None:
            for stage in (INDUCTION_STAGE, PREVIOUS_TOKEN_STAGE):
                progress(f"{stage}: no induction candidate", 0, 0)
        return {}
    previous_token = scores.candidates("previous_token", max_candidates)
    typed = never_random(scores)
    induction_layers = sorted({layer for layer, _ in induction})

    def first_read(layer: int) -> int:  # a previous-token check reads the induction heads after `layer`
        return next((later for later in induction_layers if later > layer), model.cfg.n_layers)

    classes = {
        "induction": random_head_classes(model, induction, typed, n_random, seed),
        "previous_token": random_head_classes(model, previous_token, typed, n_random, seed, below=first_read),
    }
    # One clean run for both checks: the targets of the previous-token check are induction candidates.
    layers = [layer for layer, _ in induction + previous_token]
    ablated = [layer for found in classes.values() for layer in ablated_layers(found)]
    if progress is not None:
        progress(CLEAN_RUN_STAGE, 0, 1)
    clean = clean_run_for_ablations(model, probes.held_out, probes.reference, ablated, layers, final=True)
    if progress is not None:
        progress(CLEAN_RUN_STAGE, 1, 1)
    stages, probe = StageResults() if stages is None else stages, probes.held_out

    def checked(kind: str, stage: str, run: Callable[[], CausalEffects]) -> CausalEffects:
        effects = stages.run(stage, run, progress)
        return with_held_out_scores(effects, probe, clean, list(classes[kind]), kind, scores.thresholds)

    found = checked(
        "induction",
        INDUCTION_STAGE,
        lambda: induction_ablation_effects(model, probe, classes["induction"], progress, clean, seed),
    )
    targets = [head for head in induction if found.confirmed(head)] or induction
    previous = checked(
        "previous_token",
        PREVIOUS_TOKEN_STAGE,
        lambda: previous_token_ablation_effects(
            model, probe, classes["previous_token"], targets, progress, clean, seed
        ),
    )
    return {"induction": found, "previous_token": previous}


def with_held_out_scores(
    effects: CausalEffects,
    probe: Probe,
    clean: CleanRun,
    heads: Sequence[Head],
    head_type: str,
    thresholds: dict[str, float],
) -> CausalEffects:
    """`effects` with each of `heads`' `head_type` score (`scores.type_score`) on `probe`, from the clean
    run's patterns, and the type's threshold the verdicts read them by."""
    masks = {head_type: score_masks(probe.tokens, probe.lengths)[head_type]}  # the same for every layer
    found = {}
    for layer in sorted({layer for layer, _ in heads}):
        of_layer = [head for lh, head in heads if lh == layer]
        pattern = clean.patterns[layer][:, of_layer].float().cpu()  # [batch, head, q, k]
        per_sequence = pattern_scores(pattern, masks, probe.lengths)[head_type]  # [batch, head]
        score = type_score(head_type, per_sequence, probe.repeat_len)  # [head]
        found |= {(layer, head): float(value) for head, value in zip(of_layer, score, strict=True)}
    return dataclasses.replace(effects, held_out_scores=found, score_threshold=thresholds[head_type])
