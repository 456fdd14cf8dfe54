"""interp: a hookable transformer for mechanistic interpretability."""

import interp.memory  # noqa: F401  (keeps freed memory for reuse; see interp/memory.py)
from interp.cache import ActivationCache, act_name
from interp.config import Config
from interp.devices import default_device
from interp.loading import DEFAULT_MODEL, OFFLINE_MODELS, from_hf, load_model
from interp.model import HookedTransformer, next_token_loss

__all__ = [
    "DEFAULT_MODEL",
    "OFFLINE_MODELS",
    "ActivationCache",
    "Config",
    "HookedTransformer",
    "act_name",
    "default_device",
    "from_hf",
    "load_model",
    "next_token_loss",
]
