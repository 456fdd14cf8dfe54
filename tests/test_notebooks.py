"""Every research notebook runs end to end."""

from __future__ import annotations

import re
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


PROSE_FIGURE = re.compile(
    r"(?<![\w.~])[+−-]?\d[\d,]*(?:\.\d+%?|%)"
)  # a decimal or a percentage; "~87%" quotes
SHOWN_NUMBER = re.compile(r"[+−-]?\d[\d,]*(?:\.\d+)?%?")


def _value(figure: str) -> tuple[float, int, bool]:
    """(value, decimals, percentage) of a written figure."""
    text = figure.replace("−", "-").replace(",", "").rstrip("%")
    return float(text), len(text.partition(".")[2]), figure.endswith("%")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_the_prose_quotes_figures_its_outputs_show(path: Path) -> None:
    """Every decimal or percentage of a notebook's text is one its stored outputs show (rounded as
    written; the CIs' 95% and figures quoted from papers, written "~87%", aside): a refresh that
    changes a result fails here until the text says what the outputs now show."""
    notebook = nbformat.read(path, as_version=4)
    shown = [
        _value(number)
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        for text in output_texts(output)
        for number in SHOWN_NUMBER.findall(text)
    ]
    unshown = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown":
            continue
        for figure in PROSE_FIGURE.findall(cell.source):
            value, decimals, percent = _value(figure)
            near = 0.5 * 10**-decimals + 1e-9
            if figure != "95%" and not any(
                is_percent == percent and abs(abs(number) - abs(value)) <= near
                for number, _, is_percent in shown
            ):
                unshown.append(figure)
    assert not unshown, f"figures of the text that no output shows: {unshown}"
