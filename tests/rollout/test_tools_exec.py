"""Tools: parsers, the calculator, and every failure a tool can have turned into an error observation
(never an exception), in process and through the reward agent's kill-safe workers."""

from __future__ import annotations

import time

import pytest

from stepcredit.config import RewardConfig, SandboxConfig
from stepcredit.reward import build_rewarder
from stepcredit.reward.tools import AgentCallRunner
from stepcredit.tools import PARSERS, TOOLS, ToolCall, ToolError, execute_call, register_tool, schemas
from stepcredit.tools.builtin import calculate

OBJ = {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}


@register_tool("t_raises", description="raises", parameters=OBJ)
def t_raises(x: str) -> str:
    raise RuntimeError("boom " + x)


@register_tool("t_prints", description="prints megabytes", parameters=OBJ)
def t_prints(x: str) -> None:
    for _ in range(1000):
        print("y" * 4096)  # 4 MB printed, none of it kept past the limit


@register_tool("t_huge", description="returns megabytes", parameters=OBJ)
def t_huge(x: str) -> str:
    return "z" * 3_000_000


@register_tool("t_bytes", description="invalid utf-8", parameters=OBJ)
def t_bytes(x: str) -> bytes:
    return b"ok \xff\xfe done"


@register_tool("t_surrogate", description="a str that is not UTF-8", parameters=OBJ)
def t_surrogate(x: str) -> str:
    return "a\udcffb"


@register_tool("t_sleeps", description="hangs", parameters=OBJ)
def t_sleeps(x: str) -> str:
    time.sleep(3600)  # killed at the reward deadline: a test that waited for it would hang an hour
    return "never"


@register_tool("t_kw", description="reads a per-row kwarg", parameters=OBJ)
def t_kw(x: str, secret: str = "") -> str:
    return f"{x}:{secret}"


@register_tool("t_domain", description="raises its own kind", parameters=OBJ)
def t_domain(x: str) -> str:
    raise ToolError("not_found", f"no page {x}")


ALL = [
    "calculator",
    "t_raises",
    "t_prints",
    "t_huge",
    "t_bytes",
    "t_surrogate",
    "t_sleeps",
    "t_kw",
    "t_domain",
]


def run(name: str, args: dict | None, **kw: object) -> object:
    return execute_call(ToolCall(name, args, "" if args is not None else "bad json"), offered=ALL, **kw)


def test_calculator_is_exact_and_refuses_anything_else() -> None:
    assert TOOLS.get("calculator").fn(expression="347*28+5") == "9721"  # 9716 + 5
    assert TOOLS.get("calculator").fn(expression="7/2") == "3.5"
    assert TOOLS.get("calculator").fn(expression="2^10 - (3 % 2)") == "1023"
    for bad in ("__import__('os').system('x')", "a+1", "9**9**9", "1/0", "[1]*3"):
        with pytest.raises(ToolError):
            calculate(bad)


def test_hermes_and_fenced_parsers() -> None:
    tools = {n: TOOLS.get(n) for n in ALL}
    hermes = PARSERS.get("hermes")
    text = 'pre <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call> post'
    got = hermes.find(text, tools)
    assert got is not None and got.call == ToolCall("calculator", {"expression": "2*3"})
    assert text[: got.end].endswith("</tool_call>")
    # arguments written as a JSON string (some templates do) are read too
    s = '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1\\"}"}</tool_call>'
    assert hermes.find(s, tools).call.arguments == {"expression": "1"}
    bad = hermes.find("<tool_call>{name: calculator}</tool_call>", tools)
    assert bad is not None and bad.call.arguments is None and bad.call.error
    # an opened call never closed is an unparseable call to the end of the text, never a silent answer
    unfinished = hermes.find("<tool_call>{unfinished", tools)
    assert unfinished is not None and unfinished.call.kind == "unparseable_call" and unfinished.end == 22
    fenced = PARSERS.get("fenced")
    f = fenced.find("so\n```calculator\n12*12\n```\nrest", tools)
    assert f.call == ToolCall("calculator", {"expression": "12*12"})
    # our own result block is not a call; a result marks where a turn ends
    assert fenced.find("```output\n144\n```", tools) is None
    obs = fenced.observation("144")
    assert fenced.observation_starts("a" + obs) == [1]
    assert schemas(["calculator"])[0]["function"]["name"] == "calculator"


def test_each_failure_is_an_error_observation() -> None:
    assert run("calculator", {"expression": "6*7"}).text == "42"
    o = run("t_raises", {"x": "1"})
    assert (o.error, o.text) == ("raised", "error: RuntimeError: boom 1")
    o = run("nope", {"x": "1"})
    assert o.error == "unknown_tool" and "calculator" in o.text
    o = run("t_raises", None)  # malformed JSON arguments
    assert o.error == "bad_arguments" and "malformed" in o.text
    o = run("calculator", {"wrong": "1"})  # arguments that do not fit the function
    assert o.error == "bad_arguments"
    o = run("calculator", {"expression": "1+"})
    assert o.error == "bad_expression" and o.text.startswith("error: cannot parse")
    o = run("t_domain", {"x": "p"})
    assert (o.error, o.text) == ("not_found", "error: no page p")
    o = run("t_prints", {"x": ""}, max_chars=100)
    assert o.truncated and not o.error and len(o.text) < 120 and o.text.startswith("y" * 100)
    o = run("t_huge", {"x": ""}, max_chars=100)
    assert o.truncated and o.text.startswith("z" * 100) and "2999900 more characters cut" in o.text
    for name in ("t_bytes", "t_surrogate"):
        o = run(name, {"x": ""})
        assert o.error == "invalid_utf8"
        o.text.encode("utf-8")  # what the policy sees is valid text
    o = run("t_kw", {"x": "a"}, tools_kwargs={"t_kw": {"secret": "row7"}})
    assert o.text == "a:row7"
    # a tool the run does not offer is unknown even when registered
    o = execute_call(ToolCall("t_kw", {"x": "a"}), offered=["calculator"])
    assert o.error == "unknown_tool"


def test_calls_run_through_the_reward_agent_with_a_deadline() -> None:
    # one pool for the rewards and the tools: a tool hanging past reward.timeout_s is killed there
    cfg = RewardConfig(timeout_s=1.0)
    with build_rewarder(cfg) as rewarder:
        runner = AgentCallRunner(rewarder, offered=ALL, max_chars=64)
        t0 = time.perf_counter()
        obs = runner(
            [
                ToolCall("t_sleeps", {"x": ""}),
                ToolCall("calculator", {"expression": "12*12"}),
                ToolCall("t_kw", {"x": "b"}),  # a user tool: the worker imports this file to find it
                ToolCall("t_raises", {"x": "2"}),
                ToolCall("", None, "bad"),
            ],
            [None, None, {"t_kw": {"secret": "s"}}, None, None],
        )
        # the hang ends at its 1 s deadline (the "timeout" below), not after its hour; the bound is
        # 10x a loaded machine's time (12 s measured with other work on both cores; worker start-up)
        assert time.perf_counter() - t0 < 120
    assert [o.error for o in obs] == ["timeout", "", "", "raised", "bad_arguments"]
    assert obs[0].text.startswith("error: the tool timeout")
    assert [o.text for o in obs[1:3]] == ["144", "b:s"]


def test_python_tool_runs_in_the_code_sandbox() -> None:
    # the code reward's sandbox: output comes back, a crash, a hang, a fork bomb and an escape attempt
    # are the program's failures (error observations), never the run's
    def py(code: str, **kw: object) -> object:
        return execute_call(ToolCall("python", {"code": code}), offered=["python"], **kw)

    assert py("print(12 * 12)").text == "144\n"
    o = py("raise SystemExit('nope')")
    assert o.error == "program_error" and "nope" in o.text
    o = py("while True: pass", sandbox=SandboxConfig(timeout_s=1.0))  # the run's reward.sandbox limits
    assert o.error == "timeout"
    o = py("import os\nwhile True:\n    try: os.fork()\n    except OSError: break\nprint('done')")
    assert o.error in ("", "program_error", "timeout")  # bounded by the sandbox's process limit
    o = py("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\nprint('escaped')")
    assert "escaped" not in o.text and o.error == "program_error"
    o = py("print(open('/etc/shadow').read())")
    assert o.error == "program_error"
