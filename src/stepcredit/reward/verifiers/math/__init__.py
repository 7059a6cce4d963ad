"""The math verifier: answer extraction, normalisation, an exact fast path, math-verify for LaTeX.

Scoring a response against a ground truth goes in three steps:

1. **Extraction** (:func:`extract_answer`): the text after the last ``</think>`` is searched for, in
   order of strength, the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces) or GSM8K's ``#### N``
   (whichever comes last; a later "The final answer is ..." wins over a box), then the last answer
   phrase (``Final answer: ...``, ``The answer is ...``, an ``Answer: ...`` line, GSM8K's ``A: 26``,
   "answer" followed by math). In ``flexible`` mode a response without any of these gives its last
   math expression (``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]``, as math-verify reads them),
   else the whole response when it is short math without delimiters, else its last number standing on
   its own; ``strict`` mode calls it unparseable, and an unfinished ``<think>`` block is unparseable too.
2. **Fast path** (:func:`fast_verdict`, with :mod:`~stepcredit.reward.verifiers.latex`): both answers are
   normalised (delimiters, units, ``%``, thousands separators, ``\\dfrac``, ``\\left``/``\\right`` ...)
   and read as structures (numbers compared exactly as :class:`fractions.Fraction`, constant closed
   forms as floats, relations, intervals, sets, tuples, matrices, lists of answers); the verdict is
   given where the structures make it certain. This decides GSM8K answers and most MATH answers
   without sympy.
3. **Slow path**: everything else goes to the ``math-verify`` library (``parse`` + ``verify``), which
   can hang on adversarial input; the :class:`~stepcredit.reward.run.rewarder.Rewarder` therefore runs it
   in the kill-safe pool. We never parse LaTeX into sympy ourselves.

The steps live apart: :mod:`.extract` (1, and :class:`Anchor`, how an answer was found), :mod:`.fast` (2),
:mod:`.mv` (3: the bridge to math-verify), :mod:`.score` (the verifier that runs them, and its registration).

The functions registered here follow VeRL's signature
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``.
"""

# the old module's names, re-exported (callers and tests import them from here)
from stepcredit.reward.verifiers.latex import normalize
from stepcredit.reward.verifiers.math.extract import (
    MODES,
    Anchor,
    extract_answer,
    extract_gold,
    last_boxed,
    last_math,
    last_number,
    strip_think,
)
from stepcredit.reward.verifiers.math.fast import fast_verdict
from stepcredit.reward.verifiers.math.mv import _mv_sure_false, math_verify_verdict
from stepcredit.reward.verifiers.math.mv_read import (
    _MV_REGEX_MAX_CHARS,
    _fitted_readings,
    _mv_first_number,
    _mv_group_matches,
    _mv_parse,
    _mv_parse_cached,
    _mv_parse_text,
    _plain_number,
    _reads_whole,
    disable_math_verify_timeouts,
)
from stepcredit.reward.verifiers.math.mv_sets import _set_reading
from stepcredit.reward.verifiers.math.score import _raw_golds, math_compute_score, math_fast, sure_candidate

__all__ = [
    "MODES",
    "_MV_REGEX_MAX_CHARS",
    "Anchor",
    "_fitted_readings",
    "_mv_first_number",
    "_mv_group_matches",
    "_mv_parse",
    "_mv_parse_cached",
    "_mv_parse_text",
    "_mv_sure_false",
    "_plain_number",
    "_raw_golds",
    "_reads_whole",
    "_set_reading",
    "disable_math_verify_timeouts",
    "extract_answer",
    "extract_gold",
    "fast_verdict",
    "last_boxed",
    "last_math",
    "last_number",
    "math_compute_score",
    "math_fast",
    "math_verify_verdict",
    "normalize",
    "strip_think",
    "sure_candidate",
]
