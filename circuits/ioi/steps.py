"""The steps of the IOI circuit discovery (Wang et al. 2022, section 3), one function per step, walking
back from the logits. Each path-patches each sender's output from the ABC run along one path (into the
previous step's heads) and measures the drop of logit(IO) - logit(S) at END, relative to the clean one
((clean - patched) / clean; positive: the head helps predict IO), selects the heads that stand out and
classifies them (`circuits.ioi.evidence`):

  1. find_name_movers                          heads -> logits: name movers, negative name movers,
                                               S-suppression heads
  2. find_s_inhibition_heads                   heads -> name movers' (then S-suppression heads')
                                               queries at END
  3. find_induction_and_duplicate_token_heads  heads -> S-inhibition heads' own values at S2
  4. find_previous_token_heads                 heads -> induction heads' own keys at S1+1
  5. find_backup_name_movers                   heads -> logits, name movers mean-ablated (growth)

A step run on its own: docs/guide/ioi.md.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

import interp
from circuits.evidence import every_head, select_heads
from circuits.ioi.evidence import ClassEvidence
from circuits.ioi.patching import MeanAblation, SenderEffects, path_patching_effects
from circuits.ioi.results import HeadEvidence, Settings
from interp.checks import check_finite_scores
from interp.interventions.engine import forward_logits
from interp.tasks.ioi_prompts import IOIPrompts
from interp.types import Head, Progress, head_label


@dataclass
class PatchingPrompts:
    """The first `n_patching_prompts` clean and ABC prompts (one forward pass per sender, the cost of
    the discovery) and their mean clean logit diff (logits), which every step's effect is relative to."""

    clean: IOIPrompts
    abc: IOIPrompts
    logit_diff: float


def patching_prompts(
    model: interp.HookedTransformer,
    clean: IOIPrompts,
    abc: IOIPrompts,
    n_prompts: int,
    clean_logits: Tensor | None = None,
) -> PatchingPrompts:
    """The first `n_prompts` of (clean, abc) on the model's device, with their mean clean logit diff
    (clean_logits [batch, pos, d_vocab]: the clean run's on all of `clean`, if run already)."""
    n = min(n_prompts, len(clean))
    first, first_abc = clean[:n].to(model.device), abc[:n].to(model.device)
    if clean_logits is None:
        with torch.no_grad():
            diffs = first.logit_diff(forward_logits(model, first.tokens, first.positions["END"]))
    else:
        diffs = clean.logit_diff(clean_logits)[:n]
    return PatchingPrompts(first, first_abc, diffs.mean().item())


@dataclass(kw_only=True)
class StepResult:
    """What one step found: sweep -> [layer, head] relative drops (NaN: not a sender) and the senders
    path-patched (bool; the others keep EAP's estimate), class -> heads (strongest first), selected
    heads no class fits, selection -> its figures, stage -> seconds."""

    effects: dict[str, Tensor] = field(default_factory=dict)
    path_patched: dict[str, Tensor] = field(default_factory=dict)
    classes: dict[str, list[HeadEvidence]] = field(default_factory=dict)
    unclassified: list[HeadEvidence] = field(default_factory=list)
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    def heads(self, cls: str) -> list[Head]:
        """The heads the step put in class `cls`, strongest effect first."""
        return [(h.layer, h.head) for h in self.classes.get(cls, [])]


@contextmanager
def timed(name: str, timings: dict[str, float], progress: Progress | None = None) -> Iterator[None]:
    """Record the block's seconds in timings[name], reported to `progress` as (name, 0, 1), (name, 1, 1)."""
    if progress:
        progress(name, 0, 1)
    began = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - began
    if progress:
        progress(name, 1, 1)


@dataclass(kw_only=True)
class StepInputs:
    """What every step needs; sender_effects: `path_patching_effects` (every sender) or `EAPRanking`."""

    model: interp.HookedTransformer
    prompts: PatchingPrompts
    settings: Settings
    evidence: ClassEvidence
    sender_effects: SenderEffects = path_patching_effects
    progress: Progress | None = None


@dataclass
class _Step:
    """A step being run: its inputs, and what it found so far."""

    inputs: StepInputs
    result: StepResult = field(default_factory=StepResult)

    def sweep(
        self,
        name: str,
        receivers: Sequence[Head] | None = None,
        receiver_input: str | None = None,
        position: str = "END",
        senders: Sequence[Head] | None = None,
        ablated: tuple[MeanAblation, Sequence[Head]] | None = None,
        stage: str | None = None,
        every_sender: bool = False,
    ) -> Tensor:
        """Relative drops [layer, head] of the senders' paths to `receivers` (None: the logits), timed
        and reported as `stage` (default "path patching: heads -> {name}"); every_sender: each
        path-patched, whatever the inputs' `sender_effects`."""
        inputs = self.inputs
        clean, abc = inputs.prompts.clean, inputs.prompts.abc
        sender_effects = path_patching_effects if every_sender else inputs.sender_effects
        with timed(stage or f"path patching: heads -> {name}", self.result.timings, inputs.progress):
            drop = sender_effects(
                inputs.model, clean, abc, receivers, receiver_input, position, senders, ablated
            )
            effects = drop / inputs.prompts.logit_diff
        senders = ~effects.isnan()  # NaN marks heads that are not senders in this sweep
        patched = getattr(sender_effects, "path_patched", None)  # `SenderEffects`
        self.result.path_patched[name] = senders if patched is None else patched & senders
        check_finite_scores(
            effects.where(senders, 0.0) if senders.any() else effects,
            f"the path-patching effects of {name}",
            lambda i: head_label(*i),
        )
        self.result.effects[name] = effects
        return effects

    def select(
        self,
        sweep: str,
        effects: Tensor,
        sign: int,
        label: str,
        candidates: Sequence[str],
        exclude: Collection[Head] = (),
    ) -> None:
        """Select heads by their effects in direction `sign` (+1: they help) and put each (except
        `exclude`) into the candidate class it shows most strongly, or among the unclassified."""
        s = self.inputs.settings
        heads, z, figures = select_heads(effects, sign, s.effect_z, s.min_effect, s.min_share)
        self.result.thresholds[label] = figures
        for head in heads:
            if head in exclude:
                continue
            cls = self.inputs.evidence.strongest(candidates, head)
            found = self.inputs.evidence.record(head, sweep, effects, z)
            if cls is None:
                self.result.unclassified.append(found)
            elif head not in self.result.heads(cls):
                self.result.classes.setdefault(cls, []).append(found)

    def sweep_receivers(
        self,
        name: str,
        receiver_class: str,
        receivers: Sequence[Head],
        receiver_input: str,
        position: str,
        candidates: Sequence[str],
    ) -> None:
        """Heads that help through the receivers' `receiver_input` at `position` (a positive drop)."""
        if not receivers or max(layer for layer, _ in receivers) == 0:  # no heads before layer 0
            if self.inputs.progress:  # a stage with nothing to do
                skipped = f"path patching: heads -> {name} (skipped: no {receiver_class} heads after layer 0)"
                self.inputs.progress(skipped, 0, 0)
            return
        effects = self.sweep(name, receivers, receiver_input, position)
        self.select(name, effects, 1, name, candidates)


def find_name_movers(inputs: StepInputs) -> StepResult:
    """Step 1, heads -> logits, sweep "logits": name movers (END->IO, write IO) and S-suppression heads
    (END->S2, write against S) help; negative name movers (END->IO, write against IO) work against IO."""
    step = _Step(inputs)
    effects = step.sweep("logits")
    step.select("logits", effects, 1, "logits (name_mover, s_suppression)", ("name_mover", "s_suppression"))
    step.select("logits", effects, -1, "logits (negative_name_mover)", ("negative_name_mover",))
    return step.result


def find_s_inhibition_heads(
    inputs: StepInputs, name_movers: Sequence[Head], s_suppression: Sequence[Head]
) -> StepResult:
    """Step 2, heads -> the queries at END of the name movers ("name_mover_queries"), then of the
    S-suppression heads ("s_suppression_queries"): S-inhibition heads (END->S2)."""
    step = _Step(inputs)
    step.sweep_receivers("name_mover_queries", "name_mover", name_movers, "q", "END", ("s_inhibition",))
    step.sweep_receivers(
        "s_suppression_queries", "s_suppression", s_suppression, "q", "END", ("s_inhibition",)
    )
    return step.result


def find_induction_and_duplicate_token_heads(inputs: StepInputs, s_inhibition: Sequence[Head]) -> StepResult:
    """Step 3, heads -> the S-inhibition heads' values at S2 ("s_inhibition_values"): induction heads
    (S2->S1+1) and duplicate-token heads (S2->S1). Under grouped-query attention each S-inhibition
    head's own copy of its value is patched, not its key/value head's, which the other query heads of
    its group read too (`circuits.ioi.patching.shared_by_a_group`)."""
    step = _Step(inputs)
    candidates = ("induction", "duplicate_token")
    step.sweep_receivers("s_inhibition_values", "s_inhibition", s_inhibition, "v", "S2", candidates)
    return step.result


def find_previous_token_heads(inputs: StepInputs, induction: Sequence[Head]) -> StepResult:
    """Step 4, heads -> the induction heads' keys at S1+1 ("induction_keys"): previous-token heads
    (under grouped-query attention, each induction head's own copy of its key, as step 3's values)."""
    step = _Step(inputs)
    step.sweep_receivers("induction_keys", "induction", induction, "k", "S1+1", ("previous_token",))
    return step.result


def find_backup_name_movers(
    inputs: StepInputs,
    name_movers: Sequence[Head],
    direct_effects: Tensor,
    classified: Collection[Head],
    mean_ablation: MeanAblation,
) -> StepResult:
    """Step 5, heads -> logits with the name movers mean-ablated ("logits_without_name_movers"): backup
    name movers are heads after the first name mover's layer whose direct effect grows ("backup_growth":
    minus step 1's `direct_effects` [layer, head]) and that attend and write like name movers; heads
    already `classified` are not backups. Every sender is path-patched, whatever the inputs'
    `sender_effects`: they are the heads after the first name mover's layer, whose patched runs are
    short, where EAP's ranking would take an attribution of its own under the ablation (SmolLM2-135M,
    54 senders: 2.2 s path-patching all of them, 4.2 s ranking them)."""
    step = _Step(inputs)
    first_layer = min(name_movers)[0] if name_movers else inputs.model.cfg.n_layers
    senders = [head for head in every_head(inputs.model) if head[0] > first_layer and head not in name_movers]
    if not senders:
        return step.result
    ablated = step.sweep(
        "logits_without_name_movers",
        senders=senders,
        ablated=(mean_ablation, list(name_movers)),
        stage="path patching: heads -> logits, name movers ablated",
        every_sender=True,
    )
    growth = ablated - direct_effects
    step.result.effects["backup_growth"] = growth
    step.select("backup_growth", growth, 1, "backup_growth", ("backup_name_mover",), exclude=classified)
    return step.result
