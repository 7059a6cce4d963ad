"""Which responses get process rewards (``process.domains``).

The forced-answer probe asks the policy for the gold answer after a prefix: that is meaningful when
the answer is a short string (a number, an expression), not when it is a test specification (code)
or a rubric. So by default a domain gets process rewards when every gold answer of its training rows
is a short single-line string.
"""

from __future__ import annotations

from collections.abc import Iterable

from stepcredit.config import ProcessConfig
from stepcredit.types import Sample


def short_answer(ground_truth: object, max_chars: int) -> bool:
    """A gold answer the policy can be asked to state: a number or a short one-line string."""
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        return False
    text = str(ground_truth)
    return 0 < len(text) <= max_chars and "\n" not in text


def process_domains(cfg: ProcessConfig, samples: Iterable[Sample]) -> frozenset[str]:
    """The domains whose responses get V(prefix) and a process channel: ``cfg.domains`` when given,
    else every domain whose gold answers are all short strings (:func:`short_answer`)."""
    if cfg.domains:
        return frozenset(cfg.domains)
    seen: dict[str, bool] = {}
    for s in samples:
        seen[s.domain] = seen.get(s.domain, True) and short_answer(s.ground_truth, cfg.max_answer_chars)
    return frozenset(d for d, ok in seen.items() if ok)
