"""stepcredit's bubblewrap sandbox behind SandboxFusion's HTTP API (``stepcredit serve sandbox``).

``POST /run_code`` takes the request VeRL's ``sandbox_fusion`` client sends (``code``, ``language``,
``stdin``, ``compile_timeout``, ``run_timeout``, ``memory_limit_MB``, ``files``, ``fetch_files``) and
answers the fields it reads: ``status`` (``Success``, ``Failed``, ``SandboxError``), ``message``,
``compile_result`` (null: Python is not compiled) and ``run_result`` (``status`` ``Finished`` or
``TimeLimitExceeded``, ``execution_time``, ``return_code`` (negative: killed by that signal), ``stdout``,
``stderr``). ``GET /v1/ping`` answers ``pong``. A VeRL user points ``reward_model.sandbox_fusion.url`` at
``http://HOST:PORT/run_code`` and changes nothing else.

Every program runs in the local :class:`~.bwrap.Sandbox` (one bubblewrap sandbox per request, its
limits, its containment), never a second sandbox: the request's ``run_timeout`` and
``memory_limit_MB`` are honoured up to the server's maxima. At most ``concurrency`` programs run at once;
up to ``max_queue`` more wait for a slot and any beyond are refused (503). A body over
``max_request_bytes`` is refused (413) unread. The server binds loopback unless told otherwise.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stepcredit.config import SandboxConfig
from stepcredit.errors import UserError
from stepcredit.sandbox.bwrap import Sandbox
from stepcredit.sandbox.cases import CaseMode, TestCase
from stepcredit.sandbox.judging import SANDBOX_ERROR, memory_message

__all__ = ["SandboxServer", "is_loopback"]

LANGUAGES = ("python", "python3")


def is_loopback(host: str) -> bool:
    """True when every address ``host`` names is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    owner: SandboxServer


class SandboxServer:
    """The sandbox behind ``/run_code``: ``serve_forever()`` in one thread, ``shutdown()`` from another."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        cfg: SandboxConfig | None = None,
        concurrency: int = 2,
        max_queue: int = 64,
        max_request_bytes: int = 1 << 20,
        max_timeout_s: float = 30.0,
        max_memory_mb: int = 2048,
        allow_remote: bool = False,
    ) -> None:
        if not allow_remote and not is_loopback(host):
            raise UserError(
                f"refusing to serve the sandbox on {host!r}, which is not a loopback address: anyone who "
                "can reach it can run programs here; pass --allow-remote to do it anyway"
            )
        if concurrency < 1 or max_queue < 0 or max_request_bytes < 1024 or max_timeout_s <= 0:
            raise UserError(
                "serve sandbox: --concurrency >= 1, --max-queue >= 0, --max-request-kb >= 1 needed"
            )
        self.cfg = cfg or SandboxConfig()
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.max_request_bytes = max_request_bytes
        self.max_timeout_s = max_timeout_s
        self.max_memory_mb = max(64, max_memory_mb)
        self._slots = threading.BoundedSemaphore(concurrency)
        self._lock = threading.Lock()
        self._in_flight = 0
        self.served = 0
        """Programs run so far (for logs and tests)."""
        self._sandboxes: dict[tuple[float, int], Sandbox] = {}
        cls = type(
            "_Server", (_HTTPServer,), {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET}
        )
        self.httpd: _HTTPServer = cls((host, port), _Handler)
        self.httpd.owner = self

    @property
    def url(self) -> str:
        """``http://host:port/run_code`` of the bound socket (the port chosen by the OS when 0 was asked)."""
        host, port = self.httpd.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/run_code"

    def check(self) -> None:
        """The start-up probe: a known-good program must pass in the sandbox (UserError if not)."""
        why = self.sandbox(self.cfg.timeout_s, self.cfg.memory_mb).unavailable()
        if why is not None:
            raise UserError(f"serve sandbox: the local sandbox does not work: {why}")

    def serve_forever(self) -> None:
        self.httpd.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def sandbox(self, timeout_s: float, memory_mb: int) -> Sandbox:
        """The sandbox with these limits (one per pair, kept: each caches its start-up probe)."""
        key = (timeout_s, memory_mb)
        with self._lock:
            sb = self._sandboxes.get(key)
            if sb is None:
                cfg = dataclasses.replace(
                    self.cfg, timeout_s=timeout_s, memory_mb=memory_mb, concurrency=self.concurrency
                )
                sb = self._sandboxes[key] = Sandbox(cfg)
            return sb

    # ------------------------------------------------------------------------------------- work
    def run_code(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, reply) for one ``/run_code`` request body (already parsed)."""
        code, stdin, language = request.get("code"), request.get("stdin"), request.get("language", "python")
        if not isinstance(code, str) or not (stdin is None or isinstance(stdin, str)):
            return 400, _error("'code' must be a string and 'stdin' a string or null")
        if language not in LANGUAGES:
            return 200, _error(f"language {language!r} is not supported: this server runs Python only")
        timeout = _number(request.get("run_timeout"), self.cfg.timeout_s)
        timeout = min(max(timeout, 0.1), self.max_timeout_s)
        memory = int(_number(request.get("memory_limit_MB"), self.cfg.memory_mb))
        memory = min(max(memory, 64) if memory > 0 else self.max_memory_mb, self.max_memory_mb)
        with self._lock:
            if self._in_flight >= self.concurrency + self.max_queue:
                return 503, _error("the sandbox server is busy: too many requests waiting")
            self._in_flight += 1
        try:
            with self._slots:
                sb = self.sandbox(timeout, memory)
                out = sb.run_program(code, [TestCase(CaseMode.STDIO, stdin=stdin or "", expected="")])[0]
        finally:
            with self._lock:
                self._in_flight -= 1
                self.served += 1
        done = out.detail
        if out.status == SANDBOX_ERROR or not done:
            return 200, _error(out.message or "the sandbox failed")
        sig, exit_code = done.get("sig"), done.get("exit")
        run: dict[str, Any] = {
            "status": "Finished",
            "execution_time": round(float(done.get("wall") or out.latency_s), 4),
            "return_code": exit_code,
            "stdout": str(done.get("out", "")),
            "stderr": str(done.get("err", "")),
        }
        # wall clock, SIGXCPU (a process's CPU-time limit) or the CPU time of all its processes together
        timed_out = bool(done.get("timeout") or sig == 24 or done.get("cpu"))
        if timed_out:
            run.update(status="TimeLimitExceeded", return_code=None)
        elif done.get("overflow"):
            run.update(return_code=-9, stderr=run["stderr"] + "\n[stepcredit] output limit exceeded")
        elif done.get("memory"):
            run.update(
                return_code=-9, stderr=run["stderr"] + f"\n[stepcredit] {memory_message(done['memory'])}"
            )
        elif sig:
            run["return_code"] = -int(sig)
        ok = not timed_out and run["return_code"] == 0
        reply: dict[str, Any] = {"status": "Success" if ok else "Failed", "message": ""}
        reply["compile_result"] = None
        reply.update(run_result=run, executor_pod_name=None, files={})
        return 200, reply


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _error(message: str) -> dict[str, Any]:
    return {
        "status": "SandboxError",
        "message": message,
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": None,
        "files": {},
    }


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # a client that stops sending its body is dropped

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
        return

    def _send(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(body, str) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        match self.path.split("?")[0]:
            case "/v1/ping":
                self._send(200, "pong")
            case _:
                self._send(404, _error(f"no such endpoint: GET {self.path[:100]}"))

    def do_POST(self) -> None:
        match self.path.split("?")[0]:
            case "/run_code":
                self._run_code()
            case _:
                self.close_connection = True
                self._send(404, _error(f"no such endpoint: POST {self.path[:100]} (use /run_code)"))

    def _run_code(self) -> None:
        owner = self.server.owner
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            self._send(411, _error("a Content-Length header is required"))
            return
        if length > owner.max_request_bytes or length < 0:
            self.close_connection = True  # the body is left unread
            self._send(413, _error(f"request body of {length} bytes is over {owner.max_request_bytes}"))
            return
        try:
            request = json.loads(self.rfile.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            self._send(400, _error("the request body is not JSON"))
            return
        if not isinstance(request, dict):
            self._send(400, _error("the request body must be a JSON object"))
            return
        status, reply = owner.run_code(request)
        self._send(status, reply)
