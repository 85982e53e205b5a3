"""Processes the same way everywhere: stopping a child (gateway workers, the demo, test servers),
and a handle on a process this one did not start (a worker a restarted gateway adopts).

Process identity on Linux: a pid alone can be reused once its process has exited, so a process
is recognised by its pid *and* its start time (``/proc/<pid>/stat`` field 22, clock ticks after
boot), which no later process with the same pid shares.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Optional

__all__ = ["stop_process", "AdoptedProcess", "process_start", "process_cmdline", "process_alive", "stat_fields",
           "EXIT_UNKNOWN"]

# The exit status of a process that is not our child cannot be read (its parent reaps it): poll()
# of an AdoptedProcess that has gone returns this (real codes are 0..255, or -signal).
EXIT_UNKNOWN = 256


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 15.0) -> int:
    """Send ``sig`` to ``proc``, wait up to ``grace_s`` seconds for it to exit, then SIGKILL it.

    SIGTERM (the default) makes a worker run its policy's ``@seq.shutdown``; SIGINT is what a
    node expects from Ctrl-C. A process that already exited is left alone. Returns its exit code.
    ``proc`` may be a ``subprocess.Popen`` or an ``AdoptedProcess``.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def stat_fields(pid) -> Optional[list[str]]:
    """``/proc/<pid>/stat`` (``pid`` a number or ``"self"``) split after the command name (which may
    hold spaces), so field N of proc(5) is index N - 3; None if gone."""
    try:
        raw = open(f"/proc/{pid}/stat", "rb").read().decode(errors="replace")
    except OSError:
        return None
    return raw[raw.rfind(")") + 2:].split()


def process_start(pid: int) -> Optional[int]:
    """The start time of ``pid`` in clock ticks after boot (its identity with the pid); None when
    there is no such process."""
    fields = stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_cmdline(pid: int) -> list[str]:
    """The argv of ``pid`` (empty when it is gone or unreadable)."""
    try:
        raw = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def process_alive(pid: int, start: Optional[int] = None) -> bool:
    """True while ``pid`` runs (not a zombie) and, when ``start`` is given, is still the process
    that started then (not a later one that reused the pid)."""
    fields = stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return False
    return start is None or (len(fields) > 19 and int(fields[19]) == int(start))


class AdoptedProcess:
    """A ``subprocess.Popen`` look-alike for a running process this one did not start: what a
    restarted gateway holds for a worker its previous run started (the worker is no longer our
    child, so it is watched by pid + start time, and its exit status reads ``EXIT_UNKNOWN``).

    Args:
        pid: the process id.
        start: its start time from ``process_start`` (guards against pid reuse).
    """

    def __init__(self, pid: int, start: Optional[int]):
        self.pid = int(pid)
        self.start = start
        self.returncode: Optional[int] = None
        self.adopted = True

    def poll(self) -> Optional[int]:
        """None while it runs; ``EXIT_UNKNOWN`` once it has gone."""
        if self.returncode is None and not process_alive(self.pid, self.start):
            self.returncode = EXIT_UNKNOWN
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait (polling every 20 ms) for it to go; raises ``subprocess.TimeoutExpired`` after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        """Signal it, unless it has gone (a reused pid is never signalled)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.send_signal(signal.SIGKILL)
