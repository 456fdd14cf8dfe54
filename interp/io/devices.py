"""Where tensors live: the default device, and weights of blocks that accelerate offloaded.

`load_model(device_map=...)` (see `interp.model.loading.dispatch`) leaves the parameters of blocks
offloaded to CPU or disk on the meta device between forward passes; `module_weight` reads them in.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor, nn


def default_device() -> torch.device:
    """Where models load when no device is given: `$INTERP_DEVICE` ("cuda", "cuda:1", ...), else CPU."""
    name = os.environ.get("INTERP_DEVICE", "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"INTERP_DEVICE={name!r} is not a torch device (e.g. cpu, cuda, cuda:1).") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"INTERP_DEVICE={name!r} but torch sees no CUDA device; unset it or use cpu.")
    return device


def transformer_lens_device() -> torch.device:
    """TransformerLens's default device for from_pretrained: a GPU where there is one, else the CPU
    (interp.load_model's default is `default_device`: $INTERP_DEVICE, else CPU)."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def module_weight(module: nn.Module, attr: str, device: str | torch.device) -> Tensor:
    """module.attr on `device`, read from accelerate's offload (CPU or disk) when it is not in memory
    (models loaded with device_map); use it rather than module.attr for weights of any block."""
    weight = getattr(module, attr)
    if weight.is_meta:
        from accelerate.utils import align_module_device

        with align_module_device(module, device):
            return getattr(module, attr).detach().clone()
    return weight.to(device)
