"""Process memory policy: keep freed memory for reuse (glibc only).

A full activation cache allocates gigabytes of fresh tensors. By default glibc returns freed memory
to the operating system, so every new cache page-faults it back (on SmolLM2, 32x64 tokens, a full
cache took 1.65x a forward pass; with freed memory kept, 1.1x). `interp` keeps freed memory on
import, and serves large tensors from the heap too (glibc maps anything over 32 MiB afresh, and
page-faults it in on every allocation: SmolLM2's logits for 64 prompts took 33 ms to allocate,
8.5 ms from the heap): the process's resident size then stays near its peak.

Importing interp changes nothing: a process opts in. The `interp` command does (unless
INTERP_RETURN_FREED_MEMORY=1); a library user calls `keep_freed_memory()`, and
`keep_freed_memory(False)` restores glibc's default.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4
POLICY_APPLIED = False  # whether keep_freed_memory(True) is in effect in this process
_GLIBC_DEFAULTS = {_M_TRIM_THRESHOLD: 128 * 1024, _M_MMAP_THRESHOLD: 128 * 1024, _M_MMAP_MAX: 65536}


def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") else None


def keep_freed_memory(enabled: bool = True) -> bool:
    """Keep freed heap memory for reuse (True) or return it to the OS (False). Returns whether
    the setting took effect (False off glibc)."""
    global POLICY_APPLIED
    libc = _libc()
    if libc is None:
        return False
    # Enabled: never trim the heap, and serve every allocation from it (no mmap: a fresh mapping of
    # a large tensor page-faults each time it is allocated).
    options = ((_M_TRIM_THRESHOLD, -1), (_M_MMAP_MAX, 0)) if enabled else tuple(_GLIBC_DEFAULTS.items())
    applied = all(libc.mallopt(option, value) for option, value in options)
    POLICY_APPLIED = enabled and applied
    return applied
