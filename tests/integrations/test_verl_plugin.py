"""The verl plugin: registration on `import verl`, and the estimators through verl's own compute_advantage."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage

from stepcredit.advantages import AdvantageInputs, compute_advantages
from stepcredit.config import AlgorithmConfig
from stepcredit.errors import ConfigError
from stepcredit.integrations.verl.config import algorithm_config
from stepcredit.integrations.verl.estimators import group_ids, verl_advantages
from stepcredit.integrations.verl.plugin import version_ok

pytestmark = pytest.mark.verl  # runs in .venv-verl (make test)


def test_import_verl_alone_registers_everything() -> None:
    # A fresh interpreter that imports only verl: the entry point must do the rest.
    code = textwrap.dedent(
        """
        import verl
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn
        from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls
        for n in ("grpo_process", "prime_rloo", "gae", "reinforce_pp", "grpo"):
            get_adv_estimator_fn("stepcredit_" + n)
        print("manager", get_reward_manager_cls("stepcredit").__name__)
        from verl.trainer.ppo.v1 import get_trainer_cls
        print("trainer", get_trainer_cls("stepcredit_sync").__name__)
        """
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto", "PYTHONWARNINGS": "ignore"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "manager StepCreditRewardManager" in p.stdout
    assert "trainer StepCreditTrainer" in p.stdout
    assert "[stepcredit]" not in p.stderr  # nothing failed loudly


def test_version_guard() -> None:
    assert version_ok("0.9.1") and version_ok("0.9.0") and version_ok("0.9.5.dev0")
    assert (
        not version_ok("0.8.4") and not version_ok("0.10.0") and not version_ok("1.0") and not version_ok("x")
    )


def _data(seed: int = 0, B: int = 12, T: int = 9, G: int = 4) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lens[:, None]).float()
    score = torch.randint(0, 2, (B,), generator=gen).float() + 0.1 * torch.randn(B, generator=gen)
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lens - 1] = score
    uids = np.array([f"prompt-{b // G}" for b in range(B)], dtype=object)
    return DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uids}
    )


VERL_ALGO = {
    "gamma": 0.9,
    "lam": 0.95,
    "norm_adv_by_std_in_grpo": True,
    "stepcredit": {"process_weight": 0.5},
}


@pytest.mark.parametrize(
    "name", ["grpo_process", "prime_rloo", "reinforce_pp", "grpo", "rloo", "reinforce_pp_baseline"]
)
@pytest.mark.parametrize("norm", [True, False])
def test_estimators_through_verl_compute_advantage(name: str, norm: bool) -> None:
    data = _data(seed=len(name))
    algo = OmegaConf.create(
        {**VERL_ALGO, "adv_estimator": f"stepcredit_{name}", "norm_adv_by_std_in_grpo": norm}
    )
    want = compute_advantages(
        AlgorithmConfig(advantage=name, gamma=0.9, lam=0.95, norm_by_std=norm, process_weight=0.5),
        AdvantageInputs(
            outcome_BT=data.batch["token_level_rewards"].clone(),
            mask_BT=data.batch["response_mask"].bool(),
            group_B=torch.arange(12) // 4,
        ),
    )
    out = compute_advantage(
        data,
        adv_estimator=f"stepcredit_{name}",
        gamma=0.9,
        lam=0.95,
        norm_adv_by_std_in_grpo=norm,
        config=algo,
    )
    torch.testing.assert_close(out.batch["advantages"], want.adv_BT)
    torch.testing.assert_close(out.batch["returns"], want.ret_BT)


def test_stepcredit_grpo_equals_verl_grpo() -> None:
    # The adapter (uids -> groups, masks, config) against verl's own estimator on the same DataProto.
    data = _data(seed=3)
    ours = compute_advantage(
        _data(seed=3), adv_estimator="stepcredit_grpo", config=OmegaConf.create({"stepcredit": {}})
    )
    theirs, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=data.batch["token_level_rewards"],
        response_mask=data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
    )
    torch.testing.assert_close(ours.batch["advantages"], theirs, atol=1e-5, rtol=1e-5)


def test_gae_needs_values_and_uses_them() -> None:
    data = _data(seed=5)
    with pytest.raises(ConfigError, match="stepcredit_sync"):
        compute_advantage(data, adv_estimator="stepcredit_gae", config=OmegaConf.create(VERL_ALGO))
    values = torch.randn(12, 9, generator=torch.Generator().manual_seed(1))
    r, m = data.batch["token_level_rewards"], data.batch["response_mask"]
    adv, ret = verl_advantages(
        "gae", r, m, index=data.non_tensor_batch["uid"], config=VERL_ALGO, values=values
    )
    want = compute_advantages(
        AlgorithmConfig(advantage="gae", gamma=0.9, lam=0.95, process_weight=0.5, use_critic=True),
        AdvantageInputs(outcome_BT=r, mask_BT=m.bool(), group_B=torch.arange(12) // 4, values_BT=values),
    )
    torch.testing.assert_close(adv, want.adv_BT)
    torch.testing.assert_close(ret, want.ret_BT)


def test_config_reading() -> None:
    cfg = algorithm_config("grpo_process", OmegaConf.create(VERL_ALGO))
    assert (cfg.gamma, cfg.lam, cfg.norm_by_std, cfg.process_weight, cfg.eps) == (0.9, 0.95, True, 0.5, 1e-6)
    assert algorithm_config("grpo", None).advantage == "grpo"
    with pytest.raises(ConfigError, match=r"algorithm\.stepcredit\.proces_weight"):
        algorithm_config("grpo", {"stepcredit": {"proces_weight": 1.0}})
    # uids of any type, in order of first appearance; None = every response its own group
    assert group_ids(np.array(["b", "a", "b", 7], dtype=object), 4).tolist() == [0, 1, 0, 2]
    assert group_ids(None, 3).tolist() == [0, 1, 2]


def test_example_config_composes_and_validates() -> None:
    # examples/verl/gsm8k_stepcredit.yaml on top of verl's ppo_trainer: verl accepts it, and the
    # stepcredit keys in it parse into stepcredit's config tree.
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from stepcredit.integrations.verl.config import stepcredit_config

    examples = Path(__file__).resolve().parents[2] / "examples" / "verl"
    with initialize_config_dir(config_dir=str(examples), version_base=None):
        cfg = compose(config_name="gsm8k_stepcredit")
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert cfg.trainer.v1.trainer_mode == "stepcredit_sync" and cfg.reward.reward_manager.name == "stepcredit"
    assert core_algos.get_adv_estimator_fn(cfg.algorithm.adv_estimator) is not None
    assert stepcredit_config(cfg).process.enabled
    assert algorithm_config("grpo_process", cfg.algorithm).process_weight == 0.5
    with pytest.raises(ConfigError, match=r"stepcredit\.procces"):
        stepcredit_config({"stepcredit": {"procces": {}}})


def test_unsupported_verl_is_refused_loudly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import verl

    from stepcredit.integrations.verl import plugin

    monkeypatch.setattr(verl, "__version__", "0.8.5")
    assert plugin.register() == {}
    assert "verl 0.8.5 is outside the supported range >=0.9,<0.10" in capsys.readouterr().err
    monkeypatch.undo()
    assert plugin.register()["reward_managers"] == ["stepcredit"]  # registering again is a no-op


def test_failed_reward_in_a_stock_verl_trainer_stays_in_the_loss() -> None:
    # What the README documents (issue 19): verl's own trainers hand an estimator only the rewards, the
    # mask, the uids and the config; the reward manager's typed failure (reward_extra_info ok=0, score 0
    # under failure_policy=mask) sits in non_tensor_batch, which verl never passes on. So a failed
    # response gets an advantage like any 0-score response and counts in its group's baseline; only
    # stepcredit_sync reads the flag back and masks it (the `valid` argument below).
    data = _data(seed=7)
    B = len(data)
    rewards = data.batch["token_level_rewards"]
    failed = 1  # prompt-0's second response: could not be scored, the failure policy made it 0
    rewards[failed] = 0.0
    data.non_tensor_batch["ok"] = np.array([0.0 if b == failed else 1.0 for b in range(B)], dtype=object)
    algo = OmegaConf.create({**VERL_ALGO, "adv_estimator": "stepcredit_grpo"})
    stock = compute_advantage(data, adv_estimator="stepcredit_grpo", config=algo).batch["advantages"]
    assert stock[failed].abs().sum() > 0  # in the loss

    valid = torch.tensor([b != failed for b in range(B)])
    masked, _ = verl_advantages(
        "grpo",
        rewards,
        data.batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        config=algo,
        valid=valid,
    )
    assert masked[failed].abs().sum() == 0  # stepcredit_sync: out of the loss
    assert not torch.allclose(masked[:4], stock[:4])  # and out of its group's baseline
    torch.testing.assert_close(masked[4:], stock[4:])  # other groups unchanged
