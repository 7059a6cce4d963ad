"""Tokens a greedy-continuation training step generates, next to outcome GRPO's (issue 44, item 3).

Both arms train ``--steps`` steps from one SFT model with ``data.train_size=320`` and the same seed:
``grpo`` (preset ``midchain``) and ``greedy`` (preset ``midchain_greedy``: a greedy continuation per
episode end, ``grpo_vineppo``), and with ``--arms grpo,greedy,bisect`` also ``bisect`` (the same with
``process.value_estimator=greedy_bisect``). Per step it prints the rollout's tokens, the continuations' tokens
(``process/generated_tokens``), the verifier's texts and the step's generated tokens; then the ratio of
the greedy arm's generated tokens per step to GRPO's, the figure an equal-compute GRPO arm is sized by.
Tokens do not depend on the machine, so the figures hold under load (no seconds are printed; the
harness's load record and its "valid" verdict concern timings only).
The training part reads only ``train()`` and ``metrics.jsonl``: run it with ``PYTHONPATH`` at an older
checkout for the "before" figures.

``--check``: on one rollout of the SFT model (the greedy arm's first step's batch size, behaviour
log-probs and KV cache kept as in training), today's greedy values against the plain loop (every
prefix continued on its own, prefilled, to eos or the cap, with no answer-marker stop, no shares and no
answered-prefix rule): how many values differ and both token counts.

    python benchmarks/greedy_tokens.py [--json] [--model DIR] [--steps 2] [--check] [key=value ...]

Without ``--model`` the ``midchain`` SFT runs first (400 steps: minutes).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from _harness import Monitor, emit

ARMS = {"grpo": "midchain", "greedy": "midchain_greedy", "bisect": "midchain_greedy"}
ARM_OVERRIDES = {"bisect": ["process.value_estimator=greedy_bisect"]}
"""``bisect``: the greedy arm with ``greedy_bisect`` values (continuations only where the verdicts change)."""
COMMON = ["data.train_size=320", "sft.steps=0", "trainer.val_every=0", "trainer.save_every=0",
          "trainer.progress=false", "trainer.tensorboard=false"]  # fmt: skip


def arm_tokens(
    preset: str, model: str, steps: int, threads: int, overrides: list[str]
) -> list[dict[str, float]]:
    """Per step of a run of ``preset`` from ``model``: rollout, continuation and step tokens, verifier texts."""
    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict
    from stepcredit.trainer import train

    extra = [
        f"model.path={model}",
        f"trainer.steps={steps}",
        f"trainer.threads={threads}",
        *COMMON,
        *overrides,
    ]
    cfg = from_dict(apply_overrides(load_preset(preset), extra))
    with tempfile.TemporaryDirectory() as d:
        train(cfg, Path(d))
        rows = [json.loads(x) for x in (Path(d) / "metrics.jsonl").read_text().splitlines()]
    keys = ("process/generated_tokens", "process/verifier_calls", "generated/step_tokens")
    out = []
    for r in rows:
        if r.get("step", 0) > 0 and "generated/step_tokens" in r:
            got = {k: float(r.get(k, 0.0)) for k in keys}
            # the step's tokens are the rollout's and the continuations' (trainer.loop)
            out.append(
                {"rollout_tokens": got["generated/step_tokens"] - got["process/generated_tokens"], **got}
            )
    return out


def sft_model(d: str, threads: int, overrides: list[str]) -> str:
    """The ``midchain`` SFT model (as the experiment's arms start from), saved under ``d``."""
    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict
    from stepcredit.trainer import train

    extra = ["trainer.steps=1", "trainer.val_every=0", "trainer.save_every=0", "trainer.progress=false",
             "trainer.tensorboard=false", f"trainer.threads={threads}", *overrides]  # fmt: skip
    train(from_dict(apply_overrides(load_preset("midchain"), extra)), Path(d) / "sft")
    return str(Path(d) / "sft" / "checkpoints" / "sft" / "model")


def check_values(model_dir: str, overrides: list[str]) -> dict[str, Any]:
    """Today's greedy values on one rollout batch against the plain loop's (see the module docstring)."""
    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict
    from stepcredit.data import PromptStream, load_task
    from stepcredit.process import batch_logps, batch_token_ids, build_requests
    from stepcredit.reward.run.rewarder import build_rewarder
    from stepcredit.rollout import generate
    from stepcredit.trainer.setup import load_model

    cfg = from_dict(
        apply_overrides(load_preset("midchain_greedy"), [f"model.path={model_dir}", *COMMON, *overrides])
    )
    model, tok = load_model(cfg)
    train_set, _ = load_task(cfg.data)
    samples = PromptStream(train_set, seed=cfg.trainer.seed).take(cfg.rollout.prompts_per_step)
    torch.manual_seed(cfg.trainer.seed)
    batch = generate(model, tok, samples, n=cfg.rollout.n, max_new_tokens=cfg.rollout.max_new_tokens,
                     temperature=cfg.rollout.temperature, keep_cache=True)  # fmt: skip
    prompts, responses = batch_token_ids(batch)
    _, reqs = build_requests(batch.samples, prompts, responses, tok, cfg.process, logps=batch_logps(batch))
    with build_rewarder(cfg.reward) as rewarder:
        return _compare(model, tok, reqs, batch.kv_cache, cfg.process, rewarder.verifier_fn())


def _compare(model: Any, tok: Any, reqs: list[Any], body: Any, p: Any, verifier: Any) -> dict[str, Any]:
    """Today's values of ``reqs`` against the plain loop's, and what each generated."""
    from stepcredit.process.continuation import continuation_values
    from stepcredit.process.values import ValueContext, evaluating, spending
    from stepcredit.rollout.engines import SamplingSpec, engine_for

    with evaluating(model), spending() as spent:
        ctx = ValueContext(model, tok, reqs, p, verifier, body=body)
        got = continuation_values(ctx, samples=1, greedy=True, temperature=1.0)
    # the plain loop: every prefix but a complete response's last, continued on its own to eos or the cap
    slots = [(ri, pi) for ri, r in enumerate(reqs) for pi in range(len(r.prefix_lens))
             if not (r.complete and r.prefix_lens[pi] >= len(r.response_ids) - 1)]  # fmt: skip
    contexts = [reqs[ri].prompt_ids + reqs[ri].response_ids[: reqs[ri].prefix_lens[pi]] for ri, pi in slots]
    unique = list(dict.fromkeys(map(tuple, contexts)))  # identical contexts continued once, as before
    spec = SamplingSpec(n=1, temperature=0.0, max_tokens=p.mc_max_new_tokens)
    with evaluating(model):
        made = dict(
            zip(unique, (c.ids for c in engine_for(model).sample(model, tok, unique, spec)), strict=True)
        )
    conts = [made[tuple(c)] for c in contexts]
    texts = [tok.decode(reqs[ri].response_ids[: reqs[ri].prefix_lens[pi]] + c, skip_special_tokens=True)
             for (ri, pi), c in zip(slots, conts, strict=True)]  # fmt: skip
    scores = verifier([reqs[ri].sample for ri, _ in slots], texts)
    differ = sum(got[ri][pi] != s for (ri, pi), s in zip(slots, scores, strict=True))
    return {"values": len(slots), "values_that_differ": differ, "plain_loop_tokens": sum(map(len, made.values())),
            "today_tokens": spent.generated_tokens, "today_verifier_texts": spent.verifier_calls,
            "plain_loop_verifier_texts": len(texts)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", default="", help="the SFT model both arms start from (default: run the SFT)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check", action="store_true", help="compare today's values with the plain loop's")
    ap.add_argument("--arms", default="grpo,greedy")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {"benchmark": "greedy_tokens", "steps": args.steps}
    mon = Monitor()
    with tempfile.TemporaryDirectory() as d:
        model = args.model or sft_model(d, args.threads, args.overrides)
        for arm in args.arms.split(","):
            with mon.side(arm):
                more = [*ARM_OVERRIDES.get(arm, []), *args.overrides]
                out[arm] = arm_tokens(ARMS[arm], model, args.steps, args.threads, more)
            for i, r in enumerate(out[arm], 1):
                print(f"{arm:<8} step {i}: " + "  ".join(f"{k}={v:.0f}" for k, v in r.items()))
        for costly in ("greedy", "bisect"):
            if {"grpo", costly} <= out.keys():
                mean = {
                    a: sum(r["generated/step_tokens"] for r in out[a]) / len(out[a]) for a in ("grpo", costly)
                }
                out[f"{costly}_vs_grpo_tokens_per_step"] = mean[costly] / mean["grpo"]
                print(f"{costly} / grpo generated tokens per step: {mean[costly]:.0f} / {mean['grpo']:.0f} = "
                      f"{out[f'{costly}_vs_grpo_tokens_per_step']:.3f}")  # fmt: skip
        if args.check:
            out["check"] = check_values(model, args.overrides)
            print("check: " + "  ".join(f"{k}={v}" for k, v in out["check"].items()))
    commands = {a: [f"--preset {ARMS[a]}", *ARM_OVERRIDES.get(a, []), *COMMON, *args.overrides] for a in ARMS}
    emit(mon.finish(out, commands), args.json)


if __name__ == "__main__":
    main()
