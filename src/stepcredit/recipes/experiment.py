"""``stepcredit experiment FILE.yaml``: a pre-registered comparison of arms over paired seeds.

One YAML file fixes, before anything runs, the arms (each a preset plus overrides, with the flags
``oracle``, ``placebo_of``, ``equal_compute_of``), the baseline (outcome GRPO), the seeds, the primary
endpoint (the mean of the last ``endpoint.last`` validations) and the held-out set of the secondary one
(greedy accuracy of each final model on ``final_greedy_prompts`` prompts of the validation
distribution that validation never sees). The recipe then:

1. builds every arm's config and checks the file (one line naming the file and key on a mistake);
2. trains the shared SFT model once (or takes ``sft_model``), writes the held-out prompts;
3. runs every (arm, seed) as ``stepcredit train`` in a subprocess (``--jobs`` at a time, each with a
   real timeout), then ``stepcredit eval`` greedy on the held-out prompts; a run whose
   ``final_greedy.json`` exists is not run again (resume), a run cut short is started over;
4. reads each run's ``metrics.jsonl`` (validation curve, ``generated_tokens``, step seconds) and writes
   the summary (``replication.json``, shaped as issue 44 asks), a markdown table, a plot and the
   details (per-arm compute breakdown, commands).

Every arm shares the seeds, the SFT model and the validation's per-row random streams (``trainer.seed``,
step, prompt index: :mod:`stepcredit.rollout.sampling`), so the comparisons are paired seed by seed.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from stepcredit.config import Config
from stepcredit.errors import ConfigError, UserError
from stepcredit.recipes.stats import holm, paired_t, trapezoid_mean
from stepcredit.types import Sample

Purpose = Literal["confirm", "search"]
MIN_CONFIRM_SEEDS = 16
"""A confirmatory file (``purpose: confirm``) pairs at least this many seeds (issue 44)."""
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
    """Primary endpoint: the mean of this many last validations of each run."""
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
    known = {"name", "purpose", "baseline", "seeds", "arms", "endpoint", "final_greedy_prompts", "common",
             "sft_model", "sft", "notes"}  # fmt: skip
    for k in raw:
        if k not in known:
            raise _err(path, str(k), f"unknown; valid keys: {', '.join(sorted(known))}")
    seeds = raw.get("seeds")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise _err(path, "seeds", "expected a non-empty list of integers, fixed before the run")
    if len(set(seeds)) != len(seeds):
        raise _err(path, "seeds", "a seed is listed twice")
    arms_raw = raw.get("arms")
    if not isinstance(arms_raw, dict) or len(arms_raw) < 2:
        raise _err(path, "arms", "expected a mapping of at least two arms (name: {preset, overrides, ...})")
    arms = []
    arm_keys = {"preset", "overrides", "oracle", "placebo_of", "equal_compute_of"}
    for name, a in arms_raw.items():
        if not isinstance(a, dict) or not isinstance(a.get("preset"), str):
            raise _err(path, f"arms.{name}", "expected a mapping with a preset")
        for k in a:
            if k not in arm_keys:
                raise _err(path, f"arms.{name}.{k}", f"unknown; valid keys: {', '.join(sorted(arm_keys))}")
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
    baseline = raw.get("baseline")
    if baseline not in names:
        raise _err(path, "baseline", f"{baseline!r} is not an arm ({', '.join(names)})")
    purpose = raw.get("purpose", "confirm")
    if purpose not in ("confirm", "search"):
        raise _err(path, "purpose", "confirm or search")
    endpoint = raw.get("endpoint") or {}
    if not isinstance(endpoint, dict) or set(endpoint) - {"primary", "last"}:
        raise _err(path, "endpoint", "expected {primary: last_validations, last: N}")
    if endpoint.get("primary", "last_validations") != "last_validations":
        raise _err(
            path, "endpoint.primary", "the primary endpoint is last_validations (the mean of the last N)"
        )
    last = endpoint.get("last", 4)
    if not isinstance(last, int) or last < 1:
        raise _err(path, "endpoint.last", "a number of validations >= 1")
    fg = raw.get("final_greedy_prompts", 2000)
    if not isinstance(fg, int) or fg < 0:
        raise _err(path, "final_greedy_prompts", "a number of prompts >= 0")
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
        arms=tuple(arms),
        last=last,
        final_greedy_prompts=fg,
        common=_strs(path, "common", raw.get("common")),
        sft_model=str(raw.get("sft_model") or ""),
        sft={
            "preset": sft.get("preset"),
            "seed": int(sft.get("seed", 0)),
            "overrides": list(_strs(path, "sft.overrides", sft.get("overrides"))),
        },
    )


# ------------------------------------------------------------------------------------------ plan
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

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.out / arm / f"s{seed}"

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


def check(plan: Plan) -> dict[str, Config]:
    """Every arm's config (first seed), after the file's own checks: the runs validate the same way, the
    primary endpoint has its validations, the same seeds everywhere, and a confirmatory file has 16
    seeds, a placebo for every process-credit arm and an equal-compute arm for every costly one."""
    from stepcredit.process import VALUE_ESTIMATORS
    from stepcredit.trainer import check_config

    spec = plan.spec
    for ov in [*spec.common, *plan.extra, *(o for a in spec.arms for o in a.overrides)]:
        if ov.split("=", 1)[0].strip() in _FIXED:
            raise ConfigError(f"{spec.path}: override {ov}: the recipe sets {', '.join(_FIXED)} itself")
    cfgs = {a.name: plan.config(a, plan.run_seeds[0]) for a in spec.arms}
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
        if t.steps // t.val_every < spec.last:
            raise ConfigError(
                f"{spec.path}: arm {name}: {t.steps // t.val_every} validations after SFT, fewer than the "
                f"primary endpoint's last {spec.last} (endpoint.last)"
            )
    base = cfgs[spec.baseline]
    for name, cfg in cfgs.items():
        if cfg.data != base.data:
            raise ConfigError(
                f"{spec.path}: arm {name}: data.* differs from the baseline's: arms must share prompts"
            )
    for a in spec.arms:
        cfg = cfgs[a.name]
        if a.placebo_of is not None:
            target = cfgs[a.placebo_of]
            if cfg.process.placebo == "none" or not target.process.enabled:
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
    if set(plan.run_seeds) - set(spec.seeds):
        raise ConfigError(f"{spec.path}: --seeds: every seed run must be one of the file's ({spec.seeds})")
    if spec.purpose == "confirm":
        if len(spec.seeds) < MIN_CONFIRM_SEEDS:
            raise ConfigError(f"{spec.path}: seeds: a confirmatory file pairs >= {MIN_CONFIRM_SEEDS} seeds")
        for a in spec.arms:
            p = cfgs[a.name].process
            if not p.enabled or p.placebo != "none" or a.name == spec.baseline:
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
    return cfgs


# ------------------------------------------------------------------------------------------- run
def _job(*commands: list[str]) -> list[str]:
    """One subprocess that runs ``stepcredit`` commands in turn (train, then eval: one start-up, not two),
    stopping at the first that fails (:func:`stepcredit.cli.experiment.worker`)."""
    out = [sys.executable, "-m", "stepcredit.cli.experiment"]
    for c in commands:
        out += ["::", *c]
    return out


def _launch(cmd: list[str], log: Path, plan: Plan) -> int:
    """Run one command with its output in ``log``; a run past ``plan.timeout_s`` is killed (exit 124)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(plan.threads), RAY_AUTH_MODE="disabled")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            return subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=plan.timeout_s
            ).returncode
        except subprocess.TimeoutExpired:  # subprocess.run has killed the child
            f.write(f"\nkilled after {plan.timeout_s:.0f} s (--timeout)\n")
            return 124


def metrics_rows(run: Path) -> list[dict[str, Any]]:
    f = run / "metrics.jsonl"
    if not f.is_file():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def _trained(run: Path, steps: int) -> bool:
    rows = metrics_rows(run)
    return (
        any(r.get("step") == steps and "val/accuracy" in r for r in rows)
        and (run / "checkpoints" / "final" / "model" / "config.json").is_file()
    )


def run_one(plan: Plan, arm: Arm, seed: int, steps: int, log: Any) -> str | None:
    """Train one (arm, seed) and evaluate its final model greedily on the held-out prompts, in one
    subprocess; None when it finished (or had finished), else what failed."""
    run = plan.run_dir(arm.name, seed)
    done = run / "final_greedy.json"
    if done.is_file():
        return None
    commands = []
    if not _trained(run, steps):
        if run.exists():
            shutil.rmtree(run)  # cut short earlier: started over, so every run is one uninterrupted run
        commands.append(["train", "--preset", arm.preset, "--out", str(run), *plan.overrides(arm, seed)])
    greedy = run / "final_greedy.jsonl"
    if plan.spec.final_greedy_prompts > 0:
        commands.append(
            ["eval", "--model", str(run), "--data", str(plan.heldout), "--temperature", "0", "--no-progress",
             "--out", str(greedy), f"trainer.threads={plan.threads}"]
        )  # fmt: skip
    log(f"start {arm.name} seed {seed}")
    t0 = time.perf_counter()
    job_log = plan.out / "logs" / f"{arm.name}-s{seed}.log"
    code = _launch(_job(*commands), job_log, plan)
    if code != 0:
        return f"{arm.name} seed {seed}: exit {code} (log {job_log})"
    result: dict[str, Any] = {"accuracy": None, "prompts": 0}
    if plan.spec.final_greedy_prompts > 0:
        rows = [json.loads(line) for line in greedy.read_text().splitlines() if line.strip()]
        result = {"accuracy": sum(bool(r["correct"]) for r in rows) / len(rows), "prompts": len(rows)}
    result.update(commands=commands, wall_s=time.perf_counter() - t0)
    done.write_text(json.dumps(result) + "\n")
    log(f"done {arm.name} seed {seed} ({time.perf_counter() - t0:.0f} s)")
    return None


def write_heldout(plan: Plan, cfg: Config) -> None:
    """``final_greedy_prompts`` prompts of the validation distribution that neither validation nor
    training ever sees: the validation split's generator run past its ``data.val_size`` prompts (the
    ``arith`` tasks generate it row by row from one seeded stream, so the first ``val_size`` rows are
    validation's own), leaving out any prompt that is also a validation prompt or one of the training
    split's (the SFT model's full set, ``data.train_size`` of the default config, or the run's if larger)."""
    from stepcredit.config import DataConfig
    from stepcredit.data import load_task

    n = plan.spec.final_greedy_prompts
    if n == 0 or plan.heldout.is_file():
        return
    own = load_task(cfg.data)[1]
    train_size = max(cfg.data.train_size, DataConfig().train_size)
    train, val = load_task(replace(cfg.data, val_size=cfg.data.val_size + 2 * n, train_size=train_size))
    if [s.prompt for s in val[: len(own)]] != [s.prompt for s in own]:
        raise ConfigError(
            f"{plan.spec.path}: final_greedy_prompts: data.task={cfg.data.task} does not extend its validation "
            "split row by row, so no held-out prompts of the same distribution can be drawn (set it to 0)"
        )

    def text(s: Sample) -> str:
        return json.dumps(list(s.prompt), sort_keys=True)

    seen = {text(s) for s in train} | {text(s) for s in own}
    fresh: list[Sample] = []
    for s in val[len(own) :]:
        if text(s) not in seen and len(fresh) < n:
            fresh.append(s)
            seen.add(text(s))
    if len(fresh) < n:
        raise ConfigError(
            f"{plan.spec.path}: final_greedy_prompts: only {len(fresh)} of {n} held-out prompts differ from every "
            f"training and validation prompt of data.task={cfg.data.task}; ask for fewer"
        )
    rows: list[dict[str, Any]] = [
        {
            "data_source": s.data_source,
            "prompt": list(s.prompt),
            "ability": s.ability,
            "reward_model": {"style": s.style, "ground_truth": s.ground_truth},
            "extra_info": dict(s.extra_info) | {"tag": "heldout"},
        }
        for s in fresh
    ]
    plan.heldout.parent.mkdir(parents=True, exist_ok=True)
    tmp = plan.heldout.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    tmp.replace(plan.heldout)


def train_sft(plan: Plan, log: Any) -> None:
    """The SFT model every arm starts from, trained once (skipped when it exists)."""
    if (plan.sft_model / "config.json").is_file():
        return
    sft = plan.spec.sft
    out = plan.sft_model.parent
    cmd = _job(["sft", "--preset", sft["preset"], "--out", str(out), *sft["overrides"],
                f"trainer.seed={sft['seed']}", f"trainer.threads={plan.threads}", "trainer.progress=false"])  # fmt: skip
    log(f"SFT: {' '.join(cmd)}")
    code = _launch(cmd, plan.out / "logs" / "sft.log", plan)
    if code != 0 or not (plan.sft_model / "config.json").is_file():
        raise UserError(
            f"{plan.spec.path}: sft: the SFT run failed (exit {code}); see {plan.out / 'logs' / 'sft.log'}"
        )


def run_all(plan: Plan, jobs: int, log: Any = print) -> None:
    cfgs = check(plan)
    if not plan.spec.sft_model:
        train_sft(plan, log)
    write_heldout(plan, cfgs[plan.spec.baseline])
    todo = [(a, s) for s in plan.run_seeds for a in plan.spec.arms]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, plan, a, s, cfgs[a.name].trainer.steps, log) for a, s in todo]
        failed = [f for f in (fu.result() for fu in futures) if f]
    if failed:
        raise UserError(f"{len(failed)} of {len(todo)} runs failed; first: {failed[0]} (rerun to resume)")


# --------------------------------------------------------------------------------------- summary
@dataclass(frozen=True)
class RunResult:
    curve: list[float]
    steps: list[int]
    generated_tokens: float
    rollout_tokens: float
    process_tokens: float
    verifier_calls: float
    values: float
    seconds: float
    final_greedy: float | None


def read_run(run: Path) -> RunResult:
    """A finished run's validation curve (step 0 first) and compute: ``generated_tokens`` (the trainer's
    running total: rollouts plus process continuations) and the RL steps' seconds less validation's."""
    rows = metrics_rows(run)
    vals = [r for r in rows if "val/accuracy" in r]
    rl = [r for r in rows if r.get("step", 0) > 0 and "time/step_s" in r]
    if not vals or not rl:
        raise UserError(f"{run}: no finished run here (metrics.jsonl without validations or RL steps)")
    done = run / "final_greedy.json"
    fg = json.loads(done.read_text()).get("accuracy") if done.is_file() else None
    process = float(sum(r.get("process/generated_tokens", 0.0) for r in rl))
    return RunResult(
        curve=[float(r["val/accuracy"]) for r in vals],
        steps=[int(r["step"]) for r in vals],
        generated_tokens=float(rl[-1].get("generated_tokens", float("nan"))),
        rollout_tokens=float(sum(r.get("generated/step_tokens", float("nan")) for r in rl)) - process,
        process_tokens=process,
        verifier_calls=float(sum(r.get("process/verifier_calls", 0.0) for r in rl)),
        values=float(sum(r.get("process/values", 0.0) for r in rl)),
        seconds=float(sum(r["time/step_s"] - r.get("time/val_s", 0.0) for r in rl)),
        final_greedy=None if fg is None else float(fg),
    )


def _strict(x: Any) -> Any:
    """JSON without NaN: an undefined statistic is null."""
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_strict(v) for v in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def comparisons(spec: Spec, primary: dict[str, list[float]], kind: str) -> list[dict[str, Any]]:
    """Every arm against GRPO, against its equal-compute GRPO and against its placebo, paired by seed,
    on one endpoint; Holm's correction over the list (the family of that endpoint)."""
    pairs: list[tuple[str, str, str]] = []
    for a in spec.arms:
        if a.name != spec.baseline:
            pairs.append((a.name, spec.baseline, "grpo"))
        pairs += [(a.name, b.name, "equal_compute") for b in spec.arms if b.equal_compute_of == a.name]
        pairs += [(a.name, b.name, "placebo") for b in spec.arms if b.placebo_of == a.name]
    out = [
        {"arm": x, "against": y, "kind": k, "endpoint": kind, **paired_t(primary[x], primary[y])}
        for x, y, k in pairs
        if all(v is not None for v in primary[x] + primary[y])
    ]
    for c, p in zip(out, holm([c["p"] for c in out]), strict=True):
        c["p_holm"] = p
        c["significant_holm_05"] = bool(p <= 0.05) if p == p else False
    return out


def summarize(plan: Plan, cfgs: dict[str, Config]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the summary shaped as issue 44 asks, the details: compute breakdown, endpoints' own figures)."""
    spec = plan.spec
    res = {a.name: [read_run(plan.run_dir(a.name, s)) for s in plan.run_seeds] for a in spec.arms}
    base = cfgs[spec.baseline]
    kind = f"sampled at T={base.rollout.val_temperature:g}" if base.rollout.val_temperature > 0 else "greedy"
    endpoint = (
        f"mean of the last {spec.last} validations (val/accuracy, {kind}, {base.data.val_size} prompts every "
        f"trainer.val_every steps, per-row common random numbers keyed by (seed, step, prompt))"
    )
    arms: dict[str, Any] = {}
    primary: dict[str, list[float]] = {}
    greedy: dict[str, list[float | None]] = {}
    auc: dict[str, list[float]] = {}
    details: dict[str, Any] = {"arms": {}}
    for a in spec.arms:
        rs = res[a.name]
        primary[a.name] = [statistics.fmean(r.curve[-spec.last :]) for r in rs]
        greedy[a.name] = [r.final_greedy for r in rs]
        auc[a.name] = [trapezoid_mean(r.curve) for r in rs]
        arms[a.name] = {
            "oracle": a.oracle,
            "placebo_of": a.placebo_of,
            "equal_compute_of": a.equal_compute_of,
            "compute": {
                "generated_tokens": [r.generated_tokens for r in rs],
                "seconds": [r.seconds for r in rs],
            },
            "curves": [r.curve for r in rs],
            "primary": primary[a.name],
            "final_greedy": greedy[a.name],
        }
        details["arms"][a.name] = {
            "preset": a.preset,
            "overrides": [*spec.common, *a.overrides, *plan.extra],
            "steps": cfgs[a.name].trainer.steps,
            "val_every": cfgs[a.name].trainer.val_every,
            "validation_steps": rs[0].steps,
            "auc": auc[a.name],
            "rollout_tokens": [r.rollout_tokens for r in rs],
            "process_continuation_tokens": [r.process_tokens for r in rs],
            "process_verifier_calls": [r.verifier_calls for r in rs],
            "process_values": [r.values for r in rs],
        }
    # compute matching: an equal-compute arm's generated tokens over its costly arm's, seed by seed
    for a in spec.arms:
        if a.equal_compute_of is not None:
            mine, theirs = arms[a.name]["compute"], arms[a.equal_compute_of]["compute"]
            details["arms"][a.name]["token_ratio_to_costly_arm"] = [
                x / y if y else float("nan")
                for x, y in zip(mine["generated_tokens"], theirs["generated_tokens"], strict=True)
            ]
            details["arms"][a.name]["seconds_ratio_to_costly_arm"] = [
                x / y if y else float("nan") for x, y in zip(mine["seconds"], theirs["seconds"], strict=True)
            ]
    greedy_ok = {k: v for k, v in greedy.items()}
    comps = comparisons(spec, primary, "primary")
    if all(all(x is not None for x in v) for v in greedy_ok.values()):
        comps += comparisons(
            spec, {k: [float(x) for x in v if x is not None] for k, v in greedy_ok.items()}, "final_greedy"
        )
    comps += comparisons(spec, auc, "auc")
    summary = {"endpoint": endpoint, "seeds": list(plan.run_seeds), "arms": arms, "comparisons": comps}
    details.update(
        {
            "file": str(spec.path),
            "purpose": spec.purpose,
            "file_seeds": list(spec.seeds),
            "complete": list(plan.run_seeds) == list(spec.seeds) and not plan.extra,
            "baseline": spec.baseline,
            "sft_model": str(plan.sft_model),
            "final_greedy_prompts": spec.final_greedy_prompts,
            "command_line_overrides": list(plan.extra),
            "compute": "generated_tokens = tokens sampled from the policy: rollouts (a tree's shared prefixes once, "
            "dynamic sampling's refills included) + process continuations (monte_carlo, greedy_continuation), "
            "up to and including eos; forced-answer values generate nothing (one scoring pass per value: "
            "process_values) and verifier calls are counted apart (process_verifier_calls). seconds = the RL "
            "steps' wall time less validation's (time/step_s - time/val_s), on the machine and load of the run",
            "secondary": "final_greedy: greedy accuracy of the final model on the held-out prompts "
            "(comparisons with endpoint final_greedy); auc: the validation curve's trapezoid mean over the "
            "arm's own budget (step 0 to the last step; comparisons with endpoint auc)",
            "holm": "Holm's correction within each endpoint's comparisons; the primary family is the claim",
        }
    )
    return _strict(summary), _strict(details)


def markdown(summary: dict[str, Any], details: dict[str, Any]) -> str:
    def pm(xs: Sequence[float | None]) -> str:
        v = [x for x in xs if x is not None]
        if not v:
            return "-"
        se = statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else float("nan")
        return f"{100 * statistics.fmean(v):.2f} +- {100 * se:.2f}"

    lines = [
        f"Endpoint: {summary['endpoint']}; seeds {', '.join(map(str, summary['seeds']))}.",
        "",
        "| arm | role | primary (%) | final greedy (%) | AUC (%) | generated tokens / run | s / run |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, a in summary["arms"].items():
        role = "oracle" if a["oracle"] else ""
        role = f"placebo of {a['placebo_of']}" if a["placebo_of"] else role
        role = f"equal compute of {a['equal_compute_of']}" if a["equal_compute_of"] else role
        toks = [x for x in a["compute"]["generated_tokens"] if x is not None]
        secs = [x for x in a["compute"]["seconds"] if x is not None]
        lines.append(
            f"| {name} | {role or ('baseline' if name == details['baseline'] else '')} | {pm(a['primary'])} | "
            f"{pm(a['final_greedy'])} | {pm(details['arms'][name]['auc'])} | "
            f"{statistics.fmean(toks):,.0f} | {statistics.fmean(secs):.1f} |"
        )
    lines += [
        "",
        "| arm | against | kind | endpoint | diff (points) | 95 % CI | t | df | p | p (Holm) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(x: float | None, scale: float = 1.0, fmt: str = ".2f") -> str:
        return "-" if x is None else format(scale * x, fmt)

    for c in summary["comparisons"]:
        lo, hi = c["ci95"]
        lines.append(
            f"| {c['arm']} | {c['against']} | {c['kind']} | {c['endpoint']} | {f(c['mean_diff'], 100, '+.2f')} | "
            f"[{f(lo, 100, '+.2f')}, {f(hi, 100, '+.2f')}] | {f(c['t'])} | {c['df']} | {f(c['p'], fmt='.3g')} | "
            f"{f(c['p_holm'], fmt='.3g')} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], details: dict[str, Any], png: Path) -> None:
    """Per-seed (thin) and mean (thick) validation curves of every arm, against steps and against the
    fraction of the arm's own budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, (name, a) in enumerate(summary["arms"].items()):
        steps = details["arms"][name]["validation_steps"]
        frac = [s / max(1, steps[-1]) for s in steps]
        for c in a["curves"]:
            axes[0].plot(steps, c, color=f"C{i}", alpha=0.2, lw=0.8)
        mean = [statistics.fmean(col) for col in zip(*a["curves"], strict=True)]
        axes[0].plot(steps, mean, color=f"C{i}", lw=2.2, marker="o", ms=3, label=name)
        axes[1].plot(frac, mean, color=f"C{i}", lw=2.2, marker="o", ms=3, label=name)
    axes[0].set_xlabel("RL step")
    axes[1].set_xlabel("fraction of the arm's budget (equal-compute arms run more steps)")
    for ax in axes:
        ax.set_ylabel("validation accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{len(summary['seeds'])} seeds: per seed (thin) and mean (thick)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def write_outputs(plan: Plan, cfgs: dict[str, Config]) -> tuple[dict[str, Any], Path]:
    """The summary (``OUT/replication.json``), details, markdown table and plot; returns the summary."""
    summary, details = summarize(plan, cfgs)
    out = plan.out
    (out / "replication.json").write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    (out / "details.json").write_text(json.dumps(details, indent=1, allow_nan=False) + "\n")
    (out / "replication.md").write_text(markdown(summary, details))
    plot(summary, details, out / "curves.png")
    return summary, out / "replication.json"
