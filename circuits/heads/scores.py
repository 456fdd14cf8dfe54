"""Attention-pattern scores of every head on the probes, and their thresholds.

Per head, a mean over queries, then over probe sequences (fractions of attention, 0 to 1):

  previous_token   attention from token i to token i-1                                (queries i >= 1)
  induction        attention from i to every token right after an earlier copy of i   (queries with a copy)
  duplicate_token  attention from i to earlier copies of i                            (queries with a copy)
  current_token    attention from i to itself                                         (queries i >= 1)
  first_token      attention to position 0 (BOS, or the first token without one)      (queries i >= 1)
  broad            normalised entropy H(row) / log(i+1): 1 is uniform over the prefix (queries i >= 4)
  fixed_offset     on random tokens, attention from i to i-d at the head's best offset d >= 2
  skip_gram        on natural text, a query token t attends to one earlier token v (`skipgrams`)

The first six are TransformerLens head_detector masks ("mul"), averaged per query, on the repeated
probe (`<score>_text`: on natural text); induction is the lowest over repeat lengths
(`induction_len<L>`). Threshold: the score of uniform causal attention on the same probes (its mean over
every repeat length for induction, a little above its lowest) plus MARGINS (broad: BROAD_THRESHOLD).
Confidence: the bootstrap probability over probe sequences that the score clears it (induction: the
product over repeat lengths).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

import interp
from circuits.heads.probes import Probe, Probes, token_texts
from circuits.heads.skipgrams import skip_gram_masses, skip_gram_scores
from interp.checks import check_finite_scores
from interp.interventions.stats import bootstrap
from interp.types import Head, Progress, head_label

PATTERN_SCORES = ("previous_token", "induction", "duplicate_token", "current_token", "first_token", "broad")
SCORE_NAMES = (*PATTERN_SCORES, "fixed_offset", "skip_gram")  # every head type, in report order
MARGINS = {name: 0.4 if name == "first_token" else 0.3 for name in SCORE_NAMES if name != "broad"}
BROAD_THRESHOLD = 0.8
BROAD_MIN_QUERY = 4
# A fixed offset d is scored only where at least a third of the queries (and 4) have a key at i-d.
MIN_OFFSET_QUERIES = 4
MIN_OFFSET_QUERY_FRACTION = 1 / 3
N_BOOTSTRAP = 500
SCORES_STAGE = "Attention scores"  # every probe's scores (`HeadScores`): one stage, each probe a part


Masks = dict[str, tuple[Bool[Tensor, "batch q k"], Bool[Tensor, "batch q"]]]


def score_masks(tokens: Int[Tensor, "batch pos"], lengths: Int[Tensor, " batch"]) -> Masks:
    """Per mask score: (the keys a head of that type attends to, the queries with one such key)."""
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
    pattern: Float[Tensor, "batch head q k"], masks: Masks, lengths: Int[Tensor, " batch"]
) -> dict[str, Float[Tensor, "batch head"]]:
    """Per-sequence mask scores and `broad` (fractions of attention; NaN where no query counts)."""
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


def mask_scores(
    pattern: Float[Tensor, "batch head q k"], tokens: Int[Tensor, "batch pos"], lengths: Int[Tensor, " batch"]
) -> dict[str, Float[Tensor, "batch head"]]:
    """PATTERN_SCORES of a pattern on its own tokens."""
    return pattern_scores(pattern, score_masks(tokens, lengths), lengths)


def type_score(
    head_type: str, per_sequence: Float[Tensor, "seq ..."], repeat_len: Int[Tensor, " seq"]
) -> Tensor:
    """The mean a head is typed by (NaNs skipped): induction the lowest over the repeat lengths
    (`repeat_len` [seq]), any other type the mean over sequences."""
    if head_type != "induction":
        return per_sequence.nanmean(0)
    means = torch.stack([per_sequence[repeat_len == length].nanmean(0) for length in repeat_len.unique()])
    return means.gather(0, weakest_length(means))[0]


def weakest_length(means: Float[Tensor, "length ..."]) -> Int[Tensor, "1 ..."]:
    """The index [1, ...] of each head's lowest mean over repeat lengths (never a NaN one)."""
    return means.nan_to_num(float("inf")).argmin(0, keepdim=True)


def uniform_pattern(lengths: Int[Tensor, " batch"], n: int) -> Float[Tensor, "batch 1 n n"]:
    """Uniform causal attention: 1/(q+1) on every key k <= q."""
    causal = torch.tril(torch.ones(n, n))
    return (causal / causal.sum(-1, keepdim=True))[None, None].expand(len(lengths), 1, n, n)


def fixed_offset_scores(
    pattern: Float[Tensor, "batch head q k"], lengths: Int[Tensor, " batch"]
) -> Float[Tensor, "batch head offset"]:
    """Attention from i to i-d averaged over queries i > d, for d = 0..pos-1 (never keyed on the first
    token); NaN where fewer than MIN_OFFSET_QUERIES, or MIN_OFFSET_QUERY_FRACTION, of the queries can."""
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


@torch.inference_mode()
def probe_patterns(
    model: interp.HookedTransformer,
    probe: Probe,
    batch_size: int,
    score: Callable[[Tensor, Tensor, Tensor], dict[str, Tensor]],
    progress: Progress | None = None,
) -> tuple[dict[str, Tensor], Float[Tensor, "layer head q k"]]:
    """Run the probe and score every layer's attention: ({name: [rows, layer, head, ...]}, the first
    sequence's patterns). score(pattern [batch, head, q, k], tokens, lengths) -> {name: [rows, head,
    ...]} (rows concatenate over batches, each cut to its longest sequence)."""
    cfg = model.cfg
    per_batch: list[dict[str, Tensor]] = []
    pattern_names = [interp.act_name("pattern", layer) for layer in range(cfg.n_layers)]
    n = int(probe.lengths[0])
    example = torch.zeros(cfg.n_layers, cfg.n_heads, n, n)
    total = len(probe.tokens)
    stage = f"{SCORES_STAGE}: {probe.name} probe"
    if progress:
        progress(stage, 0, total)
    for start in range(0, total, batch_size):
        lengths = probe.lengths[start : start + batch_size]
        # Cut to the batch's longest sequence: right padding after it cannot change earlier positions.
        tokens = probe.tokens[start : start + batch_size, : int(lengths.max())]
        _, cache = model.run_with_cache(tokens.to(model.device), names_filter=pattern_names, return_type=None)
        for layer in range(cfg.n_layers):  # a NaN pattern would score NaN, and NaN types no head: refuse
            check_finite_scores(
                cache["pattern", layer],
                f"the attention patterns of layer {layer} on the {probe.name!r} probe",
                lambda index, layer=layer, start=start: (
                    f"{head_label(layer, index[1])} (sequence {start + index[0]}, query {index[2]})"
                ),
            )
        layer_scores = [
            score(cache["pattern", layer].float().cpu(), tokens.cpu(), lengths.cpu())
            for layer in range(cfg.n_layers)
        ]
        per_batch.append({name: torch.stack([s[name] for s in layer_scores], 1) for name in layer_scores[0]})
        if start == 0:
            example[:] = torch.stack(
                [cache["pattern", layer][0, :, :n, :n].float().cpu() for layer in range(cfg.n_layers)]
            )
        if progress:
            progress(stage, start + len(tokens), total)
    return {name: torch.cat([b[name] for b in per_batch]) for name in per_batch[0]}, example


def score_thresholds(probes: Probes) -> dict[str, float]:
    """Each type's threshold: uniform causal attention's score plus its margin (broad: fixed)."""
    repeated, unrepeated, skip_probe = probes.repeated, probes.random, probes.skip_gram

    def uniform(probe: Probe) -> Float[Tensor, "batch 1 pos pos"]:
        return uniform_pattern(probe.lengths, probe.tokens.shape[1])

    baseline = mask_scores(uniform(repeated), repeated.tokens, repeated.lengths)
    found = {
        name: float(baseline[name].nanmean()) + MARGINS[name] for name in PATTERN_SCORES if name in MARGINS
    }
    found["broad"] = BROAD_THRESHOLD
    offsets = fixed_offset_scores(uniform(unrepeated), unrepeated.lengths).nanmean(0)[0]  # [offset]
    found["fixed_offset"] = float(offsets[2:].nan_to_num(0.0).max()) + MARGINS["fixed_offset"]
    types, keys = skip_probe.tokens.unique(return_inverse=True)
    mass = skip_gram_masses(uniform(skip_probe), keys, skip_probe.lengths, len(types))
    skip = skip_gram_scores(mass, keys, skip_probe.lengths)[0]
    found["skip_gram"] = float(skip.nan_to_num(0.0).max()) + MARGINS["skip_gram"]
    return found


def _mean_se_confidence(
    per_sequence: Float[Tensor, "seq layer head"], threshold: float, seed: int
) -> tuple[Float[Tensor, "layer head"], Float[Tensor, "layer head"], Float[Tensor, "layer head"]]:
    """(mean, standard error, bootstrap probability of clearing `threshold`) over sequences, NaN skipped."""
    mean = per_sequence.nanmean(0)
    n = (~per_sequence.isnan()).sum(0)
    centred = (per_sequence - mean).nan_to_num(0.0)
    se = (centred.pow(2).sum(0) / (n - 1)).sqrt() / n.sqrt()  # NaN under two sequences: no spread to read
    se = torch.where(n >= 2, se, float("nan"))

    def fraction_clearing(samples: Int[Tensor, "n_boot seq"]) -> Float[Tensor, "layer head 1"]:
        resampled = per_sequence[samples].nanmean(1)  # [n_boot, layer, head]
        return (resampled >= threshold).float().mean(0)[..., None]  # one value: both quantiles are it

    confidence, _ = bootstrap(fraction_clearing, len(per_sequence), N_BOOTSTRAP, seed=seed)
    return mean, se, confidence


@dataclass(kw_only=True)
class HeadScores:
    """Stage 2 of `head_report`. columns: {column: [layer, head]}: each of SCORE_NAMES, its `_se` and
    `confidence_` (NaN for skip_gram), `<score>_text`, `induction_len<L>`, `fixed_offset_distance`."""

    columns: dict[str, Float[Tensor, "layer head"]]
    thresholds: dict[str, float]
    skip_gram_pairs: list[str]  # "t -> v" per head, layer-major ("" where no pair is scored)
    patterns: dict[str, Float[Tensor, "layer head q k"]]  # probe -> the first sequence's attention
    str_tokens: dict[str, list[str]]  # probe -> the first sequence's tokens

    def candidates(self, head_type: str, limit: int | None = None) -> list[Head]:
        """Up to `limit` (None: every one) heads whose `head_type` score clears its threshold, highest
        first."""
        values, threshold = self.columns[head_type], self.thresholds[head_type]
        flat = values.flatten().nan_to_num(-1.0)
        n_heads = values.shape[1]
        return [
            (int(i) // n_heads, int(i) % n_heads)
            for i in flat.argsort(descending=True)[:limit]
            if flat[i] >= threshold
        ]


def score_heads(
    model: interp.HookedTransformer,
    probes: Probes,
    seed: int = 0,
    batch_size: int = 8,
    progress: Progress | None = None,
) -> HeadScores:
    """Stage 2 of `head_report`: every head's scores, `batch_size` sequences per pass; `seed`: the
    confidences' bootstraps."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    cfg = model.cfg
    skip_probe = probes.skip_gram
    types, keys = skip_probe.tokens.unique(return_inverse=True)  # compact token types

    def skip_gram_mass(pattern: Tensor, tokens: Tensor, lengths: Tensor) -> Tensor:
        return skip_gram_masses(pattern, torch.searchsorted(types, tokens.contiguous()), lengths, len(types))

    def random_scores(pattern: Tensor, tokens: Tensor, lengths: Tensor) -> dict[str, Tensor]:
        offsets = fixed_offset_scores(pattern, lengths)
        width = probes.random.tokens.shape[1]  # NaN at offsets a cut batch is too short for, as uncut
        padded = torch.nn.functional.pad(offsets, (0, width - offsets.shape[-1]), value=float("nan"))
        mass = {"mass": skip_gram_mass(pattern, tokens, lengths)} if probes.text is None else {}
        return {"offsets": padded} | mass

    def text_scores(pattern: Tensor, tokens: Tensor, lengths: Tensor) -> dict[str, Tensor]:
        return mask_scores(pattern, tokens, lengths) | {"mass": skip_gram_mass(pattern, tokens, lengths)}

    per_sequence, patterns, tokens = {}, {}, {}
    for probe, score in [
        (probes.repeated, mask_scores),
        (probes.random, random_scores),
        (probes.text, text_scores),
    ]:
        if probe is not None:
            per_sequence[probe.name], patterns[probe.name] = probe_patterns(
                model, probe, batch_size, score, progress
            )
            tokens[probe.name] = probe.str_tokens
    limits = score_thresholds(probes)
    columns = mask_score_columns(per_sequence, probes, limits, seed)
    columns |= _fixed_offset_columns(per_sequence["random"]["offsets"], limits["fixed_offset"], seed)
    skip_score, skip_query, skip_key = skip_gram_scores(
        per_sequence[skip_probe.name]["mass"].flatten(1, 2), keys, skip_probe.lengths
    )
    nan = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))
    columns |= {"skip_gram": skip_score.view(cfg.n_layers, cfg.n_heads), "skip_gram_se": nan,
                "confidence_skip_gram": nan.clone()}  # fmt: skip
    pairs = _token_pairs(model, types, skip_query, skip_key)
    return HeadScores(
        columns=columns, thresholds=limits, skip_gram_pairs=pairs, patterns=patterns, str_tokens=tokens
    )


def mask_score_columns(
    per_sequence: dict[str, dict[str, Tensor]], probes: Probes, limits: dict[str, float], seed: int
) -> dict[str, Tensor]:
    """The mask scores on the repeated probe (induction: the lowest over repeat lengths, its confidence
    the product), on natural text, and induction per repeat length."""
    repeated = per_sequence["repeated"]
    by_length = {
        length: _mean_se_confidence(
            repeated["induction"][probes.repeated.repeat_len == length], limits["induction"], seed
        )
        for length in probes.induction_lengths
    }
    means, ses, confidences = (torch.stack([found[i] for found in by_length.values()]) for i in range(3))
    lowest = weakest_length(means)  # [1, layer, head]
    columns = {}
    for name in PATTERN_SCORES:
        if name == "induction":
            found = means.gather(0, lowest)[0], ses.gather(0, lowest)[0], confidences.prod(0)
        else:
            found = _mean_se_confidence(repeated[name], limits[name], seed)
        columns[name], columns[f"{name}_se"], columns[f"confidence_{name}"] = found
        if probes.text is not None:
            columns[f"{name}_text"] = per_sequence["text"][name].nanmean(0)
    for length, (mean, _, _) in by_length.items():
        columns[f"induction_len{length}"] = mean
    return columns


def _fixed_offset_columns(
    offsets: Float[Tensor, "seq layer head offset"], threshold: float, seed: int
) -> dict[str, Tensor]:
    """fixed_offset at each head's best offset d >= 2 (by mean), and that offset."""
    distance = offsets.nanmean(0)[..., 2:].nan_to_num(-1.0).argmax(-1)  # [layer, head]: d - 2
    best = offsets[..., 2:].gather(-1, distance[None, ..., None].expand(len(offsets), -1, -1, 1))[..., 0]
    mean, se, confidence = _mean_se_confidence(best, threshold, seed)
    return {
        "fixed_offset": mean,
        "fixed_offset_se": se,
        "confidence_fixed_offset": confidence,
        "fixed_offset_distance": (distance + 2).float(),
    }


def _token_pairs(
    model: interp.HookedTransformer, types: Int[Tensor, " type"], query: Tensor, key: Tensor
) -> list[str]:
    """ "t -> v" strings of skip-gram pairs given as compact type ids (-1: none)."""

    def word(index: int) -> str:
        text = token_texts(model, types[index : index + 1])[0]
        return text.strip() or repr(text)

    return [
        "" if q < 0 else f"{word(q)} -> {word(k)}" for q, k in zip(query.tolist(), key.tolist(), strict=True)
    ]
