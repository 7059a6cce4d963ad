"""The GPU group (``pytest -m gpu``, ``benchmarks/gpu_check.sh``): short trainings on ``trainer.device``.

One short run of each rollout mode (flat, tree, tools) and value estimator (forced answer, Monte Carlo,
greedy continuation and bisection, group-prefix values, tree values; credit confined to mixed groups),
float32 and bfloat16, LoRA on and off, the critic; a checkpoint and an exact resume; ``eval`` and
``probe``. Each asserts what it can: finite losses, that the policy moved, the device and dtype of every
tensor a mini-batch update touches (the batch, advantages, reference log-probs, the policy's and
critic's parameters, the logits of the update's forward pass), and equal figures after a resume.

Every test runs twice: on ``cpu`` (in CI: the checks themselves are exercised) and on ``cuda`` (marked
``gpu``; skipped where torch sees no CUDA device, so CI collects and skips it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import stepcredit.trainer.loop as loop
from stepcredit.cli.common import apply_overrides, load_preset
from stepcredit.cli.main import main
from stepcredit.config import Config, from_dict
from stepcredit.trainer import train

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, CUDA])]

SMALL = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64",
    "data.train_size=64",
    "data.val_size=4",
    "rollout.prompts_per_step=2",
    "rollout.n=4",
    "sft.steps=2",
    "sft.batch_size=8",
    "trainer.steps=2",
    "trainer.val_every=2",
    "trainer.save_every=0",
    "trainer.threads=1",
    "trainer.progress=false",
    "trainer.tensorboard=false",
    "optim.warmup_steps=0",
    "optim.lr=0.001",  # a step large enough to move every trained weight, also in bf16 autocast
]
"""Overrides that make any preset a run of seconds (a 1-layer model, 2 SFT and 2 RL steps)."""

SIGNAL = [f"reward.custom.path={__file__}:length_score", "reward.custom.isolate=false"]
"""A reward with signal even for a model after 2 SFT steps (responses differ in length), so every
group has advantages and the policy must move."""


def length_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return len(solution_str) / 16


CASES: dict[str, tuple[str, list[str]]] = {
    "flat": ("default", []),
    "flat_bf16": ("default", ["model.dtype=bfloat16"]),
    "flat_lora": ("default", ["model.lora.rank=4"]),
    "flat_lora_bf16": ("default", ["model.lora.rank=4", "model.dtype=bfloat16"]),
    "critic": ("default", ["algorithm.advantage=gae", "algorithm.use_critic=true"]),
    "forced_answer": ("process", ["process.value_estimator=forced_answer_logprob"]),
    "monte_carlo": ("midchain_process", ["process.mc_samples=2", "process.mc_prefixes=2"]),
    "greedy_continuation": ("midchain_process", ["process.value_estimator=greedy_continuation"]),
    "greedy_bisect": ("midchain_process", ["process.value_estimator=greedy_bisect"]),
    "group_prefix": ("midchain_process", ["process.value_estimator=group_prefix"]),
    "credit_groups_mixed": (
        "midchain_process",
        ["process.value_estimator=greedy_continuation", "process.credit_groups=mixed"],
    ),
    "tree_values": ("midchain_tree", ["rollout.tree.branching=[2, 2]"]),
    "tools": ("tools", ["data.arith.max_steps=1"]),
}
"""Name -> (preset, overrides): each rollout mode and value estimator, both dtypes, LoRA, the critic."""

LONG = ["rollout.max_new_tokens=24", "process.mc_max_new_tokens=24"]
"""Shorter generations for the presets that ask for 96-112 tokens."""


def config(device: str, preset: str, extra: list[str]) -> Config:
    over = [*SMALL, *SIGNAL, f"trainer.device={device}"]
    if preset != "default":
        over += LONG
    return from_dict(apply_overrides(load_preset(preset), [*over, *extra]))


class Touched:
    """What the mini-batch updates of a run touched: every tensor of each prepared mini-batch, the
    parameters of the policy and the critic, and the dtype of the logits of each policy forward pass."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.params: dict[str, torch.Tensor] = {}
        self.logits_dtypes: set[torch.dtype] = set()
        self.first: dict[str, torch.Tensor] | None = None
        self.last: dict[str, torch.Tensor] = {}
        self.calls = 0

    def wrap(self, train_on: Callable[..., Any]) -> Callable[..., Any]:
        def spy(state: Any, mb: Any, **kw: Any) -> Any:
            policy = {n: p for n, p in state.model.named_parameters() if p.requires_grad}
            if self.first is None:  # the policy as RL found it
                self.first = {n: p.detach().clone() for n, p in policy.items()}
            hook = state.model.register_forward_hook(
                lambda _m, _a, out: self.logits_dtypes.add(out.logits.dtype)
            )
            try:
                p, metrics = train_on(state, mb, **kw)
            finally:
                hook.remove()
            self.calls += 1
            self.last = {n: q.detach().clone() for n, q in policy.items()}
            self._tensors("batch", vars(p.batch))
            self._tensors("channels", vars(p.channels))
            self._tensors("adv", vars(p.adv))
            self._tensors("prepared", {"ref_logp_BT": p.ref_logp_BT, "live_BT": p.live_BT})
            self.params.update({f"policy.{n}": q for n, q in state.model.named_parameters()})
            if state.critic is not None:
                self.params.update({f"critic.{n}": q for n, q in state.critic.model.named_parameters()})
            return p, metrics

        return spy

    def _tensors(self, where: str, fields: dict[str, Any]) -> None:
        for k, v in fields.items():
            if isinstance(v, torch.Tensor):
                self.tensors[f"{where}.{k}"] = v

    def check(self, device: str, dtype: str) -> None:
        assert self.calls >= 2 and self.first is not None
        want = torch.device(device).type
        wrong = {
            k: str(v.device) for k, v in {**self.tensors, **self.params}.items() if v.device.type != want
        }
        assert not wrong, f"tensors off {want}: {wrong}"
        # parameters (and optimiser state) stay float32 under bf16 autocast; the stored log-probs,
        # advantages and returns are float32; masks are bool
        assert {k: v.dtype for k, v in self.params.items() if v.dtype != torch.float32} == {}
        for k, v in self.tensors.items():
            if k.endswith(("mask_BT", "mask_BP", "live_BT")):
                assert v.dtype == torch.bool, (k, v.dtype)
            elif v.is_floating_point():
                assert v.dtype == torch.float32, (k, v.dtype)
        compute = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        assert self.logits_dtypes == {compute}, self.logits_dtypes  # autocast really ran (or did not)
        moved = [n for n, p in self.first.items() if not torch.equal(p, self.last[n])]
        assert moved, "no trained weight of the policy moved"


def rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def run_case(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device: str, preset: str, extra: list[str]
) -> tuple[Config, Touched, list[dict[str, Any]]]:
    cfg = config(device, preset, extra)
    touched = Touched()
    monkeypatch.setattr(loop, "train_on", touched.wrap(loop.train_on))
    train(cfg, tmp_path / "run")
    return cfg, touched, rows(tmp_path / "run")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_a_short_run_trains_on_the_device(
    case: str, device: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    preset, extra = CASES[case]
    cfg, touched, metrics = run_case(monkeypatch, tmp_path, device, preset, extra)
    touched.check(device, cfg.model.dtype)
    rl = [r for r in metrics if r.get("step", 0) >= 1]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:
        for key in ("loss", "pg_loss", "grad_norm"):
            assert math.isfinite(r[key]), (key, r[key])
        if cfg.algorithm.use_critic:
            assert math.isfinite(r["critic/value_loss"])
    assert "val/accuracy" in rl[-1]  # validation generated on the device too


@pytest.mark.parametrize("device", DEVICES)
def test_a_resumed_run_continues_exactly(device: str, tmp_path: Path) -> None:
    """Stop after step 2 (a checkpoint every step), resume, and compare step 3 with an uninterrupted
    run: the checkpoint restores the weights, the optimiser, the prompt stream and the RNGs (CUDA's too)."""
    over = ["trainer.steps=3", "trainer.save_every=1", "trainer.val_every=0"]
    train(config(device, "default", over), tmp_path / "full")
    train(config(device, "default", [*over, "trainer.stop_after_steps=2"]), tmp_path / "part")
    assert [r["step"] for r in rows(tmp_path / "part")] == [0, 1, 2]
    train(config(device, "default", over), tmp_path / "part", resume=tmp_path / "part")
    a = {r["step"]: r for r in rows(tmp_path / "full")}
    b = {r["step"]: r for r in rows(tmp_path / "part")}
    assert sorted(b) == [0, 1, 2, 3]
    for key in ("reward/mean", "response_length/mean", "loss", "kl", "grad_norm"):
        # the same sampled tokens (equal lengths and rewards) and the same update; float32 kernels
        # may round differently between the two processes' passes (~1e-7 relative)
        assert math.isclose(a[3][key], b[3][key], rel_tol=1e-5, abs_tol=1e-7), (key, a[3][key], b[3][key])


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved model of a short CPU run (eval and probe load it onto their device)."""
    out = tmp_path_factory.mktemp("trained") / "run"
    train(config("cpu", "default", ["trainer.val_every=0"]), out)
    return out / "checkpoints" / "final" / "model"


def _load_spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import stepcredit.models as models

    loaded: list[Any] = []
    real = models.load_policy

    def spy(*a: Any, **k: Any) -> Any:
        model, tok = real(*a, **k)
        loaded.append(model)
        return model, tok

    monkeypatch.setattr(models, "load_policy", spy)
    # the one model set-up (trainer/setup.py) that eval and probe load through holds its own name
    import stepcredit.trainer.setup as setup

    monkeypatch.setattr(setup, "load_policy", spy)
    return loaded


@pytest.mark.parametrize("device", DEVICES)
def test_eval_runs_on_the_device(
    device: str,
    trained: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    loaded = _load_spy(monkeypatch)
    out = tmp_path / "eval.jsonl"
    args = ["eval", "--model", str(trained), "--data", "arith", "--limit", "4", "--n", "2", "--no-progress"]
    assert main([*args, "--out", str(out), f"trainer.device={device}", "trainer.threads=1"]) == 0
    (model,) = loaded
    assert {p.device.type for p in model.parameters()} == {torch.device(device).type}
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["prompts"] == 4 and report["n"] == 2  # (the run's 4 validation prompts)
    assert len(out.read_text().splitlines()) == 8  # every answer scored and written


@pytest.mark.parametrize("device", DEVICES)
def test_probe_runs_on_the_device(
    device: str, trained: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = _load_spy(monkeypatch)
    args = ["probe", "--model", str(trained), "--data", "arith", "--n", "4", "--json"]
    assert (
        main(
            [*args, "--estimators", "forced_answer_logprob", f"trainer.device={device}", "trainer.threads=1"]
        )
        == 0
    )
    (model,) = loaded
    assert {p.device.type for p in model.parameters()} == {torch.device(device).type}
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["n"] == 4
    figures = json.dumps(report)
    assert "NaN" not in figures and "Infinity" not in figures  # every value finite
