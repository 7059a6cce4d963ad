"""Training prestarts the reward pool's workers (``reward.agent.prestart``) and leaves none behind."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from stepcredit.cli.main import main
from stepcredit.reward.run.pool import KillSafePool


@pytest.mark.parametrize("prestart", [True, False])
def test_training_prestarts_the_process_pool_only_when_asked(
    tmp_path: Path, tiny_train: list[str], monkeypatch: pytest.MonkeyPatch, prestart: bool
) -> None:
    # an untrained policy's answers are decided by the in-process fast path: without the prestart the
    # pool would start only at the first sample that needs math-verify, mid-run
    pools: list[KillSafePool] = []
    real = KillSafePool.prestart

    def spy(self: KillSafePool) -> object:
        pools.append(self)
        return real(self)

    monkeypatch.setattr(KillSafePool, "prestart", spy)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    args = [*tiny_train, "sft.steps=0", "trainer.steps=2", "trainer.val_every=0", "trainer.save_every=0",
            "reward.agent.backend=process", f"reward.agent.prestart={str(prestart).lower()}"]  # fmt: skip
    assert main(["train", *args, "--out", str(tmp_path / "run")]) == 0
    assert len(pools) == (1 if prestart else 0)
    for pool in pools:  # closed with the run: its prestart ended, and no worker is left
        assert pool._closed and not pool.pids
        assert all(not t.is_alive() for t in pool._prestarts)
    left = {c.pid for c in psutil.Process().children(recursive=True)} - before
    assert all(_gone(p) for p in left)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
