"""Weight processing that leaves the model's log-probabilities unchanged.

- fold_ln: a norm's weight w and bias b move into the layer that reads its output
  (W <- diag(w) W, b_W <- b_W + b W); the norm keeps only centring and scaling. After a LayerNorm,
  W is also centred over d_model (its input has mean zero), as TransformerLens does.
- center_writing_weights: (LayerNorm models) every matrix that writes to the residual stream
  writes mean-zero vectors; LayerNorm removes the mean anyway.
- center_unembed: W_U and b_U get mean zero over the vocabulary; softmax ignores constant shifts.
- fold_value_biases: b_V moves into b_O (each head's pattern sums to 1, so b_V W_O is a constant
  added to the output); hook_v and hook_z change, the output does not.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from interp.model.components import Norm


def process_weights(
    model: nn.Module,
    fold_ln: bool = False,
    center_writing_weights: bool = False,
    center_unembed: bool = False,
    fold_value_biases: bool = False,
) -> None:
    """Process a HookedTransformer's weights in place (see the module docstring); `model.cfg`
    becomes a new Config recording what was folded (norm_folded, the biases that now exist).
    center_unembed is refused on a model that soft-caps its logits (cap * tanh(logits / cap) is not
    shift-invariant, so centring W_U would change its probabilities)."""
    if center_unembed and model.cfg.output_logits_soft_cap:
        raise ValueError(
            f"center_unembed would change {model.cfg.model_name}'s probabilities: it soft-caps its "
            f"logits (cap {model.cfg.output_logits_soft_cap} * tanh(logits / cap)), which a shift of the "
            "logits does not pass through unchanged; leave center_unembed=False."
        )
    if not (fold_ln or center_writing_weights or center_unembed or fold_value_biases):
        return
    with torch.no_grad():
        # Weights may share storage with the transformers model they came from, or with each other
        # (tied embeddings: W_U is a view of W_E); the edits below are in place, so copy them first.
        for param in model.parameters():
            param.data = param.data.clone()
        if fold_ln:
            _fold_ln(model)
        if center_writing_weights:
            _center_writing_weights(model)
        if center_unembed:
            _center_unembed(model)
        if fold_value_biases:
            _fold_value_biases(model)


def _bias(module: nn.Module, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
    """The bias parameter `name`, created as zeros if the module has none."""
    if getattr(module, name) is None:
        setattr(module, name, nn.Parameter(torch.zeros(shape, dtype=like.dtype, device=like.device)))
    return getattr(module, name)


def _fold_norm_into(norm: Norm, readers: list[tuple[nn.Module, str, str]]) -> None:
    """readers: (module, weight name, bias name); weights are [..., d_model, out] matrices."""
    w, b = norm.w, norm.b
    if w is None and b is None:  # folded already, or no norm at all
        return
    for module, weight_name, bias_name in readers:
        W = getattr(module, weight_name)
        if b is not None:
            shift = torch.einsum("d,...de->...e", b, W)
            bias = _bias(module, bias_name, shift.shape, W)
            bias += shift
        W *= w[:, None]
        if norm.center:  # LayerNorm output has mean zero, so W's mean over d_model is unused
            W -= W.mean(-2, keepdim=True)
    norm.w = None
    norm.b = None


def _mlp_readers(mlp: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """The (module, weight, bias) pairs that read an MLP's input: W_in and W_gate, or for a
    mixture of experts the router and every expert's."""
    if hasattr(mlp, "experts"):
        return [(mlp, "W_router", "b_router")] + [r for e in mlp.experts for r in _mlp_readers(e)]
    readers = [(mlp, "W_in", "b_in")]
    if mlp.W_gate is not None:
        readers.append((mlp, "W_gate", "b_gate"))
    return readers


def _fold_ln(model: nn.Module) -> None:
    cfg = model.cfg
    if cfg.norm_folded:
        return
    if cfg.positional == "shortformer" and cfg.normalization != "none" and cfg.pre_norm:
        raise ValueError(
            f"fold_ln cannot fold {cfg.model_name}'s ln1: its shortformer positions are added after ln1, "
            "so ln1's weight moved into W_Q and W_K would scale the positions too. Pass fold_ln=False."
        )
    for block in model.blocks:
        if (
            getattr(block, "mlp", None) is not None and getattr(block.mlp, "ln", None) is not None
        ):  # SoLU's LayerNorm, read by W_out
            _fold_norm_into(block.mlp.ln, [(block.mlp, "W_out", "b_out")])
        if not cfg.pre_norm:
            continue  # nothing before attention and MLP to fold (OLMo 2); post-norms cannot fold
        attn = block.attn
        # key/value parameters per key/value head (_W_K), not the per-query-head views (W_K)
        readers = [(attn, "W_Q", "b_Q"), (attn, "_W_K", "_b_K"), (attn, "_W_V", "_b_V")]
        _fold_norm_into(block.ln1, readers)
        if not cfg.attn_only:
            readers = _mlp_readers(block.mlp)
            if cfg.num_experts is not None and block.ln2.b is not None:
                raise NotImplementedError("Folding a LayerNorm bias into routed experts is not supported.")
            _fold_norm_into(block.ln2, readers)
    _fold_norm_into(model.ln_final, [(model, "W_U", "b_U")])
    cfg = model.cfg = dataclasses.replace(
        cfg,
        norm_folded=True,
        qkv_bias=all(block.attn.b_Q is not None and block.attn._b_K is not None for block in model.blocks),
        mlp_bias=cfg.attn_only or all(getattr(block.mlp, "b_in", None) is not None for block in model.blocks),
        unembed_bias=model.b_U is not None,
    )
    if not cfg.attn_only and cfg.mlp_bias:
        for block in model.blocks:
            _bias(block.mlp, "b_out", (cfg.d_model,), block.mlp.W_out)


def _center_writing_weights(model: nn.Module) -> None:
    if model.cfg.normalization != "layernorm":
        raise ValueError(
            "center_writing_weights needs LayerNorm (which removes the mean); "
            f"{model.cfg.model_name} uses {model.cfg.normalization}."
        )
    writers = [model.W_E] + ([model.W_pos] if model.cfg.positional == "learned" else [])
    for block in model.blocks:
        writers += [block.attn.W_O, block.attn.b_O]
        if not model.cfg.attn_only:
            writers += [block.mlp.W_out, block.mlp.b_out]
    for W in writers:
        if W is not None:
            W -= W.mean(-1, keepdim=True)


def _center_unembed(model: nn.Module) -> None:
    model.W_U -= model.W_U.mean(-1, keepdim=True)
    if model.b_U is not None:
        model.b_U -= model.b_U.mean()


def _fold_value_biases(model: nn.Module) -> None:
    for block in model.blocks:
        attn = block.attn
        if attn.b_V is None:
            continue
        shift = torch.einsum("he,hed->d", attn.b_V, attn.W_O)  # b_V per query head: [head, d_head]
        b_O = _bias(attn, "b_O", shift.shape, attn.W_O)
        b_O += shift
        attn._b_V.zero_()
    model.cfg = dataclasses.replace(
        model.cfg, attn_out_bias=all(block.attn.b_O is not None for block in model.blocks)
    )


@torch.no_grad()
def refactor_factored_attn_matrices(model: nn.Module) -> None:
    """TransformerLens's refactoring of a HookedTransformer, in place: per head, [W_Q; b_Q] and
    [W_K; b_K] become the balanced factors of their product (SVD, sqrt of the singular values on each
    side), b_V is folded into b_O, and W_V W_O = U S V^T (SVD) is split as W_V = U S, W_O = V^T (W_O
    orthonormal rows, so a head's z has the norm of its output). Attention scores and
    outputs are unchanged; only the split between the factors is. Needs learned (not rotary)
    positions, one key/value head per query head, no q/k norms and the q, k and output biases as
    parameters."""
    from transformer_lens.FactoredMatrix import FactoredMatrix

    cfg = model.cfg
    why = (
        "rotary positions make QK depend on the positions" if cfg.positional == "rotary"
        else "grouped-query attention shares W_K between query heads" if cfg.group_size > 1
        else "q/k norms sit between the factors" if cfg.qk_norm != "none"
        else "the model has no q/k biases or output bias to hold the refactored biases"
        if not (cfg.qkv_bias and cfg.attn_out_bias) else None
    )  # fmt: skip
    if why is not None:
        raise ValueError(f"refactor_factored_attn_matrices is not possible on {cfg.model_name}: {why}.")
    for block in model.blocks:
        attn = block.attn
        q = torch.cat([attn.W_Q, attn.b_Q[:, None, :]], dim=1)  # [head, d_model + 1, d_head]
        k = torch.cat([attn._W_K, attn._b_K[:, None, :]], dim=1)
        q, k_t = FactoredMatrix(q, k.transpose(-1, -2)).make_even().pair
        k = k_t.transpose(-1, -2)
        attn.W_Q.copy_(q[:, :-1])
        attn.b_Q.copy_(q[:, -1])
        attn._W_K.copy_(k[:, :-1])
        attn._b_K.copy_(k[:, -1])
        attn.b_O.add_(torch.einsum("he,hed->d", attn._b_V, attn.W_O))
        attn._b_V.zero_()
        u, s, v = FactoredMatrix(attn._W_V, attn.W_O).svd()  # W_V W_O = u diag(s) v^T
        attn._W_V.copy_(u @ s.diag_embed())
        attn.W_O.copy_(v.transpose(-1, -2))
