"""Model configuration: one dataclass describes every architecture interp runs.

An architecture is a handful of choices (which norm, which positions, which MLP, parallel or
sequential residual), not a class of its own. `interp.io.architectures` maps `transformers` configs onto
these fields; models we train ourselves set them directly.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

Normalization = Literal["layernorm", "rmsnorm", "none"]
Positional = Literal["learned", "rotary", "none", "shortformer"]
Activation = Literal["gelu", "gelu_new", "silu", "relu", "solu_ln"]  # solu_ln: SoLU then a LayerNorm
QKNorm = Literal["none", "head", "all_heads"]
AttentionType = Literal["global", "local"]


@dataclass
class Config:
    """Shape and architecture of a decoder-only transformer.

    A Config describes a checkpoint; it never reads the model. TransformerLens's names for these
    fields (`cfg.act_fn`, `cfg.normalization_type`, ...) are read-only properties below.
    `device` and `dtype` say where the model's weights are: the model keeps them current when it
    moves (`model.to(...)`); they are not saved with a checkpoint.
    Sizes: `d_vocab_out` (the logits' vocabulary) defaults to d_vocab, `d_head` to d_model // n_heads,
    `n_kv_heads` to n_heads (no grouped-query attention), `d_mlp` to 4 * d_model, `rotary_dim` to
    d_head (all dims rotated).

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
    - positional "shortformer" (Press et al. 2021, TransformerLens's name): learned positions W_pos
      added to every attention layer's query and key inputs (after ln1), not to its value input
      and not to the residual stream.
    - causal: False for bidirectional attention (encoders, compiled RASP programs; TransformerLens's
      attention_dir="bidirectional"): every query sees every key, pads included.
    - nope_layers: layers whose attention uses no positions at all (SmolLM3; rotary models).
    - rotary_adjacent_pairs: RoPE rotates dims (2i, 2i + 1) together (GPT-J), not (i, i + r/2).
    - num_experts, experts_per_token: a routed mixture of gated-MLP experts replaces the MLP
      (Mixtral): softmax over the router logits, the top experts_per_token renormalised.
    - tied_embeddings: the checkpoint's unembedding is its embedding matrix (W_U = W_E^T, up to
      Gemma's embedding scale), one matrix that `parameter_count` counts once; interp keeps W_U a
      parameter of its own.
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
    d_vocab_out: int | None = None  # the logits' vocabulary, when it is not the input's (toy tasks)
    n_kv_heads: int | None = None
    d_mlp: int | None = None
    attn_only: bool = False
    normalization: Normalization = "layernorm"
    norm_eps: float = 1e-5
    positional: Positional = "learned"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_inv_freq: list[float] | None = None  # explicit (scaled RoPE: Llama 3); rotary_base unused
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
    source: str | None = None  # the file the weights were read from when that says more (a GGUF's name)
    task: str | None = None  # the synthetic task a toy checkpoint was trained on; None for pretrained models
    hops: int | None = None  # the hop task's number of induction lookups (task "hop"); None otherwise
    init_std: float = 0.02
    attn_scale: float | None = None
    attn_scores_soft_cap: float | None = None
    output_logits_soft_cap: float | None = None
    qk_norm: QKNorm = "none"
    causal: bool = True
    pre_norm: bool = True
    post_norm: bool = False
    attn_types: list[AttentionType] | None = None
    window_size: int | None = None
    rotary_base_local: float | None = None
    nope_layers: list[int] = field(default_factory=list)
    num_experts: int | None = None
    experts_per_token: int | None = None
    tied_embeddings: bool = False  # the source's unembedding is its embedding: one matrix (see above)
    # Set by weight processing: norms whose weights were folded into the next layer.
    norm_folded: bool = False
    # Where the weights are (kept current by the model; not saved with a checkpoint).
    device: str = field(default="cpu", compare=False)
    dtype: torch.dtype = field(default=torch.float32, compare=False)

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
        if self.d_vocab_out is None:
            self.d_vocab_out = self.d_vocab
        if self.d_vocab_out < 1:
            raise ValueError(f"d_vocab_out must be >= 1, got {self.d_vocab_out}.")
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
        if self.rotary_inv_freq is not None and len(self.rotary_inv_freq) != self.rotary_dim // 2:
            raise ValueError(
                f"rotary_inv_freq lists {len(self.rotary_inv_freq)} frequencies, but rotary_dim="
                f"{self.rotary_dim} rotates {self.rotary_dim // 2} pairs: edit both, or remove "
                "rotary_inv_freq."
            )
        if self.attn_scale is None:
            self.attn_scale = math.sqrt(self.d_head)
        if self.attn_types is None:
            self.attn_types = ["global"] * self.n_layers
        if len(self.attn_types) != self.n_layers:
            raise ValueError(f"attn_types has {len(self.attn_types)} entries for {self.n_layers} layers.")
        if "local" in self.attn_types and not self.window_size:
            raise ValueError("Local attention layers need window_size.")
        if "local" in self.attn_types and not self.causal:
            raise ValueError(
                "Local (sliding-window) layers look back window_size tokens; with bidirectional attention "
                "(causal=False) the window is undefined: use global layers."
            )
        if self.nope_layers and self.positional != "rotary":
            raise ValueError(
                f"nope_layers turn off rotary positions in some layers; this model's positions are "
                f"{self.positional!r}: leave nope_layers empty."
            )
        if (self.num_experts is None) != (self.experts_per_token is None):
            raise ValueError("Set both num_experts and experts_per_token (or neither).")
        if self.activation == "solu_ln" and (self.gated_mlp or self.normalization != "layernorm"):
            raise ValueError(
                "SoLU (activation='solu_ln') is a plain MLP with a LayerNorm: no gated_mlp, no RMSNorm."
            )
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

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOOK_SETTINGS:  # TransformerLens code sets them here: switch the owning model's
            settings = self.__dict__.get("_hook_settings")
            if settings is None:
                raise AttributeError(
                    f"{name} is a setting of a model's hook points, and no model owns this Config: build "
                    f"the model, then model.set_{name}({value!r}) (or set model.cfg.{name})."
                )
            settings.switch(self.group_size, **{name: value})
            return
        if name not in _FIELD_NAMES:
            raise AttributeError(f"Config has no field {name!r}; fields: {sorted(_FIELD_NAMES)}.")
        if name in _RUNTIME_FIELDS and name in self.__dict__:
            raise AttributeError(
                f"cfg.{name} follows the model's weights: move the model instead (model.to(...))."
            )
        super().__setattr__(name, value)

    @property
    def group_size(self) -> int:
        """Query heads per key/value head (1 without grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    @property
    def learned_positions(self) -> bool:
        """Whether the model holds a position embedding W_pos (learned or shortformer positions)."""
        return self.positional in ("learned", "shortformer")

    def to_dict(self) -> dict[str, Any]:
        """The fields that describe the checkpoint (not where it is loaded: device, dtype)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in _RUNTIME_FIELDS}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        values = {k: v for k, v in values.items() if k not in _LEGACY_FIELDS}
        known = _FIELD_NAMES - _RUNTIME_FIELDS
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"Unknown config fields {sorted(unknown)}; known: {sorted(known)}.")
        return cls(**values)

    # --- TransformerLens's names for these fields (read-only) -----------------------------------

    # TransformerLens's hook switches: those of the model that owns this Config (`model.hook_settings`);
    # setting one switches the model's (as model.set_use_attn_result(...)); False for a Config no model owns.
    @property
    def use_attn_result(self) -> bool:
        return self._hook_setting("use_attn_result")

    @property
    def use_split_qkv_input(self) -> bool:
        return self._hook_setting("use_split_qkv_input")

    @property
    def use_hook_mlp_in(self) -> bool:
        return self._hook_setting("use_hook_mlp_in")

    @property
    def use_attn_in(self) -> bool:
        return self._hook_setting("use_attn_in")

    @property
    def use_hook_tokens(self) -> bool:
        return self._hook_setting("use_hook_tokens")

    @property
    def ungroup_grouped_query_attention(self) -> bool:
        return self._hook_setting("ungroup_grouped_query_attention")

    def _hook_setting(self, name: str) -> bool:
        return bool(getattr(self.__dict__.get("_hook_settings"), name, False))

    @property
    def act_fn(self) -> str:
        return self.activation

    @property
    def normalization_type(self) -> Literal["LN", "LNPre", "RMS", "RMSPre"] | None:
        """ "LN"/"RMS", with "Pre" once fold_ln has moved the norm's weights into the next layer;
        None without norms."""
        if self.normalization == "none":
            return None
        return _NORMALIZATION_TYPES[self.normalization] + ("Pre" if self.norm_folded else "")

    @property
    def positional_embedding_type(self) -> str:
        return _POSITIONAL_TYPES[self.positional]

    @property
    def attention_dir(self) -> Literal["causal", "bidirectional"]:
        return "causal" if self.causal else "bidirectional"

    @property
    def n_key_value_heads(self) -> int | None:
        """None without grouped-query attention, as in TransformerLens."""
        return None if self.n_kv_heads == self.n_heads else self.n_kv_heads

    @property
    def eps(self) -> float:
        return self.norm_eps

    @property
    def parallel_attn_mlp(self) -> bool:
        return self.parallel_residual

    @property
    def original_architecture(self) -> str:
        return self.architecture

    @property
    def tokenizer_name(self) -> str:
        return self.model_name

    @property
    def use_attn_scale(self) -> bool:
        return True

    @property
    def final_rms(self) -> bool:
        """Whether the final norm is an RMSNorm (TransformerLens's Llama-family configs: True)."""
        return self.normalization == "rmsnorm"

    @property
    def n_params(self) -> int:
        """Weights in attention and MLP matrices (TransformerLens's count: no embeddings, norms or biases)."""
        attn = self.n_layers * (2 * self.n_heads + 2 * self.n_kv_heads) * self.d_model * self.d_head
        n_mlp_matrices = 0 if self.attn_only else 3 if self.gated_mlp else 2
        mlp = self.n_layers * n_mlp_matrices * self.d_model * self.d_mlp
        return attn + mlp


def attach_hook_settings(cfg: Config, settings: Any) -> None:
    """Let `cfg.use_attn_result` etc. read the hook settings of the model that owns `cfg`."""
    object.__setattr__(cfg, "_hook_settings", settings)


def place(cfg: Config, device: torch.device | str, dtype: torch.dtype) -> None:
    """Record where the model that owns `cfg` holds its weights (the model calls this when it moves)."""
    object.__setattr__(cfg, "device", str(device))
    object.__setattr__(cfg, "dtype", dtype)


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Config))
_RUNTIME_FIELDS = frozenset({"device", "dtype"})
# Fields that checkpoints written before hook settings moved to the model may hold: not read.
_LEGACY_FIELDS = frozenset(
    {"use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in", "extra"}
)
_HOOK_SETTINGS = frozenset(
    {"use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in", "use_hook_tokens",
     "ungroup_grouped_query_attention"}
)  # fmt: skip
_NORMALIZATION_TYPES = {"layernorm": "LN", "rmsnorm": "RMS"}
_POSITIONAL_TYPES = {"learned": "standard", "rotary": "rotary", "none": "none", "shortformer": "shortformer"}


def rotary_inv_freq(rotary_dim: int, base: float) -> Float[Tensor, " rotary_dim_half"]:
    """Inverse frequencies of rotary position embeddings (Su et al. 2021), one per dim pair."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim
    return 1.0 / (base**exponents)
