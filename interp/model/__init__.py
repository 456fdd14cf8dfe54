"""The model layer: components, the hookable transformer, its cache, weight processing, loading."""

from interp.model.cache import ActivationCache, act_name
from interp.model.components import MLP, Attention, Block, MixtureOfExperts, Norm
from interp.model.hooks import HookSettings
from interp.model.kv_cache import HookedTransformerKeyValueCache, HookedTransformerKeyValueCacheEntry
from interp.model.loading import (
    FINGERPRINT_SCHEME,
    dispatch,
    from_hf,
    load_checkpoint,
    load_gguf,
    load_model,
    parameter_count,
    provenance,
    ungrouped,
    weights_fingerprint,
)
from interp.model.transformer import HookedTransformer, next_token_loss
from interp.model.weights import process_weights

__all__ = [
    "MLP", "ActivationCache", "Attention", "Block", "HookSettings", "HookedTransformer",
    "HookedTransformerKeyValueCache", "HookedTransformerKeyValueCacheEntry", "MixtureOfExperts",
    "Norm", "act_name", "dispatch", "from_hf", "load_checkpoint", "load_gguf", "load_model",
    "parameter_count", "provenance", "ungrouped",
    "next_token_loss", "process_weights", "weights_fingerprint", "FINGERPRINT_SCHEME",
]  # fmt: skip
