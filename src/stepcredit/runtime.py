"""Process-wide settings of a stepcredit run (the CLI applies them; a library user may call them).

:func:`keep_freed_memory`: glibc's malloc hands tensors above its mmap threshold (dynamic, 128 KiB to
32 MiB) straight back to the kernel when they are freed, and trims the heap top as soon as 2x that
threshold is free. A training step allocates and frees many batch-sized tensors (a 1024 x 4096 float32
advantage tensor is 16 MiB), so each one is faulted in again page by page: on this project's CPU
machine the page faults took half the time of the token-level estimators (benchmarks/advantages.py:
reinforce_pp 69 ms -> 33 ms at 1024 x 4096, 12,256 -> 0 minor faults per call). Keeping freed memory
in the process removes them; the price is a resident size that stays at its high-water mark.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20
"""glibc's largest accepted mmap threshold on 64-bit: bigger tensors are still mapped and unmapped."""
_TRIM_THRESHOLD = 1 << 30
"""Free memory at the heap top that glibc may keep before returning it to the kernel."""

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Let glibc keep freed batch-sized tensors for reuse (``mallopt``); True when it took effect.

    A no-op elsewhere (macOS, musl) and on a second call. Same as starting the process with
    ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824``.
    """
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _done = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
    return _done
