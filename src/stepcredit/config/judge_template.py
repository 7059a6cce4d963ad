"""Judge prompt templates: their grammar and the start-up check of a template's fields."""

from __future__ import annotations

import re

from stepcredit.config.checks import _check

JUDGE_FIELD_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")
"""A judge template's grammar: ``{{`` / ``}}`` are literal braces, ``{name}`` is a field, the rest is text."""
JUDGE_FIELDS = ("question", "response", "ground_truth", "marker")
"""Fields of a judge template (``marker``: the request's random region code, the only field repeatable)."""


def check_judge_template(template: str) -> None:
    """ConfigError naming an unknown or repeated field of a judge template (a typo such as
    ``{reference}`` stops the run at start-up instead of reaching the judge as text)."""
    if not template:
        return
    seen: dict[str, int] = {}
    for m in JUDGE_FIELD_RE.finditer(template):
        name = m.group(1)
        if name is None:
            continue
        _check(
            name in JUDGE_FIELDS,
            "reward.judge.prompt_template",
            f"unknown field {{{name}}} (fields: {', '.join('{' + f + '}' for f in JUDGE_FIELDS)};"
            " write {{ and }} for literal braces)",
        )
        seen[name] = seen.get(name, 0) + 1
    _check(seen.get("response") == 1, "reward.judge.prompt_template", "must contain {response} exactly once")
    for name in ("question", "ground_truth"):
        _check(seen.get(name, 0) <= 1, "reward.judge.prompt_template", f"{{{name}}} may appear once at most")
