"""interp: a hookable transformer for mechanistic interpretability.

Layers, each importing only from those before it (see ARCHITECTURE.md): config, types -> io ->
model -> interventions -> edges -> tasks -> training, viz, runtime, compat.
Importing interp changes nothing in the process (no allocator policy, no output); the
`interventions` modules are reachable as `interp.metrics`, `interp.patching`, `interp.ablation`.
"""

import importlib

from interp.compat.transformer_lens import HookedTransformerConfig
from interp.config import Config
from interp.io.devices import default_device
from interp.io.sources import DEFAULT_MODEL, OFFLINE_MODELS
from interp.model import (
    ActivationCache,
    HookedTransformer,
    HookedTransformerKeyValueCache,
    HookedTransformerKeyValueCacheEntry,
    act_name,
    from_hf,
    load_model,
    next_token_loss,
)

_INTERVENTIONS = ("metrics", "patching", "path_patching", "ablation", "engine", "results", "stats")


def __getattr__(name: str):
    """`interp.interventions.metrics` etc.: the modules of interp.interventions, imported on first use."""
    if name in _INTERVENTIONS:
        return importlib.import_module(f"interp.interventions.{name}")
    raise AttributeError(f"module 'interp' has no attribute {name!r}")


__all__ = [
    "DEFAULT_MODEL",
    "OFFLINE_MODELS",
    "ActivationCache",
    "Config",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "act_name",
    "default_device",
    "from_hf",
    "load_model",
    "next_token_loss",
]
