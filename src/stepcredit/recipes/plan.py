"""An experiment's plan (where every run goes, the overrides every run shares) and the checks of every
arm's config before anything runs (:func:`check`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from stepcredit.config import Config
from stepcredit.errors import ConfigError, UserError
from stepcredit.recipes.spec import MIN_CONFIRM_SEEDS, Arm, Spec

_FIXED = (
    "model.path",
    "sft.steps",
    "trainer.seed",
    "trainer.save_every",
    "trainer.progress",
    "trainer.threads",
)
"""Keys the recipe sets on every run: an arm or the command line may not override them."""


@dataclass(frozen=True)
class Plan:
    """Where everything goes and the settings every run shares."""

    spec: Spec
    out: Path
    sft_model: Path
    build: Callable[[str, list[str]], Config]
    """(preset, overrides) -> the config ``stepcredit train --preset P overrides`` runs (the CLI's loader)."""
    seeds: tuple[int, ...] = ()
    """The seeds run (default: the file's); a subset (a smoke run) is recorded as one in the details."""
    extra: tuple[str, ...] = ()
    """Command-line overrides of every run (last: a smoke run's sizes, ``trainer.device=cuda``)."""
    threads: int = 1
    timeout_s: float = 6 * 3600.0
    left_out: tuple[str, ...] = ()
    """Arms of the file not run (``--arms`` ran the others first; recorded as incomplete)."""
    archive: Path | None = None
    """Where each finished run's record (config, metrics, validation rows, final greedy result), the SFT
    model and the held-out prompts are copied as they finish (``--archive``: a directory kept in git or on
    durable storage); a fresh machine's run restores them from there first and resumes past them."""

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.out / arm / f"s{seed}"

    def done(self, arm: str, seed: int) -> bool:
        """The run finished: trained and evaluated (its ``final_greedy.json``, written last, exists)."""
        return (self.run_dir(arm, seed) / "final_greedy.json").is_file()

    def progress(self) -> tuple[int, int]:
        """(finished runs, runs) of the whole file: the arms run and those left out, every seed of it."""
        arms = [*(a.name for a in self.spec.arms), *self.left_out]
        return sum(self.done(a, s) for a in arms for s in self.spec.seeds), len(arms) * len(self.spec.seeds)

    @property
    def interim(self) -> bool:
        """A part (``--seeds``, ``--arms``) of a confirmatory file as written (no override but the
        device): its comparisons would be an interim look at the data the claim rests on, so the runner
        reports progress instead. A smoke run (shortened by overrides) is not the claim's data."""
        part = bool(self.left_out) or set(self.run_seeds) != set(self.spec.seeds)
        as_written = all(o.startswith("trainer.device=") for o in self.extra)
        return self.spec.purpose == "confirm" and part and as_written

    def overrides(self, arm: Arm, seed: int) -> list[str]:
        return [
            *self.spec.common, *arm.overrides, *self.extra,
            f"model.path={self.sft_model}", "sft.steps=0", f"trainer.seed={seed}", "trainer.save_every=0",
            "trainer.progress=false", f"trainer.threads={self.threads}",
        ]  # fmt: skip

    def config(self, arm: Arm, seed: int) -> Config:
        try:
            return self.build(arm.preset, self.overrides(arm, seed))
        except UserError as e:
            raise ConfigError(f"{self.spec.path}: arm {arm.name}: {e}") from None

    @property
    def run_seeds(self) -> tuple[int, ...]:
        return self.seeds or self.spec.seeds

    @property
    def heldout(self) -> Path:
        return self.out / "heldout.jsonl"


def only_arms(spec: Spec, names: tuple[str, ...]) -> tuple[Spec, tuple[str, ...]]:
    """(the file cut to the arms ``names``, the arms left out): the baseline, and the target of every
    placebo or equal-compute arm kept, must be among them (``--arms``: a first part of a file's runs,
    resumed later by the whole file, since every run keeps its own directory)."""
    known = [a.name for a in spec.arms]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"--arms: {', '.join(unknown)} not arms of {spec.path} ({', '.join(known)})")
    if spec.baseline not in names:
        raise UserError(f"--arms: the baseline arm {spec.baseline} must be one of them")
    for a in spec.arms:
        target = a.placebo_of or a.equal_compute_of
        if a.name in names and target is not None and target not in names:
            raise UserError(f"--arms: {a.name} is compared with {target}, which must be one of them too")
    kept = tuple(a for a in spec.arms if a.name in names)
    return replace(spec, arms=kept), tuple(n for n in known if n not in names)


def check(plan: Plan) -> dict[str, Config]:
    """Every arm's config (first seed), after the file's own checks: the runs validate the same way, the
    primary endpoint has its validations, the same seeds everywhere, and a confirmatory file has 16
    seeds, a placebo for every process-credit arm and an equal-compute arm for every costly one."""
    spec = plan.spec
    for ov in [*spec.common, *plan.extra, *(o for a in spec.arms for o in a.overrides)]:
        if ov.split("=", 1)[0].strip() in _FIXED:
            raise ConfigError(f"{spec.path}: override {ov}: the recipe sets {', '.join(_FIXED)} itself")
    cfgs = {a.name: plan.config(a, plan.run_seeds[0]) for a in spec.arms}
    _check_runs(spec, cfgs)
    # the file as written has the endpoint's validations; a smoke run's command line may shorten the
    # runs (the details then say the run is not complete, and its endpoint averages what it has)
    as_written = replace(plan, extra=())
    _check_endpoint(spec, {a.name: as_written.config(a, plan.run_seeds[0]) for a in spec.arms})
    _check_roles(spec, cfgs)
    if set(plan.run_seeds) - set(spec.seeds):
        raise ConfigError(f"{spec.path}: --seeds: every seed run must be one of the file's ({spec.seeds})")
    if spec.purpose == "confirm":
        _check_confirmatory(spec, cfgs)
    return cfgs


def _check_runs(spec: Spec, cfgs: dict[str, Config]) -> None:
    """Each arm's runs validate as ``stepcredit train`` does, have equally spaced validations, and share
    the baseline's prompts."""
    from stepcredit.trainer import check_config

    for name, cfg in cfgs.items():
        try:
            check_config(cfg)
        except UserError as e:
            raise ConfigError(f"{spec.path}: arm {name}: {e}") from None
        t = cfg.trainer
        if t.val_every <= 0 or t.steps % t.val_every:
            raise ConfigError(
                f"{spec.path}: arm {name}: trainer.steps ({t.steps}) must be a multiple of trainer.val_every "
                f"({t.val_every}): the curves are then equally spaced and their area recomputable"
            )
    base = cfgs[spec.baseline]
    for name, cfg in cfgs.items():
        if cfg.data != base.data:
            raise ConfigError(
                f"{spec.path}: arm {name}: data.* differs from the baseline's: arms must share prompts"
            )


def _check_endpoint(spec: Spec, cfgs: dict[str, Config]) -> None:
    """Each arm of the file as written validates at least ``endpoint.last`` times after SFT."""
    for name, cfg in cfgs.items():
        t = cfg.trainer
        if t.val_every > 0 and t.steps // t.val_every < spec.last:
            raise ConfigError(
                f"{spec.path}: arm {name}: {t.steps // t.val_every} validations after SFT, fewer than the "
                f"primary endpoint's last {spec.last} (endpoint.last)"
            )


def _check_roles(spec: Spec, cfgs: dict[str, Config]) -> None:
    """A placebo arm is its target's run but for ``process.placebo``; an equal-compute arm is GRPO."""
    for a in spec.arms:
        cfg = cfgs[a.name]
        if a.placebo_of is not None:
            target = cfgs[a.placebo_of]
            if not cfg.process.placebo_on or not target.process.enabled:
                raise ConfigError(
                    f"{spec.path}: arms.{a.name}.placebo_of: a placebo sets process.placebo on the credit path of "
                    f"{a.placebo_of}, which must have process.enabled=true"
                )
            # the same run in every setting but where the credits land
            mine = replace(cfg, process=replace(cfg.process, placebo="none", placebo_seed=0))
            if mine != replace(target, process=replace(target.process, placebo_seed=0)):
                raise ConfigError(
                    f"{spec.path}: arms.{a.name}.placebo_of: its settings must be {a.placebo_of}'s but for "
                    "process.placebo"
                )
        if a.equal_compute_of is not None and cfg.process.enabled:
            raise ConfigError(
                f"{spec.path}: arms.{a.name}.equal_compute_of: an equal-compute arm is outcome GRPO given more "
                "steps or samples (process.enabled=false)"
            )


def _check_confirmatory(spec: Spec, cfgs: dict[str, Config]) -> None:
    """A claim pairs >= 16 seeds, and every process-credit arm has its placebo and, when its value
    estimator generates, its equal-compute GRPO arm (issue 44)."""
    from stepcredit.process import VALUE_ESTIMATORS

    if len(spec.seeds) < MIN_CONFIRM_SEEDS:
        raise ConfigError(f"{spec.path}: seeds: a confirmatory file pairs >= {MIN_CONFIRM_SEEDS} seeds")
    for a in spec.arms:
        p = cfgs[a.name].process
        if not p.enabled or p.placebo_on or a.name == spec.baseline:
            continue
        if not any(b.placebo_of == a.name for b in spec.arms):
            raise ConfigError(
                f"{spec.path}: arms.{a.name}: a process-credit arm needs a placebo arm (placebo_of)"
            )
        costly = VALUE_ESTIMATORS.get(p.value_estimator).generates
        if costly and not any(b.equal_compute_of == a.name for b in spec.arms):
            raise ConfigError(
                f"{spec.path}: arms.{a.name}: {p.value_estimator} generates; it needs an equal-compute GRPO "
                "arm (equal_compute_of)"
            )
