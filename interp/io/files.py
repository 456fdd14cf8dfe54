"""Atomic writes: a file or a directory is replaced whole or not at all, never left half-written.

Everything is written under a hidden temporary name in the target's own directory (same file
system), then renamed into place with os.replace; on any error, KeyboardInterrupt included, the
temporary file or directory is removed and the old target stays as it was. Missing parent
directories are created. The written file or directory gets the ordinary permissions the process's
umask gives (not the private ones of a temporary file).

    write_text_atomic("report.html", page)
    with atomic_write("scores.csv") as file:            # "w" (UTF-8 text) or "wb"
        frame.to_csv(file)
    with atomic_path("shard.safetensors") as tmp:       # for writers that take a file name
        save_file(tensors, tmp)
    with atomic_dir("checkpoint") as tmp:               # a directory, swapped in whole
        (tmp / "config.json").write_text(...)

`held_lock` keeps a second process from writing where one is writing (activation shards, --save).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Literal


def file_stamp(path: Path) -> tuple[int, int, int, int]:
    """What tells a file's version from another at the same path without reading it: its inode, size,
    and modification and change times (ns). A file rewritten in place or renamed into place with its
    old size and modification time restored (as `cp -p` leaves it) has a new change time or inode."""
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` (`.NAME.XXXXXXXX.tmp`) to write; on leaving the block without
    an error it replaces `path`, else it is removed."""
    path = Path(path)
    with _naming(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.chmod(0o666 & ~_umask())  # mkstemp makes it private; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: Literal["w", "wb"] = "w") -> Iterator[IO]:
    """An open temporary file ("w": UTF-8 text, "wb": bytes) that replaces `path` when the block
    ends without an error (see `atomic_path`)."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, encoding="utf-8" if mode == "w" else None) as file:
        yield file


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically; returns the path."""
    with atomic_write(path) as file:
        file.write(text)
    return Path(path)


@contextlib.contextmanager
def atomic_dir(directory: str | os.PathLike, keep_existing: bool = False) -> Iterator[Path]:
    """An empty temporary directory beside `directory` (`.NAME.XXXXXXXX`) to fill; on leaving the
    block without an error it replaces `directory` (`replace_dir`), with its files readable as the
    umask allows (as an ordinary file), else it is removed. keep_existing:
    a `directory` already there (another process's copy of the same content, which a third may be
    reading) is kept and the new one removed: the first to land stays."""
    directory = Path(directory)
    with _naming(directory):
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        tmp.chmod(0o777 & ~_umask())  # mkdtemp makes it private; the result is an ordinary directory
        yield tmp
        for path in tmp.rglob("*"):  # safetensors' save_file writes private files (0600)
            if path.is_file() and not path.is_symlink():
                path.chmod(0o666 & ~_umask() | path.stat().st_mode & 0o111)
        with _naming(directory):
            if not keep_existing:
                replace_dir(tmp, directory)
            elif not _landed(tmp, directory):
                shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _landed(source: Path, target: Path) -> bool:
    """Rename the directory `source` to `target` unless a non-empty `target` is there (False then)."""
    try:
        source.rename(target)
    except OSError as error:
        if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    return True


@contextlib.contextmanager
def _naming(target: Path) -> Iterator[None]:
    """An OSError of making or renaming the temporary file raised as one of its kind naming the
    target (not the hidden temporary name) and its directory."""
    try:
        yield
    except OSError as error:
        raise type(error)(
            error.errno,
            f"cannot write {target}: {error.strerror or error} in {target.parent}; pass a path in a "
            "directory you can write to",
        ) from error


def replace_dir(source: Path, target: Path) -> None:
    """Move the complete directory `source` to `target`, replacing any old `target`."""
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        try:
            target.rename(old)
            source.rename(target)
        except BaseException:  # Ctrl-C between the renames: the old directory goes back
            if old.exists() and not target.exists():
                old.rename(target)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        source.rename(target)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    return True


@contextlib.contextmanager
def held_lock(lock: Path, busy: Callable[[str], Exception]) -> Iterator[None]:
    """Hold the file `lock` (naming this process, its host and since when) until the block ends. Where
    another process holds it, raise busy("process PID on HOST, since TIME"). The hold is the kernel's
    (`fcntl.flock`), released when its process ends however it ends, so two processes can never both
    take over a lock left by a killed one; such a lock is taken over with a warning. A lock file naming
    a live process without the kernel's hold (an older interp's) is respected as held."""
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            os.close(fd)
            raise busy(_describe_holder(holder)) from None
        try:
            same_file = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(fd)  # its holder removed it as we opened it: open the one at the path now
    try:
        holder = _lock_holder(fd)
        pid, host = holder.get("pid"), holder.get("host")
        if pid is not None and (host != me["host"] or (isinstance(pid, int) and _process_alive(pid))):
            raise busy(_describe_holder(holder))
        if pid is not None:
            warnings.warn(
                f"{lock} was left by process {pid}, which is gone (interrupted); taking it over",
                RuntimeWarning,
                stacklevel=4,
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)  # before the hold ends: no one can lock this file and find it gone
        os.close(fd)


def _lock_holder(fd: int) -> dict:
    """What a lock file says of its holder ({} when empty or unreadable)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe_holder(holder: dict) -> str:
    if holder.get("pid") is None:
        return "another process, starting"
    return f"process {holder['pid']} on {holder.get('host')}, since {holder.get('since')}"
