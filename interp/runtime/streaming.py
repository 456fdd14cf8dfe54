"""Activations of a large prompt set, streamed to disk in safetensors shards.

`cache_to_disk` runs the prompts in batches of `batch_size`; batch i becomes
`out_dir/shard_{i:05d}.safetensors`, holding {hook name: [rows, ...]} on CPU. Only one batch's
activations are in memory at a time, and each forward stops after the last block it needs.
A shard is written to a temporary file and renamed into place, so an interrupted run leaves only
complete shards; running the same job again skips them, after checking each one (readable, of this
job and its rows, the sha256 of its tensors as written): a damaged shard is computed again, with a
warning. `job.json` records what the job is (the model, hook names, tokens and batch size); another
job cannot write into the same directory, and two writers cannot run in it at once (`.lock` holds the
writer's process id and host; a lock whose process is gone is taken over, with a warning).

    cache_to_disk(model, tokens, ["blocks.3.hook_resid_post"], "acts/", batch_size=32)
    acts = load_activations("acts/")            # {name: [n_prompts, ...]}
    for rows, shard in iter_shards("acts/"):   # one shard at a time
        ...
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from interp.io.devices import module_weight
from interp.io.files import atomic_path, held_lock, write_text_atomic
from interp.io.source_code import INTERP_SOURCE, source_key
from interp.model import HookedTransformer
from interp.model.tokens import record_padding, recorded_padding
from interp.runtime.keys import add_content, tensor_bytes
from interp.types import Progress

JOB_FILE = "job.json"
LOCK_FILE = ".lock"
CACHING_STAGE = "Caching"  # the stage cache_to_disk reports


def _shard_path(out_dir: Path, index: int) -> Path:
    return out_dir / f"shard_{index:05d}.safetensors"


def job_key(model: HookedTransformer, tokens: Tensor, names: Sequence[str], batch_size: int) -> str:
    """A hash of everything that determines the shards' contents: every byte of every weight, the
    config, the prompts (with the padding mask they record), the hooks on the model that may change
    activations (`keys.add_content`: their code and the values they write; `observer` hooks only
    read), the batch size and interp's source code (`interp.io.source_code.source_key`) (sha256,
    ~1 GB/s)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(["interp", source_key(INTERP_SOURCE)]).encode())
    digest.update(json.dumps(model.cfg.to_dict(), sort_keys=True, default=str).encode())
    for name, parameter in model.state_dict().items():
        digest.update(f"{name}{tuple(parameter.shape)}{parameter.dtype}".encode())
        if parameter.is_meta:  # offloaded by accelerate: read in from its offload
            owner, _, attr = name.rpartition(".")
            parameter = module_weight(model.get_submodule(owner), attr, "cpu")
        if not parameter.is_meta:
            digest.update(tensor_bytes(parameter))
    digest.update(json.dumps([list(names), batch_size, str(model.dtype)]).encode())
    digest.update(f"{tuple(tokens.shape)}".encode())
    digest.update(tensor_bytes(tokens.long()))
    mask = recorded_padding(tokens)  # which tokens are padding changes every activation
    digest.update(b"no mask" if mask is None else tensor_bytes(mask.long()))
    hooks = [(name, point.writing_hooks()) for name, point in model.hook_dict.items() if point.has_hooks()]
    add_content(digest, hooks, known=[model])
    return digest.hexdigest()[:32]


def _tensors_hash(tensors: dict[str, Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(f"{name}{tuple(tensors[name].shape)}{tensors[name].dtype}".encode())
        digest.update(tensor_bytes(tensors[name]))
    return digest.hexdigest()


def _shard_damage(path: Path, key: str, rows: str, names: Sequence[str]) -> str | None:
    """Why the shard at `path` is not this job's complete shard of `rows` (None: it is)."""
    try:
        with safe_open(path, framework="pt") as shard:
            metadata = shard.metadata() or {}
            if metadata.get("job") != key or metadata.get("rows") != rows:
                return f"it holds rows {metadata.get('rows')} of job {metadata.get('job')}"
            missing = sorted(set(names) - set(shard.keys()))
            if missing:
                return f"it lacks {missing}"
            tensors = {name: shard.get_tensor(name) for name in names}
    except Exception as error:  # a truncated or overwritten file: safetensors cannot read it
        return f"it cannot be read ({type(error).__name__}: {str(error)[:80]})"
    if metadata.get("sha256") != _tensors_hash(tensors):
        return "its tensors' sha256 differs from the one recorded when it was written"
    return None


def _writer_lock(out_dir: Path) -> AbstractContextManager[None]:
    """Hold `out_dir/.lock` while writing: a second writer is refused (`held_lock`)."""
    lock = out_dir / LOCK_FILE
    return held_lock(
        lock,
        lambda holder: RuntimeError(
            f"another cache_to_disk ({holder}) is writing into {out_dir}; wait for it to finish or pass "
            f"another out_dir (if no such process runs, delete {lock})"
        ),
    )


def _as_tokens(model: HookedTransformer, prompts: Tensor | Sequence[str]) -> Tensor:
    """Token ids on the CPU, keeping the padding mask `to_tokens` recorded (texts: padded on the
    model's side)."""
    tokens = model.input_tokens(prompts) if isinstance(prompts, Tensor) else model.to_tokens(list(prompts))
    mask = recorded_padding(tokens)
    return tokens.cpu() if mask is None else record_padding(tokens.cpu(), mask.cpu())


@torch.no_grad()
def cache_to_disk(
    model: HookedTransformer,
    prompts: Tensor | Sequence[str],
    names_filter: str | Sequence[str] | Callable[[str], bool],
    out_dir: str | Path,
    batch_size: int = 32,
    progress: Progress | None = None,
) -> Path:
    """Cache the hooks `names_filter` selects on every prompt, one shard per batch (see module doc).

    prompts: token ids [n_prompts, pos] or texts (tokenized together, right-padded).
    Returns out_dir. Shards that exist and check out are skipped (a damaged one is computed again), so an
    interrupted call resumes when re-run; a second writer into out_dir at the same time is refused.
    progress("Caching", shards done, shards), the shards found on disk counted as done.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
    tokens = _as_tokens(model, prompts)
    names = model.hook_names(names_filter)
    if not names:
        raise ValueError("names_filter selects no hook; name at least one, e.g. 'blocks.0.hook_resid_post'.")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with _writer_lock(out_dir):
        _cache_to_disk(model, tokens, names, out_dir, batch_size, progress)
    return out_dir


def _cache_to_disk(
    model: HookedTransformer,
    tokens: Tensor,
    names: list[str],
    out_dir: Path,
    batch_size: int,
    progress: Progress | None,
) -> None:
    key = job_key(model, tokens, names, batch_size)
    job = {"key": key, "names": names, "n_prompts": len(tokens), "batch_size": batch_size}
    job_file = out_dir / JOB_FILE
    if job_file.exists():
        old = json.loads(job_file.read_text())
        if old.get("key") != key:
            raise ValueError(
                f"{out_dir} holds the activations of another job (other model, prompts, hooks or batch "
                "size); choose another out_dir or delete it."
            )
    else:
        write_text_atomic(job_file, json.dumps(job, indent=2))
    starts = range(0, len(tokens), batch_size)
    todo = []
    for index, start in enumerate(starts):
        path = _shard_path(out_dir, index)
        if not path.exists():
            todo.append(index)
            continue
        damage = _shard_damage(path, key, f"{start}:{min(start + batch_size, len(tokens))}", names)
        if damage is not None:
            warnings.warn(
                f"{path.name} is damaged ({damage}); computing it again", RuntimeWarning, stacklevel=3
            )
            todo.append(index)
    done = len(starts) - len(todo)
    if progress is not None:
        progress(CACHING_STAGE, done, len(starts))
    mask = recorded_padding(tokens)
    for index in todo:
        start = starts[index]
        rows = slice(start, start + batch_size)
        batch = tokens[rows].to(model.device)
        padding = {} if mask is None else {"attention_mask": mask[rows].to(model.device)}
        _, cache = model.run_with_cache(batch, names_filter=names, return_type=None, device="cpu", **padding)
        # resid_post of block L and resid_pre of block L + 1 are one tensor in the cache, and safetensors
        # refuses tensors that share storage: each name gets its own copy
        tensors = {name: cache[name].contiguous().clone() for name in names}
        rows = f"{start}:{start + len(batch)}"
        with atomic_path(_shard_path(out_dir, index)) as tmp:
            save_file(tensors, tmp, metadata={"rows": rows, "job": key, "sha256": _tensors_hash(tensors)})
        done += 1
        if progress is not None:
            progress(CACHING_STAGE, done, len(starts))


def iter_shards(
    out_dir: str | Path, names: str | Sequence[str] | None = None
) -> Iterator[tuple[range, dict]]:
    """(rows, {name: tensor}) of each shard in order, of the hooks `names` (one name, several, or None:
    every one the job cached); raises if the job is incomplete, a name is not one it cached, or a shard
    read whole (every one of the job's names) is not what was written (its sha256)."""
    out_dir = Path(out_dir)
    job_file = out_dir / JOB_FILE
    if not job_file.exists():
        raise FileNotFoundError(f"{out_dir} holds no cached activations (no {JOB_FILE}).")
    job = json.loads(job_file.read_text())
    n_shards = -(-job["n_prompts"] // job["batch_size"])
    missing = [i for i in range(n_shards) if not _shard_path(out_dir, i).exists()]
    if missing:
        raise ValueError(
            f"{out_dir} is incomplete: {len(missing)} of {n_shards} shards are missing; re-run "
            "cache_to_disk with the same arguments to finish it."
        )
    wanted = job["names"] if names is None else [names] if isinstance(names, str) else list(names)
    unknown = [name for name in wanted if name not in job["names"]]
    if unknown:
        raise ValueError(
            f"{out_dir} holds no activations of {', '.join(unknown)}; it cached {', '.join(job['names'])}"
        )
    for index in range(n_shards):
        path = _shard_path(out_dir, index)
        with safe_open(path, framework="pt") as shard:
            metadata = shard.metadata()
            tensors = {name: shard.get_tensor(name) for name in wanted}
        whole = set(wanted) >= set(job["names"])  # every tensor read: checked against the recorded sha256
        if whole and metadata.get("sha256") != _tensors_hash({name: tensors[name] for name in job["names"]}):
            raise ValueError(
                f"{path} is damaged (its tensors' sha256 differs from the one recorded when it was written); "
                "re-run cache_to_disk with the same arguments to compute it again."
            )
        start, stop = map(int, metadata["rows"].split(":"))
        yield range(start, stop), tensors


def load_activations(out_dir: str | Path, names: str | Sequence[str] | None = None) -> dict[str, Tensor]:
    """Every shard concatenated: {name: [n_prompts, ...]} (all in memory; see iter_shards)."""
    parts: dict[str, list[Tensor]] = {}
    for _, shard in iter_shards(out_dir, names):
        for name, tensor in shard.items():
            parts.setdefault(name, []).append(tensor)
    return {name: torch.cat(tensors) for name, tensors in parts.items()}
