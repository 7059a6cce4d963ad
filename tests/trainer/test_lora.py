"""LoRA in the trainer: the optimiser over the adapters, the reference as a view of the policy's base
weights (one copy in memory), checkpoints and exact resume, the export, start-up errors; through the
command line with the smoke preset."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from stepcredit.cli.main import main
from stepcredit.config import Config, from_dict
from stepcredit.data.domains import build_data
from stepcredit.models import load_policy
from stepcredit.models.lora import AdapterOffView, adapter_parameters, base_parameters
from stepcredit.trainer.checkpoint import load_checkpoint
from stepcredit.trainer.state import TrainState, build_state

FAST = [
    "--preset",
    "smoke",
    "sft.steps=4",
    "data.val_size=8",
    "rollout.max_new_tokens=24",
    "trainer.save_every=1",
    # the smoke model of before 781b5d4 (32 wide), with adapters on all seven projections: after 4 SFT
    # steps some of its answers score, so the adapters get a gradient (the 64-wide one scores none yet)
    "model.tiny.hidden_size=32",
    "model.tiny.num_heads=1",
    "model.tiny.intermediate_size=64",
    "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    # rewards in threads: the default process pool starts its workers anew in every run (the pool has
    # its own tests; tests/cli/test_train.py runs the smoke preset with it through a subprocess)
    "reward.agent.backend=thread",
]
# optim.lr 1e-3: adapters need a larger step than full fine-tuning's (at smoke's 4e-6 they barely move)
LORA = ["model.lora.rank=8", "optim.lr=1e-3"]


def _state(lora: bool) -> TrainState:
    d: dict[str, Any] = {
        "model": {"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}},
        "data": {"train_size": 16, "val_size": 4},
        "loss": {"kl_coef": 0.05},
    }
    if lora:
        d["model"]["lora"] = {"rank": 8}
    cfg: Config = from_dict(d)
    _, _, stream = build_data(cfg.data, seed=0)
    model, tok = load_policy(cfg.model, seed=0)
    state = build_state(cfg, model, tok, stream)
    state.start_rl()
    return state


def _storage_bytes(*models: Any) -> int:
    """Bytes of the distinct storages behind the models' parameters (what the process holds)."""
    seen: dict[int, int] = {}
    for m in models:
        for p in m.parameters():
            s = p.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def test_the_optimiser_steps_the_adapters_and_the_reference_shares_the_base_weights() -> None:
    state = _state(lora=True)
    in_opt = [p for g in state.opt.param_groups for p in g["params"]]
    assert [id(p) for p in in_opt] == [id(p) for p in adapter_parameters(state.model)]
    assert all(p.requires_grad for p in in_opt)
    assert not any(p.requires_grad for p in base_parameters(state.model))
    assert isinstance(state.ref, AdapterOffView)
    ref, base = list(state.ref.parameters()), base_parameters(state.model)
    assert [id(p) for p in ref] == [id(p) for p in base]  # the same tensor objects
    assert [p.data_ptr() for p in ref] == [p.data_ptr() for p in base]
    # one copy of the base weights: the reference adds no storage; the full fine-tuning run's frozen
    # copy holds a second one
    assert _storage_bytes(state.model, state.ref) == _storage_bytes(state.model)
    full = _state(lora=False)
    assert _storage_bytes(full.model, full.ref) == 2 * _storage_bytes(full.model)
    lora_bytes = sum(p.numel() * p.element_size() for p in adapter_parameters(state.model))
    assert _storage_bytes(state.model) == _storage_bytes(full.model) + lora_bytes


def _metrics(run: Path) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def test_resume_with_lora_and_one_step_off_policy_continues_exactly(tmp_path: Path) -> None:
    """3 steps straight vs 2 steps + resume to 3 (the checkpoint holds the adapters, the SFT base, the
    adapters' optimiser state and the batch generated ahead)."""
    full, part = tmp_path / "full", tmp_path / "part"
    off = ["pipeline.one_step_off_policy=true", "loss.name=decoupled_ppo", "loss.kl_coef=0.05"]
    assert main(["train", *FAST, *LORA, *off, "trainer.steps=3", "--out", str(full)]) == 0
    assert (
        main(
            ["train", *FAST, *LORA, *off, "trainer.steps=3", "trainer.stop_after_steps=2", "--out", str(part)]
        )
        == 0
    )
    ckpt = load_checkpoint(part / "checkpoints" / "step_000002")
    adapters = [k for k in ckpt["model"] if ".lora_" in k]
    assert adapters and any(".base_layer." in k for k in ckpt["model"])  # SFT moved the base: kept
    assert ckpt["ref_model"] is None  # the reference is the base: nothing of its own to save
    assert len(ckpt["optimizer"]["state"]) == len(adapters)
    assert main(["train", "--resume", str(part)]) == 0
    a, b = _metrics(full), _metrics(part)
    assert sorted(b) == [0, 1, 2, 3] and b[3]["staleness"] == 1.0
    assert a[3]["kl"] > 0  # the adapters moved the policy away from the reference
    for key in ("reward/mean", "response_length/mean", "loss", "kl", "entropy", "grad_norm", "adv/abs_mean"):
        x, y = a[3][key], b[3][key]
        # the tolerance of the off-policy resume test (tests/trainer/test_composition.py)
        assert math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-7), (key, x, y)


def test_the_merged_export_is_a_model_eval_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No SFT: checkpoints hold the adapters alone; the merged model at final/model runs in eval."""
    run = tmp_path / "run"
    args = [*FAST, *LORA, "sft.steps=0", "trainer.steps=1", "trainer.val_every=0"]
    assert main(["train", *args, "model.lora.merge_on_export=true", "--out", str(run)]) == 0
    ckpt = load_checkpoint(run / "checkpoints" / "step_000001")
    assert ckpt["model"] and all(".lora_" in k for k in ckpt["model"])
    final = run / "checkpoints" / "final"
    assert {p.name for p in final.iterdir()} == {"adapter", "base", "model"}  # tiny: the base is written
    adapter_cfg = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert Path(adapter_cfg["base_model_name_or_path"]) == (final / "base").resolve()
    capsys.readouterr()
    model = final / "model"
    out = tmp_path / "samples.jsonl"
    argv = ["eval", "--preset", "smoke", "data.val_size=4", "--model", str(model), "--out", str(out)]
    assert main([*argv, "--no-progress"]) == 0
    assert '"prompts": 4' in capsys.readouterr().out


def test_a_layer_the_model_lacks_fails_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "train",
            *FAST,
            "model.lora.rank=8",
            "model.lora.target_modules=[q_proj,qkv]",
            "--out",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "model.lora.target_modules: qkv" in err[0]
    assert not (tmp_path / "metrics.jsonl").exists() or "sft" not in (tmp_path / "metrics.jsonl").read_text()


def test_lora_adapters_start_as_the_sft_policy() -> None:
    """B = 0 at attachment: the first RL step's policy is the SFT policy (KL 0 to the reference)."""
    state = _state(lora=True)
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(0))
    assert state.ref is not None
    with torch.no_grad():
        assert torch.equal(state.model(input_ids=ids).logits, state.ref(input_ids=ids).logits)


def test_a_lora_run_prints_what_it_wrote_and_counts_its_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = [*FAST, *LORA, "sft.steps=1", "trainer.steps=1", "trainer.val_every=0", "trainer.save_every=0"]
    assert main(["train", *args, "--out", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    printed = [Path(ln.split()[1]) for ln in out if ln.startswith("model: ")]
    # every model path printed exists (no merged final/model was asked for, so none is printed)
    final = run / "checkpoints" / "final"
    assert printed == [run / "checkpoints" / "sft" / "model", final / "adapter", final / "base"]
    assert all(p.is_dir() for p in printed) and not (final / "model").exists()
    # LoRA rank 8 on the seven projections of a 32-wide model (MLP 64), 2 layers: r (in + out) per layer
    # q, k, v, o: 8 (32 + 32) = 512 each; gate, up: 8 (32 + 64) = 768 each; down: 8 (64 + 32) = 768
    # -> 4 * 512 + 3 * 768 = 4,352 per layer, 8,704 for two
    params = json.loads((run / "summary.json").read_text())["params"]
    cfg = from_dict(
        {"model": {"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 1, "intermediate_size": 64}}}
    )
    total = sum(p.numel() for p in load_policy(cfg.model, seed=0)[0].parameters())
    assert params == {"trainable": 8_704, "total": total}
    banner = next(ln for ln in out if ln.strip().startswith("trains"))
    assert f"RL trains 8,704 LoRA weights ({100 * 8704 / total:.1f} %" in banner
    assert f"parameters: 8,704 trained of {total:,}" in "\n".join(out)
