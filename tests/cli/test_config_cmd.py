"""What a new user types first: scientific notation, ``--version``, ``stepcredit config`` round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import stepcredit
import stepcredit.config as C
from stepcredit.cli.common import _read_yaml, apply_overrides, load_preset
from stepcredit.cli.main import main
from stepcredit.errors import ConfigError


def test_scientific_notation_parses_on_the_command_line_and_in_yaml() -> None:
    cfg = C.from_dict(apply_overrides({}, ["optim.lr=1e-5", "sft.lr=2E-3", "trainer.steps=1e1"]))
    assert cfg.optim.lr == pytest.approx(1e-5) and cfg.sft.lr == pytest.approx(2e-3)
    assert cfg.trainer.steps == 10 and isinstance(cfg.trainer.steps, int)
    data = _read_yaml("optim:\n  lr: 3e-6\nrollout:\n  top_p: .9\n", "test.yaml")
    assert data["optim"]["lr"] == "3e-6"  # PyYAML (YAML 1.1) reads it as a string ...
    cfg = C.from_dict(data)
    assert cfg.optim.lr == pytest.approx(3e-6) and cfg.rollout.top_p == pytest.approx(0.9)  # ... we do not
    with pytest.raises(ConfigError, match=r"optim\.lr: expected a number, got '1e-5x'"):
        C.from_dict(apply_overrides({}, ["optim.lr=1e-5x"]))
    with pytest.raises(ConfigError, match=r"trainer\.steps: expected an integer"):
        C.from_dict(apply_overrides({}, ["trainer.steps=1.5e0"]))


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"stepcredit {stepcredit.__version__}"


def test_config_prints_documented_yaml_that_config_reads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    over = ["trainer.steps=3", "optim.lr=1e-5", "optim.betas=[0.8, 0.95]", "model.gguf_file='a: #b'"]
    assert main(["config", "--preset", "default", *over]) == 0
    text = capsys.readouterr().out
    want = C.from_dict(apply_overrides(load_preset("default"), over))
    assert want.trainer.steps == 3 and want.optim.lr == pytest.approx(1e-5)
    # each field's documentation is there as a comment above it
    assert "    # Width of the residual stream.\n    hidden_size: 128\n" in text
    assert "  # AdamW learning rate of the RL phase.\n  lr: 1.0e-05\n" in text
    assert "  gguf_file: 'a: #b'\n" in text
    f = tmp_path / "merged.yaml"
    f.write_text(text)
    assert C.from_dict(_read_yaml(text, str(f))) == want
    assert main(["config", "--config", str(f)]) == 0
    again = capsys.readouterr().out
    assert again.splitlines()[1:] == text.splitlines()[1:]  # only the header line names the source


def test_train_with_scientific_lr_runs(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # the command line, with a shorter SFT and validation (overrides stay together)
    args = ["train", "optim.lr=1e-5", "trainer.steps=1", "sft.steps=2", "data.val_size=4"]
    args += ["rollout.max_new_tokens=16", "trainer.threads=1", "--preset", "smoke", "--out", str(out)]
    assert main(args) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 1
    saved = C.from_dict(_read_yaml((out / "config.yaml").read_text(), "config.yaml"))
    assert saved.optim.lr == pytest.approx(1e-5)
