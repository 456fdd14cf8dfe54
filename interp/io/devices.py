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
    return check_device(os.environ.get("INTERP_DEVICE", "cpu"), "INTERP_DEVICE")


def check_device(device: str | int | torch.device, what: str = "device") -> torch.device:
    """`device` as a torch device a model can run on here, else a ValueError naming `what` (the option or
    variable it came from): not a device name, a GPU torch does not see, or the meta device (no weights)."""
    try:
        found = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{what}={device!r} is not a torch device (e.g. cpu, cuda, cuda:1).") from error
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found.type == "cuda" and (found.index or 0) >= n_gpus:
        raise ValueError(f"{what}={device!r} but torch sees {n_gpus} CUDA device(s) here; use cpu.")
    if found.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{what}={device!r} but torch sees no MPS device here; use cpu.")
    if found.type == "meta":
        raise ValueError(f"{what}={device!r}: a model on the meta device holds no weights to run; use cpu.")
    return found


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
