"""Checkpoint directories on disk: config.json + model.safetensors + tokenizer/, written atomically,
and the toy checkpoints shipped with interp. Reads and writes (Config, state dict, tokenizer);
knows nothing of how a model is built (see `interp.model.loading`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from interp.checks import check_loaded_weights, check_regular_file
from interp.config import Config
from interp.io.files import atomic_dir


class LoadedWeights(NamedTuple):
    """What a source holds: the model's config, its state dict (interp's parameter names), its
    tokenizer (None for models that work on token ids only) and the side `to_tokens` pads (a saved
    model's; None: the default, "right")."""

    cfg: Config
    state_dict: dict[str, Tensor]
    tokenizer: Any = None
    padding_side: str | None = None


CHECKPOINT_FORMAT = "interp-checkpoint-1"
SHIPPED_DIR = Path(__file__).parent.parent / "data"
SHIPPED_MODELS = ("toy-induction", "toy-ioi", "toy-hop")


def shipped_checkpoint(name: str = "toy-induction") -> Path:
    """A committed small attention-only model (see interp/data/README.md): "toy-induction"
    (trained on copied spans), "toy-ioi" (trained on toy IOI prompts) or "toy-hop" (3 layers,
    trained on the 2-hop induction task)."""
    if name not in SHIPPED_MODELS:
        raise ValueError(f"no shipped checkpoint {name!r}; choose one of {SHIPPED_MODELS}")
    path = SHIPPED_DIR / name
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"The shipped checkpoint is missing from {path}; reinstall interp.")
    return path


def is_checkpoint(path: Path) -> bool:
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        meta = json.loads(config.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(meta, dict) and meta.get("format") == CHECKPOINT_FORMAT


def save_checkpoint(model: nn.Module, directory: str | Path, extra: dict | None = None) -> Path:
    """Write a model's config.json, model.safetensors and tokenizer/ into `directory`, atomically, with
    the side it pads (`model.default_padding_side`)."""
    weights = LoadedWeights(model.cfg, model.state_dict(), model.tokenizer, model.default_padding_side)
    return write_checkpoint(weights, directory, extra)


def write_checkpoint(
    weights: LoadedWeights, directory: str | Path, extra: dict | None = None, keep_existing: bool = False
) -> Path:
    """Write config.json, model.safetensors and tokenizer/ into `directory`, atomically.

    Everything is written to a temporary sibling directory first and renamed into place, so an
    interrupted save never leaves a half-written checkpoint. keep_existing: a checkpoint already at
    `directory` stays and this one is dropped (a cache entry of the same content: `files.atomic_dir`).
    """
    with atomic_dir(directory, keep_existing) as tmp:
        state = {k: v.detach().contiguous().cpu() for k, v in weights.state_dict.items()}
        save_file(state, tmp / "model.safetensors")
        if weights.tokenizer is not None:
            weights.tokenizer.save_pretrained(tmp / "tokenizer")
        meta = {"format": CHECKPOINT_FORMAT, "config": weights.cfg.to_dict(), **(extra or {})}
        if weights.padding_side is not None:
            meta["padding_side"] = weights.padding_side
        (tmp / "config.json").write_text(json.dumps(meta, indent=2))
    return Path(directory)


def read_checkpoint(directory: str | Path) -> LoadedWeights:
    """The config, weights and tokenizer of a checkpoint directory written by `write_checkpoint`."""
    directory = Path(directory)
    config_file = check_regular_file(directory / "config.json", "checkpoint config")  # a FIFO never hangs
    try:
        meta = json.loads(config_file.read_text())
        cfg = Config.from_dict(meta["config"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise ValueError(
            f"The checkpoint config {config_file} is not an interp checkpoint's config.json ({error}); "
            "re-create the checkpoint"
        ) from error
    if cfg.task is None and meta.get("task"):  # checkpoints written before Config recorded it
        cfg.task = meta["task"]
    weights_file = directory / "model.safetensors"
    try:
        check_regular_file(weights_file, "weights file")
        state = load_file(weights_file)
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"The weights file {weights_file} is missing, truncated or corrupted ({error}). "
            "Re-create the checkpoint (or delete it if it is a cache entry)."
        ) from error
    check_loaded_weights(cfg, state, weights_file)
    tokenizer = None
    if (directory / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer", trust_remote_code=False)
    side = meta.get("padding_side")
    if side not in (None, "left", "right"):
        raise ValueError(
            f"The checkpoint config {config_file} has padding_side={side!r}; use 'left' or 'right'."
        )
    return LoadedWeights(cfg, state, tokenizer, side)
