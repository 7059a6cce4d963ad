"""Multi-domain data: each domain's samples (tagged with its name and tag) and the interleaved
prompt stream whose per-step composition follows ``data.domain_interleave_probs`` exactly.

A step of ``k`` prompts takes ``floor(p_d * k)`` from every domain but the last, which takes the
remainder (ROLL's rule), each from its own seeded, epoch-shuffled :class:`PromptStream`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from stepcredit.config import DataConfig
from stepcredit.data import TASKS, PromptStream, load_task
from stepcredit.errors import ConfigError
from stepcredit.types import Sample


def domain_counts(probs: list[float], k: int) -> list[int]:
    """Prompts per domain in a step of ``k``: floor of each share, the remainder to the last domain."""
    # 1e-9 so that a share like 0.29 * 100 = 28.999999999999996 floors to 29, not 28
    counts = [int(p * k + 1e-9) for p in probs[:-1]]
    counts.append(k - sum(counts))
    if counts[-1] < 0:
        raise ValueError(f"shares {probs} give more than {k} prompts")
    return counts


def load_domains(cfg: DataConfig) -> dict[str, tuple[list[Sample], list[Sample]]]:
    """(train, validation) samples of every domain of ``cfg.domains``, each row carrying its domain
    name and tag."""
    out: dict[str, tuple[list[Sample], list[Sample]]] = {}
    for name, d in cfg.domains.items():
        task = d.task or "files"
        if task not in TASKS:
            raise ConfigError(
                f"config key data.domains.{name}.task: unknown task {task!r} (valid: {', '.join(TASKS.names())})"
            )
        sub = dataclasses.replace(
            cfg,
            task=task,
            train_files=d.train_files,
            val_files=d.val_files,
            domains={},
            domain_interleave_probs={},
        )
        train, val = TASKS.get(task)(sub)
        if not train:
            raise ConfigError(f"config key data.domains.{name}: the domain has no training rows")
        out[name] = (
            [s.with_(domain=name, tag=d.tag or s.tag) for s in train],
            [s.with_(domain=name, tag=d.tag or s.tag) for s in val],
        )
    return out


class MixedStream:
    """One :class:`PromptStream` per domain; ``take(k)`` returns each domain's exact share, in domain order."""

    def __init__(self, train_sets: dict[str, list[Sample]], probs: dict[str, float], seed: int) -> None:
        self.names = list(train_sets)
        shares = probs or {d: 1.0 / len(self.names) for d in self.names}
        self.probs = [shares[d] for d in self.names]
        # every domain its own seed, so adding a domain does not reorder the others' prompts
        self.streams = {
            d: PromptStream(s, seed=seed + 7_919 * i) for i, (d, s) in enumerate(train_sets.items())
        }

    def take(self, k: int) -> list[Sample]:
        out: list[Sample] = []
        for d, n in zip(self.names, domain_counts(self.probs, k), strict=True):
            out.extend(self.streams[d].take(n))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {d: s.state_dict() for d, s in self.streams.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for d, s in self.streams.items():
            s.load_state_dict(state[d])


def build_data(
    cfg: DataConfig, *, seed: int
) -> tuple[list[Sample], list[Sample], PromptStream | MixedStream]:
    """(all training samples, all validation samples, the prompt stream) of a single- or multi-domain run."""
    if not cfg.domains:
        train, val = load_task(cfg)
        return train, val, PromptStream(train, seed=seed)
    sets = load_domains(cfg)
    train = [s for tr, _ in sets.values() for s in tr]
    val = [s for _, va in sets.values() for s in va]
    return (
        train,
        val,
        MixedStream({d: tr for d, (tr, _) in sets.items()}, dict(cfg.domain_interleave_probs), seed),
    )


def check_routes(samples: list[Sample], route: Any) -> None:
    """Every (domain, tag, data_source) of the data has a reward route (``route`` is ``Rewarder.route``);
    else a ConfigError naming the domain and tag. A route's ``validate`` check (e.g. IFEval's known
    instruction ids) runs on every row: a UserError naming the row."""
    seen: set[tuple[str, str, str, str, str]] = set()
    for s in samples:
        key = (s.domain, s.tag, s.data_source, s.ability, s.style)
        if key not in seen:
            seen.add(key)
            try:
                route(s)
            except ConfigError as e:
                raise ConfigError(
                    f"data domain {s.domain!r}, tag {s.tag!r} (data_source {s.data_source!r}) has no reward route: "
                    f"map it in reward.domains / reward.tag_domains ({e})"
                ) from None
        validate = getattr(getattr(route(s), "entry", None), "validate", None)
        if validate is not None:
            validate(s)
