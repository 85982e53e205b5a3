"""A worker process as the gateway sees it: :class:`WorkerRecord` (its launcher handle, role,
version, run files, secret and the reports its launch events brought), :class:`Role`,
:func:`worker_key` (the one place a ``Supervisor.workers`` key is spelled), the supervision
constants, and the small helpers that read a worker's log and describe how it ended."""
from __future__ import annotations

import contextlib
import enum
import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from sequence_ai_server.common.processes import EXIT_UNKNOWN, process_start, stop_process
from sequence_ai_server.launchers.base import Exited, Failed, Log, Phase, Placed, Ready, Started
from sequence_ai_server.gateway.store import DeploymentRow

__all__ = ["Role", "WorkerRecord", "worker_key", "STOP_GRACE_S", "JAMMED_GRACE_S", "KEEP_VERSIONS",
           "DEFAULT_LOAD_ESTIMATE_S", "DEFAULT_IDLE_TIMEOUT_S"]

DEFAULT_LOAD_ESTIMATE_S = 30.0   # warming estimate before a load was measured (s)
DEFAULT_IDLE_TIMEOUT_S = 600.0  # when the policy declares none (seq._policy default)
STOP_GRACE_S = 10.0
JAMMED_GRACE_S = 2.0        # a jammed worker (replace_jammed) is killed this long after SIGTERM
KEEP_VERSIONS = 5
BUILD_SUFFIX = ".build"     # worker_key(BUILD, name): the version building beside the serving one
SIDE_MARK = "@v"            # worker_key(SIDE, name, N): a kept version serving a traffic split or a pin
EXTRA_MARK = "#"            # worker_key(EXTRA, name, N): the serving version's N-th worker (N >= 2)


class Role(str, enum.Enum):
    """What a worker process is for (``WorkerRecord.role``; stored as its value in state.db)."""
    SERVING = "serving"     # the deployment's serving version
    BUILD = "build"         # a version (or a jammed worker's replacement) loading beside the serving one
    SIDE = "side"           # a kept version serving a traffic split or a pin
    RETIRING = "retiring"   # replaced: draining its requests, then stopped
    EXTRA = "extra"         # another worker of the serving version (a deployment's fleet past its first)


def worker_key(role: Role, name: str, version: int = 0) -> str:
    """The ``Supervisor.workers`` key of ``name``'s worker in ``role``: ``name`` (serving),
    ``name.build``, ``name@vN`` (side, version N), ``name#N`` (the serving version's N-th worker,
    N >= 2; ``version`` is N there); the one place the key is spelled."""
    if role is Role.EXTRA:
        return f"{name}{EXTRA_MARK}{version}"
    if role is Role.BUILD:
        return name + BUILD_SUFFIX
    if role is Role.SIDE:
        return f"{name}{SIDE_MARK}{version}"
    return name


@dataclass
class WorkerRecord:
    """One worker process the gateway supervises (its role, version, files and secret).
    Times are unix seconds."""
    name: str
    proc: Any                           # its launch.WorkerHandle (Popen-like, with events())
    ready_file: Path
    log_path: Path
    started_at: float
    startup_timeout_s: float = 1800.0
    phase_new: bool = False
    reports: dict = field(default_factory=dict, repr=False)   # phase / ready / error, from events
    stopping: bool = False
    log_handle: Any = field(default=None, repr=False)
    secret: str = field(default="", repr=False)
    secret_file: Optional[Path] = None
    activity_file: Optional[Path] = None
    version: int = 0
    file: str = ""
    class_name: Optional[str] = None
    file_sha: Optional[str] = None
    spec: Optional[dict] = None
    port: Optional[int] = None          # a side or extra worker once ready; the first serving one keeps it in the row
    host: Optional[str] = None          # with port: that worker's host (from its ready file)
    epoch: int = 0                      # a side or extra worker's lease epoch
    error: Optional[str] = None         # a side worker that failed to load: why
    proc_start: Optional[int] = None    # the process's start time (_proc.process_start): its identity with the pid
    supervisor_file: Optional[Path] = None   # {pid, start} of the gateway supervising it (worker --supervisor-file)
    role: Role = Role.SERVING
    retired_at: float = 0.0             # RETIRING: when it was told to stop (unix s)
    grace_s: float = STOP_GRACE_S       # RETIRING: how long it may drain before it is killed
    replacing_jammed: bool = False      # BUILD: started to replace a jammed serving worker (health.py)
    node: Optional[str] = None          # the cluster machine its launcher placed it on (Placed.node); None: here

    # -- what the worker reports: its launcher's typed events (launch.py), consumed here so every
    # poller reads the same state
    def drain(self) -> None:
        """Consume the handle's new events: log chunks go to the deployment log, the phase,
        ready and error reports are kept for the readers below."""
        events = getattr(self.proc, "events", None)
        for ev in (events() if events else []):
            if isinstance(ev, Log):
                if self.log_handle is not None and ev.chunk:
                    with contextlib.suppress(ValueError, OSError):
                        self.log_handle.write(ev.chunk)
            elif isinstance(ev, Placed):
                self.node = ev.node
            elif isinstance(ev, Started):
                if self.supervisor_file is not None and self.proc_start is None:
                    self.proc_start = process_start(ev.pid)     # started after its image environment was built
            elif isinstance(ev, Phase):
                self.reports["phase"], self.phase_new = ev.report, True
            elif isinstance(ev, Ready):
                self.reports["ready"] = ev.report
            elif isinstance(ev, Exited) and ev.error:
                self.reports["error"] = ev.error
            elif isinstance(ev, Failed):
                self.reports["error"] = {"phase": "building_image", "detail": ev.reason,
                                         "exception_type": "ImageBuildError", "traceback": None,
                                         **({"details": ev.details} if ev.details else {})}

    def phase_report(self) -> dict:
        """The last phase report (``{"phase", "spec"?}``); {} while there is none."""
        self.drain()
        return self.reports.get("phase") or {}

    def phase_changed(self) -> Optional[dict]:
        """The phase report when it changed since the last call, else None."""
        self.drain()
        if not self.phase_new:
            return None
        self.phase_new = False
        return self.reports.get("phase")

    def ready_report(self) -> Optional[dict]:
        """The ready report once the worker serves (``{"port", "host"|"url", "spec"}``), else None."""
        self.drain()
        ready = self.reports.get("ready")
        return ready if ready and ready.get("port") else None

    def error_report(self) -> dict:
        """What a worker whose load failed reported (``{"phase", "detail", "exception_type",
        "traceback"}``); {} when there is none."""
        self.drain()
        return self.reports.get("error") or {}

    def last_activity(self) -> float:
        """When the worker last accepted a request (unix s), 0 when never."""
        fn = getattr(self.proc, "last_activity", None)
        return float(fn()) if fn else 0.0

    def load_failure(self, code: int, phase: Optional[str]) -> tuple[str, dict]:
        """``(message, details)`` for a worker that exited with ``code`` while loading (last
        seen in ``phase``): the policy's own error when it wrote one, else how it ended; details
        ``{"phase", "exception_type", "remote_traceback", "log_tail", "exit_code"}``; a load that
        raised ModuleNotFoundError adds ``missing_module``, ``python`` (the worker's interpreter)
        and ``image`` (whether the policy declares ``image=``), from which ``seq deploy`` words
        what to install where."""
        err = self.error_report()
        msg = (f"worker failed while {err.get('phase')}: {err.get('detail')}" if err
               else f"worker {_exit_reason(code)} while {phase or 'starting'}")
        details = {"phase": err.get("phase") or phase, "exception_type": err.get("exception_type"),
                   "remote_traceback": err.get("traceback"), "log_tail": _log_tail(self.log_path),
                   "exit_code": code}
        if err.get("missing_module"):
            details.update(missing_module=err["missing_module"], python=err.get("python"),
                           image=self._declares_image())
        return msg, details

    def _declares_image(self) -> bool:
        """Whether the policy file declares ``image=`` (its worker runs in a built environment)."""
        from sequence_ai_server.launchers.envs import image_from_source
        try:
            return image_from_source(self.file) is not None
        except Exception:  # noqa: BLE001 - an unreadable image= was refused at deploy
            return False

    def startup_expired(self, now: float) -> bool:
        """Whether the worker has loaded longer than its startup timeout (``now``: unix s)."""
        return now - self.started_at > self.startup_timeout_s

    def abandon(self) -> tuple[str, dict]:
        """Stop a worker that did not load within its startup timeout; ``(message, details)``."""
        self.stopping = True
        _terminate(self.proc)
        return (f"worker did not load within the startup timeout ({self.startup_timeout_s:g} s)",
                {"log_tail": _log_tail(self.log_path)})


def _write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` with mode 0600 (atomic replace)."""
    from sequence_ai_server.launchers.local import write_secret
    write_secret(path, value)


def _log_tail(path: Path, lines: int = 20) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _exit_reason(code: int) -> str:
    if code == EXIT_UNKNOWN:   # an adopted worker (not our child): its status is its reaper's
        return "exited (status unknown: the worker was adopted after a gateway restart)"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _ready_host(ready: dict) -> Optional[str]:
    """The host in a worker's ready file (``host``, else the one in ``url``): 127.0.0.1 for a local
    worker, the node's IP for a Ray worker on another machine. None when it names none."""
    if ready.get("host"):
        return str(ready["host"])
    return urlsplit(str(ready.get("url") or "")).hostname


def _worker_url(row: DeploymentRow) -> str:
    """Where robots reach a ready deployment's worker: ``http://HOST:PORT`` (HOST defaults to loopback)."""
    return f"http://{row.worker_host or '127.0.0.1'}:{row.worker_port}"


def _terminate(proc: subprocess.Popen) -> None:
    stop_process(proc, grace_s=STOP_GRACE_S)
