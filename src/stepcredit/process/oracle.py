"""Exact step values where the task can check every step: the oracle that bounds every V(prefix)
estimator from above on that task.

On ``arith`` each step's equation can be checked against the problem's own chain, so the value of a
prefix is known exactly (:func:`stepcredit.data.arith.step_value`): 1 while the last stated quantity is
right, 0 from a slip until it is corrected, and 0 from a step that writes a number no check holds (an
operation without its result), which a policy would otherwise learn to write to dodge the slip's -1. Its differences are exact step
credit (-1 at the step that goes wrong, +1 at its correction, 0 elsewhere), and they run through the
same credit forms and advantage estimators as any estimated value; the gap between a training run with
these values and one with an estimator's is what the estimator loses.
"""

from __future__ import annotations

from stepcredit.data import STEP_VALUES
from stepcredit.errors import DataError
from stepcredit.process.values import ValueContext, register_value_estimator


@register_value_estimator(
    "step_oracle",
    needs_verifier=True,
    generates=False,
    terminal_is_reward=True,
    needs_step_values=True,
    success_probability=True,
)
def step_oracle(ctx: ValueContext) -> list[list[float]]:
    """V_i = the data source's exact value of the response's first i episodes (``STEP_VALUES``); the
    value after a complete response is its reward (the verifier's score), so the utilities add up to
    R - V_0 as ``terminal_is_reward`` promises."""
    tokenizer, requests = ctx.tokenizer, ctx.requests
    out: list[list[float]] = []
    complete: list[int] = []  # rows whose last value is their reward, scored in one verifier call
    for r in requests:
        if r.sample.data_source not in STEP_VALUES:
            raise DataError(
                f"sample {r.sample.uid or '?'}: process.value_estimator=step_oracle has no exact step values "
                f"for data source {r.sample.data_source!r} (known: {', '.join(STEP_VALUES.names())})"
            )
        fn = STEP_VALUES.get(r.sample.data_source)
        values = [
            fn(r.sample, tokenizer.decode(r.response_ids[:n], skip_special_tokens=True))
            for n in r.prefix_lens
        ]
        if r.complete and r.prefix_lens[-1] >= len(r.response_ids) - 1:
            complete.append(len(out))
        out.append(values)
    if complete:
        texts = [tokenizer.decode(requests[b].response_ids, skip_special_tokens=True) for b in complete]
        rewards = ctx.verifier([requests[b].sample for b in complete], texts)
        for b, reward in zip(complete, rewards, strict=True):
            out[b][-1] = float(reward)
    return out
