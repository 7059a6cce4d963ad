"""A LoRA run directory (final/base + final/adapter, with or without the merged export) loads through
the one model set-up in eval, probe and explain; a Hugging Face hub id is one line, never a download."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stepcredit.cli.main import main
from stepcredit.config import ModelConfig
from stepcredit.models import load_policy

# the smoke preset's model with adapters on every projection, a few SFT steps (so the base written
# to final/base differs from the tiny model) and one RL step whose adapters move the policy
TRAIN = [
    "train", "--preset", "smoke", "sft.steps=4", "data.val_size=4", "rollout.max_new_tokens=16",
    "trainer.steps=1", "trainer.val_every=0", "model.lora.rank=8", "optim.lr=1e-3",
    "model.tiny.hidden_size=32", "model.tiny.num_heads=1", "model.tiny.intermediate_size=64",
    "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    "model.lora.merge_on_export=true",
]  # fmt: skip


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("lora") / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    return run


def _eval(model: Path | str, out: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    argv = ["eval", "--preset", "smoke", "data.val_size=4", "rollout.max_new_tokens=16"]
    assert main([*argv, "--model", str(model), "--out", str(out), "--no-progress"]) == 0
    assert '"prompts": 4' in capsys.readouterr().out
    return [json.loads(line)["response"] for line in out.read_text().splitlines()]


def test_a_lora_run_directory_evaluates_as_its_merged_export(
    lora_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    final = lora_run / "checkpoints" / "final"
    # the reference: the merged export the run wrote (W + (alpha/r) B A in each layer)
    merged = _eval(final / "model", tmp_path / "merged.jsonl", capsys)
    # the adapters on their base, loaded by the model set-up: the same greedy answers
    assert _eval(final / "adapter", tmp_path / "adapter.jsonl", capsys) == merged
    # and the run directory itself without the merged export (final/base + final/adapter only)
    bare = tmp_path / "bare"
    shutil.copytree(lora_run, bare)
    shutil.rmtree(bare / "checkpoints" / "final" / "model")
    # the adapters name their base by absolute path: point them at the copy's base
    cfg_file = bare / "checkpoints" / "final" / "adapter" / "adapter_config.json"
    adapter_cfg = json.loads(cfg_file.read_text())
    adapter_cfg["base_model_name_or_path"] = str((bare / "checkpoints" / "final" / "base").resolve())
    cfg_file.write_text(json.dumps(adapter_cfg))
    assert _eval(bare, tmp_path / "bare.jsonl", capsys) == merged
    # the weights themselves: the merged model equals the adapters merged at load time
    a, _ = load_policy(ModelConfig(path=str(final / "model")))
    b, _ = load_policy(ModelConfig(path=str(bare)))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all((sa[k] - sb[k]).abs().max() < 1e-6 for k in sa)


def test_probe_and_explain_take_a_lora_run_directory(
    lora_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.rmtree(lora_run / "checkpoints" / "final" / "model", ignore_errors=True)
    capsys.readouterr()
    argv = ["probe", "--model", str(lora_run), "--data", "arith", "--n", "3", "--estimators"]
    assert main([*argv, "forced_answer_logprob", "--credits", "difference"]) == 0
    assert "recommendation: " in capsys.readouterr().out
    argv = ["explain", "--model", str(lora_run), "--prompt", "What is 2 + 3?", "--response"]
    assert main([*argv, "2 + 3 = 5. The answer is 5.", "--answer", "5"]) == 0
    printed = capsys.readouterr().out
    # the legend and the V_0 row: the merged LoRA policy valued the response
    assert "value estimator: " in printed and "(empty)" in printed


@pytest.mark.parametrize("command", ["eval", "probe", "explain"])
def test_a_hub_id_is_one_line_not_a_download(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra = {
        "eval": [],
        "probe": ["--data", "arith"],
        "explain": ["--prompt", "q", "--response", "r", "--answer", "1"],
    }
    assert main([command, "--model", "Qwen/Qwen2.5-0.5B-Instruct", *extra[command]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hub downloads are not supported here; pass a local directory" in err[0]
    assert "Qwen/Qwen2.5-0.5B-Instruct" in err[0]
