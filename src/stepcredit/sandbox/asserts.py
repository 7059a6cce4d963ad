"""Assert test cases on the host: checked and compiled once (:func:`plan_assert`), then run here
(:func:`evaluate_assert`) against the program behind a :class:`~stepcredit.sandbox.remote.RemoteLink`.

Names the test does not define and that are not one of a few pure builtins (``len``, ``sorted``,
``math.isclose``...) belong to the program and become :class:`~stepcredit.sandbox.remote.Remote`
references; ``==`` of two plain values is Python's own and cannot be overridden.
"""

from __future__ import annotations

import ast
import builtins
import math
import typing
from dataclasses import dataclass
from typing import Any

from stepcredit.sandbox.plain import encode_plain
from stepcredit.sandbox.remote import Call, RemoteLink

# Pure builtins an assert may use on the host; a program's own definition of one of these names is
# ignored there (Python would use it: that is how "patching builtins" passes a test).
_MAX_LEN = 10_000_000


def _pow(a: Any, b: Any, *m: Any) -> Any:
    if isinstance(b, int) and isinstance(a, int) and not m and abs(b) > 10_000 and abs(a) > 1:
        raise OverflowError("exponent too large to evaluate")
    return pow(a, b, *m)


def _mul(a: Any, b: Any) -> Any:
    for seq, n in ((a, b), (b, a)):
        if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > _MAX_LEN:
            raise OverflowError("sequence repetition too large to evaluate")
    return a * b


def _lshift(a: Any, b: Any) -> Any:
    if isinstance(b, int) and b > 100_000:
        raise OverflowError("shift too large to evaluate")
    return a << b


def _range(*args: int) -> range:
    r = range(*args)
    if len(r) > _MAX_LEN:
        raise OverflowError("range too large to evaluate")
    return r


_HOST_MODULES: dict[str, Any] = {"math": math, "typing": typing}


def _import(name: str, *args: Any, **kwargs: Any) -> Any:
    if name not in _HOST_MODULES:
        raise ImportError(f"an assert case may import only {', '.join(_HOST_MODULES)}")
    return _HOST_MODULES[name]


_SAFE_NAMES = [
    "abs",
    "all",
    "any",
    "bool",
    "chr",
    "dict",
    "divmod",
    "enumerate",
    "filter",
    "float",
    "frozenset",
    "hex",
    "int",
    "isinstance",
    "len",
    "list",
    "map",
    "max",
    "min",
    "oct",
    "ord",
    "repr",
    "reversed",
    "round",
    "set",
    "sorted",
    "str",
    "sum",
    "tuple",
    "zip",
    "True",
    "False",
    "None",
    "ValueError",
    "TypeError",
    "KeyError",
    "IndexError",
    "ZeroDivisionError",
    "Exception",
]
_HOST_BUILTINS: dict[str, Any] = {n: getattr(builtins, n) for n in _SAFE_NAMES if hasattr(builtins, n)}
_HOST_BUILTINS.update({"pow": _pow, "range": _range, "__import__": _import})


_GUARDS = {"__sc_pow": _pow, "__sc_mul": _mul, "__sc_lshift": _lshift}
_ALLOWED_NODES = (
    ast.Module, ast.Assert, ast.Assign, ast.Expr, ast.Import, ast.ImportFrom, ast.Pass, ast.alias,
    ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Lambda, ast.IfExp, ast.Dict, ast.Set, ast.ListComp,
    ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Compare, ast.Call, ast.Constant, ast.Attribute,
    ast.Subscript, ast.Starred, ast.Name, ast.List, ast.Tuple, ast.Slice, ast.JoinedStr,
    ast.FormattedValue, ast.keyword, ast.comprehension, ast.arguments, ast.arg, ast.expr_context,
    ast.boolop, ast.operator, ast.unaryop, ast.cmpop,
)  # fmt: skip


@dataclass(frozen=True)
class AssertPlan:
    """An assert test case ready for the host: its code (guards in place) and the program names it uses."""

    code: Any
    """The compiled module, run with :func:`evaluate_assert`."""
    program_names: tuple[str, ...]
    """Free names that are neither builtins allowed on the host nor defined by the test: the program's."""
    calls: tuple[Call, ...] | None = None
    """Every use of the program as calls known in advance (``f(1, [2])``, ``Solution().f(3)``), which the
    sandbox answers in one go; None when the test needs a conversation (comprehensions, handles...)."""


class _Guard(ast.NodeTransformer):
    # Operators whose cost grows with a value (2 ** n, "x" * n, 1 << n) go through bounded versions, so
    # a huge value from the program cannot hang the host.
    _OPS = {ast.Pow: "__sc_pow", ast.Mult: "__sc_mul", ast.LShift: "__sc_lshift"}

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        name = self._OPS.get(type(node.op))
        if name is None:
            return node
        call = ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=[node.left, node.right], keywords=[])
        return ast.copy_location(call, node)


def plan_assert(src: str) -> AssertPlan:
    """Check and compile one ``assert_case`` entry; ValueError (a ground-truth error) if unsupported.

    Allowed: ``assert`` statements, assignments to names, expression statements and ``import math``;
    no attribute starting with ``_``. An entry that never uses a program name tests nothing: rejected.
    """
    try:
        tree = ast.parse(src, mode="exec")
    except SyntaxError as e:
        raise ValueError(f"assert case does not parse ({e.msg}): {src[:120]}") from None
    bound: set[str] = set(_GUARDS)
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"assert case uses unsupported syntax ({type(node).__name__}): {src[:120]}")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            raise ValueError(f"assert case uses a private attribute ({node.attr}): {src[:120]}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if any(m not in _HOST_MODULES for m in mods):
                raise ValueError(f"assert case imports {', '.join(mods)} (only math): {src[:120]}")
            bound.update((a.asname or a.name) for a in node.names)
        elif isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, ast.Store) else loaded).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    if not any(isinstance(n, ast.Assert) for n in tree.body):
        raise ValueError(f"assert case has no assert statement: {src[:120]}")
    program = tuple(sorted(n for n in loaded - bound if n not in _HOST_BUILTINS and n not in _HOST_MODULES))
    if not program:
        raise ValueError(f"assert case never calls the program (only builtins): {src[:120]}")
    calls = _known_calls(tree, set(program))
    tree = ast.fix_missing_locations(_Guard().visit(tree))
    # optimize=0: the asserts must run even when stepcredit itself runs under ``python -O``.
    code = compile(tree, "<assert case>", "exec", optimize=0)
    return AssertPlan(code=code, program_names=program, calls=calls)


def _known_calls(tree: ast.Module, program: set[str]) -> tuple[Call, ...] | None:
    """The calls into the program, in evaluation order, when each is ``name(consts)`` or
    ``Name().attr(consts)`` with arguments computable now; None otherwise."""
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    calls: list[Call] = []
    test = tree.body[0].test
    for node in _in_order(test):
        if not (isinstance(node, ast.Name) and node.id in program):
            continue
        call = parents.get(node)
        if not isinstance(call, ast.Call) or call.func is not node:
            return None
        attr = parents.get(call)
        if not call.args and not call.keywords and isinstance(attr, ast.Attribute):
            outer = parents.get(attr)
            if not isinstance(outer, ast.Call) or outer.func is not attr:
                return None
            kind, target, call = "method", f"{node.id}.{attr.attr}", outer
        else:
            kind, target = "fn", node.id
        consts = _constant_args(call, program)
        if consts is None:
            return None
        calls.append((kind, target, *consts))
    return tuple(calls)


def _in_order(node: ast.AST) -> list[ast.AST]:
    # Depth-first, children left to right: the order in which Python evaluates these expressions.
    out = [node]
    for child in ast.iter_child_nodes(node):
        out += _in_order(child)
    return out


def _constant_args(call: ast.Call, program: set[str]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    nodes = [*call.args, *(k.value for k in call.keywords)]
    if any(isinstance(n, ast.Starred) for n in call.args) or any(k.arg is None for k in call.keywords):
        return None
    for n in nodes:
        for sub in ast.walk(n):
            if isinstance(sub, ast.Name) and (sub.id in program or sub.id not in _HOST_BUILTINS):
                return None
            if isinstance(sub, (ast.Lambda, ast.comprehension)):
                return None
    try:
        values = [
            eval(compile(ast.Expression(n), "<arg>", "eval"), {"__builtins__": _HOST_BUILTINS}) for n in nodes
        ]
        for v in values:
            encode_plain(v)  # plain values only
    except Exception:
        return None
    n_pos = len(call.args)
    return tuple(values[:n_pos]), {
        k.arg: v for k, v in zip(call.keywords, values[n_pos:], strict=True) if k.arg
    }


class AssertFailed(Exception):
    """The assert statement was false: a wrong answer."""


def evaluate_assert(plan: AssertPlan, link: RemoteLink) -> None:
    """Run an assert case on the host against the program behind ``link``.

    Returns when every assert holds; AssertFailed when one is false; NotPlain when a value from the
    program is not plain; ProgramRaised when the program raised; anything else the test itself raised.
    """
    env: dict[str, Any] = {"__builtins__": dict(_HOST_BUILTINS), **_HOST_MODULES, **_GUARDS}
    env.update(link.names(plan.program_names))
    try:
        exec(plan.code, env)  # the trusted test, on plain values and Remote references only
    except AssertionError:
        raise AssertFailed("assertion failed") from None
