"""Execute every notebook and store it with its outputs (`make notebooks`), so that a viewer or a
code host shows the results without running anything.

    python notebooks/refresh.py [NAME.ipynb ...]

Each notebook runs in a scratch directory (files it writes are not kept), without timing metadata
(the stored file changes only when a result does), and is replaced atomically once it ran cleanly.
Interactive HTML outputs that inline a JavaScript bundle (circuitsvis: ~1 MB each, and code hosts do
not run them) are stored as a one-line note; images, tables and text are kept.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).parent
MAX_HTML_OUTPUT = 100_000  # characters; larger HTML outputs are interactive widgets, stored as a note
STORED_NOTE = (
    "<p><i>Interactive view: run the notebook to see it (not stored, to keep the file small).</i></p>"
)


def shrink(notebook: nbformat.NotebookNode) -> None:
    """Replace oversized HTML outputs (inlined JavaScript widgets) by STORED_NOTE, in place."""
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if len(data.get("text/html", "")) > MAX_HTML_OUTPUT:
                data["text/html"] = STORED_NOTE


def refresh(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        client = NotebookClient(
            notebook, timeout=1200, kernel_name="python3", record_timing=False,
            resources={"metadata": {"path": scratch}},
        )  # fmt: skip
        client.execute()
    notebook.metadata.pop("widgets", None)
    shrink(notebook)
    partial = path.with_suffix(f".partial-{os.getpid()}")
    nbformat.write(notebook, partial)
    os.replace(partial, path)


def main(names: list[str]) -> None:
    paths = [NOTEBOOKS / name for name in names] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        began = time.perf_counter()
        print(f"{path.name} ...", end=" ", flush=True)
        refresh(path)
        print(f"{time.perf_counter() - began:.0f} s, {path.stat().st_size / 1024:.0f} KiB", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
