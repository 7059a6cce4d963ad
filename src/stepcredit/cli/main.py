"""The ``stepcredit`` command: parses arguments, then calls one function per sub-command.

Each sub-command is a module in this package exposing ``configure(parser)`` and ``run(args) -> int``;
adding one means adding its name to ``COMMANDS``. Any :class:`~stepcredit.errors.UserError` ends as
one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from stepcredit import __version__
from stepcredit.errors import UserError
from stepcredit.runtime import share_cpus

COMMANDS: dict[str, str] = {
    "train": "Train with RL (SFT warm-up first): stepcredit train [--preset NAME] [key=value ...]",
    "sft": "Supervised warm-up only: stepcredit sft [--preset NAME] [--out DIR] [key=value ...]",
    "score": "Score a jsonl file of model outputs: stepcredit score --in F.jsonl --out F.jsonl [--workers N]",
    "data": "Prepare datasets: stepcredit data prepare gsm8k|math500 --out DIR",
    "explain": "Show episodes, V(prefix) and utilities of a response: stepcredit explain --model PATH --prompt T --response T --answer A [--html F] [--json]",
    "eval": "pass@1, pass@k and maj@k of a model: stepcredit eval --model PATH|tiny|smollm2 --data arith|gsm8k|math500|FILE [--n K] [--temperature T] [--limit N]",
    "config": "Print the merged configuration as YAML with each field's documentation: stepcredit config [--preset NAME | --config F] [key=value ...]",
    "probe": "Do process rewards find a wrong step? stepcredit probe --model M --data arith|gsm8k|FILE [--estimators a,b] [--png F] [--json]",
    "experiment": "Run a pre-registered comparison of arms over paired seeds: stepcredit experiment FILE.yaml [--jobs K] [--out DIR] [key=value ...]",
    "serve": "Serve the code sandbox behind SandboxFusion's /run_code API: stepcredit serve sandbox [--host H] [--port P]",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stepcredit", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"stepcredit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        mod = importlib.import_module(f"stepcredit.cli.{name.replace('-', '_')}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.configure(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    # before any command module imports torch: how OpenMP's threads wait, chosen by what else the
    # machine is doing, so other work slows a run about in proportion (stepcredit.runtime)
    share_cpus()
    parser = build_parser()
    # key=value overrides may follow options that follow a command's own positional argument
    # (`stepcredit experiment FILE.yaml --jobs 4 trainer.device=cuda`): argparse leaves them over
    raw = sys.argv[1:] if argv is None else argv
    for i, a in enumerate(raw, 1):
        try:
            a.encode("utf-8")
        except UnicodeEncodeError:  # bytes the locale could not decode (kept as lone surrogates)
            shown = a.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")[:80]
            parser.error(f"argument {i} ({shown}) is not valid UTF-8 text")
    args, extra = parser.parse_known_args(argv)
    if extra:
        if isinstance(getattr(args, "overrides", None), list) and all(
            "=" in e and not e.startswith("-") for e in extra
        ):
            args.overrides = [*args.overrides, *extra]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        msg = " ".join(str(e).split())
        print(f"stepcredit {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stepcredit: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
