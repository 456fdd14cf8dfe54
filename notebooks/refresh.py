"""Execute every notebook and store it with its outputs (`make notebooks`), so that a viewer or a
code host shows the results without running anything.

    python notebooks/refresh.py [NAME.ipynb ...]

Each notebook runs in a scratch directory (files it writes are not kept), without timing metadata
(the stored file changes only when a result does), and is replaced atomically once it ran cleanly.
Interactive HTML outputs that inline a JavaScript bundle (circuitsvis attention viewers: ~1 MB each,
and code hosts do not run them) are stored as a PNG screenshot of the rendered viewer, taken in
headless Chromium (tests/browser.py's, so refreshing needs it: .ci/install_browser.sh); images,
tables and text are kept. Progress-bar widgets (tqdm under Jupyter) are live views with no stored
state, which no viewer can replay, so they are dropped.
"""

from __future__ import annotations

import base64
import io
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from PIL import Image
from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from interp.io.files import atomic_write  # noqa: E402
from tests.browser import CHROMIUM, CHROMIUM_FLAGS  # noqa: E402

NOTEBOOKS = Path(__file__).parent
MAX_HTML_OUTPUT = 100_000  # characters; larger HTML outputs are interactive widgets, stored as PNG
WIDGET = "application/vnd.jupyter.widget-view+json"
SCREENSHOT_NOTE = "Attention viewer, stored as a screenshot: run the notebook to explore it interactively."


def screenshot(page, html: str) -> str:
    """The attention viewer in `html` rendered by `page` (Chromium), as a base64 palette PNG."""
    page.set_content(f"<html><body style='margin: 8px; background: #fff'>{html}</body></html>")
    view = page.locator(".interp-attention")
    page.wait_for_function("() => document.querySelector('.interp-attention canvas, .interp-attention svg')")
    page.wait_for_timeout(300)  # let the viewer finish drawing
    image = Image.open(io.BytesIO(view.screenshot())).convert("RGB")
    buffer = io.BytesIO()
    image.quantize(colors=128).save(buffer, format="PNG", optimize=True)  # a few flat colours: small
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def shrink(notebook: nbformat.NotebookNode) -> None:
    """In place: oversized HTML outputs (inlined JavaScript widgets) become screenshots, and
    progress-bar widgets are dropped."""
    large = [
        output
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if len(output.get("data", {}).get("text/html", "")) > MAX_HTML_OUTPUT
    ]
    for cell in notebook.cells:
        if "outputs" in cell:
            cell.outputs = [output for output in cell.outputs if WIDGET not in output.get("data", {})]
    if not large:
        return
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 900, "height": 600})
            for output in large:
                png = screenshot(page, output.data["text/html"])
                output.data = {"image/png": png, "text/plain": SCREENSHOT_NOTE}
        finally:
            browser.close()


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
    with atomic_write(path) as file:
        nbformat.write(notebook, file)


def main(names: list[str]) -> None:
    paths = [NOTEBOOKS / name for name in names] or sorted(NOTEBOOKS.glob("*.ipynb"))
    for path in paths:
        began = time.perf_counter()
        print(f"{path.name} ...", end=" ", flush=True)
        refresh(path)
        print(f"{time.perf_counter() - began:.0f} s, {path.stat().st_size / 1024:.0f} KiB", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
