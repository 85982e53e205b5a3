"""Structured logs: one JSON object per line from the gateway and every worker.

Where it sits: the gateway writes ``<data_dir>/logs/gateway.jsonl``; each worker it starts writes
``<data_dir>/logs/<deployment>.jsonl`` (the path comes in ``$SEQ_JSON_LOG``, the version in
``$SEQ_DEPLOYMENT_VERSION``). The human log ``<deployment>.log`` (the worker's stdout, with
the policy's own prints and tracebacks) stays as it is. Each line is::

    {"time": 1764484800.123, "level": "WARNING", "component": "worker", "pid": 4242,
     "deployment": "arm", "version": 3, "request_id": "req_9f...", "message": "..."}

``request_id`` is the record's own (``log.info(..., extra={"request_id": rid})``), else the one
the HTTP middleware put in :data:`REQUEST_ID` for the request being served, else null.
``deployment`` likewise (``extra={"deployment": name}`` or :data:`DEPLOYMENT`).

:func:`read_logs` merges the gateway's lines about one deployment with that deployment's worker
lines, ordered by time -- what ``seq policy logs NAME [--request-id R] [--lines N] [--follow]``
prints. Values of secrets are never logged by this code (workers get them in the environment).
"""
from __future__ import annotations

import contextvars
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Optional

__all__ = ["REQUEST_ID", "DEPLOYMENT", "JsonFormatter", "install_json_log", "read_logs", "GATEWAY_LOG"]

REQUEST_ID: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("seq_request_id", default=None)
DEPLOYMENT: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("seq_deployment", default=None)
GATEWAY_LOG = "gateway.jsonl"
_MAX_READ_BYTES = 8 * 1024 * 1024    # read_logs looks at most at the last 8 MiB of each file


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line. ``component`` ("gateway" | "worker"), and the
    deployment/version a worker serves, are fixed per process; request_id and deployment may
    also come per record (``extra=``) or from the context variables above."""

    def __init__(self, component: str, deployment: Optional[str] = None, version: Optional[int] = None):
        super().__init__()
        self.component, self.deployment, self.version = component, deployment, version

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        line = {"time": round(record.created, 6), "level": record.levelname, "component": self.component,
                "pid": record.process,
                "deployment": getattr(record, "deployment", None) or self.deployment or DEPLOYMENT.get(),
                "version": getattr(record, "version", None) or self.version,
                "request_id": getattr(record, "request_id", None) or REQUEST_ID.get(),
                "logger": record.name, "message": message}
        return json.dumps(line, default=str)


def install_json_log(path: Path, component: str, *, deployment: Optional[str] = None,
                     version: Optional[int] = None, logger: str = "sequence_ai_server") -> logging.Handler:
    """Append JSON lines for ``logger`` (and its children) to ``path`` (created 0600 if new).
    The logger's level is set to INFO when it was unset or higher. Returns the handler (remove it
    from the logger and close it to stop)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.close(fd)
    handler = logging.FileHandler(str(path), encoding="utf-8")
    handler.setFormatter(JsonFormatter(component, deployment, version))
    target = logging.getLogger(logger)
    if target.level == logging.NOTSET or target.level > logging.INFO:
        target.setLevel(logging.INFO)
    target.addHandler(handler)
    return handler


def _lines(path: Path) -> Iterable[dict]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _MAX_READ_BYTES))
            if size > _MAX_READ_BYTES:
                f.readline()                 # a partial first line
            data = f.read()
    except OSError:
        return
    for raw in data.splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue                         # a line being written right now, or not ours
        if isinstance(rec, dict):
            yield rec


def read_logs(log_dir: Path, deployment: str, *, request_id: Optional[str] = None, lines: int = 200,
              since: Optional[float] = None) -> list[dict]:
    """The last ``lines`` JSON log lines about ``deployment`` (its workers' and the gateway's that
    name it), oldest first, merged by ``time`` (unix s). ``request_id`` keeps only that request's
    lines; ``since`` only lines strictly newer than it (``--follow`` polls with the last time seen).
    Raises ValueError for lines < 1."""
    if lines < 1:
        raise ValueError(f"lines must be >= 1, got {lines}")
    log_dir = Path(log_dir)
    found = [r for r in _lines(log_dir / GATEWAY_LOG) if r.get("deployment") == deployment]
    found += list(_lines(log_dir / f"{deployment}.jsonl"))
    if request_id:
        found = [r for r in found if r.get("request_id") == request_id]
    if since is not None:
        found = [r for r in found if float(r.get("time") or 0) > since]
    found.sort(key=lambda r: float(r.get("time") or 0))
    return found[-lines:]

