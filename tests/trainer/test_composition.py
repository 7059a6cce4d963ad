"""Every switch composes: pairwise combinations of the loop's switches through ``train()``.

Factors (levels): the mini-batch pipeline (off / 8 responses), one-step off-policy, process rewards
(off / forced-answer / Monte Carlo values), dynamic sampling, the critic with GAE, two domains
(arith + code in the sandbox), KL in the reward, PPO epochs (1 / 2), every registered loss, the
overlong length penalty, LoRA adapters (merged for generation or not), torch's thread count (from
the config or the environment), and the rollout mode (flat, tree, tree branching at entropy, multi-turn
tool calls: turns are the process channel's steps). The compiled decode step, which takes a compilation
per batch shape, composes in a few runs of its own through ``stepcredit train``
(tests/trainer/test_composition_decode.py).
A greedy pairwise covering array (every pair of levels of every two factors appears in some run) is
built once, deterministically; each run is 2 RL steps of a tiny model.

Checked per run: it finishes; every generated response is trained or dropped with a reason
(``samples/generated == samples/trained + samples/dropped``); staleness is 1 exactly when off-policy
is on (step 2); the decoupled loss is applied (a proximal pass, importance weights != 1) when the
policy moved since generation.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stepcredit.config import from_dict
from stepcredit.losses import LOSSES
from stepcredit.trainer import train

# A convention under which a random model calls the calculator in about half its turns (registered by
# tests/trainer/conftest.py): a tiny model that trained 2 SFT steps never writes a fenced call.
TEST_PARSER = "composition_every_other_turn"
TREE_MODES = ("tree", "tree_entropy", "tools_tree")
TOOL_MODES = ("tools", "tools_tree")

FACTORS: dict[str, list[Any]] = {
    "loss": LOSSES.names(),
    # vineppo: Monte Carlo values with the VinePPO step advantage; mc_sample_v0: Monte Carlo with V_0
    # sampled (process.mc_v0=sample) instead of taken from the group; grpo_vineppo: Monte Carlo values
    # with GRPO's outcome advantage plus the VinePPO step advantage
    # tree: a tree rollout's node values (process.value_estimator=tree) with grpo_vineppo
    "process": [
        "off",
        "forced_answer_logprob",
        "monte_carlo",
        "vineppo",
        "mc_sample_v0",
        "grpo_vineppo",
        "tree",
        "step_oracle",  # exact arith step values (the oracle) with grpo_vineppo and a step cost
        "greedy_bisect",  # greedy verdicts where they change, found by bisection, with grpo_vineppo
        "group_prefix",  # a flat group's values where its responses share a prefix, with grpo_vineppo
    ],
    # tree_entropy: a tree that branches at high-entropy tokens (rollout.tree.branch_at=entropy)
    # tools: multi-turn rollouts that call the calculator (rollout.mode=tools, task arith_tools);
    # tools_tree: a tree of them that branches at turn boundaries (rollout.mode=tools_tree)
    "rollout_mode": ["flat", "tree", "tree_entropy", "tools", "tools_tree"],
    "mini_batch": [0, 8],
    "off_policy": [False, True],
    "dynamic_sampling": [False, True],
    "critic": [False, True],
    "multi_domain": [False, True],
    "kl_in_reward": [False, True],
    "ppo_epochs": [1, 2],
    # DAPO's soft overlong penalty on the outcome score (postprocess.outcome.length_penalty)
    "length_penalty": [False, True],
    # LoRA adapters (model.lora.rank=8): the reference is the policy with them off; merged into the base
    # weights while generating (model.lora.merge_for_generation, the default) or beside them
    "lora": [False, "merged", "unmerged"],
    # torch's threads: trainer.threads=1 or 2, or 2 overridden by STEPCREDIT_THREADS=1 (env)
    "threads": [1, 2, "env"],
    # how step credit is formed and the step cost charged: plain (the process level's own); blame
    # (process.credit=blame, with a step cost on the outcome: process.step_cost_as=outcome); treerl
    # (TreeRL's tree credit, process.treerl, with a step cost as a return: process.step_cost_as=return)
    "credit": ["plain", "blame", "treerl"],
    # the RL learning rate constant or decaying along a cosine (optim.schedule)
    "lr_schedule": ["constant", "cosine"],
    # an experiment's placebo arm: each response's step credits permuted among its episodes
    # (process.placebo=shuffle_within_response)
    "placebo": [False, True],
    # step credit only in the groups whose outcomes are all equal, or only in the others
    # (process.credit_groups)
    "credit_groups": ["all", "all_equal", "mixed"],
}


def allowed(run: dict[str, Any]) -> bool:
    """Combinations that cannot work are refused at start-up (tested below), not run here."""
    if run.get("process") == "tree" and run.get("rollout_mode", "tree") not in TREE_MODES:
        return False  # tree values need a tree rollout (refused at start-up, tested below)
    if run.get("credit", "plain") != "plain" and run.get("process") == "off":
        return False  # credit forms need process rewards
    if run.get("credit_groups", "all") != "all" and run.get("process") == "off":
        return False  # it chooses where step credit goes (refused at start-up without it: tests/process)
    if run.get("credit_groups") == "all_equal" and run.get("dynamic_sampling"):
        return False  # dynamic sampling drops every all-equal group (refused at start-up: tests/process)
    if run.get("placebo") and run.get("process") == "off":
        return False  # the placebo moves step credits (refused at start-up without them: tests/process)
    # TreeRL's credit needs tree values (refused at start-up otherwise: tests/process), and the cost as a
    # return an estimator that reads a step's credit as its advantage (not gae's critic)
    tree_only = (
        run.get("process", "tree") != "tree"
        or run.get("rollout_mode", "tree") not in TREE_MODES
        or run.get("critic")
    )
    if run.get("credit") == "treerl" and tree_only:
        return False
    if run.get("credit") == "blame" and run.get("process") == "forced_answer_logprob":
        return False  # blame needs values that are chances of success (refused at start-up: tests/process)
    if run.get("off_policy") and "loss" in run:
        return bool(LOSSES.get(run["loss"]).corrects_staleness)
    return True


def pairwise(factors: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """A small set of runs covering every allowed pair of levels (greedy, deterministic)."""
    names = list(factors)
    todo = {
        ((a, x), (b, y))
        for a, b in itertools.combinations(names, 2)
        for x in factors[a]
        for y in factors[b]
        if allowed({a: x, b: y})
    }
    runs: list[dict[str, Any]] = []
    while todo:
        (a, x), (b, y) = min(todo, key=repr)
        run: dict[str, Any] = {a: x, b: y}
        for name in names:
            if name in run:
                continue
            best = max(
                (v for v in factors[name] if allowed({**run, name: v})),
                key=lambda v, name=name: sum(
                    (((name, v), (o, run[o])) in todo or ((o, run[o]), (name, v)) in todo) for o in run
                ),
            )
            run[name] = best
        covered = {((p, run[p]), (q, run[q])) for p, q in itertools.combinations(names, 2)}
        todo -= covered
        runs.append(run)
    return runs


RUNS = pairwise(FACTORS)


def config(run: dict[str, Any], **over: Any) -> Any:
    """A 2-step tiny run with the switches of ``run``."""
    d: dict[str, Any] = {
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
        "data": {"train_size": 64, "val_size": 4},
        "sft": {"steps": 2, "batch_size": 8},
        "rollout": {
            "prompts_per_step": 4,
            "n": 4,
            "max_new_tokens": 16,
            "mode": "tree" if run["rollout_mode"] in ("tree", "tree_entropy") else run["rollout_mode"],
            "tree": {"branch_at": "entropy" if run["rollout_mode"] == "tree_entropy" else "episode"},
        },
        "optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": run.get("lr_schedule", "constant")},
        "loss": {"name": run["loss"], "kl_coef": 0.05, "kl_in_reward": run["kl_in_reward"]},
        "pipeline": {
            "mini_batch": run["mini_batch"],
            "ppo_epochs": run["ppo_epochs"],
            "one_step_off_policy": run["off_policy"],
        },
        "postprocess": {
            "dynamic_sampling": {"enabled": run["dynamic_sampling"], "max_extra_batches": 1},
            # the ramp starts at 16 - 12 = 4 tokens, so most responses are shaped
            "outcome": {"length_penalty": {"form": "overlong", "buffer_len": 12}}
            if run.get("length_penalty")
            else {},
        },
        "algorithm": {"advantage": "grpo"},
        # the agent's backends have their own tests; threads keep 14 runs from spawning 14 worker pools
        "reward": {"agent": {"backend": "thread"}},
        "trainer": {"steps": 2, "val_every": 0, "save_every": 0, "progress": False, "tensorboard": False},
    }
    if run["rollout_mode"] in TOOL_MODES:
        # results count in the length budget: room for two calls and their results
        d["rollout"].update(max_new_tokens=28, tools={"parser": TEST_PARSER, "max_turns": 2})
        d["data"]["task"] = "arith_tools"
    if run["process"] != "off":
        vine = run["process"] in ("vineppo", "grpo_vineppo")
        mc = vine or run["process"] == "mc_sample_v0"
        d["process"] = {
            "enabled": True,
            "value_estimator": "monte_carlo" if mc else run["process"],
            "min_episode_tokens": 1,
            "mc_samples": 2,
            "mc_max_new_tokens": 8,
            "mc_v0": "sample" if run["process"] == "mc_sample_v0" else "group",
            # the oracle's level also charges every step a cost (process.step_cost)
            "step_cost": 0.05 if run["process"] == "step_oracle" or run["credit"] != "plain" else 0.0,
        }
        if run.get("placebo"):
            d["process"]["placebo"] = "shuffle_within_response"
        d["process"]["credit_groups"] = run.get("credit_groups", "all")
        if run["credit"] == "blame":
            d["process"].update(credit="blame", step_cost_as="outcome")
        if run["credit"] == "treerl":
            d["process"].update(treerl=True, step_cost_as="return")
        d["algorithm"]["advantage"] = (
            run["process"]
            if vine
            else "grpo_vineppo"
            if run["process"] in ("tree", "step_oracle", "greedy_bisect", "group_prefix")
            else "grpo_process"
        )
    if run["critic"]:
        d["algorithm"] = {"advantage": "gae", "use_critic": True}
    if run.get("lora"):
        d["model"]["lora"] = {"rank": 8, "merge_for_generation": run["lora"] == "merged"}
    d["trainer"]["threads"] = 1 if run.get("threads", 1) == 1 else 2
    if run["multi_domain"]:
        d["data"]["domains"] = {
            "arith": {"task": "arith", "tag": "arith"},
            "code": {"task": "code", "tag": "code"},
        }
        d["data"]["domain_interleave_probs"] = {"arith": 0.5, "code": 0.5}
        d["reward"]["domains"] = {"arith": {"fn": "arith"}, "code": {"fn": "code"}}
        if run.get("length_penalty"):  # per-domain normalisation beside it: code's own entry, unshaped
            d["postprocess"]["domains"] = {"code": {"mean": "group", "std": "group"}}
    for key, value in over.items():
        section, field = key.split("__")
        d.setdefault(section, {})[field] = value
    return from_dict(d)


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_pairwise_runs_cover_every_allowed_pair() -> None:
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        for x, y in itertools.product(FACTORS[a], FACTORS[b]):
            if allowed({a: x, b: y}):
                assert any(r[a] == x and r[b] == y for r in RUNS), (a, x, b, y)
    assert all(allowed(r) for r in RUNS)


@pytest.mark.parametrize("run", RUNS, ids=lambda r: "-".join(f"{k}={v}" for k, v in r.items()))
def test_switches_compose(run: dict[str, Any], tmp_path: Path, threads: Callable[[Any], int]) -> None:
    import torch

    want_threads = threads(run["threads"])
    last = train(config(run), tmp_path)
    assert last["step"] == 2
    assert torch.get_num_threads() == want_threads  # trainer.threads, or STEPCREDIT_THREADS over it
    steps = [r for r in rows(tmp_path) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # no sample lost: every generated response was trained on or dropped (with its reason)
        assert r["samples/generated"] == r["samples/trained"] + r["samples/dropped"], r
        assert r["samples/generated"] >= 16
        if not run["dynamic_sampling"]:
            assert r["samples/dropped"] == r["samples/dropped_failed"]
    # compute accounting: the running total of generated tokens is the sum of the steps' own, and a
    # step that generated (its rollout counters are logged) counts its responses' tokens at least
    total = 0.0
    for r in steps:
        if "rollout/generated_tokens_per_response" in r:
            assert r["generated/step_tokens"] > r.get("process/generated_tokens", 0.0)
        total += r["generated/step_tokens"]
        assert r["generated_tokens"] == pytest.approx(total)
    # staleness is 1 exactly when off-policy is on (step 2 trains on a batch made before step 1's update)
    assert steps[0]["staleness"] == 0.0
    assert steps[1]["staleness"] == (1.0 if run["off_policy"] else 0.0)
    trained = [r for r in steps if r["samples/trained"] > 0]
    # the policy moved since a trained batch was generated when an optimiser step came before its update:
    # an earlier mini-batch or epoch of the same step, or (one-step off-policy) the previous step's
    # update; dynamic sampling may buffer every kept group into one mini-batch, or keep none in a step.
    # A gradient of ~1e-9 (every advantage ~0) moves the weights by Adam's eps-limited step only, too
    # little to move pi_prox / pi_behav past 1e-6: such a step does not count as moving the policy.
    moved = False
    for i, r in enumerate(steps):
        if r["samples/trained"] == 0:
            continue
        before = i > 0 and steps[i - 1]["samples/trained"] > 0 and steps[i - 1].get("grad_norm", 0.0) > 1e-6
        # (with dynamic sampling, the kept groups of an off-policy step may all come from a batch it
        # sampled again after the previous update: fresh, so no proximal pass is due)
        stale = run["off_policy"] and before and not run["dynamic_sampling"]
        moved |= run["ppo_epochs"] > 1 or r["samples/mini_batches"] > 1 or stale
    if run["loss"] == "decoupled_ppo" and moved and not run["critic"]:
        # the proximal pass ran and the behaviour weights pi_prox / pi_behav moved away from 1
        assert any(r["proximal"] > 0 for r in trained)
        assert any(abs(r["behav_weight"] - 1.0) > 1e-6 for r in trained)
    if run.get("length_penalty"):  # shaped and logged (a step whose every group was dropped trains none)
        shaped = [r for r in trained if "reward/overlong_frac" in r]
        assert shaped or not trained
        assert all(-1.0 <= r["reward/overlong_penalty_mean"] <= 0.0 for r in shaped)
    else:
        assert all("reward/overlong_frac" not in r for r in steps)
    if run["rollout_mode"] in TOOL_MODES:  # tools were called (about every other turn) and turns counted
        # rollout counters belong to the step that generated (one-step off-policy's last step generates none)
        tooled = [r for r in steps if "tools/calls_per_response" in r]
        assert any(r["tools/calls_per_response"] > 0 for r in tooled)
        for r in tooled:
            assert r["tools/turns_per_response"] == pytest.approx(1 + r["tools/calls_per_response"])
    if run["process"] != "off":  # values were computed for step 1's batch (and step 2's unless off-policy)
        assert math.isfinite(steps[0]["time/process_s"]) and steps[0]["process/unscored_rows"] == 0
    if (
        run["process"] == "group_prefix"
    ):  # a trained step logs how much of its credit rests on shared prefixes
        shares = [r["process/shared_prefix_frac"] for r in steps if "process/shared_prefix_frac" in r]
        assert all(0.0 <= s <= 1.0 for s in shares)
        # logged whenever a trained step had responses of more than one episode
        assert shares or not any(
            r["samples/trained"] > 0 and r.get("process/episodes_per_response", 0) > 1 for r in steps
        )
    # the export: the model directory, or with LoRA the adapters and the base they apply to
    final = tmp_path / "checkpoints" / "final"
    exported = (
        ["adapter/adapter_config.json", "base/config.json"] if run.get("lora") else ["model/config.json"]
    )
    assert all((final / f).is_file() for f in exported), sorted(p.name for p in final.iterdir())


def test_decoupled_loss_differs_from_ppo_once_the_policy_moved() -> None:
    import torch

    from stepcredit.losses import decoupled_ppo, ppo_clip

    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=g)
    prox = old + 0.3 * torch.randn(3, 5, generator=g)  # the policy moved since the data was generated
    logp = prox + 0.05 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool)
    kw = {"logp_BT": logp, "old_logp_BT": old, "adv_BT": adv, "mask_BT": mask}
    plain, _ = ppo_clip(**kw)
    same, _ = decoupled_ppo(**kw)  # no proximal policy: plain PPO against the behaviour policy
    dec, m = decoupled_ppo(**kw, prox_logp_BT=prox)
    assert torch.allclose(plain, same)
    assert not torch.allclose(plain, dec)
    assert abs(float(m["behav_weight"]) - 1.0) > 1e-3


def test_a_combination_that_cannot_work_fails_at_start_up(tmp_path: Path) -> None:
    from stepcredit.errors import ConfigError

    bad = config({**RUNS[0], "off_policy": True, "loss": "ppo_clip"})
    with pytest.raises(ConfigError, match=r"loss\.name: pipeline\.one_step_off_policy"):
        train(bad, tmp_path)
    # VinePPO's step advantages need values that end at the reward: not the forced-answer log-prob
    vine = {**RUNS[0], "process": "forced_answer_logprob", "critic": False}
    with pytest.raises(ConfigError, match=r"process\.value_estimator: algorithm\.advantage=vineppo"):
        train(config(vine, algorithm__advantage="vineppo"), tmp_path)
    vine["process"] = "vineppo"
    with pytest.raises(ConfigError, match=r"process\.last_episode"):
        train(config(vine, process__last_episode="zero"), tmp_path)


def test_resume_after_an_interrupted_off_policy_run_continues_exactly(tmp_path: Path) -> None:
    """Stop after step 2 (its checkpoint holds the batch generated ahead for step 3), resume, and
    compare step 3 with an uninterrupted run."""
    run = {
        **RUNS[0],
        "off_policy": True,
        "loss": "decoupled_ppo",
        "dynamic_sampling": False,
        "process": "off",
        "length_penalty": True,
    }
    over = {"trainer__steps": 3, "trainer__save_every": 1}
    train(config(run, **over), tmp_path / "full")
    train(config(run, **over, trainer__stop_after_steps=2), tmp_path / "part")
    assert [r["step"] for r in rows(tmp_path / "part")] == [0, 1, 2]
    train(config(run, **over), tmp_path / "part", resume=tmp_path / "part")
    a = {r["step"]: r for r in rows(tmp_path / "full")}
    b = {r["step"]: r for r in rows(tmp_path / "part")}
    assert sorted(b) == [0, 1, 2, 3] and b[3]["staleness"] == 1.0
    for key in (
        "reward/mean",
        "response_length/mean",
        "loss",
        "kl",
        "grad_norm",
        "adv/abs_mean",
        "behav_weight",
        "reward/overlong_penalty_mean",
    ):
        x, y = a[3][key], b[3][key]
        # equal up to fp32 rounding of log-probs (~1e-7 absolute): the checkpoint keeps the batch
        # generated ahead without its KV cache, so the two runs' passes over it need not round alike,
        # and a small difference of log-probs (the KL, ~6e-4) shows that in absolute terms (a
        # full-suite run measured 1.1e-9; run alone the two agreed within 1e-9)
        assert (x is None and y is None) or math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7), (key, x, y)


def test_resume_after_an_interrupted_tool_run_continues_exactly(tmp_path: Path) -> None:
    """Checkpoint/resume of multi-turn tool rollouts with one-step off-policy: the checkpoint holds the
    tool batch generated ahead for step 3 (its result tokens marked), and step 3 is the same."""
    run = {
        **RUNS[0],
        "rollout_mode": "tools",
        "off_policy": True,
        "loss": "decoupled_ppo",
        "dynamic_sampling": False,
        "critic": False,
        "process": "step_oracle",
        "credit": "plain",
        "lora": False,
        "multi_domain": False,
    }
    over = {"trainer__steps": 3, "trainer__save_every": 1}
    train(config(run, **over), tmp_path / "full")
    train(config(run, **over, trainer__stop_after_steps=2), tmp_path / "part")
    train(config(run, **over), tmp_path / "part", resume=tmp_path / "part")
    a = {r["step"]: r for r in rows(tmp_path / "full")}
    b = {r["step"]: r for r in rows(tmp_path / "part")}
    assert sorted(b) == [0, 1, 2, 3] and b[3]["staleness"] == 1.0
    # step 2's row counts the tool calls of the batch generated ahead for step 3 (off-policy)
    assert a[2]["tools/calls_per_response"] > 0
    for key in ("reward/mean", "response_length/mean"):
        assert a[3][key] == b[3][key], key  # the same turns, results included
    # the results stay out of the loss after the resume (a batch that lost its observation mask
    # would train on them: another loss and gradient)
    for key in ("loss", "grad_norm", "adv/abs_mean", "kl"):
        assert math.isclose(a[3][key], b[3][key], rel_tol=1e-4, abs_tol=1e-7), (key, a[3][key], b[3][key])


def test_tree_values_need_a_tree_rollout(tmp_path: Path) -> None:
    from stepcredit.errors import ConfigError

    run = {**RUNS[0], "process": "tree", "rollout_mode": "flat", "critic": False}
    with pytest.raises(
        ConfigError, match=r"rollout\.mode: process\.value_estimator=tree .* rollout\.mode=.*\btree\b"
    ):
        train(config(run), tmp_path)
    # a tool rollout is not a tree either: the same one line
    with pytest.raises(
        ConfigError, match=r"rollout\.mode: process\.value_estimator=tree .* rollout\.mode=.*\btree\b"
    ) as refused:
        train(config({**run, "rollout_mode": "tools"}), tmp_path)
    assert "\n" not in str(refused.value)
    # TreeRL's tree credit on tool rollouts: refused at start-up, in one line
    with pytest.raises(ConfigError) as refused:
        train(config({**run, "rollout_mode": "tools", "process": "tree", "credit": "treerl"}), tmp_path)
    assert "\n" not in str(refused.value)
    with pytest.raises(
        ConfigError, match=r"rollout\.tree\.branching: the product .* \(6\) must equal rollout\.n \(4\)"
    ):
        config({**run, "rollout_mode": "tree"}, rollout__tree={"branching": [3, 2]})


def test_resume_mid_run_of_a_tree_rollout_with_tree_values_continues_exactly(tmp_path: Path) -> None:
    """Tree rollouts branch at points drawn from the saved random state: a resumed run's step 3 equals
    an uninterrupted run's (one-step off-policy: the saved batch ahead is a tree with its nodes)."""
    run = {
        **RUNS[0],
        "off_policy": True,
        "loss": "decoupled_ppo",
        "dynamic_sampling": False,
        "critic": False,
        "process": "tree",
        "rollout_mode": "tree",
    }
    over = {"trainer__steps": 3, "trainer__save_every": 1}
    train(config(run, **over), tmp_path / "full")
    train(config(run, **over, trainer__stop_after_steps=2), tmp_path / "part")
    train(config(run, **over), tmp_path / "part", resume=tmp_path / "part")
    a = {r["step"]: r for r in rows(tmp_path / "full")}
    b = {r["step"]: r for r in rows(tmp_path / "part")}
    assert sorted(b) == [0, 1, 2, 3]
    for key in ("reward/mean", "response_length/mean", "rollout/generated_tokens_per_response"):
        assert a[2][key] == b[2][key] and a[3].get(key) == b[3].get(key), key  # the same tokens sampled
    # the agent hands over scored rows in completion order, so sums may run in another order: equal to
    # float rounding
    for key in ("loss", "grad_norm", "adv/abs_mean", "process/u_abs_mean", "kl"):
        assert math.isclose(a[3][key], b[3][key], rel_tol=1e-4, abs_tol=1e-7), (key, a[3][key], b[3][key])
    assert a[1]["tree/depth"] == 3.0  # n=4 -> branching (1, 2, 2)
