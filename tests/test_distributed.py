"""Sweeps on Ray: a local cluster of 2 workers (conftest's ray_cluster); shards merge into the single-process
result, a failed shard is retried, and an interrupted sweep resumes from its finished shards."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import Tensor

import interp
from interp import metrics
from interp.interventions.engine import RunOptions
from interp.interventions.patching import activation_patching
from interp.model.tokens import record_padding
from interp.runtime.distributed import RayCluster, Workers, map_shards, patching_sweep, source_version
from interp.runtime.keys import content_key
from interp.tasks.ioi import ioi_dataset_for


def threads_and_square(x: int) -> tuple[int, int, int]:
    return torch.get_num_threads(), os.getpid(), x * x


def test_map_shards_on_ray_equals_this_process(ray_cluster):
    on_ray = map_shards(threads_and_square, range(6), ray="local")
    here = map_shards(threads_and_square, range(6))
    assert [r[2] for r in on_ray] == [r[2] for r in here] == [x * x for x in range(6)]
    assert {r[0] for r in on_ray} == {1}  # workers run torch on one thread each
    assert os.getpid() not in {r[1] for r in on_ray}


def record_call(directory: Path, shard: int) -> None:
    (directory / f"call-{shard}-{os.getpid()}-{time.time_ns()}").touch()


def calls(directory: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in directory.glob("call-*"))


def flaky(args: tuple[Path, int]) -> int:
    """Shard 1 fails on its first attempt (a marker file remembers the attempt across workers)."""
    directory, shard = args
    record_call(directory, shard)
    marker = directory / "failed-once"
    if shard == 1 and not marker.exists():
        marker.touch()
        raise RuntimeError("a transient failure")
    return shard * 10


def test_failed_shard_is_retried(ray_cluster, tmp_path):
    shards = [(tmp_path, i) for i in range(3)]
    assert map_shards(flaky, shards, ray="local") == [0, 10, 20]
    assert calls(tmp_path) == [0, 1, 1, 2]


def broken_while_flagged(args: tuple[Path, int]) -> int:
    directory, shard = args
    record_call(directory, shard)
    if shard == 2 and (directory / "broken").exists():
        raise RuntimeError("shard 2 is broken")
    return shard + 100


def test_interrupted_sweep_resumes_from_finished_shards(ray_cluster, tmp_path):
    calls_dir = tmp_path / "calls"
    calls_dir.mkdir()
    (calls_dir / "broken").touch()
    shards = [(calls_dir, i) for i in range(4)]
    run = dict(ray=RayCluster("local", max_retries=1), store=tmp_path / "store", job="resume-test")
    with pytest.raises(RuntimeError, match="1 shard"):
        map_shards(broken_while_flagged, shards, **run)
    assert calls(calls_dir) == [0, 1, 2, 2, 3]  # shard 2: the first attempt and one retry
    stored = sorted(p.name for p in (tmp_path / "store").glob("*/shard_*.json"))
    assert stored == ["shard_00000.json", "shard_00001.json", "shard_00003.json"]
    (calls_dir / "broken").unlink()
    assert map_shards(broken_while_flagged, shards, **run) == [100, 101, 102, 103]
    assert calls(calls_dir) == [0, 1, 2, 2, 2, 3]  # only shard 2 ran again


def _scaled(x: Tensor) -> Tensor:
    return x * 10


def test_a_stored_job_is_keyed_by_content_so_it_resumes_in_a_new_process_and_not_after_an_edit(tmp_path):
    """The default job key hashes tensors by their bytes (a tensor's pickle holds its storage's address,
    so equal prompts made anew, as in a new process, found none of their stored shards) and functions
    by their code (a pickle names a module-level function only, so an edited one got the old results)."""
    shards = [torch.arange(3), torch.arange(3, 6)]
    assert content_key(torch.arange(3)) == content_key(torch.arange(3))
    assert content_key(torch.arange(3)) != content_key(torch.arange(3.0))
    first, second = torch.zeros(2), torch.ones(2)
    assert content_key([first, second, first]) != content_key([first, second, second])  # which one repeats
    first = map_shards(_scaled, shards, store=tmp_path)
    again = [torch.arange(3), torch.arange(3, 6)]  # equal values, other storage
    seen = []
    assert all(
        map(
            torch.equal, map_shards(_scaled, again, store=tmp_path, progress=lambda *a: seen.append(a)), first
        )
    )
    assert seen[0] == ("Shards", 2, 2)  # both found in the store
    namespace: dict = {}
    exec("def _scaled(x):\n    return x * 1000\n", namespace)  # the same name, edited
    namespace["_scaled"].__module__ = _scaled.__module__
    assert torch.equal(map_shards(namespace["_scaled"], shards, store=tmp_path)[0], torch.arange(3) * 1000)
    factor = torch.tensor(7)
    assert content_key(lambda x: x * factor) != content_key(lambda x: x * torch.tensor(8))  # closures' values


def test_a_key_follows_the_users_code_in_classes_and_modules_it_reads(tmp_path, monkeypatch):
    """A metric that is an instance of the user's class, or a function calling another module of the
    user's (`helper.f(x)`): editing the class's method or the module left the key as it was (a class by
    name, a module not at all), so a store returned the old code's results. interp's and installed
    packages' code stays keyed by name (interp's source is in every job's key)."""
    import importlib
    import sys

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no .pyc of the same second and size
    source = tmp_path / "user_metric.py"
    keys = []
    for body in ("logits[:, -1, 3] - logits[:, -1, 4]", "logits[:, -1, 5] - logits[:, -1, 6]"):
        source.write_text(
            f"class Metric:\n    def __call__(self, logits):\n        return {body}\n\n"
            f"def f(x):\n    return {body.replace('logits', 'x')}\n"
        )
        sys.modules.pop("user_metric", None)
        importlib.invalidate_caches()
        module = importlib.import_module("user_metric")
        namespace = {"user_metric": module}
        exec("def reads_module(x):\n    return user_metric.f(x)\n", namespace)
        keys.append((content_key(module.Metric()), content_key(namespace["reads_module"])))
    sys.modules.pop("user_metric", None)
    assert keys[0][0] != keys[1][0] and keys[0][1] != keys[1][1]
    assert content_key(interp.metrics.logit_diff) == content_key(interp.metrics.logit_diff)


def _toy_ioi_sweep(n_prompts: int):
    """toy-ioi, IOI prompts and their ABC corruption, and a sweep's metric: the logit difference of the
    prompts `rows`."""
    model = interp.load_model("toy-ioi")
    clean, abc, _ = ioi_dataset_for(model, n_prompts, seed=3)
    io, s, end = clean.io_token, clean.s_token, clean.positions["END"]

    def metric(logits, rows):
        return metrics.logit_diff(logits, io[rows], s[rows], pos=end[rows])

    return model, clean, abc, metric


def test_patching_sweep_on_ray_equals_a_single_run(ray_cluster, tmp_path):
    model, clean, abc, metric = _toy_ioi_sweep(12)
    single = activation_patching(
        model, clean.tokens, abc.tokens, lambda logits: metric(logits, torch.arange(12)), "z", clean.positions
    )
    workers = Workers("toy-ioi", n_shards=3, ray="local", store=tmp_path)
    sharded = patching_sweep(workers, clean.tokens, abc.tokens, metric, "z", clean.positions)
    n_patches = model.cfg.n_layers * model.cfg.n_heads * len(clean.positions)
    assert sharded.values.shape == single.values.shape == (n_patches, 12)
    torch.testing.assert_close(sharded.values, single.values, rtol=0, atol=1e-6)
    torch.testing.assert_close(sharded.target, single.target, rtol=0, atol=1e-6)
    frames = [result.to_dataframe() for result in (single, sharded)]
    assert frames[0].drop(columns="value").equals(frames[1].drop(columns="value"))
    assert (frames[0]["value"] - frames[1]["value"]).abs().max() < 1e-6
    assert single.values.abs().max() > 1  # the sweep measured real effects


def test_a_model_saved_again_at_the_same_path_is_swept_anew(tmp_path):
    """The store and the loaded model are keyed by the version of the files at the path: a rerun after
    another model is saved there gives that model's figures, not the stored shards' or the cached
    model's."""
    generator = torch.Generator().manual_seed(0)
    clean, corrupted = (torch.randint(0, 20, (4, 6), generator=generator) for _ in range(2))

    def metric(logits, rows):
        return logits[:, -1, 3] - logits[:, -1, 4]

    sweeps = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = interp.HookedTransformer(
            interp.Config(n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8)
        )
        model.save(tmp_path / "model")
        workers = Workers(tmp_path / "model", store=tmp_path / "store")
        sweeps.append(patching_sweep(workers, clean, corrupted, metric, "resid_pre"))
        alone = activation_patching(
            model.eval(), clean, corrupted, lambda logits: metric(logits, None), "resid_pre"
        )
        torch.testing.assert_close(sweeps[-1].values, alone.values, rtol=0, atol=1e-6)
    assert not torch.allclose(sweeps[0].values, sweeps[1].values)


def _with_a_view(x: int) -> dict[str, Tensor]:
    whole = torch.arange(6.0) * x
    return {"whole": whole, "first_half": whole[:3]}  # one storage: safetensors refuses shared memory


def test_a_result_whose_tensors_share_memory_is_stored_and_read_back(tmp_path):
    first, seen = map_shards(_with_a_view, [1, 2], store=tmp_path), []
    again = map_shards(_with_a_view, [1, 2], store=tmp_path, progress=lambda *found: seen.append(found))
    assert seen[0] == ("Shards", 2, 2)  # both read back from the store
    for run in (first, again):
        assert torch.equal(run[1]["whole"], torch.arange(6.0) * 2) and torch.equal(
            run[1]["first_half"], run[1]["whole"][:3]
        )


def test_a_sweep_of_left_padded_prompts_keeps_their_padding_and_positions_in_every_shard(tmp_path):
    """Ids that record their left padding (as `to_tokens(..., padding_side="left")` makes them) keep it in
    each shard: the shards' figures are the single run's (the shards read the padding as tokens)."""
    generator = torch.Generator().manual_seed(0)
    clean, corrupted = (torch.randint(1, 20, (4, 6), generator=generator) for _ in range(2))
    mask = (torch.arange(6) >= torch.tensor([0, 2, 1, 3])[:, None]).long()  # left padding of 0-3 tokens
    clean, corrupted = record_padding(clean, mask), record_padding(corrupted, mask.clone())
    torch.manual_seed(0)
    model = interp.HookedTransformer(interp.Config(n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8))
    model.save(tmp_path / "model")

    def metric(logits, rows):
        return logits[:, -1, 3] - logits[:, -1, 4]

    swept = patching_sweep(Workers(tmp_path / "model", n_shards=2), clean, corrupted, metric, "resid_pre")
    alone = activation_patching(
        model.eval(), clean, corrupted, lambda logits: metric(logits, None), "resid_pre"
    )
    torch.testing.assert_close(swept.values, alone.values, rtol=0, atol=1e-6)
    positions = {
        "A": [5, 4, 5, 3],
        "B": [5, 5, 5, 5],
    }  # per prompt, as lists (activation_patching takes them)
    swept = patching_sweep(Workers(tmp_path / "model", n_shards=2), clean, corrupted, metric, "z", positions)
    alone = activation_patching(model, clean, corrupted, lambda logits: metric(logits, None), "z", positions)
    torch.testing.assert_close(swept.values, alone.values, rtol=0, atol=1e-6)


def test_patching_sweep_refuses_a_bare_source_and_options_it_does_not_read():
    tokens = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(TypeError, match=r"patching_sweep runs on Workers, got str: pass Workers\(source"):
        patching_sweep("toy-ioi", tokens, tokens, lambda logits, rows: logits[:, -1, 0])
    with pytest.raises(TypeError, match="patching_sweep does not read RunOptions' logit_tokens"):
        patching_sweep(
            Workers("toy-ioi"), tokens, tokens, lambda logits, rows: logits[:, -1, 0],
            options=RunOptions(logit_tokens=tokens),
        )  # fmt: skip


def test_without_ray_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if ray were not installed
    with pytest.raises(ImportError, match=r'pip install "interp\[ray\]"'):
        map_shards(threads_and_square, range(2), ray="local")


def test_a_model_saved_again_with_its_old_size_and_mtime_is_another_version(tmp_path):
    """`source_version` (what the sweep's store and the workers' loaded models are keyed by) tells a
    model's files rewritten in place, or renamed into place, with the old size and mtime restored (as
    `cp -p` leaves them), from the files before."""
    model = tmp_path / "model"
    model.mkdir()
    weights = model / "model.safetensors"
    weights.write_bytes(b"weights A")
    seen = {source_version(model)}
    for data in (b"weights B", b"weights C"):
        stat = weights.stat()
        if data.endswith(b"B"):  # in place: the same inode, a change time a clock tick later
            time.sleep(0.05)
            weights.write_bytes(data)
        else:  # renamed into place: another inode
            (tmp_path / "new").write_bytes(data)
            os.replace(tmp_path / "new", weights)
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert source_version(model) not in seen
        seen.add(source_version(model))
    assert source_version(model) in seen and source_version("not-a-path") == ""


def test_workers_load_an_offloaded_model_each_in_a_folder_of_its_own(tmp_path):
    """load_options with a device_map and an offload_folder (a model too big for one worker): the dicts
    did not hash (TypeError), and a second load into the same folder is refused by accelerate; the sweep
    equals one activation_patching run."""
    model, clean, abc, metric = _toy_ioi_sweep(6)
    single = activation_patching(
        model, clean.tokens, abc.tokens, lambda logits: metric(logits, torch.arange(6)), "z"
    )
    options = {"device_map": {"blocks.0": "disk", "blocks.1": "cpu"}, "offload_folder": str(tmp_path / "off")}
    for store in (None, tmp_path / "store"):
        workers = Workers("toy-ioi", n_shards=2, load_options=options, store=store)
        swept = patching_sweep(workers, clean.tokens, abc.tokens, metric, "z")
        torch.testing.assert_close(swept.values, single.values, rtol=1e-5, atol=1e-5)


def test_a_sweep_asking_for_gpus_a_ray_cluster_lacks_is_refused(ray_cluster):
    """Ray queues a shard whose GPUs no node has, forever and without a word: refused before submitting."""
    import ray

    if ray.cluster_resources().get("GPU", 0):
        pytest.skip("this Ray cluster has GPUs")
    with pytest.raises(ValueError, match=r"asks for 1 GPU\(s\) but the Ray cluster has 0"):
        map_shards(abs, [1, 2], ray=RayCluster("local", num_gpus=1))
