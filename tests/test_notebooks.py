"""Every research notebook runs end to end."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]
    assert not errors


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_with_its_outputs(path: Path) -> None:
    """Committed executed (`make notebooks`), so a viewer shows the results, and kept small."""
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count is not None for cell in code), "run `make notebooks`"
    assert sum(bool(cell.outputs) for cell in code) >= len(code) // 2
    assert path.stat().st_size < 1_000_000


MACHINE_PATHS = ("/work/", "/home/", "/root/", ".venv")


def output_texts(output: dict) -> list[str]:
    """The text a stored output shows: stream text, tracebacks, textual data (not base64 images)."""
    texts = [output.get("text", ""), *output.get("traceback", [])]
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/") or mime.endswith(("+xml", "json")):
            texts.append(value if isinstance(value, str) else str(value))
    return texts


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_outputs_have_no_machine_paths_or_warnings(path: Path) -> None:
    """What a reader sees was not made on one machine: no absolute paths, no warnings on stderr."""
    notebook = nbformat.read(path, as_version=4)
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    leaks = [
        (marker, text[:200])
        for output in outputs
        for text in output_texts(output)
        for marker in MACHINE_PATHS
        if marker in text
    ]
    assert not leaks
    warnings = [
        output["text"][:200]
        for output in outputs
        if output.get("name") == "stderr" and "warning" in output["text"].lower()
    ]
    assert not warnings


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_attention_viewers_are_stored_as_screenshots(path: Path) -> None:
    """refresh.py stores each circuitsvis viewer as a PNG (a viewer shows the pattern, not a note)."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code" and "show_attention(" in cell.source:
            images = [output for output in cell.outputs if "image/png" in output.get("data", {})]
            assert images, cell.source[:80]
    html = [
        output["data"]["text/html"]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "text/html" in output.get("data", {})
    ]
    assert not any("CircuitsVis" in text for text in html)
