"""The run directory's metrics file: a fresh run starts it over, a resumed run keeps the rows up to its
checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from stepcredit.config import TrainerConfig
from stepcredit.trainer.metrics import MetricsLogger


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_a_fresh_run_starts_the_file_over_and_a_resume_truncates_it(tmp_path: Path) -> None:
    cfg = TrainerConfig(tensorboard=False)
    for _ in range(2):  # the second run into the same directory must not append to the first's rows
        log = MetricsLogger(tmp_path, cfg, None)
        for step in range(4):
            log.log({"step": step})
        log.close()
        assert _steps(tmp_path) == [0, 1, 2, 3]
    log = MetricsLogger(tmp_path, cfg, {"step": 2})  # resumed from step 2's checkpoint
    log.log({"step": 3})
    log.close()
    assert _steps(tmp_path) == [0, 1, 2, 3]
