"""The user guide (docs/guide/*.md) and the README's library snippet run as written: each page's
Python blocks are executed in order in one namespace, as a reader would paste them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent.parent
PAGES = sorted((ROOT / "docs" / "guide").glob("*.md"))
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


def run_blocks(blocks: list[str], where: str) -> dict:
    namespace: dict = {"__name__": "__docs__"}
    torch.manual_seed(0)
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{where} block {i + 1}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(
                f"{where}, block {i + 1} fails: {type(error).__name__}: {error}\n{block}"
            ) from error
    return namespace


def test_every_guide_page_has_code() -> None:
    assert {p.stem for p in PAGES} >= {
        "loading",
        "hooks",
        "patching",
        "ablation",
        "engine",
        "edges",
        "heads",
        "ioi",
    }
    for page in PAGES:
        if page.stem != "index":
            assert python_blocks(page), f"{page.name} has no Python to run"


@pytest.mark.parametrize("page", [p for p in PAGES if p.stem != "index"], ids=lambda p: p.stem)
def test_guide_page_runs(page: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_blocks(python_blocks(page), page.name)


def test_readme_library_snippet_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    readme = ROOT / "README.md"
    section = readme.read_text().split("## Library", 1)[1].split("\n## ", 1)[0]
    blocks = BLOCK.findall(section)
    assert blocks, "the README's Library section has no Python block"
    run_blocks(blocks, "README.md Library")
