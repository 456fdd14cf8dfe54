"""TransformerLens 2.18's tests run on interp: the one list of tests skipped, each with its reason.

A test id is its path under tests/conformance and its name, without parameters
("integration/test_kv_cache.py::test_freeze_cache"), or with them to skip one parametrisation.
The reason shows in pytest's summary (`-ra`). See README.md in this directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

SKIPS: dict[str, str] = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.fspath)
        if HERE not in path.parents:
            continue
        relative = path.relative_to(HERE).as_posix()
        name = item.name
        base = item.originalname if hasattr(item, "originalname") else name
        cls = f"{item.cls.__name__}::" if item.cls is not None else ""
        for test_id in (f"{relative}::{cls}{name}", f"{relative}::{cls}{base}", relative):
            if test_id in SKIPS:
                item.add_marker(pytest.mark.skip(reason=SKIPS[test_id]))
                break
