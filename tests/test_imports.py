"""interp and circuits import each other in one direction, layer by layer, with no cycles.

Every import counts: module level, inside functions, under TYPE_CHECKING, `importlib.import_module`
and `sys.modules[...]` look-ups with a literal name. Importing interp has no side effects.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import circuits
import interp

ROOT = Path(interp.__file__).parent.parent

# Layers from the bottom up: a module may import modules of its own layer or of lower layers.
LAYERS = [
    ("interp.config", "interp.types", "interp.checks", "interp.catalog"),
    ("interp.io",),
    ("interp.model",),
    ("interp.interventions",),
    ("interp.edges",),
    ("interp.tasks",),
    ("interp.training", "interp.viz", "interp.runtime", "interp.compat"),
    ("interp",),  # the package's own __init__: the public API
    ("circuits",),
    ("circuits.cli",),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    """The highest layer whose prefix names `module` (the longest match wins)."""
    best, best_len = None, -1
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = rank, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _literal(node: ast.AST) -> str | None:
    """A module name written as a string: "interp.x" or f"interp.x.{name}" (its constant prefix)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        return str(node.values[0].value).rstrip(".")
    return None


def _imports(path: Path, module: str) -> set[str]:
    """Every interp/circuits module that `path` imports, wherever and however."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + [base]).strip(".")
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from interp import edges`
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args:
            found.add(_literal(node.args[0]) or "")
        elif isinstance(node, ast.Subscript) and getattr(node.value, "attr", "") == "modules":
            found.add(_literal(node.slice) or "")
    modules = _all_modules()
    return {name for name in found if name in modules and name != module}


def _all_modules() -> dict[str, Path]:
    paths = [*Path(interp.__file__).parent.rglob("*.py"), *Path(circuits.__file__).parent.rglob("*.py")]
    return {_module_name(path): path for path in paths}


def _graph() -> dict[str, set[str]]:
    return {module: _imports(path, module) for module, path in _all_modules().items()}


def test_every_module_imports_only_its_own_or_lower_layers() -> None:
    graph = _graph()
    assert {"interp.model.transformer", "interp.io.sources", "interp.edges.intervene"} <= set(graph)
    upward = sorted(
        f"{module} (layer {_layer(module)}) imports {target} (layer {_layer(target)})"
        for module, targets in graph.items()
        for target in targets
        if _layer(target) > _layer(module)
    )
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = _graph()

    def reachable(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for module in graph.get(todo.pop(), ()):
                if module not in seen:
                    seen.add(module)
                    todo.append(module)
        return seen

    cycles = sorted(module for module in graph if module in reachable(module))
    assert not cycles, f"import cycles through {cycles}: " + str({m: sorted(graph[m]) for m in cycles})


def test_circuits_uses_only_public_names_of_interp() -> None:
    private = []
    for module, path in _all_modules().items():
        if not module.startswith("circuits"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("interp"):
                private += [f"{module}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            is_private = isinstance(node, ast.Attribute) and node.attr.startswith("_") and node.attr[1] != "_"
            if (
                is_private
                and isinstance(node.value, ast.Name)
                and node.value.id in ("interp", "model", "edges")
            ):
                private.append(f"{module}: {node.value.id}.{node.attr}")
    assert not private, "circuits reaches into interp's private names:\n" + "\n".join(sorted(private))


def test_the_layer_test_sees_imports_inside_functions_and_type_checking() -> None:
    """The scanner must see what the old, module-level-only test missed."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from interp.model.transformer import HookedTransformer\n"
        "def f():\n    import importlib, sys\n    from interp.edges import graph\n"
        "    importlib.import_module('interp.tasks.ioi')\n    return sys.modules['interp.viz']\n"
    )
    path = ROOT / "interp" / "io" / "_probe_for_test_imports.py"
    path.write_text(source)
    try:
        found = _imports(path, "interp.io._probe_for_test_imports")
    finally:
        path.unlink()
    assert {"interp.model.transformer", "interp.edges.graph", "interp.tasks.ioi", "interp.viz"} <= found


def test_importing_interp_changes_nothing_in_the_process() -> None:
    """No output, no allocator policy: mallopt stays untouched until the CLI asks for it."""
    code = (
        "import interp, interp.edges, interp.tasks\n"
        "interp.patching, interp.ablation, interp.metrics\n"
        "from interp.runtime import memory\n"
        "print('policy', memory.POLICY_APPLIED)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "policy False"
    assert result.stderr == ""


def test_the_command_line_starts_without_torch() -> None:
    """`interp --help` imports neither torch nor transformers (it starts in a fraction of a second):
    the choices it lists come from `interp.catalog`, and every command imports what it runs."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from circuits.cli import app\n"
        "for args in ([], ['heads', '--help'], ['train', '--help'], ['patch', '--help']):\n"
        "    assert CliRunner().invoke(app, [*args, '--help'] if not args else args).exit_code == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'transformer_lens') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_clone_named_interp_in_the_current_directory_is_no_silent_namespace(tmp_path):
    """A script run from the directory above a clone named interp: Python takes the clone's folder
    (no __init__.py) for a namespace package `interp` when the install is pip's default editable
    finder. Installed as `make` does (a path) the package wins; otherwise importing circuits says
    what happened and what to do, not "cannot import name ... (unknown location)"."""
    clone = tmp_path / "interp"
    clone.mkdir()
    for name in ("interp", "circuits", "pyproject.toml"):
        (clone / name).symlink_to(ROOT / name)
    only_circuits = tmp_path / "path"  # this checkout's circuits, without putting interp on the path
    only_circuits.mkdir()
    (only_circuits / "circuits").symlink_to(ROOT / "circuits")
    script = tmp_path / "script.py"
    script.write_text("import circuits.cli\nfrom interp import metrics\nprint(metrics.__file__)\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(only_circuits), "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env)
    if run.returncode == 0:
        assert run.stdout.strip().endswith("interp/interventions/metrics.py"), run.stdout
    else:
        assert "found the folder" in run.stderr and str(clone) in run.stderr, run.stderr[-800:]
        assert "editable_mode=compat" in run.stderr and "unknown location" not in run.stderr
