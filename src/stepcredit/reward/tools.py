"""Tool calls run through the reward layer's execution path: the run's one reward agent and its
kill-safe workers, so a tool gets the same deadlines (a hanging tool's worker is killed), concurrency
limits and no-lost-request guarantees as a reward function.

A call is submitted as a row of style ``tool`` whose response is the call as JSON; the reward
function registered under that style runs :func:`stepcredit.tools.execute_call` in a worker, under the
run's ``reward.sandbox`` settings, and returns the observation in its result's ``info``.
:class:`AgentCallRunner` turns a batch of calls into observations, and a deadline or a crashed worker
into an error observation of its own kind. A call runs at most once (the style is registered with
``reruns=False``: no retry, no re-submission after a worker died) unless its tool is registered
``idempotent`` (style ``tool_idempotent``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.errors import ConfigError
from stepcredit.reward.base import FnRef, load_ref, register_reward
from stepcredit.reward.verifiers import math as _math  # noqa: F401  (registers "math")
from stepcredit.tools import TOOLS, Observation, ToolCall, execute_call
from stepcredit.types import RewardResult, Sample, Status

TOOL_STYLE = "tool"
"""The row style (and reward name) of a tool call (style routing comes before ``reward.custom``)."""
IDEMPOTENT_TOOL_STYLE = "tool_idempotent"
"""The style of a call of an ``idempotent`` tool: the agent may run it again after its worker died."""

_FINAL_RE = re.compile(r"answer is\b", re.IGNORECASE)
_INTEGER_RE = re.compile(r"(-?\d+)(?:\s+[A-Za-z]+)?")  # "47056" or "47056 eggs"


@register_reward("arith_tools", fast=None, isolate=False)
def integer_answer(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> RewardResult:
    """The tool task's verdict: what follows the last "answer is" must be an integer literal equal to
    the ground truth (a trailing unit word and full stop allowed). The math verifier (like math-verify) evaluates an
    expression it extracts, so "The answer is 68 * 692" would score 1 on a task whose point is that the
    model computes it (with the calculator, or in its head on the no-tool side): an unevaluated product
    is a wrong answer here, not an unparseable one."""
    found = list(_FINAL_RE.finditer(solution_str))
    if not found:
        return RewardResult(score=0.0, status=Status.UNPARSEABLE, info={"how": "no 'answer is'"})
    tail = solution_str[found[-1].end() :].strip().removesuffix(".").strip()
    try:
        want = int(str(ground_truth).strip())
    except ValueError:
        return RewardResult.failure(
            Status.ERROR, f"arith_tools ground truth is not an integer: {ground_truth!r}"
        )
    m = _INTEGER_RE.fullmatch(tail)
    ok = m is not None and int(m.group(1)) == want
    return RewardResult(score=float(ok), status=Status.OK, extracted=tail[:64], info={"how": "integer"})


@register_reward(TOOL_STYLE, reruns=False)
def run_tool_call(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any) -> RewardResult:
    """Runs in a worker: the call in ``solution_str`` (JSON ``{"name", "arguments"}``); ``extra_info``
    carries the offered tools, where a worker finds user tools, the row's ``tools_kwargs`` and the
    length limit. The score is 1 when the tool answered, 0 when its observation is an error."""
    info = dict(extra_info or {})
    for name, (module, path, attr) in (info.get("refs") or {}).items():
        if name not in TOOLS:  # a user's tool registered in the trainer's process: import it here
            _import_tool(name, module, path, attr)
    call = json.loads(solution_str)
    obs = execute_call(
        ToolCall(call["name"], call["arguments"], call.get("error", ""), call.get("kind", "")),
        offered=info.get("offered", []),
        tools_kwargs=info.get("tools_kwargs") or {},
        max_chars=int(info.get("max_chars", 512)),
        sandbox=SandboxConfig(**info["sandbox"]) if info.get("sandbox") else None,
    )
    return RewardResult(
        score=0.0 if obs.error else 1.0,
        status=Status.OK,
        info={"observation": obs.text, "error": obs.error, "truncated": obs.truncated},
    )


# the same function under the style whose calls the agent may run again (reruns, the default)
register_reward(IDEMPOTENT_TOOL_STYLE)(run_tool_call)


def _defined_at(fn: Any) -> tuple[str, str, str]:
    """(module, file, qualified name) of the code behind a tool's function: a plain function, the
    function of a ``functools.partial``, or the class of a callable object."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if not (inspect.isroutine(target) or inspect.isclass(target)):
        target = type(target)
    try:
        path = inspect.getsourcefile(target) or ""
    except TypeError:  # a built-in
        path = ""
    module = str(getattr(target, "__module__", "") or "")
    return module, os.path.abspath(path) if path else "", str(getattr(target, "__qualname__", ""))


def _import_tool(name: str, module: str, path: str, attr: str) -> None:
    # by module name where this worker can import it, else from its file (a script, a test module);
    # importing the module registers the tool, so a name that is no module attribute (a lambda, a
    # partial, an object) is enough once the tool is registered
    failed: ConfigError | None = None
    for kind, target in (("module", module), ("file", path)):
        if not target:
            continue
        try:
            load_ref(FnRef(kind, target, attr))
            return
        except ConfigError as e:
            if name in TOOLS:
                return
            failed = failed or e
    if failed is not None:
        raise failed


_FAILED = {Status.TIMEOUT: "timeout"}


def _style(call: ToolCall) -> str:
    """The call's row style: an idempotent tool's calls may run again, the others never."""
    spec = TOOLS.get(call.name) if call.name in TOOLS else None
    return IDEMPOTENT_TOOL_STYLE if spec is not None and spec.idempotent else TOOL_STYLE


class AgentCallRunner:
    """Runs batches of calls through a rewarder's agent: ``runner(calls, tools_kwargs) -> observations``."""

    def __init__(self, rewarder: Any, *, offered: Sequence[str], max_chars: int) -> None:
        self.rewarder = rewarder
        self.offered = list(offered)
        self.max_chars = max_chars
        # the run's sandbox limits, for tools that run code (never the policy's arguments)
        sandbox = getattr(getattr(rewarder, "cfg", None), "sandbox", None)
        self.sandbox = dataclasses.asdict(sandbox) if isinstance(sandbox, SandboxConfig) else None
        # user tools (not built in) are re-registered in workers by importing their defining module
        self.refs: dict[str, tuple[str, str, str]] = {}
        for n in self.offered:
            spec = TOOLS.get(n)  # an unknown name in rollout.tools.names: one line listing the valid ones
            ref = _defined_at(spec.fn)
            if not ref[0].startswith("stepcredit."):
                self.refs[n] = ref

    def __call__(
        self, calls: Sequence[ToolCall], tools_kwargs: Sequence[Mapping[str, Any] | None]
    ) -> list[Observation]:
        if not calls:
            return []
        samples = [
            Sample(
                prompt=(),
                ground_truth=None,
                data_source=_style(c),
                style=_style(c),
                domain=TOOL_STYLE,
                extra_info={
                    "offered": self.offered,
                    "refs": self.refs,
                    "tools_kwargs": dict(kw or {}),
                    "max_chars": self.max_chars,
                    "sandbox": self.sandbox,
                },
                uid=f"tool:{i}",
            )
            for i, (c, kw) in enumerate(zip(calls, tools_kwargs, strict=True))
        ]
        texts = [
            json.dumps({"name": c.name, "arguments": c.arguments, "error": c.error, "kind": c.kind})
            for c in calls
        ]
        out = []
        for r in self.rewarder.score_batch(samples, texts, list(range(len(calls)))):
            if r.status == Status.OK and "observation" in r.info:
                out.append(
                    Observation(str(r.info["observation"]), str(r.info["error"]), bool(r.info["truncated"]))
                )
            else:  # the worker's deadline, or a worker that died: the tool is what failed
                kind = _FAILED.get(r.status, "crashed")
                msg = str(r.info.get("message", r.status.value))[:200]
                out.append(Observation(f"error: the tool {kind}: {msg}", kind))
        return out
