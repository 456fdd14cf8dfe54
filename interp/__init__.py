"""interp: a hookable transformer for mechanistic interpretability."""

import interp.memory  # noqa: F401  (keeps freed memory for reuse; see interp/memory.py)
from interp.cache import ActivationCache, act_name
from interp.config import Config, HookedTransformerConfig
from interp.devices import default_device
from interp.loading import DEFAULT_MODEL, OFFLINE_MODELS, from_hf, load_model
from interp.metrics import next_token_loss
from interp.model import HookedTransformer

__all__ = [
    "DEFAULT_MODEL",
    "OFFLINE_MODELS",
    "ActivationCache",
    "Config",
    "HookedTransformer",
    "HookedTransformerConfig",
    "act_name",
    "default_device",
    "from_hf",
    "load_model",
    "next_token_loss",
]
