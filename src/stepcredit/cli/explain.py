"""``stepcredit explain``: the episodes of one response with V(prefix) and marginal utility U.

    stepcredit explain --model PATH --prompt TEXT --response TEXT --answer TEXT [--html FILE] [--json]
    stepcredit explain --from-run DIR [--index N] [--html FILE] [--json]

``--model`` is what every command takes (a model or run directory, ``tiny``, a packaged model). The
prompt is wrapped in the tokenizer's chat template (``--raw-prompt`` uses it as is). The command
parses, calls :func:`stepcredit.trainer.explain.explain` and prints: the value estimator and what its V
measures, the outcome (the verifier's score), per episode V, the step credit c (U) and the per-token
advantage the configured ``algorithm.advantage`` gives, with a legend. Trailing ``key=value`` arguments
override ``process.*``, ``algorithm.*``, ``reward.*`` and ``rollout.*`` settings (e.g.
``process.min_episode_tokens=2``); the run's ``config.yaml`` (``--from-run``, or ``--model RUN_DIR``)
or a packaged model's preset is read first, then ``--preset``'s; without any the advantage is the
``process`` preset's (``grpo_process``). With ``rollout.mode=tools`` (a tool run's config, ``--preset
tools``) the prompt is the tool rollout's and every value estimator that takes tools values a prefix as
training does: continuations run the calls in the reward agent, a forced answer at a call is forced
after its result. With ``--json`` the last line is the :class:`Explanation`
(``{"value_estimator", "outcome", "v0", "episodes": [{"start", "end", "text", "value", "utility",
"advantage", "observation", "tool_call"}, ...], "turns", ...}``; ``start``/``end`` are character offsets
into the response, end exclusive). A response whose turns called tools is shown per turn: each turn's
call, the tool result that opens the next turn (marked: attended to, never trained on, no advantage)
and each turn's credit.
"""

from __future__ import annotations

import argparse
import html
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepcredit.errors import UserError
from stepcredit.models.resolve import ResolvedModel
from stepcredit.trainer.explain import Explanation


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="a model directory, a run directory, 'tiny' or a packaged model (default with --from-run: the run's)",
    )
    p.add_argument("--gguf-file", default="", help="a GGUF file inside the model directory")
    p.add_argument("--prompt", help="the question (user message)")
    p.add_argument("--response", help="the response to explain")
    p.add_argument("--answer", help="the gold answer")
    p.add_argument("--from-run", type=Path, metavar="DIR", help="take the sample from DIR/samples.jsonl")
    p.add_argument(
        "--index", type=int, default=0, help="with --from-run: which line of samples.jsonl (from 0)"
    )
    p.add_argument("--raw-prompt", action="store_true", help="do not wrap the prompt in the chat template")
    p.add_argument(
        "--html", type=Path, metavar="FILE", help="write an HTML page (episodes coloured by U, the V curve)"
    )
    p.add_argument("--json", action="store_true", help="print a JSON object as the last line")
    p.add_argument(
        "--preset",
        help="read the process, algorithm, reward, rollout and data settings from this preset (e.g. tools); "
        "they win over the run's and the packaged model's",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="process.*, algorithm.*, reward.*, rollout.* or data.* settings, e.g. process.clip=1.0",
    )


def _sample_from_run(run: Path, index: int) -> tuple[Any, str, str]:
    f = run / "samples.jsonl"
    if not f.exists():
        raise UserError(f"--from-run {run}: no samples.jsonl in that directory")
    lines = [ln for ln in f.read_text().splitlines() if ln.strip()]
    if not 0 <= index < len(lines):
        raise UserError(f"--index {index}: {f} has {len(lines)} samples")
    try:
        row = json.loads(lines[index])
        return row["prompt"], str(row["response"]), str(row["ground_truth"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(
            f"{f} line {index + 1}: expected JSON with prompt, response, ground_truth ({e})"
        ) from None


_SECTIONS = ("process", "algorithm", "reward", "rollout", "data")
"""The config sections explain reads (from the run) and takes overrides for (``rollout``: whether and
how the policy calls tools, which continuations then do too)."""


def _config(args: argparse.Namespace, model: ResolvedModel) -> Any:
    import yaml

    from stepcredit.cli.common import apply_overrides, load_preset
    from stepcredit.config import from_dict

    # without a run: the process preset's advantage (grpo_process), which reads the process channel
    data: dict[str, Any] = {"algorithm": load_preset("process")["algorithm"]}
    if model.preset:  # a packaged model's preset: its force prompt and episode settings fit the model
        own = load_preset(model.preset)
        data.update({k: own[k] for k in _SECTIONS if isinstance(own.get(k), dict)})
    run_config = args.from_run / "config.yaml" if args.from_run is not None else model.run_config
    if run_config is not None and run_config.exists():
        full = yaml.safe_load(run_config.read_text()) or {}
        data.update({k: full[k] for k in _SECTIONS if isinstance(full.get(k), dict)})
    if args.preset:
        own = load_preset(args.preset)
        data.update({k: own[k] for k in _SECTIONS if isinstance(own.get(k), dict)})
    bad = [o for o in args.overrides if o.split("=", 1)[0].strip().split(".")[0] not in _SECTIONS]
    if bad:
        raise UserError(
            f"override {bad[0]!r}: explain takes only process.*, algorithm.*, reward.*, rollout.* and data.* settings"
        )
    return from_dict(apply_overrides(data, list(args.overrides)))


def _adv(a: list[float]) -> str:
    if not a:
        return "-"
    lo, hi = min(a), max(a)
    return f"{a[0]:+.3f}" if hi - lo < 1e-6 else f"{a[0]:+.3f}..{a[-1]:+.3f}"


def _legend(r: Explanation) -> list[str]:
    outcome = "not scored" if r.outcome != r.outcome else f"{r.outcome:.3f}"
    adv = r.advantage_note or (
        f"{r.advantage_estimator} (process_weight {r.process_weight:g}), for a group of this one response"
    )
    lines = [
        f"value estimator: {r.value_estimator}; V = {r.value_unit}",
        f"credit form: {r.credit}; c = {r.credit_unit}",
        f"advantage: {adv}; A = {r.advantage_unit}",
        f"outcome: {outcome} ({r.outcome_status}) against the gold answer {r.answer!r}",
    ]
    if r.turns:
        lines.append(
            f"turns: {r.turns} (each tool call ends a turn, an episode; the tool's result opens the next "
            "turn and is never trained on: no credit, no advantage)"
        )
    return lines


# control characters shown escaped: a policy's or a tool's text (ANSI escapes, carriage returns) must not
# drive the terminal the table is printed to
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]} | {0x0A: "\\n", 0x09: "\\t"}


def _short(text: str, n: int = 60) -> str:
    text = text.translate(_CONTROLS)
    return text if len(text) <= n else text[: n - 3] + "..."


def _table(r: Explanation) -> str:
    lines = [
        *_legend(r),
        f"{'#':>3} {'tokens':>11} {'V':>9} {'c (U)':>9} {'A per token':>17}  text",
        f"{0:>3} {'(empty)':>11} {r.v0:>9.4f} {'':>9} {'':>17}",
    ]
    for i, e in enumerate(r.episodes, 1):
        text = e.text[len(e.observation) :] if e.text.startswith(e.observation) else e.text
        if e.observation:
            lines.append(
                f"{'':>3} {'result':>11} {'':>9} {'':>9} {'not trained':>17}  {_short(e.observation)}"
            )
        span = f"{e.token_start}-{e.token_end}"
        call = f"  -> calls {_short(e.tool_call, 50)}" if e.tool_call else ""
        lines.append(
            f"{i:>3} {span:>11} {e.value:>9.4f} {e.utility:>+9.4f} {_adv(e.advantage):>17}  {_short(text)}{call}"
        )
    lines.append(
        "legend: V = value after the episode (V_0: empty response); c (U) = the episode's step credit, "
        "paid at its last token (default U_i = V_i - V_(i-1)); A per token = the advantage its tokens get "
        "(first..last when they differ); outcome = verifier score of the whole response"
    )
    return "\n".join(lines)


def _colour(u: float, scale: float) -> str:
    a = min(abs(u) / scale, 1.0) if scale > 0 else 0.0
    rgb = "40,160,70" if u >= 0 else "210,50,50"
    return f"rgba({rgb},{0.12 + 0.6 * a:.3f})"


def _svg(values: list[float], width: int = 640, height: int = 200) -> str:
    pad = 36
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    n = max(len(values) - 1, 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return pad + (width - 2 * pad) * i / n, height - pad - (height - 2 * pad) * (v - lo) / (hi - lo)

    pts = [xy(i, v) for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
    dots = "".join(
        f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5"><title>V_{i} = {values[i]:.4f}</title></circle>'
        for i, (x, y) in enumerate(pts)
    )
    ticks = "".join(
        f'<text x="{x:.1f}" y="{height - pad + 16}" text-anchor="middle">{i}</text>'
        for i, (x, _) in enumerate(pts)
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11" '
        f'font-family="sans-serif">'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="#888"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#888"/>'
        f'<text x="{pad - 4}" y="{pad + 4}" text-anchor="end">{hi:.2f}</text>'
        f'<text x="{pad - 4}" y="{height - pad}" text-anchor="end">{lo:.2f}</text>'
        f'<text x="{width / 2}" y="{height - 4}" text-anchor="middle">episode (0 = empty response)</text>'
        f'<polyline points="{path}" fill="none" stroke="#3060c0" stroke-width="2"/>'
        f'<g fill="#3060c0">{dots}</g>{ticks}</svg>'
    )


def _own(e: Any) -> str:
    """The episode's text without the tool result that opens it."""
    return e.text[len(e.observation) :] if e.text.startswith(e.observation) else e.text


def _html_response(r: Explanation, unit: str) -> str:
    """The response, each episode coloured by its credit (green positive, red negative), its figures
    in the tooltip; a tool result that opens an episode in grey italics."""
    scale = max((abs(e.utility) for e in r.episodes), default=0.0)

    def obs(e: Any) -> str:
        if not e.observation:
            return ""
        return (
            f'<span class="obs" title="tool result: attended to, never trained on (no credit, no advantage)">'
            f"{html.escape(e.observation)}</span>"
        )

    return "".join(
        f'{obs(e)}<span class="ep" style="background:{_colour(e.utility, scale)}" '
        f'title="{unit} {i}: V={e.value:.4f}  c={e.utility:+.4f}  A={_adv(e.advantage)}'
        f'{html.escape("  calls " + e.tool_call, quote=True) if e.tool_call else ""}">'
        f"<sup>{i}</sup>{html.escape(_own(e))}</span>"
        for i, e in enumerate(r.episodes, 1)
    )


def _html_rows(r: Explanation) -> str:
    """The table's rows: per episode V, c, the advantage of each token (and a turn's result and call)."""
    return "".join(
        f"<tr><td>{i}</td><td>{e.value:.4f}</td><td>{e.utility:+.4f}</td>"
        f"<td>{html.escape(' '.join(f'{a:+.3f}' for a in e.advantage) or '-')}</td>"
        + (
            f'<td class="obs">{html.escape(e.observation)}</td><td>{html.escape(e.tool_call)}</td>'
            if r.turns
            else ""
        )
        + f"<td>{html.escape(_own(e))}</td></tr>"
        for i, e in enumerate(r.episodes, 1)
    )


def render_html(r: Explanation, prompt: Any) -> str:
    """A self-contained page: the legend, the response with each episode coloured by its credit, the V
    curve (SVG) and a table of V, credit and per-token advantage."""
    eps = r.episodes
    unit = "turn" if r.turns else "episode"
    spans = _html_response(r, unit)
    turn_cols = "<th>tool result (not trained)</th><th>tool call</th>" if r.turns else ""
    rows = _html_rows(r)
    turns_note = (
        f"<p>{r.turns} turns: each tool call ends a turn; the tool's result (grey, in italics) "
        "opens the next turn and is attended to but never trained on: no credit, no advantage.</p>"
        if r.turns
        else ""
    )
    legend = "<br>".join(html.escape(line) for line in _legend(r))
    prompt_text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>stepcredit explain</title>
<style>
body {{ font-family: sans-serif; max-width: 900px; margin: 2em auto; color: #222; }}
.resp {{ white-space: pre-wrap; font-family: monospace; line-height: 1.7; border: 1px solid #ddd; padding: 1em; }}
.ep {{ border-radius: 3px; padding: 1px 0; }}
.obs {{ color: #666; background: #e8e8e8; font-style: italic; }}
sup {{ color: #666; font-size: 0.7em; margin-right: 2px; }}
table {{ border-collapse: collapse; font-size: 0.9em; }} td, th {{ border: 1px solid #ddd; padding: 3px 6px; }}
td:last-child {{ white-space: pre-wrap; font-family: monospace; }}
</style></head><body>
<h2>Process credit of one response</h2>
<p><b>Prompt:</b> {html.escape(prompt_text)}<br><b>Gold answer:</b> {html.escape(r.answer)}</p>
<p class="legend">{legend}<br>
V<sub>0</sub> = {r.v0:.4f} (empty response); V<sub>i</sub> = value after episode i; c<sub>i</sub> = the step
credit episode i pays at its last token (default U<sub>i</sub> = V<sub>i</sub> &minus; V<sub>i&minus;1</sub>);
A = the advantage of each of its tokens. Green episodes got positive credit, red ones negative.</p>
{turns_note}<div class="resp">{spans}</div>
<h3>V after each {unit}</h3>
{_svg([r.v0] + [e.value for e in eps])}
<h3>{unit.capitalize()}s</h3>
<table><tr><th>#</th><th>V</th><th>c (U)</th><th>A per token</th>{turn_cols}<th>text</th></tr>{rows}</table>
</body></html>
"""


def _inputs(args: argparse.Namespace) -> tuple[Any, str, str, str]:
    """(prompt, response, answer, model) from the flags or the run's samples.jsonl."""
    if args.from_run is not None:
        if not args.from_run.is_dir():
            raise UserError(f"--from-run {args.from_run}: no such directory")
        prompt, response, answer = _sample_from_run(args.from_run, args.index)
        for name in ("prompt", "response", "answer"):
            if getattr(args, name) is not None:
                raise UserError(f"--{name} cannot be combined with --from-run")
        return prompt, response, answer, args.model or str(args.from_run)
    missing = [f"--{n}" for n in ("model", "prompt", "response", "answer") if getattr(args, n) is None]
    if missing:
        raise UserError(f"missing {', '.join(missing)} (or use --from-run DIR)")
    return args.prompt, args.response, args.answer, args.model


def run(args: argparse.Namespace) -> int:
    from stepcredit.cli.common import setup_runtime
    from stepcredit.models.resolve import resolve_model

    prompt, response, answer, spec = _inputs(args)
    model_ref = resolve_model(spec)
    cfg = _config(args, model_ref)
    cfg = replace(cfg, model=replace(cfg.model, path=model_ref.path, gguf_file=args.gguf_file or ""))
    setup_runtime()
    import torch

    from stepcredit.process import check_config
    from stepcredit.reward import REWARDS, build_rewarder
    from stepcredit.rollout import ROLLOUT_MODES
    from stepcredit.trainer.explain import explain
    from stepcredit.trainer.rollout import tool_context
    from stepcredit.trainer.setup import policy

    check_config(cfg)
    # rollout.mode=tools: continuations run the calls as in training (the mode's own start-up check
    # imports rollout.tools.modules and checks the names and the parser)
    with_tools = ROLLOUT_MODES.get(cfg.rollout.mode).uses_tools
    check = ROLLOUT_MODES.get(cfg.rollout.mode).check
    if with_tools and check is not None:
        check(cfg)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    # the outcome is scored as the task's rows are: data.task names its reward where one is registered
    # under it (arith_tools: the integer answer), else the math verifier's arith
    source = cfg.data.task if cfg.data.task in REWARDS else "arith"
    with policy(cfg) as (model, tok), build_rewarder(cfg.reward) as rewarder:
        report = explain(
            model, tok, prompt, response, answer, cfg, rewarder, raw_prompt=args.raw_prompt,
            data_source=source,
            # the calls run in the reward agent, as the trainer's continuations do
            tools=tool_context(cfg, rewarder),
        )  # fmt: skip
    print(_table(report))
    if args.html is not None:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(report, prompt), encoding="utf-8")
        print(f"wrote {args.html}")
    if args.json:
        print(json.dumps(report.to_dict()))
    return 0
