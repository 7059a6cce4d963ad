"""LaTeX answer normalisation and the exact comparisons of the math verifier's fast path.

Everything here is plain string and :class:`fractions.Fraction` work, no sympy: :func:`normalize`
rewrites an answer into one canonical spelling, :func:`parse_answer` reads that spelling as a
structure (number, bracketed sequence, set, matrix, relation, list of answers), and
:func:`compare` decides ``True``/``False`` where the structures make that certain, else ``None``
(the caller then asks math-verify). The rules follow math-verify 0.9.0's comparisons
(``math_verify/grader.py``: assignments compare by right-hand side, sets ignore order, tuples and
intervals do not, open and closed ends must match, floats compare rounded to 6 decimals); where we
deliberately differ, ``docs/verifiers.md`` says so and why.
"""

from stepcredit.reward.verifiers.latex.compare import compare_structures
from stepcredit.reward.verifiers.latex.normal import normalize
from stepcredit.reward.verifiers.latex.structures import (
    Matrix,
    Relation,
    Seq,
    Union,
    is_simple_lhs,
    parse_answer,
)
from stepcredit.reward.verifiers.latex.values import const_value, numbers_equal, to_complex, to_number

__all__ = [  # one module before it was split into normal -> values -> structures -> compare
    "Matrix",
    "Relation",
    "Seq",
    "Union",
    "compare_structures",
    "const_value",
    "is_simple_lhs",
    "normalize",
    "numbers_equal",
    "parse_answer",
    "to_complex",
    "to_number",
]
