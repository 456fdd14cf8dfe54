"""interp's modules import each other in one direction (no cycles, counting imports inside
functions; imports under TYPE_CHECKING are for annotations only and do not count)."""

from __future__ import annotations

import ast
from pathlib import Path

import interp

PACKAGE = Path(interp.__file__).parent


def _type_checking_imports(tree: ast.Module) -> set[int]:
    return {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
        for node in ast.walk(block)
    }


def _imports() -> dict[str, set[str]]:
    """module -> interp modules it imports at run time."""
    edges = {}
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        skip = _type_checking_imports(tree)
        names = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("interp."):
                names.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("interp.")}
        edges[path.stem] = names - {path.stem}
    return edges


def test_no_import_cycles_in_interp() -> None:
    edges = _imports()
    assert {"model", "loading", "checkpoint", "architectures"} <= set(edges)

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for module in edges.get(todo.pop(), ()):
                if module not in seen:
                    seen.add(module)
                    todo.append(module)
        return seen

    cycles = sorted(module for module in edges if module in reachable(module))
    involved = {m: sorted(edges[m]) for m in cycles}
    assert not cycles, f"import cycles through {cycles}: {involved}"
