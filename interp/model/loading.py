"""Loading a model: `load_model` reads a source (`interp.io.sources`), builds a `HookedTransformer`
from it, processes its weights if asked, and places it on a device (or spreads it over several with
`dispatch`). `HookedTransformer.from_pretrained` is TransformerLens's entry point to the same
sources, with TransformerLens's processing defaults.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import warnings
from pathlib import Path
from typing import Any

import torch

import interp.checks as checks
from interp.catalog import DEFAULT_MODEL
from interp.config import place
from interp.io.checkpoint import LoadedWeights, read_checkpoint
from interp.io.devices import check_device, default_device, module_weight
from interp.io.sources import read_gguf, read_hf_model, read_source
from interp.model.transformer import HookedTransformer
from interp.model.weights import process_weights


def load_model(
    source: Any = DEFAULT_MODEL,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str = torch.float32,
    tokenizer: Any = None,
    fold_ln: bool = False,
    center_writing_weights: bool = False,
    center_unembed: bool = False,
    device_map: str | dict[str, str | int] | None = None,
    max_memory: dict[str | int, int | str] | None = None,
    offload_folder: str | Path | None = None,
) -> HookedTransformer:
    """Load a model into a `HookedTransformer`.

    source: a short name ("smollm2-135m"), a `transformers` model id ("gpt2",
    "EleutherAI/pythia-70m"; downloaded by transformers where the hub is reachable), a
    `transformers` model object, a local transformers directory, a .gguf file, or a checkpoint
    directory written by `model.save`. Weight processing (all off by default) leaves
    log-probabilities unchanged; see `interp.model.weights.process_weights`
    (`HookedTransformer.from_pretrained` applies TransformerLens's defaults). The model is in eval
    mode. `device` defaults to `default_device()` ($INTERP_DEVICE, else CPU); `dtype` may be
    float32, bfloat16 or float16, as a torch.dtype or its name ("fp16", "bf16" too; norms, softmaxes
    and rotary angles are still computed in float32), or float64 (the weights as read: files in
    float32, as nearly all are stored; a float64 `transformers` model object's own; metrics and
    patching results are float32 whatever the dtype).

    device_map ("auto" or {"blocks.L": device}) spreads the blocks over devices, CPU and disk
    through accelerate; see `dispatch`. max_memory ({0: "20GiB", "cpu": "64GiB"}) bounds what
    "auto" puts on each device; offload_folder (empty or new, one per model) holds the weights of
    blocks offloaded to disk.
    """
    dtype = checks.check_dtype(dtype)
    model = HookedTransformer.from_weights(read_source(source, tokenizer))
    process_weights(model, fold_ln, center_writing_weights, center_unembed)
    if device_map is not None:
        if device is not None:
            raise ValueError("Give device or device_map, not both.")
        return dispatch(model.to(dtype=dtype), device_map, max_memory, offload_folder).eval()
    if max_memory is not None or offload_folder is not None:
        raise ValueError("max_memory and offload_folder go with device_map='auto' (or a dict).")
    # eval mode, as transformers and TransformerLens; train() works
    return model.to(device=default_device() if device is None else check_device(device), dtype=dtype).eval()


# --- models over several devices -----------------------------------------------------------------

_OUTER_WEIGHTS = ("W_E", "W_pos", "W_U", "b_U")  # the model's own parameters: embed and unembed


def dispatch(
    model: HookedTransformer,
    device_map: str | dict[str, str | int],
    max_memory: dict[str | int, int | str] | None = None,
    offload_folder: str | Path | None = None,
) -> HookedTransformer:
    """Spread the blocks of `model` over devices with accelerate; returns the model.

    device_map: "auto" (fill the devices of max_memory in order: GPUs, then CPU, then disk), or
    {"blocks.L": device} for every block, where device is "cuda:0" (or 0), "cpu" or "disk".
    The embedding, ln_final and unembedding sit on the main device (the first GPU in the map, else
    the CPU), which also runs the blocks offloaded to CPU or disk, one at a time. Each block moves
    its input to its own device, so hooks see activations on the device of their block; caching
    (`run_with_cache(device=...)` gathers them), patching and ablation work unchanged. Gradients reach
    every activation, but an offloaded block's weights keep none (`.grad` stays None): train or
    attribute to weights on a model in memory.
    """
    try:
        import accelerate
    except ImportError as error:
        raise ImportError("device_map needs accelerate: pip install accelerate") from error
    n_layers = model.cfg.n_layers
    if device_map == "auto":
        device_map = _auto_device_map(model, max_memory)
    elif not isinstance(device_map, dict):
        raise ValueError(f"device_map must be 'auto' or a dict {{'blocks.L': device}}, got {device_map!r}.")
    blocks = {f"blocks.{layer}" for layer in range(n_layers)}
    if set(device_map) != blocks:
        missing, unknown = sorted(blocks - set(device_map)), sorted(set(device_map) - blocks)
        raise ValueError(
            f"device_map needs one entry per block, 'blocks.0' .. 'blocks.{n_layers - 1}' "
            f"(missing {missing[:3]}, unknown {unknown[:3]})."
        )
    device_map = {key: _device_name(value) for key, value in device_map.items()}
    if "disk" in device_map.values() and offload_folder is None:
        raise ValueError("Some blocks go to disk: give offload_folder, a directory for their weights.")
    if offload_folder is not None and (Path(offload_folder) / "index.json").exists():
        raise ValueError(
            f"offload_folder {offload_folder} already holds offloaded weights (of another model or an "
            "earlier load), which accelerate would read instead of this model's; give an empty folder."
        )
    gpus = [device for device in device_map.values() if device not in ("cpu", "disk")]
    main = gpus[0] if gpus else "cpu"
    with torch.no_grad():
        for name in _OUTER_WEIGHTS:
            if getattr(model, name, None) is not None:
                getattr(model, name).data = getattr(model, name).data.to(main)
    outer = {name: main for name in _OUTER_WEIGHTS if getattr(model, name, None) is not None}
    full_map = {**outer, "ln_final": main, **device_map}
    with warnings.catch_warnings():  # accelerate maps modules; the outer weights were placed above
        warnings.filterwarnings("ignore", message="The following device_map keys do not match")
        model = accelerate.dispatch_model(
            model, full_map, main_device=main, offload_dir=offload_folder, skip_keys=["past_kv_cache_entry"]
        )  # the KV cache is updated in place, so it must not be copied to another device
    place(model.cfg, model.device, model.dtype)
    return model


def _device_name(device: str | int | torch.device) -> str:
    if str(device) in ("cpu", "disk"):
        return str(device)
    return str(check_device(device, "a device of device_map"))


def _auto_device_map(model: HookedTransformer, max_memory: dict | None) -> dict[str, str]:
    """Blocks in order onto the devices of max_memory, after the main device keeps the embeddings."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import compute_module_sizes, get_max_memory

    budgets = get_max_memory(max_memory)  # sizes in bytes; every device torch sees if None
    main = next((key for key in budgets if key not in ("cpu", "disk", "mps")), "cpu")
    sizes = compute_module_sizes(model)
    outer = sum(sizes.get(name, 0) for name in (*_OUTER_WEIGHTS, "ln_final"))
    budgets[main] = max(0, budgets[main] - outer)
    budgets.setdefault("disk", 2**62)
    blocks = infer_auto_device_map(model.blocks, max_memory=budgets, no_split_module_classes=["Block"])
    if set(blocks) == {""}:  # every block fits on one device: accelerate names the whole list
        return {f"blocks.{layer}": blocks[""] for layer in range(len(model.blocks))}
    return {f"blocks.{key}": value for key, value in blocks.items()}


def from_hf(hf_model: Any, tokenizer: Any = None) -> HookedTransformer:
    """Copy a `transformers` causal LM's weights into a HookedTransformer."""
    return HookedTransformer.from_weights(read_hf_model(hf_model, tokenizer))


def load_gguf(path: str | Path) -> HookedTransformer:
    """Load a GGUF file (dequantised by transformers, cached as a checkpoint)."""
    return HookedTransformer.from_weights(read_gguf(path))


def load_checkpoint(directory: str | Path) -> HookedTransformer:
    """Load a checkpoint directory written by `model.save`."""
    return HookedTransformer.from_weights(read_checkpoint(directory))


UNGROUPED = "key/value heads per query head"  # what an `ungrouped` model's name says of it


def ungrouped(model: HookedTransformer) -> HookedTransformer:
    """`model` with each key/value head copied to every query head of its group (n_kv_heads = n_heads):
    the same function, with a key and a value input per query head, as TransformerLens's
    `ungroup_grouped_query_attention` and MIB's edge graph have them (an edge into a key input is an
    edge into one query head's). Every weight held per key/value head (W_K, W_V, their biases, a key
    norm's) is copied; the others are `model`'s own tensors. Named "<name> (key/value heads per query
    head)". A model without grouped-query attention is returned as it is."""
    cfg, group = model.cfg, model.cfg.group_size
    if group == 1:
        return model
    config = dataclasses.replace(cfg, n_kv_heads=cfg.n_heads, model_name=f"{cfg.model_name} ({UNGROUPED})")
    with torch.device("meta"):
        shapes = {name: value.shape for name, value in HookedTransformer(config).state_dict().items()}
    state = {
        name: value.repeat_interleave(group, dim=0) if shapes[name] != value.shape else value
        for name, value in model.state_dict().items()
    }
    weights = LoadedWeights(config, state, model.tokenizer, model.default_padding_side)
    copy = HookedTransformer.from_weights(weights)
    copy.copied_parameters = model.copied_parameters + sum(
        state[name].numel() - value.numel() for name, value in model.state_dict().items()
    )
    return copy


GGUF_QUANTISATION = re.compile(r"(I?Q\d+_[0-9A-Z_]+|F16|BF16|F32)$", re.IGNORECASE)  # a GGUF name's end


def parameter_count(model: HookedTransformer) -> int:
    """Parameters as a model card counts them: a checkpoint's tied embeddings (`cfg.tied_embeddings`:
    interp's W_U is W_E^T, or Gemma's W_E^T / sqrt(d_model)) once, and an `ungrouped` model's copies of
    its key/value heads not at all."""
    total = sum(p.numel() for p in model.parameters()) - model.copied_parameters
    return total - model.W_U.numel() if model.cfg.tied_embeddings else total


def provenance(model: HookedTransformer) -> str:
    """Where a report's numbers come from, in one line: the model's name, the quantisation its
    weights were read from (a GGUF's, as its name records it, in capitals: "Q4_1", "Q4_K_M"), the
    parameter count as the model card counts it, and the dtype it ran in."""
    name, source = model.cfg.model_name, model.cfg.source or ""
    quantised = GGUF_QUANTISATION.search(source.removesuffix(".gguf"))
    if quantised:
        source = f", weights dequantised from the {quantised[1].upper()} GGUF {source}"
    elif source:
        source = f", weights from {source}"
    dtype = str(model.cfg.dtype).removeprefix("torch.")
    n = parameter_count(model)
    size = f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"
    return f"{name}{source}, {size} parameters, run in {dtype}"


FINGERPRINT_SCHEME = "w2"  # the prefix of `weights_fingerprint`'s hashes; older ones hashed a sample
HASH_CHUNK = 1 << 24  # values of a weight moved to the CPU and hashed at a time


def weights_fingerprint(model: HookedTransformer) -> str:
    """ "w2-" and a 16-hex-digit sha256 of the model's configuration and every byte of every weight
    (about 0.4 s per GB): what saved results, cached induction heads and edge-mask checkpoints are keyed
    by. Any change to any weight, its dtype or the configuration changes it; the device does not."""
    digest = hashlib.sha256(repr(sorted(model.cfg.to_dict().items())).encode())  # not where it runs
    for name, weight in model.state_dict().items():
        if weight.is_meta:  # a block accelerate offloaded (dispatch): its weight read in from the offload
            owner, _, attr = name.rpartition(".")
            weight = module_weight(model.get_submodule(owner), attr, "cpu")
        digest.update(f"{name}{tuple(weight.shape)}{weight.dtype}".encode())
        flat = weight.detach().reshape(-1)
        for start in range(0, flat.numel(), HASH_CHUNK):
            chunk = flat[start : start + HASH_CHUNK].cpu().contiguous()
            digest.update(memoryview(chunk.view(torch.uint8).numpy()))
    return f"{FINGERPRINT_SCHEME}-{digest.hexdigest()[:16]}"
