"""Which model sources name local files, decided without reading them (no torch): the check the
`interp` command runs before anything loads, and `interp.io.sources` before it reads a source.

    check_local_source("runs/induction/")   # FileNotFoundError if that directory is not there
"""

from __future__ import annotations

from pathlib import Path

from interp.catalog import OFFLINE_MODEL_NAMES

# Suffixes of files, never of hub ids: a missing path with one of them is a missing file.
LOCAL_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".json", ".ckpt")


def check_local_source(source: str) -> None:
    """Refuse a model source that names local files which are not a model: a path that does not exist
    and cannot be a hub id (it starts with ".", "/", "~" or "\\", ends in a weights file's suffix,
    or has more than two parts), a directory without a config.json (neither an interp checkpoint nor
    a transformers model), or an existing path that is neither a directory nor a .gguf file. Short
    names of offline models, hub ids, .gguf files and model directories (read later) pass."""
    if source.lower() in OFFLINE_MODEL_NAMES:
        return
    path = Path(source).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        steps = sorted(path.glob("checkpoints/step_*/config.json"))  # `interp train`'s, unfinished
        if steps:
            raise ValueError(
                f"{path} is a training run that has not finished: run the same interp train command to "
                f"finish it, or pass its last checkpoint, {steps[-1].parent}"
            )
        raise ValueError(f"{path} holds neither an interp checkpoint nor a transformers model.")
    if path.is_dir() or (path.suffix == ".gguf" and path.exists()):
        return
    if path.exists():
        raise ValueError(f"{source} is not a model directory or a .gguf file.")
    if (
        source.startswith((".", "/", "~", "\\"))
        or path.suffix in LOCAL_SUFFIXES
        or (len(path.parts) > 2 and not source.startswith(("http:", "https:")))
    ):
        raise FileNotFoundError(
            f"no such file or directory: {source!r}; pass an existing model directory or .gguf file, "
            f"a transformers model id (e.g. 'gpt2'), or one of {', '.join(OFFLINE_MODEL_NAMES)}"
        )
