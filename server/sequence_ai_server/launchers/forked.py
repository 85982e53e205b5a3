"""Local workers forked from the worker fork server (worker/forkserver.py) rather than started as
new interpreters: the gateway's side of it.

A worker's start used to import the web stack again in every process (~0.35 of its ~0.5 s of
import CPU on a 2-core x86 VM). The fork server imports it once, then forks each worker, which
imports only the rest (numpy, the project, the policy) with its own environment. The worker is
still its own session with its own log, cwd, environment and ``/proc/<pid>/cmdline``; the
gateway holds it as a ``ForkedProcess`` (a Popen look-alike) whose exit code the fork server
reports.

A worker is started as a process of its own instead (``ForkServer.spawn`` returns None) when
forking cannot give it the process it would have had: another interpreter (an image
environment), an environment that differs from the fork server's in what the interpreter or the
C library read only at exec (``STARTUP_VARIABLES``), a command line longer than the room the
fork server has for it, a fork server that failed to start, or ``SEQ_WORKER_FORK=0``.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from sequence_ai_server.common.processes import AdoptedProcess, process_start
from sequence_ai_server.launchers.base import platform_paths

__all__ = ["ForkServer", "ForkedProcess", "fork_enabled", "STARTUP_VARIABLES"]

# Read at exec by the dynamic loader, the C library or the interpreter, or at import by what the
# fork server preloads (pydantic; FastAPI's telemetry imports OpenTelemetry, whose context and
# propagators are chosen from OTEL_* then): a fork keeps the fork server's, so a worker whose
# environment differs here from the fork server's gets its own process.
STARTUP_VARIABLES = ("LD_", "PYTHON", "GLIBC_TUNABLES", "MALLOC_", "LC_", "LANG", "LANGUAGE", "TZ", "PYDANTIC_",
                     "OTEL_")
# PYTHONPATH is rebuilt into the forked worker's sys.path; PYTHONUNBUFFERED is set for both.
_REBUILT = ("PYTHONPATH", "PYTHONUNBUFFERED")
READY_TIMEOUT_S = 60.0      # its import, on a loaded machine
SPAWN_TIMEOUT_S = 10.0      # one fork and its answer
MAX_MESSAGE = 1 << 18


def fork_enabled(environ: Optional[dict] = None) -> bool:
    """False when ``$SEQ_WORKER_FORK`` is 0 / false / no / off (every local worker then starts
    as a process of its own, as before the fork server)."""
    value = (os.environ if environ is None else environ).get("SEQ_WORKER_FORK", "1")
    return value.strip().lower() not in ("0", "false", "no", "off")


def _startup_key(key: str) -> bool:
    return key not in _REBUILT and any(key == p or (p.endswith("_") or p == "PYTHON") and key.startswith(p)
                                       for p in STARTUP_VARIABLES)


class ForkedProcess(AdoptedProcess):
    """A worker the fork server forked: watched by pid and start time like an adopted worker,
    with the exit code the fork server reports (``EXIT_UNKNOWN`` only if the fork server went
    before the worker did)."""

    def __init__(self, server: "ForkServer", pid: int, start: Optional[int]):
        super().__init__(pid, start)
        self.adopted = False
        self._server = server

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            code = self._server.exit_code(self.pid)
            if code is not None:
                self.returncode = code
            elif self._server.lost:
                return super().poll()
        return self.returncode


class ForkServer:
    """The gateway's fork server, started on the first ``spawn`` (its output goes to
    ``log_path``). Thread-safe; ``close`` ends it (its workers go on)."""

    def __init__(self, log_path: Path):
        self.log_path = Path(log_path)
        self._lock = threading.Lock()               # the start, and one request on the pair at a time
        self._cond = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._abandoned: set[int] = set()
        self._exits: dict[int, int] = {}
        self._ids = itertools.count(1)
        self._proc: Optional[subprocess.Popen] = None
        self._sock: Optional[socket.socket] = None
        self._env: dict = {}
        self.title_bytes = 0
        self.failed: Optional[str] = None           # why it is not used (for good)
        self.lost = False                           # it went: exit codes are no longer reported
        self.served_since: Optional[float] = None   # time.monotonic() when it got ready

    @property
    def ready(self) -> bool:
        """True once it serves (a spawn then takes milliseconds), or once it will never be used."""
        return self._sock is not None or self.failed is not None

    def environment(self) -> dict:
        """The fork server's environment: this process's, with the platform's packages first on
        ``PYTHONPATH`` (as a worker's, launchers/base.py) and ``PYTHONUNBUFFERED=1``."""
        env = dict(os.environ)
        paths = platform_paths() + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def refusal(self, env: dict, command: list[str]) -> Optional[str]:
        """Why a worker with ``env`` and ``command`` cannot be forked here, None when it can."""
        base = self._env or self.environment()
        differ = sorted(k for k in set(env) ^ set(base) | {k for k in env if k in base and env[k] != base[k]}
                        if _startup_key(k))
        if differ:
            return f"its environment sets {', '.join(differ)}, read only when a process starts"
        if len(b"\0".join(a.encode() for a in command)) + 1 > self.title_bytes:     # 0: no room at all
            return "its command line is longer than the fork server has room for"
        return None

    def _start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = self.environment()
        from sequence_ai_server.worker.forkserver import TITLE_SPACE
        cmd = [sys.executable, "-m", "sequence_ai_server.worker.forkserver", "--fd", str(child.fileno()),
               "--title-space", "x" * TITLE_SPACE]
        try:
            with open(self.log_path, "ab", buffering=0) as log:
                self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                              env=env, cwd="/", pass_fds=(child.fileno(),), start_new_session=True)
        except OSError as exc:
            parent.close()
            self.failed = f"the fork server did not start: {exc}"
            return
        finally:
            child.close()
        parent.settimeout(READY_TIMEOUT_S)
        try:
            hello = json.loads(parent.recv(MAX_MESSAGE) or b"{}")
        except (OSError, ValueError) as exc:
            hello = {"error": str(exc)}
        if not hello.get("ready"):
            parent.close()
            self._stop_process()
            self.failed = f"the fork server did not get ready ({hello.get('error') or 'it exited'}); see {self.log_path}"
            return
        parent.settimeout(None)
        self.served_since = time.monotonic()
        self._env = env
        self.title_bytes = int(hello.get("title_bytes") or 0)
        self._sock = parent
        threading.Thread(target=self._read, args=(parent,), daemon=True, name="fork-server").start()

    def _read(self, sock: socket.socket) -> None:
        while True:
            try:
                raw = sock.recv(MAX_MESSAGE)
                msg = json.loads(raw) if raw else None
            except (OSError, ValueError):
                msg = None
            if not msg:
                with self._cond:
                    self.lost = True
                    self._cond.notify_all()
                if self._proc is not None:          # reap it: no zombie for the rest of the gateway's run
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(5)
                return
            with self._cond:
                if msg.get("pid"):      # a new process has this pid: an exit kept for it was an earlier one's
                    self._exits.pop(int(msg["pid"]), None)
                if "exit" in msg:
                    self._exits[int(msg["exit"])] = int(msg["code"])
                elif msg.get("id") in self._abandoned:      # answered after its spawn gave up
                    self._abandoned.discard(msg["id"])
                    if msg.get("pid"):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(msg["pid"]), 9)
                else:
                    self._replies[int(msg.get("id") or 0)] = msg
                self._cond.notify_all()

    def exit_code(self, pid: int) -> Optional[int]:
        """The reported exit code of worker ``pid`` (once), None while it runs."""
        with self._cond:
            return self._exits.pop(pid, None)

    def spawn(self, command: list[str], env: dict, cwd: str, log_handle: Any) -> Optional[ForkedProcess]:
        """Fork the worker ``command`` (its argv: ``python -m sequence_ai_server.worker ...``)
        with ``env`` in ``cwd``, output to ``log_handle`` (an open file); None when it must start
        as a process of its own (the reason goes to the log). Starts the fork server first if
        needed (its import: ~0.4 s here)."""
        try:
            log_fd = log_handle.fileno()
        except (AttributeError, OSError, ValueError):
            return None
        with self._lock:
            if self._proc is None and self.failed is None:
                self._start()
            why = self.failed or ("the fork server exited" if self.lost else None) or self.refusal(env, command)
            if why is not None:
                log_handle.write(f"started as a process of its own: {why}\n".encode())
                return None
            rid = next(self._ids)
            request = {"id": rid, "argv": command[3:], "env": env, "cwd": cwd, "title": command}
            try:
                # a fork server that stopped reading fills the pair after a dozen requests: never
                # wait on it for ever here, with every other start queued behind this lock
                if not select.select([], [self._sock], [], SPAWN_TIMEOUT_S)[1]:
                    self.failed = f"the fork server took no request for {SPAWN_TIMEOUT_S:g} s"
                    raise TimeoutError(self.failed)
                socket.send_fds(self._sock, [json.dumps(request).encode()], [log_fd])   # type: ignore[arg-type]
            except (OSError, ValueError) as exc:
                log_handle.write(f"started as a process of its own: the fork server did not take it ({exc})\n".encode())
                return None
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        with self._cond:
            while rid not in self._replies and not self.lost and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            reply = self._replies.pop(rid, None)
            if reply is None:
                self._abandoned.add(rid)
                if not self.lost and self.failed is None:   # hung: later workers do not wait on it too
                    self.failed = f"the fork server did not answer a spawn within {SPAWN_TIMEOUT_S:g} s"
        if reply is None or not reply.get("pid"):
            why = (reply or {}).get("error") or "no answer from the fork server"
            log_handle.write(f"started as a process of its own: {why}\n".encode())
            return None
        pid = int(reply["pid"])
        return ForkedProcess(self, pid, process_start(pid))

    def _stop_process(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def close(self) -> None:
        """End the fork server (closing the pair ends it; its workers go on)."""
        with self._lock:
            sock, self._sock = self._sock, None
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            if self._proc is not None:
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._stop_process()
            self.failed = self.failed or "closed"
