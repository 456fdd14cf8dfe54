"""Shared pieces of the architecture specs: reading `transformers` configs (RoPE, activations,
per-layer attention kinds) and mapping their weights onto interp's layout (heads, attention, gated
MLPs, norms, q/k norms). See `interp.io.architectures`.
"""

from __future__ import annotations

from typing import Any

import einops
from torch import Tensor

from interp.config import Config
from interp.types import upcast


def rope_theta(hf: Any, default: float = 10000.0) -> float:
    params = getattr(hf, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(hf, "rope_theta", default)))


FIXED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
"""RoPE types whose frequencies are fixed up to max_position_embeddings (interp refuses longer inputs,
where dynamic scaling would change them), so the model's own inv_freq loads exactly; longrope's switch
at original_max_position_embeddings."""


def check_rope_type(hf: Any, supported: tuple[str, ...] = ("default", "llama3")) -> None:
    """Refuse a RoPE type outside `supported` (the architecture's tested ones)."""
    params = getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in supported:
        raise NotImplementedError(
            f"RoPE type {rope_type!r} is not supported yet (supported: {', '.join(supported)})."
        )


# --- shared helpers ------------------------------------------------------------------------------

ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "gelu_fast": "gelu_new",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}


def hf_activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise NotImplementedError(f"Activation {name!r} is not supported (supported: {sorted(ACTIVATIONS)}).")
    return ACTIVATIONS[name]


def attention_layers(hf: Any, every_layer: bool = False) -> dict[str, Any]:
    """attn_types and window_size for an architecture whose transformers code reads
    `sliding_window` (Llama, Gemma 1, OLMo 2, ... ignore it): local layers as `layer_types` says,
    or all of them (`every_layer`: Mistral, Mixtral and Phi-3 ignore `layer_types`)."""
    window = getattr(hf, "sliding_window", None)
    if not window:
        return {}
    kinds = {"full_attention": "global", "sliding_attention": "local"}
    layer_types = ["sliding_attention"] * hf.num_hidden_layers if every_layer else hf.layer_types
    unknown = set(layer_types) - set(kinds)
    if unknown:
        raise NotImplementedError(
            f"Layer types {sorted(unknown)} are not supported (supported: {list(kinds)})."
        )
    return {"attn_types": [kinds[t] for t in layer_types], "window_size": window}


def partial_rotary_factor(hf: Any) -> float:
    """The share of each head's dims that RoPE rotates (Phi, Phi-3, StableLM; Llama ignores it)."""
    params = getattr(hf, "rope_parameters", None) or {}
    return params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", 1.0))


def attention_biases(hf: Any) -> dict[str, bool]:
    """q/k/v/o biases as `attention_bias` says, for the architectures whose transformers code reads it."""
    return dict(qkv_bias=hf.attention_bias, attn_out_bias=hf.attention_bias)


def llama_like_config(hf: Any, rotary_fraction: float = 1.0, **fields: Any) -> Config:
    """Config of a Llama-style model (RMSNorm, RoPE on `rotary_fraction` of each head's dims,
    SwiGLU, no biases, no sliding window); `fields` override. Reads only the keys that every such
    architecture's transformers code reads: biases and windows are each spec's."""
    check_rope_type(hf)
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
        rotary_dim=int(d_head * rotary_fraction),
        rotary_base=rope_theta(hf),
        activation=hf_activation(getattr(hf, "hidden_act", "silu")),
        gated_mlp=True,
        qkv_bias=False,
        attn_out_bias=False,
        mlp_bias=False,
        default_prepend_bos=False,
        architecture=hf.model_type,
        bos_token_id=hf.bos_token_id,
    )
    return Config(**{**values, **fields})


def split_heads(W: Tensor, d_head: int) -> Tensor:
    """A transformers projection weight [(head d_head), d_model] -> ours [head, d_model, d_head]."""
    return einops.rearrange(W, "(h e) d -> h d e", e=d_head)


def attention_weights(
    sd: dict[str, Tensor], p: str, o: str, cfg: Config, names: str = "q_proj k_proj v_proj o_proj"
):
    """Separate q/k/v/o projections (nn.Linear) under prefix p into our block prefix o."""
    out = {}
    for name, proj in zip("QKV", names.split()[:3], strict=True):
        out[o + f"attn.W_{name}"] = split_heads(sd[p + f"{proj}.weight"], cfg.d_head)
        if cfg.qkv_bias:
            out[o + f"attn.b_{name}"] = einops.rearrange(sd[p + f"{proj}.bias"], "(h e) -> h e", e=cfg.d_head)
    o_proj = names.split()[3]
    out[o + "attn.W_O"] = einops.rearrange(sd[p + f"{o_proj}.weight"], "d (h e) -> h e d", e=cfg.d_head)
    if cfg.attn_out_bias:
        out[o + "attn.b_O"] = sd[p + f"{o_proj}.bias"]
    return out


def gated_mlp_weights(sd: dict[str, Tensor], p: str, o: str, cfg: Config) -> dict[str, Tensor]:
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


def norm_weights(sd: dict[str, Tensor], key: str, ours: str, plus_one: bool = False) -> dict[str, Tensor]:
    """A norm's weight (and bias if any); `plus_one` folds Gemma's x * (1 + w) into w, adding in
    float32 at least, as transformers does (a bfloat16 1 + w would round w to 2^-7)."""
    weight = sd[key + ".weight"]
    out = {ours + ".w": upcast(weight) + 1 if plus_one else weight}
    if key + ".bias" in sd:
        out[ours + ".b"] = sd[key + ".bias"]
    return out


def qk_norm_weights(
    sd: dict[str, Tensor], p: str, o: str, cfg: Config, names: str = "q_norm k_norm", plus_one: bool = False
) -> dict[str, Tensor]:
    """q/k norm weights ([d_head] shared by heads, or [(head d_head)]) as our [head, d_head]."""
    out = {}
    for ours, theirs, n in zip(["q_ln", "k_ln"], names.split(), [cfg.n_heads, cfg.n_kv_heads], strict=True):
        for key, value in norm_weights(sd, p + theirs, f"{o}attn.{ours}", plus_one).items():
            out[key] = value.reshape(-1, cfg.d_head).expand(n, cfg.d_head)
    return out
