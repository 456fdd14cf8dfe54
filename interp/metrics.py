"""Metrics for causal interventions: functions of logits that return one value per prompt.

Every metric maps logits [batch, pos, d_vocab] to a per-example tensor [batch]; the patching and
ablation functions average, bootstrap and tabulate those. Positions are None (the last position),
an int, or a LongTensor [batch] (one position per prompt, e.g. each IOI prompt's END).

    metric = lambda logits: logit_diff(logits, io_token, s_token, pos=end)
    metric = normalized(metric, clean_logits, corrupted_logits)   # 0 = corrupted, 1 = clean
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.cache import Pos

Metric = Callable[[Tensor], Tensor]


def next_token_loss(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"], per_token: bool = False
) -> Tensor:
    """Cross-entropy of predicting tokens[:, 1:] from logits[:, :-1], in nats."""
    log_probs = logits[:, :-1].float().log_softmax(-1)
    loss = -log_probs.gather(-1, tokens[:, 1:, None])[..., 0]  # [batch, pos-1]
    return loss if per_token else loss.mean()


def logits_at(logits: Float[Tensor, "batch pos d_vocab"], pos: Pos = None) -> Float[Tensor, "batch d_vocab"]:
    """The logits at one position per prompt: None = last, int = the same for all, [batch] = per prompt."""
    if logits.ndim != 3:
        raise ValueError(f"logits must be [batch, pos, d_vocab], got shape {tuple(logits.shape)}")
    if pos is None:
        return logits[:, -1]
    if isinstance(pos, int):
        if not -logits.shape[1] <= pos < logits.shape[1]:
            raise ValueError(f"position {pos} is out of range for {logits.shape[1]} positions")
        return logits[:, pos]
    pos = torch.as_tensor(pos, device=logits.device)
    if pos.shape != (logits.shape[0],):
        raise ValueError(f"per-prompt positions must be [batch={logits.shape[0]}], got {tuple(pos.shape)}")
    if pos.numel() and (pos.min() < 0 or pos.max() >= logits.shape[1]):
        raise ValueError(f"positions must lie in [0, {logits.shape[1]}), got {pos.min()}..{pos.max()}")
    return logits[torch.arange(logits.shape[0], device=logits.device), pos]


def _token_values(values: Float[Tensor, "batch d_vocab"], tokens: Tensor) -> Float[Tensor, " batch"]:
    """values[b, tokens[b]] for tokens [batch], or the mean over answers for tokens [batch, n]."""
    tokens = torch.as_tensor(tokens, device=values.device).long()
    if tokens.ndim == 0:
        tokens = tokens.expand(values.shape[0])
    if tokens.shape[0] != values.shape[0] or tokens.ndim > 2:
        raise ValueError(
            f"answer tokens must be [batch={values.shape[0]}] or [batch, n], got {tuple(tokens.shape)}"
        )
    gathered = values.gather(-1, tokens.view(tokens.shape[0], -1))  # [batch, n]
    return gathered.mean(-1)


def logit_diff(
    logits: Float[Tensor, "batch pos d_vocab"],
    correct: Int[Tensor, " batch"],
    incorrect: Int[Tensor, " batch"],
    pos: Pos = None,
) -> Float[Tensor, " batch"]:
    """logit(correct) - logit(incorrect) at `pos`, per prompt (answers [batch] or [batch, n]: mean logit)."""
    end = logits_at(logits, pos).float()
    return _token_values(end, correct) - _token_values(end, incorrect)


def answer_logprob(
    logits: Float[Tensor, "batch pos d_vocab"], answer: Int[Tensor, " batch"], pos: Pos = None
) -> Float[Tensor, " batch"]:
    """log p(answer) at `pos`, per prompt."""
    return _token_values(logits_at(logits, pos).float().log_softmax(-1), answer)


def answer_prob(
    logits: Float[Tensor, "batch pos d_vocab"], answer: Int[Tensor, " batch"], pos: Pos = None
) -> Float[Tensor, " batch"]:
    """p(answer) at `pos`, per prompt."""
    return answer_logprob(logits, answer, pos).exp()


def kl_divergence(
    logits: Float[Tensor, "batch pos d_vocab"],
    reference_logits: Float[Tensor, "batch pos d_vocab"],
    pos: Pos = None,
) -> Float[Tensor, " batch"]:
    """KL(reference || model) at `pos`, in nats, per prompt (reference = the clean run)."""
    if logits.shape != reference_logits.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and reference {tuple(reference_logits.shape)} differ in shape"
        )
    log_p = logits_at(reference_logits, pos).float().log_softmax(-1)
    log_q = logits_at(logits, pos).float().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def loss(
    logits: Float[Tensor, "batch pos d_vocab"], tokens: Int[Tensor, "batch pos"]
) -> Float[Tensor, " batch"]:
    """Mean next-token cross-entropy of each prompt, in nats."""
    if tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"tokens {tuple(tokens.shape)} must match logits' [batch, pos] {tuple(logits.shape[:2])}"
        )
    return next_token_loss(logits, tokens.to(logits.device), per_token=True).mean(-1)


def normalized(metric: Metric, clean_logits: Tensor, corrupted_logits: Tensor) -> Metric:
    """The patching metric (m - m_corrupted) / (m_clean - m_corrupted): 0 = corrupted run, 1 = clean run.

    The baselines are the batch means of `metric` on the two runs (per-example baselines would blow
    up on prompts whose clean and corrupted values happen to be close).
    """
    clean_value = metric(clean_logits).mean()
    corrupted_value = metric(corrupted_logits).mean()
    gap = clean_value - corrupted_value
    if gap.abs() < 1e-8:
        raise ValueError("the metric is the same on the clean and corrupted runs, so it cannot be normalised")

    def normalized_metric(logits: Tensor) -> Tensor:
        return (metric(logits) - corrupted_value) / gap

    return normalized_metric
