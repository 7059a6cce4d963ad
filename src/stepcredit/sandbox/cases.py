"""Test cases of code rewards and the trusted side of judging them (everything here runs on the host).

This module reads the ground truth (:func:`parse_tests`) and compares outputs; the plain values live in
:mod:`.plain`, the assert cases in :mod:`.asserts` and the references into the sandbox in :mod:`.remote`
(their names are re-exported here).

The program under test never sees an expected value, an assert statement or a secret. It only answers
questions about its own behaviour: "what do you print on this input", "what does ``f(1, 2)`` return".
Every answer crosses the sandbox boundary in a small tagged JSON form (:func:`.plain.decode_plain`) that
can only describe exact builtin values (``int``, ``float``, ``str``, ``bool``, ``None``, ``list``,
``tuple``, ``dict``, ``set``): no subclass, no object with its own ``__eq__``, nothing that runs code.
Comparisons, ``assert`` expressions and every operator on those values are then evaluated here, on the
host, by :func:`.asserts.evaluate_assert` (``==`` of two plain values is Python's own and cannot be
overridden).

An ``assert_case`` is split at the boundary: names the test does not define and that are not one of a few
pure builtins (``len``, ``sorted``, ``math.isclose``...) belong to the program and become
:class:`.remote.Remote` references. Attribute lookups and calls on them are forwarded into the sandbox
(with plain arguments); what comes back is a plain value, or another reference when the program's class
was instantiated (``Solution().twoSum``, ``MinStack().push``). Any other use of a reference (comparing,
``bool``, ``len``, iterating, hashing) is refused, so an always-equal object cannot pass.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from stepcredit.sandbox.asserts import AssertFailed, AssertPlan, evaluate_assert, plan_assert
from stepcredit.sandbox.plain import MAX_DEPTH, NotPlain, decode_plain, encode_plain
from stepcredit.sandbox.remote import NeedsConversation, ProgramRaised, Remote, RemoteLink

__all__ = [  # this module held the plain values, assert cases and remote links before they moved out
    "MAX_DEPTH",
    "AssertFailed",
    "AssertPlan",
    "CaseMode",
    "NeedsConversation",
    "NotPlain",
    "ProgramRaised",
    "Remote",
    "RemoteLink",
    "TestCase",
    "decode_plain",
    "encode_plain",
    "evaluate_assert",
    "extract_code",
    "outputs_match",
    "parse_tests",
    "plan_assert",
    "values_match",
]

# ------------------------------------------------------------------------------------ extraction
_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str | None:
    """The last fenced block labelled python/py/python3 (or, if none is labelled, the last unlabelled one)."""
    blocks = _FENCE_RE.findall(response)
    labelled = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if labelled:
        return labelled[-1]
    bare = [body for lang, body in blocks if not lang]
    return bare[-1] if bare else None


# ------------------------------------------------------------------------------------ test cases
class CaseMode(str, Enum):
    """How a test case meets the program; the value is the ground truth's and the runner's name for it."""

    STDIO = "stdio"
    """stdin in, stdout compared with the expected output."""
    ASSERT = "assert"
    """An assert statement about the program, evaluated on the host (calls answered by the program)."""
    CALL = "call"
    """``fn(*args)`` (or ``Solution().fn``) compared with the expected value."""

    @property
    def module(self) -> str:
        """The program's ``__name__`` when the host calls into it: not ``__main__`` in call mode, so that a
        LeetCode-style solution's own demo under its ``__main__`` guard does not run (and block on stdin)."""
        return "solution" if self is CaseMode.CALL else "__main__"


@dataclass(frozen=True)
class TestCase:
    """One test case: ``stdio`` (input -> expected stdout), ``assert`` or ``call`` (fn(*args) == expected)."""

    mode: CaseMode
    stdin: str = ""
    expected: Any = None
    assert_src: str = ""
    fn_name: str = ""
    args: tuple[Any, ...] = ()
    plan: AssertPlan | None = field(default=None, compare=False, repr=False)
    """The parsed assert statement (assert mode), checked when the ground truth is read."""

    def __post_init__(self) -> None:
        if not isinstance(self.mode, CaseMode):  # TestCase("stdio", ...) as written before the enum
            object.__setattr__(self, "mode", CaseMode(self.mode))


def parse_tests(ground_truth: Any) -> list[TestCase]:
    """Test cases from VeRL's ground-truth formats (a dict or its JSON string); ValueError if malformed."""
    gt = ground_truth
    if isinstance(gt, (bytes, str)):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError as e:
            raise ValueError(f"code ground truth is not valid JSON ({e})") from None
    if isinstance(gt, list) and all(isinstance(a, str) for a in gt):
        gt = {"assert_case": gt}
    if not isinstance(gt, dict):
        raise ValueError(f"code ground truth must be a mapping, got {type(gt).__name__}")
    asserts = gt.get("assert_case")
    if isinstance(asserts, list) and asserts:
        return [TestCase(CaseMode.ASSERT, assert_src=str(a), plan=plan_assert(str(a))) for a in asserts]
    inputs, outputs = gt.get("inputs"), gt.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("code ground truth needs 'assert_case' or lists 'inputs' and 'outputs'")
    if len(inputs) != len(outputs):
        raise ValueError(f"code ground truth has {len(inputs)} inputs but {len(outputs)} outputs")
    if not inputs:
        raise ValueError("code ground truth has no test cases")
    fn_name = gt.get("fn_name")
    if fn_name:
        if not str(fn_name).isidentifier():
            raise ValueError(f"code ground truth's fn_name {fn_name!r} is not a Python name")
        return [
            TestCase(CaseMode.CALL, fn_name=str(fn_name), args=tuple(_call_args(i)), expected=_maybe_json(o))
            for i, o in zip(inputs, outputs, strict=True)
        ]
    return [
        TestCase(CaseMode.STDIO, stdin=_text(i), expected=_text(o))
        for i, o in zip(inputs, outputs, strict=True)
    ]


def _text(x: Any) -> str:
    if isinstance(x, list):
        return "\n".join(str(v) for v in x)
    return "" if x is None else str(x)


def _call_args(x: Any) -> list[Any]:
    # TACO stores a list of arguments; Sandbox Fusion one JSON value per line.
    if isinstance(x, list):
        return x
    if isinstance(x, str):
        return [json.loads(line) for line in x.splitlines() if line.strip()]
    return [x]


def _maybe_json(x: Any) -> Any:
    if isinstance(x, str):
        try:
            return json.loads(x)
        except json.JSONDecodeError:
            return x
    return x


_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def outputs_match(got: str, expected: str) -> bool:
    """Line-wise equality ignoring trailing whitespace, else token-wise: integers exactly, decimals
    (a point or an exponent) equal to 1e-6."""
    norm_got = [line.rstrip() for line in got.strip().splitlines()]
    norm_exp = [line.rstrip() for line in expected.strip().splitlines()]
    if norm_got == norm_exp:
        return True
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(x == y or _tokens_match(x, y) for x, y in zip(a, b, strict=True))


def _tokens_match(x: str, y: str) -> bool:
    # float() would read "1_0", "١٠" or "infinity", and makes every integer of 309 digits or more inf.
    if _INTEGER.fullmatch(x) and _INTEGER.fullmatch(y):
        return int(x) == int(y)
    if not (_DECIMAL.fullmatch(x) and _DECIMAL.fullmatch(y)):
        return False
    return _close(float(x), float(y))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def values_match(got: Any, expected: Any) -> bool:
    """Plain values equal up to tuple/list and 1e-6 where a float is compared (two ints: exactly);
    TACO's one-item list wrapping accepted.

    ``got`` must come from :func:`decode_plain` (exact builtins), so no comparison here runs its code.
    """
    if _eq(got, expected):
        return True
    return isinstance(expected, list) and len(expected) == 1 and _eq(got, expected[0])


def _eq(a: Any, b: Any) -> bool:
    a = list(a) if isinstance(a, tuple) else a
    b = list(b) if isinstance(b, tuple) else b
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if type(a) is int and type(b) is int:
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        try:
            return _close(a, b)
        except OverflowError:  # an int too large for a float: no float is that close to it
            return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    return bool(a == b)
