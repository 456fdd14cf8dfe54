"""TransformerLens's configuration entry point, as a leaf adapter over interp's `Config`.

TransformerLens users' code runs on interp after changing only the import
(`from interp import HookedTransformer, HookedTransformerConfig`). The model takes
TransformerLens's arguments natively (forward, run_with_cache, to_tokens, generate,
`HookedTransformer.from_pretrained`); `Config` has TransformerLens's field names as read-only
properties. What is left is TransformerLens's config class, kept here: `HookedTransformerConfig`
has TL's fields and defaults and builds interp's `Config` (`to_config`); `HookedTransformer(cfg)`
reads it through `model_settings`, the one public method the model calls (so that interp.model
never imports this module). Nothing in interp imports this module except the package's `__init__`.

Deliberate differences are listed, with reasons, in docs/migrating-from-transformer-lens.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

from interp.config import Config

# Hook settings TransformerLens keeps in its config; interp keeps them on the model, which turns on
# those a HookedTransformerConfig asks for when it is built from it.
HOOK_SETTINGS = (
    "use_attn_result",
    "use_split_qkv_input",
    "use_hook_mlp_in",
    "use_attn_in",
    "use_hook_tokens",
    "ungroup_grouped_query_attention",
)
_FROM_NORMALIZATION_TYPE = {
    "LN": "layernorm", "RMS": "rmsnorm", "LNPre": "layernorm", "RMSPre": "rmsnorm", None: "none"
}  # fmt: skip
_FROM_POSITIONAL_TYPE = {"standard": "learned", "rotary": "rotary", "shortformer": "shortformer"}
_ATTENTION_DIRS = ("causal", "bidirectional")
# TL's activations that are interp's under another name (the same function).
_ACTIVATION_ALIASES = {"gelu_pytorch_tanh": "gelu_new"}
# TL options interp has no equivalent for: accepted at their default, refused otherwise, with why.
_UNSUPPORTED = {
    "scale_attn_by_inverse_layer_idx": (False, "interp scales every layer's scores by attn_scale only"),
    "final_rms": (False, "interp's final norm is of the model's normalization_type"),
    "post_embedding_ln": (False, "interp has no norm after the embedding"),
    "tie_word_embeddings": (False, "interp's W_U is its own parameter"),
    "n_devices": (1, "interp spreads a model over devices with interp.load_model(device_map=...)"),
    "init_mode": ("gpt2", "interp initialises GPT-2 style only (model.init_weights)"),
    "load_in_4bit": (False, "interp does not quantise"),
    "use_NTK_by_parts_rope": (False, "interp reads scaled RoPE frequencies from transformers' configs"),
    "relative_attention_max_distance": (None, "interp has no relative attention (T5)"),
    "relative_attention_num_buckets": (None, "interp has no relative attention (T5)"),
    "from_checkpoint": (False, "interp loads one checkpoint: interp.load_model(path)"),
    "checkpoint_index": (None, "interp loads one checkpoint: interp.load_model(path)"),
    "checkpoint_label_type": (None, "interp loads one checkpoint: interp.load_model(path)"),
    "checkpoint_value": (None, "interp loads one checkpoint: interp.load_model(path)"),
    "trust_remote_code": (False, "interp runs no remote code"),
    "decoder_start_token_id": (None, "interp has decoder-only models"),
}


@dataclass
class HookedTransformerConfig:
    """TransformerLens's `HookedTransformerConfig`: its fields and defaults, checked when built
    (what interp cannot honour raises, saying why), e.g. ARENA's
    `HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=64, n_ctx=32, d_head=16,
    act_fn="relu", attn_only=True, d_vocab=100))`.

    `HookedTransformer(cfg)` builds interp's `Config` from it (`to_config`; `model.cfg` is that
    `Config`), turns on the hook settings it asks for (`use_attn_result=True`, ...), loads the
    tokenizer `tokenizer_name` names when no tokenizer is passed (and reads `d_vocab=-1` from it),
    and moves the model to `device` and `dtype`.
    """

    n_layers: int
    d_model: int
    n_ctx: int
    d_head: int
    model_name: str = "custom"
    n_heads: int = -1
    d_mlp: int | None = None
    act_fn: str | None = None
    d_vocab: int = -1
    eps: float = 1e-5
    use_attn_result: bool = False
    use_attn_scale: bool = True
    attn_scale: float = -1.0
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
    use_local_attn: bool = False
    ungroup_grouped_query_attention: bool = False
    original_architecture: str | None = None
    from_checkpoint: bool = False
    checkpoint_index: int | None = None
    checkpoint_label_type: str | None = None
    checkpoint_value: int | None = None
    tokenizer_name: str | None = None
    window_size: int | None = None
    attn_types: list | None = None
    init_mode: str = "gpt2"
    normalization_type: str | None = "LN"
    device: str | None = None
    n_devices: int = 1
    attention_dir: str = "causal"
    attn_only: bool = False
    seed: int | None = None
    initializer_range: float = -1.0
    init_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    positional_embedding_type: str = "standard"
    final_rms: bool = False
    d_vocab_out: int = -1
    parallel_attn_mlp: bool = False
    rotary_dim: int | None = None
    n_params: int | None = None
    use_hook_tokens: bool = False
    gated_mlp: bool = False
    default_prepend_bos: bool = True
    dtype: torch.dtype = torch.float32
    tokenizer_prepends_bos: bool | None = None
    n_key_value_heads: int | None = None
    post_embedding_ln: bool = False
    rotary_base: float = 10000
    trust_remote_code: bool = False
    rotary_adjacent_pairs: bool = False
    load_in_4bit: bool = False
    num_experts: int | None = None
    experts_per_token: int | None = None
    relative_attention_max_distance: int | None = None
    relative_attention_num_buckets: int | None = None
    decoder_start_token_id: int | None = None
    tie_word_embeddings: bool = False
    use_normalization_before_and_after: bool = False
    attn_scores_soft_cap: float = -1.0
    output_logits_soft_cap: float = -1.0
    use_NTK_by_parts_rope: bool = False  # noqa: N815  (TransformerLens's name)
    use_qk_norm: bool = False

    def __post_init__(self) -> None:
        for name, (default, why) in _UNSUPPORTED.items():
            if getattr(self, name) != default:
                raise ValueError(f"{name}={getattr(self, name)!r} is not supported: {why}.")
        if self.attention_dir not in _ATTENTION_DIRS:
            raise ValueError(f"attention_dir={self.attention_dir!r} is not one of {_ATTENTION_DIRS}.")
        if self.normalization_type not in _FROM_NORMALIZATION_TYPE:
            raise ValueError(
                f"normalization_type={self.normalization_type!r}: interp supports 'LN', 'LNPre', 'RMS', "
                "'RMSPre' and None (no norms)."
            )
        if self.positional_embedding_type not in _FROM_POSITIONAL_TYPE:
            raise ValueError(
                f"positional_embedding_type={self.positional_embedding_type!r}: interp supports "
                f"{sorted(_FROM_POSITIONAL_TYPE)} (no ALiBi or relative position biases)."
            )
        if self.act_fn is None and not self.attn_only:
            raise ValueError("act_fn must be specified for non-attn-only models (as in TransformerLens).")
        if self.n_heads == -1:
            if self.d_model % self.d_head:
                raise ValueError(f"d_model={self.d_model} is not a multiple of d_head={self.d_head}.")
            self.n_heads = self.d_model // self.d_head
        if self.d_mlp is None and not self.attn_only:
            self.d_mlp = 4 * self.d_model
        if self.initializer_range < 0:
            self.initializer_range = 0.8 / math.sqrt(self.d_model)  # TransformerLens's gpt2 init
        if self.d_vocab_out == -1:
            self.d_vocab_out = self.d_vocab
        if self.use_local_attn and (self.window_size is None or self.attn_types is None):
            raise ValueError("use_local_attn=True needs window_size and attn_types (as in TransformerLens).")
        if self.seed is not None:
            torch.manual_seed(self.seed)  # the model's initialisation, as TransformerLens seeds it
        if self.d_vocab > 0:
            config = self.to_config()  # checks the rest (sizes, activation) now, as TL does
            if self.n_params is None:
                self.n_params = config.n_params

    @classmethod
    def unwrap(cls, config: dict | HookedTransformerConfig) -> HookedTransformerConfig:
        """A config from a dict of TL's fields, or the config itself (TransformerLens's helper)."""
        return cls.from_dict(config) if isinstance(config, dict) else config

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any]) -> HookedTransformerConfig:
        return cls(**config_dict)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def is_layer_norm_activation(self) -> bool:
        """Whether the activation has a norm inside (TL's "solu_ln": SoLU, then a LayerNorm)."""
        return self.act_fn is not None and self.act_fn.endswith("_ln")

    def hook_settings(self) -> dict[str, bool]:
        """The hook settings this config asks for, to turn on on the model built from it."""
        return {name: bool(getattr(self, name)) for name in HOOK_SETTINGS}

    def to_config(self, d_vocab: int | None = None) -> Config:
        """interp's `Config` of this architecture (`d_vocab` when this config leaves it -1)."""
        d_vocab = self.d_vocab if self.d_vocab > 0 else d_vocab
        if d_vocab is None or d_vocab < 1:
            raise ValueError("d_vocab=-1 needs a tokenizer: pass one, or tokenizer_name=, or set d_vocab.")
        act_fn = "gelu_new" if self.act_fn is None else self.act_fn
        attn_scale = None if self.attn_scale <= 0 else self.attn_scale
        return Config(
            n_layers=self.n_layers,
            d_model=self.d_model,
            n_heads=self.n_heads,
            d_vocab=d_vocab,
            d_vocab_out=self.d_vocab_out if self.d_vocab_out > 0 else d_vocab,
            n_ctx=self.n_ctx,
            d_head=self.d_head,
            n_kv_heads=self.n_key_value_heads,
            d_mlp=self.d_mlp,
            attn_only=self.attn_only,
            normalization=_FROM_NORMALIZATION_TYPE[self.normalization_type],
            norm_folded=(self.normalization_type or "").endswith("Pre"),
            norm_eps=self.eps,
            positional=_FROM_POSITIONAL_TYPE[self.positional_embedding_type],
            rotary_dim=self.rotary_dim,
            rotary_base=float(self.rotary_base),
            rotary_adjacent_pairs=self.rotary_adjacent_pairs,
            activation=_ACTIVATION_ALIASES.get(act_fn, act_fn),
            gated_mlp=self.gated_mlp,
            parallel_residual=self.parallel_attn_mlp,
            default_prepend_bos=self.default_prepend_bos,
            architecture=self.original_architecture or "custom",
            model_name=self.model_name,
            init_std=self.initializer_range,
            attn_scale=attn_scale if self.use_attn_scale else 1.0,
            attn_scores_soft_cap=None if self.attn_scores_soft_cap <= 0 else self.attn_scores_soft_cap,
            output_logits_soft_cap=None if self.output_logits_soft_cap <= 0 else self.output_logits_soft_cap,
            qk_norm="head" if self.use_qk_norm else "none",
            causal=self.attention_dir == "causal",
            post_norm=self.use_normalization_before_and_after,
            attn_types=list(self.attn_types) if self.use_local_attn else None,
            window_size=self.window_size if self.use_local_attn else None,
            num_experts=self.num_experts,
            experts_per_token=self.experts_per_token,
            unembed_bias=True,  # TransformerLens's models always hold b_U
        )

    def model_settings(self, tokenizer: Any = None) -> dict[str, Any]:
        """What `HookedTransformer(cfg)` needs: the `Config`, the tokenizer (loaded from
        `tokenizer_name` when none is given, as TL does), the hook settings to turn on, device, dtype."""
        if tokenizer is None and self.tokenizer_name is not None:
            import transformers

            try:
                tokenizer = transformers.AutoTokenizer.from_pretrained(self.tokenizer_name)
            except OSError as error:
                raise ValueError(
                    f"tokenizer_name={self.tokenizer_name!r} could not be loaded "
                    f"({error.__class__.__name__}: offline, or no such tokenizer): pass tokenizer= (a "
                    "transformers tokenizer or a local directory's), or tokenizer_name=None for token ids."
                ) from error
        d_vocab = None if tokenizer is None else max(tokenizer.get_vocab().values()) + 1
        return {
            "config": self.to_config(d_vocab),
            "tokenizer": tokenizer,
            "hook_settings": self.hook_settings(),
            "device": self.device,
            "dtype": self.dtype,
        }
