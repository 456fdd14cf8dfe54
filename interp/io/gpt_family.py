"""Architecture specs of GPT-2, GPT-NeoX (Pythia), GPT-J, GPT-Neo, OPT and Falcon."""

from __future__ import annotations

from typing import Any

import einops
from torch import Tensor

from interp.config import Config
from interp.io.hf_layout import (
    FIXED_ROPE_TYPES,
    attention_weights,
    check_rope_type,
    hf_activation,
    norm_weights,
    rope_theta,
)

# --- GPT-2 --------------------------------------------------------------------------------------


def gpt2_config(hf: Any) -> Config:
    if hf.scale_attn_by_inverse_layer_idx:
        raise NotImplementedError(
            "GPT-2 with scale_attn_by_inverse_layer_idx=True (scores / (layer + 1)) is not supported: "
            "interp scales every layer's scores alike; load a checkpoint without it."
        )
    return Config(
        n_layers=hf.n_layer,
        d_model=hf.n_embd,
        n_heads=hf.n_head,
        d_vocab=hf.vocab_size,
        n_ctx=hf.n_positions,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        normalization="layernorm",
        norm_eps=hf.layer_norm_epsilon,
        positional="learned",
        activation=hf_activation(hf.activation_function),
        attn_scale=None if hf.scale_attn_weights else 1.0,  # None: sqrt(d_head)
        architecture="gpt2",
        bos_token_id=hf.bos_token_id,
    )


def gpt2_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"W_E": sd["wte.weight"], "W_pos": sd["wpe.weight"]}
    out["W_U"] = sd.get("lm_head.weight", sd["wte.weight"]).T
    out["ln_final.w"], out["ln_final.b"] = sd["ln_f.weight"], sd["ln_f.bias"]
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        out[o + "ln1.w"], out[o + "ln1.b"] = sd[p + "ln_1.weight"], sd[p + "ln_1.bias"]
        out[o + "ln2.w"], out[o + "ln2.b"] = sd[p + "ln_2.weight"], sd[p + "ln_2.bias"]
        W = sd[p + "attn.c_attn.weight"]  # Conv1D: [d_model, 3 * d_model]
        b = sd[p + "attn.c_attn.bias"]
        for name, W_part, b_part in zip("QKV", W.chunk(3, dim=1), b.chunk(3), strict=True):
            out[o + f"attn.W_{name}"] = einops.rearrange(W_part, "d (h e) -> h d e", h=cfg.n_heads)
            out[o + f"attn.b_{name}"] = einops.rearrange(b_part, "(h e) -> h e", h=cfg.n_heads)
        out[o + "attn.W_O"] = einops.rearrange(
            sd[p + "attn.c_proj.weight"], "(h e) d -> h e d", h=cfg.n_heads
        )
        out[o + "attn.b_O"] = sd[p + "attn.c_proj.bias"]
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"]
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"]
    return out


# --- GPT-NeoX / Pythia --------------------------------------------------------------------------


def neox_config(hf: Any) -> Config:
    check_rope_type(hf, FIXED_ROPE_TYPES)
    d_head = hf.hidden_size // hf.num_attention_heads
    params = getattr(hf, "rope_parameters", None) or {}
    rotary_fraction = params.get("partial_rotary_factor", getattr(hf, "rotary_pct", 1.0))
    return Config(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads,
        d_vocab=hf.vocab_size,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size,
        normalization="layernorm",
        norm_eps=hf.layer_norm_eps,
        positional="rotary",
        rotary_dim=int(d_head * rotary_fraction),
        rotary_base=rope_theta(hf),
        activation=hf_activation(hf.hidden_act),
        parallel_residual=hf.use_parallel_residual,
        qkv_bias=getattr(hf, "attention_bias", True),
        attn_out_bias=getattr(hf, "attention_bias", True),
        architecture="gpt_neox",
        bos_token_id=hf.bos_token_id,
    )


def neox_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("gpt_neox."): v for k, v in sd.items()}
    h = cfg.n_heads
    unembed = sd.get("lm_head.weight", sd.get("embed_out.weight", sd["embed_in.weight"]))
    out = {"W_E": sd["embed_in.weight"], "W_U": unembed.T}
    out["ln_final.w"], out["ln_final.b"] = sd["final_layer_norm.weight"], sd["final_layer_norm.bias"]
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out[o + "ln1.w"], out[o + "ln1.b"] = sd[p + "input_layernorm.weight"], sd[p + "input_layernorm.bias"]
        out[o + "ln2.w"] = sd[p + "post_attention_layernorm.weight"]
        out[o + "ln2.b"] = sd[p + "post_attention_layernorm.bias"]
        # query_key_value rows are laid out per head as [q | k | v], each d_head wide.
        W = einops.rearrange(
            sd[p + "attention.query_key_value.weight"], "(h three e) d -> three h d e", h=h, three=3
        )
        for j, name in enumerate("QKV"):
            out[o + f"attn.W_{name}"] = W[j]
        if cfg.qkv_bias:
            b = einops.rearrange(
                sd[p + "attention.query_key_value.bias"], "(h three e) -> three h e", h=h, three=3
            )
            for j, name in enumerate("QKV"):
                out[o + f"attn.b_{name}"] = b[j]
        out[o + "attn.W_O"] = einops.rearrange(sd[p + "attention.dense.weight"], "d (h e) -> h e d", h=h)
        if cfg.attn_out_bias:
            out[o + "attn.b_O"] = sd[p + "attention.dense.bias"]
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = (
            sd[p + "mlp.dense_h_to_4h.weight"].T,
            sd[p + "mlp.dense_h_to_4h.bias"],
        )
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = (
            sd[p + "mlp.dense_4h_to_h.weight"].T,
            sd[p + "mlp.dense_4h_to_h.bias"],
        )
    return out


# --- GPT-J (rotary on adjacent pairs) and GPT-Neo (local attention) -------------------------------------


def gptj_config(hf: Any) -> Config:
    return Config(
        n_layers=hf.n_layer,
        d_model=hf.n_embd,
        n_heads=hf.n_head,
        d_vocab=hf.vocab_size,
        n_ctx=hf.n_positions,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        normalization="layernorm",
        norm_eps=hf.layer_norm_epsilon,
        positional="rotary",
        rotary_dim=hf.rotary_dim or hf.n_embd // hf.n_head,
        rotary_adjacent_pairs=True,
        activation=hf_activation(hf.activation_function),
        parallel_residual=True,
        qkv_bias=False,
        attn_out_bias=False,
        unembed_bias=True,
        architecture="gptj",
        bos_token_id=hf.bos_token_id,
    )


def gptj_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"W_E": sd["wte.weight"], "W_U": sd["lm_head.weight"].T, "b_U": sd["lm_head.bias"]}
    out.update(norm_weights(sd, "ln_f", "ln_final"))
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        out.update(norm_weights(sd, p + "ln_1", o + "ln1"))
        out.update(norm_weights(sd, p + "ln_1", o + "ln2"))  # one norm feeds attention and MLP
        out.update(attention_weights(sd, p + "attn.", o, cfg, "q_proj k_proj v_proj out_proj"))
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = sd[p + "mlp.fc_in.weight"].T, sd[p + "mlp.fc_in.bias"]
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = sd[p + "mlp.fc_out.weight"].T, sd[p + "mlp.fc_out.bias"]
    return out


def gpt_neo_config(hf: Any) -> Config:
    return Config(
        n_layers=hf.num_layers,
        d_model=hf.hidden_size,
        n_heads=hf.num_heads,
        d_vocab=hf.vocab_size,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size or 4 * hf.hidden_size,
        normalization="layernorm",
        norm_eps=hf.layer_norm_epsilon,
        positional="learned",
        activation=hf_activation(hf.activation_function),
        qkv_bias=False,
        attn_scale=1.0,  # GPT-Neo does not scale attention scores
        attn_types=list(hf.attention_layers),
        window_size=hf.window_size,
        architecture="gpt_neo",
        bos_token_id=hf.bos_token_id,
    )


def gpt_neo_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"W_E": sd["wte.weight"], "W_pos": sd["wpe.weight"], **norm_weights(sd, "ln_f", "ln_final")}
    out["W_U"] = sd.get("lm_head.weight", sd["wte.weight"]).T
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        out.update(norm_weights(sd, p + "ln_1", o + "ln1"))
        out.update(norm_weights(sd, p + "ln_2", o + "ln2"))
        out.update(attention_weights(sd, p + "attn.attention.", o, cfg, "q_proj k_proj v_proj out_proj"))
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = sd[p + "mlp.c_fc.weight"].T, sd[p + "mlp.c_fc.bias"]
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = sd[p + "mlp.c_proj.weight"].T, sd[p + "mlp.c_proj.bias"]
    return out


# --- OPT (learned positions with an offset, projections around the embedding) ---------------------

OPT_POSITION_OFFSET = 2  # OPT's position embedding table starts at row 2


def opt_config(hf: Any) -> Config:
    if not hf.do_layer_norm_before or getattr(hf, "_remove_final_layer_norm", False):
        raise NotImplementedError(
            "OPT with post-LayerNorm blocks (do_layer_norm_before=False, as OPT-350m) is not supported."
        )
    if not hf.layer_norm_elementwise_affine:
        raise NotImplementedError(
            "OPT with weightless LayerNorms (layer_norm_elementwise_affine=False) is not supported; "
            "load a checkpoint whose LayerNorms have weights and biases."
        )
    return Config(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads,
        d_vocab=hf.vocab_size,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.ffn_dim,
        normalization="layernorm",
        positional="learned",
        activation=hf_activation(hf.activation_function),
        qkv_bias=hf.enable_bias,
        attn_out_bias=hf.enable_bias,
        mlp_bias=hf.enable_bias,
        architecture="opt",
        bos_token_id=hf.bos_token_id,
    )


def opt_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """project_in (word_embed_proj_dim -> d_model) folds into W_E and project_out into W_U."""
    sd = {k.removeprefix("model.decoder."): v for k, v in sd.items()}
    W_E, W_U = sd["embed_tokens.weight"], sd.get("lm_head.weight", sd["embed_tokens.weight"]).T
    if "project_in.weight" in sd:
        W_E = W_E @ sd["project_in.weight"].T
    if "project_out.weight" in sd:
        W_U = sd["project_out.weight"].T @ W_U
    out = {"W_E": W_E, "W_U": W_U, "W_pos": sd["embed_positions.weight"][OPT_POSITION_OFFSET:]}
    out.update(norm_weights(sd, "final_layer_norm", "ln_final"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out.update(norm_weights(sd, p + "self_attn_layer_norm", o + "ln1"))
        out.update(norm_weights(sd, p + "final_layer_norm", o + "ln2"))
        out.update(attention_weights(sd, p + "self_attn.", o, cfg, "q_proj k_proj v_proj out_proj"))
        out[o + "mlp.W_in"], out[o + "mlp.W_out"] = sd[p + "fc1.weight"].T, sd[p + "fc2.weight"].T
        if cfg.mlp_bias:
            out[o + "mlp.b_in"], out[o + "mlp.b_out"] = sd[p + "fc1.bias"], sd[p + "fc2.bias"]
    return out


# --- Falcon (multi-query, parallel and new-decoder variants) --------------------------------------


def falcon_config(hf: Any) -> Config:
    if hf.alibi:
        raise NotImplementedError("Falcon with ALiBi positions (falcon-rw) is not supported.")
    check_rope_type(hf, FIXED_ROPE_TYPES)
    new = hf.new_decoder_architecture
    n_kv_heads = hf.num_kv_heads if new else 1 if hf.multi_query else hf.num_attention_heads
    return Config(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads,
        n_kv_heads=n_kv_heads,
        d_vocab=hf.vocab_size,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.ffn_hidden_size,
        normalization="layernorm",
        norm_eps=hf.layer_norm_epsilon,
        positional="rotary",
        rotary_base=rope_theta(hf),
        activation=hf_activation(hf.activation),
        parallel_residual=new or hf.parallel_attn,
        qkv_bias=hf.bias,
        attn_out_bias=hf.bias,
        mlp_bias=hf.bias,
        architecture="falcon",
        bos_token_id=hf.bos_token_id,
    )


def falcon_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"W_E": sd["word_embeddings.weight"], **norm_weights(sd, "ln_f", "ln_final")}
    out["W_U"] = sd.get("lm_head.weight", sd["word_embeddings.weight"]).T
    h, kv, e = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        if "ln_attn.weight" in {k.removeprefix(p) for k in sd if k.startswith(p)}:
            out.update(norm_weights(sd, p + "ln_attn", o + "ln1"))
            out.update(norm_weights(sd, p + "ln_mlp", o + "ln2"))
        else:  # one norm, or (sequential) a second one after attention
            out.update(norm_weights(sd, p + "input_layernorm", o + "ln1"))
            ln2 = "input_layernorm" if cfg.parallel_residual else "post_attention_layernorm"
            out.update(norm_weights(sd, p + ln2, o + "ln2"))
        # query_key_value rows, per key/value group: [q * (h / kv), k, v]. This covers all three
        # layouts: new decoder (kv groups), multi-query (kv = 1: [all q, k, v]), and neither
        # (kv = h: per head [q, k, v]).
        fused = [sd[p + "self_attention.query_key_value.weight"]]
        if cfg.qkv_bias:
            fused.append(sd[p + "self_attention.query_key_value.bias"])
        for j, tensor in enumerate(fused):
            grouped = tensor.unflatten(0, (kv, h // kv + 2, e))
            q, k, v = grouped[:, :-2].flatten(0, 1), grouped[:, -2], grouped[:, -1]
            for name, part in zip("QKV", (q, k, v), strict=True):  # part: [head, d_head(, d_model)]
                if j == 0:
                    out[o + f"attn.W_{name}"] = part.transpose(1, 2)
                else:
                    out[o + f"attn.b_{name}"] = part
        out[o + "attn.W_O"] = einops.rearrange(sd[p + "self_attention.dense.weight"], "d (h e) -> h e d", e=e)
        out[o + "mlp.W_in"], out[o + "mlp.W_out"] = (
            sd[p + "mlp.dense_h_to_4h.weight"].T,
            sd[p + "mlp.dense_4h_to_h.weight"].T,
        )
        if cfg.qkv_bias:
            out[o + "attn.b_O"] = sd[p + "self_attention.dense.bias"]
            out[o + "mlp.b_in"], out[o + "mlp.b_out"] = (
                sd[p + "mlp.dense_h_to_4h.bias"],
                sd[p + "mlp.dense_4h_to_h.bias"],
            )
    return out
