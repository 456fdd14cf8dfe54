"""Architecture specs: how a `transformers` model maps onto `Config` and our weight layout.

Each spec is two small functions: `config(hf_config) -> Config` and
`weights(hf_state_dict, cfg) -> our state dict` (plus, rarely, `fold` for constants that fold into
weights), written in `interp.io.gpt_family` and `interp.io.llama_family` with the shared pieces of
`interp.io.hf_layout`. Adding an architecture means adding a spec here and a config to
tests/test_equivalence.py.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from interp.config import Config, rotary_inv_freq
from interp.io.gpt_family import (
    falcon_config,
    falcon_weights,
    gpt2_config,
    gpt2_weights,
    gpt_neo_config,
    gpt_neo_weights,
    gptj_config,
    gptj_weights,
    neox_config,
    neox_weights,
    opt_config,
    opt_weights,
)
from interp.io.llama_family import (
    gemma_config,
    granite_config,
    granite_fold,
    llama_config,
    llama_weights,
    mistral_config,
    mixtral_config,
    olmo2_config,
    phi3_config,
    phi3_weights,
    phi_config,
    phi_weights,
    qwen2_config,
    qwen3_config,
    smollm3_config,
    stablelm_config,
    stablelm_weights,
)
from interp.types import upcast


@dataclass(frozen=True)
class ArchitectureSpec:
    """config: transformers config -> Config. weights: (transformers state dict, Config) -> our
    state dict. fold: (our state dict, transformers config) -> our state dict with constants of the
    transformers config folded in exactly (Granite's multipliers); None for most."""

    config: Callable[[Any], Config]
    weights: Callable[[dict[str, Tensor], Config], dict[str, Tensor]]
    fold: Callable[[dict[str, Tensor], Any], dict[str, Tensor]] | None = None


ARCHITECTURES: dict[str, ArchitectureSpec] = {
    "falcon": ArchitectureSpec(falcon_config, falcon_weights),
    "gemma": ArchitectureSpec(gemma_config, llama_weights),
    "gemma2": ArchitectureSpec(gemma_config, llama_weights),
    "gemma3_text": ArchitectureSpec(gemma_config, llama_weights),
    "gpt2": ArchitectureSpec(gpt2_config, gpt2_weights),
    "gpt_neo": ArchitectureSpec(gpt_neo_config, gpt_neo_weights),
    "gpt_neox": ArchitectureSpec(neox_config, neox_weights),
    "gptj": ArchitectureSpec(gptj_config, gptj_weights),
    "granite": ArchitectureSpec(granite_config, llama_weights, granite_fold),
    "llama": ArchitectureSpec(llama_config, llama_weights),
    "mistral": ArchitectureSpec(mistral_config, llama_weights),
    "mixtral": ArchitectureSpec(mixtral_config, llama_weights),
    "olmo2": ArchitectureSpec(olmo2_config, llama_weights),
    "opt": ArchitectureSpec(opt_config, opt_weights),
    "phi": ArchitectureSpec(phi_config, phi_weights),
    "phi3": ArchitectureSpec(phi3_config, phi3_weights),
    "qwen2": ArchitectureSpec(qwen2_config, llama_weights),
    "qwen3": ArchitectureSpec(qwen3_config, llama_weights),
    "smollm3": ArchitectureSpec(smollm3_config, llama_weights),
    "stablelm": ArchitectureSpec(stablelm_config, stablelm_weights),
}


def rotary_inv_freq_from_hf(hf_model: Any) -> Tensor | None:
    """The model's own rotary inverse frequencies (covers scaled RoPE such as Llama 3's)."""
    for module in hf_model.modules():
        inv_freq = getattr(module, "inv_freq", None)
        if isinstance(inv_freq, Tensor):
            # Dynamic RoPE replaces `inv_freq` after a run past max_position_embeddings (and puts it
            # back on a shorter one); the model's own frequencies are `original_inv_freq`.
            original = getattr(module, "original_inv_freq", None)
            inv_freq = original if isinstance(original, Tensor) else inv_freq
            if getattr(module, "attention_scaling", 1.0) != 1.0:
                raise NotImplementedError("RoPE with attention scaling is not supported.")
            return inv_freq.detach().float().clone()
    return None


def ties_embeddings(hf_model: Any) -> bool:
    """Whether a `transformers` model's output embedding is its input embedding (one tensor)."""
    output = getattr(hf_model.get_output_embeddings(), "weight", None)
    return output is not None and output.data_ptr() == hf_model.get_input_embeddings().weight.data_ptr()


def convert_hf_model(hf_model: Any) -> tuple[Config, dict[str, Tensor]]:
    """(Config, state dict) of a `transformers` causal LM, for `HookedTransformer.load_state_dict`."""
    model_type = hf_model.config.model_type
    if model_type not in ARCHITECTURES:
        closest = difflib.get_close_matches(model_type, ARCHITECTURES, n=1, cutoff=0.0)
        raise ValueError(
            f"Architecture {model_type!r} is not supported (closest: {closest[0]!r}). Supported: "
            f"{', '.join(sorted(ARCHITECTURES))}. Adding one takes a spec in interp/io/architectures.py."
        )
    spec = ARCHITECTURES[model_type]
    cfg = spec.config(hf_model.config)
    cfg.model_name = getattr(hf_model.config, "name_or_path", "") or model_type
    cfg.tied_embeddings = ties_embeddings(hf_model)
    state = {k: v.detach() for k, v in hf_model.state_dict().items()}
    weights = spec.weights(state, cfg)
    if spec.fold is not None:
        weights = spec.fold(weights, hf_model.config)
    if cfg.positional == "rotary" and cfg.rotary_inv_freq is None:
        inv_freq = rotary_inv_freq_from_hf(hf_model)
        inv_freq = None if inv_freq is None else inv_freq.cpu()  # a model on a GPU keeps it there
        if inv_freq is not None and not torch.allclose(
            inv_freq, rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base)
        ):
            cfg.rotary_inv_freq = inv_freq.tolist()
    return cfg, {k: upcast(v).contiguous() for k, v in weights.items()}  # float64 kept
