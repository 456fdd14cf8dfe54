"""Architecture specs: how a `transformers` model maps onto `Config` and our weight layout.

Each spec is two small functions: `config(hf_config) -> Config` and
`weights(hf_state_dict, cfg) -> our state dict`. Adding an architecture means adding a spec here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import einops
import torch
from torch import Tensor

from interp.config import Config
from interp.model import rotary_inv_freq


@dataclass(frozen=True)
class ArchitectureSpec:
    config: Callable[[Any], Config]
    weights: Callable[[dict[str, Tensor], Config], dict[str, Tensor]]


def _rope_theta(hf: Any, default: float = 10000.0) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf, "rope_theta", default)))


def _check_rope_type(hf: Any) -> None:
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "llama3"):
        raise NotImplementedError(
            f"RoPE type {rope_type!r} is not supported yet (supported: default, llama3)."
        )


# --- GPT-2 --------------------------------------------------------------------------------------


def _gpt2_config(hf: Any) -> Config:
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
        activation={"gelu_new": "gelu_new", "gelu": "gelu", "relu": "relu"}[hf.activation_function],
        architecture="gpt2",
        bos_token_id=hf.bos_token_id,
    )


def _gpt2_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
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


def _neox_config(hf: Any) -> Config:
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
        rotary_base=_rope_theta(hf),
        activation={"gelu": "gelu", "gelu_new": "gelu_new", "relu": "relu"}[hf.hidden_act],
        parallel_residual=hf.use_parallel_residual,
        qkv_bias=getattr(hf, "attention_bias", True),
        attn_out_bias=getattr(hf, "attention_bias", True),
        architecture="gpt_neox",
        bos_token_id=hf.bos_token_id,
    )


def _neox_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
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


# --- Llama family (Llama, Mistral, Qwen2, SmolLM2) ----------------------------------------------


def _llama_config(hf: Any) -> Config:
    _check_rope_type(hf)
    if getattr(hf, "use_sliding_window", False):
        raise NotImplementedError("Sliding-window attention is not supported.")
    n_heads = hf.num_attention_heads
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // n_heads
    qwen = hf.model_type == "qwen2"
    return Config(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=n_heads,
        d_head=d_head,
        n_kv_heads=getattr(hf, "num_key_value_heads", None) or n_heads,
        d_vocab=hf.vocab_size,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size,
        normalization="rmsnorm",
        norm_eps=hf.rms_norm_eps,
        positional="rotary",
        rotary_base=_rope_theta(hf),
        activation={"silu": "silu", "gelu": "gelu", "relu": "relu"}[hf.hidden_act],
        gated_mlp=True,
        qkv_bias=qwen or getattr(hf, "attention_bias", False),
        attn_out_bias=getattr(hf, "attention_bias", False),
        mlp_bias=getattr(hf, "mlp_bias", False),
        default_prepend_bos=False,
        architecture=hf.model_type,
        bos_token_id=hf.bos_token_id,
    )


def _llama_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    out = {"W_E": sd["embed_tokens.weight"], "ln_final.w": sd["norm.weight"]}
    out["W_U"] = sd.get("lm_head.weight", sd["embed_tokens.weight"]).T
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out[o + "ln1.w"] = sd[p + "input_layernorm.weight"]
        out[o + "ln2.w"] = sd[p + "post_attention_layernorm.weight"]
        for name, proj in zip("QKV", ["q_proj", "k_proj", "v_proj"], strict=True):
            out[o + f"attn.W_{name}"] = einops.rearrange(
                sd[p + f"self_attn.{proj}.weight"], "(h e) d -> h d e", e=cfg.d_head
            )
            if cfg.qkv_bias:
                out[o + f"attn.b_{name}"] = einops.rearrange(
                    sd[p + f"self_attn.{proj}.bias"], "(h e) -> h e", e=cfg.d_head
                )
        out[o + "attn.W_O"] = einops.rearrange(
            sd[p + "self_attn.o_proj.weight"], "d (h e) -> h e d", e=cfg.d_head
        )
        if cfg.attn_out_bias:
            out[o + "attn.b_O"] = sd[p + "self_attn.o_proj.bias"]
        out[o + "mlp.W_gate"] = sd[p + "mlp.gate_proj.weight"].T
        out[o + "mlp.W_in"] = sd[p + "mlp.up_proj.weight"].T
        out[o + "mlp.W_out"] = sd[p + "mlp.down_proj.weight"].T
        if cfg.mlp_bias:
            out[o + "mlp.b_in"] = sd[p + "mlp.up_proj.bias"]
            out[o + "mlp.b_gate"] = sd[p + "mlp.gate_proj.bias"]
            out[o + "mlp.b_out"] = sd[p + "mlp.down_proj.bias"]
    return out


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "gpt2": ArchitectureSpec(_gpt2_config, _gpt2_weights),
    "gpt_neox": ArchitectureSpec(_neox_config, _neox_weights),
    "llama": ArchitectureSpec(_llama_config, _llama_weights),
    "mistral": ArchitectureSpec(_llama_config, _llama_weights),
    "qwen2": ArchitectureSpec(_llama_config, _llama_weights),
}


def rotary_inv_freq_from_hf(hf_model: Any) -> Tensor | None:
    """The model's own rotary inverse frequencies (covers scaled RoPE such as Llama 3's)."""
    for module in hf_model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, Tensor):
            if getattr(module, "attention_scaling", 1.0) != 1.0:
                raise NotImplementedError("RoPE with attention scaling is not supported.")
            return inv_freq.detach().float().clone()
    return None


def convert_hf_model(hf_model: Any) -> tuple[Config, dict[str, Tensor]]:
    """(Config, state dict) of a `transformers` causal LM, for `HookedTransformer.load_state_dict`."""
    model_type = hf_model.config.model_type
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"Architecture {model_type!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}."
        )
    spec = ARCHITECTURES[model_type]
    cfg = spec.config(hf_model.config)
    cfg.model_name = getattr(hf_model.config, "name_or_path", "") or model_type
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    weights = {k: v.contiguous() for k, v in spec.weights(state, cfg).items()}
    if cfg.positional == "rotary":
        inv_freq = rotary_inv_freq_from_hf(hf_model)
        if inv_freq is not None and not torch.allclose(
            inv_freq, rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base)
        ):
            cfg.rotary_inv_freq = inv_freq.tolist()
    return cfg, {k: v.to(torch.float32) if v.is_floating_point() else v for k, v in weights.items()}
