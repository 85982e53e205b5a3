"""Usage metering, the gateway's half (the worker's is worker/meter.py, whose ``/ping?usage_since=N``
counters and samples the gateway collects): what each deployment used, per hour and card type
(``seq policy usage NAME --since``, ``seq account``, ``sequence_ai.account()``).

- :class:`UsageStore`: the ``usage`` table of state.db, one row per (deployment, hour, card type)
  with worker-seconds (every running worker: serving, building, side, retiring), requests,
  errors, bytes in and out;
- :class:`Recent`: the last hour's request samples per deployment in memory (error rate and p95
  for alerts.py).

Card type is the first type the deployment's ``gpu=`` names, or ``cpu``. Captured bytes are
measured on disk (``<data_dir>/capture/<name>``) when asked.
"""
from __future__ import annotations

import collections
import math
import os
import threading
import time
from pathlib import Path
from typing import Optional

from sequence_ai_server.common.state_db import StateDB

__all__ = ["UsageStore", "Recent", "card_of", "dir_bytes", "HOUR_S"]

HOUR_S = 3600.0


def card_of(spec: Optional[dict]) -> str:
    """The card type a deployment's workers are metered under: the first type its ``gpu=`` names
    (``"H100:2"`` -> ``H100``), else ``cpu``."""
    gpu = ((spec or {}).get("resources") or {}).get("gpu")
    first = gpu[0] if isinstance(gpu, list) and gpu else gpu
    if isinstance(first, str) and first.split(":")[0].lower() != "cpu":
        return first.split(":")[0]
    return "cpu"


def dir_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when it does not exist; unreadable files skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


class Recent:
    """The last hour's ``/act`` samples per deployment: ``(unix s, ms, error)``."""

    def __init__(self, window_s: float = HOUR_S) -> None:
        self.window_s = window_s
        self._by: dict[str, collections.deque] = {}
        self._lock = threading.Lock()

    def add(self, name: str, samples: list, now: float) -> None:
        """Record ``samples`` (``[seq, ms, error]``) of ``name`` as seen at ``now``."""
        with self._lock:
            q = self._by.setdefault(name, collections.deque())
            for _seq, ms, err in samples:
                q.append((now, float(ms), int(err)))
            while q and q[0][0] < now - self.window_s:
                q.popleft()

    def stats(self, name: str, now: float) -> dict:
        """``{"requests", "errors", "error_rate", "p95_ms"}`` of the last hour (rate and p95 None
        without a request)."""
        with self._lock:
            rows = [r for r in self._by.get(name, ()) if r[0] >= now - self.window_s]
        if not rows:
            return {"requests": 0, "errors": 0, "error_rate": None, "p95_ms": None}
        ms = sorted(r[1] for r in rows)
        errors = sum(r[2] for r in rows)
        p95 = ms[max(0, math.ceil(0.95 * len(ms)) - 1)]          # nearest rank
        return {"requests": len(rows), "errors": errors, "error_rate": round(errors / len(rows), 4), "p95_ms": p95}


_COUNTERS = ("worker_s", "requests", "errors", "bytes_in", "bytes_out")


class UsageStore:
    """The ``usage`` table of state.db (through the gateway's Store, a StateDB): per deployment,
    hour (unix s of its start, UTC) and card type, the counters in ``_COUNTERS``."""

    def __init__(self, state: StateDB):
        self._sql = state
        with self._sql.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS usage (deployment TEXT NOT NULL, hour REAL NOT NULL, "
                       "card TEXT NOT NULL, worker_s REAL NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0, "
                       "errors INTEGER NOT NULL DEFAULT 0, bytes_in INTEGER NOT NULL DEFAULT 0, "
                       "bytes_out INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (deployment, hour, card))")

    def add(self, rows: list[tuple[str, str, float, dict]]) -> None:
        """Add ``(deployment, card, unix s, {counter: amount})`` rows, each to its hour, in one transaction."""
        if not rows:
            return
        with self._sql.transaction() as db:
            for name, card, at, amounts in rows:
                hour = float(int(at // HOUR_S) * HOUR_S)
                vals = [amounts.get(c, 0) for c in _COUNTERS]
                db.execute(
                    f"INSERT INTO usage (deployment, hour, card, {', '.join(_COUNTERS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                    f"ON CONFLICT(deployment, hour, card) DO UPDATE SET "
                    + ", ".join(f"{c} = {c} + excluded.{c}" for c in _COUNTERS),
                    (name, hour, card, *vals))

    def totals(self, names: Optional[set] = None, since: float = 0.0) -> dict[str, dict]:
        """``{deployment: {"worker_s": {card: s}, "requests", "errors", "bytes_in", "bytes_out"}}``
        over the hours that end after ``since`` (unix s; an hour is counted whole), for ``names``
        (None: every deployment)."""
        with self._sql.read() as db:
            rows = db.execute(f"SELECT deployment, card, {', '.join(_COUNTERS)} FROM usage WHERE hour + ? > ?",
                              (HOUR_S, since)).fetchall()
        out: dict[str, dict] = {}
        for r in rows:
            name = r[0]
            if names is not None and name not in names:
                continue
            e = out.setdefault(name, {"worker_s": {}, "requests": 0, "errors": 0, "bytes_in": 0, "bytes_out": 0})
            e["worker_s"][r[1]] = round(e["worker_s"].get(r[1], 0.0) + r[2], 3)
            for c, v in zip(_COUNTERS[1:], r[3:]):
                e[c] += v
        return out

    def hours(self, name: str, since: float = 0.0) -> list[dict]:
        """The hourly rows of ``name`` from ``since`` on, oldest first:
        ``[{"hour", "card", "worker_s", "requests", "errors", "bytes_in", "bytes_out"}]``."""
        with self._sql.read() as db:
            rows = db.execute(f"SELECT hour, card, {', '.join(_COUNTERS)} FROM usage WHERE deployment = ? "
                              "AND hour + ? > ? ORDER BY hour, card", (name, HOUR_S, since)).fetchall()
        return [dict(zip(("hour", "card", *_COUNTERS), tuple(r))) for r in rows]

    def worker_s_since(self, names: Optional[set], since: float) -> float:
        """Worker-seconds of ``names`` (None: all) in the hours starting at or after ``since``."""
        with self._sql.read() as db:
            rows = db.execute("SELECT deployment, worker_s FROM usage WHERE hour >= ?", (since,)).fetchall()
        return sum(r[1] for r in rows if names is None or r[0] in names)
