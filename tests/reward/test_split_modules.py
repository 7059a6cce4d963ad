"""Modules split along their seams keep their old import paths: the names are the very same objects."""

from __future__ import annotations

import importlib
from fractions import Fraction

import pytest


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        (
            "stepcredit.sandbox.cases",
            "stepcredit.sandbox.plain",
            ["NotPlain", "encode_plain", "decode_plain"],
        ),
        (
            "stepcredit.sandbox.cases",
            "stepcredit.sandbox.asserts",
            ["AssertPlan", "plan_assert", "evaluate_assert"],
        ),
        ("stepcredit.sandbox.cases", "stepcredit.sandbox.remote", ["Remote", "RemoteLink", "ProgramRaised"]),
        ("stepcredit.reward.verifiers.latex", "stepcredit.reward.verifiers.latex.normal", ["normalize"]),
        (
            "stepcredit.reward.verifiers.latex",
            "stepcredit.reward.verifiers.latex.values",
            ["to_number", "const_value"],
        ),
        (
            "stepcredit.reward.verifiers.latex",
            "stepcredit.reward.verifiers.latex.structures",
            ["Seq", "parse_answer"],
        ),
        (
            "stepcredit.reward.verifiers.latex",
            "stepcredit.reward.verifiers.latex.compare",
            ["compare_structures"],
        ),
        ("stepcredit.reward.verifiers.math", "stepcredit.reward.verifiers.math.mv_read", ["_mv_parse_text"]),
        ("stepcredit.reward.verifiers.math", "stepcredit.reward.verifiers.math.mv_sets", ["_set_reading"]),
    ],
)
def test_old_paths_name_the_moved_objects(old: str, new: str, names: list[str]) -> None:
    before, after = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(before, name) is getattr(after, name), name


def test_the_split_latex_reader_still_decides_as_one_module() -> None:
    # hand-checked: 1/2 = 0.5 exactly; (1, 2) is an ordered pair, so (2, 1) differs; {1, 2} ignores order
    from stepcredit.reward.verifiers import latex

    def same(a: str, b: str) -> bool | None:
        return latex.compare_structures(
            latex.parse_answer(latex.normalize(a)), latex.parse_answer(latex.normalize(b))
        )

    assert latex.to_number(latex.normalize(r"\frac{1}{2}")) == (
        Fraction(1, 2),
        False,
    )  # not written as a decimal
    assert latex.to_number("0.5") == (Fraction(1, 2), True)
    assert same(r"\frac{1}{2}", "0.5") is True
    assert same("(1, 2)", "(2, 1)") is False
    assert same(r"\{1, 2\}", r"\{2, 1\}") is True


def test_reply_object_accepts_only_a_json_object_as_text() -> None:
    # the one reader of a program's answer that the local and SandboxFusion executors share
    from stepcredit.sandbox.plain import NotPlain
    from stepcredit.sandbox.remote import reply_object

    assert reply_object('{"v": [1, 2]}') == {"v": [1, 2]}
    for bad in ("[1]", "not json", None, b'{"v": 1}', "[" * 100_000 + "]" * 100_000):
        with pytest.raises(NotPlain):
            reply_object(bad)
