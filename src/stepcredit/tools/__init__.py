"""Tools a policy calls inside a multi-turn rollout: declarations, parsed calls, parsers, execution
(:mod:`.core`), chat templates' tool turns (:mod:`.templates`), and the built-in ``calculator`` and ``python`` tools (:mod:`.builtin`), registered on import.
"""

import stepcredit.tools.builtin  # noqa: F401  (registers calculator and python)
from stepcredit.tools.core import (
    PARSERS,
    TOOLS,
    Observation,
    ParsedCall,
    ToolCall,
    ToolError,
    ToolParser,
    ToolSpec,
    check_arguments,
    execute_call,
    neutralise,
    register_http_tool,
    register_tool,
    schemas,
)
from stepcredit.tools.templates import TemplateTools, hermes_template, probe_tool_template, tool_turn_text

__all__ = [
    "PARSERS",
    "TOOLS",
    "Observation",
    "ParsedCall",
    "TemplateTools",
    "ToolCall",
    "ToolError",
    "ToolParser",
    "ToolSpec",
    "check_arguments",
    "execute_call",
    "hermes_template",
    "neutralise",
    "probe_tool_template",
    "register_http_tool",
    "register_tool",
    "schemas",
    "tool_turn_text",
]
