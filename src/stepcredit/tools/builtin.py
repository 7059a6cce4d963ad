"""The built-in tools: ``calculator`` (exact arithmetic on a parsed expression, no ``eval``) and
``python`` (the policy's code run in the code sandbox, :mod:`stepcredit.sandbox`, under the run's
``reward.sandbox`` limits)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from stepcredit.tools.core import ToolError, register_tool

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 64
"""Largest power the calculator computes: 9**9**9 would take the worker's memory, not give an answer."""
_MAX_DIGITS = 200
"""Most digits of a result's numerator or denominator (1/7**64 repeated under ** grows only the latter)."""
_MAX_BITS = 700
"""A value with more bits than this has more than 200 digits (2**700 is about 5e210): a power whose
base has ``b`` bits and whose exponent is ``e`` has at least ``(b - 1) * |e| + 1``, so it is refused
before it is computed."""
MAX_EXPRESSION_CHARS = 2000
"""Longest expression the calculator reads: a 100 KB one is refused before ``ast.parse`` (whose parser
and the evaluation recurse once per nesting level), as ``bad_arguments``."""


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _small(x: Fraction) -> Fraction:
    """``x``, or a ToolError when its numerator or its denominator has more than 200 digits (bits
    first: ``str`` of a huge int is slow, and past Python's digit limit it raises)."""
    if _bits(x) > _MAX_BITS or max(len(str(abs(x.numerator))), len(str(x.denominator))) > _MAX_DIGITS:
        raise ToolError("bad_expression", f"result has more than {_MAX_DIGITS} digits")
    return x


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression of numbers, + - * / // % ** and parentheses.
    Raises ToolError (kind ``bad_expression``) for anything else, ``bad_arguments`` for an expression
    longer than :data:`MAX_EXPRESSION_CHARS` or nested too deeply to parse."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(
            "bad_arguments",
            f"the expression has {len(expression)} characters (at most {MAX_EXPRESSION_CHARS})",
        )
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise ToolError("bad_expression", f"cannot parse {expression[:60]!r}: {e.msg}") from None
    except (RecursionError, MemoryError, ValueError) as e:  # too deep for the parser; a NUL byte
        raise ToolError("bad_arguments", f"cannot parse the expression ({type(e).__name__})") from None

    def ev(node: ast.AST) -> Fraction:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
        ):
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (b.denominator != 1 or abs(b) > _MAX_EXPONENT):
                raise ToolError("bad_expression", f"exponent {b} is not an integer up to {_MAX_EXPONENT}")
            if isinstance(node.op, ast.Pow) and (_bits(a) - 1) * abs(b) > _MAX_BITS:
                raise ToolError("bad_expression", f"result has more than {_MAX_DIGITS} digits")
            try:
                out = Fraction(_BINARY[type(node.op)](a, b))
            except ZeroDivisionError:
                raise ToolError("bad_expression", "division by zero") from None
            return _small(out)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return Fraction(_UNARY[type(node.op)](ev(node.operand)))
        raise ToolError("bad_expression", f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        return ev(tree.body)
    except RecursionError:
        raise ToolError("bad_arguments", "the expression is nested too deeply") from None
    except (OverflowError, ValueError, ArithmeticError) as e:  # 1e999 is inf: no exact value
        raise ToolError("bad_expression", f"{type(e).__name__}: {e}") from None


def format_number(x: Fraction) -> str:
    """An integer as digits, anything else as a decimal with up to 6 places (trailing zeros dropped)."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.6f}".rstrip("0").rstrip(".")


def _one_string(name: str, description: str) -> dict[str, Any]:
    """The JSON schema of a tool's arguments when it takes one required string ``name``."""
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
    }


@register_tool(
    "calculator",
    description="Evaluate an arithmetic expression exactly (+ - * / // % ** and parentheses).",
    parameters=_one_string("expression", "e.g. 347*28+5"),
)
def calculator(expression: str) -> str:
    return format_number(calculate(str(expression)))


@register_tool(
    "python",
    description="Run a Python program in a sandbox and return what it printed.",
    parameters=_one_string("code", "a complete program; print the result"),
    uses_sandbox=True,
)
def python(code: str, sandbox: Any = None) -> str:
    """Runs ``code`` in the code sandbox (bubblewrap, rlimits, no network) under ``sandbox``, the run's
    ``reward.sandbox`` settings (its timeout and limits: the policy's arguments cannot set them); a
    crash, a timeout or too much output is a ToolError, a program error keeps its traceback's last
    lines, and output that is not UTF-8 is ``invalid_utf8``."""
    from stepcredit.config import SandboxConfig
    from stepcredit.sandbox.cases import CaseMode, TestCase
    from stepcredit.sandbox.executors import get_sandbox
    from stepcredit.sandbox.judging import ERROR, SANDBOX_ERROR, TIMEOUT

    try:
        str(code).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file can hold the program
        raise ToolError("bad_arguments", "the program is not valid UTF-8") from None
    box = get_sandbox(sandbox if isinstance(sandbox, SandboxConfig) else SandboxConfig())
    why = box.unavailable()
    if why is not None:
        raise ToolError("sandbox_unavailable", why)
    (out,) = box.run_program(str(code), [TestCase(CaseMode.STDIO, stdin="", expected="")])
    done = out.detail or {}
    if out.status == ERROR and done.get("exit"):
        # the traceback's end names the exception: the observation keeps it (ToolError.keep_end)
        raise ToolError(
            "program_error", f"exit {done.get('exit')}:\n{done.get('err', '')}".rstrip(), keep_end=True
        )
    kinds = {TIMEOUT: "timeout", ERROR: "program_error", SANDBOX_ERROR: "sandbox_error"}
    if out.status in kinds:
        raise ToolError(kinds[out.status], out.message, keep_end=out.status == ERROR)
    text = str(done.get("out", ""))
    if done.get("out_invalid_utf8"):
        raise ToolError(
            "invalid_utf8",
            "the output is not valid UTF-8 (? marks the bad bytes): " + text.replace("\ufffd", "?"),
        )
    return text
