"""The tool machinery (re-exported by :mod:`stepcredit.tools`): declarations, calls, parsers, execution.

A tool is declared as an OpenAI-style function schema (what VeRL's multi-turn tool config and
``transformers``' ``apply_chat_template(tools=...)`` take) and registered in :data:`TOOLS` with the
function that runs it (:func:`register_tool`, or :func:`register_http_tool` for an endpoint). How a
call looks in the policy's text, and how its result is written back, is a template's convention,
registered in :data:`PARSERS`: Hermes-style ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
JSON and a plain fenced-code block (the fence's language names the tool, the body is its main argument).

:func:`execute_call` runs one call and always returns an :class:`Observation`: an unknown tool,
malformed arguments, a raising function, megabytes of output or invalid UTF-8 all become error text
the policy sees, with an error kind for the metrics. It runs inside the reward layer's kill-safe
workers (:mod:`stepcredit.reward.tools`), which add the deadline a hanging tool cannot escape.
This package is stage-neutral: it imports nothing from the pipeline's stages.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepcredit.registry import Registry


# ------------------------------------------------------------------------------------ declarations
@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: its OpenAI-style schema and the function that runs it."""

    name: str
    schema: dict[str, Any]
    """``{"type": "function", "function": {"name", "description", "parameters"}}``."""
    fn: Callable[..., Any]
    """``fn(**arguments, **tools_kwargs) -> str`` (other return values are shown as JSON or ``str``)."""
    main_arg: str
    """The parameter a fenced-code call's body fills (the first required one by default)."""
    requires: tuple[str, ...] = ()
    """Modules ``fn`` imports beyond the core install, checked at start-up (``rollout.tools.names``)."""


TOOLS: Registry[ToolSpec] = Registry("tool")
"""Tools by name (``rollout.tools.names`` picks the ones a run offers)."""


class ToolError(Exception):
    """Raised by a tool for a failure the policy should see as ``error: <message>`` under ``kind``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _schema(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": dict(parameters)},
    }


def register_tool(
    name: str,
    *,
    description: str,
    parameters: Mapping[str, Any],
    main_arg: str = "",
    override: bool = False,
    requires: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the tool ``name`` with a JSON-schema ``parameters`` object.
    Per-row keyword arguments (``extra_info["tools_kwargs"][name]``, as VeRL's ``tools_kwargs``) are
    passed beside the policy's arguments; ``requires``: the modules ``fn`` needs beyond the core install
    (checked at start-up). Returns the function unchanged."""
    required = list(parameters.get("required", [])) or list(parameters.get("properties", {}))
    main = main_arg or (required[0] if required else "")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        TOOLS.register(name, override=override)(
            ToolSpec(name, _schema(name, description, parameters), fn, main, tuple(requires))
        )
        return fn

    return deco


def register_http_tool(
    name: str,
    url: str,
    *,
    description: str,
    parameters: Mapping[str, Any],
    timeout_s: float = 10.0,
    main_arg: str = "",
    override: bool = False,
) -> ToolSpec:
    """Register a tool served by an HTTP endpoint: the arguments (and per-row kwargs) are POSTed as a
    JSON object, the reply's body (text) is the result; a non-2xx reply is a ``http`` error."""

    def call(**kwargs: Any) -> str:
        req = urllib.request.Request(
            url, data=json.dumps(kwargs).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return bytes(resp.read()).decode("utf-8", errors="replace")
        except OSError as e:
            raise ToolError("http", f"{type(e).__name__}: {e}") from None

    register_tool(name, description=description, parameters=parameters, main_arg=main_arg, override=override)(
        call
    )
    return TOOLS.get(name)


def schemas(names: Sequence[str]) -> list[dict[str, Any]]:
    """The OpenAI-style schemas of the named tools (for ``apply_chat_template(tools=...)``)."""
    return [TOOLS.get(n).schema for n in names]


# ------------------------------------------------------------------------------------------ calls
@dataclass(frozen=True)
class ToolCall:
    """One call the policy wrote."""

    name: str
    arguments: dict[str, Any] | None
    """None when the call's arguments could not be read (``error`` says why)."""
    error: str = ""


@dataclass(frozen=True)
class ParsedCall:
    """The first complete call in a text and the character offset just after it."""

    call: ToolCall
    end: int


@dataclass(frozen=True)
class Observation:
    """What a call gave back: the text the policy sees and, for the metrics, what went wrong."""

    text: str
    error: str = ""
    """"" when the tool answered; else the failure's kind (``unknown_tool``, ``bad_arguments``,
    ``raised``, ``timeout``, ``invalid_utf8``, ``crashed``, or a tool's own ``ToolError`` kind)."""
    truncated: bool = False
    """The result was longer than the limit and was cut."""


@dataclass(frozen=True)
class ToolParser:
    """A template's tool-call convention."""

    find: Callable[[str, Mapping[str, ToolSpec]], ParsedCall | None]
    """(text, offered tools) -> the first complete call in the text, or None."""
    observation: Callable[[str], str]
    """Result text -> the text appended after the call (what the policy reads next)."""
    stop: tuple[str, ...] = ()
    """Strings that end every call (sampling stops there); () when a call's end is not one string."""
    observation_starts: Callable[[str], list[int]] = field(default=lambda text: [])
    """Character offsets where an appended result starts in a text: a turn ends just before each
    (the segmenter's turn boundaries; a plain response, with no results in it, has none)."""
    observation_spans: Callable[[str], list[tuple[int, int]]] = field(default=lambda text: [])
    """(start, end) character spans of the appended results in a text (what ``stepcredit explain``
    marks as not trained on)."""


def _spans(pattern: str) -> Callable[[str], list[tuple[int, int]]]:
    rx = re.compile(pattern, re.DOTALL)
    return lambda text: [m.span() for m in rx.finditer(text)]


PARSERS: Registry[ToolParser] = Registry("tool-call parser")

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _hermes_find(text: str, tools: Mapping[str, ToolSpec]) -> ParsedCall | None:
    m = _HERMES.search(text)
    if m is None:
        return None
    try:
        obj = json.loads(m.group(1))
        name = obj["name"]
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some templates write the arguments as a JSON string
            args = json.loads(args)
        if not isinstance(name, str) or not isinstance(args, dict):
            raise TypeError("name must be a string and arguments an object")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return ParsedCall(ToolCall("", None, f"{type(e).__name__}: {e}"), m.end())
    return ParsedCall(ToolCall(name, args), m.end())


# A result starts right after the call it answers: with the convention's text that is where
# "\n<tool_response>\n" starts, and with a chat template's tool turn (docs/tools.md) it is where the
# template's markup starts (its end of turn, then a tool or user turn holding <tool_response>), so
# turns end at the call's last token either way.
_HERMES_ANSWERED = re.compile(r"</tool_call>(?=(?:(?!<tool_call>).)*?<tool_response>)", re.DOTALL)

PARSERS.add(
    "hermes",
    ToolParser(
        find=_hermes_find,
        observation=lambda result: f"\n<tool_response>\n{result}\n</tool_response>\n",
        stop=("</tool_call>",),
        observation_starts=lambda text: [m.end() for m in _HERMES_ANSWERED.finditer(text)],
        # from the call's end through </tool_response> (a template's markup after it is not included)
        observation_spans=_spans(r"(?<=</tool_call>)(?:(?!<tool_call>).)*?</tool_response>\n?"),
    ),
)

# a fenced block whose language names a tool; "output" is the result block we write ourselves
_FENCE = re.compile(r"```(?!output\n)([A-Za-z_][\w-]*)\n(.*?)\n```", re.DOTALL)


def _fenced_find(text: str, tools: Mapping[str, ToolSpec]) -> ParsedCall | None:
    m = _FENCE.search(text)
    if m is None:
        return None
    name, body = m.group(1), m.group(2)
    spec = tools.get(name)
    if spec is None:
        return ParsedCall(ToolCall(name, {}), m.end())
    return ParsedCall(ToolCall(name, {spec.main_arg: body}), m.end())


PARSERS.add(
    "fenced",
    ToolParser(
        find=_fenced_find,
        observation=lambda result: f"\n```output\n{result}\n```\n",
        observation_starts=lambda text: [m.start() for m in re.finditer("\n```output\n", text)],
        observation_spans=_spans(r"\n```output\n.*?\n```\n"),
    ),
)


# -------------------------------------------------------------------------------------- execution
class _CappedText(io.TextIOBase):
    """A stdout replacement that keeps the first ``cap`` characters and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap, self.kept, self.dropped = cap, 0, 0
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(s[:room])
            self.kept += min(room, len(s))
        self.dropped += max(0, len(s) - max(room, 0))
        return len(s)


def _as_text(value: Any) -> tuple[str, bool]:
    """(text, was the value invalid UTF-8)."""
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8"), False
        except UnicodeDecodeError:
            return bytes(value).decode("utf-8", errors="replace"), True
    if not isinstance(value, str):
        try:
            value = json.dumps(value)
        except (TypeError, ValueError):
            value = str(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: a str that is not valid UTF-8
        return value.encode("utf-8", errors="replace").decode("utf-8"), True
    return value, False


def _cut(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"...[{len(text) - max_chars} more characters cut]", True


def execute_call(
    call: ToolCall,
    *,
    offered: Sequence[str],
    tools_kwargs: Mapping[str, Any] | None = None,
    max_chars: int = 512,
) -> Observation:
    """Run one call of one of the ``offered`` tools; every failure is an error observation, never an
    exception. ``tools_kwargs``: this row's keyword arguments per tool name. The result (the return
    value, or what the tool printed when it returned None) is cut to ``max_chars`` characters."""
    if call.arguments is None:
        return Observation(f"error: malformed tool call: {call.error}"[:max_chars], "bad_arguments")
    if call.name not in offered or call.name not in TOOLS:
        known = ", ".join(offered)
        return Observation(f"error: unknown tool {call.name[:40]!r} (tools: {known})", "unknown_tool")
    spec = TOOLS.get(call.name)
    extra = dict((tools_kwargs or {}).get(call.name, {}) or {})
    # printed output is kept only up to the limit: a tool that prints megabytes costs no memory
    out = _CappedText(max_chars + 1)
    try:
        with contextlib.redirect_stdout(out):
            value = spec.fn(**call.arguments, **extra)
    except ToolError as e:
        return Observation(_cut(f"error: {e}", max_chars)[0], e.kind)
    except TypeError as e:  # wrong or missing argument names
        return Observation(_cut(f"error: bad arguments: {e}", max_chars)[0], "bad_arguments")
    except Exception as e:
        return Observation(_cut(f"error: {type(e).__name__}: {e}", max_chars)[0], "raised")
    if value is None:
        text, bad = "".join(out.parts), False
        text, cut = _cut(text, max_chars) if not out.dropped else (text[:max_chars] + "...[cut]", True)
    else:
        text, bad = _as_text(value)
        if bad:  # said plainly, in characters every vocabulary has
            text = "error: the result is not valid UTF-8 (? marks the bad bytes): " + text.replace(
                "\ufffd", "?"
            )
        text, cut = _cut(text, max_chars)
    return Observation(text, "invalid_utf8" if bad else "", cut)
