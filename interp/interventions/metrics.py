"""Metrics for causal interventions: functions of logits that return one value per prompt.

One metric type (`interp.types.Metric`): logits [batch, pos, d_vocab] -> [batch]. A metric with
per-prompt answers may also take the prompts' indices, metric(logits, rows), so that it can score
a sub-batch; `AnswerMetric` (`logit_diff_metric`, `prob_metric`) does, and every batched function
calls metrics through `for_rows`. Positions are None (the last position), an int, or a LongTensor
[batch] (one position per prompt, e.g. each IOI prompt's END).

    metric = logit_diff_metric(io_token, s_token, pos=end)               # metric(logits[, rows])
    metric = lambda logits: logit_diff(logits, io_token, s_token, pos=end)   # all prompts at once
    metric = normalized(metric, clean_logits, corrupted_logits)   # 0 = corrupted, 1 = clean
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.checks import check_denominator, check_metric_output
from interp.model.transformer import next_token_loss as next_token_loss  # the model's own loss
from interp.types import Metric as Metric
from interp.types import Pos


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
    tokens = torch.as_tensor(tokens, device=values.device)
    if tokens.is_floating_point() or tokens.dtype == torch.bool or tokens.is_complex():
        raise TypeError(f"answer tokens must be integer token ids, got dtype {tokens.dtype}; pass token ids")
    tokens = tokens.long()
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= values.shape[-1]):
        raise ValueError(
            f"answer token ids must lie in [0, {values.shape[-1]}) (negative ids are not counted from the "
            f"end), got {tokens.min().item()}..{tokens.max().item()}; pass ids from model.to_single_token"
        )
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
    clean_value = check_metric_output(metric(clean_logits), clean_logits.shape[0]).mean()
    corrupted_value = check_metric_output(metric(corrupted_logits), corrupted_logits.shape[0]).mean()
    gap = clean_value - corrupted_value
    check_denominator(
        float(gap.detach()),
        float(clean_value.detach().abs()),
        "the metric is the same on the clean and corrupted runs, so the normalised metric",
    )

    def normalized_metric(logits: Tensor) -> Tensor:
        return (metric(logits) - corrupted_value) / gap

    return normalized_metric


@dataclass
class AnswerMetric:
    """A metric with per-prompt answers read at one position per prompt (None: the last):
    logit(correct) - logit(incorrect) ("logit_diff") or p(correct) ("prob"); several answers per
    prompt ([batch, n]) are averaged.

    `metric(logits)` scores every prompt; `metric(logits, rows)` scores the prompts `rows` ([batch]
    indices into the answers) when logits hold a sub-batch. Knowing the position lets batched runs
    unembed that position only (`positions`).
    """

    kind: Literal["logit_diff", "prob"]
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"]
    incorrect: Int[Tensor, " batch"] | Int[Tensor, "batch n"] | None = None
    pos: Int[Tensor, " batch"] | None = None

    def __call__(
        self, logits: Float[Tensor, "batch pos d_vocab"], rows: Int[Tensor, " batch"] | None = None
    ) -> Float[Tensor, " batch"]:
        rows = torch.arange(logits.shape[0]) if rows is None else rows
        end = logits_at(logits, None if self.pos is None else self.pos[rows]).float()
        if self.kind == "prob":
            return _token_values(end.softmax(-1), self.correct[rows])
        return _token_values(end, self.correct[rows]) - _token_values(end, self.incorrect[rows])

    def positions(self, rows: Int[Tensor, " batch"], n_pos: int) -> Int[Tensor, " batch"]:
        """The position each of `rows` is read at."""
        return torch.full_like(rows, n_pos - 1) if self.pos is None else self.pos[rows]


def logit_diff_metric(
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"],
    incorrect: Int[Tensor, " batch"] | Int[Tensor, "batch n"],
    pos: Int[Tensor, " batch"] | None = None,
) -> AnswerMetric:
    """logit(correct) - logit(incorrect) at each prompt's position (None: the last)."""
    return AnswerMetric("logit_diff", correct, incorrect, pos)


def prob_metric(
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"], pos: Int[Tensor, " batch"] | None = None
) -> AnswerMetric:
    """p(correct) at each prompt's position (several answers: the mean probability)."""
    return AnswerMetric("prob", correct, None, pos)


def takes_rows(metric: Metric) -> bool:
    """Whether `metric` is called as metric(logits, rows) (per-prompt answers) or metric(logits)."""
    if isinstance(metric, AnswerMetric):
        return True
    try:
        parameters = inspect.signature(metric).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


def for_rows(metric: Metric, rows: Int[Tensor, " batch"], n_prompts: int) -> Callable[[Tensor], Tensor]:
    """`metric` as a function of the logits of the prompts `rows` (a sub-batch of n_prompts), its
    value checked to hold one value per row (`check_metric_output`; NaN is left to the caller)."""
    if not takes_rows(metric) and (
        len(rows) != n_prompts or not torch.equal(rows.cpu(), torch.arange(n_prompts))
    ):
        raise ValueError(
            "This metric takes logits only (metric(logits)), but the prompts run in sub-batches. Give "
            "it the prompts' indices too (metric(logits, rows)), e.g. metrics.logit_diff_metric(correct, "
            "incorrect, pos), or a batch size that holds every prompt."
        )

    def of_rows(logits: Tensor) -> Tensor:
        value = metric(logits, rows) if takes_rows(metric) else metric(logits)
        return check_metric_output(value, len(rows), finite=False)

    return of_rows
