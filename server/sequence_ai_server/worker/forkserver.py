"""The worker fork server: one process per gateway that has imported the worker's web stack once
(FastAPI, pydantic, uvicorn: ~0.35 s of CPU on a 2-core x86 VM, more on a Jetson) and forks each
new local worker from that state instead of starting an interpreter that imports it again.

    python -m sequence_ai_server.worker.forkserver --fd N [--title-space ...]

The gateway's local launcher (launchers/forked.py) starts it on its first local worker, with one
end of a ``SOCK_SEQPACKET`` socket pair as fd ``N``, and talks to it in JSON messages:

    -> {"ready": true, "pid": P, "title_bytes": B}           once the stack is imported
    <- {"id": I, "argv": [...], "env": {...}, "cwd": "..."}   + the worker log's fd (SCM_RIGHTS)
    -> {"id": I, "pid": P} | {"id": I, "error": "..."}
    -> {"exit": P, "code": C}                                 a worker ended (C as Popen's returncode)

A forked worker is the process ``python -m sequence_ai_server.worker ARGV`` would be: its own
session (setsid), the log on stdout/stderr, stdin from /dev/null, ``cwd``, exactly ``env`` (also
for C code: os.environ's putenv), ``sys.path`` built from that env's ``PYTHONPATH`` as the
interpreter builds it, and ``/proc/<pid>/cmdline`` rewritten to that command line, so ``ps``,
adoption by a restarted gateway and its stray-worker sweep see what they see for a started one.
The rewrite goes into the argument area this process got at exec, which ``--title-space`` pads
(the technique of setproctitle(3)); a command longer than that area is started as a process
instead, by the launcher. What is imported here is only what reads no settings of its own at
import: numpy (whose BLAS reads its thread count then), CUDA and the policy are imported in the
worker, with the worker's environment. Which variables still need a process of their own (those
the interpreter and the C library read at exec) is the launcher's check.

The fork server exits when the gateway's end of the socket closes (the gateway stopped or died);
its workers go on (each watches its supervisor file) and are reaped by init from then on.
Nothing here reads a socket other than that pair, which only the gateway holds.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import sys
import traceback
from typing import Any, Optional

# What a worker always imports and that reads no environment at import: the web stack.
PRELOAD = ("asyncio", "concurrent.futures", "ssl", "argparse", "logging", "subprocess", "secrets", "hmac",
           "fastapi", "fastapi.responses", "pydantic", "uvicorn", "uvicorn.config", "uvicorn.server",
           "uvicorn.lifespan.off", "uvicorn.loops.auto", "uvicorn.protocols.http.h11_impl")
OPTIONAL_PRELOAD = ("uvloop", "uvicorn.protocols.http.httptools_impl")
MAX_MESSAGE = 1 << 18          # a spawn request: argv + environment (a datagram of the pair: ~200 KiB at most)
TITLE_SPACE = 8192             # bytes of argument area the launcher pads for rewritten command lines


def _preload() -> None:
    import importlib
    for name in PRELOAD:
        importlib.import_module(name)
    for name in OPTIONAL_PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _argument_area() -> Optional[tuple[int, int]]:
    """``(start, end)`` addresses of this process's argument strings (``/proc/self/stat`` fields
    48-49, Linux >= 3.5), None where they cannot be read."""
    from sequence_ai_server.common.processes import stat_fields
    try:
        fields = stat_fields("self") or []
        start, end = int(fields[45]), int(fields[46])
    except (ValueError, IndexError):
        return None
    return (start, end) if 0 < start < end else None


def _cmdline_fits(argv: Any) -> bool:
    """True when ``argv`` (a list of strings) fits this process's argument area."""
    area = _argument_area()
    return (isinstance(argv, list) and bool(argv) and all(isinstance(a, str) for a in argv) and area is not None
            and len(b"\0".join(a.encode() for a in argv)) + 1 <= area[1] - area[0])


def _set_cmdline(argv: list[str]) -> bool:
    """Rewrite ``/proc/self/cmdline`` to ``argv`` (NUL-separated, the rest of the area zeroed:
    the kernel then reads the area as plain arguments). False when it does not fit."""
    import ctypes
    area = _argument_area()
    data = b"\0".join(a.encode() for a in argv) + b"\0"
    if area is None or len(data) > area[1] - area[0]:
        return False
    size = area[1] - area[0]
    ctypes.memmove(area[0], data.ljust(size, b"\0"), size)
    return True


def _search_path(env: dict, cwd: str, base: list[str]) -> list[str]:
    """``sys.path`` as ``python -m`` in ``cwd`` with ``env`` builds it: the working directory,
    then ``PYTHONPATH``'s entries, then ``base`` (the interpreter's own: stdlib, site-packages,
    .pth entries), absolute and without repeats (as site.removeduppaths leaves it)."""
    paths = [cwd] + [os.path.join(cwd, p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + base
    seen: set = set()
    out = []
    for p in paths:
        p = os.path.abspath(p)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _run_worker(request: dict, log_fd: int, base_path: list[str]) -> int:
    """In the forked child: become the worker process ``request`` describes, run it, return its
    exit code (as the interpreter would: SystemExit's code, 1 for an uncaught exception)."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in (devnull, log_fd):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = _search_path(request["env"], os.getcwd(), base_path)
    import importlib
    importlib.invalidate_caches()
    # run as `python -m` runs it: sequence_ai_server/worker/__main__.py as the __main__ module
    # (what multiprocessing's spawn and forkserver children re-import, what tools read), with
    # sys.argv[0] its path and sys.orig_argv the command line
    import runpy
    sys.argv = ["-m"] + list(request["argv"])
    sys.orig_argv = list(request.get("title") or sys.orig_argv)
    try:
        runpy.run_module("sequence_ai_server.worker", run_name="__main__", alter_sys=True)
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught error
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    return code


def _exit_as_interpreter(code: int) -> None:
    """End a forked child as the interpreter ends: join non-daemon threads, run atexit, flush."""
    import atexit
    import threading
    try:
        threading._shutdown()           # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


class _Server:
    def __init__(self, sock: socket.socket, base_path: list[str]):
        self.sock = sock
        self.base_path = base_path
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)

    def send(self, msg: dict) -> None:
        self.sock.sendall(json.dumps(msg).encode())

    def spawn(self, request: dict, fds: list[int]) -> None:
        rid = request.get("id")
        if len(fds) != 1 or not isinstance(request.get("argv"), list) or not isinstance(request.get("env"), dict):
            for fd in fds:
                os.close(fd)
            self.send({"id": rid, "error": "a spawn request is argv, env, cwd and one log fd"})
            return
        if not _cmdline_fits(request.get("title")):
            # forked, it would show this process's command line: invisible to ps, adoption and
            # the stray-worker sweep of a restarted gateway
            for fd in fds:
                os.close(fd)
            self.send({"id": rid, "error": "its command line does not fit the fork server's argument area"})
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(fds[0])
            self.send({"id": rid, "error": f"fork failed: {exc}"})
            return
        if pid == 0:
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)   # as an interpreter starts
                self.sel.close()
                for fd in (self.sock.fileno(), self.wake_r, self.wake_w):
                    os.close(fd)
                _set_cmdline(request["title"])          # fits: checked above
                code = _run_worker(request, fds[0], self.base_path)
            except BaseException:  # noqa: BLE001 - the child never returns into the server loop
                traceback.print_exc()
            _exit_as_interpreter(code)
        os.close(fds[0])
        self.send({"id": rid, "pid": pid})

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def serve(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the gateway's: this ends with its socket
        sel = self.sel
        sel.register(self.sock, selectors.EVENT_READ)
        sel.register(self.wake_r, selectors.EVENT_READ)
        area = _argument_area()
        self.send({"ready": True, "pid": os.getpid(), "title_bytes": area[1] - area[0] if area else 0})
        while True:
            for key, _ in sel.select():
                if key.fileobj == self.wake_r:
                    while True:
                        try:
                            if not os.read(self.wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                    continue
                msg, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 4)
                if not msg:
                    return                              # the gateway closed its end
                try:
                    request = json.loads(msg)
                except ValueError:
                    for fd in fds:
                        os.close(fd)
                    continue
                self.spawn(request, fds)
            self.reap()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sequence_ai_server.worker.forkserver")
    parser.add_argument("--fd", type=int, required=True, help="this end of the gateway's socket pair")
    parser.add_argument("--title-space", default="", help="padding: room to rewrite a worker's command line")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    own = [sys.executable, "-m", "sequence_ai_server.worker.forkserver", "--fd", str(args.fd)]
    _set_cmdline(own)                                   # ps shows this, not the padding
    base = [p for p in sys.path[1:] if p not in set(_search_path(os.environ, os.getcwd(), [])[1:])]
    _preload()
    try:
        _Server(sock, base).serve()
    except (BrokenPipeError, ConnectionResetError):
        pass                                            # the gateway went while we answered
    return 0


if __name__ == "__main__":
    sys.exit(main())
