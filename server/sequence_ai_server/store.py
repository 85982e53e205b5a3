"""The gateway's SQLite state (``<data_dir>/state.db``): deployments, kept versions, the
running workers a restarted gateway adopts, open sessions, and (through keys.py,
secrets_store.py, volumes.py, which share the connection) keys, secrets and volumes. One
connection guarded by a lock; every call is short. Columns added since the first release are
added to an older state.db when it is opened."""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["Store"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (
    name TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    file TEXT NOT NULL,
    class_name TEXT,
    file_sha TEXT,
    status TEXT NOT NULL,
    phase TEXT,
    worker_port INTEGER,
    worker_pid INTEGER,
    secret TEXT,
    epoch INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    error_details TEXT,
    load_s REAL,
    started_at REAL,
    ready_at REAL,
    served INTEGER NOT NULL DEFAULT 0,
    spec_json TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS versions (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    file TEXT NOT NULL,
    source_file TEXT NOT NULL,
    class_name TEXT,
    file_sha TEXT,
    status TEXT NOT NULL,
    error TEXT,
    load_s REAL,
    created_at REAL NOT NULL,
    PRIMARY KEY (name, version)
);
CREATE TABLE IF NOT EXISTS workers (
    key TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    pid INTEGER NOT NULL,
    record_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    record_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""


class Store:
    """SQLite state, one connection guarded by a lock (every call is short)."""

    def __init__(self, path: Path):
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(deployments)")}
            if "build_json" not in cols:   # a state.db from before versions were built beside
                self._db.execute("ALTER TABLE deployments ADD COLUMN build_json TEXT")
            if "defaults_json" not in cols:  # deployment default params (`seq policy params`)
                self._db.execute("ALTER TABLE deployments ADD COLUMN defaults_json TEXT")
            if "traffic_json" not in cols:   # canary split and pins (`seq policy traffic`, traffic.py)
                self._db.execute("ALTER TABLE deployments ADD COLUMN traffic_json TEXT")
            if "worker_host" not in cols:    # the host a worker listens on (Ray: its node's IP)
                self._db.execute("ALTER TABLE deployments ADD COLUMN worker_host TEXT")
            if "halted_at" not in cols:      # `seq policy stop` (emergency stop) until `seq policy start`
                self._db.execute("ALTER TABLE deployments ADD COLUMN halted_at REAL")

    def get(self, name: str) -> Optional[dict]:
        with self._lock:
            row = self._db.execute("SELECT * FROM deployments WHERE name = ?", (name,)).fetchone()
        return dict(row) if row else None

    def all(self) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self._db.execute("SELECT * FROM deployments ORDER BY name")]

    def insert(self, row: dict) -> None:
        cols = ", ".join(row)
        with self._lock:
            self._db.execute(f"INSERT OR REPLACE INTO deployments ({cols}) VALUES ({', '.join('?' * len(row))})",
                             tuple(row.values()))

    def update(self, name: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._lock:
            self._db.execute(f"UPDATE deployments SET {sets} WHERE name = ?", (*fields.values(), name))

    def versions(self, name: str) -> list[dict]:
        with self._lock:
            return [dict(r) for r in self._db.execute(
                "SELECT * FROM versions WHERE name = ? ORDER BY version DESC", (name,))]

    def put_version(self, row: dict) -> None:
        cols = ", ".join(row)
        with self._lock:
            self._db.execute(f"INSERT OR REPLACE INTO versions ({cols}) VALUES ({', '.join('?' * len(row))})",
                             tuple(row.values()))

    def update_version(self, name: str, version: int, **fields: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in fields)
        with self._lock:
            self._db.execute(f"UPDATE versions SET {sets} WHERE name = ? AND version = ?",
                             (*fields.values(), name, version))

    def delete_version(self, name: str, version: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM versions WHERE name = ? AND version = ?", (name, version))

    # worker processes (what a restarted gateway needs to adopt them; Gateway._save_workers)
    def worker_records(self) -> list[dict]:
        with self._lock:
            return [json.loads(r["record_json"]) for r in self._db.execute("SELECT record_json FROM workers")]

    def put_worker_records(self, records: list[dict]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM workers")
            self._db.executemany("INSERT INTO workers (key, name, role, pid, record_json) VALUES (?, ?, ?, ?, ?)",
                                 [(r["key"], r["name"], r["role"], r["pid"], json.dumps(r)) for r in records])
            self._db.execute("COMMIT")

    # open sessions (SessionTable)
    def session_records(self) -> list[dict]:
        with self._lock:
            return [json.loads(r["record_json"]) for r in self._db.execute("SELECT record_json FROM sessions")]

    def put_session(self, record: dict) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO sessions (id, model, record_json) VALUES (?, ?, ?)",
                             (record["id"], record["model"], json.dumps(record)))

    def delete_sessions(self, ids: list[str]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM sessions WHERE id = ?", [(i,) for i in ids])

    def close(self) -> None:
        with self._lock:
            self._db.close()
