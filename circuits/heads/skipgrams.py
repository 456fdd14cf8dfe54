"""Cross-fitted skip-gram scores: does a query token t attend to one specific earlier token v (at
varying distances)? The pair is chosen on some probe sequences and scored on the others; attention v
gets from every query (a sink) does not count. Tokens are compact type ids (`unique(return_inverse=True)`).
"""

from __future__ import annotations

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

MIN_SKIP_GRAM_SEQUENCES = 2  # per fold: a skip-gram pair is judged on query tokens seen in 4+ sequences
MIN_DISTANCE = 2  # a skip-gram key is at least this many tokens before its query


def skip_gram_occurrences(
    tokens: Int[Tensor, "batch pos"], lengths: Int[Tensor, " batch"]
) -> tuple[Int[Tensor, " occurrence"], Int[Tensor, " occurrence"]]:
    """(rows, positions) of the queries a skip-gram score looks at: every token with a possible key
    (position >= 1, at least MIN_DISTANCE back)."""
    position = torch.arange(tokens.shape[1])[None]
    valid = (position >= MIN_DISTANCE + 1) & (position < lengths[:, None])
    return valid.nonzero(as_tuple=True)


def skip_gram_keys(
    keys: Int[Tensor, "batch pos"],
    rows: Int[Tensor, " occurrence"],
    queries: Int[Tensor, " occurrence"],
) -> Bool[Tensor, "occurrence pos"]:
    """The keys a skip-gram query may attend to: at least MIN_DISTANCE back, not the first token,
    neither a copy of the query token nor right after one (that is induction)."""
    k = torch.arange(keys.shape[1])[None]
    context = keys[rows]  # [occurrence, pos]
    same = context == context[torch.arange(len(rows)), queries][:, None]
    after_same = torch.zeros_like(same)
    after_same[:, 1:] = same[:, :-1]
    return (k >= 1) & (k <= queries[:, None] - MIN_DISTANCE) & ~same & ~after_same


def skip_gram_masses(
    pattern: Float[Tensor, "batch head q k"],
    keys: Int[Tensor, "batch pos"],
    lengths: Int[Tensor, " batch"],
    n_types: int,
) -> Float[Tensor, "occurrence head type"]:
    """Attention of each query occurrence on each key token type (keys: compact ids < n_types; which
    keys count: skip_gram_keys)."""
    rows, queries = skip_gram_occurrences(keys, lengths)
    valid = skip_gram_keys(keys, rows, queries)
    attention = pattern[rows, :, queries, :].float() * valid[:, None]  # [occurrence, head, k]
    index = keys[rows][:, None].expand_as(attention)
    return torch.zeros(*attention.shape[:2], n_types).scatter_add_(-1, index, attention)


def skip_gram_scores(
    mass: Float[Tensor, "occurrence head type"],
    keys: Int[Tensor, "batch pos"],
    lengths: Int[Tensor, " batch"],
) -> tuple[Float[Tensor, " head"], Int[Tensor, " head"], Int[Tensor, " head"]]:
    """Each head's cross-fitted skip-gram score [head] (attention) and its (query type, key type) pair
    (-1: no type seen in enough sequences); mass: `skip_gram_masses` over the probe. Sequences of a query
    type t alternate between two folds; in each, v*(t) is the key the other fold attends to most (median),
    scored as attention from t on v*(t) minus other query types'. A head's score: its best type's mean
    of the folds' medians (`torch.median`: of an even count of sequences, the lower middle value)."""
    rows, queries = skip_gram_occurrences(keys, lengths)
    query = keys[rows, queries]  # [occurrence]
    n_occ, n_heads, n_types = mass.shape
    valid = skip_gram_keys(keys, rows, queries)
    present = torch.zeros(n_occ, n_types).scatter_add_(-1, keys[rows], valid.float()).clamp_max(1.0)
    total = torch.einsum("oht,ot->ht", mass, present)  # attention on each type where present
    total_count = present.sum(0)  # [type]
    never_key = total_count == 0  # types no query may attend to (the first token's): never the preferred key
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
            preferred = _preferred_key(per_sequence[fold != f], never_key)  # [head]
            held_out = per_sequence[fold == f].gather(
                -1, preferred[None, :, None].expand((fold == f).sum(), -1, 1)
            )
            contrast = held_out[..., 0] - control.gather(-1, preferred[:, None])[:, 0]  # [sequence, head]
            medians.append(contrast.median(0).values)
        mean = (medians[0] + medians[1]) / 2  # [head]
        better = mean > score.nan_to_num(-float("inf"))
        score = torch.where(better, mean, score)
        best_query = torch.where(better, t, best_query)
        best_key = torch.where(better, _preferred_key(per_sequence, never_key), best_key)
    return score, best_query, best_key


def _preferred_key(
    per_sequence: Float[Tensor, "sequence head type"], never_key: Bool[Tensor, " type"]
) -> Int[Tensor, " head"]:
    """Per head, the key type with the largest median attention over the sequences [head], among the
    types a query may attend to (ties: the lowest such type)."""
    return per_sequence.median(0).values.masked_fill(never_key, -torch.inf).argmax(-1)
