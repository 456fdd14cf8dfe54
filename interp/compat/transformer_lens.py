"""TransformerLens's configuration entry point, as a leaf adapter over interp's `Config`.

TransformerLens users' code runs on interp after changing only the import
(`from interp import HookedTransformer, HookedTransformerConfig`). The model takes
TransformerLens's arguments natively (forward, run_with_cache, to_tokens, generate,
`HookedTransformer.from_pretrained`); `Config` has TransformerLens's field names as read-only
properties. What is left is TransformerLens's constructor arguments, mapped here. Nothing in interp
imports this module except the package's `__init__`.

Deliberate differences are listed, with reasons, in docs/migrating-from-transformer-lens.md.
"""

from __future__ import annotations

from typing import Any

import torch

from interp.config import Config

# TransformerLens's HookedTransformerConfig arguments -> interp's Config fields (same meaning).
CONFIG_NAMES = {
    "n_layers": "n_layers", "d_model": "d_model", "n_ctx": "n_ctx", "d_head": "d_head",
    "n_heads": "n_heads", "d_mlp": "d_mlp", "d_vocab": "d_vocab", "attn_only": "attn_only",
    "n_key_value_heads": "n_kv_heads", "gated_mlp": "gated_mlp", "rotary_dim": "rotary_dim",
    "rotary_base": "rotary_base", "eps": "norm_eps", "parallel_attn_mlp": "parallel_residual",
    "default_prepend_bos": "default_prepend_bos", "model_name": "model_name",
    "initializer_range": "init_std",
}  # fmt: skip
# Hook settings TransformerLens keeps in its config; interp keeps them on the model.
HOOK_SETTINGS = ("use_attn_result", "use_split_qkv_input", "use_hook_mlp_in", "use_attn_in")
_FROM_NORMALIZATION_TYPE = {"LN": "layernorm", "RMS": "rmsnorm"}
_FROM_POSITIONAL_TYPE = {"standard": "learned", "rotary": "rotary"}


def HookedTransformerConfig(  # noqa: N802  (TransformerLens's class name, so that its code runs)
    act_fn: str = "gelu_new",
    normalization_type: str | None = "LN",
    positional_embedding_type: str = "standard",
    d_vocab_out: int = -1,
    seed: int | None = None,
    **kwargs: Any,
) -> Config:
    """An interp `Config` from TransformerLens's `HookedTransformerConfig` arguments, e.g.
    `HookedTransformer(HookedTransformerConfig(n_layers=2, d_model=64, n_ctx=32, d_head=16,
    act_fn="relu", attn_only=True, d_vocab=100))`. Arguments interp has no equivalent for raise;
    hook settings (`use_attn_result`, ...) are the model's: `model.set_use_attn_result(True)`.
    """
    settings = sorted(set(kwargs) & set(HOOK_SETTINGS))
    if settings:
        raise TypeError(
            f"{settings} are hook settings of the model in interp, not of its config: build the model, "
            f"then call model.set_{settings[0]}(True) (or `with model.settings({settings[0]}=True):`)."
        )
    unknown = sorted(set(kwargs) - set(CONFIG_NAMES))
    if unknown:
        raise TypeError(f"interp's config has no equivalent of {unknown}; supported: {sorted(CONFIG_NAMES)}.")
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
    fields = {CONFIG_NAMES[name]: value for name, value in kwargs.items()}
    return Config(
        activation=act_fn,
        normalization=_FROM_NORMALIZATION_TYPE[normalization_type],
        positional=_FROM_POSITIONAL_TYPE[positional_embedding_type],
        **fields,
    )
