"""Sweeps over shards of work (prompts, checkpoints, models) on Ray workers, or in this process.

`map_shards(fn, shards)` runs fn(shard) for every shard and returns the results in shard order:
on a Ray cluster with `ray="local"` (start one here) or `ray="ADDRESS"` ("auto", "ray://host:10001"),
else one shard after another in this process. Ray is an optional extra: pip install "interp[ray]".

  - A shard whose task fails (an exception or a dead worker) is retried (`RayCluster.max_retries`).
  - With `store=DIR` each finished shard's result is written to DIR/<job key>/shard_NNNNN.json
    (+ .safetensors; atomically, never pickled) as soon as it finishes; running the same job again
    loads those and computes only the rest, so an interrupted sweep resumes. The job key hashes
    `job` by content (`keys.content_key`: anything that names the job's inputs, e.g. a model path and
    the prompts; by default the function, by its code, and the shards) and interp's source code
    (`interp.io.source_code.source_key`), so that a store is not read by other code.
  - Workers run torch on `RayCluster.threads_per_worker` threads (default 1), so that several workers on one
    machine do not oversubscribe its cores.

`patching_sweep` shards activation patching over prompts and merges the shards into the
PatchResult of a single run (the same per-prompt values, to rounding).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file
from torch import Tensor

from interp.interventions.engine import RunOptions, takes_run_options
from interp.interventions.patching import Direction, PositionAxis, activation_patching
from interp.interventions.results import PatchResult
from interp.io.files import atomic_path, file_stamp, write_text_atomic
from interp.io.serialize import decode, encode, register_dataclass
from interp.io.source_code import INTERP_SOURCE, source_key
from interp.model.tokens import index_tokens, record_padding, recorded_padding
from interp.runtime.keys import content_key
from interp.types import Progress

log = logging.getLogger("interp")

SHARDS_STAGE = "Shards"  # the stage map_shards reports
RAY_HINT = 'Ray is an optional extra: pip install "interp[ray]"'


def require_ray():
    """The ray module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"Running on Ray needs the ray package. {RAY_HINT}") from error
    return ray


def connect(ray_address: str, num_cpus: int | None = None) -> None:
    """Start a local Ray cluster ("local", with `num_cpus` workers) or join one ("auto", "ray://...").

    Does nothing if this process is already connected. Workers see this process's sys.path, so
    modules of the current project import there too.
    """
    ray = require_ray()
    if ray.is_initialized():
        return
    path = os.pathsep.join(p for p in sys.path if p)
    env = {"env_vars": {"PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}}
    if ray_address == "local":
        ray.init(num_cpus=num_cpus, runtime_env=env, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=ray_address, runtime_env=env, log_to_driver=False)


def _run_shard(fn: Callable, shard: Any, threads: int) -> Any:
    torch.set_num_threads(threads)
    return fn(shard)


# ---------------------------------------------------------------------------------------------
# The resume store: results as JSON + safetensors, never pickles (loading a store runs no code)

STORE_FORMAT = "interp-shard-result-2"  # the result in interp.io.serialize's format
register_result_type = register_dataclass  # lets map_shards(store=...) store a dataclass's results
register_dataclass(PatchResult)


def _store_result(path: Path, result: Any, key: str) -> None:
    """shard_N.json (the result, tensors by name) + shard_N.safetensors; the JSON names the job key and
    the tensors file's hash, and is written last, so a shard counts only once both are complete."""
    tensors: dict[str, Tensor] = {}
    try:
        encoded = encode(result, tensors)
    except TypeError as error:
        raise TypeError(
            f"map_shards(store=...) stores results as JSON and safetensors, never pickles: {error}; "
            "or run without store"
        ) from error
    digest = None
    if tensors:
        with atomic_path(path.with_suffix(".safetensors")) as tmp:
            save_file({name: tensor.clone() for name, tensor in tensors.items()}, tmp)  # no shared memory
            digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    record = {"format": STORE_FORMAT, "job": key, "tensors_sha256": digest, "result": encoded}
    write_text_atomic(path, json.dumps(record, allow_nan=False))


def _load_result(path: Path, key: str) -> tuple[bool, Any]:
    """(True, result) of a stored shard, or (False, None) if it is absent, of another job or damaged."""
    if not path.is_file():
        return False, None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("format") != STORE_FORMAT or record.get("job") != key:
            return False, None
        tensors: dict[str, Tensor] = {}
        if record["tensors_sha256"] is not None:
            tensor_file = path.with_suffix(".safetensors")
            if not tensor_file.is_file():
                return False, None
            data = tensor_file.read_bytes()
            if hashlib.sha256(data).hexdigest() != record["tensors_sha256"]:
                return False, None
            tensors = load(data)
        return True, decode(record["result"], tensors)
    except (ValueError, KeyError, TypeError, SafetensorError) as error:
        log.warning("ignoring the damaged stored shard %s (%s); it is computed again", path, error)
        return False, None


@dataclass(frozen=True)
class RayCluster:
    """Where and how `map_shards` runs its shards on Ray. address: "local" (start a cluster here of
    `num_cpus` workers, default one per core) or an existing one's ("auto", "ray://host:10001");
    num_gpus: GPUs each task asks for (0: CPU tasks); threads_per_worker: torch threads per worker;
    max_retries: retries of a failed shard."""

    address: str = "local"
    num_cpus: int | None = None
    num_gpus: float = 0
    threads_per_worker: int = 1
    max_retries: int = 2


def map_shards(
    fn: Callable[[Any], Any],
    shards: Sequence[Any],
    ray: str | RayCluster | None = None,
    store: str | Path | None = None,
    job: Any = None,
    progress: Progress | None = None,
) -> list[Any]:
    """[fn(shard) for shard in shards], on Ray workers when `ray` is given; see the module doc.

    ray: None (this process), an address ("local" starts a cluster here; "auto", "ray://...") or a
    `RayCluster` (the address with workers, GPUs, threads and retries).
    store, job: resume support. Results are stored as JSON + safetensors (never pickled, so reading
    a store runs no code): tensors, numbers, strings, lists, tuples, dicts, DataFrames, PatchResult
    and dataclasses registered with `register_result_type`.
    fn and the shards must pickle (cloudpickle: closures and lambdas are fine).
    progress("Shards", shards done, shards), those found in the store counted as done.
    """
    shards = list(shards)
    paths: list[Path | None] = [None] * len(shards)
    results: dict[int, Any] = {}
    key = ""
    if store is not None:
        key = content_key((source_key(INTERP_SOURCE), (fn, shards) if job is None else job))
        directory = Path(store) / key
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / f"shard_{i:05d}.json" for i in range(len(shards))]
        for i, path in enumerate(paths):
            found, result = _load_result(path, key)
            if found:
                results[i] = result
    todo = [i for i in range(len(shards)) if i not in results]
    if progress is not None:
        progress(SHARDS_STAGE, len(results), len(shards))

    def finish(i: int, result: Any) -> None:
        results[i] = result
        if paths[i] is not None:
            _store_result(paths[i], result, key)
        if progress is not None:
            progress(SHARDS_STAGE, len(results), len(shards))

    if ray is None:
        for i in todo:
            finish(i, fn(shards[i]))
    else:
        cluster = RayCluster(ray) if isinstance(ray, str) else ray
        _map_on_ray(fn, shards, todo, cluster, finish, stored=store is not None)
    return [results[i] for i in range(len(shards))]


def _map_on_ray(fn, shards, todo, cluster: RayCluster, finish, stored: bool) -> None:
    """Submit every shard in `todo`, and finish() each as it completes (failures raise at the end)."""
    ray = require_ray()
    connect(cluster.address, cluster.num_cpus)
    max_retries = cluster.max_retries
    resources = {"num_cpus": 1, "num_gpus": cluster.num_gpus}
    gpus = ray.cluster_resources().get("GPU", 0)
    if cluster.num_gpus > gpus:  # Ray would queue the shards forever, saying nothing
        raise ValueError(
            f"each shard asks for {cluster.num_gpus} GPU(s) but the Ray cluster has {gpus:g}; pass "
            "RayCluster(..., num_gpus=0) or join a cluster with GPUs"
        )
    task = ray.remote(max_retries=max_retries, retry_exceptions=True, **resources)(_run_shard)
    fn_ref = ray.put(fn)
    pending = {task.remote(fn_ref, shards[i], cluster.threads_per_worker): i for i in todo}
    failures: list[tuple[int, BaseException]] = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        i = pending.pop(done[0])
        try:
            finish(i, ray.get(done[0]))
        except Exception as error:  # keep the finished shards; report the failure afterwards
            failures.append((i, error))
    if failures:
        i, error = failures[0]
        raise RuntimeError(
            f"{len(failures)} shard(s) failed after {max_retries} retries (first: shard {i}: {error}). "
            + (
                "The finished shards are kept in `store`; run the same job again to resume."
                if stored
                else "Without store= the finished shards' results are lost."
            )
        ) from error


# ---------------------------------------------------------------------------------------------
# Activation patching over shards of prompts

PromptMetric = Callable[[Tensor, Tensor], Tensor]  # (logits [batch, pos, d_vocab], rows [batch]) -> [batch]


def source_version(source: str | Path) -> str:
    """What tells one version of the model at `source` from another: the name and `file_stamp` of each
    of its files where it is a local file or directory (a model saved again at the same path is another
    version, even with its old size and modification time); "" for a name that is not a local path."""
    path = Path(source)
    if not path.exists():
        return ""
    files = sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file())
    stats = [(str(f.relative_to(path.parent)), *file_stamp(f)) for f in files]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]


_LOADED: dict[str, Any] = {}  # this worker process's models, the two last loaded


def _cached_model(source: str, version: str, load_options: tuple) -> Any:
    """One loaded model per worker process and version of a source (`source_version`; load_model's
    options as sorted items, their values dicts too: max_memory, device_map). An `offload_folder` gets
    a folder of its own per process and load: accelerate refuses to offload into one in use."""
    from interp.model.loading import load_model

    key = repr((source, version, load_options))
    if key not in _LOADED:
        options = dict(load_options)
        if options.get("offload_folder") is not None:
            Path(options["offload_folder"]).mkdir(parents=True, exist_ok=True)
            options["offload_folder"] = tempfile.mkdtemp(
                prefix=f"worker-{os.getpid()}-", dir=options["offload_folder"]
            )
        while len(_LOADED) >= 2:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = load_model(source, **options).eval()
    return _LOADED[key]


@dataclass(frozen=True)
class Workers:
    """Where a sharded sweep runs: the prompts split into `n_shards` shards, each run by a worker
    that loads the model at `source` (`load_model(source, **load_options)`, e.g. {"dtype":
    torch.float64}), on Ray with `ray` (see `map_shards`; None: one shard after another in this
    process), each finished shard kept in `store` (a rerun resumes from it)."""

    source: str | Path
    _: KW_ONLY
    n_shards: int = 2
    ray: str | RayCluster | None = None
    store: str | Path | None = None
    load_options: Mapping[str, Any] | None = None


def _patch_shard(shard: dict) -> PatchResult:
    model = _cached_model(shard["source"], shard["version"], shard["load_options"])
    rows, prompt_metric = shard["rows"], shard["metric"]
    return activation_patching(
        model,
        shard["clean"],
        shard["corrupted"],
        lambda logits: prompt_metric(logits, rows),
        shard["component"],
        shard["positions"],
        shard["layers"],
        direction=shard["direction"],
        options=RunOptions(logit_pos=shard["logit_pos"], batch_size=shard["batch_size"]),
    )


@takes_run_options("logit_pos", "batch_size", "progress")
def patching_sweep(
    workers: Workers,
    clean: Tensor,
    corrupted: Tensor,
    metric: PromptMetric,
    component: str = "z",
    positions: PositionAxis = None,
    layers: Sequence[int] | None = None,
    *,
    direction: Direction = "denoise",
    options: RunOptions = RunOptions(),
) -> PatchResult:
    """`activation_patching` of the model at `workers.source` with the prompts split into
    `workers.n_shards` shards (each loaded and run on a worker), merged into one PatchResult over all
    prompts.

    metric(logits, rows): logits [batch, pos, d_vocab] of the shard's prompts, rows [batch] their
      indices in clean/corrupted; returns [batch]. Index per-prompt data with rows, e.g.
      `lambda logits, rows: metrics.logit_diff(logits, io[rows], s[rows], pos=end[rows])`.
      Normalise after merging (a normalised metric's baselines are means over all prompts).
    positions, options: as in activation_patching (`RunOptions`' logit_pos and batch_size, for each
      shard; progress: see `map_shards`); per-prompt tensors are split with the prompts.
    """
    if not isinstance(workers, Workers):
        raise TypeError(
            f"patching_sweep runs on Workers, got {type(workers).__name__}: pass Workers(source, "
            "n_shards=..., ray=..., store=..., load_options=...)"
        )
    source, n_shards, logit_pos = workers.source, workers.n_shards, options.logit_pos
    clean, corrupted = _on_cpu(clean), _on_cpu(corrupted)
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} differ in shape."
        )
    n_shards = max(1, min(n_shards, len(clean)))
    if isinstance(positions, Mapping):  # per-prompt positions, as lists too (as activation_patching takes)
        positions = {name: torch.as_tensor(value) for name, value in positions.items()}
    load_options = tuple(sorted((workers.load_options or {}).items()))
    version = source_version(source)
    row_sets = torch.arange(len(clean)).tensor_split(n_shards)
    shards = [
        {
            "source": str(source),
            "version": version,
            "load_options": load_options,
            "rows": rows,
            "clean": index_tokens(clean, rows),  # with the padding the ids record
            "corrupted": index_tokens(corrupted, rows),
            "metric": metric,
            "component": component,
            "positions": _slice_rows(positions, rows, len(clean)),
            "layers": layers,
            "direction": direction,
            "logit_pos": _slice_rows(logit_pos, rows, len(clean)),
            "batch_size": options.batch_size,
        }
        for rows in row_sets
    ]
    job = ("patching_sweep", str(source), version, load_options, clean, corrupted, component, positions)
    job += (layers, direction, metric, logit_pos, n_shards)
    parts = map_shards(
        _patch_shard, shards, ray=workers.ray, store=workers.store, job=job, progress=options.progress
    )
    return merge_patch_results(parts)


def _on_cpu(tokens: Tensor) -> Tensor:
    """Token ids on the CPU, with the padding mask they record (`record_padding`)."""
    mask = recorded_padding(tokens)
    return tokens.cpu() if mask is None else record_padding(tokens.cpu(), mask.cpu())


def _slice_rows(value: Any, rows: Tensor, n_prompts: int) -> Any:
    """Per-prompt tensors ([n_prompts, ...], also inside a mapping) restricted to `rows`."""
    if isinstance(value, Tensor) and value.ndim >= 1 and value.shape[0] == n_prompts:
        return value.cpu()[rows]
    if isinstance(value, Mapping):
        return {key: _slice_rows(v, rows, n_prompts) for key, v in value.items()}
    return value


def merge_patch_results(parts: Sequence[PatchResult]) -> PatchResult:
    """One PatchResult from results of the same patches on consecutive shards of prompts."""
    first = parts[0]
    for part in parts[1:]:
        if not part.index.equals(first.index):
            raise ValueError("the shards patched different sites; they cannot be merged")

    def cat(values: list[Tensor | None]) -> Tensor | None:
        return None if any(v is None for v in values) else torch.cat(values, dim=-1)

    return PatchResult(
        values=torch.cat([p.values for p in parts], dim=-1),
        index=first.index,
        dims=first.dims,
        coords=first.coords,
        metric_name=first.metric_name,
        target=cat([p.target for p in parts]),
        source=cat([p.source for p in parts]),
        method=first.method,
        extra=first.extra,
    )
