"""``stepcredit serve sandbox [--host H] [--port P]``: the bubblewrap sandbox behind SandboxFusion's API.

Point VeRL's ``reward_model.sandbox_fusion.url`` (or stepcredit's ``reward.sandbox.url`` with
``reward.sandbox.backend=sandbox_fusion``) at the printed ``/run_code`` URL. Loopback only unless
``--allow-remote``.
"""

from __future__ import annotations

import argparse

from stepcredit.sandbox.fusion_server import SandboxServer


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("sandbox", help="serve POST /run_code (SandboxFusion's API) on the local sandbox")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (0: any free port; default 8080)")
    p.add_argument("--concurrency", type=int, default=2, help="programs run at once (default 2)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a slot (503 beyond)")
    p.add_argument("--max-request-kb", type=int, default=1024, help="largest request body (413 beyond)")
    p.add_argument("--max-timeout-s", type=float, default=30.0, help="cap on a request's run_timeout")
    p.add_argument("--max-memory-mb", type=int, default=2048, help="cap on a request's memory_limit_MB")
    p.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow binding a non-loopback address (anyone who can "
        "reach it can run programs on this machine, inside the sandbox)",
    )


def run(args: argparse.Namespace) -> int:
    server = SandboxServer(
        args.host,
        args.port,
        concurrency=args.concurrency,
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_kb * 1024,
        max_timeout_s=args.max_timeout_s,
        max_memory_mb=args.max_memory_mb,
        allow_remote=args.allow_remote,
    )
    try:
        server.check()
        print(f"stepcredit sandbox serving SandboxFusion's API at {server.url}", flush=True)
        server.serve_forever()
    finally:
        server.httpd.server_close()
    return 0
