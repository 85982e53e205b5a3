"""Usage metering: what each deployment used, per hour and card type (``seq policy usage NAME
--since``, ``seq account``, ``sequence_ai.account()``).

Two halves:

- :class:`ActMeter`, in each worker: a pure ASGI layer counting HTTP ``/act`` requests (and
  :meth:`ActMeter.count`, which the /act channel ``/act/ws`` and the openpi endpoint ``/`` call
  for each request they answer, so every /act is counted alike), the ones
  answered with an error (any status >= 400 except 401, which is a routine reconnect after a
  secret rotation), request and response body bytes, and the handler time of each (ms); a
  request whose client left before its body arrived never ran and is not counted. The
  worker's ``/ping?usage_since=N`` returns the counters and the samples after sequence number N.
- :class:`UsageStore`, in the gateway: the ``usage`` table of state.db, one row per
  (deployment, hour, card type) with worker-seconds (every running worker: serving, building,
  side, retiring), requests, errors, bytes in and out; and :class:`Recent`, the last hour's
  request samples per deployment in memory (error rate and p95 for alerts.py).

Card type is the first type the deployment's ``gpu=`` names, or ``cpu``. Captured bytes are
measured on disk (``<data_dir>/capture/<name>``) when asked.
"""
from __future__ import annotations

import asyncio
import collections
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional

from starlette.requests import ClientDisconnect

__all__ = ["ActMeter", "MeterLayer", "UsageStore", "Recent", "card_of", "dir_bytes", "HOUR_S"]

HOUR_S = 3600.0
_SAMPLES = 2048          # samples a worker keeps for the gateway to collect (about 4 s at 500 Hz)


class MeterLayer:
    """Pure ASGI middleware counting into ``meter`` (an :class:`ActMeter`):
    ``app.add_middleware(MeterLayer, meter=m)``."""

    def __init__(self, app: Any, meter: "ActMeter") -> None:
        self.app, self.meter = app, meter

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.meter.around(self.app, scope, receive, send)


class ActMeter:
    """Counts ``/act`` traffic of one worker (through :class:`MeterLayer`). ``snapshot(since)``
    -> ``{"requests", "errors", "bytes_in", "bytes_out", "seq", "samples": [[seq, ms, error 0|1], ...]}``."""

    def __init__(self, path: str = "/act") -> None:
        self.path = path
        self.requests = self.errors = self.bytes_in = self.bytes_out = 0
        self.seq = 0
        self.samples: collections.deque = collections.deque(maxlen=_SAMPLES)
        self._lock = threading.Lock()

    async def around(self, app: Any, scope: dict, receive: Any, send: Any) -> None:
        """Run ``app`` on one request, counting it when it is an /act."""
        if scope["type"] != "http" or scope.get("path") != self.path:
            await app(scope, receive, send)
            return
        t0 = time.perf_counter()
        size_in = size_out = 0
        status = 0
        answered = False
        watch: Optional[asyncio.Task] = None

        async def gone() -> bool:
            # Once the body is read, the server's next message is the disconnect: before the
            # answer went out it means the client left (the server drops the answer unsent).
            return (await receive())["type"] == "http.disconnect" and not answered

        async def counted_receive() -> dict:
            nonlocal size_in, watch
            message = await receive()
            if message["type"] == "http.request":
                size_in += len(message.get("body", b""))
                if not message.get("more_body") and watch is None:
                    watch = asyncio.ensure_future(gone())
            return message

        async def counted_send(message: dict) -> None:
            nonlocal size_out, status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                answered = answered or not message.get("more_body")
                size_out += len(message.get("body", b""))
            await send(message)

        ran = True
        try:
            await app(scope, counted_receive, counted_send)
        except ClientDisconnect:
            ran = watch is not None or bool(status)    # False: the client left before its body arrived
            raise
        finally:
            if watch is not None:
                if watch.done() and not watch.cancelled() and watch.exception() is None and watch.result():
                    status, size_out = 0, 0          # nothing was delivered
                watch.cancel()
            if ran:                                  # one whose body never came never ran: not counted
                self.count((time.perf_counter() - t0) * 1000.0, status, size_in, size_out)

    def count(self, ms: float, status: int, size_in: int, size_out: int) -> None:
        """Count one answered /act: its handler time ``ms`` (ms), HTTP ``status`` (0: no answer
        was sent; an error like any status >= 400 except 401), request and answer body sizes (bytes)."""
        error = status >= 400 and status != 401 or status == 0
        with self._lock:
            self.requests += 1
            self.errors += int(error)
            self.bytes_in += size_in
            self.bytes_out += size_out
            self.seq += 1
            self.samples.append((self.seq, round(ms, 3), int(error)))

    def snapshot(self, since: int = -1) -> dict:
        """The counters and the samples with a sequence number above ``since``."""
        with self._lock:
            return {"requests": self.requests, "errors": self.errors, "bytes_in": self.bytes_in,
                    "bytes_out": self.bytes_out, "seq": self.seq,
                    "samples": [list(s) for s in self.samples if s[0] > since]}


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
    """The ``usage`` table of state.db (shares the Store's connection and lock): per deployment,
    hour (unix s of its start, UTC) and card type, the counters in ``_COUNTERS``."""

    def __init__(self, db, lock: threading.Lock):
        self._db, self._lock = db, lock
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS usage (deployment TEXT NOT NULL, hour REAL NOT NULL, "
                             "card TEXT NOT NULL, worker_s REAL NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0, "
                             "errors INTEGER NOT NULL DEFAULT 0, bytes_in INTEGER NOT NULL DEFAULT 0, "
                             "bytes_out INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (deployment, hour, card))")

    def add(self, rows: list[tuple[str, str, float, dict]]) -> None:
        """Add ``(deployment, card, unix s, {counter: amount})`` rows, each to its hour, in one transaction."""
        if not rows:
            return
        with self._lock:
            self._db.execute("BEGIN")
            try:
                for name, card, at, amounts in rows:
                    hour = float(int(at // HOUR_S) * HOUR_S)
                    vals = [amounts.get(c, 0) for c in _COUNTERS]
                    self._db.execute(
                        f"INSERT INTO usage (deployment, hour, card, {', '.join(_COUNTERS)}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                        f"ON CONFLICT(deployment, hour, card) DO UPDATE SET "
                        + ", ".join(f"{c} = {c} + excluded.{c}" for c in _COUNTERS),
                        (name, hour, card, *vals))
                self._db.execute("COMMIT")
            except Exception:
                self._db.execute("ROLLBACK")
                raise

    def totals(self, names: Optional[set] = None, since: float = 0.0) -> dict[str, dict]:
        """``{deployment: {"worker_s": {card: s}, "requests", "errors", "bytes_in", "bytes_out"}}``
        over the hours that end after ``since`` (unix s; an hour is counted whole), for ``names``
        (None: every deployment)."""
        with self._lock:
            rows = self._db.execute(f"SELECT deployment, card, {', '.join(_COUNTERS)} FROM usage WHERE hour + ? > ?",
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
        with self._lock:
            rows = self._db.execute(f"SELECT hour, card, {', '.join(_COUNTERS)} FROM usage WHERE deployment = ? "
                                    "AND hour + ? > ? ORDER BY hour, card", (name, HOUR_S, since)).fetchall()
        return [dict(zip(("hour", "card", *_COUNTERS), tuple(r))) for r in rows]

    def worker_s_since(self, names: Optional[set], since: float) -> float:
        """Worker-seconds of ``names`` (None: all) in the hours starting at or after ``since``."""
        with self._lock:
            rows = self._db.execute("SELECT deployment, worker_s FROM usage WHERE hour >= ?", (since,)).fetchall()
        return sum(r[1] for r in rows if names is None or r[0] in names)
