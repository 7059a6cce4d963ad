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
import signal
import threading
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
    idempotent: bool = False
    """Running a call twice has the effect of running it once, so a call whose worker died may run
    again; otherwise a call is never run twice (a crashed worker is a ``crashed`` observation)."""
    uses_sandbox: bool = False
    """``fn`` takes ``sandbox=``: the run's ``reward.sandbox`` settings (its limits, not the policy's)."""
    requires: tuple[str, ...] = ()
    """Modules ``fn`` imports beyond the core install, checked at start-up (``rollout.tools.names``)."""


TOOLS: Registry[ToolSpec] = Registry("tool")
"""Tools by name (``rollout.tools.names`` picks the ones a run offers)."""


class ToolError(Exception):
    """Raised by a tool for a failure the policy should see as ``error: <message>`` under ``kind``.
    ``keep_end``: a message too long for the observation keeps its first line and its end (a
    traceback's last lines name the exception), not its start."""

    def __init__(self, kind: str, message: str, *, keep_end: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.keep_end = keep_end


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
    idempotent: bool = False,
    uses_sandbox: bool = False,
    requires: tuple[str, ...] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register ``fn`` as the tool ``name`` with a JSON-schema ``parameters`` object (the
    policy's arguments are checked against it: an unknown key, a missing required one or a wrong type is
    ``bad_arguments``). Per-row keyword arguments (``extra_info["tools_kwargs"][name]``, as VeRL's
    ``tools_kwargs``) are passed beside the policy's arguments. ``idempotent``: a call whose worker died
    may run again (:attr:`ToolSpec.idempotent`); ``uses_sandbox``: ``fn`` takes the run's sandbox
    settings as ``sandbox=``; ``requires``: the modules ``fn`` needs beyond the core install (checked
    at start-up). Returns the function unchanged."""
    required = list(parameters.get("required", [])) or list(parameters.get("properties", {}))
    main = main_arg or (required[0] if required else "")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        TOOLS.register(name, override=override)(
            ToolSpec(
                name,
                _schema(name, description, parameters),
                fn,
                main,
                idempotent,
                uses_sandbox,
                tuple(requires),
            )
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
    idempotent: bool = False,
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

    register_tool(
        name,
        description=description,
        parameters=parameters,
        main_arg=main_arg,
        override=override,
        idempotent=idempotent,
    )(call)
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
    kind: str = ""
    """Why the arguments could not be read: ``unparseable_call`` (no JSON, too deep, too long, an
    unterminated call) or ``bad_arguments`` (JSON of the wrong shape); "" when they were."""


@dataclass(frozen=True)
class ParsedCall:
    """The first call in a text and the character offset just after it."""

    call: ToolCall
    end: int
    complete: bool = True
    """False when the text ends inside the call (no closing delimiter): in a sampled turn the policy
    stopped there (an ``unparseable_call``), in a prefix it is still writing it (nothing to run)."""


@dataclass(frozen=True)
class Observation:
    """What a call gave back: the text the policy sees and, for the metrics, what went wrong."""

    text: str
    error: str = ""
    """"" when the tool answered; else the failure's kind (``unknown_tool``, ``unparseable_call``,
    ``bad_arguments``, ``raised``, ``timeout``, ``invalid_utf8``, ``crashed``, or a tool's own
    ``ToolError`` kind)."""
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
    """(start, end) character spans of the result blocks in a trace given as text (``stepcredit
    explain``, the probe, SFT traces); a rollout records its own spans and never reads these."""
    markup: tuple[str, ...] = ()
    """Strings that are structure in this convention (a call's or a result's delimiters): a tool's
    output has them neutralised (:func:`neutralise`) before it is appended, under every convention."""


def _spans(pattern: str) -> Callable[[str], list[tuple[int, int]]]:
    rx = re.compile(pattern, re.DOTALL)
    return lambda text: [m.span() for m in rx.finditer(text)]


PARSERS: Registry[ToolParser] = Registry("tool-call parser")

MAX_CALL_CHARS = 65536
"""Longest call body a parser reads (a Hermes call's JSON, a fenced call's code); longer is
``unparseable_call``, so a huge payload costs one scan and no JSON parse."""
MAX_JSON_DEPTH = 32
"""Deepest nesting of ``[`` / ``{`` a Hermes call's JSON may have; deeper is ``unparseable_call`` (checked
before ``json.loads``, which would recurse once per level)."""


def _unparseable(why: str, end: int, *, complete: bool = True) -> ParsedCall:
    return ParsedCall(ToolCall("", None, why, "unparseable_call"), end, complete)


def _json_depth(text: str) -> int:
    """The deepest ``[`` / ``{`` nesting of ``text`` outside JSON strings (one linear scan)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _hermes_find(text: str, tools: Mapping[str, ToolSpec]) -> ParsedCall | None:
    # str.find, not a lazy regex: a text of many unterminated openings stays linear
    start = text.find("<tool_call>")
    if start < 0:
        return None
    body_at = start + len("<tool_call>")
    close = text.find("</tool_call>", body_at)
    if close < 0:
        return _unparseable("the call has no </tool_call>", len(text), complete=False)
    end = close + len("</tool_call>")
    body = text[body_at:close]
    if len(body) > MAX_CALL_CHARS:
        return _unparseable(f"the call is longer than {MAX_CALL_CHARS} characters", end)
    if _json_depth(body) > MAX_JSON_DEPTH:
        return _unparseable(f"the call's JSON nests deeper than {MAX_JSON_DEPTH} levels", end)
    try:
        obj = json.loads(body)
        if isinstance(obj, dict) and isinstance(obj.get("arguments"), str):
            # some templates write the arguments as a JSON string
            if _json_depth(obj["arguments"]) > MAX_JSON_DEPTH:
                return _unparseable(f"the call's JSON nests deeper than {MAX_JSON_DEPTH} levels", end)
            obj["arguments"] = json.loads(obj["arguments"])
    except Exception as e:  # ValueError, RecursionError, MemoryError: never out of the parser
        return _unparseable(f"{type(e).__name__}: {str(e)[:200]}", end)
    if not isinstance(obj, dict) or "name" not in obj:
        return ParsedCall(ToolCall("", None, "the call must be an object with a name", "bad_arguments"), end)
    name, args = obj["name"], obj.get("arguments", {})
    if not isinstance(name, str) or not isinstance(args, dict):
        why = "name must be a string and arguments an object"
        return ParsedCall(ToolCall("", None, why, "bad_arguments"), end)
    return ParsedCall(ToolCall(name, args), end)


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
        markup=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
    ),
)

# a fenced block whose language names a tool; "output" is the result block we write ourselves
_FENCE_OPEN = re.compile(r"```([A-Za-z_][\w-]*)\n")


def _fenced_find(text: str, tools: Mapping[str, ToolSpec]) -> ParsedCall | None:
    pos = 0
    while True:
        m = _FENCE_OPEN.search(text, pos)
        if m is None:
            return None
        if m.group(1) != "output":
            break
        close = text.find("\n```", m.end())  # skip a result block we wrote
        if close < 0:
            return None
        pos = close + 4
    name = m.group(1)
    close = text.find("\n```", m.end())
    if close < 0:
        if name in tools:  # a tool's block the policy never closed
            return _unparseable(f"the {name} block has no closing ```", len(text), complete=False)
        return None
    end = close + len("\n```")
    body = text[m.end() : close]
    spec = tools.get(name)
    if spec is None:
        return ParsedCall(ToolCall(name, {}), end)
    if len(body) > MAX_CALL_CHARS:
        return _unparseable(f"the call is longer than {MAX_CALL_CHARS} characters", end)
    return ParsedCall(ToolCall(name, {spec.main_arg: body}), end)


PARSERS.add(
    "fenced",
    ToolParser(
        find=_fenced_find,
        observation=lambda result: f"\n```output\n{result}\n```\n",
        observation_starts=lambda text: [m.start() for m in re.finditer("\n```output\n", text)],
        observation_spans=_spans(r"\n```output\n.*?\n```\n"),
        markup=("```",),
    ),
)


_CHAT_MARKUP = re.compile(r"<(?=\|)|<(?=/?s>)")
"""Chat-template markup written as text: ``<|user|>``, ``<|end|>``, ``<|im_start|>``, ``<s>``, ``</s>``."""


def _break(markup: str) -> str:
    """``markup`` written so that no convention or template reads it as structure: an opening ``<``
    as ``&lt;`` (``&lt;/tool_response>``), a code fence's backticks as quotes, any other first
    character as its HTML character reference (``[TOOL_CALLS]`` as ``&#91;TOOL_CALLS]``)."""
    if markup.startswith("<"):
        return "&lt;" + markup[1:]
    if "`" in markup:
        return markup.replace("`", "'")
    return f"&#{ord(markup[0])};{markup[1:]}"


def neutralise(text: str, *, markup: Sequence[str] = ()) -> str:
    """A tool's output made safe to append: every registered convention's markup (``<tool_call>``,
    ``</tool_response>``, a fence), chat-template markup (``<|...|>``, ``<s>``) and the extra ``markup``
    (a tokenizer's special-token strings) written so that nothing reads it as a call, a result's end or
    a turn. Idempotent, and text without markup is unchanged."""
    found = {m for name in PARSERS.names() for m in PARSERS.get(name).markup} | {m for m in markup if m}
    for m in sorted(found, key=len, reverse=True):
        # again until none is left: ">>>" in ">>>>>" overlaps itself, and one pass leaves ">>>" behind
        # (each pass rewrites one of the markup's characters, so the passes are bounded)
        for _ in range(len(text)):
            if m not in text:
                break
            text = text.replace(m, _break(m))
    text = re.sub(r"`{3,}", lambda g: "'" * len(g.group()), text)  # any longer fence too
    return _CHAT_MARKUP.sub("&lt;", text)


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
    """(text, was the value invalid UTF-8). Raises what a value's own ``__str__`` (or ``json.dumps``,
    or an int past Python's digit limit) raises: the caller makes that a ``raised`` observation."""
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
    value = str.__str__(value)  # the exact characters: a str subclass's overrides are never called
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: a str that is not valid UTF-8
        return value.encode("utf-8", errors="replace").decode("utf-8"), True
    return value, False


def _cut(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"...[{len(text) - max_chars} more characters cut]", True


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> str:
    """What is wrong with ``arguments`` against the tool's JSON schema (JSON Schema's ``properties``,
    ``required``, ``type`` and ``additionalProperties``, false unless the schema says otherwise), or ""
    when nothing is: the policy sets only the arguments the tool declares (a ``timeout_s`` it slips
    in is refused, never passed on)."""
    params = spec.schema.get("function", {}).get("parameters", {}) or {}
    props: Mapping[str, Any] = params.get("properties", {}) or {}
    extra = sorted(k for k in arguments if k not in props)
    if extra and params.get("additionalProperties", False) is not True:
        known = ", ".join(props) or "none"
        return f"unknown argument {str(extra[0])[:40]!r} (arguments: {known})"
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        return f"missing argument {missing[0]!r}"
    for key, value in arguments.items():
        want = (props.get(key) or {}).get("type")
        types = [want] if isinstance(want, str) else list(want or [])
        if types and not any(
            isinstance(value, _JSON_TYPES.get(t, (object,)))
            and not (t in ("integer", "number") and isinstance(value, bool))
            for t in types
        ):
            return f"argument {key!r} must be {' or '.join(types)}, not {type(value).__name__}"
    return ""


def _keep_end(text: str, max_chars: int) -> tuple[str, bool]:
    """``text`` within ``max_chars``: its first line's start, then as much of its end as fits."""
    if len(text) <= max_chars:
        return text, False
    marker = " ...[cut] ...\n"
    head = text.split("\n", 1)[0][: max(0, max_chars // 4)]
    room = max(0, max_chars - len(head) - len(marker))
    return head + marker + (text[-room:] if room else ""), True


def _utf8_safe(text: str) -> str:
    # a lone surrogate (a str that is not UTF-8) would make the tokenizer raise on the observation
    return text.encode("utf-8", errors="replace").decode("utf-8")


def execute_call(
    call: ToolCall,
    *,
    offered: Sequence[str],
    tools_kwargs: Mapping[str, Any] | None = None,
    max_chars: int = 512,
    sandbox: Any = None,
) -> Observation:
    """Run one call of one of the ``offered`` tools; every failure is an error observation, never an
    exception. ``tools_kwargs``: this row's keyword arguments per tool name. ``sandbox``: the run's
    ``reward.sandbox`` settings, given to tools that run code (``uses_sandbox``). The arguments are
    checked against the tool's schema first (:func:`check_arguments`). The result (the return value, or
    what the tool printed when it returned None) is cut to ``max_chars`` characters."""
    obs = _execute(call, offered, tools_kwargs, max_chars, sandbox)
    return replace(obs, text=_utf8_safe(obs.text))


def _execute(
    call: ToolCall,
    offered: Sequence[str],
    tools_kwargs: Mapping[str, Any] | None,
    max_chars: int,
    sandbox: Any,
) -> Observation:
    if call.arguments is None:
        kind = call.kind or "bad_arguments"
        return Observation(f"error: malformed tool call: {call.error}"[:max_chars], kind)
    if call.name not in offered or call.name not in TOOLS:
        known = ", ".join(offered)
        return Observation(f"error: unknown tool {call.name[:40]!r} (tools: {known})", "unknown_tool")
    spec = TOOLS.get(call.name)
    wrong = check_arguments(spec, call.arguments)
    if wrong:
        return Observation(_cut(f"error: bad arguments: {wrong}", max_chars)[0], "bad_arguments")
    extra = dict((tools_kwargs or {}).get(call.name, {}) or {})
    if spec.uses_sandbox:
        extra["sandbox"] = sandbox
    with _user_interrupts() as interrupted:
        try:
            return _run(spec, call.arguments, extra, max_chars)
        except BaseException as e:  # SystemExit, GeneratorExit, a result whose __str__ raises, ...
            if isinstance(e, KeyboardInterrupt) and interrupted:
                raise  # the user's Ctrl-C, not the tool's: the run stops
            return Observation(_keep_end(f"error: {_describe(e)}", max_chars)[0], "raised")


@contextlib.contextmanager
def _user_interrupts() -> Iterator[list[bool]]:
    """A list that becomes non-empty when SIGINT arrives while the block runs (in the main thread,
    where Python delivers it): a KeyboardInterrupt the tool raises itself is its error, the user's
    Ctrl-C still stops the run. Elsewhere (a worker thread) no signal can raise one."""
    seen: list[bool] = []
    main = threading.current_thread() is threading.main_thread()
    prev = signal.getsignal(signal.SIGINT) if main else None
    if not callable(prev):
        yield seen
        return
    previous: Callable[[int, Any], Any] = prev

    def note(signum: int, frame: Any) -> Any:
        seen.append(True)
        return previous(signum, frame)

    signal.signal(signal.SIGINT, note)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _message(e: BaseException) -> str:
    """An exception's message, even when its own ``__str__`` raises."""
    try:
        return str(e)
    except BaseException:
        return "(its message cannot be shown)"


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {_message(e)}"


def _run(
    spec: ToolSpec, arguments: Mapping[str, Any], extra: Mapping[str, Any], max_chars: int
) -> Observation:
    """Run the tool's function and make its result (or the error it raised) an observation."""
    # printed output is kept only up to the limit: a tool that prints megabytes costs no memory
    out = _CappedText(max_chars + 1)
    try:
        with contextlib.redirect_stdout(out):
            value = spec.fn(**arguments, **extra)
    except ToolError as e:
        shorten = _keep_end if e.keep_end else _cut
        return Observation(shorten(f"error: {_message(e)}", max_chars)[0], e.kind)
    except TypeError as e:  # wrong or missing argument names
        return Observation(_cut(f"error: bad arguments: {_message(e)}", max_chars)[0], "bad_arguments")
    except RecursionError:
        return Observation("error: bad arguments: nested too deeply", "bad_arguments")
    except Exception as e:
        return Observation(_keep_end(f"error: {_describe(e)}", max_chars)[0], "raised")
    try:
        if value is None:  # what it printed (a lone surrogate in it is invalid UTF-8 too)
            printed, bad = _as_text("".join(out.parts))
            text, cut = (printed, False) if not out.dropped else (printed[:max_chars] + "...[cut]", True)
        else:
            text, bad = _as_text(value)
            cut = False
    except Exception as e:
        why = f"error: the result cannot be shown as text ({_describe(e)})"
        return Observation(_keep_end(why, max_chars)[0], "raised")
    if bad:  # said plainly, in characters every vocabulary has
        text = "error: the result is not valid UTF-8 (? marks the bad bytes): " + text.replace("\ufffd", "?")
    if bad or not cut:
        text, more = _cut(text, max_chars)
        cut = cut or more
    return Observation(text, "invalid_utf8" if bad else "", cut)
