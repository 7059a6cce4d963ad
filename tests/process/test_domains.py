"""Which domains get process rewards (``process.domains``)."""

from __future__ import annotations

from stepcredit.config import ProcessConfig
from stepcredit.process.domains import process_domains, short_answer
from stepcredit.types import Sample


def _s(domain: str, gt: object) -> Sample:
    return Sample(prompt=({"role": "user", "content": "q"},), ground_truth=gt, domain=domain)


def test_default_is_every_domain_whose_gold_answers_are_short_strings() -> None:
    rows = [
        _s("arith", "14"),
        _s("arith", 7),
        _s("code", {"assert_case": ["assert f(1) == 2"]}),  # a test spec: the probe cannot ask for it
        _s("essay", "x" * 65),  # longer than max_answer_chars
        _s("mixed", "3"),
        _s("mixed", "line one\nline two"),  # one row that does not qualify excludes its domain
    ]
    assert process_domains(ProcessConfig(), rows) == frozenset({"arith"})
    assert process_domains(ProcessConfig(max_answer_chars=80), rows) == frozenset({"arith", "essay"})
    # named domains win over the default
    assert process_domains(ProcessConfig(domains=("code",)), rows) == frozenset({"code"})


def test_short_answer() -> None:
    assert short_answer("\\frac{1}{3}", 64) and short_answer(3.5, 64)
    assert not short_answer(True, 64) and not short_answer("", 64) and not short_answer(["1"], 64)
