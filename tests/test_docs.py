"""Every Python block of the README and of the docs (docs/**/*.md) runs as written: each page's
blocks are executed in order in one namespace, as a reader would paste them. The results pages
(docs/results/) are what docs/results/build.py makes from their data, and the README's links lead
to files that exist."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent.parent
PAGES = sorted((ROOT / "docs" / "guide").glob("*.md"))
DOCS = sorted(path for path in (ROOT / "docs").rglob("*.md") if path.parent.name != "guide")
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
README_LINES = 200  # the README teaches; results and reference live in docs/


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


@pytest.mark.parametrize(
    "page", [p for p in DOCS if python_blocks(p)], ids=lambda p: str(p.relative_to(ROOT / "docs"))
)
def test_docs_page_runs(page: Path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_blocks(python_blocks(page), str(page.relative_to(ROOT)))


def test_readme_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "the README has no Python block"
    run_blocks(blocks, "README.md")


def test_readme_is_short_and_its_links_exist() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_LINES
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"the README links to files that do not exist: {missing}"


def results_build():
    spec = importlib.util.spec_from_file_location("results_build", ROOT / "docs" / "results" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def test_results_pages_are_made_from_their_data() -> None:
    build = results_build()
    pages = build.build()
    names = {path.name for path in pages}
    assert names == {"index.md", "heads.md", "ioi.md", "circuits.md", "icl.md", "performance.md"}
    for path, text in pages.items():
        assert path.read_text() == text, f"{path.name} is out of date: run python docs/results/build.py"
        assert "**Machine**" in text or path.name == "index.md"
        shows_nan = re.search(r"\bnan\b", text, re.IGNORECASE)
        assert not shows_nan, f"{path.name} shows a NaN: say why there is none"
    for data in (ROOT / "docs" / "results" / "data").iterdir():
        assert data.stat().st_size < 1_000_000, f"{data.name}: store a summary, not the whole result"


def test_compared_figures_come_from_the_saved_results() -> None:
    """A section that compares the page's saved results takes each figure from them, or quotes one
    that another section of the page gives: a figure copied by hand that the data no longer give
    fails here. The sources are saved sections of the same page, so the reader sees them."""
    build = results_build()

    def figures(text: str) -> set[str]:
        return {figure.replace("−", "-").lstrip("+") for figure in build.FIGURE.findall(text)}

    compared = 0
    for name in build.PAGES:
        sections = build.page_spec(name)["sections"]
        saved = {section["saved"] for section in sections if section["kind"] == "saved"}
        texts = {section["title"]: "\n".join(build.section_text(section)) for section in sections}
        for section in (section for section in sections if "figures_from" in section):
            compared += 1
            title = f"{name}.md, {section['title']}"
            assert set(section["figures_from"].values()) <= saved, f"{title}: cites a result not on the page"
            elsewhere = figures("\n".join(text for other, text in texts.items() if other != section["title"]))
            by_hand = figures("\n".join(build.hand_figures(section))) - elsewhere - {"95%"}  # the CIs' level
            assert not by_hand, f"{title}: figures no saved result or other section gives: {sorted(by_hand)}"
    assert compared >= 4  # the side-by-side sections of the heads, IOI, circuits and ICL pages
