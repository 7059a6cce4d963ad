"""The code sandbox on well-behaved programs: formats, scoring modes, statuses, sandbox failures."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from stepcredit.config import SandboxConfig
from stepcredit.reward.verifiers.code import sandbox as sb
from stepcredit.types import Status

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
CFG = SandboxConfig(timeout_s=2.0, memory_mb=256)


def fenced(code: str, lang: str = "python") -> str:
    return f"Reasoning...\n```{lang}\n{code}\n```\nDone."


@pytest.fixture(scope="module")
def box() -> sb.Sandbox:
    return sb.Sandbox(CFG)


# ------------------------------------------------------------------------------ pure helpers
def test_extract_code_takes_the_last_python_block() -> None:
    text = "```python\nprint(1)\n```\n```text\nnot code\n```\n```py\nprint(2)\n```\n"
    assert sb.extract_code(text) == "print(2)\n"
    assert sb.extract_code("```\nprint(3)\n```") == "print(3)\n"  # unlabelled only as a fallback
    assert sb.extract_code("no code here") is None


def test_parse_tests_reads_verl_formats() -> None:
    stdio = sb.parse_tests(json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}))
    assert stdio == [sb.TestCase("stdio", stdin="1 2\n", expected="3\n")]
    asserts = sb.parse_tests({"assert_case": ["assert f(1) == 2"], "inputs": [""], "outputs": [None]})
    assert asserts == [sb.TestCase("assert", assert_src="assert f(1) == 2")]
    # TACO stores argument lists; Sandbox Fusion one JSON value per line.
    calls = sb.parse_tests({"fn_name": "f", "inputs": [[1, 2], "3\n4"], "outputs": [3, "7"]})
    assert [c.args for c in calls] == [(1, 2), (3, 4)] and [c.expected for c in calls] == [3, 7]
    for bad in ("{nope", {"inputs": [1]}, {"inputs": [1], "outputs": []}, 3):
        with pytest.raises(ValueError):
            sb.parse_tests(bad)


def test_output_and_value_comparison() -> None:
    assert sb.outputs_match("1 2  \n3\n\n", "1 2\n3")
    assert sb.outputs_match("0.3333333", "0.33333333")
    assert not sb.outputs_match("1 2", "1 3")
    assert sb.values_match((1, [2.0000001]), [1, [2]])
    assert sb.values_match(5, [5])  # TACO wraps single outputs in a list
    assert not sb.values_match(True, 1)


def test_integers_compare_exactly_and_only_floats_get_a_tolerance() -> None:
    # Integers went through float() with a relative tolerance of 1e-6: an answer off by one passed from
    # 10**6 up, any two integers of 309 digits or more were both inf (equal), and a right answer that
    # large raised OverflowError in math.isclose (an error verdict for a right answer).
    assert not sb.outputs_match("1000001", "1000000")
    assert not sb.outputs_match("1" * 400, "2" * 400)
    assert not sb.values_match(1000001, 1000000)
    assert not sb.values_match([10**400 + 1], [10**400])
    assert sb.outputs_match("9" * 400, "9" * 400) and sb.values_match(10**400, 10**400)
    assert sb.outputs_match("+7 007", "7 7")  # the same integers, written otherwise
    assert sb.outputs_match("3.0000001", "3") and sb.values_match(3.0000001, 3)  # a float: tolerance
    assert not sb.outputs_match("1_0", "10")  # float() and int() read underscores; an answer has none


# ------------------------------------------------------------------------------ running
@needs_bwrap
def test_stdio_fraction_and_all_or_nothing(box: sb.Sandbox) -> None:
    resp = fenced("n = int(input())\nprint(n * 2 if n < 10 else n)")
    gt = {"inputs": ["2\n", "3\n", "10\n", "20\n"], "outputs": ["4\n", "6\n", "20\n", "40\n"]}
    res = sb.score_code(resp, gt, sandbox=box)
    # cases 1 and 2 pass, 3 and 4 print n instead of 2n: 2/4.
    assert (res.status, res.score) == (Status.OK, 0.5)
    assert [c["status"] for c in res.info["cases"]] == ["passed", "passed", "failed", "failed"]
    strict = sb.score_code(resp, gt, sandbox=sb.Sandbox(CFG.__class__(timeout_s=2.0, scoring="all")))
    assert strict.score == 0.0 and strict.status == Status.OK
    assert "skipped" in strict.info["cases"][3]["message"]


@needs_bwrap
def test_assert_and_call_cases(box: sb.Sandbox) -> None:
    res = sb.score_code(
        fenced("def add(a, b):\n    return a + b"), {"assert_case": ["assert add(1, 2) == 3"]}, sandbox=box
    )
    assert (res.status, res.score) == (Status.OK, 1.0)
    code = "class Solution:\n    def twice(self, xs):\n        return [2 * x for x in xs]\n"
    gt = {"fn_name": "twice", "inputs": [[[1, 2]], [[0]]], "outputs": [[2, 4], [1]]}
    res = sb.score_code(fenced(code), gt, sandbox=box)
    assert res.score == 0.5 and res.status == Status.OK


@needs_bwrap
def test_program_failures_keep_their_score_with_a_failure_status(box: sb.Sandbox) -> None:
    code = "import time\nn = int(input())\nif n == 0:\n    raise ValueError\nif n == 1:\n    time.sleep(60)\nprint(n)"
    res = sb.score_code(fenced(code), {"inputs": ["2", "0"], "outputs": ["2", "0"]}, sandbox=box)
    assert (res.status, res.score) == (Status.PROGRAM_ERROR, 0.5)
    assert "ValueError" in res.info["message"]
    res = sb.score_code(fenced(code), {"inputs": ["2", "1"], "outputs": ["2", "1"]}, sandbox=box)
    assert (res.status, res.score) == (Status.PROGRAM_TIMEOUT, 0.5)
    # the program's failure is the model's fault: a real verdict, so the failure policy never masks it
    assert res.ok
    res = sb.score_code(fenced("def f(:\n  pass"), {"assert_case": ["assert f()"]}, sandbox=box)
    assert res.status == Status.PROGRAM_ERROR and "SyntaxError" in res.info["message"] and res.ok


@needs_bwrap
def test_memory_counts_every_process_of_a_case_and_spares_a_modest_one() -> None:
    """RLIMIT_AS caps each process alone: the runner adds up what the case's processes hold. Four workers
    holding 40 MB each (160 MB together) pass under a 256 MB limit; holding 100 MB each (each within
    RLIMIT_AS, 400 MB together) they stop the case with a memory error, whatever the program prints."""
    code = (
        "import os, time\n"
        "mb = int(input())\n"
        "kids = []\n"
        "for _ in range(4):\n"
        "    r, w = os.pipe()\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = bytearray(mb << 20)\n"
        "        for i in range(0, len(block), 4096):\n"
        "            block[i] = 1\n"
        "        os.write(w, b'x')\n"
        "        time.sleep(0.5)\n"
        "        os._exit(0)\n"
        "    kids.append((pid, r))\n"
        "for pid, r in kids:\n"
        "    os.read(r, 1)\n"
        "    os.waitpid(pid, 0)\n"
        "print('done')\n"
    )
    box = sb.Sandbox(SandboxConfig(timeout_s=20.0, memory_mb=256))
    res = sb.score_code(fenced(code), {"inputs": ["40"], "outputs": ["done"]}, sandbox=box)
    assert (res.status, res.score) == (Status.OK, 1.0), res.info
    res = sb.score_code(fenced(code), {"inputs": ["100"], "outputs": ["done"]}, sandbox=box)
    assert (res.status, res.score) == (Status.PROGRAM_ERROR, 0.0), res.info
    assert "memory limit exceeded" in res.info["message"], res.info


@needs_bwrap
def test_cpu_time_counts_every_process_of_a_case() -> None:
    """RLIMIT_CPU stops each process alone: 16 spinning processes took 16 times ``cpu_s`` within the wall
    clock. The runner adds up their CPU time and stops the case past ``cpu_s`` (a timeout, as SIGXCPU is)."""
    code = "import os\nfor _ in range(4):\n    os.fork()\nwhile True:\n    pass\n"
    box = sb.Sandbox(SandboxConfig(timeout_s=60.0, cpu_s=1, memory_mb=256))
    res = sb.score_code(fenced(code), {"inputs": [""], "outputs": ["x"]}, sandbox=box)
    assert res.status == Status.PROGRAM_TIMEOUT, res.info
    assert "CPU-time limit exceeded: the program's processes spent" in res.info["message"], res.info


@needs_bwrap
def test_a_live_test_holds_processes_left_working_to_the_memory_cap() -> None:
    """A test that talks with the program (mode ``eval``) leaves it running while the host thinks between
    requests. Processes the program forked and left working meanwhile (four of 100 MB each: 400 MB
    together, each within RLIMIT_AS) break a 256 MB cap though every reply was right; four of 40 MB pass."""
    code = (
        "import os, time\n"
        "class Hogs:\n"
        "    def start(self, n, mb):\n"
        "        for _ in range(n):\n"
        "            if os.fork() == 0:\n"
        "                block = bytearray(mb << 20)\n"
        "                for i in range(0, len(block), 4096):\n"
        "                    block[i] = 1\n"
        "                time.sleep(30)\n"
        "                os._exit(0)\n"
        "        return n\n"
    )
    # the host's own work after the reply (about a second) gives the processes time to fill their blocks
    test = "h = Hogs()\nassert h.start(4, {mb}) == 4\nassert min(sum(range(10**7)) for _ in range(8)) > 0\n"
    box = sb.Sandbox(SandboxConfig(timeout_s=20.0, memory_mb=256))
    res = sb.score_code(fenced(code), {"assert_case": [test.format(mb=40)]}, sandbox=box)
    assert (res.status, res.score) == (Status.OK, 1.0), res.info
    res = sb.score_code(fenced(code), {"assert_case": [test.format(mb=100)]}, sandbox=box)
    assert (res.status, res.score) == (Status.PROGRAM_ERROR, 0.0), res.info
    assert "memory limit exceeded" in res.info["message"], res.info


def test_unparseable_and_bad_ground_truth(box: sb.Sandbox) -> None:
    res = sb.score_code("I would loop forever.", {"inputs": ["1"], "outputs": ["1"]}, sandbox=box)
    assert (res.status, res.score) == (Status.UNPARSEABLE, 0.0)
    res = sb.score_code(fenced("print(1)"), "not json", sandbox=box)
    assert res.status == Status.ERROR and math.isnan(res.score) and not res.ok


def test_missing_bubblewrap_is_a_sandbox_error_never_a_pass() -> None:
    box = sb.Sandbox(CFG, bwrap="")
    res = sb.score_code(fenced("print(1)"), {"inputs": [""], "outputs": ["1"]}, sandbox=box)
    assert res.status == Status.SANDBOX_ERROR and math.isnan(res.score)
    assert "bubblewrap" in res.info["message"]
    assert not res.ok


@needs_bwrap
def test_broken_sandbox_is_a_sandbox_error_never_a_pass() -> None:
    for box in (
        sb.Sandbox(CFG, bwrap="/bin/false"),  # bwrap "runs" but nothing starts
        sb.Sandbox(SandboxConfig(python="/nonexistent/python3")),
    ):
        res = sb.score_code(fenced("print(1)"), {"inputs": [""], "outputs": ["1"]}, sandbox=box)
        assert res.status == Status.SANDBOX_ERROR and math.isnan(res.score), res
    # A run whose sandbox cannot start is never classified as a program failure.
    out = sb.Sandbox(CFG, bwrap="/bin/false").judge("print(1)", sb.TestCase("stdio", expected="1"))
    assert out.status == sb.SANDBOX_ERROR


@needs_bwrap
def test_batch_runs_concurrently_and_keeps_order(box: sb.Sandbox) -> None:
    responses = [fenced(f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(4)]
    truths = [{"inputs": [""], "outputs": [str(i if i != 2 else 99)]} for i in range(4)]
    results = sb.score_code_batch(responses, truths, sandbox=box)
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 1.0]


@needs_bwrap
def test_code_rows_through_stepcredit_score(tmp_path: Path) -> None:
    import argparse

    from stepcredit.cli import score

    rows = [
        {
            "data_source": "code",
            "response": fenced("print(int(input()) + 1)"),
            "ground_truth": '{"inputs": ["1"], "outputs": ["2"]}',
        },
        {
            "data_source": "apps",
            "response": fenced("while True: pass"),
            "reward_model": {"ground_truth": {"inputs": ["1"], "outputs": ["2"]}},
        },
        {
            "data_source": "code",
            "response": "no code at all",
            "ground_truth": '{"inputs": ["1"], "outputs": ["2"]}',
        },
    ]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parser = argparse.ArgumentParser()
    score.configure(parser)
    assert score.run(parser.parse_args(["--in", str(inp), "--out", str(out)])) == 0
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(g["status"], g["score"], g["source"]) for g in got] == [
        ("ok", 1.0, "code"),
        ("program_timeout", 0.0, "code"),
        ("unparseable", 0.0, "code"),
    ]
