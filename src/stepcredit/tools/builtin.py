"""The built-in tools: ``calculator`` (exact arithmetic on a parsed expression, no ``eval``) and
``python`` (the policy's code run in the code reward's sandbox, with its isolation and limits)."""

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


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression of numbers, + - * / // % ** and parentheses.
    Raises ToolError (kind ``bad_expression``) for anything else."""
    try:
        tree = ast.parse(expression.strip().replace("^", "**"), mode="eval")
    except SyntaxError as e:
        raise ToolError("bad_expression", f"cannot parse {expression[:60]!r}: {e.msg}") from None

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
            try:
                out = Fraction(_BINARY[type(node.op)](a, b))
            except ZeroDivisionError:
                raise ToolError("bad_expression", "division by zero") from None
            if len(str(out.numerator)) > _MAX_DIGITS:
                raise ToolError("bad_expression", f"result has more than {_MAX_DIGITS} digits")
            return out
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return Fraction(_UNARY[type(node.op)](ev(node.operand)))
        raise ToolError("bad_expression", f"not arithmetic: {ast.dump(node)[:60]}")

    return ev(tree.body)


def format_number(x: Fraction) -> str:
    """An integer as digits, anything else as a decimal with up to 6 places (trailing zeros dropped)."""
    if x.denominator == 1:
        return str(x.numerator)
    return f"{float(x):.6f}".rstrip("0").rstrip(".")


@register_tool(
    "calculator",
    description="Evaluate an arithmetic expression exactly (+ - * / // % ** and parentheses).",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 347*28+5"}},
        "required": ["expression"],
    },
)
def calculator(expression: str) -> str:
    return format_number(calculate(str(expression)))


@register_tool(
    "python",
    description="Run a Python program in a sandbox and return what it printed.",
    parameters={
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a complete program; print the result"}},
        "required": ["code"],
    },
)
def python(code: str, timeout_s: float = 5.0) -> str:
    """Runs ``code`` in the code reward's sandbox (bubblewrap, rlimits, no network): the same isolation
    and limits as a code reward's test case; a crash, a timeout or too much output is a ToolError."""
    from stepcredit.config import SandboxConfig
    from stepcredit.reward.verifiers.code.cases import CaseMode, TestCase
    from stepcredit.reward.verifiers.code.sandbox import ERROR, SANDBOX_ERROR, TIMEOUT, get_sandbox

    sandbox = get_sandbox(SandboxConfig(timeout_s=float(timeout_s)))
    why = sandbox.unavailable()
    if why is not None:
        raise ToolError("sandbox_unavailable", why)
    (out,) = sandbox.run_program(str(code), [TestCase(CaseMode.STDIO, stdin="", expected="")])
    kinds = {TIMEOUT: "timeout", ERROR: "program_error", SANDBOX_ERROR: "sandbox_error"}
    if out.status in kinds:
        raise ToolError(kinds[out.status], out.message)
    return str(out.detail.get("out", ""))
