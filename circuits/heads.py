"""Head types: score every attention head on probe inputs, confirm candidates causally, classify.

Attention-pattern scores (per head, averaged over queries, then over probe sequences):

  previous_token   attention from token i to token i-1                                (queries i >= 1)
  induction        attention from token i to every token right after an earlier copy of token i
                   (prefix matching; on repeated random sequences: the second copy)   (queries with a copy)
  duplicate_token  attention from token i to earlier copies of token i                (queries with a copy)
  current_token    attention from token i to itself                                   (queries i >= 1)
  first_token      attention to position 0 (BOS, or the first token without one)      (queries i >= 1)
  broad            normalised entropy H(row) / log(i+1): 1 is uniform over the prefix (queries i >= 4)
  fixed_offset     on random (unrepeated) tokens, attention from token i to token i-d at the head's best
                   offset d >= 2 (queries i > d; the offset is reported as fixed_offset_distance)
  skip_gram        on natural text (random tokens without a tokenizer): the query token t attends to one
                   specific earlier token v at varying distances (a backslash attends to `left`);
                   see skip_gram_scores

Induction is probed at several repeat lengths (`induction_lengths`, none a multiple of another), each
sequence after a random-length prefix of random tokens, so that a head attending to one fixed offset
(a positional shortcut) scores at one length only. The `induction` score is the lowest of the
per-length scores (`induction_len<L>` columns), and a head is an induction candidate only when it
clears the threshold at every length.

The masks are TransformerLens's head_detector patterns ("mul" measure), averaged per query
rather than per row of the whole matrix, so a score is "the fraction of a query's attention on the
keys its type predicts". Weight-based evidence (Elhage et al. 2021):

  copying          sum(eig) / sum(|eig|) of the full OV circuit W_E W_V W_O W_U ([vocab, vocab]); its
                   nonzero eigenvalues are those of the [d_head, d_head] matrix W_O W_U W_E W_V
  k_composition    max over earlier previous-token heads p of ||QK_h OV_p^T||_F / (||QK_h||_F ||OV_p||_F)

Thresholds. A head that ignores content and position attends uniformly, 1/(i+1) to each key: that
is also what a randomly initialised head does (its scores are near zero). A mask score's threshold is
this uniform baseline (computed exactly on the same probes) plus a margin: 0.3 for previous_token,
induction, duplicate_token and current_token (30 percentage points more attention on the predicted
keys than chance), 0.4 for first_token (sinks are common; "most of the attention"), 0.3 for
fixed_offset above the best uniform offset score, 0.3 for skip_gram (whose uniform score is ~0). broad needs
normalised entropy >= 0.8: as spread out as uniform attention over half a 40-token prefix
(log 20 / log 40 = 0.81). Confidence = the bootstrap probability (resampling probe sequences) that the
score clears its threshold. All scores stay in the table, so users can apply their own cut.

Causal checks, by mean ablation of a head's output z (its mean over the probe batch, per position),
each measured two ways because heads back each other up: alone, and with the other candidates of its
type already ablated (the IOI paper's minimality: what the head adds once its stand-ins are gone).
An induction candidate is confirmed if either way ablating it raises the loss on the second copy of
repeated sequences by more than two standard errors and 0.02 nats; a previous-token candidate is
confirmed if either way ablating it lowers the induction score of the later induction heads by more
than two standard errors and 0.02 (a significant but negligible effect confirms nothing).
"induction" is only given as a type when confirmed; "previous_token", "fixed_offset" and
"skip_gram" are given on their patterns (a previous-token head need not feed an induction head), the
first with its causal effect as evidence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.progress import Progress
from torch import Tensor

import interp
from interp.interventions.ablation import ablation_hooks
from interp.io.devices import module_weight
from interp.tasks import repeated_sequences

PATTERN_SCORES = ("previous_token", "induction", "duplicate_token", "current_token", "first_token", "broad")
SCORE_NAMES = (*PATTERN_SCORES, "fixed_offset", "skip_gram")  # every head type, in report order
CAUSAL_TYPES = ("induction", "previous_token")  # types with ablation checks
MARGINS = {
    "previous_token": 0.3,
    "induction": 0.3,
    "duplicate_token": 0.3,
    "current_token": 0.3,
    "first_token": 0.4,
    "fixed_offset": 0.3,
    "skip_gram": 0.3,
}
# A fixed offset d is scored only where at least a third of the queries (and 4) have a key at i-d.
MIN_OFFSET_QUERIES = 4
MIN_SKIP_GRAM_SEQUENCES = 2  # per fold: a skip-gram pair is judged on query tokens seen in 4+ sequences
MIN_OFFSET_QUERY_FRACTION = 1 / 3
BROAD_THRESHOLD = 0.8
BROAD_MIN_QUERY = 4
CONFIRM_SE = 2.0  # a causal effect is confirmed when effect > CONFIRM_SE * standard error ...
MIN_EFFECT = {"induction": 0.02, "previous_token": 0.02}  # ... and at least this large (nats; score)
N_BOOTSTRAP = 500

NATURAL_TEXT = (
    "The cat sat on the mat, and then the cat slept on the mat all afternoon.",
    "Alice gave Bob a book about the history of Paris, and Bob gave Alice a map of Paris.",
    "In 1969 the first people walked on the Moon; in 1972 the last people walked on the Moon.",
    "She opened the door, looked at the garden, closed the door, and looked at the garden again.",
    "Water boils at one hundred degrees Celsius at sea level, but at lower temperatures on mountains.",
    "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n",
    "$\\left( x + y \\right) = \\left( a \\right) + \\left[ b \\right]$",
    "so $f = \\left[ g \\right]$ and <b>bold</b> then <i>italic</i> then <b>bold again</b>",
    "<i>notes</i> on $\\left\\{ z \\right\\}$, <b>see</b> the table",
    "<b>Proof.</b> By $\\left| x \\right|$ and <i>induction</i> on $n$.",
)


# ---------------------------------------------------------------------------------------------
# Probe inputs


@dataclass
class Probe:
    """A batch of probe sequences: tokens [batch, pos], true lengths [batch] (right padding).

    Repeated probes also give, per row, the repeat length L (`repeat_len`) and the position of the
    first copy's first token (`repeat_start`): the second copy starts at repeat_start + L.
    """

    name: str
    tokens: Tensor
    lengths: Tensor
    str_tokens: list[str]  # of the first sequence, for attention plots
    repeat_len: Tensor | None = None  # [batch]
    repeat_start: Tensor | None = None  # [batch]

    def second_copy_predictions(self) -> Tensor:
        """[batch, pos - 1] mask of the predictions of the second copy's tokens 2..L (the ones an
        induction head can make; prediction p is of token p + 1)."""
        p = torch.arange(self.tokens.shape[1] - 1)[None]
        second = (self.repeat_start + self.repeat_len)[:, None]
        return (p >= second) & (p <= second + self.repeat_len[:, None] - 2)


def _str_tokens(model: interp.HookedTransformer, tokens: Tensor) -> list[str]:
    if model.tokenizer is None:
        return [f"t{t}" for t in tokens.tolist()]
    return model.to_str_tokens(tokens)


def _bos_token(model: interp.HookedTransformer) -> int | None:
    """The BOS id if the model runs with one (0, interp.tasks' convention, if none is named), else None."""
    cfg = model.cfg
    if not cfg.default_prepend_bos:
        return None
    if cfg.bos_token_id is not None:
        return cfg.bos_token_id
    bos = getattr(model.tokenizer, "bos_token_id", None)
    return 0 if bos is None else bos


def induction_lengths(longest: int, n: int = 3) -> list[int]:
    """`n` repeat lengths from `longest` down to about half of it, none a multiple of another
    (shorter ones where the context leaves no room for that spread)."""
    if longest < n + 2:
        raise ValueError(
            f"repeat lengths need room: the longest is {longest} tokens, {n} lengths need at least {n + 2} "
            "(raise seq_len, or use a model with a longer context)."
        )
    lengths: list[int] = []
    for spread in (True, False):  # first near the targets, then any length that fits
        for length in range(longest, 2, -1):
            target = longest * (1 - 0.45 * len(lengths) / max(1, n - 1))
            fits = length not in lengths and all(other % length and length % other for other in lengths)
            if len(lengths) < n and fits and (length <= target or not spread):
                lengths.append(length)
    return sorted(lengths, reverse=True)


def _random_rows(
    d_vocab: int, n_tokens: int, n_rows: int, generator: torch.Generator, bos: int | None
) -> Tensor:
    """[n_rows, n_tokens] uniform random tokens (never `bos`)."""
    start = int(bos is not None)
    return repeated_sequences(d_vocab, n_tokens, n_rows, generator=generator, bos=bos)[
        :, start : start + n_tokens
    ]


def repeated_probe(
    model: interp.HookedTransformer, n_samples: int, lengths: Sequence[int], max_offset: int, seed: int
) -> Probe:
    """n_samples rows per repeat length L: [BOS] p_1..p_o r_1..r_L r_1..r_L [pad], random tokens from
    the model's vocabulary, with a random prefix length o in [0, max_offset] per row."""
    bos = _bos_token(model)
    head = [] if bos is None else [bos]
    generator = torch.Generator().manual_seed(seed)
    width = len(head) + max_offset + 2 * max(lengths)
    rows, repeat_len, repeat_start = [], [], []
    for length in lengths:
        offsets = torch.randint(max_offset + 1, (n_samples,), generator=generator).tolist()
        copies = _random_rows(model.cfg.d_vocab, length, n_samples, generator, bos)
        prefixes = _random_rows(model.cfg.d_vocab, max_offset + 1, n_samples, generator, bos)
        for offset, copy, prefix in zip(offsets, copies, prefixes, strict=True):
            rows.append(torch.cat([torch.tensor(head, dtype=torch.long), prefix[:offset], copy, copy]))
            repeat_len.append(length)
            repeat_start.append(len(head) + offset)
    lengths_ = torch.tensor([len(row) for row in rows])
    tokens = torch.stack([torch.nn.functional.pad(row, (0, width - len(row))) for row in rows])
    return Probe(
        "repeated",
        tokens,
        lengths_,
        _str_tokens(model, tokens[0, : lengths_[0]]),
        repeat_len=torch.tensor(repeat_len),
        repeat_start=torch.tensor(repeat_start),
    )


def random_probe(model: interp.HookedTransformer, n_samples: int, n_tokens: int, seed: int) -> Probe:
    """[BOS] and n_tokens random tokens, nothing repeated on purpose: what positional heads attend to."""
    bos = _bos_token(model)
    generator = torch.Generator().manual_seed(seed + 1)  # not the repeated probe's numbers
    tokens = _random_rows(model.cfg.d_vocab, n_tokens, n_samples, generator, bos)
    if bos is not None:
        tokens = torch.cat([torch.full((n_samples, 1), bos), tokens], dim=1)
    lengths = torch.full((n_samples,), tokens.shape[1])
    return Probe("random", tokens, lengths, _str_tokens(model, tokens[0]))


def text_probe(model: interp.HookedTransformer, texts: Sequence[str]) -> Probe:
    """Natural text, right-padded; needs a tokenizer."""
    if model.tokenizer is None:
        raise ValueError(
            f"{model.cfg.model_name} has no tokenizer: pass natural_text=() to skip text probes."
        )
    rows = [model.to_tokens(text)[0] for text in texts]
    rows = [row[: model.cfg.n_ctx] for row in rows]
    lengths = torch.tensor([len(model.to_tokens(text)[0][: model.cfg.n_ctx]) for text in texts])
    tokens = torch.stack([torch.nn.functional.pad(r, (0, int(lengths.max()) - len(r))) for r in rows])
    return Probe("text", tokens, lengths, _str_tokens(model, tokens[0, : lengths[0]]))


# ---------------------------------------------------------------------------------------------
# Attention-pattern scores


def score_masks(tokens: Tensor, lengths: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """Per score: (key mask [batch, q, k], query mask [batch, q]) of the keys a head of that type attends to.

    Mask scores only count queries that have at least one such key.
    """
    batch, n = tokens.shape
    q = torch.arange(n)[:, None]
    k = torch.arange(n)[None, :]
    inside = torch.arange(n)[None, :] < lengths[:, None]  # [batch, pos]
    pair_inside = inside[:, :, None] & inside[:, None, :]  # [batch, q, k]
    same = (tokens[:, :, None] == tokens[:, None, :]) & pair_inside & (k < q)  # earlier copy of token q
    after_same = torch.zeros_like(same)
    after_same[:, :, 1:] = (
        (tokens[:, :, None] == tokens[:, None, :-1]) & pair_inside[:, :, 1:] & (k[:, 1:] <= q)
    )
    eye = torch.eye(n, dtype=torch.bool)
    masks = {
        "previous_token": ((q - k) == 1).expand(batch, n, n) & pair_inside,
        "induction": after_same,
        "duplicate_token": same,
        "current_token": eye.expand(batch, n, n) & pair_inside,
        "first_token": (k == 0).expand(batch, n, n) & pair_inside,
    }
    not_first = inside & (torch.arange(n)[None, :] >= 1)
    return {name: (mask, mask.any(-1) & not_first) for name, mask in masks.items()}


def pattern_scores(
    pattern: Tensor, masks: dict[str, tuple[Tensor, Tensor]], lengths: Tensor
) -> dict[str, Tensor]:
    """Per-sequence scores [batch, head] of pattern [batch, head, q, k]; NaN where no query is valid."""
    pattern = pattern.float()
    scores = {}
    for name, (mask, queries) in masks.items():
        mass = (pattern * mask[:, None]).sum(-1)  # [batch, head, q]
        scores[name] = (mass * queries[:, None]).sum(-1) / queries.sum(-1)[:, None]
    n = pattern.shape[-1]
    position = torch.arange(n)
    queries = (position[None, :] >= BROAD_MIN_QUERY) & (position[None, :] < lengths[:, None])  # [batch, q]
    entropy = -(pattern * pattern.clamp_min(1e-12).log()).sum(-1)  # [batch, head, q]
    normalised = entropy / torch.log(position + 1.0).clamp_min(1e-12)
    scores["broad"] = (normalised * queries[:, None]).sum(-1) / queries.sum(-1)[:, None]
    return scores


def uniform_pattern(lengths: Tensor, n: int) -> Tensor:
    """Uniform causal attention [batch, 1, q, k]: 1/(q+1) on every key k <= q."""
    causal = torch.tril(torch.ones(n, n))
    return (causal / causal.sum(-1, keepdim=True))[None, None].expand(len(lengths), 1, n, n)


def fixed_offset_scores(pattern: Tensor, lengths: Tensor) -> Tensor:
    """[batch, head, offset] attention from token i to token i-d, averaged over queries i > d, for
    offsets d = 0..pos-1 (the first token, a common sink, is never the key); NaN where fewer than
    MIN_OFFSET_QUERIES, or MIN_OFFSET_QUERY_FRACTION of a sequence's queries, have such a key (so
    an offset is one that most of the sequence can use). pattern: [batch, head, q, k]."""
    needed = (lengths * MIN_OFFSET_QUERY_FRACTION).ceil().clamp_min(MIN_OFFSET_QUERIES)  # [batch]
    batch, n_heads, n, _ = pattern.shape
    scores = torch.full((batch, n_heads, n), float("nan"))
    for d in range(n):
        diagonal = pattern.diagonal(offset=-d, dim1=-2, dim2=-1).float()  # [batch, head, n - d]: (q=d+j, k=j)
        j = torch.arange(n - d)[None]
        valid = (j >= 1) & (d + j < lengths[:, None])  # [batch, n - d]
        count = valid.sum(-1)  # [batch]
        mean = (diagonal * valid[:, None]).sum(-1) / count.clamp_min(1)[:, None]
        scores[:, :, d] = torch.where((count >= needed)[:, None], mean, float("nan"))
    return scores


def skip_gram_occurrences(tokens: Tensor, lengths: Tensor, min_distance: int = 2) -> tuple[Tensor, Tensor]:
    """(rows, positions) [occurrence] of the queries a skip-gram score looks at: every token with a
    possible key (position >= 1, at least min_distance back)."""
    position = torch.arange(tokens.shape[1])[None]
    valid = (position >= min_distance + 1) & (position < lengths[:, None])
    return valid.nonzero(as_tuple=True)


def skip_gram_keys(keys: Tensor, rows: Tensor, queries: Tensor, min_distance: int = 2) -> Tensor:
    """[occurrence, pos] the keys a skip-gram query may attend to: at least min_distance back, not the
    first token, neither a copy of the query token nor right after one (that is induction)."""
    k = torch.arange(keys.shape[1])[None]
    context = keys[rows]  # [occurrence, pos]
    same = context == context[torch.arange(len(rows)), queries][:, None]
    after_same = torch.zeros_like(same)
    after_same[:, 1:] = same[:, :-1]
    return (k >= 1) & (k <= queries[:, None] - min_distance) & ~same & ~after_same


def skip_gram_masses(pattern: Tensor, keys: Tensor, lengths: Tensor, n_types: int, min_distance: int = 2):
    """Attention of each query occurrence on each key token type: [occurrence, head, type].

    pattern [batch, head, q, k]; keys [batch, pos]: token types (compact ids < n_types); which keys
    count: skip_gram_keys.
    """
    rows, queries = skip_gram_occurrences(keys, lengths, min_distance)
    valid = skip_gram_keys(keys, rows, queries, min_distance)
    attention = pattern[rows, :, queries, :].float() * valid[:, None]  # [occurrence, head, k]
    index = keys[rows][:, None].expand_as(attention)
    return torch.zeros(*attention.shape[:2], n_types).scatter_add_(-1, index, attention)


def skip_gram_scores(
    mass: Tensor, keys: Tensor, lengths: Tensor, min_distance: int = 2
) -> tuple[Tensor, Tensor, Tensor]:
    """Cross-fitted skip-gram score of each head: (score [head], query type [head], key type [head]).

    mass: [occurrence, head, type] from skip_gram_masses over the whole probe. For each query type t
    seen in at least 2 * MIN_SKIP_GRAM_SEQUENCES sequences, those sequences alternate between two
    folds. In each fold, the
    preferred key type v*(t) is the one the *other* fold's sequences attend to most (median over
    sequences of their mean attention from t), so the choice is never scored on the sequences that
    made it, and one coincidence in one sequence cannot make it. A sequence scores its mean attention
    from t on v*(t) minus the mean attention that queries of other types give v*(t) where it is
    present (a head that attends to one token from everywhere is a sink, not a skip-gram). A type's
    score is the mean of the two folds' medians over sequences; the head's is its best type's (that
    pair is returned; -1 where no type is seen in enough sequences).
    """
    rows, queries = skip_gram_occurrences(keys, lengths, min_distance)
    query = keys[rows, queries]  # [occurrence]
    n_occ, n_heads, n_types = mass.shape
    valid = skip_gram_keys(keys, rows, queries, min_distance)
    present = torch.zeros(n_occ, n_types).scatter_add_(-1, keys[rows], valid.float()).clamp_max(1.0)
    total = torch.einsum("oht,ot->ht", mass, present)  # attention on each type where present
    total_count = present.sum(0)  # [type]
    score = torch.full((n_heads,), float("nan"))
    best_query = torch.full((n_heads,), -1)
    best_key = torch.full((n_heads,), -1)
    for t in query.unique():
        members = (query == t).nonzero()[:, 0]
        sequences, sequence_of = torch.unique(rows[members], return_inverse=True)
        if len(sequences) < 2 * MIN_SKIP_GRAM_SEQUENCES:
            continue
        count = torch.zeros(len(sequences)).index_add_(0, sequence_of, torch.ones(len(members)))
        per_sequence = torch.zeros(len(sequences), n_heads, n_types).index_add_(0, sequence_of, mass[members])
        per_sequence /= count[:, None, None]  # [sequence, head, type]: mean attention from t
        group = torch.einsum("oht,ot->ht", mass[members], present[members])
        control = (total - group) / (total_count - present[members].sum(0)).clamp_min(1)  # [head, type]
        fold = torch.arange(len(sequences)) % 2
        medians = []
        for f in (0, 1):
            preferred = per_sequence[fold != f].median(0).values.argmax(-1)  # [head]
            held_out = per_sequence[fold == f].gather(
                -1, preferred[None, :, None].expand((fold == f).sum(), -1, 1)
            )
            contrast = held_out[..., 0] - control.gather(-1, preferred[:, None])[:, 0]  # [sequence, head]
            medians.append(contrast.median(0).values)
        mean = (medians[0] + medians[1]) / 2  # [head]
        better = mean > score.nan_to_num(-float("inf"))
        score = torch.where(better, mean, score)
        best_query = torch.where(better, t, best_query)
        best_key = torch.where(better, per_sequence.median(0).values.argmax(-1), best_key)
    return score, best_query, best_key


@torch.inference_mode()
def probe_patterns(
    model: interp.HookedTransformer,
    probe: Probe,
    batch_size: int,
    score: Callable[[Tensor, Tensor, Tensor], dict[str, Tensor]],
    progress: Progress | None = None,
) -> tuple[dict[str, Tensor], Tensor]:
    """Run the probe and score every layer's attention: ({name: [rows, layer, head, ...]}, the first
    sequence's patterns [layer, head, q, k]).

    score(pattern [batch, head, q, k], tokens, lengths) -> {name: [rows, head, ...]}, where rows is
    the batch or anything else that concatenates over batches. Only hook_pattern is cached, one
    batch at a time.
    """
    cfg = model.cfg
    per_batch: list[dict[str, Tensor]] = []
    pattern_names = [interp.act_name("pattern", layer) for layer in range(cfg.n_layers)]
    example = torch.zeros(cfg.n_layers, cfg.n_heads, int(probe.lengths[0]), int(probe.lengths[0]))
    task = (
        progress.add_task(f"Attention scores ({probe.name})", total=len(probe.tokens)) if progress else None
    )
    for start in range(0, len(probe.tokens), batch_size):
        tokens = probe.tokens[start : start + batch_size]
        lengths = probe.lengths[start : start + batch_size]
        _, cache = model.run_with_cache(tokens.to(model.device), names_filter=pattern_names, return_type=None)
        layer_scores = [
            score(cache["pattern", layer].float().cpu(), tokens, lengths) for layer in range(cfg.n_layers)
        ]
        per_batch.append({name: torch.stack([s[name] for s in layer_scores], 1) for name in layer_scores[0]})
        if start == 0:
            n = example.shape[-1]
            example[:] = torch.stack(
                [cache["pattern", layer][0, :, :n, :n].float().cpu() for layer in range(cfg.n_layers)]
            )
        if progress:
            progress.advance(task, len(tokens))
    scores = {name: torch.cat([b[name] for b in per_batch]) for name in per_batch[0]}
    return scores, example


# ---------------------------------------------------------------------------------------------
# Weight-based evidence


def _norm_weight(norm: torch.nn.Module, d_model: int) -> Tensor:
    if getattr(norm, "w", None) is None:
        return torch.ones(d_model)
    return module_weight(norm, "w", "cpu").detach().float()  # (also when offloaded by device_map)


@torch.inference_mode()
def copying_scores(model: interp.HookedTransformer) -> Tensor:
    """[layer, head] sum(eig) / sum(|eig|) of the full OV circuit (norm weights included, biases not)."""
    cfg = model.cfg
    W_E = model.W_E.detach().float().cpu()
    W_U = model.W_U.detach().float().cpu() * _norm_weight(model.ln_final, cfg.d_model)[:, None]
    U_E = W_U @ W_E  # [d_model, d_model]: the vocabulary round trip, computed once
    W_V, W_O = model.W_V.detach().float().cpu(), model.W_O.detach().float().cpu()
    scores = torch.zeros(cfg.n_layers, cfg.n_heads)
    for layer in range(cfg.n_layers):
        W_V_normed = W_V[layer] * _norm_weight(model.blocks[layer].ln1, cfg.d_model)[None, :, None]
        small = W_O[layer] @ U_E @ W_V_normed  # [head, d_head, d_head], same nonzero eigenvalues
        eig = torch.linalg.eigvals(small.double())
        scores[layer] = (eig.sum(-1).real / eig.abs().sum(-1)).float()
    return scores


def _frobenius_composition(A: Tensor, M: Tensor, B: Tensor) -> Tensor:
    """||A M B^T||_F for A [d, e], M [..., e, f], B [d, f] via small Gram matrices."""
    AtA, BtB = A.T @ A, B.T @ B
    return torch.einsum("...ef,eg,...gh,hf->...", M, AtA, M, BtB).clamp_min(0).sqrt()


@torch.inference_mode()
def k_composition_scores(model: interp.HookedTransformer, sources: Sequence[tuple[int, int]]) -> Tensor:
    """[layer, head] max over source heads (l, h) in earlier layers of the K-composition score; NaN if none.

    K-composition of source p into head h: ||QK_h OV_p^T||_F / (||QK_h||_F ||OV_p||_F), where
    QK_h = W_Q W_K^T (query rows, key columns) and OV_p = W_V W_O: how much of h's key side reads
    what p writes. Ignores rotary positions; norm weights are folded into W_Q, W_K and W_V.
    """
    cfg = model.cfg
    W_Q, W_K = model.W_Q.detach().float().cpu(), model.W_K.detach().float().cpu()
    W_V, W_O = model.W_V.detach().float().cpu(), model.W_O.detach().float().cpu()
    eye = torch.eye(cfg.d_head)
    ln1 = [_norm_weight(block.ln1, cfg.d_model)[:, None] for block in model.blocks]
    ov = {
        (lp, hp): (W_V[lp, hp] * ln1[lp], W_O[lp, hp]) for lp, hp in sources
    }  # V [d_model, d_head], O [d_head, d_model]
    ov_norm = {src: ((V.T @ V) * (W @ W.T)).sum().sqrt() for src, (V, W) in ov.items()}  # ||V O||_F
    scores = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))
    for layer in range(cfg.n_layers):
        earlier = [src for src in ov if src[0] < layer]
        for head in range(cfg.n_heads) if earlier else ():
            Q, K = W_Q[layer, head] * ln1[layer], W_K[layer, head] * ln1[layer]
            qk_norm = _frobenius_composition(Q, eye, K)
            # QK_h OV_p^T = Q (K^T O^T) V^T
            values = [
                _frobenius_composition(Q, K.T @ ov[src][1].T, ov[src][0]) / ov_norm[src] for src in earlier
            ]
            scores[layer, head] = float(torch.stack(values).max() / qk_norm)
    return scores


# ---------------------------------------------------------------------------------------------
# Causal checks (mean ablation of hook_z)


def _mean_ablation_hooks(model: interp.HookedTransformer, heads: Sequence[tuple[int, int]], cache) -> list:
    """Hooks replacing each head's z by its mean over the probe batch, per position (from `cache`)."""
    return ablation_hooks(model, heads=heads, method="mean", reference=cache)


def _mean_se(values: Tensor) -> tuple[float, float]:
    values = values.double()
    return float(values.mean()), float(values.std() / math.sqrt(len(values))) if len(values) > 1 else float(
        "nan"
    )


Effect = tuple[float, float]  # (mean, standard error over probe sequences)


@dataclass
class CausalEffects:
    """Per candidate head: the effect of ablating it alone, and with the other candidates ablated
    (what it adds once its stand-ins are gone); and the effect of ablating all candidates."""

    alone: dict[tuple[int, int], Effect]
    with_others_ablated: dict[tuple[int, int], Effect]
    all_candidates: Effect
    min_effect: float  # an effect below this is negligible, however small its error

    def confirmed(self, head: tuple[int, int]) -> bool:
        """Either effect exceeds CONFIRM_SE standard errors and min_effect."""
        return any(
            effects[head][0] > max(CONFIRM_SE * effects[head][1], self.min_effect)
            for effects in (self.alone, self.with_others_ablated)
            if head in effects
        )


def _candidate_effects(
    heads: Sequence[tuple[int, int]],
    measure: Callable[[Sequence[tuple[int, int]]], Tensor],
    sign: int,
    kind: str,
    progress: Progress | None,
) -> CausalEffects:
    """measure(ablated heads) -> per-sequence measurement [batch]; an effect is sign * (measurement
    with the heads ablated - measurement without them), for each head alone, each head on top of the
    other candidates, and all candidates. Each set of heads is measured once."""
    measured: dict[frozenset, Tensor] = {}

    def effect(ablated: Sequence[tuple[int, int]], baseline: Sequence[tuple[int, int]] = ()) -> Effect:
        for heads_ in (ablated, baseline):
            if frozenset(heads_) not in measured:
                measured[frozenset(heads_)] = measure(sorted(heads_))
        return _mean_se(sign * (measured[frozenset(ablated)] - measured[frozenset(baseline)]))

    label = f"Ablating {kind.replace('_', '-')} candidates"
    task = progress.add_task(label, total=2 * len(heads) + 1) if progress else None
    alone, with_others = {}, {}
    for head in heads:
        alone[head] = effect([head])
        if progress:
            progress.advance(task)
    for head in heads:
        others = [h for h in heads if h != head]
        with_others[head] = effect(heads, others) if others else alone[head]
        if progress:
            progress.advance(task)
    group = effect(heads)
    if progress:
        progress.advance(task)
    return CausalEffects(alone, with_others, group, MIN_EFFECT[kind])


@torch.inference_mode()
def induction_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    heads: Sequence[tuple[int, int]],
    progress: Progress | None = None,
) -> CausalEffects:
    """Loss increase on the second copies (nats; mean, std err over sequences) when candidate heads
    are mean-ablated: each alone, each with the other candidates ablated, all together."""
    tokens = probe.tokens.to(model.device)
    n_layers = model.cfg.n_layers
    layers = sorted({layer for layer, _ in heads})
    names = [interp.act_name(kind, layer) for layer in layers for kind in ("resid_pre", "z")]
    final = interp.act_name("resid_post", n_layers - 1)
    _, cache = model.run_with_cache(tokens, names_filter=names + [final], return_type=None)
    second = probe.second_copy_predictions().to(model.device)  # [batch, pos - 1]
    rows, pos = second.nonzero(as_tuple=True)  # predictions on the second copies
    targets = tokens[rows, pos + 1]

    def loss(ablated: Sequence[tuple[int, int]]) -> Tensor:
        """Mean loss per sequence [batch] on its second copy (logits only where it is scored)."""
        resid = cache[final]
        if ablated:
            start = min(layer for layer, _ in ablated)
            with model.hooks(fwd_hooks=_mean_ablation_hooks(model, ablated, cache)):
                resid = model(cache["resid_pre", start], start_at_layer=start, stop_at_layer=n_layers)
        logits = model.unembed(model.ln_final(resid[rows, pos][:, None]))[:, 0]  # [n_scored, d_vocab]
        per_token = torch.zeros(second.shape, dtype=torch.float32, device=second.device)
        per_token[rows, pos] = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
        return (per_token.sum(-1) / second.sum(-1)).float().cpu()

    return _candidate_effects(heads, loss, 1, "induction", progress)


@torch.inference_mode()
def previous_token_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    heads: Sequence[tuple[int, int]],
    targets: Sequence[tuple[int, int]],
    progress: Progress | None = None,
) -> CausalEffects:
    """Drop in the mean induction score of the `targets` (induction heads) in layers after the
    earliest candidate when candidates are mean-ablated (mean, std err over sequences): each alone,
    each with the other candidates ablated, all together. Heads after the last target get NaN."""
    heads = [head for head in heads if any(lt > head[0] for lt, _ in targets)]
    tokens = probe.tokens.to(model.device)
    masks = {"induction": score_masks(probe.tokens, probe.lengths)["induction"]}
    start = min((layer for layer, _ in heads), default=0)
    later = [target for target in targets if target[0] > start]
    target_layers = sorted({layer for layer, _ in later})
    names = [
        interp.act_name(kind, layer) for layer in sorted({h[0] for h in heads}) for kind in ("resid_pre", "z")
    ]
    names += [interp.act_name("pattern", layer) for layer in target_layers]
    _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)

    def target_score(ablated: Sequence[tuple[int, int]]) -> Tensor:
        """Mean induction score [batch] of the later targets with `ablated` mean-ablated."""
        patterns = {layer: cache["pattern", layer] for layer in target_layers}
        first = min((layer for layer, _ in ablated), default=max(target_layers) + 1)
        affected = [layer for layer in target_layers if layer > first]  # earlier ones stay clean
        if affected:
            with model.hooks(fwd_hooks=_mean_ablation_hooks(model, ablated, cache)):
                _, run = model.run_with_cache(
                    cache["resid_pre", first],
                    names_filter=[interp.act_name("pattern", layer) for layer in affected],
                    start_at_layer=first,
                    stop_at_layer=max(affected) + 1,
                )
            patterns.update({layer: run["pattern", layer] for layer in affected})
        per_target = [
            pattern_scores(patterns[lt][:, ht : ht + 1].float().cpu(), masks, probe.lengths)["induction"][
                :, 0
            ]
            for lt, ht in later
        ]
        return torch.stack(per_target).mean(0)

    if not heads or not later:
        return CausalEffects({}, {}, (float("nan"), float("nan")), MIN_EFFECT["previous_token"])
    return _candidate_effects(heads, target_score, -1, "previous_token", progress)


# ---------------------------------------------------------------------------------------------
# The report


@dataclass
class HeadReport:
    """Scores, types and causal effects of every head; `table` has one row per (layer, head).

    Columns: layer, head; each score (SCORE_NAMES; `_se` standard errors; `_text` on natural text),
    induction_len<L> per repeat length, fixed_offset_distance (the offset d of fixed_offset),
    skip_gram_pair ("t -> v", the token pair behind skip_gram), copying, k_composition;
    confidence_<type> (bootstrap probability the score clears the threshold); for each causal type
    (induction, previous_token): <type>_effect(_se) ablating the head alone,
    <type>_effect_with_others(_se) ablating it with the other candidates already ablated (NaN when
    not tested), <type>_confirmed; types (list of type names).
    """

    model_name: str
    table: pd.DataFrame
    settings: dict[str, Any]
    thresholds: dict[str, float]
    n_layers: int
    n_heads: int
    # "induction" / "previous_token": (mean, std err) effect of ablating all candidates together
    group_effects: dict[str, tuple[float, float]] = field(default_factory=dict)
    str_tokens: dict[str, list[str]] = field(default_factory=dict)  # probe name -> first sequence's tokens
    patterns: dict[str, Tensor] = field(default_factory=dict)  # probe name -> [layer, head, q, k]

    def score_grid(self, column: str) -> np.ndarray:
        """[layer, head] values of one column."""
        grid = np.full((self.n_layers, self.n_heads), np.nan)
        grid[self.table["layer"], self.table["head"]] = self.table[column].astype(float)
        return grid

    def heads_of_type(self, head_type: str) -> list[tuple[int, int]]:
        """(layer, head) of the heads classified as `head_type`, best score first."""
        rows = self.table[self.table["types"].apply(lambda types: head_type in types)]
        rows = rows.sort_values(head_type, ascending=False)
        return list(zip(rows["layer"].tolist(), rows["head"].tolist(), strict=True))

    def to_dict(self) -> dict[str, Any]:
        lengths = self.settings["induction_lengths"]
        heads = []
        for row in self.table.to_dict("records"):
            heads.append(
                {
                    "layer": int(row["layer"]),
                    "head": int(row["head"]),
                    "scores": {
                        name: _float(row[name]) for name in (*SCORE_NAMES, "copying", "k_composition")
                    },
                    "score_se": {name: _float(row[f"{name}_se"]) for name in SCORE_NAMES},
                    "text_scores": {name: _float(row.get(f"{name}_text")) for name in PATTERN_SCORES},
                    "induction_by_length": {str(n): _float(row[f"induction_len{n}"]) for n in lengths},
                    "fixed_offset_distance": _int(row["fixed_offset_distance"]),
                    "skip_gram_pair": row["skip_gram_pair"] or None,
                    "types": list(row["types"]),
                    "confidence": {name: _float(row[f"confidence_{name}"]) for name in SCORE_NAMES},
                    "causal": {
                        kind: {
                            "effect": _float(row[f"{kind}_effect"]),
                            "se": _float(row[f"{kind}_effect_se"]),
                            "effect_with_others_ablated": _float(row[f"{kind}_effect_with_others"]),
                            "se_with_others_ablated": _float(row[f"{kind}_effect_with_others_se"]),
                            "confirmed": bool(row[f"{kind}_confirmed"]),
                        }
                        for kind in CAUSAL_TYPES
                    },
                }
            )
        groups = {
            kind: {"effect": _float(m), "se": _float(se)} for kind, (m, se) in self.group_effects.items()
        }
        return {
            "model": self.model_name,
            "settings": self.settings,
            "thresholds": self.thresholds,
            "group_effects": groups,
            "heads": heads,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)


def _float(value) -> float | None:
    """JSON-safe float: NaN and missing become None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _int(value) -> int | None:
    value = _float(value)
    return None if value is None else int(value)


def _summarise(per_sequence: Tensor, thresholds: Tensor, generator: torch.Generator) -> tuple[Tensor, ...]:
    """Scores [seq, layer, head] -> (mean, std err, bootstrap P(mean >= threshold)), each [layer, head]."""
    mean = per_sequence.nanmean(0)
    n = (~per_sequence.isnan()).sum(0).clamp_min(1)
    centred = (per_sequence - mean).nan_to_num(0.0)
    se = (centred.pow(2).sum(0) / (n - 1).clamp_min(1)).sqrt() / n.sqrt()
    index = torch.randint(len(per_sequence), (N_BOOTSTRAP, len(per_sequence)), generator=generator)
    resampled = per_sequence[index].nanmean(1)  # [bootstrap, layer, head]
    confidence = (resampled >= thresholds).float().mean(0)
    return mean, se, confidence


def mask_scores(pattern: Tensor, tokens: Tensor, lengths: Tensor) -> dict[str, Tensor]:
    """PATTERN_SCORES of pattern [batch, head, q, k] on its own tokens: {score: [batch, head]}."""
    return pattern_scores(pattern, score_masks(tokens, lengths), lengths)


def head_report(
    model: interp.HookedTransformer,
    n_samples: int = 16,
    seed: int = 0,
    seq_len: int = 24,
    progress: bool = True,
    natural_text: Sequence[str] | None = None,
    causal: bool = True,
    max_candidates: int = 12,
    batch_size: int = 8,
) -> HeadReport:
    """Score, causally check and classify every attention head of `model`.

    Probes: n_samples repeated random sequences per repeat length (induction_lengths(seq_len), each
    after a random prefix of up to seq_len // 3 tokens (less in a short context), after a BOS if
    the model uses one), n_samples
    unrepeated random sequences (fixed offsets; skip-grams without a tokenizer), and natural_text
    (default NATURAL_TEXT when the model has a tokenizer, () to skip: `<score>_text` columns and
    skip-grams). Causal checks run on at most `max_candidates` induction and previous-token
    candidates each (highest scores first). See the module docstring for definitions.
    """
    cfg = model.cfg
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 (standard errors need two sequences), got {n_samples}.")
    if max_candidates < 1 or batch_size < 1:
        raise ValueError(f"max_candidates and batch_size must be >= 1, got {max_candidates}, {batch_size}.")
    has_bos = _bos_token(model) is not None
    max_offset = max(1, min(seq_len // 3, (cfg.n_ctx - int(has_bos)) // 6))
    longest = min(seq_len, (cfg.n_ctx - int(has_bos) - max_offset) // 2)
    lengths = induction_lengths(longest)
    if natural_text is None:
        natural_text = NATURAL_TEXT if model.tokenizer is not None else ()
    natural_text = [natural_text] if isinstance(natural_text, str) else list(natural_text)
    generator = torch.Generator().manual_seed(seed)

    console = Console(stderr=True)
    bar = Progress(console=console, transient=True, disable=not progress)
    with bar:
        repeated = repeated_probe(model, n_samples, lengths, max_offset, seed)
        unrepeated = random_probe(model, n_samples, max_offset + 2 * longest, seed)
        text = text_probe(model, natural_text) if natural_text else None

        skip_probe = text if text is not None else unrepeated
        types_, keys = skip_probe.tokens.unique(return_inverse=True)  # compact token types

        def skip_gram_mass(pattern: Tensor, tokens: Tensor, lengths_: Tensor) -> Tensor:
            return skip_gram_masses(
                pattern, torch.searchsorted(types_, tokens.contiguous()), lengths_, len(types_)
            )

        def random_scores(pattern: Tensor, tokens: Tensor, lengths_: Tensor) -> dict[str, Tensor]:
            found = {"offsets": fixed_offset_scores(pattern, lengths_)}
            return found | ({} if text is not None else {"mass": skip_gram_mass(pattern, tokens, lengths_)})

        def text_scores(pattern: Tensor, tokens: Tensor, lengths_: Tensor) -> dict[str, Tensor]:
            return mask_scores(pattern, tokens, lengths_) | {
                "mass": skip_gram_mass(pattern, tokens, lengths_)
            }

        scores, examples = {}, {}
        scores["repeated"], examples["repeated"] = probe_patterns(
            model, repeated, batch_size, mask_scores, bar
        )
        scores["random"], examples["random"] = probe_patterns(
            model, unrepeated, batch_size, random_scores, bar
        )
        if text is not None:
            scores["text"], examples["text"] = probe_patterns(model, text, batch_size, text_scores, bar)
        skip_score, skip_query, skip_key = skip_gram_scores(
            scores[skip_probe.name]["mass"].flatten(1, 2), keys, skip_probe.lengths
        )
        thresholds = _thresholds(repeated, unrepeated, skip_probe, keys, len(types_))

        columns: dict[str, Tensor] = {}
        for name in PATTERN_SCORES:
            mean, se, confidence = _summarise(
                scores["repeated"][name], torch.tensor(thresholds[name]), generator
            )
            columns[name], columns[f"{name}_se"], columns[f"confidence_{name}"] = mean, se, confidence
            if text is not None:
                columns[f"{name}_text"] = scores["text"][name].nanmean(0)
        # Induction at every repeat length: the score is the lowest, confidence that all clear.
        per_length = {}
        for length in lengths:
            rows = repeated.repeat_len == length
            per_length[length] = _summarise(
                scores["repeated"]["induction"][rows], torch.tensor(thresholds["induction"]), generator
            )
            columns[f"induction_len{length}"] = per_length[length][0]
        stacked = torch.stack([per_length[n][0] for n in lengths])  # [length, layer, head]
        lowest = stacked.nan_to_num(float("inf")).argmin(0, keepdim=True)
        columns["induction"] = stacked.gather(0, lowest)[0]
        columns["induction_se"] = torch.stack([per_length[n][1] for n in lengths]).gather(0, lowest)[0]
        columns["confidence_induction"] = torch.stack([per_length[n][2] for n in lengths]).prod(0)
        # Fixed offsets d >= 2 on unrepeated random tokens, the best offset per head.
        offsets = scores["random"]["offsets"]  # [seq, layer, head, offset]
        offset_means = offsets.nanmean(0)[..., 2:].nan_to_num(-1.0)
        distance = offset_means.argmax(-1)  # [layer, head], offset - 2
        best = offsets[..., 2:].gather(-1, distance[None, ..., None].expand(len(offsets), -1, -1, 1))[..., 0]
        mean, se, confidence = _summarise(best, torch.tensor(thresholds["fixed_offset"]), generator)
        columns["fixed_offset"], columns["fixed_offset_se"], columns["confidence_fixed_offset"] = (
            mean,
            se,
            confidence,
        )
        columns["fixed_offset_distance"] = (distance + 2).float()
        columns["skip_gram"] = skip_score.view(cfg.n_layers, cfg.n_heads)
        columns["skip_gram_se"] = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))
        columns["confidence_skip_gram"] = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))

        candidates = {
            name: _top_heads(columns[name], thresholds[name], max_candidates) for name in CAUSAL_TYPES
        }
        columns["copying"] = copying_scores(model)
        columns["k_composition"] = k_composition_scores(model, candidates["previous_token"])

        effects: dict[str, CausalEffects] = {}
        if causal and candidates["induction"]:
            effects["induction"] = induction_ablation_effects(model, repeated, candidates["induction"], bar)
            confirmed = [h for h in candidates["induction"] if effects["induction"].confirmed(h)]
            effects["previous_token"] = previous_token_ablation_effects(
                model, repeated, candidates["previous_token"], confirmed or candidates["induction"], bar
            )

    skip_pairs = _token_pairs(model, types_, skip_query, skip_key)
    nan = (float("nan"), float("nan"))
    rows = []
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            row: dict[str, Any] = {"layer": layer, "head": head}
            row.update({name: float(values[layer, head]) for name, values in columns.items()})
            row["skip_gram_pair"] = skip_pairs[layer * cfg.n_heads + head]
            for kind in CAUSAL_TYPES:
                found = effects.get(kind)
                alone = found.alone.get((layer, head), nan) if found else nan
                with_others = found.with_others_ablated.get((layer, head), nan) if found else nan
                row[f"{kind}_effect"], row[f"{kind}_effect_se"] = alone
                row[f"{kind}_effect_with_others"], row[f"{kind}_effect_with_others_se"] = with_others
                row[f"{kind}_confirmed"] = bool(found and found.confirmed((layer, head)))
            types = [name for name in SCORE_NAMES if row[name] >= thresholds[name]]
            if "induction" in types and not row["induction_confirmed"]:
                types.remove("induction")
            row["types"] = types
            rows.append(row)

    settings = {
        "n_samples": n_samples,
        "seed": seed,
        "seq_len": longest,
        "induction_lengths": lengths,
        "max_prefix": max_offset,
        "has_bos": has_bos,
        "natural_text": natural_text,
        "skip_gram_probe": skip_probe.name,
        "causal": causal,
        "max_candidates": max_candidates,
        "ablation": "mean over the probe batch, per position, of hook_z",
        "causal_method": (
            "each candidate mean-ablated alone and with the other candidates of its type already "
            "ablated (minimality); confirmed when either effect exceeds the threshold"
        ),
        "confirm_if_effect_exceeds_se_times": CONFIRM_SE,
        "confirm_if_effect_at_least": MIN_EFFECT,
        "n_bootstrap": N_BOOTSTRAP,
    }
    return HeadReport(
        model_name=cfg.model_name,
        table=pd.DataFrame(rows),
        settings=settings,
        thresholds=thresholds,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        group_effects={kind: found.all_candidates for kind, found in effects.items()},
        str_tokens={"repeated": repeated.str_tokens, "random": unrepeated.str_tokens}
        | ({"text": text.str_tokens} if text is not None else {}),
        patterns=examples,
    )


def _thresholds(
    repeated: Probe, unrepeated: Probe, skip_probe: Probe, keys: Tensor, n_types: int
) -> dict[str, float]:
    """Each type's threshold: the score of uniform causal attention on the same probes plus its margin
    (broad: a fixed normalised entropy)."""
    baseline = pattern_scores(
        uniform_pattern(repeated.lengths, repeated.tokens.shape[1]),
        score_masks(repeated.tokens, repeated.lengths),
        repeated.lengths,
    )
    thresholds = {
        name: float(baseline[name].nanmean()) + MARGINS[name] for name in PATTERN_SCORES if name in MARGINS
    }
    thresholds["broad"] = BROAD_THRESHOLD
    uniform = uniform_pattern(unrepeated.lengths, unrepeated.tokens.shape[1])
    offsets = fixed_offset_scores(uniform, unrepeated.lengths).nanmean(0)[0]  # [offset]
    thresholds["fixed_offset"] = float(offsets[2:].nan_to_num(0.0).max()) + MARGINS["fixed_offset"]
    uniform = uniform_pattern(skip_probe.lengths, skip_probe.tokens.shape[1])
    mass = skip_gram_masses(uniform, keys, skip_probe.lengths, n_types)
    skip = skip_gram_scores(mass, keys, skip_probe.lengths)[0]
    thresholds["skip_gram"] = float(skip.nan_to_num(0.0).max()) + MARGINS["skip_gram"]
    return thresholds


def _token_pairs(model: interp.HookedTransformer, types: Tensor, query: Tensor, key: Tensor) -> list[str]:
    """ "t -> v" strings of the skip-gram pairs (compact type ids; -1: none)."""

    def word(index: int) -> str:
        text = _str_tokens(model, types[index : index + 1])[0]
        return text.strip() or repr(text)

    return [
        "" if q < 0 else f"{word(q)} -> {word(k)}" for q, k in zip(query.tolist(), key.tolist(), strict=True)
    ]


def _top_heads(values: Tensor, threshold: float, limit: int) -> list[tuple[int, int]]:
    """(layer, head) of up to `limit` heads whose score is >= threshold, highest first."""
    flat = values.flatten().nan_to_num(-1.0)
    order = flat.argsort(descending=True)[:limit]
    n_heads = values.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in order if flat[i] >= threshold]
