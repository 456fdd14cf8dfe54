"""Weight-based evidence of head types (Elhage et al. 2021), unitless:

  copying          sum(eig) / sum(|eig|) of the full OV circuit W_E W_V W_O W_U, in [-1, 1] (eigenvalues
                   from the [d_head, d_head] W_O W_U W_E W_V)
  k_composition    max over earlier previous-token heads p of ||QK_h OV_p^T||_F / (||QK_h||_F ||OV_p||_F),
                   in [0, 1]

Norm weights are folded into the matrices they scale (pre-norms into the readers, a post-attention norm
into W_O, q/k norms into W_Q's and W_K's columns), a LayerNorm's centring (it reads x - mean(x)) into
its readers, and the unembedding is centred over the vocabulary (a shift of every logit alike changes
no probability), so raw weights and weights processed as TransformerLens's (`fold_ln`,
`center_writing_weights`, `center_unembed`) give the same scores; biases, rotary positions and a
logit soft-cap are ignored. Read in float32 on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

import interp
from interp.checks import check_heads
from interp.model.components import Norm
from interp.types import Head


def _norm_weight(norm: nn.Module | None, d_model: int) -> Float[Tensor, " d_model"]:
    """A norm's elementwise weight; ones where there is none (None, or a post-norm block's Identity
    pre-norm)."""
    return norm.weight(d_model) if isinstance(norm, Norm) else torch.ones(d_model)


def _read(model: interp.HookedTransformer, weights: Float[Tensor, "... d_model out"]) -> Tensor:
    """What a norm's reader reads with `weights` (its weight folded in already): under LayerNorm, the
    centred residual stream, so P @ weights with P = I - 1 1^T / d_model (the mean over d_model taken
    out of each column; for a writer, weights.mT @ P, the part of its output any reader sees); under
    RMSNorm or none, the stream itself."""
    if model.cfg.normalization != "layernorm":
        return weights
    return weights - weights.mean(-2, keepdim=True)


def _query_key_weights(model: interp.HookedTransformer) -> tuple[Tensor, Tensor]:
    """The q/k norms' elementwise weights per query head ([layer, head, 1, d_head] each: ones without
    q/k norms; a key/value head's repeated for its group), which scale W_Q's and W_K's columns."""
    cfg = model.cfg
    if cfg.qk_norm == "none":
        ones = torch.ones(cfg.n_layers, cfg.n_heads, 1, cfg.d_head)
        return ones, ones
    group = cfg.group_size
    q = [block.attn.q_ln.weight(cfg.d_head).expand(cfg.n_heads, cfg.d_head).cpu() for block in model.blocks]
    k = [
        block.attn.k_ln.weight(cfg.d_head).expand(cfg.n_kv_heads, cfg.d_head).cpu() for block in model.blocks
    ]
    return torch.stack(q)[:, :, None], torch.stack(k).repeat_interleave(group, 1)[:, :, None]


def _output_weight(block: nn.Module, d_model: int) -> Float[Tensor, " d_model"]:
    """The post-attention norm's elementwise weight, which scales every head's output (ones without one)."""
    return _norm_weight(getattr(block, "ln1_post", None), d_model)


@torch.inference_mode()
def copying_scores(model: interp.HookedTransformer) -> Float[Tensor, "layer head"]:
    """sum(eig) / sum(|eig|) of each head's full OV circuit (norm weights included, biases not; the
    unembedding centred over the vocabulary)."""
    cfg = model.cfg
    W_E = model.W_E.detach().float().cpu()
    W_U = _read(model, model.W_U.detach().float().cpu() * _norm_weight(model.ln_final, cfg.d_model)[:, None])
    W_U = W_U - W_U.mean(-1, keepdim=True)  # [d_model, d_vocab]: what the logits differ by
    U_E = W_U @ W_E  # [d_model, d_model]: the vocabulary round trip, computed once
    W_V, W_O = model.W_V.detach().float().cpu(), model.W_O.detach().float().cpu()
    scores = torch.zeros(cfg.n_layers, cfg.n_heads)
    for layer in range(cfg.n_layers):
        W_V_normed = _read(
            model, W_V[layer] * _norm_weight(model.blocks[layer].ln1, cfg.d_model)[None, :, None]
        )
        W_O_out = W_O[layer] * _output_weight(model.blocks[layer], cfg.d_model)  # what reaches the stream
        small = W_O_out @ U_E @ W_V_normed  # [head, d_head, d_head], same nonzero eigenvalues
        eig = torch.linalg.eigvals(small.double())
        scores[layer] = (eig.sum(-1).real / eig.abs().sum(-1)).float()
    return scores


@torch.inference_mode()
def k_composition_scores(
    model: interp.HookedTransformer, sources: Sequence[Head]
) -> Float[Tensor, "layer head"]:
    """Max over source heads (l, h) in earlier layers of the K-composition score; NaN if none.

    K-composition of source p into head h: ||QK_h OV_p^T||_F / (||QK_h||_F ||OV_p||_F), where
    QK_h = W_Q W_K^T (query rows, key columns) and OV_p = W_V W_O: how much of h's key side reads
    what p writes.
    """
    cfg = model.cfg
    sources = check_heads(cfg, sources)
    scores = torch.full((cfg.n_layers, cfg.n_heads), float("nan"))
    if not sources:
        return scores
    W_Q, W_K = model.W_Q.detach().float().cpu(), model.W_K.detach().float().cpu()
    W_V, W_O = model.W_V.detach().float().cpu(), model.W_O.detach().float().cpu()
    ln1 = torch.stack([_norm_weight(block.ln1, cfg.d_model) for block in model.blocks])[:, None, :, None]
    q_norm, k_norm = _query_key_weights(model)
    # Q, K: [layer, head, d_model, d_head]; V: [source, d_model, d_head]; W: [source, d_head, d_model]
    Q, K = _read(model, W_Q * ln1 * q_norm), _read(model, W_K * ln1 * k_norm)
    QtQ, KtK = Q.mT @ Q, K.mT @ K  # Gram matrices [layer, head, d_head, d_head]
    source_layers = torch.tensor([layer for layer, _ in sources])
    V = _read(model, torch.stack([W_V[lp, hp] * ln1[lp, 0] for lp, hp in sources]))
    W = torch.stack([W_O[lp, hp] * _output_weight(model.blocks[lp], cfg.d_model) for lp, hp in sources])
    W = _read(model, W.mT).mT  # what a LayerNorm reader sees of it: its output's mean taken out
    VtV, WWt = V.mT @ V, W @ W.mT
    ov_norm = (VtV * WWt).sum((-2, -1)).sqrt()  # ||V O||_F per source
    qk_norm = (QtQ * KtK.mT).sum((-2, -1)).clamp_min(0).sqrt()  # ||Q K^T||_F [layer, head]
    for layer in range(cfg.n_layers):
        earlier = (source_layers < layer).nonzero()[:, 0]
        if not len(earlier):
            continue
        # QK_h OV_p^T = Q (K^T O^T) V^T, so ||.||_F^2 = trace(M^T QtQ M VtV) with M = K^T O^T
        M = K[layer].mT[:, None] @ W[earlier].mT[None]  # [head, source, d_head, d_head]
        squared = (M * (QtQ[layer][:, None] @ M @ VtV[earlier][None])).sum((-2, -1))
        values = squared.clamp_min(0).sqrt() / ov_norm[earlier]  # [head, source]
        scores[layer] = values.max(-1).values / qk_norm[layer]
    return scores


def weight_scores(model: interp.HookedTransformer, previous_token_heads: Sequence[Head]) -> dict[str, Tensor]:
    """Stage 3 of `head_report`: {"copying": [layer, head], "k_composition": [layer, head]}, the latter
    with the previous-token candidates as sources."""
    return {
        "copying": copying_scores(model),
        "k_composition": k_composition_scores(model, previous_token_heads),
    }
