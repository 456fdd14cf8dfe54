"""Model configuration: one dataclass describes every architecture interp runs.

An architecture is a handful of choices (which norm, which positions, which MLP, parallel or
sequential residual), not a class of its own. `interp.architectures` maps `transformers` configs onto
these fields; models we train ourselves set them directly.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from interp.transformer_lens_api import TransformerLensConfig

Normalization = Literal["layernorm", "rmsnorm"]
Positional = Literal["learned", "rotary", "none"]
Activation = Literal["gelu", "gelu_new", "silu", "relu"]


@dataclass
class Config(TransformerLensConfig):
    """Shape and architecture of a decoder-only transformer.

    TransformerLens's names for these fields (`cfg.act_fn`, `cfg.normalization_type`, `cfg.device`,
    ...) are read-only views, see `interp.transformer_lens_api.TransformerLensConfig`.
    Sizes: `d_head` defaults to d_model // n_heads, `n_kv_heads` to n_heads (no grouped-query
    attention), `d_mlp` to 4 * d_model, `rotary_dim` to d_head (all dims rotated).
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
    # Opt-in hook points (they cost memory): per-head outputs and per-head attention inputs.
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False  # hook_mlp_in: the MLP's input before ln2
    use_attn_in: bool = False  # hook_attn_in: per-head attention input shared by q, k and v
    # Set by weight processing: norms whose weights were folded into the next layer.
    norm_folded: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
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
        for name, value, allowed in [
            ("normalization", self.normalization, Normalization.__args__),
            ("positional", self.positional, Positional.__args__),
            ("activation", self.activation, Activation.__args__),
        ]:
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {allowed}.")

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
