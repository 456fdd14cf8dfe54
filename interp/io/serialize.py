"""Results as JSON, never pickled: `encode` turns a value into JSON data, `decode` turns it back.

Loading runs no code: a dataclass is rebuilt only if its type was registered (`register_dataclass`),
by name. One format serves the result files of `interp ... --save` (`circuits.results_file`) and the
resume store of `interp.runtime.distributed.map_shards`:

    value                      JSON
    None, bool, int, str       itself
    float                      itself; NaN and infinities as {"__float__": "nan" | "inf" | "-inf"}
    list                       a list
    tuple                      {"__tuple__": [...]}
    dict (any hashable keys)   {"__items__": [[key, value], ...]}
    torch.Tensor               {"__tensor__": nested list, "dtype": "float32", "shape": [...]}, or, with
                               `tensors=` given, {"__tensor__": name} and the tensor in tensors[name]
    numpy array                {"__array__": ...}, as a tensor ("dtype" is numpy's; by name only if it holds
                               numbers); numpy scalars as plain numbers
    pandas DataFrame           {"__frame__": [column names], "index": [...], "index_names": [...] (two or
                               more: a MultiIndex), "values": [[column], ...], "dtypes": ["int64", ...]}
    registered dataclass       {"__dataclass__": "Name", "fields": {name: value}} (its init fields)
    function                   null with `drop_callables=True` (a task's metric: not stored), else refused

NaN and infinity: JSON has neither, so a non-finite float, wherever it stands (a plain value, an
element of a tensor, array or frame column), is the object {"__float__": "nan"}, {"__float__": "inf"}
or {"__float__": "-inf"}, and the text is strict JSON: write it with `json.dumps(data, allow_nan=False)`.
`decode` also reads the bare NaN / Infinity tokens of files written before this rule (Python's
`json.loads` parses them), and a "__frame__" that maps column names to values (results files).

`plain` is the other direction's plain form, for people and scripts, never read back: numbers as
numbers, NaN and infinities as null, tuples as lists, tensors and arrays as nested lists, frames as
lists of rows, dataclasses as objects of their fields (what `--format json` prints).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

_DATACLASSES: dict[str, type] = {}


def register_dataclass(cls: type) -> type:
    """Let `encode` and `decode` store instances of the dataclass `cls` (by its qualified name; its
    fields must be storable). Returns cls, so it works as a decorator."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"only dataclasses can be registered for storing, got {cls!r}")
    name = cls.__qualname__
    known = _DATACLASSES.get(name)
    if known is not None and known is not cls and known.__module__ != cls.__module__:
        raise ValueError(
            f"two dataclasses are named {name}: {known.__module__}.{name} is registered already, "
            f"so {cls.__module__}.{name} cannot be; rename one"
        )
    _DATACLASSES[name] = cls  # the same name in the same module: a reloaded module replaces its class
    return cls


def encode(value: Any, tensors: dict[str, Tensor] | None = None, drop_callables: bool = False) -> Any:
    """`value` as JSON data (see the module doc). With `tensors` (a dict to fill), tensors and arrays
    go there by name (to be saved as safetensors) instead of inline as numbers."""

    def again(item: Any) -> Any:
        return encode(item, tensors, drop_callables)

    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, np.generic):
        return again(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(float(value))}
    if isinstance(value, Tensor | np.ndarray):
        return _array_data(value, tensors)
    if isinstance(value, pd.DataFrame):
        return {
            "__frame__": [again(c) for c in value.columns],
            "index": again(value.index.tolist()),
            "index_names": again(list(value.index.names)),
            "values": [again(value.iloc[:, i].tolist()) for i in range(value.shape[1])],
            "dtypes": [str(t) for t in value.dtypes],
        }
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if _DATACLASSES.get(type(value).__qualname__) is not type(value):
            raise TypeError(
                f"{type(value).__qualname__} is not a registered dataclass; register it with "
                "interp.io.serialize.register_dataclass to store it"
            )
        fields = {f.name: again(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return {"__dataclass__": type(value).__qualname__, "fields": fields}
    if isinstance(value, list):
        return [again(item) for item in value]
    if isinstance(value, tuple):
        return {"__tuple__": [again(item) for item in value]}
    if isinstance(value, dict):
        return {"__items__": [[again(k), again(v)] for k, v in value.items()]}
    if drop_callables and callable(value):
        return None
    raise TypeError(
        f"a value of type {type(value).__name__} cannot be stored as JSON; store tensors, arrays, numbers, "
        "strings, lists, tuples, dicts, DataFrames or dataclasses registered with register_dataclass"
    )


def plain(value: Any) -> Any:
    """`value` as plain JSON data (see the module doc): untagged, so not read back by `decode`.
    Dict keys that JSON cannot hold (a tuple, a head) become their text; anything else it cannot
    write (a function) is refused."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Tensor):
        return plain(value.detach().cpu().tolist())
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, pd.DataFrame):
        return plain(value.to_dict("records"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key if isinstance(key, str | int | float | bool) else str(key): plain(item)
                for key, item in value.items()}  # fmt: skip
    raise TypeError(f"a value of type {type(value).__name__} has no plain JSON form")


def _array_data(value: Tensor | np.ndarray, tensors: dict[str, Tensor] | None) -> dict:
    """A tensor or array: by name in `tensors` (an array only if it holds numbers), or inline."""
    if isinstance(value, np.ndarray):
        tag, dtype = "__array__", str(value.dtype)
        numbers = value.dtype.kind in "biuf"  # (np.ascontiguousarray makes a 0-d array 1-d)
        tensor = torch.from_numpy(np.require(value, requirements="C")) if numbers else None
    else:
        tag, dtype = "__tensor__", str(value.dtype).removeprefix("torch.")
        value = tensor = value.detach().cpu()
    if tensors is not None and tensor is not None:
        name = f"t{len(tensors)}"
        tensors[name] = tensor.contiguous()
        return {tag: name}
    finite = tensor is not None and (not tensor.is_floating_point() or bool(tensor.isfinite().all()))
    data = value.tolist() if finite else _numbers(value.tolist())
    return {tag: data, "dtype": dtype, "shape": list(value.shape)}


def decode(value: Any, tensors: Mapping[str, Tensor] | None = None) -> Any:
    """The value `encode` stored as `value` (tensors stored by name are looked up in `tensors`).
    Raises ValueError on data it does not know (an unregistered dataclass, an unknown tag)."""
    if isinstance(value, list):
        return [decode(item, tensors) for item in value]
    if not isinstance(value, dict):
        return value
    if "__float__" in value:
        return float(value["__float__"])
    if "__tensor__" in value:
        return _array(value, "__tensor__", tensors)
    if "__array__" in value:
        return _array(value, "__array__", tensors)
    if "__tuple__" in value:
        return tuple(decode(item, tensors) for item in value["__tuple__"])
    if "__items__" in value:
        return {_hashable(decode(k, tensors)): decode(v, tensors) for k, v in value["__items__"]}
    if "__frame__" in value:
        return _frame(value, tensors)
    if "__dataclass__" in value:
        cls = _DATACLASSES.get(value["__dataclass__"])
        if cls is None:
            raise ValueError(f"stored dataclass of unregistered type {value['__dataclass__']!r}")
        return cls(**{name: decode(field, tensors) for name, field in value["fields"].items()})
    raise ValueError(f"unknown stored value {str(value)[:80]!r}")


def _numbers(data: Any) -> Any:
    """A (nested) list of numbers with each non-finite float as {"__float__": ...}."""
    if isinstance(data, list):
        return [_numbers(item) for item in data]
    if isinstance(data, float) and not math.isfinite(data):
        return {"__float__": repr(data)}
    return data


def _floats(data: Any) -> Any:
    """`_numbers` undone: {"__float__": ...} back to floats."""
    if isinstance(data, list):
        return [_floats(item) for item in data]
    return float(data["__float__"]) if isinstance(data, dict) else data


def _array(value: dict, tag: str, tensors: Mapping[str, Tensor] | None) -> Tensor | np.ndarray:
    data = value[tag]
    if isinstance(data, str):  # stored by name beside the JSON
        if tensors is None or data not in tensors:
            raise ValueError(f"the stored tensor {data!r} is missing")
        return tensors[data] if tag == "__tensor__" else tensors[data].numpy()
    data = _floats(data)
    if tag == "__tensor__":
        result = torch.tensor(data, dtype=getattr(torch, value["dtype"]))
    else:
        result = np.array(data, dtype=value["dtype"])
    return result.reshape(value["shape"]) if "shape" in value else result


def _frame(value: dict, tensors: Mapping[str, Tensor] | None) -> pd.DataFrame:
    columns = value["__frame__"]
    if isinstance(columns, dict):  # results files before interp.io.serialize: {column: values}
        frame = pd.DataFrame({column: decode(values, tensors) for column, values in columns.items()})
        return frame.astype({c: d for c, d in value["dtypes"].items() if d != "object"})
    data = {i: decode(column, tensors) for i, column in enumerate(value["values"])}
    index, names = decode(value["index"], tensors), decode(value.get("index_names", [None]), tensors)
    index = (
        pd.MultiIndex.from_tuples(index, names=names) if len(names) > 1 else pd.Index(index, name=names[0])
    )
    frame = pd.DataFrame(data, index=index)
    frame = frame.astype({i: t for i, t in enumerate(value["dtypes"]) if t != "object"})
    frame.columns = [decode(c, tensors) for c in columns]
    return frame


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list | tuple) else key
