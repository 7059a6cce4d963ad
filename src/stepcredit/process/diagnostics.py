"""Per-sample diagnostics: the episodes of a response with their V and U, for logs and ``explain``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepcredit.config import ProcessConfig
from stepcredit.process.segment import token_char_spans
from stepcredit.process.utility import step_credits


def prompt_ids(tokenizer: Any, prompt: str | Sequence[dict[str, str]], *, raw: bool = False) -> list[int]:
    """Token ids of a prompt as the rollout renders it: chat messages (or a string as one user message)
    through the tokenizer's chat template with the generation prompt; a string as it is with
    ``raw=True`` or when the tokenizer has no template."""
    if isinstance(prompt, str) and (raw or not getattr(tokenizer, "chat_template", None)):
        text = prompt
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def describe_episodes(
    response_ids: Sequence[int],
    tokenizer: Any,
    ends: Sequence[int],
    values: Sequence[float],
    cfg: ProcessConfig,
) -> list[dict[str, Any]]:
    """One dict per episode: ``start``/``end`` (character offsets into the decoded response, end
    exclusive), ``token_start``/``token_end`` (inclusive token indices), ``text``, ``value`` (V_i, after
    the episode) and ``utility`` (the step credit as the process channel gets it: credit form, clip, scale,
    last-episode rule).
    """
    if len(values) != len(ends) + 1:
        raise ValueError(f"{len(ends)} episodes need {len(ends) + 1} values, got {len(values)}")
    text, spans = token_char_spans(response_ids, tokenizer)
    utils = step_credits(values, cfg)
    out = []
    first = 0
    for i, last in enumerate(ends):
        start, end = spans[first][0], spans[last][1]
        out.append(
            {
                "start": start,
                "end": end,
                "token_start": first,
                "token_end": last,
                "text": text[start:end],
                "value": float(values[i + 1]),
                "utility": float(utils[i]),
            }
        )
        first = last + 1
    return out
