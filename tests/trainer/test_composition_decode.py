"""The compiled decode step composes: ``rollout.decode_compile`` through ``stepcredit train`` on each
rollout mode (flat, tree with tree values, multi-turn tool calls), with LoRA adapters merged for
generation (``model.lora.merge_for_generation``) or beside the weights, and each thread setting
(``trainer.threads``, ``STEPCREDIT_THREADS`` over it). Kept apart from the pairwise runs of
tests/trainer/test_composition.py because every batch shape the static step meets is a compilation of
its own; the switches' other pairs are covered there. The engine compiles with ``aot_eager`` here, as
tests/models/test_decode_step.py does: dynamo traces the step into the graph inductor would compile on
a GPU and runs it, in about a second per shape instead of a C++ build of tens of seconds (the three runs
took minutes with inductor on this CPU).

Checked per run: it finishes its 2 steps, every rollout decode ran the compiled step, the adapters were
merged for every decode exactly when asked, torch runs the configured threads, no sample is lost and
the tool runs called tools. Combinations that cannot work (the loop's switches with an engine that does
not run it; a thread count that is no number) stop at start-up with one line.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TOY_PARSER = "composition_every_other_turn"  # registered by tests/trainer/conftest.py


SMALL_RUN = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.intermediate_size=64", "data.train_size=64", "data.val_size=4", "sft.steps=2",
    "sft.batch_size=8", "rollout.prompts_per_step=2", "rollout.n=4", "rollout.max_new_tokens=16",
    "optim.lr=0.001", "optim.warmup_steps=0", "trainer.steps=2", "trainer.val_every=0",
    "trainer.save_every=0", "trainer.progress=false", "trainer.tensorboard=false", "model.lora.rank=8",
    "rollout.decode_compile=default", "reward.agent.backend=thread",
]  # fmt: skip
"""``stepcredit train`` overrides of a 2-step run with LoRA adapters and the compiled decode step (small
batches: each batch shape the static step meets is one compilation). Rewards are scored in threads, as in
tests/trainer/test_composition.py: a process pool would start its workers anew in every run."""

TOOLS_RUN = [
    "rollout.mode=tools", "data.task=arith_tools", f"rollout.tools.parser={TOY_PARSER}",
    "rollout.tools.max_turns=2", "rollout.max_new_tokens=28",  # results count in the length budget
]  # fmt: skip
TREE_VALUES = ["process.enabled=true", "process.value_estimator=tree", "process.min_episode_tokens=1"]

DECODE_RUNS: dict[str, tuple[list[str], Any]] = {
    # name: (overrides, threads level); LoRA + merged for generation + tree mode with tree values
    "flat-merged": (["rollout.mode=flat"], "env"),
    "tree-merged-tree_values": (["rollout.mode=tree", *TREE_VALUES, "algorithm.advantage=grpo_vineppo"], 1),
    "tools-unmerged": ([*TOOLS_RUN, "model.lora.merge_for_generation=false"], 2),
}
"""The compiled decode step (``rollout.decode_compile``) on each rollout mode, with LoRA adapters merged
for generation or beside the weights, and each ``threads`` level."""


@pytest.mark.parametrize("name", list(DECODE_RUNS))
def test_the_compiled_decode_step_composes_through_the_command_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: Callable[[Any], int]
) -> None:
    import functools

    import torch

    import stepcredit.rollout.engines.hf as hf
    import stepcredit.rollout.sampling as sampling
    from stepcredit.cli.main import main
    from stepcredit.models.decode_step import DecodeOptions

    overrides, level = DECODE_RUNS[name]
    want_threads = threads(level)
    steps: list[bool] = []  # per decode: the static step compiled in the configured mode ran it
    merged: list[int] = []  # per decode with merging on: the LoRA layers merged for it
    static_step, adapters_merged = sampling.static_step, sampling.adapters_merged

    def spy_step(*args: Any) -> Any:
        step = static_step(*args)
        steps.append(step is not None and args[-1].compile == "default")
        return step

    @contextlib.contextmanager
    def spy_merge(model: Any) -> Iterator[int]:
        with adapters_merged(model) as n:
            merged.append(n)
            yield n

    monkeypatch.setattr(hf, "DecodeOptions", functools.partial(DecodeOptions, backend="aot_eager"))
    monkeypatch.setattr(sampling, "static_step", spy_step)
    monkeypatch.setattr(sampling, "adapters_merged", spy_merge)
    trainer_threads = "trainer.threads=1" if level == 1 else "trainer.threads=2"
    assert main(["train", *SMALL_RUN, trainer_threads, *overrides, "--out", str(tmp_path)]) == 0
    assert torch.get_num_threads() == want_threads
    assert steps and all(steps)  # every rollout decode ran the compiled step over the static cache
    if "model.lora.merge_for_generation=false" in overrides:
        assert not merged
    else:
        assert merged and all(n > 0 for n in merged)  # the adapters were merged for every decode
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r["samples/generated"] == r["samples/trained"] + r["samples/dropped"] for r in trained)
    assert all(math.isfinite(r["loss"]) for r in trained if r["samples/trained"] > 0)
    if name.startswith("tools"):  # tools were called (the toy convention: about every other turn)
        assert any(r.get("tools/calls_per_response", 0.0) > 0 for r in trained)


def test_decode_switches_an_engine_cannot_honour_fail_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepcredit.cli.main import main
    from stepcredit.runtime import THREADS_ENV

    # vLLM runs its own decode (fed merged weights): neither switch of stepcredit's loop applies there.
    # Refused before SFT, and before the engine's package is looked for (a conflict whatever is installed)
    unmerged = ["rollout.decode_compile=off", "model.lora.merge_for_generation=false"]
    for switches, key in (
        ([], r"rollout\.decode_compile: default compiles"),  # SMALL_RUN compiles the decode step
        (unmerged, r"model\.lora\.merge_for_generation: rollout\.engine=vllm"),
    ):
        argv = ["train", *SMALL_RUN, "rollout.engine=vllm", *switches, "--out", str(tmp_path / "r")]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(f"error: config key {key}", err), err
        assert not (tmp_path / "r" / "checkpoints").exists()  # nothing ran
    # a thread count that is no number: one line naming the variable
    monkeypatch.setenv(THREADS_ENV, "two")
    assert main(["train", *SMALL_RUN, "--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "STEPCREDIT_THREADS='two': expected an integer" in err, err
