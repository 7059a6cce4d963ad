"""Importing a user's own code (a reward function's module, a tool module) by module name or ``.py``
file, once per file: one loader and one cache for every stage that takes user code."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from stepcredit.errors import ConfigError

BY_PATH_PREFIX = "_stepcredit_user_"
"""Module names of files imported by path (they cannot be re-imported by name)."""

_FILE_CACHE: dict[str, Any] = {}


def loaded_by_path(module: str) -> bool:
    """Was ``module`` loaded from a file path (by us, or pytest's importlib mode), so a fresh process
    cannot import it by name?"""
    if module.startswith(BY_PATH_PREFIX):
        return True
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def load_file(path: str, *, what: str = "user code") -> Any:
    """The module of the ``.py`` file ``path``, imported once (cached by path); a ConfigError naming
    ``what`` and the file when it is missing or fails to import."""
    if path in _FILE_CACHE:
        return _FILE_CACHE[path]
    if not os.path.isfile(path):
        raise ConfigError(f"{what} file {path} does not exist")
    name = BY_PATH_PREFIX + str(abs(hash(path)))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{what} file {path} is not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    # Its folder is importable, as a script's is, so ``from helpers import x`` finds a file beside it;
    # appended, so a file there named like a standard or installed module (random.py) shadows nothing.
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.modules.pop(name, None)
        hint = ""
        if isinstance(e, ImportError) and "relative import" in str(e):
            hint = " (a file loaded by path is in no package: import absolutely, or name it pkg.module:fn)"
        raise ConfigError(f"{what} file {path} failed to import: {type(e).__name__}: {e}{hint}") from None
    _FILE_CACHE[path] = mod
    return mod


def load_module(target: str, *, what: str = "user code") -> Any:
    """A dotted module name or a path to a ``.py`` file (``~`` expanded, relative to the working
    directory), imported once; a ConfigError naming ``what`` otherwise."""
    if target.endswith(".py"):
        return load_file(os.path.abspath(os.path.expanduser(target)), what=what)
    try:
        return importlib.import_module(target)
    except Exception as e:  # ImportError, or the module's own failure at import
        raise ConfigError(f"{what} module {target!r} cannot be imported: {type(e).__name__}: {e}") from None
