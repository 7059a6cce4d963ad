"""Exact step values (``step_oracle``): the values of a trace's prefixes by the task's own arithmetic, the
step credit they give, and the start-up refusal for data without exact step values."""

from __future__ import annotations

import pytest

from stepcredit.config import ProcessConfig
from stepcredit.errors import DataError
from stepcredit.models import build_tokenizer
from stepcredit.process import VALUE_ESTIMATORS, check_data, prefix_request, step_credits
from stepcredit.process.values import ValueContext
from stepcredit.types import Sample

Q = "Ned has 5 apples. Then is given 8 more. Then loses 4. How many apples now?"


def test_oracle_credit_is_minus_one_at_the_slip_and_plus_one_at_its_correction() -> None:
    tok = build_tokenizer()
    cfg = ProcessConfig(enabled=True, value_estimator="step_oracle", min_episode_tokens=2)
    text = "Let me start with 5. So 5 + 8 = 14. Wait, 5 + 8 = 13. But 13 - 4 = 9. The answer is 9."
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    sample = Sample(prompt=({"role": "user", "content": Q},), ground_truth="9", uid="t:0")
    ends, req = prefix_request(sample, [1, 2], ids, tok, cfg)
    assert len(ends) == 4  # a marker opens an episode; "The answer is" joins the last one
    spec = VALUE_ESTIMATORS.get("step_oracle")
    values = spec(ValueContext(None, tok, [req], cfg, lambda ss, texts: [1.0] * len(texts)))[0]
    # V_0 (nothing said) = 1; after the start 1; the slip 0; the correction 1; the rest with the answer: 1
    assert values == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert step_credits(values, cfg) == [0.0, -1.0, 1.0, 0.0]
    # a complete response ends at its reward (the verifier's score), whatever its steps looked like
    assert spec(ValueContext(None, tok, [req], cfg, lambda ss, texts: [0.0] * len(texts)))[0] == [
        1.0,
        1.0,
        0.0,
        1.0,
        0.0,
    ]
    assert spec.terminal_is_reward and spec.needs_verifier


def test_data_without_exact_step_values_is_refused_at_start_up() -> None:
    cfg = ProcessConfig(enabled=True, value_estimator="step_oracle")
    ok = Sample(prompt=({"role": "user", "content": Q},), ground_truth="9", uid="arith:train:0")
    code = Sample(
        prompt=({"role": "user", "content": "x"},), ground_truth="1", data_source="gsm8k", uid="f.jsonl:3"
    )
    check_data(cfg, [ok], frozenset({"default"}))
    with pytest.raises(DataError, match=r"sample f\.jsonl:3: .*step_oracle.*'gsm8k'"):
        check_data(cfg, [ok, code], frozenset({"default"}))
    check_data(cfg, [ok, code.with_(domain="other")], frozenset({"default"}))  # not a process domain


@pytest.mark.parametrize(
    ("prefix", "value"),
    [
        ("Let me start with 5. So 5 + 8 = 13.", 1.0),
        # an operation written without its result is checked by nothing: 0, not the last checked value
        # (a policy trained on that credit learned to write such steps: docs/results/regime_weaksft.md)
        ("Let me start with 5. So 5 + 8.", 0.0),
        ("Let me start with 5. So 5 + 8 = 13. So 17.", 0.0),
        ("Let me start with 5. So 5 + 8. So 13 - 4 = 9.", 1.0),  # a later checked step decides again
        ("Let me start with 5. So 5 + 8 = 13. Hmm, 13 apples so far.", 1.0),  # a restatement: no change
        ("Let me start with 5. So 5 + 8 = 13. Let me check: that leaves 13.", 1.0),
        ("Let me start with 5. So 5 + 8 = 13. So", 1.0),  # a marker alone states nothing
        ("Let me start with 5. So 5 + 8 = 13. But 13 - 4 = 9. The answer is 9.", 1.0),
    ],
)
def test_a_step_that_no_check_holds_is_worth_nothing(prefix: str, value: float) -> None:
    from stepcredit.data.arith import step_value

    assert step_value(Q, prefix) == value
