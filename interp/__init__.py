"""interp: a hookable transformer for mechanistic interpretability."""

from interp.cache import ActivationCache, act_name
from interp.config import Config
from interp.loading import DEFAULT_MODEL, OFFLINE_MODELS, from_hf, load_model
from interp.model import HookedTransformer, next_token_loss

__all__ = [
    "DEFAULT_MODEL",
    "OFFLINE_MODELS",
    "ActivationCache",
    "Config",
    "HookedTransformer",
    "act_name",
    "from_hf",
    "load_model",
    "next_token_loss",
]
