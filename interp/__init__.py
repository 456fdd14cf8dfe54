"""interp: a hookable transformer for mechanistic interpretability.

Layers, each importing only from those before it (see ARCHITECTURE.md): config, types, catalog ->
io -> model -> interventions -> edges -> tasks -> training, viz, runtime, compat.
Importing interp changes nothing in the process (no allocator policy, no output) and loads nothing:
each public name and subpackage is imported on first use, so `import interp.catalog` (what the
command line's `--help` needs) does not import torch. The `interventions` modules are reachable as
`interp.metrics`, `interp.patching`, `interp.ablation`, ...
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Ablation": "interp.interventions.ablation",
    "DEFAULT_MODEL": "interp.catalog",
    "OFFLINE_MODELS": "interp.io.sources",
    "ActivationCache": "interp.model",
    "Config": "interp.config",
    "HookedTransformer": "interp.model",
    "HookedTransformerConfig": "interp.compat.transformer_lens",
    "HookedTransformerKeyValueCache": "interp.model",
    "HookedTransformerKeyValueCacheEntry": "interp.model",
    "act_name": "interp.model",
    "default_device": "interp.io.devices",
    "from_hf": "interp.model",
    "load_model": "interp.model",
    "next_token_loss": "interp.model",
    "parameter_count": "interp.model",
    "patch": "interp.interventions.patching",
    "provenance": "interp.model",
    "ungrouped": "interp.model",
    "weights_fingerprint": "interp.model",
}
_INTERVENTIONS = ("metrics", "patching", "path_patching", "ablation", "engine", "results", "stats")
_SUBPACKAGES = (
    "catalog", "checks", "compat", "config", "edges", "interventions", "io", "model", "runtime", "tasks",
    "training", "types", "viz",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    """A public name, a subpackage, or a module of interp.interventions, imported on first use."""
    if name in _PUBLIC:
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"interp.{name}")
    elif name in _INTERVENTIONS:
        value = importlib.import_module(f"interp.interventions.{name}")
    else:
        raise AttributeError(f"module 'interp' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC, *_SUBPACKAGES, *_INTERVENTIONS])


__all__ = list(_PUBLIC)
