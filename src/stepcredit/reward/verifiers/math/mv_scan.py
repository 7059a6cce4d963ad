"""Every answer math-verify could read in a response, in its order: "incorrect" without its parser when
each of them surely differs from the gold."""

from __future__ import annotations

import re

from stepcredit.reward.verifiers.latex import Relation, parse_answer
from stepcredit.reward.verifiers.latex import normalize as _normalize
from stepcredit.reward.verifiers.math.extract import extract_gold
from stepcredit.reward.verifiers.math.fast import fast_verdict
from stepcredit.reward.verifiers.math.mv_read import (
    _chain_tail,
    _mv_const,
    _mv_group_matches,
    _mv_pattern_groups,
    _plain_number,
)

_RELATION_CHARS_RE = re.compile(r"=|<|>|\\[lg]eq?(?![a-zA-Z])|\\neq?(?![a-zA-Z])|\\in(?![a-zA-Z])|≤|≥|≠")


def _readings(m: re.Match[str], is_latex: bool) -> list[str] | None:
    """The texts math-verify parses for one match of its extraction regexes (``extract_match``): each
    LaTeX environment of it, or the number it builds (``extract_expr``: separators dropped, a decimal
    comma read as a point), or the expression; None when a percent sign or a box takes part (read by
    other rules) or a match holds several environments whose union could be a set (``$1$ and $2$``)."""
    groups = {k: v for k, v in m.groupdict().items() if v is not None}
    if any("percent" in k for k in groups):
        return None
    if is_latex:
        latex = [v for k, v in groups.items() if "_latex" in k]
        if any(k.endswith("latexBoxed") for k in groups) or not latex:
            return None
        if len(latex) > 1:
            # its FiniteSet of the parts, compared with a gold set: our list reading of the parts
            return [*latex, ", ".join(latex)]
        return latex
    if "expr" in groups:
        return [groups["expr"]]
    integer = next((v for k, v in groups.items() if k.startswith("integer") and v), "")
    decimal = next((v for k, v in groups.items() if k.startswith("decimal") and v), "")
    integer = integer.translate(str.maketrans("", "", ", ")).lstrip("0") or "0"
    return [integer + decimal.replace(",", ".")]


def _surely_parses(m: re.Match[str], is_latex: bool, texts: list[str]) -> bool:
    """Whether math-verify's parser surely reads this match (so it tries no later one): a number it
    builds itself, or one LaTeX environment holding a plain number, an exact constant or an equation
    chain it cuts to one (:func:`~stepcredit.reward.verifiers.math.mv_read._chain_tail`)."""
    if not is_latex:
        return "expr" not in m.groupdict() or m.group("expr") is None
    if len(texts) != 1:
        return False
    tail = _chain_tail(texts[0])
    return tail is not None and (_plain_number(tail) is not None or _mv_const(tail) is not None)


def _differs(gold: str, text: str) -> bool:
    """Whether math-verify's reading of ``text`` surely differs from ``gold``: :func:`fast_verdict` is sure
    of it, or ``text`` is an equation (a chain of them) whose last right side surely differs, which is
    what it compares against a gold that is no relation (``math_verify.grader.sympy_expr_eq``)."""
    if "%" in text or "\\boxed" in text:
        return False
    if fast_verdict(gold, text) is False:
        return True
    parsed = parse_answer(_normalize(text))
    if not isinstance(parsed, Relation) or any(op != "=" for op in parsed.ops):
        return False
    return fast_verdict(gold, parsed.parts[-1]) is False


def mv_reads_only_wrong(text: str, golds: list[str]) -> str | None:
    """The answer math-verify reads first in ``text`` when whatever it may read there is surely wrong
    against every gold, else None.

    math-verify (``extract_target_from_pred``) tries its regex matches group by group, strongest first,
    in each the match that ends last first, until one parses, and keeps the first match's text as a
    fallback. Which match its parser accepts is not known without it; but when every match it would
    try (up to one it surely parses, :func:`_surely_parses`) surely differs from each gold
    (:func:`_differs`), its verdict is "incorrect" whichever it reads. Golds that are worked solutions
    or relations are left to it (it reads those otherwise)."""
    if not golds or not _mv_pattern_groups():
        return None
    for gold in golds:
        if extract_gold(gold) != gold or _RELATION_CHARS_RE.search(gold):
            return None
    first: str | None = None
    for index in range(len(_mv_pattern_groups())):
        for m, is_latex, _ in _mv_group_matches(text, index):
            texts = _readings(m, is_latex)
            if texts is None or not all(_differs(g, t) for g in golds for t in texts):
                return None
            first = first or texts[0]
            if _surely_parses(m, is_latex, texts):
                return first
    return first
