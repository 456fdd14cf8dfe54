"""Head types: score every attention head on probe inputs, confirm candidates causally, classify.

Attention-pattern scores (per head, averaged over queries, then over probe sequences):

  previous_token   attention from token i to token i-1                                (queries i >= 1)
  induction        attention from token i to every token right after an earlier copy of token i
                   (prefix matching; on repeated random sequences: the second copy)   (queries with a copy)
  duplicate_token  attention from token i to earlier copies of token i                (queries with a copy)
  current_token    attention from token i to itself                                   (queries i >= 1)
  first_token      attention to position 0 (BOS, or the first token without one)      (queries i >= 1)
  broad            normalised entropy H(row) / log(i+1): 1 is uniform over the prefix (queries i >= 4)

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
keys than chance), 0.4 for first_token (sinks are common; "most of the attention"). broad needs
normalised entropy >= 0.8: as spread out as uniform attention over half a 40-token prefix
(log 20 / log 40 = 0.81). Confidence = the bootstrap probability (resampling probe sequences) that the
score clears its threshold. All scores stay in the table, so users can apply their own cut.

Causal checks, by mean ablation of a head's output z (its mean over the probe batch, per position):
an induction candidate is confirmed if ablating it raises the loss on the second copy of repeated
sequences by more than two standard errors; a previous-token candidate is confirmed if ablating it
lowers the induction score of the later induction candidates by more than two standard errors.
"induction" is only given as a type when confirmed; "previous_token" is given on its pattern alone
(a previous-token head need not feed an induction head) and carries its causal effect as evidence.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from rich.console import Console
from rich.progress import Progress
from torch import Tensor

import interp
from interp.ablation import ablation_hooks
from interp.devices import module_weight
from interp.tasks import repeated_sequence_masks, repeated_sequences

SCORE_NAMES = ("previous_token", "induction", "duplicate_token", "current_token", "first_token", "broad")
MARGINS = {
    "previous_token": 0.3,
    "induction": 0.3,
    "duplicate_token": 0.3,
    "current_token": 0.3,
    "first_token": 0.4,
}
BROAD_THRESHOLD = 0.8
BROAD_MIN_QUERY = 4
CONFIRM_SE = 2.0  # a causal effect is confirmed when effect > CONFIRM_SE * standard error
N_BOOTSTRAP = 500

NATURAL_TEXT = (
    "The cat sat on the mat, and then the cat slept on the mat all afternoon.",
    "Alice gave Bob a book about the history of Paris, and Bob gave Alice a map of Paris.",
    "In 1969 the first people walked on the Moon; in 1972 the last people walked on the Moon.",
    "She opened the door, looked at the garden, closed the door, and looked at the garden again.",
    "Water boils at one hundred degrees Celsius at sea level, but at lower temperatures on mountains.",
    "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n",
)


# ---------------------------------------------------------------------------------------------
# Probe inputs


@dataclass
class Probe:
    """A batch of probe sequences: tokens [batch, pos], true lengths [batch] (right padding)."""

    name: str
    tokens: Tensor
    lengths: Tensor
    str_tokens: list[str]  # of the first sequence, for attention plots


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


def repeated_probe(model: interp.HookedTransformer, n_samples: int, seq_len: int, seed: int) -> Probe:
    """[BOS] r_1..r_n r_1..r_n with random tokens from the model's vocabulary."""
    bos = _bos_token(model)
    tokens = repeated_sequences(model.cfg.d_vocab, seq_len, n_samples, generator=seed, bos=bos)
    lengths = torch.full((n_samples,), tokens.shape[1])
    return Probe("repeated", tokens, lengths, _str_tokens(model, tokens[0]))


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


@torch.inference_mode()
def probe_patterns(
    model: interp.HookedTransformer, probe: Probe, batch_size: int, progress: Progress | None = None
) -> tuple[dict[str, Tensor], Tensor]:
    """Score every head: ({score: [seq, layer, head]}, first sequence's patterns [layer, head, q, k]).

    Only hook_pattern is cached, one batch at a time.
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
        masks = score_masks(tokens, lengths)
        layer_scores = [
            pattern_scores(cache["pattern", layer].cpu(), masks, lengths) for layer in range(cfg.n_layers)
        ]
        per_batch.append({name: torch.stack([s[name] for s in layer_scores], 1) for name in SCORE_NAMES})
        if start == 0:
            n = example.shape[-1]
            example[:] = torch.stack(
                [cache["pattern", layer][0, :, :n, :n].float().cpu() for layer in range(cfg.n_layers)]
            )
        if progress:
            progress.advance(task, len(tokens))
    scores = {name: torch.cat([b[name] for b in per_batch]).cpu() for name in SCORE_NAMES}
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
    return ablation_hooks(model, heads=heads, method="mean", reference=cache, per_position=True)


def _mean_se(values: Tensor) -> tuple[float, float]:
    values = values.double()
    return float(values.mean()), float(values.std() / math.sqrt(len(values))) if len(values) > 1 else float(
        "nan"
    )


@torch.inference_mode()
def induction_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    heads: Sequence[tuple[int, int]],
    has_bos: bool,
    seq_len: int,
    progress: Progress | None = None,
) -> tuple[dict[tuple[int, int], tuple[float, float]], tuple[float, float]]:
    """Loss increase on the second copy (mean, std err over sequences) when each head, then all, are ablated.

    Returns ({(layer, head): effect}, effect of ablating all `heads` together): redundant induction
    heads can each matter little alone and much together.
    """
    tokens = probe.tokens.to(model.device)
    layers = sorted({layer for layer, _ in heads})
    names = [interp.act_name(kind, layer) for layer in layers for kind in ("resid_pre", "z")]
    clean_logits, cache = model.run_with_cache(tokens, names_filter=names)
    _, second_half = repeated_sequence_masks(seq_len, has_bos)
    clean = interp.next_token_loss(clean_logits, tokens, per_token=True)[:, second_half]  # [batch, n]

    def loss_increase(ablated_heads: Sequence[tuple[int, int]]) -> tuple[float, float]:
        start = min(layer for layer, _ in ablated_heads)
        hooks = _mean_ablation_hooks(model, ablated_heads, cache)
        logits = model.run_with_hooks(cache["resid_pre", start], start_at_layer=start, fwd_hooks=hooks)
        ablated = interp.next_token_loss(logits, tokens, per_token=True)[:, second_half]
        return _mean_se((ablated - clean).mean(-1).cpu())

    task = progress.add_task("Ablating induction candidates", total=len(heads) + 1) if progress else None
    effects = {}
    for head in heads:
        effects[head] = loss_increase([head])
        if progress:
            progress.advance(task)
    group = loss_increase(heads)
    if progress:
        progress.advance(task)
    return effects, group


@torch.inference_mode()
def previous_token_ablation_effects(
    model: interp.HookedTransformer,
    probe: Probe,
    heads: Sequence[tuple[int, int]],
    targets: Sequence[tuple[int, int]],
    progress: Progress | None = None,
) -> dict[tuple[int, int], tuple[float, float]]:
    """(mean, std err) of the drop in the mean induction score of later `targets` when a head is ablated.

    Heads with no target in a later layer get NaN.
    """
    tokens = probe.tokens.to(model.device)
    masks = score_masks(probe.tokens, probe.lengths)
    masks = {"induction": masks["induction"]}
    layers = sorted({layer for layer, _ in heads})
    target_layers = sorted({layer for layer, _ in targets})
    names = [interp.act_name(kind, layer) for layer in layers for kind in ("resid_pre", "z")]
    names += [interp.act_name("pattern", layer) for layer in target_layers]
    _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)

    def target_scores(patterns: dict[int, Tensor], after: int) -> Tensor:
        """Mean induction score [batch] of the targets in layers after `after`."""
        per_target = [
            pattern_scores(patterns[lt][:, ht : ht + 1], masks, probe.lengths)["induction"][:, 0]
            for lt, ht in targets
            if lt > after
        ]
        return torch.stack(per_target).mean(0)

    clean_patterns = {layer: cache["pattern", layer].cpu() for layer in target_layers}  # masks live on CPU
    task = progress.add_task("Ablating previous-token candidates", total=len(heads)) if progress else None
    effects = {}
    for layer, head in heads:
        if not any(lt > layer for lt, _ in targets):
            effects[(layer, head)] = (float("nan"), float("nan"))
        else:
            later = [lt for lt in target_layers if lt > layer]
            with model.hooks(fwd_hooks=_mean_ablation_hooks(model, [(layer, head)], cache)):
                _, ablated = model.run_with_cache(
                    cache["resid_pre", layer],
                    names_filter=[interp.act_name("pattern", lt) for lt in later],
                    start_at_layer=layer,
                    stop_at_layer=max(later) + 1,
                )
            patterns = {lt: ablated["pattern", lt].cpu() for lt in later}
            drop = target_scores(clean_patterns, layer) - target_scores(patterns, layer)
            effects[(layer, head)] = _mean_se(drop.cpu())
        if progress:
            progress.advance(task)
    return effects


# ---------------------------------------------------------------------------------------------
# The report


@dataclass
class HeadReport:
    """Scores, types and causal effects of every head; `table` has one row per (layer, head).

    Columns: layer, head; each score (SCORE_NAMES, their `_se` standard errors, `_text` on natural
    text), copying, k_composition; threshold_<type>; confidence_<type> (bootstrap probability the
    score clears the threshold); induction_effect(_se), previous_token_effect(_se) (NaN when not
    tested); induction_confirmed, previous_token_confirmed; types (list of type names).
    """

    model_name: str
    table: pd.DataFrame
    settings: dict[str, Any]
    thresholds: dict[str, float]
    n_layers: int
    n_heads: int
    # "induction": (mean, std err) loss increase when all induction candidates are ablated together
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
                    "text_scores": {name: _float(row.get(f"{name}_text")) for name in SCORE_NAMES},
                    "types": list(row["types"]),
                    "confidence": {name: _float(row[f"confidence_{name}"]) for name in SCORE_NAMES},
                    "causal": {
                        kind: {
                            "effect": _float(row[f"{kind}_effect"]),
                            "se": _float(row[f"{kind}_effect_se"]),
                            "confirmed": bool(row[f"{kind}_confirmed"]),
                        }
                        for kind in ("induction", "previous_token")
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

    n_samples repeated random sequences of 2 * seq_len tokens (after a BOS if the model uses one) are
    the main probe; natural_text (default NATURAL_TEXT when the model has a tokenizer, () to skip)
    adds `<score>_text` columns. Causal checks run on at most `max_candidates` induction and
    previous-token candidates each (highest scores first). See the module docstring for definitions.
    """
    cfg = model.cfg
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 (standard errors need two sequences), got {n_samples}.")
    has_bos = _bos_token(model) is not None
    seq_len = min(seq_len, (cfg.n_ctx - int(has_bos)) // 2)
    if seq_len < 3:
        raise ValueError(f"seq_len must be >= 3 and fit twice in n_ctx={cfg.n_ctx}; got {seq_len}.")
    if natural_text is None:
        natural_text = NATURAL_TEXT if model.tokenizer is not None else ()
    natural_text = [natural_text] if isinstance(natural_text, str) else list(natural_text)
    generator = torch.Generator().manual_seed(seed)

    console = Console(stderr=True)
    bar = Progress(console=console, transient=True, disable=not progress)
    with bar:
        probes = [repeated_probe(model, n_samples, seq_len, seed)]
        if natural_text:
            probes.append(text_probe(model, natural_text))
        scores, examples = {}, {}
        for probe in probes:
            scores[probe.name], examples[probe.name] = probe_patterns(model, probe, batch_size, bar)

        repeated = probes[0]
        baseline = pattern_scores(
            uniform_pattern(repeated.lengths, repeated.tokens.shape[1]),
            score_masks(repeated.tokens, repeated.lengths),
            repeated.lengths,
        )
        thresholds = {name: float(baseline[name].nanmean()) + MARGINS[name] for name in MARGINS}
        thresholds["broad"] = BROAD_THRESHOLD

        columns: dict[str, Tensor] = {}
        for name in SCORE_NAMES:
            mean, se, confidence = _summarise(
                scores["repeated"][name], torch.tensor(thresholds[name]), generator
            )
            columns[name], columns[f"{name}_se"], columns[f"confidence_{name}"] = mean, se, confidence
            if "text" in scores:
                columns[f"{name}_text"] = scores["text"][name].nanmean(0)

        candidates = {
            name: _top_heads(columns[name], thresholds[name], max_candidates)
            for name in ("induction", "previous_token")
        }
        columns["copying"] = copying_scores(model)
        columns["k_composition"] = k_composition_scores(model, candidates["previous_token"])

        effects: dict[str, dict] = {"induction": {}, "previous_token": {}}
        group_effects: dict[str, tuple[float, float]] = {}
        if causal and candidates["induction"]:
            effects["induction"], group_effects["induction"] = induction_ablation_effects(
                model, repeated, candidates["induction"], has_bos, seq_len, bar
            )
            confirmed_induction = [h for h, (m, s) in effects["induction"].items() if m > CONFIRM_SE * s]
            targets = confirmed_induction or candidates["induction"]
            effects["previous_token"] = previous_token_ablation_effects(
                model, repeated, candidates["previous_token"], targets, bar
            )

    rows = []
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            row: dict[str, Any] = {"layer": layer, "head": head}
            row.update({name: float(values[layer, head]) for name, values in columns.items()})
            for kind in ("induction", "previous_token"):
                effect, se = effects[kind].get((layer, head), (float("nan"), float("nan")))
                row[f"{kind}_effect"], row[f"{kind}_effect_se"] = effect, se
                row[f"{kind}_confirmed"] = bool(effect > CONFIRM_SE * se)
            types = [name for name in SCORE_NAMES if row[name] >= thresholds[name]]
            if "induction" in types and not row["induction_confirmed"]:
                types.remove("induction")
            row["types"] = types
            rows.append(row)

    settings = {
        "n_samples": n_samples,
        "seed": seed,
        "seq_len": seq_len,
        "has_bos": has_bos,
        "natural_text": natural_text,
        "causal": causal,
        "max_candidates": max_candidates,
        "ablation": "mean over the probe batch, per position, of hook_z",
        "confirm_if_effect_exceeds_se_times": CONFIRM_SE,
        "n_bootstrap": N_BOOTSTRAP,
    }
    return HeadReport(
        model_name=cfg.model_name,
        table=pd.DataFrame(rows),
        settings=settings,
        thresholds=thresholds,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        group_effects=group_effects,
        str_tokens={probe.name: probe.str_tokens for probe in probes},
        patterns=examples,
    )


def _top_heads(values: Tensor, threshold: float, limit: int) -> list[tuple[int, int]]:
    """(layer, head) of up to `limit` heads whose score is >= threshold, highest first."""
    flat = values.flatten().nan_to_num(-1.0)
    order = flat.argsort(descending=True)[:limit]
    n_heads = values.shape[1]
    return [(int(i) // n_heads, int(i) % n_heads) for i in order if flat[i] >= threshold]
