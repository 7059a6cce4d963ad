"""``benchmarks/gpu_check.sh --prepare``: the packages the GPU machine lacks travel as plain folders with
their ``.dist-info``, and a Python that finds them first on its path imports and uses them from there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.sh"

USE = """
import importlib.metadata as md, json, math_verify, latex2sympy2_extended, antlr4
from math_verify import parse, verify
print(json.dumps({
    "files": [m.__file__ for m in (math_verify, latex2sympy2_extended, antlr4)],
    "antlr": md.version("antlr4-python3-runtime"),
    "half": verify(parse("$\\\\frac{1}{2}$"), parse("$0.5$")),
}))
"""


def test_prepare_carries_math_verify_with_its_metadata(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "GPU_SITE": str(site), "PYTHON": sys.executable}
    subprocess.run(["bash", str(SCRIPT), "--prepare"], env=env, check=True, capture_output=True, timeout=120)
    names = sorted(p.name for p in site.iterdir())
    assert [n for n in names if not n.endswith(".dist-info")] == [
        "antlr4",
        "latex2sympy2_extended",
        "math_verify",
    ]
    assert len([n for n in names if n.endswith(".dist-info")]) == 3
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", USE], env=env, check=True, capture_output=True, text=True, timeout=120
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(f.startswith(str(site)) for f in got["files"]), got["files"]  # the carried copies
    assert got["antlr"] == "4.9.3" and got["half"] is True  # LaTeX parsed with the carried runtime


def test_without_cuda_the_check_stops_with_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "gpu_check: no usable CUDA device" in out.stdout
    assert list(tmp_path.iterdir()) == []  # no test or benchmark ran
