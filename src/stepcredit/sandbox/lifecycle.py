"""A jail's life: started (possibly before its program is known), used for exactly one program, then
stopped; and a batch's jails, the next one started while the current program runs.

Starting a jail (bubblewrap's namespaces and mounts, then the runner's interpreter) and tearing it
down cost more than a short program's cases. A :class:`Batch` hides both behind the cases of the
programs around them: it starts the next program's jail as a program begins, and stops a program's
jail in the background once all its cases are judged. Every jail still serves one program only and
never outlives the batch: :meth:`Batch.close` (before the batch's results are handed out) waits for
every background stop and stops any jail started for a program that never took it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stepcredit.sandbox.dirs import make_sandbox_dir
from stepcredit.sandbox.jail import _sweep_uid, as_uid, claim_uid, release_uid
from stepcredit.sandbox.judging import SANDBOX_ERROR, CaseOutcome
from stepcredit.sandbox.session import _Session


@dataclass
class Jail:
    """One started sandbox for one program: its host folder, its uid (and lock), its runner session."""

    host_dir: str
    uid: int | None
    uid_fd: int
    session: _Session | None = None
    error: str | None = None
    """Why bubblewrap could not be started (then ``session`` is None)."""


def start_jail(
    command: Callable[[str], list[str]], *, runner: tuple[str, bytes], root: bool, line_cap: int
) -> Jail:
    """Start a jail (``command(host_dir)`` is its bubblewrap command line, ``runner`` the runner's file
    name and contents, see :func:`~.session.runner_file`): returns as soon as bubblewrap is running; the
    runner says hello when it is ready for its program."""
    host_dir = make_sandbox_dir()
    uid, uid_fd = None, -1
    try:
        # Traversable (not listable) so that bwrap, started as the run's uid, can bind the runner in.
        os.chmod(host_dir, 0o711)
        path = os.path.join(host_dir, runner[0])
        with open(path, "wb") as f:
            f.write(runner[1])
        os.chmod(path, 0o444)
        uid, uid_fd = claim_uid(root)
        jail = Jail(host_dir, uid, uid_fd)
        argv, extra = as_uid(command(host_dir), uid)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
                **extra,
            )
        except OSError as e:
            jail.error = f"cannot start bubblewrap: {e}"
            return jail
        jail.session = _Session(proc, line_cap=line_cap)
        return jail
    except BaseException:
        release_uid(uid_fd)
        shutil.rmtree(host_dir, ignore_errors=True)
        raise


def finish_jail(jail: Jail, *, graceful: bool) -> int:
    """Stop the jail, free its uid and remove its folder; how many of its processes outlived it (0 is
    normal: a graceful stop whose runner exited cleanly leaves nothing, see ``_Session.close``)."""
    try:
        if jail.session is None:
            return 0
        clean = jail.session.close(graceful=graceful)
        # The uid's own sweep is the safety net for a sandbox we had to kill.
        return _sweep_uid(jail.uid) if jail.uid is not None and not clean else 0
    finally:
        release_uid(jail.uid_fd)
        shutil.rmtree(jail.host_dir, ignore_errors=True)


def outlived(left: int, n: int) -> list[CaseOutcome]:
    """The verdicts of a program whose sandbox left ``left`` processes behind (``n`` cases)."""
    return [CaseOutcome(SANDBOX_ERROR, f"{left} processes outlived the sandbox and were killed")] * n


class Batch:
    """The jails of one batch of ``total`` programs: at most ``ahead`` started before their program,
    finished programs' jails stopped in the background.

    bubblewrap's ``--die-with-parent`` fires when the *thread* that started it ends, so :meth:`take`
    and :meth:`start_ahead` (which start jails) are called only from the batch's worker threads, and
    :meth:`close` runs before those threads end."""

    def __init__(self, start: Callable[[], Jail], *, total: int, ahead: int = 1) -> None:
        self._start = start
        self._ahead = ahead
        self._lock = threading.Lock()
        self._ready: list[Jail] = []
        self._unstarted = total  # jails still to start: one per program, never more
        self._starting = 0
        self._stopping: list[threading.Thread] = []

    def take(self) -> Jail:
        """The jail for the calling worker's next program: one started ahead, else one started now."""
        with self._lock:
            jail = self._ready.pop(0) if self._ready else None
            if jail is None:
                self._unstarted -= 1
        return jail if jail is not None else self._start()

    def start_ahead(self) -> None:
        """Start jails for the programs to come, up to ``ahead`` waiting (from a worker thread, while its
        own program's cases run: the start's fork and bubblewrap's set-up overlap them)."""
        with self._lock:
            n = max(0, min(self._ahead - len(self._ready) - self._starting, self._unstarted))
            self._unstarted -= n
            self._starting += n
        for _ in range(n):
            try:
                jail = self._start()
            except Exception:  # the program that would have taken it starts its own (and reports why)
                with self._lock:
                    self._starting -= 1
                    self._unstarted += 1
                continue
            with self._lock:
                self._starting -= 1
                self._ready.append(jail)

    def finish_later(self, jail: Jail, outcomes: list[CaseOutcome]) -> list[CaseOutcome]:
        """Stop a jail whose program is judged (cleanly) in the background; ``outcomes`` become sandbox
        errors, in place, should processes outlive it (before :meth:`close` returns)."""
        assert jail.session is not None
        if not jail.session.end_input():
            left = finish_jail(jail, graceful=False)
            return outlived(left, len(outcomes)) if left else outcomes

        def stop() -> None:
            left = finish_jail(jail, graceful=True)
            if left:
                outcomes[:] = outlived(left, len(outcomes))

        t = threading.Thread(target=stop, name="stepcredit-sandbox-stop", daemon=True)
        t.start()
        with self._lock:
            self._stopping.append(t)
        return outcomes

    def close(self) -> None:
        """Wait for every background stop; stop the jails no program took."""
        with self._lock:
            stopping, self._stopping = self._stopping, []
            ready, self._ready = self._ready, []
        for t in stopping:
            t.join()
        for jail in ready:
            finish_jail(jail, graceful=True)
