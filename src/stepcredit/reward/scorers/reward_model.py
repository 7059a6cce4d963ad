"""Reward models: Hugging Face sequence- or token-classification models with a single label.

Rows with ``reward_model.style: model`` route here. The prompt (chat messages rendered with the
tokenizer's chat template, with the generation prompt) and the response are tokenized separately and
concatenated, so the response's tokens are known exactly; a too-long input loses prompt tokens from the
left first. Text is text: the response, and the content of the prompt's messages, are encoded with
special-token strings split (``<|end|>`` in a response is six characters' tokens, never the control
token), so a response cannot end its turn or open a new one; only the chat template's own markup
yields special tokens. Batches are left-padded with explicit ``position_ids`` (so padding does not change a score)
and the model's ``pad_token_id`` is hidden during the forward pass, so a sequence model pools the last
position, which is the last valid token even when that token is the eos/pad id.

The score is that of the last valid token (a sequence model's pooled logit, or a token model's
logit at the last token): the outcome channel. Per-token scores are not returned: they are on the
reward model's tokenizer, and step credit comes from the process stage instead.

``worker: process`` runs the model in its own spawned process (its own device and thread count), so
it does not compete with the policy; a crashed or hung worker gives typed ``error``/``timeout`` results.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing as mp
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from stepcredit.config import RewardModelConfig
from stepcredit.errors import ConfigError
from stepcredit.types import RewardResult, Sample, Status

WORKER_TIMEOUT_S = 600.0
"""Longest a worker may take for one batch before its results are ``timeout`` and it is restarted."""


def special_token_strings(tok: Any) -> list[str]:
    """Every string the tokenizer would read as a special (control) token."""
    added = getattr(tok, "added_tokens_decoder", None) or {}
    out = {getattr(t, "content", str(t)) for t in added.values() if getattr(t, "special", False)}
    out.update(getattr(tok, "all_special_tokens", None) or [])
    return sorted(x for x in out if x)


def encode_text(tok: Any, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """Token ids of ``text`` with any special-token strings in it encoded as ordinary text
    (``add_special_tokens`` only adds the tokenizer's own bos/eos around it)."""
    return list(tok(text, add_special_tokens=add_special_tokens, split_special_tokens=True)["input_ids"])


def _kind_of(config: Any, kind: str) -> str:
    """``reward.reward_model.kind``, with ``auto`` read from the model's architecture."""
    match kind:
        case "auto":
            archs = getattr(config, "architectures", None) or []
            return "token" if any(a.endswith("ForTokenClassification") for a in archs) else "sequence"
        case _:
            return kind


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # AutoTokenizer may swap a custom fast tokenizer for a slow class that drops spaces (see NOTES).
    tj = Path(path) / "tokenizer.json"
    tok = (
        PreTrainedTokenizerFast.from_pretrained(path) if tj.exists() else AutoTokenizer.from_pretrained(path)
    )
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


class RewardModel:
    """A loaded reward model that scores (prompt, response) pairs in batches."""

    def __init__(self, cfg: RewardModelConfig, *, model: Any = None, tokenizer: Any = None) -> None:
        self.cfg = cfg
        if model is None:
            model, tokenizer = self._load(cfg)
        self.model = model
        self.tok = tokenizer
        self.kind = _kind_of(model.config, cfg.kind)
        if getattr(model.config, "num_labels", 1) != 1:
            raise ConfigError(
                f"reward_model.path {cfg.path}: the model has {model.config.num_labels} labels, expected 1"
            )

    @staticmethod
    def _load(cfg: RewardModelConfig) -> tuple[Any, Any]:
        from transformers import (
            AutoConfig,
            AutoModelForSequenceClassification,
            AutoModelForTokenClassification,
        )

        if not cfg.path or not os.path.isdir(cfg.path):
            raise ConfigError(f"reward.reward_model.path {cfg.path!r}: not a model directory")
        try:
            config = AutoConfig.from_pretrained(cfg.path)
            if getattr(config, "num_labels", 1) != 1:
                raise ConfigError(
                    f"reward.reward_model.path {cfg.path}: the model has {config.num_labels} labels, expected 1"
                )
            heads = {"token": AutoModelForTokenClassification, "sequence": AutoModelForSequenceClassification}
            auto = heads[_kind_of(config, cfg.kind)]
            model = auto.from_pretrained(cfg.path)
            tok = _load_tokenizer(cfg.path)
        except (OSError, ValueError, RuntimeError) as e:
            raise ConfigError(
                f"reward.reward_model.path {cfg.path}: cannot load the reward model: {e}"
            ) from None
        model.to(cfg.device).eval()
        return model, tok

    # --------------------------------------------------------------------------------- encoding
    def render_prompt(self, prompt: Sequence[dict[str, str]] | str) -> list[int]:
        """Token ids of the prompt: the chat template (with generation prompt) when there is one; the
        messages' content is text (its special-token strings are never control tokens)."""
        if isinstance(prompt, str):
            return encode_text(self.tok, prompt, add_special_tokens=True)
        if getattr(self.tok, "chat_template", None):
            specials = special_token_strings(self.tok)
            if any(x in str(m.get("content", "")) for m in prompt for x in specials):
                return self._render_chat_as_text(list(prompt))
            # No special-token text in the content: the template's ids exactly, as before.
            ids = self.tok.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return list(ids)
        text = "\n".join(m.get("content", "") for m in prompt) + "\n"
        return encode_text(self.tok, text, add_special_tokens=True)

    def _render_chat_as_text(self, messages: list[dict[str, str]]) -> list[int]:
        # The template is rendered around placeholders; its own text (and special tokens) is tokenized
        # as the template wrote it, each message's content separately as plain text.
        contents = [str(m.get("content", "")) for m in messages]
        nonce = secrets.token_hex(8)
        while any(nonce in c for c in contents):
            nonce = secrets.token_hex(8)
        holes = [{**m, "content": f"STEPCREDITHOLE{nonce}N{i}E"} for i, m in enumerate(messages)]
        rendered = self.tok.apply_chat_template(holes, add_generation_prompt=True, tokenize=False)
        ids: list[int] = []
        pos = 0
        for m in re.finditer(f"STEPCREDITHOLE{nonce}N(\\d+)E", rendered):
            ids += self.tok(rendered[pos : m.start()], add_special_tokens=False)["input_ids"]
            ids += encode_text(self.tok, contents[int(m.group(1))])
            pos = m.end()
        ids += self.tok(rendered[pos:], add_special_tokens=False)["input_ids"]
        return ids

    def _encode(self, prompt: Sequence[dict[str, str]] | str, response: str) -> tuple[list[int], int]:
        p = self.render_prompt(prompt)
        r = encode_text(self.tok, response)
        limit = self.cfg.max_length
        r = r[: limit - 1] if len(r) >= limit else r  # keep at least one prompt token
        p = p[max(0, len(p) - (limit - len(r))) :]
        return p + r, len(r)

    # ---------------------------------------------------------------------------------- scoring
    def score(
        self, prompts: Sequence[Sequence[dict[str, str]] | str], responses: Sequence[str]
    ) -> list[RewardResult]:
        """One result per response: ``score`` at the last valid token."""
        import torch

        out: list[RewardResult] = []
        encoded = [self._encode(p, r) for p, r in zip(prompts, responses, strict=True)]
        bs = self.cfg.batch_size
        for start in range(0, len(encoded), bs):
            chunk = encoded[start : start + bs]
            t0 = time.monotonic()
            width = max(len(ids) for ids, _ in chunk)
            pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
            ids_BT = torch.full((len(chunk), width), pad, dtype=torch.long)
            mask_BT = torch.zeros((len(chunk), width), dtype=torch.long)
            for b, (ids, _) in enumerate(chunk):
                ids_BT[b, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                mask_BT[b, width - len(ids) :] = 1
            pos_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
            device = next(self.model.parameters()).device
            saved_pad = self.model.config.pad_token_id
            # Sequence models pool "the last non-pad token"; with left padding that is the last
            # position, which an eos == pad at the end must not hide.
            self.model.config.pad_token_id = -1
            try:
                with torch.no_grad():
                    logits = self.model(
                        input_ids=ids_BT.to(device),
                        attention_mask=mask_BT.to(device),
                        position_ids=pos_BT.to(device),
                    ).logits.float()
            finally:
                self.model.config.pad_token_id = saved_pad
            dt = (time.monotonic() - t0) / len(chunk)
            for b in range(len(chunk)):
                info: dict[str, Any] = {"kind": self.kind}
                match self.kind:
                    case "token":  # the head's output at the last token
                        score = float(logits[b, -1, 0])
                    case _:
                        score = float(logits[b].reshape(-1)[0])
                out.append(
                    RewardResult(
                        score=score, status=Status.OK, info=info, latency_s=dt, source="reward_model"
                    )
                )
        return out


# -------------------------------------------------------------------------------- worker process
def _worker_main(cfg: RewardModelConfig, conn: Any) -> None:
    import torch

    torch.set_num_threads(max(1, cfg.threads))
    try:
        rm = RewardModel(cfg)
        conn.send((True, None))  # (ok, payload): loaded
    except Exception as e:
        conn.send((False, f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        prompts, responses = msg
        try:
            conn.send((True, [r.to_json() for r in rm.score(prompts, responses)]))
        except Exception as e:
            conn.send((False, f"{type(e).__name__}: {e}"))


class RewardModelWorker:
    """The reward model in its own spawned process; ``score`` has the same contract as RewardModel's."""

    def __init__(self, cfg: RewardModelConfig, *, timeout_s: float = WORKER_TIMEOUT_S) -> None:
        self.cfg = cfg
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_worker_main, args=(self.cfg, child), daemon=True, name="stepcredit-reward-model"
        )
        proc.start()
        child.close()
        if not parent.poll(self.timeout_s):
            proc.kill()
            raise ConfigError(f"reward model worker did not load {self.cfg.path} within {self.timeout_s:g}s")
        try:
            ok, payload = parent.recv()
        except EOFError:
            ok, payload = False, f"the worker died while loading (exit code {proc.exitcode})"
        if not ok:
            proc.join(5)
            raise ConfigError(f"reward.reward_model.path {self.cfg.path}: {payload}")
        self._proc, self._conn = proc, parent

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[RewardResult]:
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            t0 = time.monotonic()
            try:
                self._conn.send(([p if isinstance(p, str) else list(p) for p in prompts], list(responses)))
                if not self._conn.poll(self.timeout_s):
                    self.close()
                    return [
                        RewardResult.failure(
                            Status.TIMEOUT, f"reward model took longer than {self.timeout_s:g}s"
                        )
                        for _ in responses
                    ]
                ok, payload = self._conn.recv()
            except (EOFError, OSError, BrokenPipeError) as e:
                self.close()
                return [
                    RewardResult.failure(Status.ERROR, f"reward model worker died: {e!r}") for _ in responses
                ]
            if not ok:
                return [
                    RewardResult.failure(Status.ERROR, f"reward model failed: {payload}") for _ in responses
                ]
            dt = (time.monotonic() - t0) / max(1, len(responses))
            return [
                RewardResult(
                    score=float(d["score"]),
                    status=Status.OK,
                    info=d["info"],
                    latency_s=dt,
                    source="reward_model",
                )
                for d in payload
            ]

    def close(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(None)
            self._proc.join(2)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(2)
            self._proc = self._conn = None


WORKERS: dict[str, Callable[[RewardModelConfig], RewardModel | RewardModelWorker]] = {
    "inline": RewardModel,
    "process": RewardModelWorker,
}
"""``reward.reward_model.worker`` -> where the model runs: in the calling process, or in its own worker process."""


@functools.lru_cache(maxsize=4)
def get_reward_model(cfg: RewardModelConfig) -> RewardModel | RewardModelWorker:
    """The process-wide reward model of a configuration (loaded once)."""
    return WORKERS[cfg.worker](cfg)


class RewardModelScorer:
    """The rewarder's scorer for rows with ``reward_model.style: model`` (the model loads on first use)."""

    def __init__(self, cfg: RewardModelConfig) -> None:
        if not cfg.path:
            raise ConfigError(
                "rows with reward_model.style=model need reward.reward_model.path (a model directory)"
            )
        self.cfg = cfg
        self._rm: RewardModel | RewardModelWorker | None = None

    def score_batch(self, samples: list[Sample], responses: list[str]) -> list[RewardResult]:
        if self._rm is None:
            self._rm = WORKERS[self.cfg.worker](self.cfg)
        try:
            return self._rm.score([s.prompt for s in samples], responses)
        except ConfigError:
            raise
        except Exception as e:
            msg = f"reward model: {type(e).__name__}: {e}"
            return [RewardResult.failure(Status.ERROR, msg, source="reward_model") for _ in samples]

    def close(self) -> None:
        if isinstance(self._rm, RewardModelWorker):
            self._rm.close()
        self._rm = None


def _register() -> None:
    from stepcredit.reward.base import register_scorer

    @register_scorer("model", "reward_model")
    def make_reward_model_scorer(cfg: Any) -> RewardModelScorer:
        return RewardModelScorer(cfg.reward_model)


_register()
