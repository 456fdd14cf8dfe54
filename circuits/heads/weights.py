"""Weight-based evidence of head types (Elhage et al. 2021), from the weights alone:

  copying          sum(eig) / sum(|eig|) of the full OV circuit W_E W_V W_O W_U ([vocab, vocab]); its
                   nonzero eigenvalues are those of the [d_head, d_head] matrix W_O W_U W_E W_V
  k_composition    max over earlier previous-token heads p of ||QK_h OV_p^T||_F / (||QK_h||_F ||OV_p||_F)

Both are unitless in [-1, 1] (copying) or [0, 1] (composition). Norm weights are multiplied into the
matrices that read the normalised stream; biases and rotary positions are ignored. Weights are read
in float32 on the CPU, also from blocks that accelerate offloaded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn

import interp
from interp.model.components import Norm
from interp.types import Head


def _norm_weight(norm: nn.Module, d_model: int) -> Float[Tensor, " d_model"]:
    """A pre-norm's elementwise weight; ones where there is none (post-norm blocks: an Identity)."""
    return norm.weight(d_model) if isinstance(norm, Norm) else torch.ones(d_model)


@torch.inference_mode()
def copying_scores(model: interp.HookedTransformer) -> Float[Tensor, "layer head"]:
    """sum(eig) / sum(|eig|) of each head's full OV circuit (norm weights included, biases not)."""
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


def _frobenius_composition(
    A: Float[Tensor, "d e"], M: Float[Tensor, "... e f"], B: Float[Tensor, "d f"]
) -> Float[Tensor, "..."]:
    """||A M B^T||_F via small Gram matrices."""
    AtA, BtB = A.T @ A, B.T @ B
    return torch.einsum("...ef,eg,...gh,hf->...", M, AtA, M, BtB).clamp_min(0).sqrt()


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
    W_Q, W_K = model.W_Q.detach().float().cpu(), model.W_K.detach().float().cpu()
    W_V, W_O = model.W_V.detach().float().cpu(), model.W_O.detach().float().cpu()
    eye = torch.eye(cfg.d_head)
    ln1 = [_norm_weight(block.ln1, cfg.d_model)[:, None] for block in model.blocks]
    ov = {(lp, hp): (W_V[lp, hp] * ln1[lp], W_O[lp, hp]) for lp, hp in sources}  # V [d_model, d_head], O
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


def weight_scores(model: interp.HookedTransformer, previous_token_heads: Sequence[Head]) -> dict[str, Tensor]:
    """Stage 3 of `head_report`: {"copying": [layer, head], "k_composition": [layer, head]}, the latter
    with the previous-token candidates as sources."""
    return {
        "copying": copying_scores(model),
        "k_composition": k_composition_scores(model, previous_token_heads),
    }
