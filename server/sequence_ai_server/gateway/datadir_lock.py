"""One gateway per data dir: an exclusive ``flock`` on ``<data_dir>/gateway.lock`` held for the
gateway's lifetime.

The lock file is opened ``O_CLOEXEC`` so the workers a gateway starts do not inherit it (a worker
outlives a gateway crash and is adopted by the next one; it must not keep the lock). The kernel
drops a ``flock`` when its holder dies, so a gateway killed with SIGKILL leaves no stale lock.
The file holds the holder's ``{"pid", "port"}`` so the refusal names it.
"""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Optional

__all__ = ["DataDirLock", "hold_data_dir"]

LOCK_NAME = "gateway.lock"


class DataDirLock:
    """The held lock: ``fd`` (open, O_CLOEXEC, flocked), ``path``. Keep the object for the
    gateway's lifetime; :meth:`note` records the bound port; :meth:`release` unlocks."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    def note(self, port: Optional[int] = None) -> None:
        """Write ``{"pid", "port"}`` into the lock file (what a refused gateway reports)."""
        data = json.dumps({"pid": os.getpid(), "port": port}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        """Unlock and close (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)     # closing the only descriptor drops the flock
            self.fd = -1


def hold_data_dir(data_dir: Path) -> DataDirLock:
    """Take the exclusive lock of ``data_dir`` (created if missing) without waiting.

    Raises ``DataDirInUse`` (an OSError) naming the holder's pid and port when another live
    gateway holds it: stop that one first, or use another ``--data-dir``."""
    from sequence_ai_server.gateway.supervisor import DataDirInUse   # defined with the supervisor (its adoption check raises it too)

    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            holder = {}
        os.close(fd)
        port = f"port {holder['port']}, " if holder.get("port") else ""
        raise DataDirInUse(f"DataDirInUse: another gateway (pid {holder.get('pid', '?')}) is running on {data_dir} "
                           f"({port}holding {path}); stop it first, or use another --data-dir") from None
    lock = DataDirLock(fd, path)
    lock.note()
    return lock
