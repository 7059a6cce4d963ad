"""An experiment file and its own checks (:func:`load_spec`): the arms, the baseline, the seeds and the
endpoints, fixed before anything runs (docs/experiments.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from stepcredit.errors import ConfigError, UserError

Purpose = Literal["confirm", "search"]
MIN_CONFIRM_SEEDS = 16
"""A confirmatory file (``purpose: confirm``) pairs at least this many seeds (issue 44)."""


@dataclass(frozen=True)
class Arm:
    """One arm of the file."""

    name: str
    preset: str
    """The preset the arm's runs start from (``stepcredit train --preset``)."""
    overrides: tuple[str, ...] = ()
    """``key=value`` overrides after the file's ``common`` ones."""
    oracle: bool = False
    """An upper bound the policy cannot compute for itself (exact step values): reported, never the claim."""
    placebo_of: str | None = None
    """The process-credit arm this one is the placebo of (``process.placebo`` on the same credit path)."""
    equal_compute_of: str | None = None
    """The costly arm whose generated tokens this (GRPO) arm is given, by more steps or samples."""


@dataclass(frozen=True)
class Spec:
    """An experiment file, parsed (:func:`load_spec`)."""

    path: Path
    name: str
    purpose: Purpose
    """``confirm`` (a claim: at least 16 seeds, a placebo and an equal-compute arm where due) or
    ``search`` (a regime search: few seeds, nothing claimed)."""
    baseline: str
    """The outcome GRPO arm every other arm is compared with."""
    seeds: tuple[int, ...]
    arms: tuple[Arm, ...]
    last: int = 4
    """The validation endpoint: the mean of this many last validations of each run."""
    primary: str = "last_validations"
    """Which endpoint is the claim (``endpoint.primary``): ``last_validations`` (the mean of the last
    ``last`` validations) or ``final_greedy`` (greedy accuracy of each run's final model on the
    held-out prompts, evaluated once at the end); the other is a secondary endpoint."""
    against_sft: bool = False
    """Also compare every arm's primary endpoint with its own step-0 validation (the shared SFT model,
    "RL beats SFT"), paired by seed, in the primary family (Holm) (``endpoint.against_sft``)."""
    final_greedy_prompts: int = 2000
    """Held-out prompts of the validation distribution for the final greedy evaluation (0: none)."""
    common: tuple[str, ...] = ()
    """Overrides of every arm's runs (before the arm's own)."""
    sft_model: str = ""
    """A model every run starts from (``model.path``); empty: ``sft`` trains one."""
    sft: dict[str, Any] = field(default_factory=dict)
    """``{preset, overrides, seed}`` of the SFT model trained once for every arm (``stepcredit sft``)."""

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)


def _err(path: Path, key: str, what: str) -> ConfigError:
    return ConfigError(f"{path}: key {key}: {what}")


def _strs(path: Path, key: str, x: Any) -> tuple[str, ...]:
    if x is None:
        return ()
    if not isinstance(x, list) or not all(isinstance(s, str) and "=" in s for s in x):
        raise _err(path, key, "expected a list of key=value strings")
    return tuple(x)


_KEYS = {"name", "purpose", "baseline", "seeds", "arms", "endpoint", "final_greedy_prompts", "common",
         "sft_model", "sft", "notes"}  # fmt: skip
_ARM_KEYS = {"preset", "overrides", "oracle", "placebo_of", "equal_compute_of"}


def load_spec(path: Path) -> Spec:
    """Parse an experiment file; a ConfigError naming the file and the key on any mistake."""
    if not path.is_file():
        raise UserError(f"{path}: no such experiment file")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for k in raw:
        if k not in _KEYS:
            raise _err(path, str(k), f"unknown; valid keys: {', '.join(sorted(_KEYS))}")
    seeds = raw.get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise _err(path, "seeds", "expected a non-empty list of integers, fixed before the run")
    if len(set(seeds)) != len(seeds):
        raise _err(path, "seeds", "a seed is listed twice")
    arms = _arms(path, raw.get("arms"))
    names = [a.name for a in arms]
    baseline = raw.get("baseline")
    if baseline not in names:
        raise _err(path, "baseline", f"{baseline!r} is not an arm ({', '.join(names)})")
    purpose = raw.get("purpose", "confirm")
    if purpose not in ("confirm", "search"):
        raise _err(path, "purpose", "confirm or search")
    last, against_sft, primary = _endpoint(path, raw.get("endpoint") or {})
    fg = raw.get("final_greedy_prompts", 2000)
    if not isinstance(fg, int) or fg < 0:
        raise _err(path, "final_greedy_prompts", "a number of prompts >= 0")
    if primary == "final_greedy" and fg == 0:
        raise _err(
            path, "endpoint.primary", "final_greedy needs final_greedy_prompts > 0 (the held-out prompts)"
        )
    sft = raw.get("sft") or {}
    if not isinstance(sft, dict) or set(sft) - {"preset", "overrides", "seed"}:
        raise _err(path, "sft", "expected {preset, overrides, seed}")
    if not raw.get("sft_model") and not sft.get("preset"):
        raise _err(
            path, "sft", "name the SFT model every arm starts from (sft_model: DIR, or sft: {preset: NAME})"
        )
    return Spec(
        path=path,
        name=str(raw.get("name") or path.stem),
        purpose=purpose,
        baseline=baseline,
        seeds=tuple(seeds),
        arms=arms,
        last=last,
        primary=primary,
        against_sft=against_sft,
        final_greedy_prompts=fg,
        common=_strs(path, "common", raw.get("common")),
        sft_model=str(raw.get("sft_model") or ""),
        sft={
            "preset": sft.get("preset"),
            "seed": int(sft.get("seed", 0)),
            "overrides": list(_strs(path, "sft.overrides", sft.get("overrides"))),
        },
    )


def _arms(path: Path, arms_raw: Any) -> tuple[Arm, ...]:
    """The file's ``arms``: each a mapping with a preset; ``placebo_of`` and ``equal_compute_of`` name
    another arm."""
    if not isinstance(arms_raw, dict) or len(arms_raw) < 2:
        raise _err(path, "arms", "expected a mapping of at least two arms (name: {preset, overrides, ...})")
    arms = []
    for name, a in arms_raw.items():
        if not isinstance(a, dict) or not isinstance(a.get("preset"), str):
            raise _err(path, f"arms.{name}", "expected a mapping with a preset")
        for k in a:
            if k not in _ARM_KEYS:
                raise _err(path, f"arms.{name}.{k}", f"unknown; valid keys: {', '.join(sorted(_ARM_KEYS))}")
        arms.append(
            Arm(
                str(name),
                a["preset"],
                _strs(path, f"arms.{name}.overrides", a.get("overrides")),
                bool(a.get("oracle", False)),
                a.get("placebo_of"),
                a.get("equal_compute_of"),
            )
        )
    names = [a.name for a in arms]
    for a in arms:
        for key, target in (("placebo_of", a.placebo_of), ("equal_compute_of", a.equal_compute_of)):
            if target is not None and (target not in names or target == a.name):
                raise _err(
                    path, f"arms.{a.name}.{key}", f"{target!r} is not another arm ({', '.join(names)})"
                )
    return tuple(arms)


def _endpoint(path: Path, endpoint: Any) -> tuple[int, bool, str]:
    """The file's ``endpoint``: the primary endpoint is the mean of the last ``last`` validations
    (``last_validations``) or the final model's greedy accuracy on the held-out prompts
    (``final_greedy``); ``against_sft`` adds each arm against its step-0 validation to the primary family
    (a validation figure: with ``last_validations`` only)."""
    if not isinstance(endpoint, dict) or set(endpoint) - {"primary", "last", "against_sft"}:
        raise _err(
            path,
            "endpoint",
            "expected {primary: last_validations or final_greedy, last: N, against_sft: BOOL}",
        )
    primary = endpoint.get("primary", "last_validations")
    if primary not in ("last_validations", "final_greedy"):
        raise _err(
            path,
            "endpoint.primary",
            "last_validations (the mean of the last N validations) or final_greedy (the final model's "
            "greedy accuracy on the held-out prompts)",
        )
    last = endpoint.get("last", 4)
    if not isinstance(last, int) or last < 1:
        raise _err(path, "endpoint.last", "a number of validations >= 1")
    against_sft = endpoint.get("against_sft", False)
    if not isinstance(against_sft, bool):
        raise _err(path, "endpoint.against_sft", "true or false")
    if against_sft and primary != "last_validations":
        raise _err(
            path,
            "endpoint.against_sft",
            "the SFT start has a validation figure only: use primary: last_validations",
        )
    return last, against_sft, primary
