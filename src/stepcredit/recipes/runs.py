"""Running an experiment: the SFT model once, the held-out prompts, then every (arm, seed) as
``stepcredit train`` + ``stepcredit eval`` in a subprocess with a real timeout; a run whose
``final_greedy.json`` exists is not run again (resume), a run cut short is started over. With an
archive (``--archive``) each finished run's record, the SFT model and the held-out prompts are copied
there as they finish, and restored from there first, so a file spread over machines that do not keep
their disks (a session's machine, a spot instance) resumes where the archive left off."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepcredit.config import Config
from stepcredit.errors import ConfigError, UserError
from stepcredit.recipes.plan import Plan, check
from stepcredit.recipes.spec import Arm
from stepcredit.types import Sample


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


def device_label(name: str) -> str:
    """The device ``trainer.device=name`` runs on here, as the summary records it: ``cpu``, or ``cuda``
    with the card's name (seconds compare only between runs on the same kind)."""
    import torch

    from stepcredit.trainer.state import resolve_device

    dev = resolve_device(name)
    return f"cuda ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else dev.type


RECORD = ("config.yaml", "metrics.jsonl", "validation.jsonl", "final_greedy.json")
"""The files of a finished run that the summary reads, archived in this order: ``final_greedy.json``,
the mark of a finished run, last (no checkpoints: the comparisons need none)."""


def _copy(src: Path, dst: Path) -> None:
    """Copy one file so that a reader never sees half of it (a temporary name, then a rename)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)


def _copy_record(src: Path, dst: Path) -> None:
    for name in RECORD:
        if (src / name).is_file():
            _copy(src / name, dst / name)


def _model_files(d: Path) -> dict[str, bytes]:
    return {str(f.relative_to(d)): f.read_bytes() for f in sorted(d.rglob("*")) if f.is_file()}


def archive_run(plan: Plan, arm: str, seed: int) -> None:
    """Copy one finished run's record into the archive (nothing without one, or when it is there)."""
    if plan.archive is None or not plan.done(arm, seed):
        return
    dst = plan.archive / arm / f"s{seed}"
    if not (dst / "final_greedy.json").is_file():
        _copy_record(plan.run_dir(arm, seed), dst)


def archive_shared(plan: Plan) -> None:
    """Copy the SFT model the runs start from and the held-out prompts into the archive, once."""
    a = plan.archive
    if a is None:
        return
    if not plan.spec.sft_model and (plan.sft_model / "config.json").is_file():
        model = a / "sft" / "model"
        if not (model / "config.json").is_file():
            tmp = model.with_name("model.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(plan.sft_model, tmp)
            shutil.rmtree(model, ignore_errors=True)
            tmp.rename(model)
    if plan.heldout.is_file() and not (a / "heldout.jsonl").is_file():
        _copy(plan.heldout, a / "heldout.jsonl")


def restore(plan: Plan) -> int:
    """Copy into ``plan.out`` what the archive holds and it lacks: the SFT model, the held-out prompts and
    every finished run's record; the number of runs restored. An SFT model in both that differs ends in
    one line (the runs of one file start from one model)."""
    a = plan.archive
    if a is None or not a.is_dir():
        return 0
    if a.resolve() == plan.out.resolve():
        raise UserError(f"--archive {a}: the archive must be another directory than --out")
    model = a / "sft" / "model"
    if not plan.spec.sft_model and (model / "config.json").is_file():
        if not (plan.sft_model / "config.json").is_file():
            shutil.copytree(model, plan.sft_model, dirs_exist_ok=True)
        elif _model_files(model) != _model_files(plan.sft_model):
            raise UserError(
                f"--archive {a}: its SFT model differs from {plan.sft_model}; the runs of one file start from "
                "one model (use another --out, or the archive's model)"
            )
    if (a / "heldout.jsonl").is_file() and not plan.heldout.is_file():
        _copy(a / "heldout.jsonl", plan.heldout)
    n = 0
    for arm in [*(x.name for x in plan.spec.arms), *plan.left_out]:
        for seed in plan.spec.seeds:
            src = a / arm / f"s{seed}"
            if (src / "final_greedy.json").is_file() and not plan.done(arm, seed):
                run = plan.run_dir(arm, seed)
                if run.exists():
                    shutil.rmtree(run)  # a run cut short here: the archive's finished one replaces it
                _copy_record(src, run)
                n += 1
    return n


def code_version() -> str:
    """The code a run starts with: the last git commit that changed the package (commits of docs or of
    an archive's runs leave it alone; ``+dirty`` when its tracked files differ from that), else the
    installed version. A file run over sessions records it per run, so a seed whose arms ran on
    different code is named in the summary."""
    from importlib.metadata import PackageNotFoundError, version

    src = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "log", "-1", "--format=%h", "--abbrev=12", "--", str(src)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if head.returncode == 0 and head.stdout.strip():
            dirty = subprocess.run(
                ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "--", str(src)],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"stepcredit {version('stepcredit')}"
    except PackageNotFoundError:
        return "unknown"


def run_one(plan: Plan, arm: Arm, seed: int, cfg: Config, log: Any) -> str | None:
    """Train one (arm, seed) and evaluate its final model greedily on the held-out prompts, in one
    subprocess; None when it finished (or had finished), else what failed."""
    run = plan.run_dir(arm.name, seed)
    done = run / "final_greedy.json"
    if plan.done(arm.name, seed):
        archive_run(plan, arm.name, seed)
        return None
    steps = cfg.trainer.steps
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
    code = code_version()  # what the subprocess imports now
    t0 = time.perf_counter()
    job_log = plan.out / "logs" / f"{arm.name}-s{seed}.log"
    exit_code = _launch(_job(*commands), job_log, plan)
    if exit_code != 0:
        return f"{arm.name} seed {seed}: exit {exit_code} (log {job_log})"
    result: dict[str, Any] = {"accuracy": None, "prompts": 0}
    if plan.spec.final_greedy_prompts > 0:
        rows = [json.loads(line) for line in greedy.read_text().splitlines() if line.strip()]
        result = {"accuracy": sum(bool(r["correct"]) for r in rows) / len(rows), "prompts": len(rows)}
    result.update(
        commands=commands, wall_s=time.perf_counter() - t0, device=device_label(cfg.trainer.device), code=code
    )
    done.write_text(json.dumps(result) + "\n")
    archive_run(plan, arm.name, seed)
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
    restored = restore(plan)
    if restored:
        log(f"restored {restored} finished runs from the archive {plan.archive}")
    if not plan.spec.sft_model:
        train_sft(plan, log)
    write_heldout(plan, cfgs[plan.spec.baseline])
    archive_shared(plan)
    todo = [(a, s) for s in plan.run_seeds for a in plan.spec.arms]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(run_one, plan, a, s, cfgs[a.name], log) for a, s in todo]
        failed = [f for f in (fu.result() for fu in futures) if f]
    if failed:
        raise UserError(f"{len(failed)} of {len(todo)} runs failed; first: {failed[0]} (rerun to resume)")
