"""The host folders of sandboxed programs: made per program, removed whatever ends the program (by
the maker, by the parent that killed the maker, or by the next sandbox's sweep)."""

from __future__ import annotations

import glob
import os
import shutil
import tempfile

DIR_PREFIX = "stepcredit-sbx-"
"""The host's folder of one sandboxed program: ``stepcredit-sbx-<pid>-<random>`` in the temporary
folder, ``pid`` the process that made it (so a folder its maker, killed at a deadline, never removed
can be found and removed: :func:`remove_sandbox_dirs`)."""


def make_sandbox_dir() -> str:
    return tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_sandbox_dirs(pid: int | None = None) -> int:
    """Remove the sandbox folders of the process ``pid`` (its parent does this after killing it), or,
    with no ``pid``, of every process that is gone (the sweep each new sandbox runs at its start).
    Returns how many were removed."""
    removed = 0
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{DIR_PREFIX}*")):
        owner = os.path.basename(path)[len(DIR_PREFIX) :].split("-", 1)[0]
        if not owner.isdigit() or (int(owner) != pid if pid is not None else _alive(int(owner))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += not os.path.exists(path)
    return removed
