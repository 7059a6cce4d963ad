"""The config tree: every field documented, unknown keys rejected with close names, round trip."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import stepcredit.config as C
from stepcredit.cli.common import apply_overrides, load_preset, preset_names
from stepcredit.errors import ConfigError


def test_every_field_has_a_docstring() -> None:
    tree = ast.parse(C.tree_source())
    missing = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config"):
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    if not (
                        isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
                    ):
                        missing.append(f"{node.name}.{stmt.target.id}")
    assert not missing, missing


def test_unknown_key_lists_close_keys() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.steps"):
        apply_overrides({}, ["trainer.stepz=3"])
    with pytest.raises(ConfigError, match=r"unknown config key rollout\.nn"):
        C.from_dict({"rollout": {"nn": 3}})


def test_types_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.n"):
        C.from_dict({"rollout": {"n": "many"}})
    with pytest.raises(ConfigError, match=r"rollout\.temperature"):
        C.from_dict({"rollout": {"temperature": -1}})


def test_off_is_a_string_in_overrides_and_files(tmp_path: Path) -> None:
    # YAML 1.1 reads off/on/yes/no as booleans; the config reads 1.2's (true and false only), so
    # `rollout.decode_compile=off` is the value it names, and a boolean spelled `no` is an error
    from stepcredit.cli.common import build_config
    from stepcredit.cli.main import build_parser

    cfg = C.from_dict(apply_overrides({}, ["rollout.decode_compile=off", "trainer.progress=false"]))
    assert cfg.rollout.decode_compile == "off" and cfg.trainer.progress is False
    with pytest.raises(ConfigError, match=r"trainer\.progress: expected true/false, got 'no'"):
        C.from_dict(apply_overrides({}, ["trainer.progress=no"]))
    f = tmp_path / "run.yaml"
    f.write_text("rollout:\n  decode_compile: off\ntrainer:\n  progress: False\n")
    cfg = build_config(build_parser().parse_args(["train", "--config", str(f)]))
    assert cfg.rollout.decode_compile == "off" and cfg.trainer.progress is False


def test_round_trip_and_presets() -> None:
    cfg = C.from_dict(apply_overrides({}, ["trainer.steps=7", "optim.betas=[0.8, 0.9]"]))
    assert cfg.trainer.steps == 7 and cfg.optim.betas == (0.8, 0.9)
    assert C.from_dict(C.to_dict(cfg)) == cfg
    assert {"default", "smoke"} <= set(preset_names())
    for name in preset_names():
        assert dataclasses.is_dataclass(C.from_dict(load_preset(name)))


def test_every_preset_reaches_its_learning_rate() -> None:
    # no preset ends inside its warm-up (smoke's 3 steps once sat in a 10-step one and printed the
    # short-run warning on every test run)
    from stepcredit.trainer.schedule import short_run_warning

    for name in preset_names():
        cfg = C.from_dict(load_preset(name))
        warning = short_run_warning(steps=cfg.trainer.steps, warmup=cfg.optim.warmup_steps, lr=cfg.optim.lr)
        assert warning is None, (name, warning)


def test_every_preset_passes_the_start_up_checks() -> None:
    from stepcredit.trainer.loop import check_config

    for name in preset_names():
        check_config(C.from_dict(load_preset(name)))  # raises ConfigError naming the key


def test_literal_keys_read_the_same_strings() -> None:
    # Literal-typed keys take the strings YAML presets always wrote; a wrong one names the valid values
    cfg = C.from_dict(
        {"loss": {"kl_ctrl": "adaptive"}, "process": {"last_episode": "zero", "mc_v0": "sample"}}
    )
    assert (cfg.loss.kl_ctrl, cfg.process.last_episode, cfg.process.mc_v0) == ("adaptive", "zero", "sample")
    cfg = C.from_dict({"reward": {"reward_model": {"worker": "process", "kind": "token"}}})
    assert (cfg.reward.reward_model.worker, cfg.reward.reward_model.kind) == ("process", "token")
    with pytest.raises(ConfigError, match=r"loss\.kl_ctrl: fixed or adaptive"):
        C.from_dict({"loss": {"kl_ctrl": "adaptve"}})
    with pytest.raises(ConfigError, match=r"loss\.kl_ctrl: expected a string"):
        C.from_dict({"loss": {"kl_ctrl": True}})
