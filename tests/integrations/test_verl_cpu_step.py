"""One real verl training step with stepcredit, on CPU (verl 0.9.1 through stepcredit's CPU platform).

``python -m verl.trainer.main_ppo`` runs in a subprocess with ``VERL_PLATFORM=cpu`` and
``VERL_USE_EXTERNAL_MODULES=stepcredit.integrations.verl.cpu.backend`` (:mod:`stepcredit.integrations.verl.cpu`:
gloo, verl's FSDP engines for the CPU, a Hugging Face ``generate`` rollout server with weight sync), a
tiny random Llama, 4 arithmetic prompts x 4 samples, and every stepcredit piece inside verl: the plugin
registered by ``import verl`` alone, the ``stepcredit_sync`` trainer with process rewards, the
``stepcredit`` reward manager running a custom reward function, the ``stepcredit_grpo_process``
estimator. The log-prob micro-batch (5) divides neither the 16 responses nor the probe count.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")

from stepcredit.config import ArithConfig, TinyModelConfig
from stepcredit.data.arith import make_rows
from stepcredit.data.prepare import write_parquet
from stepcredit.integrations.verl import cpu
from stepcredit.models import build_tiny

pytestmark = pytest.mark.verl  # runs in .venv-verl (make test)

ROOT = Path(__file__).resolve().parents[2]

# A reward with a gradient on a random model (a GSM8K verdict would be 0 for every response): the share
# of digits in the response. It raises for every response of the first prompt and for any response whose
# length is a multiple of 3: the reward manager types those as failures, which the stepcredit_sync
# trainer keeps out of the loss (so 0 < reward_valid_frac <= 0.75 whatever the random samples are).
REWARD_FN = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if (extra_info or {}).get("index") == 0 or len(solution_str) % 3 == 0:
        raise ValueError("cannot score this one")
    return sum(c.isdigit() for c in solution_str) / len(solution_str)
"""


def prepare(tmp: Path, *, rows: int = 4) -> dict[str, Path]:
    """Data (verl parquet), a saved tiny model with its tokenizer, and the custom reward file."""
    data = [*make_rows(ArithConfig(), rows, seed=0, split="train")]
    write_parquet(tmp / "train.parquet", data)
    write_parquet(tmp / "val.parquet", data)
    model, tok = build_tiny(
        TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), seed=0
    )
    model.save_pretrained(tmp / "model")
    tok.save_pretrained(tmp / "model")
    (tmp / "reward.py").write_text(REWARD_FN)
    return {"data": tmp, "model": tmp / "model", "reward": tmp / "reward.py"}


def overrides(paths: dict[str, Path], *, prompts: int = 4, n: int = 4) -> list[str]:
    d = paths["data"]
    return [
        *cpu.OVERRIDES,
        f"data.train_files={d / 'train.parquet'}",
        f"data.val_files={d / 'val.parquet'}",
        f"data.train_batch_size={prompts}",
        "data.max_prompt_length=192",
        "data.max_response_length=32",
        f"actor_rollout_ref.model.path={paths['model']}",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.temperature=1.0",
        "algorithm.adv_estimator=stepcredit_grpo_process",
        "algorithm.use_kl_in_reward=false",
        "reward.reward_manager.name=stepcredit",
        f"reward.custom_reward_function.path={paths['reward']}",
        "reward.custom_reward_function.name=compute_score",
        "+stepcredit.reward.workers=1",
        "+stepcredit.process.enabled=true",
        "+stepcredit.process.max_episode_tokens=8",
        "+stepcredit.process.min_episode_tokens=4",
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=stepcredit_sync",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.logger=[console,file]",
        "trainer.project_name=stepcredit_cpu",
        "trainer.experiment_name=step",
        f"trainer.default_local_dir={d / 'ckpt'}",
        "ray_kwargs.ray_init.num_cpus=8",
    ]


def run_verl(tmp: Path, extra: list[str] | None = None, *, timeout: float = 400) -> tuple[list[dict], str]:
    """Run verl's main_ppo on CPU; returns (the metrics it logged per step, its output)."""
    paths = prepare(tmp)
    metrics_path = tmp / "metrics.jsonl"
    env = {
        **os.environ,
        **cpu.env(),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "RAY_AUTH_MODE": "disabled",
        "RAY_ADDRESS": "local",  # a Ray of its own, never one another job started on this machine
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_DEDUP_LOGS": "0",
        "VERL_FILE_LOGGER_PATH": str(metrics_path),
        "WANDB_MODE": "disabled",
    }
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(paths), *(extra or [])]
    log = tmp / "verl.log"
    with log.open("w") as f:
        # its own session, so that a timeout can stop it with every Ray process it started
        proc = subprocess.Popen(
            cmd, cwd=tmp, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        with contextlib.suppress(ProcessLookupError):  # whatever of its Ray outlived it
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert rc == 0, out[-6000:]
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return rows, out


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(420)
def test_one_verl_step_with_stepcredit_on_cpu(tmp_path: Path) -> None:
    start = time.perf_counter()
    rows, _ = run_verl(tmp_path)
    m: dict[str, Any] = rows[-1].get("data", rows[-1])
    wall = time.perf_counter() - start
    keys = [
        "timing_s/step",
        "timing_s/gen",
        "timing_s/old_log_prob",
        "timing_s/stepcredit_probes",
        "timing_s/adv",
        "timing_s/update_actor",
        "stepcredit/value_probes",
        "stepcredit/probe_tokens_per_response_token",
        "stepcredit/probe_tokens_per_sequence_token",
        "stepcredit/packed_tokens_per_sequence_token",
        "stepcredit/reward_valid_frac",
        "actor/grad_norm",
    ]
    print(f"verl CPU run {wall:.1f} s: " + ", ".join(f"{k}={m.get(k)}" for k in keys))
    # the step trained: a gradient, the stepcredit_sync trainer valued prefixes with the actor
    assert m["training/global_step"] == 1
    assert m["actor/grad_norm"] > 0
    assert m["stepcredit/value_probes"] > 0 and m["stepcredit/episodes_per_response"] > 0
    assert m["timing_s/stepcredit_probes"] > 0 and m["stepcredit/probe_tokens_per_response_token"] > 1
    # the custom reward raised for some responses: typed failures, kept out of the loss
    assert 0 < m["stepcredit/reward_valid_frac"] <= 0.75
    # the rollout server took the actor's weights and sampled what the actor scores
    assert "timing_s/update_weights" in m
    assert m["training/rollout_probs_diff_max"] < 1e-2
