"""``stepcredit explain``: the episodes of one response with V(prefix) and marginal utility U.

    stepcredit explain --model PATH --prompt TEXT --response TEXT --answer TEXT [--html FILE] [--json]
    stepcredit explain --from-run DIR [--index N] [--html FILE] [--json]

``--model tiny`` builds a random tiny model. The prompt is wrapped in the tokenizer's chat template
(``--raw-prompt`` uses it as is). Trailing ``key=value`` arguments override process settings
(e.g. ``process.min_episode_tokens=2``); with ``--from-run`` the run's ``config.yaml`` is read first.
With ``--json`` the last line is ``{"episodes": [{"start", "end", "text", "value", "utility"}, ...]}``
(``start``/``end`` are character offsets into the response, end exclusive).
"""

from __future__ import annotations

import argparse
import html
import json
from pathlib import Path
from typing import Any

from stepcredit.errors import UserError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", help="a model directory, or 'tiny' (default with --from-run: DIR/checkpoints/final/model)"
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
        "overrides", nargs="*", metavar="key=value", help="process settings, e.g. process.clip=1.0"
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


def _process_config(args: argparse.Namespace) -> Any:
    import yaml

    from stepcredit.cli.common import apply_overrides
    from stepcredit.config import from_dict

    data: dict[str, Any] = {}
    if args.from_run is not None and (args.from_run / "config.yaml").exists():
        full = yaml.safe_load((args.from_run / "config.yaml").read_text()) or {}
        if isinstance(full.get("process"), dict):
            data["process"] = full["process"]
    bad = [o for o in args.overrides if not o.split("=", 1)[0].strip().startswith("process.")]
    if bad:
        raise UserError(f"override {bad[0]!r}: explain takes only process.* settings")
    return from_dict(apply_overrides(data, list(args.overrides))).process


def _prompt_ids(tok: Any, prompt: Any, raw: bool) -> list[int]:
    if isinstance(prompt, str) and (raw or not getattr(tok, "chat_template", None)):
        text = prompt
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def explain(
    model: Any,
    tok: Any,
    prompt: Any,
    response: str,
    answer: str,
    cfg: Any,
    *,
    raw_prompt: bool = False,
    score_fn: Any = None,
) -> dict[str, Any]:
    """The report of one response: V_0 and its episodes (see :func:`describe_episodes`). ``score_fn``
    is the verifier, for value estimators whose registry entry says they need one."""
    import torch

    from stepcredit.process import compute_prefix_values, describe_episodes
    from stepcredit.types import Batch, Sample

    p_ids = _prompt_ids(tok, prompt, raw_prompt)
    r_ids = list(tok(response, add_special_tokens=False)["input_ids"])
    if not r_ids:
        raise UserError("--response: the response is empty")
    messages = ({"role": "user", "content": prompt},) if isinstance(prompt, str) else tuple(prompt)
    batch = Batch(
        samples=[Sample(prompt=messages, ground_truth=answer, uid="explain")],
        group_B=torch.zeros(1, dtype=torch.long),
        prompt_ids_BP=torch.tensor([p_ids], dtype=torch.long).reshape(1, -1),
        prompt_mask_BP=torch.ones(1, len(p_ids), dtype=torch.bool),
        response_ids_BT=torch.tensor([r_ids], dtype=torch.long),
        response_mask_BT=torch.ones(1, len(r_ids), dtype=torch.bool),
        behaviour_logp_BT=torch.zeros(1, len(r_ids)),
        texts=[response],
        truncated_B=torch.zeros(1, dtype=torch.bool),
    )
    got = compute_prefix_values(model, tok, batch, cfg, score_fn=score_fn)
    values = got.values[0]
    return {
        "episodes": describe_episodes(r_ids, tok, got.episode_ends[0], values, cfg),
        "v0": values[0],
        "answer": answer,
        "response": response,
    }


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"{'#':>3} {'tokens':>11} {'V':>9} {'U':>9}  text",
        f"{0:>3} {'(empty)':>11} {report['v0']:>9.4f} {'':>9}",
    ]
    for i, e in enumerate(report["episodes"], 1):
        text = e["text"].replace("\n", "\\n")
        text = text if len(text) <= 70 else text[:67] + "..."
        span = f"{e['token_start']}-{e['token_end']}"
        lines.append(f"{i:>3} {span:>11} {e['value']:>9.4f} {e['utility']:>+9.4f}  {text}")
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


def render_html(report: dict[str, Any], prompt: Any) -> str:
    """A self-contained page: the response with each episode coloured by U, and the V curve (SVG)."""
    eps = report["episodes"]
    scale = max((abs(e["utility"]) for e in eps), default=0.0)
    spans = "".join(
        f'<span class="ep" style="background:{_colour(e["utility"], scale)}" '
        f'title="episode {i}: V={e["value"]:.4f}  U={e["utility"]:+.4f}">'
        f"<sup>{i}</sup>{html.escape(e['text'])}</span>"
        for i, e in enumerate(eps, 1)
    )
    rows = "".join(
        f"<tr><td>{i}</td><td>{e['value']:.4f}</td><td>{e['utility']:+.4f}</td><td>{html.escape(e['text'])}</td></tr>"
        for i, e in enumerate(eps, 1)
    )
    prompt_text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>stepcredit explain</title>
<style>
body {{ font-family: sans-serif; max-width: 900px; margin: 2em auto; color: #222; }}
.resp {{ white-space: pre-wrap; font-family: monospace; line-height: 1.7; border: 1px solid #ddd; padding: 1em; }}
.ep {{ border-radius: 3px; padding: 1px 0; }}
sup {{ color: #666; font-size: 0.7em; margin-right: 2px; }}
table {{ border-collapse: collapse; font-size: 0.9em; }} td, th {{ border: 1px solid #ddd; padding: 3px 6px; }}
td:last-child {{ white-space: pre-wrap; font-family: monospace; }}
</style></head><body>
<h2>Process credit of one response</h2>
<p><b>Prompt:</b> {html.escape(prompt_text)}<br><b>Gold answer:</b> {html.escape(report["answer"])}<br>
V = mean log-probability of the gold answer after the prefix (V<sub>0</sub> = {report["v0"]:.4f} for the empty
response); U<sub>i</sub> = V<sub>i</sub> &minus; V<sub>i&minus;1</sub>. Green episodes raised V, red ones lowered it.</p>
<div class="resp">{spans}</div>
<h3>V after each episode</h3>
{_svg([report["v0"]] + [e["value"] for e in eps])}
<h3>Episodes</h3>
<table><tr><th>#</th><th>V</th><th>U</th><th>text</th></tr>{rows}</table>
</body></html>
"""


def run(args: argparse.Namespace) -> int:
    from stepcredit.cli.common import setup_runtime

    if args.from_run is not None:
        if not args.from_run.is_dir():
            raise UserError(f"--from-run {args.from_run}: no such directory")
        prompt, response, answer = _sample_from_run(args.from_run, args.index)
        for name in ("prompt", "response", "answer"):
            if getattr(args, name) is not None:
                raise UserError(f"--{name} cannot be combined with --from-run")
        model_path = args.model or str(args.from_run / "checkpoints" / "final" / "model")
    else:
        missing = [f"--{n}" for n in ("model", "prompt", "response", "answer") if getattr(args, n) is None]
        if missing:
            raise UserError(f"missing {', '.join(missing)} (or use --from-run DIR)")
        prompt, response, answer, model_path = args.prompt, args.response, args.answer, args.model
    cfg = _process_config(args)
    setup_runtime()
    import torch

    from stepcredit.config import Config, ModelConfig
    from stepcredit.models import load_policy
    from stepcredit.process import VALUE_ESTIMATORS, check_config
    from stepcredit.reward import build_rewarder

    check_config(Config(process=cfg))
    if model_path != "tiny" and not Path(model_path).is_dir():
        raise UserError(f"--model {model_path}: model directory does not exist")
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model, tok = load_policy(ModelConfig(path=model_path, gguf_file=args.gguf_file))
    if VALUE_ESTIMATORS.get(cfg.value_estimator).needs_verifier:
        # Continuations are scored against the gold answer by the default verifier.
        with build_rewarder() as rewarder:
            report = explain(
                model,
                tok,
                prompt,
                response,
                answer,
                cfg,
                raw_prompt=args.raw_prompt,
                score_fn=rewarder.verifier_fn(),
            )
    else:
        report = explain(model, tok, prompt, response, answer, cfg, raw_prompt=args.raw_prompt)
    print(_table(report))
    if args.html is not None:
        args.html.parent.mkdir(parents=True, exist_ok=True)
        args.html.write_text(render_html(report, prompt), encoding="utf-8")
        print(f"wrote {args.html}")
    if args.json:
        print(json.dumps(report))
    return 0
