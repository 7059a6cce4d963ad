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

The recipe's parts, one module each: :mod:`.spec` (the file and its own checks), :mod:`.plan` (where the
runs go, every arm's config checked), :mod:`.runs` (the subprocesses, resume, held-out prompts),
:mod:`.summary` (the summary, the table and the plot). This module keeps their public names together.
"""

from __future__ import annotations

from stepcredit.recipes.plan import Plan, check, only_arms
from stepcredit.recipes.runs import (
    RECORD,
    archive_run,
    archive_shared,
    metrics_rows,
    restore,
    run_all,
    run_one,
    train_sft,
    write_heldout,
)
from stepcredit.recipes.spec import MIN_CONFIRM_SEEDS, Arm, Purpose, Spec, load_spec
from stepcredit.recipes.summary import (
    RunResult,
    comparisons,
    markdown,
    plot,
    read_run,
    summarize,
    write_outputs,
)

__all__ = [
    "MIN_CONFIRM_SEEDS",
    "RECORD",
    "Arm",
    "Plan",
    "Purpose",
    "RunResult",
    "Spec",
    "archive_run",
    "archive_shared",
    "check",
    "comparisons",
    "load_spec",
    "markdown",
    "metrics_rows",
    "only_arms",
    "plot",
    "read_run",
    "restore",
    "run_all",
    "run_one",
    "summarize",
    "train_sft",
    "write_heldout",
    "write_outputs",
]
