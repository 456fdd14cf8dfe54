"""What classifies a selected head (selection: `circuits.evidence.select_heads`): the candidate class
whose attention between IOI roles it shows most strongly (mean attention above an adaptive threshold,
`attention_threshold`) and, for a class that writes to the logits, its direct logit attribution at END
the class's way (`CLASS_WRITES`; through the final norm, and a post-norm model's ln1_post, frozen at
the clean run's scale)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

import interp
from circuits.discovery import end_logits_and_cache
from circuits.ioi.results import ATTENTION_KINDS, CLASS_KIND, CLASS_WRITES, HeadEvidence, Settings
from interp.interventions.stats import median_mad
from interp.tasks.ioi_prompts import IOIPrompts
from interp.types import Head


@torch.no_grad()
def attention_evidence(
    model: interp.HookedTransformer, prompts: IOIPrompts, cache: interp.ActivationCache
) -> dict[str, Tensor]:
    """Mean attention of every head between IOI roles: kind ("END->IO", ...) -> [layer, head]."""
    rows = torch.arange(len(prompts))
    evidence = {}
    for kind, (query, key) in ATTENTION_KINDS.items():
        q, k = prompts.positions[query].cpu(), prompts.positions[key].cpu()
        evidence[kind] = torch.stack(
            [cache["pattern", layer].cpu()[rows, :, q, k].mean(0) for layer in range(model.cfg.n_layers)]
        )  # [layer, head]
    return evidence


@torch.no_grad()
def direct_logit_attributions(
    model: interp.HookedTransformer, prompts: IOIPrompts, cache: interp.ActivationCache | None = None
) -> dict[str, Tensor]:
    """Each head's mean direct effect on the IO and S logits at END, each against the mean logit over
    the vocabulary (a shift of every logit alike changes no probability, so raw and centred
    unembeddings give the same), in logits: {"IO", "S"} -> [layer, head]. cache:
    `end_logits_and_cache`'s, if run already."""
    cfg = model.cfg
    if cache is None:
        names = [*model.head_contribution_hook_names(), interp.act_name("scale")]
        _, cache = model.run_with_cache(prompts.tokens.to(model.device), names_filter=names, return_type=None)
    end = prompts.positions["END"].to(model.device)
    stack = cache.stack_head_contributions(pos=end, apply_ln=True)  # [layer * head, batch, d_model]
    attributions = {}
    mean_logit = model.W_U.mean(-1)  # [d_model]
    for role, tokens in (("IO", prompts.io_token), ("S", prompts.s_token)):
        directions = model.W_U[:, tokens.to(model.device)].T - mean_logit  # [batch, d_model]
        per_prompt = (stack * directions).sum(-1)  # [layer * head, batch]
        attributions[role] = per_prompt.mean(-1).view(cfg.n_layers, cfg.n_heads).float().cpu()
    return attributions


def attention_threshold(scores: Tensor, z: float, floor: float, ceiling: float) -> float:
    """Attention a head needs to show a pattern: median + z robust SDs over all heads, at least `floor`,
    at most `ceiling`."""
    median, mad = median_mad(scores)
    return min(max((median + z * 1.4826 * mad).item(), floor), max(ceiling, floor))


@dataclass
class ClassEvidence:
    """What classifies a head, measured once on the clean prompts: attention kind ("END->IO", ...) ->
    [layer, head] mean attention and its threshold; "IO", "S" -> [layer, head] direct logit attribution."""

    attention: dict[str, Tensor]
    thresholds: dict[str, float]
    direct_logit_attribution: dict[str, Tensor]

    def shows(self, head: Head, cls: str) -> bool:
        """The head shows the class's attention pattern (and, for writers, writes its way)."""
        kind = CLASS_KIND[cls]
        if self.attention[kind][head].item() < self.thresholds[kind]:
            return False
        logit, sign = CLASS_WRITES.get(cls, (None, 0))
        return logit is None or sign * self.direct_logit_attribution[logit][head].item() > 0

    def strongest(self, candidates: Sequence[str], head: Head) -> str | None:
        """The candidate class whose attention the head shows most strongly (None: none)."""
        shown = [cls for cls in candidates if self.shows(head, cls)]
        return max(shown, key=lambda cls: self.attention[CLASS_KIND[cls]][head].item(), default=None)

    def record(self, head: Head, step: str, effect: Tensor, z: Tensor) -> HeadEvidence:
        """The evidence for `head`, found by sweep `step` with effects and z-scores [layer, head]."""
        return HeadEvidence(
            layer=head[0],
            head=head[1],
            effect=effect[head].item(),
            z=z[head].item(),
            step=step,
            attention={kind: scores[head].item() for kind, scores in self.attention.items()},
            direct_logit_attribution={
                logit: values[head].item() for logit, values in self.direct_logit_attribution.items()
            },
        )


def measure_class_evidence(
    model: interp.HookedTransformer,
    prompts: IOIPrompts,
    settings: Settings,
    cache: interp.ActivationCache | None = None,
) -> ClassEvidence:
    """Attention, thresholds and direct logit attribution of every head on `prompts` (cache:
    `end_logits_and_cache`'s, if run already)."""
    if cache is None:
        _, cache = end_logits_and_cache(model, prompts)
    attention = attention_evidence(model, prompts, cache)
    s = settings
    thresholds = {
        kind: attention_threshold(scores, s.attention_z, s.min_attention, s.large_attention)
        for kind, scores in attention.items()
    }
    return ClassEvidence(attention, thresholds, direct_logit_attributions(model, prompts, cache))
