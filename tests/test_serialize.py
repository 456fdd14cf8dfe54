"""One atomic write (`interp.io.files`) and one JSON format (`interp.io.serialize`) for results files
(`circuits.results_file`) and the map_shards resume store (`interp.runtime.distributed`)."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from rich.console import Console
from safetensors.torch import save_file

from circuits.results_file import SCHEMA, load_result, save_result, write_result_report
from interp.io.files import atomic_dir, atomic_path, atomic_write, write_text_atomic
from interp.io.serialize import decode, encode, plain, register_dataclass
from interp.runtime.distributed import map_shards

DATA = Path(__file__).parent / "data"


@register_dataclass
@dataclass
class Inner:
    scores: torch.Tensor
    frame: pd.DataFrame


@register_dataclass
@dataclass
class Outer:
    name: str
    inner: Inner
    by_head: dict
    pair: tuple
    ratio: float
    array: np.ndarray
    notes: list = field(default_factory=list)


def _value() -> Outer:
    nan, inf = float("nan"), float("inf")
    frame = pd.DataFrame({"head": ["L0H1", "L1H0", "L1H2"], "score": [0.5, nan, -inf], 3: [1, 2, 3]})
    frame.index = [10, 20, 30]
    inner = Inner(torch.tensor([[1.0, nan], [inf, -inf]]), frame)
    return Outer(
        name="run",
        inner=inner,
        by_head={(0, 1): torch.arange(3), "half": torch.tensor([0.5, nan], dtype=torch.bfloat16), 2: [inf]},
        pair=(nan, 1.5, None, True),
        ratio=-inf,
        array=np.array([[1.0, np.nan]], dtype=np.float32),
        notes=[
            torch.zeros(0, 3),
            np.array(["a", "bc"]),
            {"deep": [(1, {"x": nan})]},
            np.array(1.5),  # 0-d: stored by name it came back of shape (1,)
            pd.DataFrame(  # index names and a MultiIndex came back as one unnamed index of tuples
                {"score": [0.1, 0.2, 0.3]},
                index=pd.MultiIndex.from_tuples([(0, 1), (1, 0), (1, 2)], names=["layer", "head"]),
            ),
            pd.DataFrame({"score": [0.1, 0.2]}, index=pd.Index(["a", "b"], name="key")),
        ],
    )


def _assert_same(a, b) -> None:
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    elif isinstance(a, float):
        assert a == b or (math.isnan(a) and math.isnan(b))
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif hasattr(a, "__dataclass_fields__"):
        for name in a.__dataclass_fields__:
            _assert_same(getattr(a, name), getattr(b, name))
    else:
        assert a == b


@pytest.mark.parametrize("where", ["inline", "side file"])
def test_one_format_round_trips_dataclasses_tensors_frames_nan_and_inf(where):
    value = _value()
    tensors = {} if where == "side file" else None
    text = json.dumps(encode(value, tensors), allow_nan=False)  # strict JSON: no bare NaN / Infinity
    assert "NaN" not in text and "Infinity" not in text and '{"__float__": "nan"}' in text
    assert (tensors is not None) == ('__tensor__": "t0"' in text)
    _assert_same(decode(json.loads(text), tensors), value)
    assert encode([np.float32(1.5), np.int64(2), np.float64("nan")]) == [1.5, 2, {"__float__": "nan"}]


def test_plain_json_holds_numbers_as_numbers_and_nan_as_null():
    """`--format json`'s form (`circuits.sections.result_json`): untagged, strict, every number a number."""
    data = plain(_value())
    text = json.dumps(data, allow_nan=False)  # strict JSON
    assert "__" not in text  # no type tags
    assert data["inner"]["scores"] == [[1.0, None], [None, None]] and data["ratio"] is None
    rows = [("L0H1", 0.5, 1), ("L1H0", None, 2), ("L1H2", None, 3)]
    assert data["inner"]["frame"] == [{"head": head, "score": score, 3: n} for head, score, n in rows]
    assert data["by_head"] == {"(0, 1)": [0, 1, 2], "half": [0.5, None], 2: [None]}
    assert data["pair"] == [None, 1.5, None, True] and data["array"] == [[1.0, None]]
    assert data["notes"][:4] == [[], ["a", "bc"], {"deep": [[1, {"x": None}]]}, 1.5]
    assert plain([np.float32(1.5), np.int64(2)]) == [1.5, 2] and type(plain(np.int64(2))) is int
    with pytest.raises(TypeError, match="no plain JSON form"):
        plain({"metric": len})


def test_the_format_refuses_what_it_cannot_hold_and_reads_no_unknown_type():
    @dataclass
    class Unregistered:
        x: int

    for bad in (Unregistered(1), {1, 2}, b"bytes", object()):
        with pytest.raises(TypeError, match="cannot be stored|not a registered dataclass"):
            encode(bad)
    assert encode({"metric": len}, drop_callables=True) == {"__items__": [["metric", None]]}
    with pytest.raises(ValueError, match="unregistered type 'Nope'"):
        decode({"__dataclass__": "Nope", "fields": {}})


def test_results_files_and_the_shard_store_write_the_same_json(tmp_path):
    """Both write interp.io.serialize's format: the store with its tensors in a safetensors file."""
    value = _value()
    (stored,) = map_shards(lambda v: v, [value], store=tmp_path, job="same")
    again = map_shards(lambda v: 1 / 0, [value], store=tmp_path, job="same")[0]  # loaded
    for result in (stored, again):
        _assert_same(result, value)
    (shard,) = tmp_path.glob("*/shard_00000.json")
    record = json.loads(shard.read_text())
    assert record["format"] == "interp-shard-result-2" and shard.with_suffix(".safetensors").is_file()
    assert record["result"] == encode(value, {})  # the same encoder, tensors by name

    report = load_result(DATA / "patch-result-1.json")
    report.result.extra = {"value": value}
    save_result(report, tmp_path / "report.json")
    document = json.loads((tmp_path / "report.json").read_text())
    assert document["result"] == encode(report, drop_callables=True)  # the same encoder, tensors inline
    _assert_same(load_result(tmp_path / "report.json").result.extra["value"], value)


@pytest.mark.filterwarnings("ignore:.*bootstrap resamples give an undefined value")
def test_a_result_file_of_the_previous_schema_still_loads(tmp_path):
    """tests/data/patch-result-1.json was written by `save_result` at 8ef2c98 (schema interp-result-1,
    bare NaN / Infinity tokens, frames as {column: values}): `interp patch --model toy-ioi --n-prompts 4
    --top 3` with NaN, inf and -inf put into its values, and a frame, floats, an array and a bfloat16
    tensor into its `extra`."""
    old = load_result(DATA / "patch-result-1.json")
    values = old.result.values
    assert math.isnan(values[0, 0]) and values[1, 1] == math.inf and values[2, 2] == -math.inf
    assert list(old.result.index.columns) == ["component", "layer", "head", "position"]
    extra = old.result.extra
    assert math.isnan(extra["nan"]) and extra["inf"] == math.inf
    expected = pd.DataFrame({"w": [1.5, float("nan"), -math.inf], "name": ["a", "b", "c"]})
    pd.testing.assert_frame_equal(extra["weights"], expected.astype({"name": extra["weights"]["name"].dtype}))
    assert extra[("pair", 1)].dtype == np.float32 and extra["half"].dtype == torch.bfloat16

    save_result(old, tmp_path / "new.json")
    assert json.loads((tmp_path / "new.json").read_text())["schema"] == SCHEMA != "interp-result-1"
    new = load_result(tmp_path / "new.json")
    _assert_same(new, old)
    for result, out in ((old, "old.md"), (new, "new.md")):
        write_result_report(result, "markdown", tmp_path / out, Console())
    assert (tmp_path / "old.md").read_text() == (tmp_path / "new.md").read_text()


def test_an_ioi_result_of_effects_ablated_minus_clean_loads_as_drops(tmp_path):
    """tests/data/ioi-result-ablated-minus-clean.json is docs/results/data/ioi-toy-ioi.json as saved at
    399279e (its example patterns left out): IOI's held-out class effects ablated - clean, each stratum
    a StratumEffect. It loads with every effect negated into a drop (clean - ablated), the class
    directions with it, each class a ClassVerdict, and the verdicts unchanged."""
    stored = json.loads((DATA / "ioi-result-ablated-minus-clean.json").read_text())
    classes = dict(stored["result"]["fields"]["validation"]["fields"]["classes"]["__items__"])
    finding = load_result(DATA / "ioi-result-ablated-minus-clean.json")
    assert [c.name for c in finding.classes] == list(classes) and classes
    for found in finding.classes:
        name = found.name
        old, tested = classes[name]["fields"], found.heldout
        assert (found.name, found.sign, tested.drop, tested.random_drop) == (
            name,
            -old["sign"],
            -old["effect"],
            -old["random_effect"],
        )
        low, high = old["difference_ci"]["__tuple__"]
        assert (tested.beyond, tested.beyond_ci) == (-old["difference"], (-high, -low))
        assert found.verdict == old["verdict"] and tested.n_prompts == finding.extras.heldout.n_prompts
        assert [s.name for s in found.strata if s.holds] == old["holds_in"]
        assert list(found.details["heterogeneity"].values()) == old["heterogeneity"]["__tuple__"]
        for stratum, older in zip(found.strata, old["strata"], strict=True):
            older = older["fields"]
            assert (stratum.kind, stratum.name, stratum.holds) == (
                older["kind"],
                older["name"],
                older["holds"],
            )
            assert stratum.beyond == -older["difference"] and stratum.example == older["example"]
    save_result(load_result(DATA / "ioi-result-ablated-minus-clean.json"), tmp_path / "new.json")
    assert plain(load_result(tmp_path / "new.json")) == plain(finding)  # the drop CIs NaN


def test_an_ioi_result_of_path_patching_effects_patched_minus_clean_loads_as_drops(tmp_path):
    """The same file (schema interp-result-2) stored IOI's path-patching effects as patched - clean. It
    loads with them negated into drops (clean - patched): each head's effect and robust z, the effect
    grids and the selections' medians; the attention thresholds stay. The step's heads, selected again
    from the loaded grid in the drops' direction (+1: the heads that help), are those the file holds."""
    from circuits.evidence import select_heads

    path = DATA / "ioi-result-ablated-minus-clean.json"
    stored = json.loads(path.read_text())
    assert stored["schema"] == "interp-result-2"
    fields = stored["result"]["fields"]
    finding = load_result(path)
    result = finding.extras
    old_heads = dict(fields["classes"]["__items__"])
    for cls, found in result.class_heads.items():
        older = [h["fields"] for h in old_heads[cls]]
        assert [(h.layer, h.head, h.step) for h in found] == [
            (h["layer"], h["head"], h["step"]) for h in older
        ]
        assert [(h.effect, h.z) for h in found] == [(-h["effect"], -h["z"]) for h in older]
    older = [h["fields"] for h in fields["unclassified"]]
    assert [(h.effect, h.z) for h in result.unclassified] == [(-h["effect"], -h["z"]) for h in older]
    for step, grid in fields["effects"]["__items__"]:
        torch.testing.assert_close(result.effects[step], -decode(grid), equal_nan=True, rtol=0, atol=0)
    for label, figures in fields["thresholds"]["__items__"]:
        figures = dict(figures["__items__"])
        expected = {**figures, "median": -figures["median"]} if "median" in figures else figures
        assert result.thresholds[label] == expected
    s = finding.settings
    chosen, _, _ = select_heads(result.effects["logits"], 1, s.effect_z, s.min_effect, s.min_share)
    assert chosen == result.circuit["s_suppression"] == [(1, 0), (1, 2), (1, 3), (1, 1)]
    assert result.class_heads["s_suppression"][0].effect > 0  # the strongest head helps: a positive drop
    save_result(finding, tmp_path / "new.json")  # this schema: read as it is, not negated again
    again = load_result(tmp_path / "new.json").extras
    assert again.class_heads == result.class_heads and again.thresholds == result.thresholds


def test_a_store_is_read_only_by_the_code_that_wrote_it(tmp_path):
    """A store's key holds interp's source (`source_code.source_key`): shards of the same job stored by other
    code (another version, or a checkout edited since) are not read, but computed again."""
    from interp.runtime import distributed

    (first,) = map_shards(
        lambda _: {"scores": torch.tensor([1.0, float("nan")])}, [None], store=tmp_path, job="j"
    )
    (again,) = map_shards(lambda _: 1 / 0, [None], store=tmp_path, job="j")  # read back, not run
    _assert_same(again["scores"], first["scores"])
    package = tmp_path / "edited" / "interp"
    shutil.copytree(distributed.INTERP_SOURCE, package, ignore=shutil.ignore_patterns("__pycache__", "data"))
    (package / "runtime" / "keys.py").write_text(
        (package / "runtime" / "keys.py").read_text() + "\n# edited\n"
    )
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(distributed, "INTERP_SOURCE", package)
        (fresh,) = map_shards(lambda _: {"scores": torch.tensor([2.0])}, [None], store=tmp_path, job="j")
    _assert_same(fresh["scores"], torch.tensor([2.0]))


@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_an_interrupted_atomic_write_leaves_the_old_file_and_no_temporary_file(tmp_path, interrupt):
    path = tmp_path / "out" / "report.txt"
    assert write_text_atomic(path, "old ✓") == path  # makes out/
    with pytest.raises(interrupt), atomic_write(path) as file:
        file.write("half of the new")
        file.flush()
        raise interrupt
    with pytest.raises(interrupt), atomic_path(path) as tmp:
        tmp.write_text("half of the new")
        raise interrupt
    with pytest.raises(TypeError):
        write_text_atomic(path, None)  # fails mid-write
    assert path.read_text(encoding="utf-8") == "old ✓"
    assert os.listdir(path.parent) == ["report.txt"]

    with atomic_write(path, "wb") as file:
        file.write(b"\x00new")
    assert path.read_bytes() == b"\x00new" and os.listdir(path.parent) == ["report.txt"]
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # an ordinary file, not mkstemp's 0o600


@pytest.mark.parametrize("interrupt", [RuntimeError, KeyboardInterrupt])
def test_an_interrupted_atomic_directory_write_leaves_the_old_directory(tmp_path, interrupt):
    directory = tmp_path / "checkpoint"
    with atomic_dir(directory) as tmp:
        (tmp / "config.json").write_text("old")
    with pytest.raises(interrupt), atomic_dir(directory) as tmp:
        (tmp / "config.json").write_text("new")
        raise interrupt
    assert (directory / "config.json").read_text() == "old" and os.listdir(tmp_path) == ["checkpoint"]
    with atomic_dir(directory) as tmp:
        (tmp / "weights").write_text("new")
        save_file({"w": torch.zeros(2)}, tmp / "model.safetensors")  # safetensors writes it 0o600
    assert sorted(os.listdir(directory)) == ["model.safetensors", "weights"]
    assert os.listdir(tmp_path) == ["checkpoint"]
    assert directory.stat().st_mode & 0o777 == 0o777 & ~_umask()
    # a checkpoint's weights readable by whoever may read the directory, as an ordinary file
    assert (directory / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_an_interrupt_between_the_renames_of_a_directory_leaves_the_old_one(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoint"
    with atomic_dir(directory) as tmp:
        (tmp / "config.json").write_text("old")
    rename = Path.rename

    def interrupted_after_the_first(self, target):
        rename(self, target)
        monkeypatch.setattr(Path, "rename", rename)
        raise KeyboardInterrupt  # lands after the old directory moved aside, before the new one is in place

    monkeypatch.setattr(Path, "rename", interrupted_after_the_first)
    with pytest.raises(KeyboardInterrupt), atomic_dir(directory) as tmp:
        (tmp / "config.json").write_text("new")
    assert (directory / "config.json").read_text() == "old"


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_older_ioi_files_name_held_out_templates_as_runs_do_now_and_untested_dependence_as_such():
    """Files saved before held-out templates were numbered after the discovery ones (T15..T28) named
    held-out template k "Tk": their strata read as discovery templates. They are renamed as now. A
    "<kind>-dependent" verdict saved before the dependence test shows no p: its cell says "not tested"
    and a legend line says what the verdict meant then."""
    from circuits.results_file import load_result
    from circuits.sections import ClassView, class_sections
    from interp.tasks.ioi_templates import BABA_TEMPLATES, HELDOUT_TEMPLATES

    found = load_result("tests/data/ioi-smollm2.json")
    strata = [s for c in found.classes for s in c.strata if s.kind == "template"]
    assert strata and all(int(s.name[1:]) >= len(BABA_TEMPLATES) for s in strata)
    assert {s.name for s in strata} <= set(found.tested["templates"])
    first = next(s for s in strata if s.example)
    assert first.example.split(",")[0] in HELDOUT_TEMPLATES[int(first.name[1:]) - len(BABA_TEMPLATES)]
    older = load_result("tests/data/ioi-result-ablated-minus-clean.json")
    untested = [c for c in older.classes if c.verdict.endswith("-dependent")]
    assert untested and all(c.verdict.removesuffix("-dependent") not in c.differ_p for c in untested)
    section = [
        s
        for s in class_sections(older.classes, ClassView())
        if s.table and "kind differs, p" in s.table.columns
    ]
    cells = [row[-1] for row in section[0].table.rows]
    assert "not tested" in cells and any(
        "judged before the dependence test" in line for line in section[0].lines
    )
