"""Model configuration: one dataclass describes every architecture interp runs.

An architecture is a handful of choices (which norm, which positions, which MLP, parallel or
sequential residual), not a class of its own. `interp.architectures` maps `transformers` configs onto
these fields; models we train ourselves set them directly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from interp.transformer_lens_api import (
    _CONFIG_NAMES,
    _FROM_NORMALIZATION_TYPE,
    _FROM_POSITIONAL_TYPE,
    TransformerLensConfig,
)

Normalization = Literal["layernorm", "rmsnorm"]
Positional = Literal["learned", "rotary", "none"]
Activation = Literal["gelu", "gelu_new", "silu", "relu"]
QKNorm = Literal["none", "head", "all_heads"]
AttentionType = Literal["global", "local"]


@dataclass
class Config(TransformerLensConfig):
    """Shape and architecture of a decoder-only transformer.

    TransformerLens's names for these fields (`cfg.act_fn`, `cfg.normalization_type`, `cfg.device`,
    ...) are read-only views, see `interp.transformer_lens_api.TransformerLensConfig`.
    Sizes: `d_head` defaults to d_model // n_heads, `n_kv_heads` to n_heads (no grouped-query
    attention), `d_mlp` to 4 * d_model, `rotary_dim` to d_head (all dims rotated).

    Architecture quirks beyond the basics (each used in one place of `interp.model`):
    - attn_scale: attention scores are q.k / attn_scale (default sqrt(d_head); GPT-Neo 1,
      Gemma sqrt(query_pre_attn_scalar), Granite 1 / attention_multiplier).
    - attn_scores_soft_cap, output_logits_soft_cap: scores and logits pass through
      cap * tanh(x / cap) (Gemma 2).
    - qk_norm: a norm (of `normalization` type) on each query and key after projection, before
      rotary: "head" normalises each head's d_head dims (Qwen3, Gemma 3, StableLM, Phi), "all_heads"
      the whole projection (OLMo 2).
    - pre_norm / post_norm: norms on the input (ln1, ln2) and on the output (ln1_post, ln2_post)
      of attention and MLP; OLMo 2 has only post-norms, Gemma 2/3 both.
    - attn_types, window_size: per-layer "global" or "local"; a local layer's query at position i
      sees keys j with i - window_size < j <= i (GPT-Neo, Gemma 2/3, Mistral's sliding window).
    - rotary_base_local: RoPE base of local layers when it differs from rotary_base (Gemma 3).
    - nope_layers: layers whose attention uses no positions at all (SmolLM3).
    - rotary_adjacent_pairs: RoPE rotates dims (2i, 2i + 1) together (GPT-J), not (i, i + r/2).
    - num_experts, experts_per_token: a routed mixture of gated-MLP experts replaces the MLP
      (Mixtral): softmax over the router logits, the top experts_per_token renormalised.
    Quirks that fold exactly into weights (Gemma's (1 + w) norms and embedding scale, Granite's
    multipliers, OPT's projections and position offset, one norm shared by parallel attention
    and MLP) are applied when loading and need no field.
    """

    n_layers: int
    d_model: int
    n_heads: int
    d_vocab: int
    n_ctx: int
    d_head: int | None = None
    n_kv_heads: int | None = None
    d_mlp: int | None = None
    attn_only: bool = False
    normalization: Normalization = "layernorm"
    norm_eps: float = 1e-5
    positional: Positional = "learned"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_inv_freq: list[float] | None = None  # explicit frequencies (scaled RoPE, e.g. Llama 3)
    rotary_adjacent_pairs: bool = False  # rotate dims (2i, 2i+1) (GPT-J), not (i, i + rotary_dim/2)
    activation: Activation = "gelu_new"
    gated_mlp: bool = False
    parallel_residual: bool = False
    qkv_bias: bool = True
    attn_out_bias: bool = True
    mlp_bias: bool = True
    unembed_bias: bool = False
    default_prepend_bos: bool = True
    bos_token_id: int | None = None
    architecture: str = "custom"
    model_name: str = "custom"
    init_std: float = 0.02
    attn_scale: float | None = None
    attn_scores_soft_cap: float | None = None
    output_logits_soft_cap: float | None = None
    qk_norm: QKNorm = "none"
    pre_norm: bool = True
    post_norm: bool = False
    attn_types: list[AttentionType] | None = None
    window_size: int | None = None
    rotary_base_local: float | None = None
    nope_layers: list[int] = field(default_factory=list)
    num_experts: int | None = None
    experts_per_token: int | None = None
    # Opt-in hook points (they cost memory): per-head outputs and per-head attention inputs.
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False  # hook_mlp_in: the MLP's input before ln2
    use_attn_in: bool = False  # hook_attn_in: per-head attention input shared by q, k and v
    # Set by weight processing: norms whose weights were folded into the next layer.
    norm_folded: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {"n_layers": self.n_layers, "d_model": self.d_model, "n_heads": self.n_heads,
                 "d_vocab": self.d_vocab, "n_ctx": self.n_ctx}  # fmt: skip
        if any(value < 1 for value in sizes.values()):
            raise ValueError(f"model sizes must be >= 1, got {sizes}.")
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                    "pass d_head explicitly."
                )
            self.d_head = self.d_model // self.n_heads
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}.")
        if self.d_mlp is None:
            self.d_mlp = 4 * self.d_model
        if self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.positional == "rotary" and (self.rotary_dim % 2 or self.rotary_dim > self.d_head):
            raise ValueError(f"rotary_dim={self.rotary_dim} must be even and at most d_head.")
        if self.attn_scale is None:
            self.attn_scale = math.sqrt(self.d_head)
        if self.attn_types is None:
            self.attn_types = ["global"] * self.n_layers
        if len(self.attn_types) != self.n_layers:
            raise ValueError(f"attn_types has {len(self.attn_types)} entries for {self.n_layers} layers.")
        if "local" in self.attn_types and not self.window_size:
            raise ValueError("Local attention layers need window_size.")
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ValueError("Set both num_experts and experts_per_token (or neither).")
        if self.num_experts is not None and not self.gated_mlp:
            raise ValueError("Experts are gated MLPs: set gated_mlp=True.")
        for name, value, allowed in [
            ("normalization", self.normalization, Normalization.__args__),
            ("positional", self.positional, Positional.__args__),
            ("activation", self.activation, Activation.__args__),
            ("qk_norm", self.qk_norm, QKNorm.__args__),
        ]:
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}.")
        for kind in self.attn_types:
            if kind not in AttentionType.__args__:
                raise ValueError(f"attn_types entry {kind!r} is not one of {AttentionType.__args__}.")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"Unknown config fields {sorted(unknown)}; known: {sorted(known)}.")
        return cls(**values)


def HookedTransformerConfig(  # noqa: N802  (TransformerLens's class name, so that its code runs)
    act_fn: str = "gelu_new",
    normalization_type: str | None = "LN",
    positional_embedding_type: str = "standard",
    d_vocab_out: int = -1,
    seed: int | None = None,
    **kwargs: Any,
):
    """An interp `Config` from TransformerLens's `HookedTransformerConfig` arguments, e.g.
    `HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=64, n_ctx=32, d_head=16,
    act_fn="relu", attn_only=True, d_vocab=100))`. Arguments interp has no equivalent for raise.
    """
    unknown = sorted(set(kwargs) - set(_CONFIG_NAMES))
    if unknown:
        raise TypeError(
            f"interp's config has no equivalent of {unknown}; supported: {sorted(_CONFIG_NAMES)}."
        )
    if normalization_type not in _FROM_NORMALIZATION_TYPE:
        raise ValueError(f"normalization_type={normalization_type!r}: interp supports 'LN' and 'RMS'.")
    if positional_embedding_type not in _FROM_POSITIONAL_TYPE:
        raise ValueError(
            f"positional_embedding_type={positional_embedding_type!r}: interp supports 'standard', 'rotary'."
        )
    if d_vocab_out not in (-1, kwargs.get("d_vocab")):
        raise ValueError("interp's unembedding has d_vocab outputs; d_vocab_out must equal d_vocab.")
    if "d_head" in kwargs and "n_heads" not in kwargs:
        kwargs["n_heads"] = kwargs["d_model"] // kwargs["d_head"]
    if seed is not None:
        torch.manual_seed(seed)  # the model's initialisation, as TransformerLens seeds it
    fields = {_CONFIG_NAMES[name]: value for name, value in kwargs.items()}
    return Config(
        activation=act_fn,
        normalization=_FROM_NORMALIZATION_TYPE[normalization_type],
        positional=_FROM_POSITIONAL_TYPE[positional_embedding_type],
        **fields,
    )
