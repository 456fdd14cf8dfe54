"""The source code as a key: what is kept under it (a resumable job's results, a converted GGUF, an
edge mask's training state) is made again after any change to the code that made it."""

from __future__ import annotations

import hashlib
import types
from pathlib import Path

INTERP_SOURCE = Path(__file__).resolve().parents[1]  # interp's own package directory


def source_key(*packages: types.ModuleType | Path) -> str:
    """A 16-hex-digit sha256 of the packages' source code (every .py file under each one's directory,
    `INTERP_SOURCE` for interp itself, or one .py file, by its path there and its bytes)."""
    digest = hashlib.sha256()
    for package in packages:
        root = package if isinstance(package, Path) else Path(package.__file__).parent
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            digest.update(f"{root.name}/{path.relative_to(root)}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
