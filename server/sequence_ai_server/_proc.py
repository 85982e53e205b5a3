"""Stopping a child process the same way everywhere (gateway workers, the demo, test servers)."""
from __future__ import annotations

import contextlib
import signal
import subprocess

__all__ = ["stop_process"]


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 15.0) -> int:
    """Send ``sig`` to ``proc``, wait up to ``grace_s`` seconds for it to exit, then SIGKILL it.

    SIGTERM (the default) makes a worker run its policy's ``@seq.shutdown``; SIGINT is what a
    node expects from Ctrl-C. A process that already exited is left alone. Returns its exit code.
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
