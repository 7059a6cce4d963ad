"""The bubblewrap jail: its command line and mounts, the interpreter it runs, and the unprivileged uids claimed per sandbox."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import re
import signal
import stat
import sys
import tempfile
import threading
import time
from typing import Any

UID_BASE = 1_700_000
"""Unprivileged uids used for runs when stepcredit runs as root (one per concurrent sandbox)."""
UID_COUNT = 4096

PYTHON_MOUNT = "/opt/stepcredit-python"
"""Where an interpreter from outside ``/usr`` appears inside the sandbox (its host path stays hidden)."""


def bwrap_command(
    bwrap: str,
    python: str,
    host_dir: str,
    limits: dict[str, Any],
    *,
    tmpfs_mb: int,
    runner: str = "runner.py",
) -> list[str]:
    """The bubblewrap command that starts the runner in a fresh jail: ``runner`` (``runner.py``, or the
    interpreter's compiled ``runner.pyc``) from ``host_dir`` read-only under ``/box``, the runner's limits
    as its arguments (the program comes over the protocol)."""
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    # CAP_SYS_ADMIN of the sandbox's own user namespace, for the runner alone: it mounts each case's /tmp
    # (capped in files as well as bytes, which bwrap's --tmpfs cannot do); the cases' children drop it.
    cmd += ["--as-pid-1", "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
    cmd += ["--cap-add", "CAP_SYS_ADMIN"]
    cmd += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    python, mounts, env_extra = _python_mounts(python)
    cmd += mounts
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    cmd += ["--ro-bind", os.path.join(host_dir, runner), f"/box/{runner}"]
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--clearenv"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    for k, v in {**env, **env_extra}.items():
        cmd += ["--setenv", k, v]
    cmd += ["--", python, "-I", "-S", "-B", f"/box/{runner}", *(str(limits[k]) for k in RUNNER_LIMITS)]
    return cmd


RUNNER_LIMITS = (
    "cpu_s",
    "memory_mb",
    "file_size_mb",
    "max_procs",
    "output_limit_kb",
    "tmpfs_mb",
    "max_files",
    "timeout_s",
)
"""The runner's arguments, in order (``runner.main`` reads them so)."""


def _base_python() -> str:
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe)


def _default_python() -> str:
    """The host's base interpreter if an unprivileged uid can reach it, else the system's python3."""
    base = _base_python()
    if os.geteuid() != 0 or _world_reachable(base):
        return base
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(cand):
            return os.path.realpath(cand)
    return base


def _world_reachable(path: str) -> bool:
    # The run's uid is nobody's: every directory on the way needs o+x (e.g. /root is usually 0700).
    p = os.path.realpath(path)
    while True:
        parent = os.path.dirname(p)
        if parent == p:
            return True
        try:
            if not os.stat(parent).st_mode & 0o001:
                return False
        except OSError:
            return False
        p = parent


def _python_mounts(python: str) -> tuple[str, list[str], dict[str, str]]:
    """The interpreter's path inside the sandbox, the bwrap mounts it needs, and extra environment.

    An interpreter under /usr needs nothing more. Any other (pyenv, conda, a build under /home) is
    relocated to PYTHON_MOUNT: only its executable and its ``lib`` directory, with site-packages and
    dist-packages hidden, so nothing else of /home (or wherever it lives) is visible.
    """
    real = os.path.realpath(python)
    if real.startswith("/usr/"):
        return real, [], {}
    prefix = os.path.dirname(os.path.dirname(real))
    mounts = ["--ro-bind", real, f"{PYTHON_MOUNT}/bin/python3"]
    lib = os.path.join(prefix, "lib")
    if os.path.isdir(lib):
        mounts += ["--ro-bind", lib, f"{PYTHON_MOUNT}/lib"]
        for std in sorted(os.listdir(lib)):
            for pkgs in ("site-packages", "dist-packages"):
                if std.startswith("python") and os.path.isdir(os.path.join(lib, std, pkgs)):
                    mounts += ["--tmpfs", f"{PYTHON_MOUNT}/lib/{std}/{pkgs}"]
    # A shared libpython is found through the build's RUNPATH (its host path): point the loader here.
    return f"{PYTHON_MOUNT}/bin/python3", mounts, {"LD_LIBRARY_PATH": f"{PYTHON_MOUNT}/lib"}


@functools.lru_cache(maxsize=1)
def _setpriv() -> str | None:
    # Fixed places only: we run it as root, so never one found through a PATH.
    return next((p for p in ("/usr/bin/setpriv", "/bin/setpriv") if os.access(p, os.X_OK)), None)


def as_uid(argv: list[str], uid: int | None) -> tuple[list[str], dict[str, Any]]:
    """``argv`` run as ``uid`` (None: as we are): the command and ``Popen``'s extra arguments.

    util-linux's ``setpriv`` sets the real, effective and saved uid and gid and clears the groups
    before it executes bubblewrap, the same credentials ``Popen(user=, group=, extra_groups=[])``
    sets; but Popen can only start a child that changes its uid with a full fork() of this process
    (vfork is unsafe there), which copies every page table of a large host (torch loaded: ~200 MB)
    and leaves its pages copy-on-write, while without a uid change it uses vfork."""
    if uid is None:
        return argv, {}
    setpriv = _setpriv()
    if setpriv is None:
        return argv, {"user": uid, "group": uid, "extra_groups": []}
    return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv], {}


def _uid_lock_dir() -> str:
    """A directory only we can write: a world-writable /tmp with a predictable name would let any local
    user pre-create it (or a symlink) and hand two runs the same uid."""
    base = "/run" if os.path.isdir("/run") and os.access("/run", os.W_OK) else tempfile.gettempdir()
    path = os.path.join(base, f"stepcredit-sandbox-uids-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RuntimeError(
            f"{path} is not a private directory of ours (owner {st.st_uid}, mode {st.st_mode:o})"
        )
    return path


def claim_uid(root: bool) -> tuple[int | None, int]:
    """As root, an unprivileged uid nobody else uses for the run (an flock on a per-uid file) and the
    lock's descriptor (:func:`release_uid` frees it); not as root, ``(None, -1)``."""
    if not root:
        return None, -1
    lock_dir = _uid_lock_dir()
    start = (os.getpid() * 64 + threading.get_ident()) % UID_COUNT
    for i in range(UID_COUNT):
        uid = UID_BASE + (start + i) % UID_COUNT
        fd = os.open(os.path.join(lock_dir, str(uid)), os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        # No sweep here: a previous owner's runs died with it (bwrap's --die-with-parent), and the
        # sweep after each run catches anything else.
        return uid, fd
    raise RuntimeError(f"no free sandbox uid in {UID_BASE}..{UID_BASE + UID_COUNT}")


def release_uid(fd: int) -> None:
    """Free a uid claimed by :func:`claim_uid` (its lock's descriptor; -1: nothing was claimed)."""
    if fd >= 0:
        os.close(fd)


def uid_processes(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is ``uid``."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except OSError:
            continue
        m = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        zombie = re.search(r"^State:\s+Z", status, re.MULTILINE)
        if m and int(m.group(1)) == uid and not zombie:
            pids.append(int(name))
    return pids


def _sweep_uid(uid: int) -> int:
    """Kill every process of ``uid``; return how many could not be killed within ~2 s (0 is normal).

    After a run the namespace is already going down (its pid 1 is dead), so anything found here is
    normally a process in the middle of dying; the uid belongs to this run alone, so killing is safe.
    """
    for _ in range(200):
        pids = uid_processes(uid)
        if not pids:
            return 0
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    return len(uid_processes(uid))
