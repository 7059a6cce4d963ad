"""Test cases of code rewards and the trusted side of judging them (everything here runs on the host).

The program under test never sees an expected value, an assert statement or a secret. It only answers
questions about its own behaviour: "what do you print on this input", "what does ``f(1, 2)`` return".
Every answer crosses the sandbox boundary in a small tagged JSON form (:func:`decode_plain`) that can
only describe exact builtin values (``int``, ``float``, ``str``, ``bool``, ``None``, ``list``,
``tuple``, ``dict``, ``set``): no subclass, no object with its own ``__eq__``, nothing that runs code.
Comparisons, ``assert`` expressions and every operator on those values are then evaluated here, on the
host, by :func:`evaluate_assert` (``==`` of two plain values is Python's own and cannot be overridden).

An ``assert_case`` is split at the boundary: names the test does not define and that are not one of a
few pure builtins (``len``, ``sorted``, ``math.isclose``...) belong to the program and become
:class:`Remote` references. Attribute lookups and calls on them are forwarded into the sandbox (with
plain arguments); what comes back is a plain value, or another reference when the program's class was
instantiated (``Solution().twoSum``, ``MinStack().push``). Any other use of a reference (comparing,
``bool``, ``len``, iterating, hashing) is refused, so an always-equal object cannot pass.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

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


def outputs_match(got: str, expected: str) -> bool:
    """Line-wise equality ignoring trailing whitespace, else token-wise with floats equal to 1e-6."""
    norm_got = [line.rstrip() for line in got.strip().splitlines()]
    norm_exp = [line.rstrip() for line in expected.strip().splitlines()]
    if norm_got == norm_exp:
        return True
    a, b = got.split(), expected.split()
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        try:
            if not math.isclose(float(x), float(y), rel_tol=1e-6, abs_tol=1e-6):
                return False
        except ValueError:
            return False
    return True


def values_match(got: Any, expected: Any) -> bool:
    """Plain values equal up to tuple/list and 1e-6 on floats; TACO's one-item list wrapping accepted.

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
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    return bool(a == b)


# -------------------------------------------------------------------------------- plain values
class NotPlain(Exception):
    """A value from the program is not a plain builtin value (or is used as one when it is a reference)."""


MAX_DEPTH = 100
"""Deepest nesting of a value that crosses the sandbox boundary."""


def encode_plain(value: Any, *, depth: int = 0) -> Any:
    """The tagged JSON form of a plain value: lists stay arrays; tuples, sets, dicts and non-finite floats
    become one-key objects (``t``, ``s``, ``d``, ``f``). Exact types only; NotPlain otherwise."""
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if math.isfinite(value) else {"f": repr(value)}
    if t is list:
        return [encode_plain(v, depth=depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode_plain(v, depth=depth + 1) for v in value]}
    if t is set:
        return {"s": [encode_plain(v, depth=depth + 1) for v in value]}
    if t is dict:
        return {
            "d": [
                [encode_plain(k, depth=depth + 1), encode_plain(v, depth=depth + 1)] for k, v in value.items()
            ]
        }
    raise NotPlain(f"a {t.__name__} is not a plain builtin value")


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode_plain(wire: Any, *, depth: int = 0) -> Any:
    """Strict inverse of :func:`encode_plain` for untrusted input (parsed JSON); NotPlain on anything else."""
    if depth > MAX_DEPTH:
        raise NotPlain("value nested too deeply")
    t = type(wire)
    if wire is None or t is bool or t is int or t is str or t is float:
        return wire
    if t is list:
        return [decode_plain(v, depth=depth + 1) for v in wire]
    if t is dict and len(wire) == 1:
        ((tag, body),) = wire.items()
        match tag:  # the tags encode_plain writes: float (nan, inf), tuple, set, dict (as pairs)
            case "f" if body in _FLOATS:
                return _FLOATS[body]
            case _ if type(body) is list:
                items = [decode_plain(v, depth=depth + 1) for v in body]
                try:
                    match tag:
                        case "t":
                            return tuple(items)
                        case "s":
                            return set(items)
                        case "d" if all(type(p) is list and len(p) == 2 for p in items):
                            return {k: v for k, v in items}
                except TypeError as e:  # an unhashable set element or key
                    raise NotPlain(str(e)) from None
    raise NotPlain(f"malformed value from the sandbox: {str(wire)[:80]}")


# ------------------------------------------------------------------------------- assert cases
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


Call = tuple[str, str, tuple[Any, ...], dict[str, Any]]
"""A call the sandbox makes after the program ran: (kind, target, args, kwargs) with plain values; kind ``fn``
(``target(...)``), ``method`` (``Class().name(...)`` for target ``Class.name``) or ``auto`` (VeRL's
fn_name: the function if the program defines it, else ``Solution().target``)."""


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


class Remote:
    """A reference to an object inside the sandbox (a program function, class, instance or method).

    Only attribute lookup and calls are forwarded, through ``link``; every other use is refused.
    """

    __slots__ = ("_label", "_link", "_ref")

    def __init__(self, link: RemoteLink, ref: Any, label: str) -> None:
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_label", label)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._link.attr(self._ref, name, f"{self._label}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._link.call(self._ref, args, kwargs, f"{self._label}(...)")

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise NotPlain(f"{object.__getattribute__(self, '_label')} is not a plain builtin value")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse
    __bool__ = __len__ = __iter__ = __contains__ = __hash__ = __index__ = __int__ = __float__ = _refuse
    __str__ = __repr__ = __format__ = __getitem__ = __setattr__ = __delattr__ = _refuse  # type: ignore[assignment]
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _refuse
    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __pow__ = __rpow__ = __neg__ = __pos__ = _refuse
    __abs__ = __invert__ = __and__ = __rand__ = __or__ = __ror__ = __xor__ = __rxor__ = _refuse
    __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = __round__ = __reversed__ = _refuse


class RemoteLink:
    """The host's side of the conversation with one running test case (see ``sandbox._Session``).

    ``send(request) -> reply`` forwards one request to the program's process; replies are
    ``{"v": wire}`` (a plain value), ``{"h": id}`` (a new reference) or ``{"raise": "Type: message"}``.
    """

    def __init__(self, send: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self._send = send

    def _reply(self, reply: dict[str, Any], label: str) -> Any:
        if "raise" in reply:
            raise ProgramRaised(f"{label} raised {str(reply['raise'])[:300]}")
        if "np" in reply:
            raise NotPlain(f"{label} returned {str(reply['np'])[:80]}, not a plain builtin value")
        if "h" in reply and type(reply["h"]) is int:
            return Remote(self, {"h": reply["h"]}, label)
        if "v" in reply:
            return decode_plain(reply["v"])
        raise NotPlain(f"malformed reply from the sandbox for {label}")

    def attr(self, ref: Any, name: str, label: str) -> Any:
        return self._reply(self._send({"op": "attr", "ref": ref, "name": name}), label)

    def call(self, ref: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str) -> Any:
        request = {"op": "call", "ref": ref, "args": [_arg(a) for a in args]}
        request["kwargs"] = {k: _arg(v) for k, v in kwargs.items()}
        return self._reply(self._send(request), label)

    def auto(self, fn_name: str, args: tuple[Any, ...]) -> Any:
        """VeRL's ``fn_name`` call: the program's function ``fn_name``, else ``Solution().fn_name``."""
        found = self.names((fn_name, "Solution"))
        if fn_name in found:
            fn = found[fn_name]
        elif "Solution" in found:
            fn = getattr(found["Solution"](), fn_name)
        else:
            raise ProgramRaised(f"the program defines neither {fn_name} nor Solution")
        return fn(*args)

    def names(self, names: tuple[str, ...]) -> dict[str, Any]:
        """The program's values of ``names``: Remote references (functions, classes) or plain values."""
        reply = self._send({"op": "names", "names": list(names)})
        found = reply.get("found")
        if type(found) is not dict:
            raise NotPlain("malformed reply from the sandbox for the program's names")
        return {n: self._reply(found[n], n) for n in names if n in found and type(found[n]) is dict}


class ProgramRaised(Exception):
    """The program raised while the test called it."""


def _arg(value: Any) -> Any:
    """An argument for the program: a plain value, or a reference to one of its objects (as bytes)."""
    if type(value) is Remote:
        ref = object.__getattribute__(value, "_ref")
        if "h" not in ref:
            raise NeedsConversation("a reference as an argument")
        return str(ref["h"]).encode()
    try:
        encode_plain(value)
    except NotPlain:
        raise NotPlain("an assert case passes a non-plain value (a function?) to the program") from None
    return value


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


class NeedsConversation(Exception):
    """The test asked for something the precomputed calls do not answer."""


class PrecomputedLink(RemoteLink):
    """Serves an assert's calls from the answers the sandbox gave to ``AssertPlan.calls``."""

    def __init__(self, calls: tuple[Call, ...], replies: list[Any]) -> None:
        super().__init__(self._refuse_send)
        self._answers: dict[str, list[Any]] = {}
        for (kind, target, args, kwargs), reply in zip(calls, replies, strict=False):
            self._answers.setdefault(_key(kind, target, args, kwargs), []).append(reply)
        self._classes = {c[1].split(".", 1)[0] for c in calls if c[0] == "method"}

    @staticmethod
    def _refuse_send(request: dict[str, Any]) -> dict[str, Any]:
        raise NeedsConversation(str(request.get("op")))

    def names(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {n: Remote(self, {"name": n}, n) for n in names}

    def auto(self, fn_name: str, args: tuple[Any, ...]) -> Any:
        pending = self._answers.get(_key("auto", fn_name, args, {}))
        if not pending:
            raise NeedsConversation("call")
        reply = pending.pop(0)
        if type(reply) is not dict:
            raise NotPlain(f"malformed reply from the sandbox for {fn_name}(...)")
        return self._reply(reply, f"{fn_name}(...)")

    def attr(self, ref: Any, name: str, label: str) -> Any:
        if "new" in ref:
            return Remote(self, {"method": f"{ref['new']}.{name}"}, label)
        raise NeedsConversation("attr")

    def call(self, ref: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str) -> Any:
        if any(type(a) is Remote for a in (*args, *kwargs.values())):
            raise NeedsConversation("a reference as an argument")
        if "method" in ref:
            key = _key("method", ref["method"], args, kwargs)
        elif not args and not kwargs and ref["name"] in self._classes:
            return Remote(self, {"new": ref["name"]}, label)
        else:
            key = _key("fn", ref["name"], args, kwargs)
        pending = self._answers.get(key)
        if not pending:
            raise NeedsConversation("call")
        reply = pending.pop(0)
        if type(reply) is not dict:
            raise NotPlain(f"malformed reply from the sandbox for {label}")
        return self._reply(reply, label)


def _key(kind: str, target: str, args: Any, kwargs: Any) -> str:
    try:
        return json.dumps(
            [kind, target, encode_plain(list(args)), encode_plain(dict(kwargs))], sort_keys=True
        )
    except (NotPlain, TypeError):
        raise NeedsConversation("a value that has no key") from None
