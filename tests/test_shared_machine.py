"""``benchmarks/shared_machine.py``'s yardstick: the slowdown of a run that only loses its share of the
cores (what a run beside busy processes should show once its threads no longer spin, issue 45)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_the_proportional_slowdown_is_the_runnable_threads_per_core() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from shared_machine import proportional_ratio
    finally:
        sys.path.remove(str(BENCH))
    # 2 threads + 2 spinners on 2 cores: each gets half a core, so the run takes 2x
    assert proportional_ratio(threads=2, busy=2, cores=2) == 2.0
    # room for everyone: no slowdown; 1 thread + 1 spinner on 2 cores: a core each
    assert proportional_ratio(threads=2, busy=0, cores=2) == 1.0
    assert proportional_ratio(threads=1, busy=1, cores=2) == 1.0
    # 4 + 2 runnable threads on 2 cores: 3x; on 16 cores: none
    assert proportional_ratio(threads=4, busy=2, cores=2) == 3.0
    assert proportional_ratio(threads=4, busy=2, cores=16) == 1.0
