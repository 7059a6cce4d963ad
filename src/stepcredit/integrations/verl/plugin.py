"""verl's plugin entry point: importing this module registers stepcredit in verl.

verl >= 0.9 runs ``entry_point.load()`` for every entry point of the ``verl.plugins`` group at the end
of ``import verl``, in every process (driver, task runner, reward workers, actor workers). ``load()``
imports the module and never calls anything, so registration happens at import, below. verl catches
a plugin's exceptions and logs them at DEBUG level, i.e. invisibly; so every failure here is caught
and reported at ERROR level on verl's logger *and* on stderr, and the rest still registers.

Registered: the ``stepcredit_*`` advantage estimators, the ``stepcredit`` reward manager and the
``stepcredit_sync`` v1 trainer (the last needs verl's v1 trainer dependencies, e.g. TransferQueue;
without them it is skipped with an INFO line, since verl's v1 trainer cannot run either).
"""

from __future__ import annotations

import logging
import sys

SUPPORTED = ((0, 9), (0, 10))
"""verl versions this plugin was written against: >= 0.9, < 0.10 (tested with 0.9.1)."""

logger = logging.getLogger("stepcredit.integrations.verl")

REGISTERED: dict[str, list[str]] = {}
"""What the last :func:`register` put into verl: kind -> names (for tests and diagnostics)."""


def _loud(msg: str) -> None:
    logger.error(msg)
    print(f"[stepcredit] {msg}", file=sys.stderr, flush=True)


def version_ok(version: str) -> bool:
    """Whether verl ``version`` (e.g. "0.9.1", "0.9.2.dev0") is in the supported range."""
    try:
        parts = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return SUPPORTED[0] <= parts < SUPPORTED[1]


def register() -> dict[str, list[str]]:
    """Register everything in verl; failures are logged loudly, never raised (verl would hide them)."""
    try:
        import verl

        version = str(getattr(verl, "__version__", "?"))
    except Exception as e:
        _loud(f"verl plugin: cannot import verl ({type(e).__name__}: {e}); nothing registered")
        return {}
    lo, hi = (".".join(map(str, v)) for v in SUPPORTED)
    if not version_ok(version):
        _loud(
            f"verl plugin: verl {version} is outside the supported range >={lo},<{hi}; nothing registered "
            f"(install a supported verl: pip install 'stepcredit[verl]')"
        )
        return {}
    out: dict[str, list[str]] = {}
    try:
        from stepcredit.integrations.verl.estimators import register_estimators

        out["estimators"] = register_estimators()
    except Exception as e:
        _loud(f"verl plugin: advantage estimators not registered: {type(e).__name__}: {e}")
    try:
        from stepcredit.integrations.verl.reward_manager import NAME

        out["reward_managers"] = [NAME]
    except Exception as e:
        _loud(f"verl plugin: reward manager 'stepcredit' not registered: {type(e).__name__}: {e}")
    try:
        from stepcredit.integrations.verl.trainer import NAME as TRAINER

        out["trainers"] = [TRAINER]
    except ModuleNotFoundError as e:
        if e.name and not e.name.startswith(("stepcredit", "verl")):  # an optional dependency of verl v1
            logger.info("verl plugin: trainer 'stepcredit_sync' not registered (verl's v1 needs %s)", e.name)
        else:
            _loud(f"verl plugin: trainer 'stepcredit_sync' not registered: {type(e).__name__}: {e}")
    except Exception as e:
        _loud(f"verl plugin: trainer 'stepcredit_sync' not registered: {type(e).__name__}: {e}")
    REGISTERED.clear()
    REGISTERED.update(out)
    return out


register()
