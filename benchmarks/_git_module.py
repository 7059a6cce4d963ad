"""An earlier version of one of stepcredit's modules, loaded from the git history as a module of its own,
so that a benchmark can run it beside today's in the same process.

The file is read with ``git show COMMIT:PATH`` and executed as a fresh module under another name; its
closing ``register_reward(...)`` call is dropped (the names it registers belong to today's module).
"""

from __future__ import annotations

import subprocess
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_at(commit: str, path: str, name: str) -> types.ModuleType:
    """``path`` (relative to the repository) as it was at ``commit``, as a module called ``name``.

    RuntimeError with one line when git or that commit is not available (a shallow clone: fetch more history).
    """
    try:
        src = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{commit}:{path}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        err = getattr(e, "stderr", "") or str(e)
        raise RuntimeError(
            f"cannot read {path} at commit {commit} (needs the git history: git fetch --unshallow): "
            f"{err.strip()}"
        ) from None
    src = src.split("\nregister_reward(", 1)[0]
    mod = types.ModuleType(name)
    mod.__file__ = f"{path}@{commit}"
    exec(compile(src, mod.__file__, "exec"), mod.__dict__)
    return mod
