"""Where the gateway is in each serving worker's usage, kept across gateway restarts:
:class:`UsageCursors`, one entry per (deployment, worker pid) with the last sample number
collected (the next ``/ping?usage_since=``) and the worker's counters as last collected (the
next delta is taken against them).

A worker's counters grow from its start, so a restarted gateway that adopts it must go on from
where the previous gateway stopped: held only in memory, the cursor would be gone and the
adopted worker's whole tally counted a second time. The entries are kept in a JSON file
(``<data_dir>/run/usage_cursors.json``), written whole to a temporary file and renamed over the
old one on each change, with each worker's process start time, so an entry is dropped once its
process has gone and never applies to a later process that reuses the pid.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Optional

from sequence_ai_server.common.processes import process_alive, process_start

__all__ = ["UsageCursors", "COUNTERS"]

COUNTERS = ("requests", "errors", "bytes_in", "bytes_out")


class UsageCursors:
    """Usage cursors per ``(deployment, pid)`` in ``path`` (None: memory only)."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._by: dict[tuple, dict] = {}       # (deployment, pid) -> {"seq", "counts", "start"}
        self._load()

    def seq(self, name: str, pid: Optional[int]) -> int:
        """The last sample number collected from worker ``pid`` of ``name`` (-1: none yet)."""
        with self._lock:
            entry = self._by.get((name, pid))
            return int(entry["seq"]) if entry else -1

    def counts(self, name: str, pid: Optional[int]) -> dict:
        """The worker's counters as last collected (empty: none yet)."""
        with self._lock:
            entry = self._by.get((name, pid))
            return dict(entry["counts"]) if entry else {}

    def put(self, name: str, pid: Optional[int], seq: int, counts: dict) -> None:
        """Record what was just collected from worker ``pid`` of ``name`` and write the file
        when it changed."""
        counts = {c: int(counts.get(c, 0) or 0) for c in COUNTERS}
        with self._lock:
            old = self._by.get((name, pid))
            if old and old["seq"] == seq and old["counts"] == counts:
                return
            start = old["start"] if old else (process_start(pid) if pid else None)
            self._by[(name, pid)] = {"seq": int(seq), "counts": counts, "start": start}
            self._sweep()
            self._save()

    def _sweep(self) -> None:
        for key, entry in list(self._by.items()):
            pid = key[1]
            if pid and entry.get("start") is not None and not process_alive(pid, entry["start"]):
                del self._by[key]

    def _save(self) -> None:
        if self.path is None:
            return
        rows = [{"deployment": n, "pid": p, **e} for (n, p), e in sorted(self._by.items(), key=str)]
        tmp = Path(f"{self.path}.tmp")
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(rows, sort_keys=True))
            os.replace(tmp, self.path)

    def _load(self) -> None:
        """The cursors a previous gateway left for workers that still run (adopted ones)."""
        if self.path is None:
            return
        try:
            rows = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return
        for r in rows if isinstance(rows, list) else []:
            with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
                pid = int(r["pid"]) if r.get("pid") is not None else None
                start = int(r["start"]) if r.get("start") is not None else None
                if pid and not process_alive(pid, start):
                    continue                       # that worker is gone: its cursor with it
                self._by[(str(r["deployment"]), pid)] = {
                    "seq": int(r["seq"]), "counts": {c: int(r["counts"].get(c, 0) or 0) for c in COUNTERS},
                    "start": start}
