"""Metrics for causal interventions: functions of logits that return one value per prompt.

One metric type (`interp.types.Metric`): logits [batch, pos, d_vocab] -> [batch]. A metric with
per-prompt answers may also take the prompts' indices, metric(logits, rows), so that it can score
a sub-batch; `AnswerMetric` (`logit_diff_metric`, `prob_metric`) does, and every batched function
calls metrics through `for_rows`. Positions are None (the last position), an int (negative ones
count from the end, as Python's and TransformerLens's `-1`), or a LongTensor [batch] (one position
per prompt, e.g. each IOI prompt's END, or each prompt's last real token:
`model.last_positions(tokens)`).

Padding: `model.to_tokens([short, long])` pads on the right, so the last position of a short prompt
is padding. A metric never reads it: None and ints are refused where they land on a prompt's
padding (logits of the model's forward pass record their prompts' last real tokens; interp's
patching, ablation and edge functions check their prompts, `check_reads_real_tokens`); per-prompt
positions are read as given.

    metric = logit_diff_metric(io_token, s_token, pos=end)               # metric(logits[, rows])
    metric = logit_diff_metric(io_token, s_token, pos=model.last_positions(tokens))   # padded prompts
    metric = lambda logits: logit_diff(logits, io_token, s_token, pos=end)   # all prompts at once
    metric = normalized(metric, clean_logits, corrupted_logits)   # 0 = corrupted, 1 = clean
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from interp.checks import check_attention_mask, check_denominator, check_metric_output
from interp.model.tokens import FIRST_POSITIONS, LAST_POSITIONS, recorded_padding
from interp.model.transformer import next_token_loss as next_token_loss  # the model's own loss
from interp.types import Metric as Metric
from interp.types import Pos

if TYPE_CHECKING:
    from interp.model.transformer import HookedTransformer

MetricPos = int | Int[Tensor, " batch"] | None
"""A metric's position: None (the last), an int (negative: from the end), or one per prompt [batch]."""

PADDING_FIX = (
    "pass pos=model.last_positions(tokens) (each prompt's last real token), or pad on the left "
    "(model.default_padding_side = 'left')"
)


def check_metric_pos(pos: Any, what: str = "pos") -> MetricPos:
    """A metric's position checked for its type: None, an int (a 0-d integer tensor too), or integer
    positions [batch] (a LongTensor or a list of ints), returned as None, int or LongTensor."""
    if pos is None:
        return None
    if isinstance(pos, numbers.Integral) and not isinstance(pos, bool):
        return int(pos)
    integers = isinstance(pos, Sequence) and not isinstance(pos, str) and len(pos) > 0
    if integers and all(isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in pos):
        return torch.tensor([int(p) for p in pos])
    integer_tensor = isinstance(pos, Tensor) and not (pos.is_floating_point() or pos.is_complex())
    if integer_tensor and pos.dtype != torch.bool:
        if pos.ndim == 0:
            return int(pos)
        if pos.ndim == 1:
            return pos.long()
        raise ValueError(f"{what} must be one position per prompt [batch], got shape {tuple(pos.shape)}")
    shown = f"{type(pos).__name__} {pos!r}"[:60]
    raise TypeError(
        f"{what} must be None (the last position), an int (-1: the last) or a LongTensor [batch] "
        f"(one position per prompt), got {shown}"
    )


def positions_read(pos: MetricPos, batch: int, n_pos: int, what: str = "pos") -> Int[Tensor, " batch"]:
    """The position [batch] that `pos` reads in each prompt of n_pos positions, in [0, n_pos)."""
    pos = check_metric_pos(pos, what)
    if pos is None:
        return torch.full((batch,), n_pos - 1, dtype=torch.long)
    if isinstance(pos, int):
        if not -n_pos <= pos < n_pos:
            raise ValueError(
                f"{what}={pos} is out of range for {n_pos} positions; pass {-n_pos}..{n_pos - 1}"
            )
        return torch.full((batch,), pos % n_pos, dtype=torch.long)
    if pos.shape != (batch,):
        raise ValueError(f"per-prompt positions must be [batch={batch}], got {tuple(pos.shape)}")
    if pos.numel() and (pos.min() < -n_pos or pos.max() >= n_pos):
        raise ValueError(
            f"positions must lie in [-{n_pos}, {n_pos}) (negative: from the end), "
            f"got {pos.min()}..{pos.max()}"
        )
    return pos % n_pos


def refuse_padding(
    last: Int[Tensor, " batch"],
    read: Int[Tensor, " batch"],
    n_pos: int,
    what: str = "the metric reads",
    first: Int[Tensor, " batch"] | None = None,
    fix: str = PADDING_FIX,
) -> None:
    """Raise if a prompt is read (`read` [batch]) after its last real token (`last` [batch]) or
    before its first (`first` [batch], left padding; None: position 0), saying `fix`."""
    beyond = read.to(last.device) > last
    if bool(beyond.any()):
        i = int(beyond.nonzero()[0, 0])
        raise ValueError(
            f"prompt {i} is right-padded (its last real token is at position {int(last[i])} of {n_pos}), "
            f"but {what} position {int(read[i])}, its padding; {fix}"
        )
    before = None if first is None else read.cpu() < first.cpu()
    if before is not None and bool(before.any()):
        i = int(before.nonzero()[0, 0])
        raise ValueError(
            f"prompt {i} is left-padded (its first real token is at position {int(first[i])} of {n_pos}), "
            f"but {what} position {int(read[i])}, its padding: an int counts from the padded batch's "
            "first column; pass pos=None or -1 (the last token), or one position per prompt"
        )


def logits_at(logits: Float[Tensor, "batch pos d_vocab"], pos: Pos = None) -> Float[Tensor, "batch d_vocab"]:
    """The logits at one position per prompt: None = last, int = the same for all (negative: from the
    end), [batch] = per prompt. None and ints are refused where they land on padding of logits that
    record their prompts' last real tokens (the model's forward pass on right-padded prompts)."""
    if logits.ndim != 3:
        raise ValueError(f"logits must be [batch, pos, d_vocab], got shape {tuple(logits.shape)}")
    batch, n_pos = logits.shape[:2]
    pos = check_metric_pos(pos)
    read = positions_read(pos, batch, n_pos)
    last = getattr(logits, LAST_POSITIONS, None)
    if last is not None and not isinstance(pos, Tensor):
        refuse_padding(
            last, read, n_pos, f"the metric (pos={pos}) reads", getattr(logits, FIRST_POSITIONS, None)
        )
    return logits[torch.arange(batch, device=logits.device), read.to(logits.device)]


def _token_values(values: Float[Tensor, "batch d_vocab"], tokens: Tensor) -> Float[Tensor, " batch"]:
    """values[b, tokens[b]] for tokens [batch], or the mean over answers for tokens [batch, n]."""
    return values.gather(-1, _answer_ids(values, tokens)).mean(-1)


def _answer_ids(values: Float[Tensor, "batch d_vocab"], tokens: Tensor) -> Int[Tensor, "batch n"]:
    """Answer tokens [batch] or [batch, n] (or one for every prompt) checked to be token ids of
    `values`' vocabulary, one row per prompt: [batch, n]."""
    check_unpadded_answers(tokens)
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
    return tokens.view(tokens.shape[0], -1)


def check_unpadded_answers(tokens: Any) -> None:
    """Refuse answers [batch, n] that record padding (ids from `to_tokens` of texts of different
    lengths): several answers per prompt are averaged, so the pad id would count as one."""
    real = recorded_padding(tokens) if isinstance(tokens, Tensor) and tokens.ndim == 2 else None
    if real is None or bool(real.bool().all()):
        return
    i = int((~real.bool()).any(-1).nonzero()[0, 0])
    raise ValueError(
        f"answer row {i} is padded ({int(real[i].sum())} of {tokens.shape[1]} ids real): several answers per "
        "prompt are averaged, so the pad id would count as an answer; give each prompt one answer token "
        "(model.to_single_token), or the same number of answers, each one token"
    )


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
    """log p(answer) at `pos`, per prompt (answers [batch, n]: the mean log-probability)."""
    return _token_values(logits_at(logits, pos).float().log_softmax(-1), answer)


def answer_prob(
    logits: Float[Tensor, "batch pos d_vocab"], answer: Int[Tensor, " batch"], pos: Pos = None
) -> Float[Tensor, " batch"]:
    """p(answer) at `pos`, per prompt (answers [batch, n]: the mean probability, as `prob_metric`)."""
    return _token_values(logits_at(logits, pos).float().softmax(-1), answer)


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
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)  # 0 log 0 = 0 (tokens at -inf)


def loss(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    attention_mask: Int[Tensor, "batch pos"] | None = None,
) -> Float[Tensor, " batch"]:
    """Mean next-token cross-entropy of each prompt, in nats; with `attention_mask` (1: real token,
    from `model.to_tokens_and_mask`; default: the one ids from `model.to_tokens` carry) over the
    positions where it and the next token are real."""
    if tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"tokens {tuple(tokens.shape)} must match logits' [batch, pos] {tuple(logits.shape[:2])}"
        )
    per_token = next_token_loss(logits, tokens.to(logits.device), per_token=True)  # [batch, pos - 1]
    attention_mask = recorded_padding(tokens) if attention_mask is None else attention_mask
    if attention_mask is None:
        last = getattr(logits, LAST_POSITIONS, None)
        n_pos = logits.shape[1]
        if last is not None and bool((last < n_pos - 1).any()):
            i = int((last < n_pos - 1).nonzero()[0, 0])
            raise ValueError(
                f"prompt {i} is right-padded (its last real token is at position {int(last[i])} of "
                f"{n_pos}), and the loss would count its padding; pass attention_mask= (from "
                "model.to_tokens_and_mask)"
            )
        return per_token.mean(-1)
    mask = check_attention_mask(attention_mask, tokens.shape, per_token.device)
    counted = mask[:, :-1].bool() & mask[:, 1:].bool()
    # a prompt with no counted position (one real token) has no loss: NaN, not 0 nats
    return torch.where(counted, per_token, 0.0).sum(-1) / counted.sum(-1)


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
        max(float(clean_value.detach().abs()), float(corrupted_value.detach().abs())),
        "the metric is the same on the clean and corrupted runs, so the normalised metric",
    )

    def normalized_metric(logits: Tensor) -> Tensor:
        return (metric(logits) - corrupted_value) / gap

    return normalized_metric


@dataclass
class AnswerMetric:
    """A metric with per-prompt answers read at one position per prompt (None: the last; an int,
    negative from the end, as TransformerLens's -1; a LongTensor [batch]): logit(correct) -
    logit(incorrect) ("logit_diff"), p(correct) ("prob"), or 1.0 where correct is the top token and
    0.0 elsewhere ("accuracy": no gradient, one answer per prompt); several answers per prompt
    ([batch, n]) are averaged.

    `metric(logits)` scores every prompt; `metric(logits, rows)` scores the prompts `rows` ([batch]
    indices into the answers) when logits hold a sub-batch. Knowing the position lets batched runs
    unembed that position only (`positions`).
    """

    kind: Literal["logit_diff", "prob", "accuracy"]
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"]
    incorrect: Int[Tensor, " batch"] | Int[Tensor, "batch n"] | None = None
    pos: MetricPos = None

    def __post_init__(self) -> None:
        self.pos = check_metric_pos(self.pos)
        check_unpadded_answers(self.correct)
        check_unpadded_answers(self.incorrect)

    def __call__(
        self, logits: Float[Tensor, "batch pos d_vocab"], rows: Int[Tensor, " batch"] | None = None
    ) -> Float[Tensor, " batch"]:
        rows = torch.arange(logits.shape[0]) if rows is None else rows
        pos = self.pos[rows] if isinstance(self.pos, Tensor) else self.pos
        end = logits_at(logits, pos).float()
        if self.kind == "accuracy":
            answers = _answer_ids(end, self.correct[rows])
            if answers.shape[1] != 1:
                raise ValueError("accuracy reads one answer per prompt: give correct as [batch] token ids")
            return (end.argmax(-1) == answers[:, 0]).float()
        if self.kind == "prob":
            return _token_values(end.softmax(-1), self.correct[rows])
        return _token_values(end, self.correct[rows]) - _token_values(end, self.incorrect[rows])

    def at_read_positions(self) -> AnswerMetric:
        """This metric of logits made only at the positions it reads, one per prompt ([batch, 1,
        d_vocab]: `interp.edges.unembed_at`)."""
        return replace(self, pos=None)

    def positions(self, rows: Int[Tensor, " batch"], n_pos: int) -> Int[Tensor, " batch"]:
        """The position each of `rows` is read at, in [0, n_pos)."""
        pos = self.pos[rows] if isinstance(self.pos, Tensor) else self.pos
        return positions_read(pos, len(rows), n_pos).to(rows.device)


def logit_diff_metric(
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"],
    incorrect: Int[Tensor, " batch"] | Int[Tensor, "batch n"],
    pos: MetricPos = None,
) -> AnswerMetric:
    """logit(correct) - logit(incorrect) at each prompt's position (None: the last; padded prompts:
    pos=model.last_positions(tokens))."""
    return AnswerMetric("logit_diff", correct, incorrect, pos)


def prob_metric(
    correct: Int[Tensor, " batch"] | Int[Tensor, "batch n"], pos: MetricPos = None
) -> AnswerMetric:
    """p(correct) at each prompt's position (several answers: the mean probability)."""
    return AnswerMetric("prob", correct, None, pos)


def accuracy_metric(correct: Int[Tensor, " batch"], pos: MetricPos = None) -> AnswerMetric:
    """1.0 where `correct` is the top token at each prompt's position, else 0.0 (top-1 accuracy)."""
    return AnswerMetric("accuracy", correct, None, pos)


def check_differentiable(metric: Metric, what: str) -> None:
    """Refuse an accuracy `AnswerMetric` to `what`, which takes the metric's gradient: it has none."""
    if isinstance(metric, AnswerMetric) and metric.kind == "accuracy":
        raise ValueError(
            f"{what} takes the metric's gradient, and accuracy (the top token) has none: use prob_metric "
            "or logit_diff_metric"
        )


def check_reads_real_tokens(
    model: HookedTransformer,
    metric: Metric,
    tokens: Int[Tensor, "batch pos"],
    *others: Int[Tensor, "batch pos"],
    logit_pos: Pos = None,
) -> Metric:
    """The metric to score runs on `tokens` (and on `others`: the other prompts of each pair, where
    the metric scores their runs too) with, never reading a prompt's padding (`model.last_positions`,
    `model.first_positions`): the same metric where no prompt is padded; a ValueError saying what to
    pass where an `AnswerMetric`'s `pos` or `logit_pos` (None, an int, or one position per prompt)
    reads padding of a run it scores; any other metric wrapped to get NaN logits at padding,
    refused by name if it reads them."""
    if getattr(metric, "reads_real_tokens", False):  # checked already
        return metric
    n_pos = tokens.shape[1]
    runs = (tokens, *others)
    last = torch.stack([model.last_positions(run).cpu() for run in runs]).amin(0)
    first = torch.stack([model.first_positions(run) for run in runs]).amax(0)
    if bool((last == n_pos - 1).all()) and not bool(first.any()):
        return metric
    if logit_pos is not None:
        _refuse_reading_padding(logit_pos, "logit_pos", last, first, n_pos, paired=bool(others))
    if isinstance(metric, AnswerMetric):
        _refuse_reading_padding(metric.pos, "pos", last, first, n_pos, paired=bool(others))
        return metric
    if isinstance(logit_pos, Tensor):  # the logits are NaN off the positions checked
        return metric
    return _nan_at_padding(metric, last.cpu(), first)


def _refuse_reading_padding(
    pos: MetricPos,
    name: str,
    last: Int[Tensor, " batch"],
    first: Int[Tensor, " batch"],
    n_pos: int,
    paired: bool,
) -> None:
    """Raise if `pos` (`name`: "logit_pos" or the metric's "pos"; None, an int, or one position per
    prompt) reads a prompt's padding: `last`, `first` [batch] the last and first positions real in
    every run scored (paired: the runs of both prompts of each pair)."""
    read = positions_read(pos, len(last), n_pos, name).cpu()
    if not isinstance(pos, Tensor):
        what = f"logit_pos={pos} reads" if name == "logit_pos" else f"the metric (pos={pos}) reads"
        refuse_padding(last, read, n_pos, what, first)
        return
    what = "logit_pos" if name == "logit_pos" else "the metric's pos"
    after, before = read > last, read < first
    if paired and bool((after | before).any()):
        i = int((after | before).nonzero()[0, 0])
        edge = f"ends at {int(last[i])}" if after[i] else f"starts at {int(first[i])}"
        raise ValueError(
            f"pair {i}: {what} reads position {int(read[i])}, but one of its prompts {edge} (padding "
            "beyond): both runs of a pair are scored at the same positions, so read each pair where both "
            "prompts are real, or pair prompts of one length in tokens (model.to_str_tokens shows them)"
        )
    refuse_padding(
        last, read, n_pos, f"{what} reads", first,
        "give each prompt a position within its real tokens (model.last_positions(tokens): the last of each)",
    )  # fmt: skip


def _nan_at_padding(metric: Metric, last: Int[Tensor, " batch"], first: Int[Tensor, " batch"]) -> Metric:
    """`metric` given logits that are NaN after each prompt's last real token and before its first,
    refused by name where its value on a padded prompt is not finite (it read the padding)."""

    def scored(logits: Tensor, rows: Tensor | None) -> Tensor:
        ends = last if rows is None else last[rows.cpu()]
        starts = first if rows is None else first[rows.cpu()]
        where = torch.arange(logits.shape[1])
        padding = (where > ends[:, None]) | (where < starts[:, None])  # [batch, pos]
        padding = padding.to(logits.device)[..., None]
        if logits.requires_grad:
            logits = logits.masked_fill(padding, float("nan"))
        else:
            logits.masked_fill_(padding, float("nan"))  # the caller's own run: no copy of the logits
        value = metric(logits) if rows is None else metric(logits, rows)
        if isinstance(value, Tensor) and value.shape == ends.shape:
            padded = (ends < logits.shape[1] - 1) | (starts > 0)
            bad = ~torch.isfinite(value.detach()).cpu() & padded
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                prompt = i if rows is None else int(rows[i])
                side, fix = (
                    (
                        f"right-padded (its last real token is at position {int(ends[i])} of "
                        f"{logits.shape[1]})",
                        f"(pos=None and -1 read the last position); {PADDING_FIX}",
                    )
                    if ends[i] < logits.shape[1] - 1
                    else (
                        f"left-padded (its first real token is at position {int(starts[i])})",
                        "(an index counts from the padded batch's first column); read the last position "
                        "(-1), or each prompt's own positions",
                    )
                )
                raise ValueError(
                    f"the metric is {value[i].item()} on prompt {prompt}, which is {side}: it reads the "
                    f"padding {fix}. (Its logits are NaN at padding: a metric that masks the padding by "
                    "multiplying, x * mask, gets NaN * 0 = NaN there; mask with torch.where.)"
                )
        return value

    if takes_rows(metric):

        def with_rows(logits: Tensor, rows: Tensor | None = None) -> Tensor:
            return scored(logits, rows)

        checked = with_rows
    else:

        def without_rows(logits: Tensor) -> Tensor:
            return scored(logits, None)

        checked = without_rows
    checked.reads_real_tokens = True
    return checked


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
