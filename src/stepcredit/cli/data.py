"""``stepcredit data prepare gsm8k|math500 --out DIR``: verl-style parquet from the shared raw data."""

from __future__ import annotations

import argparse

from stepcredit.data.prepare import DATASETS, prepare, shared_data_dir


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("prepare", help="write <out>/<split>.parquet in verl's schema")
    p.add_argument("dataset", choices=sorted(DATASETS), help="which dataset")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--src", default=None, help="raw data directory (default: $STEPCREDIT_SHARED_DATA or ../shared/data)"
    )


def run(args: argparse.Namespace) -> int:
    src = args.src or shared_data_dir()
    written = prepare(args.dataset, args.out, src=src)
    import pyarrow.parquet as pq

    for split, path in written.items():
        print(f"{args.dataset} {split}: {pq.read_metadata(path).num_rows} rows -> {path}")
    return 0
