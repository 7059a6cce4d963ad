"""Chat templates and tool turns: does a tokenizer's chat template render tool calls and tool messages,
and what text does it put between a call and the next assistant turn?

A template "renders tools" when an assistant message's ``tool_calls`` and a ``tool`` message both show
in its output (a template that prints any role generically, as SmolLM2's ChatML one does, renders the
tool message but drops the call: it does not). Its tool turn for a result is the difference between
rendering the conversation with the ``tool`` message (and the generation prompt) and rendering it
without, taken from the end of the call: the template's end of the assistant's turn, the tool turn's
markup and the next assistant header. :func:`hermes_template` writes a Hermes-style template (tools in
the system turn, ``<tool_call>`` JSON in the assistant turn, results in ``<tool_response>`` tags) for a
model whose own template has no tools.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# strings no real conversation holds: where they show in a rendering, the template printed that part
_CALL_NAME = "probe_tool_call_7f3a"
_RESULT = "probe_tool_result_7f3a"
_ANSWER = "probe_answer_7f3a"


@dataclass(frozen=True)
class TemplateTools:
    """What a tokenizer's chat template does with tools (:func:`probe_tool_template`)."""

    renders: bool
    """The template renders an assistant message's ``tool_calls`` and a ``tool`` message."""
    why_not: str = ""
    """When it does not: what is missing, in words (for the start-up error)."""
    end_of_turn: str = ""
    """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
    schemas: bool = False
    """The template prints the ``tools`` schemas it is given (in the prompt's system turn)."""


def _call_message(name: str, arguments: Mapping[str, Any], content: str = "") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": dict(arguments)}}],
    }


def _render(tok: Any, messages: Sequence[Mapping[str, Any]], *, gen: bool, tools: Any = None) -> str:
    return str(
        tok.apply_chat_template(list(messages), tools=tools, add_generation_prompt=gen, tokenize=False)
    )


_PROBED: dict[tuple[int, str], TemplateTools] = {}


def probe_tool_template(tok: Any) -> TemplateTools:
    """Probe ``tok``'s chat template once (cached per tokenizer and template) with a conversation of
    made-up strings: a call, its result and a plain answer."""
    template = getattr(tok, "chat_template", None)
    key = (id(tok), str(template))
    if key not in _PROBED:
        _PROBED[key] = _probe(tok, template)
    return _PROBED[key]


def _probe(tok: Any, template: Any) -> TemplateTools:
    if not template:
        return TemplateTools(False, "it has no chat template")
    user = {"role": "user", "content": "q"}
    schema = {"type": "function", "function": {"name": _CALL_NAME, "description": "d", "parameters": {}}}
    try:
        with_call = _render(tok, [user, _call_message(_CALL_NAME, {})], gen=False)
        with_result = _render(
            tok, [user, _call_message(_CALL_NAME, {}), {"role": "tool", "content": _RESULT}], gen=True
        )
        answer = _render(tok, [user, {"role": "assistant", "content": _ANSWER}], gen=False)
        schemas = _CALL_NAME in _render(tok, [user], gen=True, tools=[schema])
    except Exception as e:  # a template that fails on these messages cannot render them
        return TemplateTools(False, f"rendering a tool call failed ({type(e).__name__}: {e})")
    if _CALL_NAME not in with_call:
        return TemplateTools(False, "it does not render an assistant message's tool_calls", schemas=schemas)
    if _RESULT not in with_result:
        return TemplateTools(False, "it does not render a message of role 'tool'", schemas=schemas)
    end = answer[answer.rindex(_ANSWER) + len(_ANSWER) :]
    if not with_call.endswith(end) or not with_result.startswith(with_call[: len(with_call) - len(end)]):
        return TemplateTools(
            False, "its tool turn rewrites the text before it (no turn can be appended)", schemas=schemas
        )
    return TemplateTools(True, end_of_turn=end, schemas=schemas)


def tool_turn_text(
    tok: Any,
    result: str,
    *,
    prompt: Sequence[Mapping[str, Any]],
    call: str,
    tools: Any = None,
) -> str:
    """The template's text from the end of a call to the next assistant turn's first token, for a
    result (a tool named ``call`` answered ``result`` to the conversation ``prompt``): the rendering of
    ``prompt`` + the call + the ``tool`` message with the generation prompt, minus the rendering of
    ``prompt`` + the call up to its end of turn. Earlier turns of the response are not rendered: a tool
    turn of a template that renders tools depends on its own message only (checked by :func:`probe_tool_template`,
    which refuses a template whose tool turn rewrites the text before it)."""
    turns = probe_tool_template(tok)
    if not turns.renders:
        raise ValueError(f"the tokenizer's chat template cannot render a tool turn: {turns.why_not}")
    head = [*prompt, _call_message(call, {})]
    before = _render(tok, head, gen=False, tools=tools)
    after = _render(tok, [*head, {"role": "tool", "name": call, "content": result}], gen=True, tools=tools)
    start = len(before) - len(turns.end_of_turn)
    if not before.endswith(turns.end_of_turn) or after[:start] != before[:start]:
        raise ValueError("the chat template's tool turn rewrites the conversation before it")
    return after[start:]


def hermes_template(*, turn_start: str = "<|im_start|>{role}\n", turn_end: str = "<|im_end|>\n") -> str:
    """A Jinja chat template in the Hermes style, written for this project: the offered tools' JSON
    schemas in the system turn, calls as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
    in the assistant turn, and each result as a user turn ``<tool_response>...</tool_response>``.
    ``turn_start`` (with ``{role}``) and ``turn_end`` are the model's turn markup: ChatML's by default
    (SmolLM2's, Qwen's), or e.g. ``"<|{role}|>"`` and ``"<|end|>"`` for the built-in tiny tokenizer."""
    before, after = turn_start.split("{role}")

    def lit(s: str) -> str:  # a Jinja string literal
        return json.dumps(s)

    head = f"{lit(before)} ~ {{role}} ~ {lit(after)}"
    start = {r: head.replace("{role}", lit(r)) for r in ("system", "user", "assistant")}
    intro = "You can call these tools; each line of <tools></tools> is one tool's JSON schema:\n<tools>\n"
    how = (
        "</tools>\nTo call a tool, write a JSON object with its name and arguments between <tool_call> and "
        '</tool_call>:\n<tool_call>\n{"name": "<tool>", "arguments": {"<arg>": "<value>"}}\n</tool_call>\n'
        "The result comes back between <tool_response> and </tool_response>."
    )
    return (
        "{%- if messages and messages[0].role == 'system' %}"
        "{%- set system = messages[0].content %}{%- set rest = messages[1:] %}"
        "{%- else %}{%- set system = '' %}{%- set rest = messages %}{%- endif %}"
        "{%- if system or tools %}"
        f"{{{{ {start['system']} }}}}{{{{ system }}}}"
        "{%- if tools %}{%- if system %}{{ '\\n\\n' }}{%- endif %}"
        f"{{{{ {lit(intro)} }}}}"
        "{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}{%- endfor %}"
        f"{{{{ {lit(how)} }}}}"
        "{%- endif %}"
        f"{{{{ {lit(turn_end)} }}}}"
        "{%- endif %}"
        "{%- for m in rest %}"
        "{%- if m.role == 'assistant' %}"
        f"{{{{ {start['assistant']} }}}}"
        "{%- if m.content %}{{ m.content }}{%- endif %}"
        "{%- for c in m.tool_calls or [] %}"
        "{%- set f = c.function if c.function is defined else c %}"
        "{%- if m.content or not loop.first %}{{ '\\n' }}{%- endif %}"
        "{{ '<tool_call>\\n{\"name\": ' ~ (f.name | tojson) ~ ', \"arguments\": ' }}"
        "{{- f.arguments | tojson if f.arguments is mapping else f.arguments }}"
        "{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        f"{{{{ {lit(turn_end)} }}}}"
        "{%- elif m.role == 'tool' %}"
        f"{{{{ {start['user']} ~ '<tool_response>\\n' ~ m.content ~ '\\n</tool_response>' ~ {lit(turn_end)} }}}}"
        "{%- else %}"
        f"{{{{ {head.replace('{role}', 'm.role')} ~ m.content ~ {lit(turn_end)} }}}}"
        "{%- endif %}"
        "{%- endfor %}"
        f"{{%- if add_generation_prompt %}}{{{{ {start['assistant']} }}}}{{%- endif %}}"
    )
