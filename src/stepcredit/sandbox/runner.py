# ruff: noqa: SIM105, B905  (no contextlib: its import costs every program; zip(strict=) needs 3.10)
"""The process manager inside the sandbox: runs each test case of one program in a fresh child.

This file is bound into the sandbox and run by its interpreter as pid 1 of its pid namespace (``bwrap
--as-pid-1``): ``python -I -S -B runner.py LIMITS``. It imports only cheap standard modules (no json, re,
enum, signal, traceback: every program would pay their import) and stays valid on any Python >= 3.8.

It is *not* trusted with the verdict and holds nothing secret: the host never sends it an expected value
or an assert statement, only a case's stdin, or calls such as ``f(1, 2)`` to make. Its answers are checked
by the host (``plain.decode_plain``): a program that took it over could only claim what it could return
anyway. Being pid 1, it cannot be signalled from inside the namespace (signals without a handler are
dropped for pid 1), and it is non-dumpable: the program can't ptrace it or open ``/proc/1/fd``, ``/mem``.
It holds one capability, CAP_SYS_ADMIN in the sandbox's own user namespace, to mount each case's /tmp in
a mount namespace of its own; every case's child drops it (all capabilities) before the program runs.

Protocol. Host -> runner on fd 0: frames of a 4-byte big-endian length and a ``marshal``-ed dict
(the host is trusted here). Runner -> host on fd 1: one JSON object per line, written by hand below.

* runner: ``{"op": "hello"}`` once its limits are in place (no hello: the sandbox failed).
* host ``{"op": "program", "source": ...}``: the sandbox's one program (any later one is ignored).
* host ``{"op": "case", "mode": "stdio"|"calls"|"eval", ...}``: a fresh /tmp is mounted and a child forked:
  limits, cwd /tmp, then the program (``stdio``: as ``__main__`` with the case's stdin on a pipe).
  ``calls``: after the program, the child makes the given calls and writes one answer line for each.
  ``eval``: after the program the child reports ``ready`` and answers requests until told to end.
* runner: ``{"op": "ready"}`` (eval) or ``{"op": "done", ...}`` when the case is over.
* host ``{"op": "req", "r": {...}}`` -> runner ``{"op": "reply", "r": "<the child's raw line>"}`` or
  ``done``; host ``{"op": "end"}`` -> ``done``. ``done`` carries the exit code or signal, whether the case
  timed out, wrote too much, held too much memory or spent too much CPU time (its processes together,
  checked every 10 ms, also while the host thinks between an ``eval`` case's requests), its stdout, the tail of its stderr and its answer lines. After every case all
  its processes are killed (``kill(-1)`` from pid 1 reaches every other one of the namespace), reaped.
"""

import _signal
import gc
import marshal
import os
import resource
import select
import sys
import time

RUNNER_FAILED = 97
_MB = 1024 * 1024
_SIGKILL, _SIGXFSZ = 9, 25


# ------------------------------------------------------------------------------ JSON out
_ESCAPES = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES[ord('"')] = '\\"'
_ESCAPES[ord("\\")] = "\\\\"


def _is_utf8(b):
    """Is ``b`` valid UTF-8 (the output cap may cut a character in two: a cut tail still counts)?"""
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError as e:
        return e.start >= len(b) - 3 and e.reason == "unexpected end of data"


def _u_escape(c):
    if c < 0x10000:
        return f"\\u{c:04x}"
    c -= 0x10000
    return f"\\u{0xD800 + (c >> 10):04x}\\u{0xDC00 + (c & 0x3FF):04x}"


def _json(value):
    """JSON text of None/bool/int/float/str/list/dict(str keys); lone surrogates become \\u escapes."""
    t = type(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is int:
        return str(value)
    if t is float:
        return repr(value)
    if t is str:
        text = value.translate(_ESCAPES)
        if not text.isascii():  # JSON's \u escapes (UTF-16, as JSON has them), never a lost character
            text = "".join(ch if ch < "\x80" else _u_escape(ord(ch)) for ch in text)
        return '"' + text + '"'
    if t is list:
        return "[" + ",".join(_json(v) for v in value) + "]"
    if t is dict:
        return "{" + ",".join(_json(str(k)) + ":" + _json(v) for k, v in value.items()) + "}"
    raise TypeError(t.__name__)


# ------------------------------------------------------------------------------ plain values
class NotPlain(Exception):
    pass


def encode_plain(value, depth=0):
    """Exact builtin types only (the host's plain.decode_plain re-checks everything)."""
    if depth > 100:
        raise NotPlain("value nested too deeply")
    t = type(value)
    if value is None or t is bool or t is int or t is str:
        return value
    if t is float:
        return value if value - value == 0 else {"f": repr(value)}  # nan and inf are tagged
    if t is list:
        return [encode_plain(v, depth + 1) for v in value]
    if t is tuple:
        return {"t": [encode_plain(v, depth + 1) for v in value]}
    if t is set:
        return {"s": [encode_plain(v, depth + 1) for v in value]}
    if t is dict:
        return {"d": [[encode_plain(k, depth + 1), encode_plain(v, depth + 1)] for k, v in value.items()]}
    raise NotPlain(f"a {t.__name__}")


# ------------------------------------------------------------------------------------- child
def _arg(value, handles):
    # A reference to an object kept here travels as bytes (never a plain value).
    return handles[int(value)] if type(value) is bytes else value


def _wrap(value, handles):
    try:
        return {"v": encode_plain(value)}
    except NotPlain:
        handles.append(value)
        return {"h": len(handles) - 1}


def _serve_names(req, ns, handles):
    return {"found": {n: _wrap(ns[n], handles) for n in req["names"] if n in ns}}


def _serve_attr(req, ns, handles):
    return _wrap(getattr(handles[req["ref"]["h"]], req["name"]), handles)


def _serve_call(req, ns, handles):
    target = handles[req["ref"]["h"]]
    args = [_arg(a, handles) for a in req["args"]]
    kwargs = {k: _arg(v, handles) for k, v in req["kwargs"].items()}
    result = target(*args, **kwargs)
    try:
        return {"v": encode_plain(result)}
    except NotPlain as e:
        if isinstance(target, type):  # a program class was instantiated: keep the instance here
            handles.append(result)
            return {"h": len(handles) - 1}
        return {"np": str(e)}


_SERVERS = {"names": _serve_names, "attr": _serve_attr, "call": _serve_call}  # a request's op -> its answer


def _serve(req, ns, handles):
    serve = _SERVERS.get(req["op"])
    if serve is None:
        raise ValueError("unknown request")
    return serve(req, ns, handles)


def _method(target, ns):
    cls, name = target.split(".", 1)
    return getattr(ns[cls](), name)


def _auto(target, ns):  # VeRL's fn_name: the function, or LeetCode's Solution().fn
    return ns[target] if target in ns else getattr(ns["Solution"](), target)


# A precomputed call's kind -> how its target is found in the program's namespace.
_CALLEES = {"method": _method, "fn": lambda target, ns: ns[target], "auto": _auto}


def _precomputed(call, ns, handles):
    kind, target, args, kwargs = call
    fn = _CALLEES.get(kind, _auto)(target, ns)
    result = fn(*args, **kwargs)
    try:
        return {"v": encode_plain(result)}
    except NotPlain as e:
        return {"np": str(e)}


def _answer(fn, req, ns, handles):
    try:
        reply = fn(req, ns, handles)
    except BaseException as e:  # the program's exception, reported by name
        try:
            reply = {"raise": f"{type(e).__name__}: {e}"[:500]}
        except BaseException:
            reply = {"raise": "an exception that cannot be shown"}
    try:
        data = _json(reply).encode()
    except BaseException as e:  # e.g. an int too long to print
        data = _json({"np": f"unserialisable value ({type(e).__name__})"}).encode()
    _flush()
    return data + b"\n"


def _write_all(fd, data):
    while data:
        data = data[os.write(fd, data) :]


def _read_frame(fd, buf):
    """One host frame from ``fd`` (buffered in ``buf``), or None at end of input."""
    while True:
        if len(buf) >= 4:
            n = int.from_bytes(buf[:4], "big")
            if len(buf) >= 4 + n:
                frame = bytes(buf[4 : 4 + n])
                del buf[: 4 + n]
                return marshal.loads(frame)
        data = os.read(fd, 1 << 20)
        if not data:
            return None
        buf += data


def _flush():
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass


def _exit_code(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1


def _child(source, msg, limits, fds):
    in_r, out_w, err_w, req_r, rep_w = fds
    mode = msg["mode"]
    try:
        _drop_capabilities()
        _deny_unaccounted_memory()
        cpu = limits["cpu_s"]
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        os.chdir("/tmp")
    except BaseException as e:
        # Still the runner's own fd 1: the host reads this as the sandbox's failure, which the program
        # (it never ran) cannot forge; an exit code alone would have been judged as the program's.
        _write_all(1, (_json({"op": "failed", "message": f"case setup: {e}"}) + "\n").encode())
        os._exit(RUNNER_FAILED)
    try:
        os.dup2(in_r, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        keep = 3
        if req_r >= 0:
            os.dup2(req_r, 3)
            os.dup2(rep_w, 4)
            keep = 5
        os.closerange(keep, 65536)
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        _dumpable(1)
    except BaseException as e:
        os.write(2, f"sandbox runner failed: {e}".encode())
        os._exit(RUNNER_FAILED)
    sys.argv = ["solution.py"]
    ns = {"__name__": msg.get("module", "__main__"), "__builtins__": __builtins__}
    try:
        # Compiled in the child: a compile-time bomb (SyntaxError, MemoryError...) is the program's failure.
        exec(compile(source, "solution.py", "exec"), ns)
    except SystemExit as e:
        _flush()
        os._exit(_exit_code(e))
    except BaseException:
        try:
            import traceback  # only when needed: its import costs more than most programs run

            traceback.print_exc()
        except BaseException:
            pass
        _flush()
        os._exit(1)
    _flush()
    match mode:
        case "stdio":
            os._exit(0)
        case "calls":
            # Calls known in advance (``f(1, 2)``, ``Solution().f(1, 2)``): answered in order, then exit.
            for call in msg["calls"]:
                _write_all(4, _answer(_precomputed, call, ns, []))
            os._exit(0)
    handles = []  # type: list
    _write_all(4, b'{"ready": 1}\n')
    buf = bytearray()
    while True:
        req = _read_frame(3, buf)
        if req is None:
            os._exit(0)
        _write_all(4, _answer(_serve, req, ns, handles))


# ------------------------------------------------------------------------------------ runner
def _libc_functions():
    # From _ctypes alone: ``import ctypes`` would add four modules (types, struct, ctypes._endian and
    # ctypes itself, dozens of classes) to every sandbox's start for these few calls.
    import _ctypes

    class CInt(_ctypes._SimpleCData):
        _type_ = "i"

    class CFunction(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = CInt

    class Libc:
        _handle = _ctypes.dlopen(None)  # type: ignore[arg-type]  # None: the program itself (libc)

    class CChar(_ctypes._SimpleCData):
        _type_ = "c"

    def c_bytes(data):
        """A C copy of ``data`` and its address (the copy must outlive every use of the address)."""
        buf = (CChar * len(data)).from_buffer_copy(data)  # type: ignore[operator]
        return buf, _ctypes.addressof(buf)

    names = ("prctl", "unshare", "mount", "umount2", "capset", "msgctl", "semctl", "shmctl")
    functions = {n: CFunction((n, Libc())) for n in names}  # type: ignore[arg-type]
    functions["c_bytes"] = c_bytes  # type: ignore[assignment]
    return functions, _ctypes.get_errno


_LIBC = {}  # type: dict  # libc's functions once found (the runner's children inherit them)


def _libc(name, *args):
    """``name(*args)`` from libc; OSError (with errno) when it fails."""
    if not _LIBC:
        functions, _LIBC["errno"] = _libc_functions()
        _LIBC.update(functions)
    if _LIBC[name](*args) != 0:
        raise OSError(_LIBC["errno"](), f"{name} failed")


def _dumpable(flag):
    try:
        _libc("prctl", 4, flag, 0, 0, 0)  # PR_SET_DUMPABLE
    except Exception:
        pass


_CLONE_NEWNS, _MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE, _MNT_DETACH = 0x20000, 2, 4, 0x4000, 0x40000, 2
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4


def _private_mounts():
    """The runner's own mount namespace, where it may mount each case's /tmp (bwrap gave it
    CAP_SYS_ADMIN in the sandbox's user namespace for that alone); no process it starts keeps it."""
    _libc("unshare", _CLONE_NEWNS)
    _libc("mount", b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)
    _libc("prctl", _PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # an exec never inherits it


# System calls that make memory no rlimit counts, refused (EPERM) to every process of a case: a memfd's pages
# (written with write(), never mapped) and a System V segment's (detached) are in no process's address space
# or resident set, so RLIMIT_AS and the runner's watch of resident memory both missed them (128 memfds of
# 16 MB, or 32 segments made and detached in a loop, held 2 GiB past a 256 MB ``memory_mb``); System V
# message queues and semaphore sets are kernel memory too (an IPC namespace allows 32,000 queues of 16 KB).
# Numbers from the kernel's syscall tables: shmget, msgget, semget, memfd_create, memfd_secret.
_SECCOMP_DENY = {
    "x86_64": (0xC000003E, (29, 68, 64, 319, 447)),  # AUDIT_ARCH_X86_64
    "aarch64": (0xC00000B7, (194, 186, 190, 279, 447)),  # AUDIT_ARCH_AARCH64
}


def _seccomp_program(arch, denied):
    """A classic-BPF seccomp filter (``struct sock_filter`` array, native byte order): EPERM for the
    ``denied`` numbers, for the x32 ABI's numbers (bit 30: the same calls by another number) and for any
    other architecture's calls (i386's ``int 0x80`` from a 64-bit process); everything else allowed."""
    n = len(denied)
    ins = [
        (0x20, 0, 0, 4),  # ld  [arch]            (seccomp_data.arch)
        (0x15, 0, n + 3, arch),  # jeq arch, next, deny
        (0x20, 0, 0, 0),  # ld  [nr]              (seccomp_data.nr)
        (0x35, n + 1, 0, 0x40000000),  # jge x32 bit, deny, next
    ]
    ins += [(0x15, n - i, 0, nr) for i, nr in enumerate(denied)]  # jeq nr, deny, next
    ins += [(0x06, 0, 0, 0x7FFF0000), (0x06, 0, 0, 0x00050000 | 1)]  # ret ALLOW; ret ERRNO(EPERM)
    order = sys.byteorder
    return b"".join(c.to_bytes(2, order) + bytes((jt, jf)) + k.to_bytes(4, order) for c, jt, jf, k in ins)


def _deny_unaccounted_memory():
    """Install the seccomp filter above in this process (inherited by everything it starts; needs
    no_new_privs, set by :func:`_drop_capabilities`). On another architecture there is none: the
    runner's watch of resident memory still holds, memfds and System V segments go unwatched."""
    spec = _SECCOMP_DENY.get(os.uname().machine)
    if spec is None:
        return
    program = _seccomp_program(*spec)
    make = _LIBC["c_bytes"]
    filt, addr = make(program)
    count = len(program) // 8
    fprog, _ = make(count.to_bytes(2, sys.byteorder) + bytes(6) + addr.to_bytes(8, sys.byteorder))
    _libc("prctl", 22, 2, fprog, 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &sock_fprog
    del filt  # kept alive until the kernel copied the program


def _drop_capabilities():
    """No capability left in this process (a case's child, before any of the program runs), and none to
    gain from an exec (no_new_privs: a file with capabilities, which the bounding set bwrap left with
    CAP_SYS_ADMIN would let through, runs without them; bwrap sets it too, this does not rely on that)."""
    version_3 = (0x20080522).to_bytes(4, sys.byteorder) + bytes(4)  # _LINUX_CAPABILITY_VERSION_3, pid 0
    _libc("capset", version_3, bytes(24))  # effective, permitted, inheritable: all empty
    _libc("prctl", 38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


_TMP_MOUNTED = []  # type: list  # a case's /tmp is mounted over the jail's own


def _fresh_tmp(limits):
    """A new, empty tmpfs on /tmp for the next case, capped in bytes and in files (``nr_inodes``: every
    file, directory and link costs kernel memory that no rlimit counts, and a byte cap alone let a
    program make millions of empty ones). The last case's is detached: the kernel frees it with
    everything in it, however deep, locked or large (its processes are dead by now)."""
    os.chdir("/")  # the runner's cwd must not keep the old one alive
    if _TMP_MOUNTED:
        _libc("umount2", b"/tmp", _MNT_DETACH)
        _TMP_MOUNTED.clear()
    size, files = limits["tmpfs_mb"] * _MB, limits["max_files"] + 1  # + 1: its root directory
    options = f"mode=0755,size={size},nr_inodes={files}".encode()
    _libc("mount", b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, options)
    _TMP_MOUNTED.append(1)


def _set_limits(limits):
    pairs = [
        (resource.RLIMIT_AS, limits["memory_mb"] * _MB),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * _MB),
        # The runner itself is one of the uid's processes.
        (resource.RLIMIT_NPROC, limits["max_procs"] + 1),
        (resource.RLIMIT_NOFILE, 256),
        (resource.RLIMIT_CORE, 0),
    ]
    for res, value in pairs:
        resource.setrlimit(res, (value, value))
    # Writing past RLIMIT_FSIZE then raises OSError(EFBIG) in the program instead of killing it silently.
    _signal.signal(_SIGXFSZ, _signal.SIG_IGN)


def _remove_ipc():
    """Remove every System V IPC object of the sandbox (its own IPC namespace): a message queue, semaphore
    or shared memory segment outlives the processes of the case that made it, so it carried state into
    the next case, and a detached segment's memory, which RLIMIT_AS no longer counts, stayed taken."""
    # msgctl(id, IPC_RMID, NULL), shmctl(id, IPC_RMID, NULL), semctl(id, semnum (ignored), IPC_RMID)
    for kind, remove, tail in (
        ("msg", "msgctl", (0, None)),
        ("shm", "shmctl", (0, None)),
        ("sem", "semctl", (0, 0)),
    ):
        with open(f"/proc/sysvipc/{kind}", "rb") as f:
            rows = f.read().splitlines()[1:]
        for row in rows:
            try:
                _libc(remove, int(row.split()[1]), *tail)
            except OSError:
                pass  # already gone


_MEMORY_POLL_S = 0.01
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _program_usage():
    """What every process of the namespace but the runner (pid 1) holds and has spent: bytes of
    anonymous and shared-memory resident pages (``RssAnon`` + ``RssShmem``: the heap, stack and shared
    anonymous mappings, not the interpreter's file pages), and CPU seconds (user + system, their own and
    their reaped children's). RLIMIT_AS and RLIMIT_CPU cap each process alone: 16 processes of 200 MB
    each were within the one, 16 spinning processes took 16 times the other. A mapping that several
    processes share counts once for each (the cap errs on the safe side)."""
    memory = ticks = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and name != "1":
            try:
                with open("/proc/" + name + "/status", "rb") as f:
                    for line in f:
                        if line.startswith((b"RssAnon:", b"RssShmem:")):
                            memory += int(line.split()[1])  # kB
                with open("/proc/" + name + "/stat", "rb") as f:
                    # after the name in parentheses (which may hold any byte): fields 3 (state) onwards;
                    # utime, stime, cutime, cstime are fields 14-17 (proc(5))
                    fields = f.read().rpartition(b")")[2].split()
                ticks += sum(int(x) for x in fields[11:15])
            except (OSError, IndexError, ValueError):
                pass  # exited meanwhile
    return memory * 1024, ticks / _CLOCK_TICKS


def _kill_others():
    """SIGKILL every process of the namespace but the runner (pid 1: kill(-1) spares the caller)."""
    try:
        os.kill(-1, _SIGKILL)
    except OSError:
        pass


def _sweep(child):
    """Kill every other process of the namespace; the direct child's wait status (if reaped here) and
    whether something could not be killed."""
    status = None
    for _ in range(500):
        _kill_others()
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status, 0
            if pid == 0:
                break
            if pid == child:
                status = st
        time.sleep(0.002)
    return status, 1


_ANSWERING_MODES = ("calls", "eval")  # the child answers over its own request/reply pipes (stdio prints)


class Runner:
    def __init__(self, limits):
        self.limits = limits
        self.cap = limits["output_limit_kb"] * 1024
        self.memory_cap = limits["memory_mb"] * _MB  # of the case's processes together (RLIMIT_AS: each)
        self.cpu_cap = limits["cpu_s"]  # CPU seconds of the case's processes together (RLIMIT_CPU: each)
        self.timeout = limits["timeout_s"]
        self.inbuf = bytearray()
        self.source = None  # the program: a sandbox may start before its program is known

    def send(self, msg):
        _write_all(1, (_json(msg) + "\n").encode())

    def recv(self):
        return _read_frame(0, self.inbuf)

    def case(self, msg):  # mode: stdio, calls (answered in order), eval (a live test's requests)
        _fresh_tmp(self.limits)
        _remove_ipc()
        mode = msg["mode"]
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        req_r, req_w, rep_r, rep_w = -1, -1, -1, -1
        if mode in _ANSWERING_MODES:
            req_r, req_w = os.pipe()
            rep_r, rep_w = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            for fd in (0, 1, in_w, out_r, err_r, req_w, rep_r):
                if fd >= 0:
                    os.close(fd)
            _child(self.source, msg, self.limits, (in_r, out_w, err_w, req_r, rep_w))
        for fd in (in_r, out_w, err_w, req_r, rep_w):
            if fd >= 0:
                os.close(fd)
        c = _Case(self, pid, t0, in_w, msg.get("stdin", "").encode("utf-8"), out_r, err_r, rep_r)
        try:
            match mode:
                case "eval":
                    self._relay(c, req_w)
                case _:  # stdio, calls: the child runs to its end on its own
                    c.wait_exit()
            self.send(c.done())
        finally:
            c.close()
            if req_w >= 0:
                os.close(req_w)

    def _relay(self, c, req_w):
        """A live test (mode ``eval``): once the child is ready, pass each of the host's requests to it
        and its one-line reply back, until the host ends, the child stops answering or it exits."""
        if c.wait_line() is None:
            return
        self.send({"op": "ready"})
        while True:
            req = self._host_request(c)
            if req is None or req.get("op") == "end":
                c.over_caps(time.monotonic(), force=True)  # what was left working after the last reply
                return
            frame = marshal.dumps(req["r"])
            _write_all(req_w, len(frame).to_bytes(4, "big") + frame)
            line = c.wait_line()
            if line is None:
                return
            self.send({"op": "reply", "r": line.decode("utf-8", "replace")})

    def _host_request(self, c):
        """The host's next request. While the host thinks, what the program left working (a forked
        process, a thread) is still held to the memory and CPU caps: past one, the case's processes are
        killed at once and the report says which cap (the host's next request finds the case over)."""
        while len(self.inbuf) < 4 + int.from_bytes(self.inbuf[:4].ljust(4, b"\xff"), "big"):
            if select.select([0], [], [], _MEMORY_POLL_S)[0]:
                return self.recv()
            if not (c.memory or c.cpu) and c.over_caps(time.monotonic()):
                _kill_others()
        return self.recv()


class _Case:
    def __init__(self, runner, pid, t0, in_w, stdin, out_r, err_r, rep_r):
        self.r, self.pid, self.t0 = runner, pid, t0
        self.deadline = t0 + runner.timeout
        self.in_w, self.stdin = in_w, stdin
        self.out_r, self.err_r, self.rep_r = out_r, err_r, rep_r
        self.out, self.err, self.rep = bytearray(), bytearray(), bytearray()
        self.status = None
        self.timed_out = self.overflow = self.exited = False
        self.memory = 0  # the resident memory seen when it passed the cap (0: never)
        self.cpu = 0.0  # the CPU seconds seen when they passed the cap (0: never)
        self.next_memory_check = 0.0
        self.leftover = 0
        self.pidfd = -1
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pass
        for fd in (in_w, out_r, err_r, rep_r):
            if fd >= 0:
                os.set_blocking(fd, False)
        if not stdin:
            self._close_stdin()

    def _buf(self, fd):
        return self.out if fd == self.out_r else self.err if fd == self.err_r else self.rep

    def _close_stdin(self):
        if self.in_w >= 0:
            os.close(self.in_w)
            self.in_w = -1

    def _pump(self, want_line):
        """Move data until a reply line (want_line), the child's exit, the deadline or too much output."""
        while True:
            if want_line:
                i = self.rep.find(b"\n")
                if i >= 0:
                    line = bytes(self.rep[:i])
                    del self.rep[: i + 1]
                    return line
            if self.exited or self.timed_out or self.overflow or self.memory or self.cpu:
                return None
            now = time.monotonic()
            remaining = self.deadline - now
            if remaining <= 0:
                self.timed_out = True
                return None
            if self.over_caps(now):
                return None
            rd = [fd for fd in (self.out_r, self.err_r, self.rep_r) if fd >= 0]
            if self.pidfd >= 0:
                rd.append(self.pidfd)
            wr = [self.in_w] if self.in_w >= 0 else []
            r, w, _ = select.select(rd, wr, [], min(remaining, 0.005 if self.pidfd < 0 else _MEMORY_POLL_S))
            if w:
                try:
                    n = os.write(self.in_w, self.stdin[:65536])
                    self.stdin = self.stdin[n:]
                except BlockingIOError:
                    pass
                except OSError:  # the program closed its stdin: the rest is not wanted
                    self.stdin = b""
                if not self.stdin:
                    self._close_stdin()
            for fd in r:
                if fd != self.pidfd:
                    self._read(fd)
            if self.pidfd < 0 or self.pidfd in r:
                self._reap()

    def over_caps(self, now, *, force=False):
        """Whether the case's processes together have passed the memory or CPU-time cap (looked at every
        10 ms, or now when ``force``; the first figure past a cap is kept for the report)."""
        if not (self.memory or self.cpu) and (force or now >= self.next_memory_check):
            self.next_memory_check = now + _MEMORY_POLL_S
            held, spent = _program_usage()
            if held > self.r.memory_cap:
                self.memory = held
            elif spent > self.r.cpu_cap:
                self.cpu = spent
        return bool(self.memory or self.cpu)

    def _read(self, fd):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        buf = self._buf(fd)
        if not data:
            if fd == self.out_r:
                self.out_r = -1
            elif fd == self.err_r:
                self.err_r = -1
            else:
                self.rep_r = -1
            os.close(fd)
            return False
        buf += data
        if len(buf) > self.r.cap + (65536 if buf is self.rep else 0):
            self.overflow = True
            return False
        return True

    def _reap(self):
        try:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, st = self.pid, 0
        if pid == self.pid:
            self.status = st
            self.exited = True

    def wait_line(self):
        return self._pump(True)

    def wait_exit(self):
        self._pump(False)

    def done(self):
        status, self.leftover = _sweep(self.pid)
        if self.status is None:
            self.status = status
        # Everything else is dead now: what is left in the pipes can be read to the end.
        for fd in (self.out_r, self.err_r, self.rep_r):
            if fd >= 0:
                while not self.overflow and self._read(fd):
                    pass
        st = self.status
        code = sig = None
        # A child we killed (at "end", on a timeout or too much output) has no exit code of its own.
        if st is not None and self.exited and not self.timed_out:
            if os.WIFEXITED(st):
                code = os.WEXITSTATUS(st)
            elif os.WIFSIGNALED(st):
                sig = os.WTERMSIG(st)
        return {
            "op": "done",
            "exit": code,
            "sig": sig,
            "timeout": self.timed_out,
            "overflow": self.overflow,
            "memory": self.memory,
            "cpu": self.cpu,
            "out": bytes(self.out[: self.r.cap]).decode("utf-8", "replace"),
            "out_invalid_utf8": not _is_utf8(bytes(self.out[: self.r.cap])),
            "err": bytes(self.err[-2000:]).decode("utf-8", "replace"),
            "replies": [x.decode("utf-8", "replace") for x in bytes(self.rep).split(b"\n")[:-1]],
            "wall": time.monotonic() - self.t0,
            "leftover": self.leftover,
        }

    def close(self):
        for fd in (self.in_w, self.out_r, self.err_r, self.rep_r, self.pidfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def main():
    try:
        names = (
            "cpu_s",
            "memory_mb",
            "file_size_mb",
            "max_procs",
            "output_limit_kb",
            "tmpfs_mb",
            "max_files",
        )
        limits = dict(zip(names, map(int, sys.argv[1:8])))  # type: dict
        limits["timeout_s"] = float(sys.argv[8])
        # pid 1 of the namespace: a signal without a handler is dropped, so the program cannot stop us.
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        _dumpable(0)
        _private_mounts()
        _set_limits(limits)
        runner = Runner(limits)
    except BaseException as e:
        os.write(1, (_json({"op": "failed", "message": f"{type(e).__name__}: {e}"}) + "\n").encode())
        os._exit(RUNNER_FAILED)
    # compile()'s first call builds the AST types (~1.5 ms): once here, not in every child; gc.freeze:
    # what exists now is never garbage, so no child's gc pass touches (and copies) its pages.
    compile("pass", "warm-up", "exec")
    gc.freeze()
    runner.send({"op": "hello"})
    handlers = {"case": runner.case}  # the host's messages between cases (others are ignored)
    while True:
        msg = runner.recv()
        if msg is None:
            break
        if msg.get("op") == "program" and runner.source is None:  # one sandbox, one program
            runner.source = msg["source"]
        handle = handlers.get(msg.get("op"))
        if handle is not None:
            handle(msg)
    os._exit(0)


if __name__ == "__main__":
    main()
