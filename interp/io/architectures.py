"""Architecture specs: how a `transformers` model maps onto `Config` and our weight layout.

Each spec is two small functions: `config(hf_config) -> Config` and
`weights(hf_state_dict, cfg) -> our state dict` (plus, rarely, `fold` for constants that fold into
weights). Adding an architecture means adding a spec here and a config to tests/test_equivalence.py.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import einops
import torch
from torch import Tensor

from interp.config import Config, rotary_inv_freq


@dataclass(frozen=True)
class ArchitectureSpec:
    """config: transformers config -> Config. weights: (transformers state dict, Config) -> our
    state dict. fold: (our state dict, transformers config) -> our state dict with constants of the
    transformers config folded in exactly (Granite's multipliers); None for most."""

    config: Callable[[Any], Config]
    weights: Callable[[dict[str, Tensor], Config], dict[str, Tensor]]
    fold: Callable[[dict[str, Tensor], Any], dict[str, Tensor]] | None = None


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


# --- shared helpers ------------------------------------------------------------------------------

_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "gelu_fast": "gelu_new",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}


def _activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise NotImplementedError(
            f"Activation {name!r} is not supported (supported: {sorted(_ACTIVATIONS)})."
        )
    return _ACTIVATIONS[name]


def _attention_layers(hf: Any) -> dict[str, Any]:
    """attn_types and window_size from `layer_types` / `sliding_window` (no layer_types: every
    layer slides when a window is set, as Mistral and Mixtral)."""
    window = getattr(hf, "sliding_window", None)
    if not window:
        return {}
    kinds = {"full_attention": "global", "sliding_attention": "local"}
    layer_types = getattr(hf, "layer_types", None) or ["sliding_attention"] * hf.num_hidden_layers
    unknown = set(layer_types) - set(kinds)
    if unknown:
        raise NotImplementedError(
            f"Layer types {sorted(unknown)} are not supported (supported: {list(kinds)})."
        )
    return {"attn_types": [kinds[t] for t in layer_types], "window_size": window}


def _rotary_fraction(hf: Any) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    return params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))


def _llama_like_config(hf: Any, **fields: Any) -> Config:
    """Config of a Llama-style model (RMSNorm, rotary, SwiGLU, no biases); `fields` override."""
    _check_rope_type(hf)
    n_heads = hf.num_attention_heads
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // n_heads
    values = dict(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=n_heads,
        d_head=d_head,
        n_kv_heads=getattr(hf, "num_key_value_heads", None) or n_heads,
        d_vocab=hf.vocab_size,
        n_ctx=hf.max_position_embeddings,
        d_mlp=hf.intermediate_size,
        normalization="rmsnorm",
        norm_eps=getattr(hf, "rms_norm_eps", None) or getattr(hf, "layer_norm_eps", 1e-6),
        positional="rotary",
        rotary_dim=int(d_head * _rotary_fraction(hf)),
        rotary_base=_rope_theta(hf),
        activation=_activation(getattr(hf, "hidden_act", "silu")),
        gated_mlp=True,
        qkv_bias=getattr(hf, "attention_bias", False),
        attn_out_bias=getattr(hf, "attention_bias", False),
        mlp_bias=getattr(hf, "mlp_bias", False),
        default_prepend_bos=False,
        architecture=hf.model_type,
        bos_token_id=hf.bos_token_id,
        **_attention_layers(hf),
    )
    return Config(**{**values, **fields})


def _heads(W: Tensor, d_head: int) -> Tensor:
    """A transformers projection weight [(head d_head), d_model] -> ours [head, d_model, d_head]."""
    return einops.rearrange(W, "(h e) d -> h d e", e=d_head)


def _attention(
    sd: dict[str, Tensor], p: str, o: str, cfg: Config, names: str = "q_proj k_proj v_proj o_proj"
):
    """Separate q/k/v/o projections (nn.Linear) under prefix p into our block prefix o."""
    out = {}
    for name, proj in zip("QKV", names.split()[:3], strict=True):
        out[o + f"attn.W_{name}"] = _heads(sd[p + f"{proj}.weight"], cfg.d_head)
        if cfg.qkv_bias:
            out[o + f"attn.b_{name}"] = einops.rearrange(sd[p + f"{proj}.bias"], "(h e) -> h e", e=cfg.d_head)
    o_proj = names.split()[3]
    out[o + "attn.W_O"] = einops.rearrange(sd[p + f"{o_proj}.weight"], "d (h e) -> h e d", e=cfg.d_head)
    if cfg.attn_out_bias:
        out[o + "attn.b_O"] = sd[p + f"{o_proj}.bias"]
    return out


def _gated_mlp(sd: dict[str, Tensor], p: str, o: str, cfg: Config) -> dict[str, Tensor]:
    out = {
        o + "mlp.W_gate": sd[p + "gate_proj.weight"].T,
        o + "mlp.W_in": sd[p + "up_proj.weight"].T,
        o + "mlp.W_out": sd[p + "down_proj.weight"].T,
    }
    if cfg.mlp_bias:
        out[o + "mlp.b_gate"] = sd[p + "gate_proj.bias"]
        out[o + "mlp.b_in"] = sd[p + "up_proj.bias"]
        out[o + "mlp.b_out"] = sd[p + "down_proj.bias"]
    return out


def _norm(sd: dict[str, Tensor], key: str, ours: str, plus_one: bool = False) -> dict[str, Tensor]:
    """A norm's weight (and bias if any); `plus_one` folds Gemma's x * (1 + w) into w."""
    out = {ours + ".w": sd[key + ".weight"] + 1 if plus_one else sd[key + ".weight"]}
    if key + ".bias" in sd:
        out[ours + ".b"] = sd[key + ".bias"]
    return out


def _qk_norms(
    sd: dict[str, Tensor], p: str, o: str, cfg: Config, names: str = "q_norm k_norm", plus_one: bool = False
) -> dict[str, Tensor]:
    """q/k norm weights ([d_head] shared by heads, or [(head d_head)]) as our [head, d_head]."""
    out = {}
    for ours, theirs, n in zip(["q_ln", "k_ln"], names.split(), [cfg.n_heads, cfg.n_kv_heads], strict=True):
        for key, value in _norm(sd, p + theirs, f"{o}attn.{ours}", plus_one).items():
            out[key] = value.reshape(-1, cfg.d_head).expand(n, cfg.d_head)
    return out


# --- Llama family (Llama, Mistral, Qwen2, Qwen3, SmolLM3, Granite, OLMo 2, Gemma 1-3, Mixtral) -------


def _llama_config(hf: Any) -> Config:
    return _llama_like_config(hf)


def _qwen2_config(hf: Any) -> Config:
    return _llama_like_config(hf, qkv_bias=True)


def _qwen3_config(hf: Any) -> Config:
    return _llama_like_config(hf, qk_norm="head")


def _smollm3_config(hf: Any) -> Config:
    uses_rope = hf.no_rope_layers  # 1: the layer uses RoPE, 0: no positions (NoPE)
    return _llama_like_config(hf, nope_layers=[i for i, rope in enumerate(uses_rope) if not rope])


def _olmo2_config(hf: Any) -> Config:
    return _llama_like_config(hf, qk_norm="all_heads", pre_norm=False, post_norm=True)


def _granite_config(hf: Any) -> Config:
    # embedding_multiplier, residual_multiplier and logits_scaling fold into weights (_granite_weights).
    return _llama_like_config(hf, attn_scale=1 / hf.attention_multiplier)


def _gemma_config(hf: Any) -> Config:
    if getattr(hf, "use_bidirectional_attention", False):
        raise NotImplementedError("Bidirectional attention (EmbeddingGemma) is not supported.")
    activation = getattr(hf, "hidden_activation", None) or hf.hidden_act
    fields: dict[str, Any] = dict(activation=_activation(activation), default_prepend_bos=True)
    if hf.model_type in ("gemma2", "gemma3_text"):
        fields.update(
            attn_scale=math.sqrt(hf.query_pre_attn_scalar),
            attn_scores_soft_cap=hf.attn_logit_softcapping,
            output_logits_soft_cap=hf.final_logit_softcapping,
            post_norm=True,
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
    return _llama_like_config(hf, **fields)


def _mixtral_config(hf: Any) -> Config:
    return _llama_like_config(hf, num_experts=hf.num_local_experts, experts_per_token=hf.num_experts_per_tok)


def _llama_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """Llama-style weights; also Gemma's (1 + w) norms and four norms per block, q/k norms,
    OLMo 2's post-only norms and Mixtral's experts, as `cfg` says."""
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    gemma = cfg.architecture.startswith("gemma")
    out = {"W_E": sd["embed_tokens.weight"], **_norm(sd, "norm", "ln_final", gemma)}
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
            out.update(_norm(sd, p + theirs, o + ours, gemma))
        out.update(_attention(sd, p + "self_attn.", o, cfg))
        if cfg.qk_norm != "none":
            out.update(_qk_norms(sd, p + "self_attn.", o, cfg, plus_one=gemma))
        if cfg.num_experts is None:
            out.update(_gated_mlp(sd, p + "mlp.", o, cfg))
            continue
        out[o + "mlp.W_router"] = sd[p + "mlp.gate.weight"].T
        gate, up = sd[p + "mlp.experts.gate_up_proj"].chunk(2, dim=1)  # [expert, d_mlp, d_model] each
        for e in range(cfg.num_experts):
            out[o + f"mlp.experts.{e}.W_gate"] = gate[e].T
            out[o + f"mlp.experts.{e}.W_in"] = up[e].T
            out[o + f"mlp.experts.{e}.W_out"] = sd[p + "mlp.experts.down_proj"][e].T
    return out


def _granite_fold(out: dict[str, Tensor], hf: Any) -> dict[str, Tensor]:
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


def _phi3_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
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
    return _llama_weights(sd, cfg)


# --- StableLM and Phi (LayerNorm, partial rotary) -------------------------------------------------


def _stablelm_config(hf: Any) -> Config:
    return _llama_like_config(
        hf,
        normalization="layernorm",
        norm_eps=hf.layer_norm_eps,
        qkv_bias=hf.use_qkv_bias,
        qk_norm="head" if hf.qk_layernorm else "none",
        parallel_residual=hf.use_parallel_residual,
    )


def _stablelm_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    out = {"W_E": sd["embed_tokens.weight"], "W_U": sd["lm_head.weight"].T, **_norm(sd, "norm", "ln_final")}
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out.update(_norm(sd, p + "input_layernorm", o + "ln1"))
        # Parallel StableLM feeds one norm to attention and MLP: ln2 gets a copy of its weights.
        ln2 = "input_layernorm" if cfg.parallel_residual else "post_attention_layernorm"
        out.update(_norm(sd, p + ln2, o + "ln2"))
        out.update(_attention(sd, p + "self_attn.", o, cfg))
        if cfg.qk_norm != "none":  # one LayerNorm (no bias) per head
            for ours, theirs, n in [
                ("q_ln", "q_layernorm", cfg.n_heads),
                ("k_ln", "k_layernorm", cfg.n_kv_heads),
            ]:
                w = torch.stack([sd[p + f"self_attn.{theirs}.norms.{h}.weight"] for h in range(n)])
                out[o + f"attn.{ours}.w"], out[o + f"attn.{ours}.b"] = w, torch.zeros_like(w)
        out.update(_gated_mlp(sd, p + "mlp.", o, cfg))
    return out


def _phi_config(hf: Any) -> Config:
    return _llama_like_config(
        hf,
        normalization="layernorm",
        norm_eps=hf.layer_norm_eps,
        activation=_activation(hf.hidden_act),
        gated_mlp=False,
        qkv_bias=True,
        attn_out_bias=True,
        mlp_bias=True,
        unembed_bias=True,
        qk_norm="head" if hf.qk_layernorm else "none",
        parallel_residual=True,
    )


def _phi_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("model."): v for k, v in sd.items()}
    out = {"W_E": sd["embed_tokens.weight"], "W_U": sd["lm_head.weight"].T, "b_U": sd["lm_head.bias"]}
    out.update(_norm(sd, "final_layernorm", "ln_final"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out.update(_norm(sd, p + "input_layernorm", o + "ln1"))
        out.update(_norm(sd, p + "input_layernorm", o + "ln2"))  # one norm feeds attention and MLP
        out.update(_attention(sd, p + "self_attn.", o, cfg, "q_proj k_proj v_proj dense"))
        if cfg.qk_norm != "none":  # one LayerNorm over d_head, shared by all heads
            out.update(_qk_norms(sd, p + "self_attn.", o, cfg, "q_layernorm k_layernorm"))
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = sd[p + "mlp.fc1.weight"].T, sd[p + "mlp.fc1.bias"]
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = sd[p + "mlp.fc2.weight"].T, sd[p + "mlp.fc2.bias"]
    return out


# --- GPT-J (rotary on adjacent pairs) and GPT-Neo (local attention) -------------------------------------


def _gptj_config(hf: Any) -> Config:
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
        activation=_activation(hf.activation_function),
        parallel_residual=True,
        qkv_bias=False,
        attn_out_bias=False,
        unembed_bias=True,
        architecture="gptj",
        bos_token_id=hf.bos_token_id,
    )


def _gptj_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"W_E": sd["wte.weight"], "W_U": sd["lm_head.weight"].T, "b_U": sd["lm_head.bias"]}
    out.update(_norm(sd, "ln_f", "ln_final"))
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        out.update(_norm(sd, p + "ln_1", o + "ln1"))
        out.update(_norm(sd, p + "ln_1", o + "ln2"))  # one norm feeds attention and MLP
        out.update(_attention(sd, p + "attn.", o, cfg, "q_proj k_proj v_proj out_proj"))
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = sd[p + "mlp.fc_in.weight"].T, sd[p + "mlp.fc_in.bias"]
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = sd[p + "mlp.fc_out.weight"].T, sd[p + "mlp.fc_out.bias"]
    return out


def _gpt_neo_config(hf: Any) -> Config:
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
        activation=_activation(hf.activation_function),
        qkv_bias=False,
        attn_scale=1.0,  # GPT-Neo does not scale attention scores
        attn_types=list(hf.attention_layers),
        window_size=hf.window_size,
        architecture="gpt_neo",
        bos_token_id=hf.bos_token_id,
    )


def _gpt_neo_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"W_E": sd["wte.weight"], "W_pos": sd["wpe.weight"], **_norm(sd, "ln_f", "ln_final")}
    out["W_U"] = sd.get("lm_head.weight", sd["wte.weight"]).T
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        out.update(_norm(sd, p + "ln_1", o + "ln1"))
        out.update(_norm(sd, p + "ln_2", o + "ln2"))
        out.update(_attention(sd, p + "attn.attention.", o, cfg, "q_proj k_proj v_proj out_proj"))
        out[o + "mlp.W_in"], out[o + "mlp.b_in"] = sd[p + "mlp.c_fc.weight"].T, sd[p + "mlp.c_fc.bias"]
        out[o + "mlp.W_out"], out[o + "mlp.b_out"] = sd[p + "mlp.c_proj.weight"].T, sd[p + "mlp.c_proj.bias"]
    return out


# --- OPT (learned positions with an offset, projections around the embedding) ---------------------

_OPT_POSITION_OFFSET = 2  # OPT's position embedding table starts at row 2


def _opt_config(hf: Any) -> Config:
    if not hf.do_layer_norm_before or getattr(hf, "_remove_final_layer_norm", False):
        raise NotImplementedError(
            "OPT with post-LayerNorm blocks (do_layer_norm_before=False, as OPT-350m) is not supported."
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
        activation=_activation(hf.activation_function),
        qkv_bias=hf.enable_bias,
        attn_out_bias=hf.enable_bias,
        mlp_bias=hf.enable_bias,
        architecture="opt",
        bos_token_id=hf.bos_token_id,
    )


def _opt_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    """project_in (word_embed_proj_dim -> d_model) folds into W_E and project_out into W_U."""
    sd = {k.removeprefix("model.decoder."): v for k, v in sd.items()}
    W_E, W_U = sd["embed_tokens.weight"], sd.get("lm_head.weight", sd["embed_tokens.weight"]).T
    if "project_in.weight" in sd:
        W_E = W_E @ sd["project_in.weight"].T
    if "project_out.weight" in sd:
        W_U = sd["project_out.weight"].T @ W_U
    out = {"W_E": W_E, "W_U": W_U, "W_pos": sd["embed_positions.weight"][_OPT_POSITION_OFFSET:]}
    out.update(_norm(sd, "final_layer_norm", "ln_final"))
    for i in range(cfg.n_layers):
        p, o = f"layers.{i}.", f"blocks.{i}."
        out.update(_norm(sd, p + "self_attn_layer_norm", o + "ln1"))
        out.update(_norm(sd, p + "final_layer_norm", o + "ln2"))
        out.update(_attention(sd, p + "self_attn.", o, cfg, "q_proj k_proj v_proj out_proj"))
        out[o + "mlp.W_in"], out[o + "mlp.W_out"] = sd[p + "fc1.weight"].T, sd[p + "fc2.weight"].T
        if cfg.mlp_bias:
            out[o + "mlp.b_in"], out[o + "mlp.b_out"] = sd[p + "fc1.bias"], sd[p + "fc2.bias"]
    return out


# --- Falcon (multi-query, parallel and new-decoder variants) --------------------------------------


def _falcon_config(hf: Any) -> Config:
    if hf.alibi:
        raise NotImplementedError("Falcon with ALiBi positions (falcon-rw) is not supported.")
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
        rotary_base=_rope_theta(hf),
        activation=_activation(hf.activation),
        parallel_residual=new or hf.parallel_attn,
        qkv_bias=hf.bias,
        attn_out_bias=hf.bias,
        mlp_bias=hf.bias,
        architecture="falcon",
        bos_token_id=hf.bos_token_id,
    )


def _falcon_weights(sd: dict[str, Tensor], cfg: Config) -> dict[str, Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"W_E": sd["word_embeddings.weight"], **_norm(sd, "ln_f", "ln_final")}
    out["W_U"] = sd.get("lm_head.weight", sd["word_embeddings.weight"]).T
    h, kv, e = cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    for i in range(cfg.n_layers):
        p, o = f"h.{i}.", f"blocks.{i}."
        if "ln_attn.weight" in {k.removeprefix(p) for k in sd if k.startswith(p)}:
            out.update(_norm(sd, p + "ln_attn", o + "ln1"))
            out.update(_norm(sd, p + "ln_mlp", o + "ln2"))
        else:  # one norm, or (sequential) a second one after attention
            out.update(_norm(sd, p + "input_layernorm", o + "ln1"))
            ln2 = "input_layernorm" if cfg.parallel_residual else "post_attention_layernorm"
            out.update(_norm(sd, p + ln2, o + "ln2"))
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


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "falcon": ArchitectureSpec(_falcon_config, _falcon_weights),
    "gemma": ArchitectureSpec(_gemma_config, _llama_weights),
    "gemma2": ArchitectureSpec(_gemma_config, _llama_weights),
    "gemma3_text": ArchitectureSpec(_gemma_config, _llama_weights),
    "gpt2": ArchitectureSpec(_gpt2_config, _gpt2_weights),
    "gpt_neo": ArchitectureSpec(_gpt_neo_config, _gpt_neo_weights),
    "gpt_neox": ArchitectureSpec(_neox_config, _neox_weights),
    "gptj": ArchitectureSpec(_gptj_config, _gptj_weights),
    "granite": ArchitectureSpec(_granite_config, _llama_weights, _granite_fold),
    "llama": ArchitectureSpec(_llama_config, _llama_weights),
    "mistral": ArchitectureSpec(_llama_config, _llama_weights),
    "mixtral": ArchitectureSpec(_mixtral_config, _llama_weights),
    "olmo2": ArchitectureSpec(_olmo2_config, _llama_weights),
    "opt": ArchitectureSpec(_opt_config, _opt_weights),
    "phi": ArchitectureSpec(_phi_config, _phi_weights),
    "phi3": ArchitectureSpec(_llama_config, _phi3_weights),
    "qwen2": ArchitectureSpec(_qwen2_config, _llama_weights),
    "qwen3": ArchitectureSpec(_qwen3_config, _llama_weights),
    "smollm3": ArchitectureSpec(_smollm3_config, _llama_weights),
    "stablelm": ArchitectureSpec(_stablelm_config, _stablelm_weights),
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
        closest = difflib.get_close_matches(model_type, ARCHITECTURES, n=1, cutoff=0.0)
        raise ValueError(
            f"Architecture {model_type!r} is not supported (closest: {closest[0]!r}). Supported: "
            f"{', '.join(sorted(ARCHITECTURES))}. Adding one takes a spec in interp/architectures.py."
        )
    spec = ARCHITECTURES[model_type]
    cfg = spec.config(hf_model.config)
    cfg.model_name = getattr(hf_model.config, "name_or_path", "") or model_type
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    weights = spec.weights(state, cfg)
    if spec.fold is not None:
        weights = spec.fold(weights, hf_model.config)
    if cfg.positional == "rotary" and cfg.rotary_inv_freq is None:
        inv_freq = rotary_inv_freq_from_hf(hf_model)
        if inv_freq is not None and not torch.allclose(
            inv_freq, rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base)
        ):
            cfg.rotary_inv_freq = inv_freq.tolist()
    return cfg, {k: v.to(torch.float32).contiguous() for k, v in weights.items()}
