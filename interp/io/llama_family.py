"""Architecture specs of the Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM3, Granite, OLMo 2,
Gemma 1-3, Mixtral), Phi-3, StableLM and Phi: separate or fused q/k/v projections, RMSNorm or
LayerNorm, rotary positions."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from interp.config import Config, rotary_inv_freq
from interp.io.hf_layout import (
    attention_biases,
    attention_layers,
    attention_weights,
    gated_mlp_weights,
    hf_activation,
    llama_like_config,
    norm_weights,
    partial_rotary_factor,
    qk_norm_weights,
)

# --- Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM3, Granite, OLMo 2, Gemma 1-3, Mixtral) -------


def llama_config(hf: Any) -> Config:
    return llama_like_config(hf, **attention_biases(hf), mlp_bias=hf.mlp_bias)


def mistral_config(hf: Any) -> Config:
    return llama_like_config(hf, **attention_layers(hf, every_layer=True))


def qwen2_config(hf: Any) -> Config:
    return llama_like_config(hf, qkv_bias=True, **attention_layers(hf))


def qwen3_config(hf: Any) -> Config:
    return llama_like_config(hf, qk_norm="head", **attention_biases(hf), **attention_layers(hf))


def smollm3_config(hf: Any) -> Config:
    uses_rope = hf.no_rope_layers  # 1: the layer uses RoPE, 0: no positions (NoPE)
    nope_layers = [i for i, rope in enumerate(uses_rope) if not rope]
    return llama_like_config(
        hf, nope_layers=nope_layers, **attention_biases(hf), mlp_bias=hf.mlp_bias, **attention_layers(hf)
    )


def olmo2_config(hf: Any) -> Config:
    return llama_like_config(hf, qk_norm="all_heads", pre_norm=False, post_norm=True, **attention_biases(hf))


def granite_config(hf: Any) -> Config:
    # embedding_multiplier, residual_multiplier and logits_scaling fold into weights (_granite_weights).
    return llama_like_config(
        hf, attn_scale=1 / hf.attention_multiplier, **attention_biases(hf), mlp_bias=hf.mlp_bias
    )


def gemma_config(hf: Any) -> Config:
    if getattr(hf, "use_bidirectional_attention", False):
        raise NotImplementedError("Bidirectional attention (EmbeddingGemma) is not supported.")
    activation = hf.hidden_act if hf.model_type == "gemma" else hf.hidden_activation  # as their MLPs read
    fields: dict[str, Any] = dict(
        activation=hf_activation(activation), default_prepend_bos=True, **attention_biases(hf)
    )
    if hf.model_type in ("gemma2", "gemma3_text"):
        fields.update(
            attn_scale=math.sqrt(hf.query_pre_attn_scalar),
            attn_scores_soft_cap=hf.attn_logit_softcapping,
            output_logits_soft_cap=hf.final_logit_softcapping,
            post_norm=True,
            **attention_layers(hf),
        )
    if hf.model_type == "gemma3_text":
        # RoPE per layer type: {"full_attention": {...}, "sliding_attention": {...}}
        full, local = hf.rope_parameters["full_attention"], hf.rope_parameters["sliding_attention"]
        local_type, full_type = local.get("rope_type", "default"), full.get("rope_type", "default")
        if local_type != "default" or full_type not in ("default", "linear"):
            raise NotImplementedError(
                f"Gemma 3 RoPE (local {local_type}, global {full_type}) is not supported; "
                "supported: local default, global default or linear."
            )
        fields.update(
            attn_scores_soft_cap=None,  # transformers' Gemma 3 ignores attn_logit_softcapping; so do we
            qk_norm="head",
            rotary_base=full["rope_theta"],
            rotary_base_local=local["rope_theta"],
        )
        if full_type == "linear":
            inv_freq = rotary_inv_freq(hf.head_dim, full["rope_theta"]) / full["factor"]
            fields["rotary_inv_freq"] = inv_freq.tolist()
    return llama_like_config(hf, **fields)


def mixtral_config(hf: Any) -> Config:
    return llama_like_config(
        hf,
        num_experts=hf.num_local_experts,
        experts_per_token=hf.num_experts_per_tok,
        **attention_layers(hf, every_layer=True),
    )


def llama_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """Llama-style weights; also Gemma's (1 + w) norms and four norms per block, q/k norms,
    OLMo 2's post-only norms and Mixtral's experts, as `cfg` says."""
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    gemma = cfg.architecture.startswith("gemma")
    out = {"W_E": sd["embed_tokens.weight"], **norm_weights(sd, "norm", "ln_final", gemma)}
    out["W_U"] = sd.get("lm_head.weight", sd["embed_tokens.weight"]).T
    if gemma:  # Gemma scales embeddings by sqrt(d_model); our W_E and W_U are separate tensors
        out["W_E"] = out["W_E"] * torch.tensor(cfg.d_model**0.5, dtype=out["W_E"].dtype)
    # (ours, theirs) norm names per block
    if not cfg.pre_norm:  # OLMo 2
        norms = [("ln1_post", "post_attention_layernorm"), ("ln2_post", "post_feedforward_layernorm")]
    elif cfg.post_norm:  # Gemma 2 / 3
        norms = [
            ("ln1", "input_layernorm"),
            ("ln1_post", "post_attention_layernorm"),
            ("ln2", "pre_feedforward_layernorm"),
            ("ln2_post", "post_feedforward_layernorm"),
        ]
    else:
        norms = [("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")]
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        for ours, theirs in norms:
            out.update(norm_weights(sd, p + theirs, o + ours, gemma))
        out.update(attention_weights(sd, p + "self_attn.", o, cfg))
        if cfg.qk_norm != "none":
            out.update(qk_norm_weights(sd, p + "self_attn.", o, cfg, plus_one=gemma))
        if cfg.num_experts is None:
            out.update(gated_mlp_weights(sd, p + "mlp.", o, cfg))
            continue
        out[o + "mlp.W_router"] = sd[p + "mlp.gate.weight"].T
        gate, up = sd[p + "mlp.experts.gate_up_proj"].chunk(2, dim=1)  # [expert, d_mlp, d_model] each
        for e in range(cfg.num_experts):
            out[o + f"mlp.experts.{e}.W_gate"] = gate[e].T
            out[o + f"mlp.experts.{e}.W_in"] = up[e].T
            out[o + f"mlp.experts.{e}.W_out"] = sd[p + "mlp.experts.down_proj"][e].T
    return out


def granite_fold(out: dict[str, Tensor], hf: Any) -> dict[str, Tensor]:
    """Granite's multipliers folded into our weights: embeddings * embedding_multiplier,
    attention and MLP outputs * residual_multiplier, logits / logits_scaling."""
    out = dict(out)
    out["W_E"] = out["W_E"] * hf.embedding_multiplier
    out["W_U"] = out["W_U"] / hf.logits_scaling
    for key in out:
        if key.endswith(("attn.W_O", "attn.b_O", "mlp.W_out", "mlp.b_out")):
            out[key] = out[key] * hf.residual_multiplier
    return out


# --- Phi-3 (fused projections) --------------------------------------------------------------------


def phi3_config(hf: Any) -> Config:
    return llama_like_config(hf, partial_rotary_factor(hf), **attention_layers(hf, every_layer=True))


def phi3_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = dict(sd)
    q_size, kv_size = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        q, k, v = sd.pop(p + "self_attn.qkv_proj.weight").split([q_size, kv_size, kv_size])
        sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"] = q, k
        sd[p + "self_attn.v_proj.weight"] = v
        sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"] = sd.pop(
            p + "mlp.gate_up_proj.weight"
        ).chunk(2)
    return llama_weights(sd, cfg)


# --- StableLM and Phi (LayerNorm, partial rotary) -------------------------------------------------


def stablelm_config(hf: Any) -> Config:
    return llama_like_config(
        hf,
        partial_rotary_factor(hf),
        normalization="layernorm",
        norm_eps=hf.layer_norm_eps,
        qkv_bias=hf.use_qkv_bias,
        qk_norm="head" if hf.qk_layernorm else "none",
        parallel_residual=hf.use_parallel_residual,
    )


def stablelm_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    out = {
        "W_E": sd["embed_tokens.weight"],
        "W_U": sd["lm_head.weight"].T,
        **norm_weights(sd, "norm", "ln_final"),
    }
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out.update(norm_weights(sd, p + "input_layernorm", o + "ln1"))
        # Parallel StableLM feeds one norm to attention and MLP: ln2 gets a copy of its weights.
        ln2 = "input_layernorm" if cfg.parallel_residual else "post_attention_layernorm"
        out.update(norm_weights(sd, p + ln2, o + "ln2"))
        out.update(attention_weights(sd, p + "self_attn.", o, cfg))
        if cfg.qk_norm != "none":  # one LayerNorm (no bias) per head
            for ours, theirs, n in [
                ("q_ln", "q_layernorm", cfg.n_heads),
                ("k_ln", "k_layernorm", cfg.n_kv_heads),
            ]:
                w = torch.stack([sd[p + f"self_attn.{theirs}.norms.{h}.weight"] for h in range(n)])
                out[o + f"attn.{ours}.w"], out[o + f"attn.{ours}.b"] = w, torch.zeros_like(w)
        out.update(gated_mlp_weights(sd, p + "mlp.", o, cfg))
    return out


def phi_config(hf: Any) -> Config:
    return llama_like_config(
        hf,
        partial_rotary_factor(hf),
        normalization="layernorm",
        norm_eps=hf.layer_norm_eps,
        activation=hf_activation(hf.hidden_act),
        gated_mlp=False,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        unembed_bias=True,
        qk_norm="head" if hf.qk_layernorm else "none",
        parallel_residual=True,
    )


def phi_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    out = {"W_E": sd["embed_tokens.weight"], "W_U": sd["lm_head.weight"].T, "b_U": sd["lm_head.bias"]}
    out.update(norm_weights(sd, "final_layernorm", "ln_final"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out.update(norm_weights(sd, p + "input_layernorm", o + "ln1"))
        out.update(norm_weights(sd, p + "input_layernorm", o + "ln2"))  # one norm feeds attention and MLP
        out.update(attention_weights(sd, p + "self_attn.", o, cfg, "q_proj k_proj v_proj dense"))
        if cfg.qk_norm != "none":  # one LayerNorm over d_head, shared by all heads
            out.update(qk_norm_weights(sd, p + "self_attn.", o, cfg, "q_layernorm k_layernorm"))
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = sd[p + "mlp.fc1.weight"].T, sd[p + "mlp.fc1.bias"]
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = sd[p + "mlp.fc2.weight"].T, sd[p + "mlp.fc2.bias"]
    return out
