"""Writes ``ifeval_reference.json``: the reference's strict and loose verdicts on crafted responses.

The reference is lm-eval's copy of Google's IFEval code (``lm_eval/tasks/ifeval``: ``instructions.py``,
``instructions_util.py``, ``instructions_registry.py`` and ``utils.py`` with
``test_instruction_following_strict`` / ``test_instruction_following_loose``), run unchanged. The committed
test (``tests/reward/test_ifeval_reference.py``) reads the JSON only, so it needs neither lm-eval nor this
script. How the committed file was produced (lm-eval 0.4.13, nltk 3.10.4, langdetect 1.0.9):

    python3 -m venv /tmp/ifref && /tmp/ifref/bin/pip install nltk langdetect immutabledict packaging
    /tmp/ifref/bin/pip download --no-deps lm-eval==0.4.13 -d /tmp/ifref_dl
    mkdir /tmp/ifref_src && cd /tmp/ifref_src && unzip /tmp/ifref_dl/lm_eval-*.whl 'lm_eval/tasks/ifeval/*'
    NLTK_DATA=~/.cache/stepcredit/nltk_data /tmp/ifref/bin/python tests/reward/data/make_ifeval_reference.py \
        --lm-eval-src /tmp/ifref_src

Only the ifeval files of the wheel are unpacked (``lm_eval/__init__`` would import the whole harness);
the two parent packages are stood in for by empty modules. NLTK's ``punkt_tab`` English model comes from
``NLTK_DATA`` (the copy ``stepcredit``'s ``ensure_punkt`` writes; ``nltk.download('punkt_tab')`` gives the
same files). langdetect's process-wide factory is seeded 0 (``DetectorFactory.seed``), as the verifier's
own factory is; unseeded, the reference's language verdicts are random on short or mixed texts.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("ifeval_reference.json")

LOREM = (
    "The river runs past the old mill. Children play on its banks in summer. "
    "In winter the water freezes and the town goes skating. Nobody remembers who built the mill."
)
LOWER = "i like to drink green tea in the morning because it helps me wake up and think clearly."
UPPER = "I LIKE TO DRINK GREEN TEA IN THE MORNING BECAUSE IT HELPS ME WAKE UP AND THINK CLEARLY."
PROMPT = "Write a short note about tea. Do not use any commas."


def _c(iid: str, kwargs: dict[str, Any], responses: list[str], prompt: str = "") -> list[dict[str, Any]]:
    return [{"id": iid, "kwargs": kwargs, "prompt": prompt, "response": r} for r in responses]


def cases() -> list[dict[str, Any]]:
    """Crafted responses per registered instruction: on each side of its threshold, in the layouts the
    loose variants change (a title line, a sign-off line, ``*`` markup), and the edge cases of its rule."""
    out: list[dict[str, Any]] = []
    # ------------------------------------------------------------------ keywords
    kw = {"keywords": ["tea", "honey"]}
    out += _c(
        "keywords:existence",
        kw,
        [
            "Green TEA and Honey.",
            "Green tea.",
            "teapot and honeycomb",  # the reference searches without word boundaries
            "**tea** with *honey*",
            "Tea\nand\nhoney",
            "",
        ],
    )
    for rel, freq in [("less than", 2), ("at least", 2), ("at least", 3)]:
        out += _c(
            "keywords:frequency",
            {"keyword": "tea", "relation": rel, "frequency": freq},
            [
                "tea",
                "Tea and TEA.",
                "tea, tea, tea",
                "teapot teatime tea",  # \btea\b: only whole words
                "I like tea.\nMore tea please.\n-- tea lover",
                "no such word",
            ],
        )
    out += _c(
        "keywords:forbidden_words",
        {"forbidden_words": ["tea", "coffee"]},
        [
            "I drink water.",
            "I drink Tea.",
            "I own a teapot.",
            "Coffee!",
            "**Tea**\nI drink water.",  # loose: the first line dropped
            "tea's aroma",
        ],
    )
    for letter, rel, freq in [
        ("e", "at least", 5),
        ("e", "less than", 3),
        ("Z", "at least", 2),
        ("q", "less than", 1),
    ]:
        out += _c(
            "keywords:letter_frequency",
            {"letter": letter, "let_relation": rel, "let_frequency": freq},
            ["eee", "Eeeee e", "zZ pizza", "quick", "no letters of that kind here?", "EEEEE\nx"],
        )
    # ------------------------------------------------------------------ language
    for lang in ("en", "es", "de", "hi"):
        out += _c(
            "language:response_language",
            {"language": lang},
            [
                "The response is English and it says so plainly.",
                "Desayunamos en McDonald's hoy y luego fuimos al parque.",
                "Wir haben heute im Park gefrühstückt und sind dann nach Hause gegangen.",
                "हम आज पार्क में गए और फिर घर लौट आए।",
                "12345 678",
                "**Title**\nWir haben heute im Park gefrühstückt.",
            ],
        )
    # ------------------------------------------------------------------ length
    for rel, n in [("less than", 3), ("at least", 3), ("at least", 5)]:
        out += _c(
            "length_constraints:number_sentences",
            {"relation": rel, "num_sentences": n},
            [
                "One. Two. Three.",
                "One sentence only",
                "Dr. Smith went home. He slept! Did he? Yes.",
                "It costs $3.50 today. Tomorrow more.",
                "First line\nsecond line\nthird line",
                "A. B. C. D. E.",
                "Title\nOne. Two.\nBye.",
                LOREM,
            ],
        )
    for n in (1, 2, 3):
        out += _c(
            "length_constraints:number_paragraphs",
            {"num_paragraphs": n},
            [
                "one paragraph",
                "p1\n***\np2",
                "p1\n* * *\np2",  # only *** (with optional spaces around) splits
                "p1\n***\np2\n***\np3",
                "\n  paragraph 1\n  ***\n  paragraph 2\n  ***\n  paragraph 3",
                "p1\n***\n\n***\np3",  # an empty paragraph fails
                "***\np1\n***\np2",  # leading separator: the first piece is empty
                "p1\n***\np2\n***",  # trailing separator: the last piece is empty
                "p1 *** p2",
                "p1\n\np2",
            ],
        )
    for rel, n in [("less than", 5), ("at least", 5), ("less than", 1)]:
        out += _c(
            "length_constraints:number_words",
            {"relation": rel, "num_words": n},
            [
                "one two three four",
                "one two three four five",
                "don't stop-believing now ok",  # \w+ splits at ' and -
                "a_b c_d e f g",  # _ is a word character
                "3.14 is pi",
                "word\u3000" * 6,
                "日本語のテキスト",
                "Title here\none two three\nbye now",
                "",
            ],
        )
    for n, first in [(2, "tea"), (1, "the"), (3, "bye")]:
        out += _c(
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": 3, "nth_paragraph": n, "first_word": first},
            [
                "Coffee first.\n\nTea second.\n\nBye third.",
                "The first.\n\nTea second.\n\nBye third.",
                '"Tea," he said.\n\nTea, said she.\n\nBye!',
                "Coffee.\n\n**Tea** time.\n\nBye.",
                "Coffee.\n\nTeatime.\n\nBye.",
                "Coffee.\n\n\n\nTea.\n\nBye.",  # blank paragraphs are dropped before counting
                "One.\n\nTwo.",
                "The one.\n\nTea two.\n\nBye three.\n\nFour.",
                "  \n\nthe start\n\ntea middle\n\nbye end",
            ],
        )
    # ------------------------------------------------------------------ detectable content
    for n in (1, 2):
        out += _c(
            "detectable_content:number_placeholders",
            {"num_placeholders": n},
            [
                "Dear [name], see you at [place].",
                "Dear [name].",
                "Dear name.",
                "[]",
                "[a] [b] [c]",
                "[[nested]]",
            ],
        )
    for marker in ("P.S.", "P.P.S", "p.s."):
        out += _c(
            "detectable_content:postscript",
            {"postscript_marker": marker},
            [
                "Tea is good.\nP.S. so is cake.",
                "Tea is good.\np.s. so is cake.",
                "Tea is good. P.S. so is cake.",
                "Tea is good.\nP.P.S. and scones.",
                "Tea is good.\n  P.S. indented",
                "Tea is good.\nPS so is cake.",
                "Tea is good.\n**P.S.** so is cake.",
            ],
        )
    # ------------------------------------------------------------------ detectable format
    for n in (2, 3):
        out += _c(
            "detectable_format:number_bullet_lists",
            {"num_bullets": n},
            [
                "* one\n* two",
                "- one\n- two",
                "* one\n- two\n* three",
                "*one\n*two",  # no space after the marker
                "  * one\n  * two",
                "**bold** start\n* one\n* two",  # ** at a line start is not a bullet
                "1. one\n2. two",
                "Intro\n* one\n* two\n* three\nBye",
                "* one\n* two\n* three",
            ],
        )
    out += _c(
        "detectable_format:constrained_response",
        {},
        [
            "My answer is yes.",
            "\n My answer is no.\n",
            "My answer is maybe.",
            "I think so. My answer is yes.",
            "My answer is Yes.",
            "My answer is yes",
            "My answer is yes. My answer is no.",
        ],
    )
    for n in (2, 3):
        out += _c(
            "detectable_format:number_highlighted_sections",
            {"num_highlights": n},
            [
                "*one* and *two*",
                "**one** and **two**",
                "*one* **two** *three*",
                "* one\n* two",
                "*one two*",
                "** **",
                "*  * and *x*",
                "*a*b*c*",
            ],
        )
    for splitter, n in [("SECTION", 2), ("Section", 3), ("PARAGRAPH", 2)]:
        out += _c(
            "detectable_format:multiple_sections",
            {"section_spliter": splitter, "num_sections": n},
            [
                "SECTION 1\nfoo\nSECTION 2\nbar",
                "Section 1\nfoo\nSection 2\nbar\nSection 3\nbaz",
                "section 1\nfoo\nsection 2\nbar",
                "SECTION X\nfoo\nSECTION Y\nbar",
                "Intro\nSECTION 1 foo SECTION 2 bar",
                "PARAGRAPH 1\nfoo\nPARAGRAPH 2\nbar",
                "Section 1: x. Section 2: y. Section 3: z.",
            ],
        )
    out += _c(
        "detectable_format:json_format",
        {},
        [
            '{"a": 1}',
            '```json\n{"a": 1}\n```',
            '```JSON\n{"a": 1}\n```',
            '```Json\n{"a": 1}\n```',
            '```\n{"a": 1}\n```',
            'Here it is:\n```json\n{"a": 1}\n```',
            '{"a": 1,}',
            "[1, 2]",
            '"text"',
            "42",
            "a: 1",
            '```json\n{"a": 1}\n```\nHope this helps!',
        ],
    )
    out += _c(
        "detectable_format:title",
        {},
        [
            "<<Tea Time>>\nTea is good.",
            "Tea Time\nTea is good.",
            "<< >>\nTea.",
            "Tea is <<good>>.",
            "<<Tea\nTime>>",
            "<<<Tea>>>",
        ],
    )
    # ------------------------------------------------------------------ combination
    out += _c(
        "combination:two_responses",
        {},
        [
            "Tea is good.\n******\nCoffee is good.",
            "Tea is good.\n******\nTea is good.",
            "Tea is good.\n*******\nCoffee is good.",
            "Tea is good.******Coffee is good.",
            "Tea.\n******\nCoffee.\n******\nJuice.",
            "******\nCoffee is good.",
            "Tea is good.",
        ],
    )
    repeat = "Write a short note about tea. Do not use any commas."
    out += _c(
        "combination:repeat_prompt",
        {"prompt_to_repeat": repeat},
        [
            repeat + "\nTea is lovely.",
            repeat.lower() + " tea is lovely.",
            "  " + repeat + " Tea.",
            "Sure! " + repeat + " Tea.",
            "Write a short note about tea.",
            "**Prompt:**\n" + repeat + " Tea.",
        ],
    )
    # ------------------------------------------------------------------ start / end
    for phrase in ("Any other questions?", "Is there anything else I can help with?", "bye."):
        out += _c(
            "startend:end_checker",
            {"end_phrase": phrase},
            [
                "Tea is good. Any other questions?",
                "Tea is good. any other questions?   ",
                "Tea is good. Any other questions?\n-- bot",
                "Tea is good. Is there anything else I can help with?",
                "Tea is good. **Is there anything else I can help with?**",
                "Tea. Bye.",
                "Tea. Bye",
                '"Tea. Any other questions?"',
            ],
        )
    out += _c(
        "startend:quotation",
        {},
        [
            '"Tea is good."',
            '  "Tea is good."  ',
            "\u201cTea is good.\u201d",
            "'Tea is good.'",
            '"Tea" is good.',
            'Title\n"Tea is good."',
            '"',
        ],
    )
    # ------------------------------------------------------------------ change case
    for rel, n in [("less than", 2), ("at least", 2), ("at least", 3)]:
        out += _c(
            "change_case:capital_word_frequency",
            {"capital_relation": rel, "capital_frequency": n},
            [
                "TEA is GOOD",
                "TEA is good",
                "Tea Is Good",
                "I am OK",  # "I" is a capital word
                "DON'T STOP",  # word_tokenize: DO, N'T, STOP
                "U.S.A. and NASA",
                "TEA-TIME is FUN",
                "ÉCOLE ÜBER alles",
                "**TEA** *IS* GOOD",
            ],
        )
    out += _c(
        "change_case:english_capital",
        {},
        [
            UPPER,
            UPPER.replace("TEA", "tea"),
            "HELLO",
            "TEA 123!",
            "ÉCOLE ET THÉ DU MATIN POUR TOUT LE MONDE ICI",
            "**Title**\n" + UPPER,
            "12345",
        ],
    )
    out += _c(
        "change_case:english_lowercase",
        {},
        [
            LOWER,
            LOWER.replace("tea", "Tea"),
            "**Tea**\n" + LOWER,
            "hello",
            "nous buvons du thé vert le matin parce que cela nous réveille",
            "12345",
            "héllo wörld école",
        ],
    )
    # ------------------------------------------------------------------ punctuation
    out += _c(
        "punctuation:no_comma",
        {},
        [
            "I like tea and cake.",
            "I like tea, and cake.",
            "1,000 cups",
            "Tea\uff0ccake",
            "Tea\u060c cake",
            ".",
            "",
            "Yes, sir\n.",
        ],
        prompt=PROMPT,
    )
    return out


def load_reference(src: Path) -> Any:
    """lm-eval's ``tasks/ifeval/utils`` from an unpacked wheel, without importing the rest of lm-eval."""
    for name in ("lm_eval", "lm_eval.tasks"):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(src.joinpath(*name.split(".")))]
        sys.modules[name] = pkg
    from langdetect import DetectorFactory

    DetectorFactory.seed = 0
    from lm_eval.tasks.ifeval import utils

    return utils


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lm-eval-src", type=Path, required=True, help="folder holding lm_eval/tasks/ifeval")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    ref = load_reference(args.lm_eval_src)
    rows = []
    for c in cases():
        inp = ref.InputExample(key=0, instruction_id_list=[c["id"]], prompt=c["prompt"], kwargs=[c["kwargs"]])
        strict = ref.test_instruction_following_strict(inp, c["response"]).follow_instruction_list[0]
        loose = ref.test_instruction_following_loose(inp, c["response"]).follow_instruction_list[0]
        rows.append({**c, "strict": bool(strict), "loose": bool(loose)})
    import langdetect
    import nltk

    meta = {
        "reference": "lm-eval 0.4.13 lm_eval/tasks/ifeval (Google's instruction_following_eval, unchanged)",
        "nltk": nltk.__version__,
        "langdetect": getattr(langdetect, "__version__", "1.0.9"),
        "langdetect_seed": 0,
        "produced_by": "tests/reward/data/make_ifeval_reference.py",
    }
    args.out.write_text(json.dumps({"meta": meta, "cases": rows}, indent=1, ensure_ascii=False) + "\n")
    ids = {r["id"] for r in rows}
    print(f"{len(rows)} cases over {len(ids)} instructions -> {args.out}")


if __name__ == "__main__":
    main()
