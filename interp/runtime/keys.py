"""Keys of resumable jobs: hashes of what a job's results depend on, by content, so that the same job
run again (in a new process too) finds its stored results and a changed one does not.

`content_key(value)` hashes tensors by their bytes (and the padding mask token ids carry), containers
by their items, dataclasses and plain objects by their fields and their class, and functions by their
code, defaults, closures and the values of the globals they read, so that editing a metric or changing
a tensor it reads changes the key. The user's own code (`_by_code`: a script, a notebook, a module
beside them) is hashed by its code wherever it is met: functions, classes (their methods), the class of
an object, a module a function reads (its source file); interp's and installed packages' by name
(`interp.io.source_code.source_key` keys interp's source). Pickled bytes are no key: a tensor's pickle
holds its storage's address, and a function's pickle only its name.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import sysconfig
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from interp.io.source_code import source_key
from interp.model.tokens import recorded_padding

LIBRARY_DIRS = tuple(
    Path(path).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (path := sysconfig.get_paths().get(key))
)  # fmt: skip


@functools.cache
def _by_code(module_name: str | None) -> bool:
    """Whether the functions and classes of this module are keyed by their code: the user's own (a
    script, a notebook's `__main__`, a module beside them), not interp's (its source is in the jobs'
    keys), the standard library's or an installed package's (by name)."""
    if not module_name or module_name.partition(".")[0] == "interp":
        return False
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if file is None:
        return module_name == "__main__"  # a notebook's or an interactive session's
    path = Path(file).resolve()
    return not any(path.is_relative_to(directory) for directory in LIBRARY_DIRS)


def tensor_bytes(tensor: Tensor) -> memoryview:
    """Every byte of a tensor (any dtype, bfloat16 included) as a buffer for a hash."""
    flat = tensor.detach().reshape(-1).contiguous().cpu()
    return memoryview(flat.view(torch.uint8).numpy())


def content_key(value: Any) -> str:
    """A 32-hex-digit sha256 of `value`'s content (see the module doc)."""
    digest = hashlib.sha256()
    add_content(digest, value)
    return digest.hexdigest()[:32]


def add_content(digest: Any, value: Any, known: Sequence[Any] = ()) -> None:
    """Feed `value`'s content to a hashlib `digest`; the objects `known` (hashed already) by place only."""
    hasher = _Hasher(digest)
    hasher.seen.update({id(item): (f"known {i}", item) for i, item in enumerate(known)})
    hasher.add(value)


class _Hasher:
    def __init__(self, digest: Any) -> None:
        self.digest = digest
        # id -> (the order it was met in, the object: kept alive so that no other takes its id)
        self.seen: dict[int, tuple[Any, Any]] = {}

    def put(self, *parts: Any) -> None:
        self.digest.update(json.dumps([str(part) for part in parts]).encode())

    def add(self, value: Any) -> None:
        if value is None or isinstance(value, bool | int | float | complex | str | bytes):
            self.put(type(value).__name__, repr(value))
            return
        if id(value) in self.seen:  # a cycle, or an object met before: which one it is is enough
            self.put("again", self.seen[id(value)][0])
            return
        self.seen[id(value)] = (len(self.seen), value)
        if isinstance(value, Tensor):
            self.put("tensor", value.dtype, tuple(value.shape))
            if not value.is_meta:
                self.digest.update(tensor_bytes(value))
            self.add(recorded_padding(value))
        elif isinstance(value, np.ndarray):
            self.put("ndarray", value.dtype, value.shape)
            self.digest.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, torch.Generator):
            self.put("generator")
            self.add(value.get_state())
        elif isinstance(value, nn.Module):
            self.put("module", type(value).__qualname__)
            self.add(dict(value.state_dict()))
            self.add(type(value))
        elif isinstance(value, pd.DataFrame | pd.Series):
            self.put("pandas", type(value).__name__)
            self.add(value.to_dict())
        elif isinstance(value, Mapping):
            self.put("mapping", type(value).__qualname__, len(value))
            for key, item in sorted(value.items(), key=lambda pair: repr(pair[0])):
                self.add(key)
                self.add(item)
        elif isinstance(value, list | tuple | set | frozenset):
            items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
            self.put(type(value).__qualname__, len(items))
            for item in items:
                self.add(item)
        elif isinstance(value, functools.partial):
            self.put("partial")
            self.add((value.func, value.args, value.keywords))
        elif isinstance(value, types.FunctionType):
            self._function(value)
        elif isinstance(value, types.MethodType):
            self.put("method")
            self.add((value.__func__, value.__self__))
        elif isinstance(value, type):
            self._class(value)
        elif isinstance(value, types.ModuleType | types.BuiltinFunctionType):
            self.put(
                type(value).__name__, getattr(value, "__module__", ""), getattr(value, "__qualname__", value)
            )
        elif dataclasses.is_dataclass(value):
            self.put("dataclass", type(value).__module__, type(value).__qualname__)
            self.add({field.name: getattr(value, field.name) for field in dataclasses.fields(value)})
            self.add(type(value))
        elif hasattr(value, "__dict__"):
            self.put("object", type(value).__module__, type(value).__qualname__)
            self.add(vars(value))
            self.add(type(value))
        else:
            self.put("other", type(value).__qualname__, repr(value))

    def _class(self, cls: type) -> None:
        """A class by name; the user's own (`_by_code`), and their bases of the user's, by the code of
        their methods too (static and class methods and properties included)."""
        self.put("class", cls.__module__, cls.__qualname__)
        for klass in cls.__mro__:
            if not _by_code(klass.__module__):
                continue
            for name, member in sorted(vars(klass).items()):
                for part in (member.fget, member.fset) if isinstance(member, property) else (member,):
                    function = getattr(part, "__func__", part)  # staticmethod, classmethod
                    if isinstance(function, types.FunctionType):
                        self.put("method", klass.__qualname__, name)
                        self.add(function)

    def _function(self, function: types.FunctionType) -> None:
        """A function by its code, defaults, closure and the globals its code reads."""
        self.put("function", function.__module__, function.__qualname__)
        self._code(function.__code__)
        self.add((function.__defaults__, function.__kwdefaults__))
        cells = []
        for cell in function.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # a cell not yet filled
                cells.append(None)
        self.add(cells)
        for name in sorted(_global_names(function.__code__)):
            if name not in function.__globals__:
                continue
            value = function.__globals__[name]
            if isinstance(value, types.ModuleType):  # the user's own module: its source file
                file = getattr(value, "__file__", None)
                if _by_code(value.__name__) and file is not None and file.endswith(".py"):
                    self.put("global module", name, source_key(Path(file)))
            elif isinstance(value, types.FunctionType | type) and not _by_code(value.__module__):
                self.put("global", name, value.__module__, value.__qualname__)  # a library's: by name
            else:
                self.put("global", name)
                self.add(value)

    def _code(self, code: types.CodeType) -> None:
        self.put("code", code.co_code.hex(), code.co_names, code.co_varnames)
        for constant in code.co_consts:
            if isinstance(constant, types.CodeType):
                self._code(constant)
            else:
                self.add(constant)


def _global_names(code: types.CodeType) -> set[str]:
    """The names a code object (and the code nested in it) may read as globals."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names
