"""Writes ``verl_math_reference.json``: realistic GSM8K / MATH-500 / DAPO-style responses, each with a
careful grader's label, and the verdicts of VeRL's and lm-eval's graders on them.

Provenance. Golds are real (GSM8K test and MATH-500 answers from ``shared/data``); responses are written
in the formats models emit (``\\boxed`` with nested braces, ``\\frac`` against decimals, units and money,
thousands separators, percentages, trailing full stops, "The answer is", several boxes, truncated
outputs, ``\\text{}``, negative numbers, intervals, answers in words, DAPO's ``Answer:`` line). ``label`` is
our judgement, never a reference's; ``note`` says why where it is not obvious. The references, recorded
per case under ``refs``:

- ``verl_gsm8k_strict`` / ``verl_gsm8k_flexible``: verl 0.9.1 ``verl.utils.reward_score.gsm8k.compute_score``
  (``method="strict"`` / ``"flexible"``), GSM8K rows only;
- ``lm_eval_strict`` / ``lm_eval_flexible``: lm-eval-harness's gsm8k filters (strict-match: the first
  ``#### N``; flexible-extract: the last number) with its exact_match settings, GSM8K rows only;
- ``verl_math``: ``reward_score.math_reward.compute_score``; ``verl_math_dapo``:
  ``reward_score.math_dapo.compute_score`` (``acc``); ``verl_prime_math``: ``reward_score.prime_math.compute_score``.

How the committed file was produced (the test reads the JSON only and needs neither verl nor this script):

    python3 -m venv /tmp/verlref && /tmp/verlref/bin/pip install --no-deps verl==0.9.1
    /tmp/verlref/bin/pip install sympy pylatexenc "antlr4-python3-runtime==4.11.*"
    /tmp/verlref/bin/python tests/reward/data/make_verl_math_reference.py \\
        --verl /tmp/verlref/lib/python3.11/site-packages/verl

Only the reward_score modules run: the ``verl`` and ``verl.utils`` packages (whose ``__init__`` imports
torch) are stood in for by empty modules, and ``verl.utils.py_functional.timeout_limit`` by a SIGALRM
timer of the same seconds. lm-eval's two filters are a few regular expressions, written out below.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import signal
import sys
import types
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("verl_math_reference.json")

G = "gsm8k"
M = "math500"
D = "dapo"

CASES = [
    # ------------------------------------------------------------------ GSM8K
    (G, "18", "She makes 9 * 2 = $18 every day.\n#### 18", True, ""),
    (G, "18", "She makes 9 * 2 = $18 every day.\n#### 18.", True, "trailing period after ####"),
    (G, "18", "She makes 9 * 2 = 18 dollars.\n#### $18", True, "currency sign after ####"),
    (G, "18", "#### 18.00", True, "cents written out"),
    (G, "18", "She makes $18.00 every day. The answer is $18.00.", True, ""),
    (G, "18", "So she makes 18 dollars every day. The answer is 18.", True, ""),
    (G, "18", "The answer is: 18", True, ""),
    (G, "18", "Janet makes **$18** per day.\n\n**Answer: 18**", True, ""),
    (G, "18", "Therefore, Janet makes $\\boxed{18}$ dollars every day.", True, ""),
    (G, "18", "Therefore, Janet makes $\\boxed{\\$18}$ every day.", True, ""),
    (G, "18", "Therefore, Janet makes \\boxed{18 \\text{ dollars}} every day.", True, ""),
    (G, "18", "Janet makes $\\boxed{\\$18.00}$.", True, ""),
    (
        G,
        "18",
        "16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\nShe makes eighteen dollars.",
        True,
        "last number stated is 18",
    ),
    (G, "18", "She sells 9 eggs at $2 each, so she makes 9 x 2 = $18.", True, "flexible: last number"),
    (G, "18", "She sells 9 eggs. 9 * 2 = 18. So she makes $18 a day at the market.", True, ""),
    (G, "18", "She has 16 - 3 - 4 = 9 eggs left. She makes 9 * 2 =", False, "truncated before the answer"),
    (G, "18", "She has 16 - 3 - 4 = 9 eggs left, so she makes 9 * $2", False, "truncated"),
    (
        G,
        "18",
        "#### 16\nWait, she eats 3 and bakes 4, so 9 eggs: 9 * 2 = 18.\n#### 18",
        True,
        "the last #### is the final answer",
    ),
    (
        G,
        "18",
        "#### 18\nWait, I forgot the muffins. 16 - 3 = 13, 13 * 2 = 26.\n#### 26",
        False,
        "the last #### is the final answer",
    ),
    (G, "18", "The answer is 18 or 20.", False, "hedge"),
    (G, "18", "The answer is 20.", False, ""),
    (G, "18", "#### 20", False, ""),
    (G, "18", "The answer is eighteen.", True, "an answer in words; a human grader credits it"),
    (G, "18", "Janet makes eighteen dollars a day.", True, "an answer in words"),
    (G, "18", "She makes 9 * 2 = 18.\n#### 9", False, "the marked answer is wrong"),
    (G, "18", "The answer is 180.", False, ""),
    (G, "18", "The answer is 1.8.", False, ""),
    (G, "3", "It takes 2 + 1 = 3 bolts.\n#### 3", True, ""),
    (
        G,
        "3",
        "A robe needs 2 bolts of blue and 2/2 = 1 bolt of white fiber, 3 bolts in total.",
        True,
        "flexible: last number; phrase absent",
    ),
    (G, "3", "It takes 2 + 2/2 = 3 bolts in total.\nThe answer is 3 bolts.", True, ""),
    (
        G,
        "70000",
        "He made a profit of 200,000 - 130,000 = $70,000.\n#### 70,000",
        True,
        "thousands separator",
    ),
    (G, "70000", "The profit is $70,000.", True, "thousands separator and currency"),
    (G, "70000", "The profit is $70 000.", True, "space as thousands separator"),
    (G, "70000", "The profit is \\$70{,}000.", True, "LaTeX thousands separator"),
    (
        G,
        "70000",
        "The answer is 70.000",
        False,
        "European separator is ambiguous; not credited (stepcredit policy)",
    ),
    (G, "70000", "#### 70000.0", True, ""),
    (G, "70000", "He made a profit of $70k.", True, "k suffix is an abbreviation of thousand"),
    (G, "-3", "The temperature fell to -3 degrees.\n#### -3", True, "negative"),
    (G, "-3", "#### \u22123", True, "unicode minus"),
    (G, "-3", "#### 3", False, "sign dropped"),
    (G, "-3", "The final temperature is $-3^\\circ$ C.", True, ""),
    (G, "0.5", "#### .5", True, "leading dot"),
    (G, "0.5", "The answer is 1/2.", True, "fraction for decimal gold"),
    (G, "0.5", "#### 0.50", True, ""),
    (G, "25", "The discount is 25%.\n#### 25", True, "percent question with numeric gold"),
    (G, "25", "She saved 25 percent.", True, "percent word"),
    (G, "25", "She saved $\\boxed{25\\%}$.", True, ""),
    (G, "5", "It will take 5 hours and 30 minutes.", False, "5.5 hours is not 5; last number is 30"),
    (G, "35", "So 7 * 5 = 35 cookies. The answer is **35**.", True, ""),
    (G, "35", "The answer is \\(35\\).", True, ""),
    (G, "35", "The answer is $$35$$", True, ""),
    (G, "35", "Answer: 35 cookies", True, ""),
    (G, "35", "A: 35", True, ""),
    (G, "1080", "So the answer is 1,080.", True, ""),
    (G, "1080", "So the answer is 1 080.", True, ""),
    (G, "5", "The answer is 5.", True, ""),
    (G, "5", "The answer is 5. Then she buys 3 more.", True, ""),
    (G, "16", "There are 2^4 = 16 ways.", True, ""),
    (G, "12", "The answer is 12.\n\nThe answer is 13.", False, "the last stated answer is wrong"),
    # ------------------------------------------------------------------ MATH-500
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{\\frac{1}{8}}$.", True, ""),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{\\dfrac{1}{8}}$.", True, ""),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{1/8}$.", True, ""),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{0.125}$.", True, "exact decimal of the fraction"),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{\\frac18}$.", True, ""),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{12.5\\%}$.", True, ""),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{\\frac{1}{4}}$.", False, ""),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{0.12}$.", False, "rounded"),
    (
        M,
        "\\frac{1}{8}",
        "So the probability is $\\boxed{\\frac{1}{8}}$. Hmm, actually it is $\\boxed{\\frac{1}{4}}$.",
        False,
        "two different boxes",
    ),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{\\frac{1}{", False, "truncated inside the box"),
    (M, "\\frac{1}{8}", "So the probability is $\\boxed{}$.", False, "empty box"),
    (M, "\\frac{\\sqrt{21}}{5}", "Thus $\\sin A = \\boxed{\\frac{\\sqrt{21}}{5}}$.", True, "nested braces"),
    (M, "\\frac{\\sqrt{21}}{5}", "Thus $\\sin A = \\boxed{\\dfrac{\\sqrt{21}}{5}}$.", True, ""),
    (M, "\\frac{\\sqrt{21}}{5}", "Thus $\\boxed{\\frac{1}{5}\\sqrt{21}}$.", True, ""),
    (M, "\\frac{\\sqrt{21}}{5}", "Thus $\\boxed{\\sqrt{21}/5}$.", True, ""),
    (M, "\\frac{\\sqrt{21}}{5}", "Thus $\\boxed{\\frac{\\sqrt{21}}{25}}$.", False, ""),
    (
        M,
        "\\frac{\\sqrt{21}}{5}",
        "Thus $\\boxed{0.9165}$.",
        False,
        "a rounded decimal of an irrational answer",
    ),
    (M, "\\frac{3\\sqrt{3}}{4}", "The area is $\\boxed{\\frac{3 \\sqrt 3}{4}}$.", True, ""),
    (M, "3\\sqrt{13}", "$AB = \\boxed{\\sqrt{117}}$", True, ""),
    (M, "11\\sqrt2", "$\\boxed{11\\sqrt{2}}$", True, ""),
    (
        M,
        "\\text{Evelyn}",
        "Evelyn has the greatest average speed, so the answer is $\\boxed{\\text{Evelyn}}$.",
        True,
        "",
    ),
    (M, "\\text{Evelyn}", "The answer is $\\boxed{Evelyn}$.", True, ""),
    (M, "\\text{Evelyn}", "The answer is Evelyn.", True, ""),
    (M, "\\text{Evelyn}", "The answer is $\\boxed{\\text{Carla}}$.", False, ""),
    (M, "\\text{east}", "She is facing $\\boxed{\\text{East}}$.", True, "case of a word"),
    (M, "\\text{even}", "Hence $f$ is $\\boxed{\\text{even}}$.", True, ""),
    (M, "\\text{even}", "Hence $f$ is $\\boxed{\\text{odd}}$.", False, ""),
    (M, "\\text{ellipse}", "The curve is an $\\boxed{\\text{ellipse}}$.", True, ""),
    (M, "90^\\circ", "The angle is $\\boxed{90^\\circ}$.", True, ""),
    (M, "90^\\circ", "The angle is $\\boxed{90}$.", True, ""),
    (M, "90^\\circ", "The angle is $\\boxed{90^{\\circ}}$.", True, ""),
    (M, "90^\\circ", "The angle is $\\boxed{90\\text{ degrees}}$.", True, ""),
    (M, "90^\\circ", "The angle is $\\boxed{90°}$.", True, ""),
    (M, "90^\\circ", "The angle is $\\boxed{45^\\circ}$.", False, ""),
    (M, "\\frac{270}7\\text{ degrees}", "$\\angle BAC = \\boxed{\\frac{270}{7}}$ degrees.", True, ""),
    (M, "\\frac{270}7\\text{ degrees}", "$\\angle BAC = \\boxed{\\frac{270}{7}^\\circ}$", True, ""),
    (M, "\\frac{270}7\\text{ degrees}", "$\\angle BAC = \\boxed{\\frac{270^\\circ}{7}}$", True, ""),
    (
        M,
        "\\frac{270}7\\text{ degrees}",
        "$\\angle BAC = \\boxed{38\\frac{4}{7}}$ degrees",
        True,
        "mixed number",
    ),
    (M, "10,\\!080", "There are $\\boxed{10080}$ ways.", True, ""),
    (M, "10,\\!080", "There are $\\boxed{10,080}$ ways.", True, ""),
    (M, "10,\\!080", "There are $\\boxed{10{,}080}$ ways.", True, ""),
    (M, "10,\\!080", "There are $\\boxed{10,\\!080}$ ways.", True, ""),
    (M, "10,\\!080", "There are $\\boxed{1008}$ ways.", False, ""),
    (M, "11,\\! 111,\\! 111,\\! 100", "The answer is $\\boxed{11111111100}$.", True, ""),
    (M, "\\$32,\\!348", "She will have $\\boxed{\\$32,348}$.", True, ""),
    (M, "\\$32,\\!348", "She will have $\\boxed{32348}$ dollars.", True, ""),
    (M, "\\$32,\\!348", "She will have $\\boxed{\\$32,\\!348}$.", True, ""),
    (M, "\\$18.90", "The total cost is $\\boxed{\\$18.90}$.", True, ""),
    (M, "\\$18.90", "The total cost is $\\boxed{18.9}$.", True, ""),
    (M, "\\$18.90", "The total cost is $\\boxed{\\$18.09}$.", False, ""),
    (M, "864 \\mbox{ inches}^2", "The area is $\\boxed{864}$ square inches.", True, ""),
    (M, "864 \\mbox{ inches}^2", "The area is $\\boxed{864 \\text{ in}^2}$.", True, ""),
    (M, "864 \\mbox{ inches}^2", "The area is $\\boxed{864\\text{ square inches}}$.", True, ""),
    (M, "15\\mbox{ cm}^2", "The area is $\\boxed{15 \\text{ cm}^2}$.", True, ""),
    (M, "5.4 \\text{ cents}", "The average price is $\\boxed{5.4}$ cents.", True, ""),
    (M, "5.4 \\text{ cents}", "The average price is $\\boxed{5.4 \\text{ cents}}$.", True, ""),
    (M, "1\\frac{4}{5}", "$BH = \\boxed{1\\frac{4}{5}}$", True, ""),
    (M, "1\\frac{4}{5}", "$BH = \\boxed{1 \\frac{4}{5}}$", True, ""),
    (
        M,
        "1\\frac{4}{5}",
        "$BH = \\boxed{\\frac{9}{5}}$",
        True,
        "value grading: the mixed-number form asked for is not checked",
    ),
    (M, "1\\frac{4}{5}", "$BH = \\boxed{1.8}$", True, "value grading"),
    (
        M,
        "1\\frac{4}{5}",
        "$BH = \\boxed{\\frac{4}{5}}$",
        False,
        "4/5 is not 1 4/5 (a reading of 1\\frac45 as a product would say yes)",
    ),
    (M, "137 \\frac{1}{2}", "The car travels $\\boxed{137\\frac{1}{2}}$ miles.", True, ""),
    (M, "137 \\frac{1}{2}", "The car travels $\\boxed{137.5}$ miles.", True, ""),
    (M, "137 \\frac{1}{2}", "The car travels $\\boxed{\\frac{275}{2}}$ miles.", True, ""),
    (M, "137 \\frac{1}{2}", "The car travels $\\boxed{68\\frac{1}{2}}$ miles.", False, ""),
    (M, "(3,4]", "The solution set is $\\boxed{(3,4]}$.", True, ""),
    (M, "(3,4]", "The solution set is $\\boxed{(3, 4)}$.", False, ""),
    (M, "(3,4]", "The solution set is $\\boxed{3 < x \\le 4}$.", True, ""),
    (M, "(3,4]", "The solution set is $x \\in \\boxed{(3,4]}$.", True, ""),
    (M, "x \\in [-2,7]", "So $\\boxed{[-2,7]}$.", True, ""),
    (M, "x \\in [-2,7]", "So $\\boxed{-2 \\le x \\le 7}$.", True, ""),
    (M, "x \\in [-2,7]", "So $\\boxed{x \\in [-2, 7]}$.", True, ""),
    (M, "x \\in [-2,7]", "So $\\boxed{(-2,7)}$.", False, ""),
    (M, "(2,\\infty)", "So $x \\in \\boxed{(2, \\infty)}$.", True, ""),
    (M, "(2,\\infty)", "So $\\boxed{x > 2}$.", True, ""),
    (M, "(-\\infty, 0]", "The range is $\\boxed{(-\\infty,0]}$.", True, ""),
    (M, "(0,9) \\cup (9,36)", "The domain is $\\boxed{(0,9)\\cup(9,36)}$.", True, ""),
    (M, "(0,9) \\cup (9,36)", "The domain is $\\boxed{(0,36)}$.", False, ""),
    (M, "(-\\infty, 2) \\cup (3, \\infty)", "So $\\boxed{(-\\infty,2) \\cup (3,\\infty)}$.", True, ""),
    (M, "(-\\infty, 2) \\cup (3, \\infty)", "So $\\boxed{x<2 \\text{ or } x>3}$.", True, ""),
    (
        M,
        "\\left(\\frac{3}{5},\\frac{8}{3}\\right]",
        "So $\\boxed{\\left(\\frac35, \\frac83\\right]}$.",
        True,
        "",
    ),
    (M, "\\left(\\frac{3}{5},\\frac{8}{3}\\right]", "So $\\boxed{(0.6, \\frac{8}{3}]}$.", True, ""),
    (M, "\\{1\\pm\\sqrt{5},-2\\}", "The roots are $\\boxed{-2, 1+\\sqrt{5}, 1-\\sqrt{5}}$.", True, ""),
    (
        M,
        "\\{1\\pm\\sqrt{5},-2\\}",
        "The roots are $\\boxed{1+\\sqrt{5}, 1-\\sqrt{5}}$.",
        False,
        "a root missing",
    ),
    (M, "1 \\pm \\sqrt{19}", "The real roots are $\\boxed{1+\\sqrt{19}, 1-\\sqrt{19}}$.", True, ""),
    (M, "1 \\pm \\sqrt{19}", "The real roots are $\\boxed{1 \\pm \\sqrt{19}}$.", True, ""),
    (
        M,
        "1 \\pm \\sqrt{19}",
        "The real roots are $\\boxed{1+\\sqrt{19}}$.",
        False,
        "the problem asks for all real roots",
    ),
    (M, "3, 5, 7", "The roots are $\\boxed{3, 5, 7}$.", True, ""),
    (M, "3, 5, 7", "The roots are $\\boxed{7,5,3}$.", True, "roots: order free"),
    (M, "3, 5, 7", "The roots are $\\boxed{3, 7}$.", False, ""),
    (M, "3, 5, 7", "The roots are $x = 3$, $x = 5$, and $x = 7$.", True, "unboxed list"),
    (M, "-2,1", "The solutions are $\\boxed{1,-2}$.", True, ""),
    (M, "-2,1", "The solutions are $\\boxed{x=1 \\text{ or } x=-2}$.", True, ""),
    (M, "(6,31,-1)", "So $(a,b,c) = \\boxed{(6,31,-1)}$.", True, ""),
    (M, "(6,31,-1)", "So $(a,b,c) = \\boxed{(6,-1,31)}$.", False, "ordered triple"),
    (
        M,
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "In polar coordinates $\\boxed{\\left(3,\\frac{\\pi}{2}\\right)}$.",
        True,
        "",
    ),
    (M, "\\left( 3, \\frac{\\pi}{2} \\right)", "In polar coordinates $\\boxed{(3, \\pi/2)}$.", True, ""),
    (
        M,
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
        "$\\boxed{\\begin{pmatrix} -\\frac{1}{3} \\\\ \\frac{2}{3} \\\\ \\frac{5}{3} \\end{pmatrix}}$",
        True,
        "",
    ),
    (
        M,
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
        "$\\boxed{\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}}$",
        True,
        "",
    ),
    (
        M,
        "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
        "$\\boxed{\\begin{pmatrix} 1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}}$",
        False,
        "",
    ),
    (
        M,
        "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}",
        "$\\boxed{\\begin{bmatrix} -1 & 0 \\\\ 0 & -1 \\end{bmatrix}}$",
        True,
        "bmatrix for pmatrix",
    ),
    (M, "52_8", "The product is $\\boxed{52_8}$.", True, ""),
    (M, "52_8", "The product is $\\boxed{52_{8}}$.", True, ""),
    (M, "52_8", "The product is $\\boxed{52}$.", True, "base given by the question"),
    (
        M,
        "52_8",
        "The product is $\\boxed{42}$.",
        False,
        "the decimal value, not the base-8 numeral asked for",
    ),
    (M, "4210_{5}", "So $\\boxed{4210_5}$.", True, ""),
    (M, "6 - 5i", "$z = \\boxed{6-5i}$", True, ""),
    (M, "6 - 5i", "$z = \\boxed{-5i+6}$", True, ""),
    (M, "6 - 5i", "$z = \\boxed{6+5i}$", False, ""),
    (M, "\\pi", "The period is $\\boxed{\\pi}$.", True, ""),
    (M, "\\pi", "The period is $\\boxed{3.14}$.", False, "an approximation of pi"),
    (M, "\\pi", "The period is $\\boxed{2\\pi}$.", False, ""),
    (M, "288 \\pi", "The volume is $\\boxed{288\\pi}$ cubic units.", True, ""),
    (M, "288 \\pi", "The volume is $\\boxed{288 \\pi \\text{ cm}^3}$.", True, ""),
    (M, "\\cot x", "This simplifies to $\\boxed{\\cot x}$.", True, ""),
    (M, "\\cot x", "This simplifies to $\\boxed{\\frac{\\cos x}{\\sin x}}$.", True, ""),
    (M, "\\cot x", "This simplifies to $\\boxed{\\tan x}$.", False, ""),
    (M, "p - q", "The sum is $\\boxed{p-q}$.", True, ""),
    (M, "p - q", "The sum is $\\boxed{-q+p}$.", True, ""),
    (M, "p - q", "The sum is $\\boxed{q-p}$.", False, ""),
    (M, "2k+2", "$\\boxed{2(k+1)}$", True, ""),
    (M, "x^3+3x-6", "$p(x) = \\boxed{x^3 + 3x - 6}$", True, ""),
    (M, "x^3+3x-6", "$\\boxed{x^3 + 3x + 6}$", False, ""),
    (M, ".0000672", "The decimal is $\\boxed{0.0000672}$.", True, ""),
    (M, ".0000672", "The decimal is $\\boxed{6.72 \\times 10^{-5}}$.", True, ""),
    (M, ".0000672", "The decimal is $\\boxed{.000672}$.", False, ""),
    (M, ".35625", "$\\boxed{0.35625}$", True, ""),
    (M, "1.25", "$\\boxed{\\frac{5}{4}}$", True, ""),
    (M, "1.25", "$\\boxed{1\\frac{1}{4}}$", True, ""),
    (M, "0.15", "$\\frac{3}{20} = \\boxed{0.15}$", True, ""),
    (M, "0.15", "$\\frac{3}{20} = \\boxed{.15}$", True, ""),
    (M, "\\text{(C)}", "The answer is $\\boxed{C}$.", True, ""),
    (M, "\\text{(C)}", "The answer is $\\boxed{\\text{(C)}}$.", True, ""),
    (M, "\\text{(C)}", "The answer is (C).", True, ""),
    (M, "\\text{(C)}", "The answer is $\\boxed{(E)}$.", False, ""),
    (M, "x=5", "$\\boxed{5}$", True, ""),
    (M, "x=5", "$\\boxed{x = 5}$", True, ""),
    (M, "x=5", "$\\boxed{x=-5}$", False, ""),
    (M, "y = 2x + 3", "The line is $\\boxed{y = 2x + 3}$.", True, ""),
    (M, "y = 2x + 3", "The line is $\\boxed{y = 3 + 2x}$.", True, ""),
    (M, "y = 2x + 3", "The line is $\\boxed{y = 2x - 3}$.", False, ""),
    (M, "-\\frac{35}{9}", "$\\boxed{-\\frac{35}{9}}$", True, "negative fraction"),
    (M, "-\\frac{35}{9}", "$\\boxed{\\frac{-35}{9}}$", True, ""),
    (M, "-\\frac{35}{9}", "$\\boxed{-\\dfrac{35}9}$", True, ""),
    (M, "-\\frac{35}{9}", "$\\boxed{\\frac{35}{9}}$", False, "sign"),
    (M, "-\\frac{35}{9}", "$\\boxed{-3.89}$", False, "rounded"),
    (M, "-\\sqrt{3}", "$\\tan \\theta = \\boxed{-\\sqrt3}$", True, ""),
    (M, "-9", "So $x = \\boxed{-9}$.", True, ""),
    (M, "-9", "So $x = \\boxed{9}$.", False, ""),
    (M, "-9", "So $x = \\boxed{\u22129}$.", True, ""),
    (M, "46", "Final Answer: The final answer is $46$. I hope it is correct.", True, "Minerva format"),
    (M, "46", "Final Answer: The final answer is $\\boxed{46}$. I hope it is correct.", True, ""),
    (M, "46", "Final Answer: The final answer is 46. I hope it is correct.", True, ""),
    (M, "46", "Final Answer: The final answer is $64$. I hope it is correct.", False, ""),
    (M, "46", "So $n = 46$.", True, "unboxed last math"),
    (
        M,
        "46",
        "The answer is $\\boxed{46}$.\n\nHowever, let me double-check: $46 = 2 \\cdot 23$. Yes.",
        True,
        "check after the box",
    ),
    (
        M,
        "46",
        "I think the answer is \\boxed{46}, but it might be \\boxed{47}.",
        False,
        "two different boxes",
    ),
    (M, "46", "\\boxed{46} \\boxed{46}", True, "same box twice"),
    (M, "46", "<think>maybe 47</think>The answer is $\\boxed{46}$.", True, ""),
    (M, "46", "<think>It is 46, I believe. Let me check again", False, "unfinished thinking"),
    (M, "46", "The answer is $\\boxed{\\text{46}}$.", True, ""),
    (M, "46", "The answer is $\\boxed{46.}$", True, "trailing period inside the box"),
    (M, "46", "The answer is $\\boxed{046}$.", True, "leading zero"),
    (M, "46", "The answer is $\\boxed{\\mathbf{46}}$.", True, ""),
    (M, "46", "The answer is $\\boxed{{46}}$.", True, "double braces"),
    (M, "\\frac{20000}{\\pi}", "The area is $\\boxed{\\frac{20000}{\\pi}}$.", True, ""),
    (M, "\\frac{20000}{\\pi}", "The area is $\\boxed{\\frac{20,000}{\\pi}}$.", True, ""),
    (M, "\\frac{20000}{\\pi}", "The area is $\\boxed{6366.2}$.", False, "rounded"),
    (M, "18+2\\pi", "$\\boxed{2\\pi + 18}$", True, ""),
    (M, "\\frac{11+9a}{20}", "$\\boxed{\\frac{9a+11}{20}}$", True, ""),
    (M, "\\frac{11+9a}{20}", "$\\boxed{\\frac{11}{20} + \\frac{9a}{20}}$", True, ""),
    (M, "6r^2-4r-24", "$\\boxed{6r^2 - 4r - 24}$", True, ""),
    (M, "5r^5", "$\\boxed{5r^{5}}$", True, ""),
    (M, "3R^2", "$\\boxed{3R^2}$", True, ""),
    # ------------------------------------------------------------------ DAPO "Answer:" lines
    (D, "34", "The largest such $n$ is 34.\nAnswer: 34", True, ""),
    (D, "34", "...\nAnswer: $34$", True, ""),
    (D, "34", "...\nAnswer: \\boxed{34}", True, ""),
    (D, "34", "...\nAnswer: n = 34", True, ""),
    (D, "34", "...\nAnswer: 34.", True, ""),
    (D, "34", "...\nAnswer: 43", False, ""),
    (
        D,
        "34",
        "...\nAnswer: 34\nWait, let me recheck. Actually $n = 35$.\nAnswer: 35",
        False,
        "last Answer line is wrong",
    ),
    (D, "34", "The answer is $\\boxed{34}$.", True, "box without Answer line"),
    (D, "34", "Answer: 34\n\\boxed{35}", False, "two different final answers"),
    (D, "\\frac{1}{2}", "...\nAnswer: \\frac{1}{2}", True, ""),
    (D, "\\frac{1}{2}", "...\nAnswer: 1/2", True, ""),
    (D, "\\frac{1}{2}", "...\nAnswer: 0.5", True, ""),
    (D, "\\frac{1}{2}", "...\nAnswer: \\frac12", True, ""),
    (D, "\\frac{1}{2}", "...\nAnswer: $\\dfrac{1}{2}$", True, ""),
    (D, "1000", "...\nAnswer: 1,000", True, ""),
    (D, "1000", "...\nAnswer: 1000 dollars", True, ""),
    (D, "-7", "...\nAnswer: -7", True, ""),
    (D, "-7", "...\nAnswer: 7", False, ""),
    (D, "2\\sqrt{2}", "...\nAnswer: 2\\sqrt2", True, ""),
    (D, "2\\sqrt{2}", "...\nAnswer: \\sqrt{8}", True, ""),
    (D, "2\\sqrt{2}", "...\nAnswer: 2.828", False, "rounded"),
    (D, "5", "...\nanswer: 5", True, ""),
    (D, "5", "...\n**Answer:** 5", True, ""),
    (D, "5", "...\nThe final answer: 5", True, ""),
    (D, "5", "We get $x = 5$ and $y = 3$, so the answer is 5 + 3 = 8.\nAnswer: 8", False, ""),
    (D, "8", "We get $x = 5$ and $y = 3$, so the answer is 5 + 3 = 8.\nAnswer: 8", True, ""),
    (D, "8", "Answer: 8 or 9", False, "hedge"),
    # ------------------------------------------------------------------ expressions after an answer phrase
    (D, "2\\sqrt{2}", "...\nAnswer: 2\\sqrt{2}", True, ""),
    (D, "2", "...\nAnswer: 2\\sqrt2", False, "the coefficient of the answer is not the answer"),
    (D, "3\\sqrt{13}", "So $AB^2 = 117$.\nAnswer: 3\\sqrt{13}", True, ""),
    (D, "3", "So $AB^2 = 117$.\nAnswer: 3\\sqrt{13}", False, ""),
    (D, "5\\pi", "The area is 5\\pi square units.\nAnswer: 5\\pi", True, ""),
    (D, "5", "Answer: 5\\pi", False, ""),
    (D, "2x+3", "Answer: 2x+3", True, ""),
    (D, "2", "Answer: 2x+3", False, ""),
    (D, "12000", "Answer: 12 \\times 10^3", True, ""),
    (D, "12", "Answer: 12 \\times 10^3", False, ""),
    (D, "6", "Answer: 6i", False, "6i is imaginary"),
    (M, "3\\sqrt{13}", "The answer is 3\\sqrt{13}.", True, ""),
    (M, "3\\sqrt{13}", "The answer is 3 \\sqrt{13}, which is about 10.8.", True, ""),
    (M, "1\\frac{4}{5}", "The answer is 1\\frac{4}{5}.", True, ""),
    (
        M,
        "137 \\frac{1}{2}",
        "Final Answer: The final answer is 137\\frac{1}{2}. I hope it is correct.",
        True,
        "",
    ),
    (M, "6 - 5i", "The answer is 6-5i.", True, ""),
    (M, "52_8", "The answer is 52_8.", True, ""),
    (M, "288 \\pi", "Final Answer: The final answer is 288\\pi. I hope it is correct.", True, ""),
    (M, "11\\sqrt2", "The answer is 11\\sqrt{2}.", True, ""),
    (M, "11\\sqrt2", "The answer is 11.", False, ""),
    (G, "2", "#### 2\\sqrt{2}", False, ""),
    (G, "10080", "The answer is 10,\\!080.", True, "LaTeX thousands separator"),
    (G, "10", "The answer is 10,\\!080.", False, "one number, not 10"),
    (G, "10080", "The answer is 10\\,080.", True, ""),
    (M, "\\frac{1000}{3}", "$\\boxed{\\frac{1,000}{3}}$", True, "thousands separator in a fraction"),
]


class _Timeout:
    """Stands in for verl's ``timeout_limit``: a decorator and a context manager."""

    def __init__(self, seconds: float, use_signals: bool = False) -> None:
        self.seconds = seconds

    def __call__(self, f: Any) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            with self:
                return f(*a, **k)

        return wrapped

    def __enter__(self) -> None:
        def fire(*_: Any) -> None:
            raise TimeoutError

        signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: Any) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _load(verl: Path) -> dict[str, Any]:
    for name in ("verl", "verl.utils"):
        m = types.ModuleType(name)
        m.__path__ = []
        sys.modules[name] = m
    pf = types.ModuleType("verl.utils.py_functional")
    pf.timeout_limit = _Timeout  # type: ignore[attr-defined]
    sys.modules[pf.__name__] = pf
    rs = types.ModuleType("verl.utils.reward_score")
    rs.__path__ = [str(verl / "utils" / "reward_score")]
    sys.modules[rs.__name__] = rs
    return {
        n: importlib.import_module(f"verl.utils.reward_score.{n}")
        for n in ("gsm8k", "math_reward", "math_dapo", "prime_math")
    }


def _lm_clean(s: str) -> str:
    # lm-eval gsm8k exact_match: ignore_case, regexes_to_ignore [",", "\$", "(?s).*#### ", "\.$"]
    for rx in (",", "\\$", "(?s).*#### ", "\\.$"):
        s = re.sub(rx, "", s)
    return s.lower().strip()


def lm_strict(response: str, gold: str) -> bool:
    found = re.findall(r"#### (\-?[0-9\.\,]+)", response)
    return bool(found) and _lm_clean(found[0]) == _lm_clean(gold)


def lm_flexible(response: str, gold: str) -> bool:
    found = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", response)
    return bool(found) and _lm_clean(next(x for x in found[-1] if x)) == _lm_clean(gold)


def _guarded(f: Any) -> bool | None:
    try:
        with _Timeout(20):
            return bool(f())
    except Exception:
        return None  # the reference raised: no verdict


def _verdicts(mods: dict[str, Any], source: str, gold: str, response: str) -> dict[str, bool | None]:
    refs: dict[str, bool | None] = {}
    if source == G:
        gsm8k = mods["gsm8k"].compute_score
        refs["verl_gsm8k_strict"] = _guarded(lambda: gsm8k(response, gold, method="strict") == 1.0)
        refs["verl_gsm8k_flexible"] = _guarded(lambda: gsm8k(response, gold, method="flexible") == 1.0)
        refs["lm_eval_strict"] = _guarded(lambda: lm_strict(response, gold))
        refs["lm_eval_flexible"] = _guarded(lambda: lm_flexible(response, gold))
    refs["verl_math"] = _guarded(lambda: mods["math_reward"].compute_score(response, gold) == 1.0)
    refs["verl_math_dapo"] = _guarded(lambda: mods["math_dapo"].compute_score(response, gold)["acc"])
    refs["verl_prime_math"] = _guarded(lambda: mods["prime_math"].compute_score(response, gold)[0])
    return refs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--verl", type=Path, required=True, help="the installed verl package directory")
    mods = _load(ap.parse_args().verl)
    cases = [
        {"source": s, "gold": g, "response": r, "label": lab, "note": n, "refs": _verdicts(mods, s, g, r)}
        for s, g, r, lab, n in CASES
    ]
    meta = {
        "verl": "0.9.1",
        "lm_eval": "gsm8k.yaml strict-match / flexible-extract",
        "produced_by": "tests/reward/data/make_verl_math_reference.py",
    }
    OUT.write_text(
        json.dumps({"meta": meta, "cases": cases}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
