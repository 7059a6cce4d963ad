"""What greedy-continuation step values cost per training step, next to outcome-only GRPO.

Issue 38 asks for greedy-continuation values at every episode end (``process.value_estimator=
greedy_continuation``, ``process.mc_prefixes=0``: one greedy continuation per prefix, scored by the
verifier, Math-Shepherd's hard estimate) with their cost per step measured. Both sides train from the
same saved model on the same preset (``midchain`` by default) for ``--steps`` steps, alternated
``--repeats`` times (GRPO, greedy, GRPO, ...):

* ``grpo``: outcome-only GRPO (process rewards off), the preset as it is;
* ``greedy_continuation``: the same, plus greedy-continuation values at every episode end, continuations
  as long as a response (``rollout.max_new_tokens``), credit by ``--advantage`` (``grpo_vineppo``:
  GRPO's outcome advantage plus each step's change of value).

Printed per side: seconds per step (mean over steps 2..K, median over repeats, with the spread), the
process stage's seconds per step (``time/process_s``) and generated tokens per response; then
``greedy_vs_grpo`` = greedy_continuation_step_s / grpo_step_s and the process stage's share of the
greedy step. The machine's load around each side is recorded (``benchmarks/_harness.py``) and
``"valid": false`` says when the figures cannot be trusted.

    python benchmarks/greedy_cost.py [--json] [--model DIR] [--steps 4] [--repeats 3] [key=value ...]

Without ``--model`` the preset's SFT runs first (400 steps on ``midchain``: minutes) and both sides
start from its model (``checkpoints/sft/model``); ``key=value``
overrides apply to both sides (e.g. ``sft.steps=20 rollout.prompts_per_step=4`` for a quick check).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from _harness import Monitor, emit
from process_cost import step_cost_of_sides


def sides(max_new_tokens: int, advantage: str) -> dict[str, list[str]]:
    """The two sides' overrides of the preset."""
    return {
        "grpo": ["process.enabled=false", "algorithm.advantage=grpo"],
        "greedy_continuation": [
            "process.enabled=true",
            "process.value_estimator=greedy_continuation",
            "process.mc_prefixes=0",  # every episode end
            f"process.mc_max_new_tokens={max_new_tokens}",
            f"algorithm.advantage={advantage}",
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--preset", default="midchain", help="the preset both sides train (default midchain)")
    ap.add_argument("--model", default="", help="start both sides from this saved model (skips SFT)")
    ap.add_argument("--steps", type=int, default=4, help="training steps per side and repeat (>= 2)")
    ap.add_argument("--repeats", type=int, default=3, help="alternations of the two sides")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--advantage", default="grpo_vineppo", help="the greedy side's advantage estimator")
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides of the preset")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be >= 2 (step 1 warms up and is not timed)")

    from stepcredit.cli.common import apply_overrides, load_preset, setup_runtime
    from stepcredit.config import from_dict
    from stepcredit.trainer import train

    setup_runtime()
    torch.set_num_threads(args.threads)
    cfg = from_dict(apply_overrides(load_preset(args.preset), args.overrides))
    mon = Monitor()
    with tempfile.TemporaryDirectory() as d:
        model = args.model
        if not model:  # the preset's SFT once (and one RL step), then both sides start from the SFT model
            sft = from_dict(
                apply_overrides(
                    load_preset(args.preset),
                    [*args.overrides, "trainer.steps=1", "trainer.val_every=0", "trainer.save_every=0",
                     "trainer.progress=false", "trainer.tensorboard=false", f"trainer.threads={args.threads}"],
                )
            )  # fmt: skip
            if sft.sft.steps < 1:
                ap.error("without --model the preset's SFT makes the model: sft.steps must be >= 1")
            with mon.side("sft"):
                train(sft, Path(d) / "sft")
            model = str(Path(d) / "sft" / "checkpoints" / "sft" / "model")
        the_sides = sides(cfg.rollout.max_new_tokens, args.advantage)
        res: dict[str, Any] = step_cost_of_sides(
            cfg, model, mon, the_sides, steps=args.steps, repeats=args.repeats, threads=args.threads
        )
    res["greedy_vs_grpo"] = res["greedy_continuation_step_s"] / res["grpo_step_s"]
    res["greedy_process_share_of_step"] = (
        res["greedy_continuation_process_s"] / res["greedy_continuation_step_s"]
    )
    res |= {"preset": args.preset, "steps": args.steps, "threads": args.threads, "advantage": args.advantage}
    print(f"{'what':<46}{'value':>12}")
    for k, v in res.items():
        print(f"{k:<46}{v:>12.4g}" if isinstance(v, float) else f"{k:<46}{v!s:>12}")
    print(
        f"greedy_vs_grpo = greedy_continuation_step_s / grpo_step_s = "
        f"{res['greedy_continuation_step_s']:.4g} / {res['grpo_step_s']:.4g} = {res['greedy_vs_grpo']:.3g}"
    )
    emit(mon.finish({"benchmark": "greedy_cost", **res, "repeats": args.repeats}, the_sides), args.json)


if __name__ == "__main__":
    main()
