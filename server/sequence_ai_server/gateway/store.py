"""The gateway's SQLite state (``<data_dir>/state.db``): deployments, kept versions, the
running workers a restarted gateway adopts, open sessions, and (through keys.py,
secrets.py, common/volumes.py and the ops stores, which share the connection through
``Store.transaction`` / ``Store.read``: common/state_db.py) keys, secrets, volumes, limits,
schedules, webhooks and usage. One connection guarded by one lock; every call is short. Columns added since the first release are
added to an older state.db when it is opened."""
from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.traffic import dump_policy, load_policy

__all__ = ["Store", "DeploymentRow", "VersionRow"]

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


def _loads(text: Optional[str]) -> Any:
    return json.loads(text) if text else None


def _dumps(value: Any) -> Optional[str]:
    return None if value is None else json.dumps(value)


# typed field -> (column, to the column, from the column): the JSON columns, parsed once on read
_JSON_FIELDS = {
    "spec": ("spec_json", _dumps, _loads),
    "details": ("error_details", _dumps, _loads),
    "build": ("build_json", _dumps, _loads),
    "defaults": ("defaults_json", lambda v: json.dumps(v) if v else None, lambda t: _loads(t) or {}),
    "traffic": ("traffic_json", lambda v: dump_policy(v or {}), load_policy),
}


@dataclass
class DeploymentRow:
    """One deployment as stored: the serving version and its worker. Times are unix seconds.

    ``status``: starting | ready | failed | stopped; ``phase``: the worker's load phase (or
    idle | exited | stopped). ``spec``: the loaded policy's spec (contract, params, timeouts...;
    None until it loaded); ``details``: why the last start failed; ``build``: the version
    building beside the serving one (or the last one that did); ``defaults``: deployment
    default params; ``traffic``: ``{"split": {version: share}, "pins": {key_id: version}}``
    (traffic.py); ``halted_at``: an emergency stop until ``seq policy start``."""
    name: str
    version: int
    file: str
    class_name: Optional[str] = None
    file_sha: Optional[str] = None
    status: str = "starting"
    phase: Optional[str] = None
    worker_port: Optional[int] = None
    worker_pid: Optional[int] = None
    worker_host: Optional[str] = None
    secret: Optional[str] = None
    epoch: int = 0
    error: Optional[str] = None
    details: Optional[dict] = None
    load_s: Optional[float] = None
    started_at: Optional[float] = None
    ready_at: Optional[float] = None
    served: int = 0
    spec: Optional[dict] = None
    created_at: float = 0.0
    updated_at: float = 0.0
    build: Optional[dict] = None
    defaults: dict = field(default_factory=dict)
    traffic: dict = field(default_factory=lambda: {"split": {}, "pins": {}})
    halted_at: Optional[float] = None

    @classmethod
    def from_columns(cls, cols: dict) -> "DeploymentRow":
        """From a ``deployments`` table row (JSON columns parsed here, once)."""
        kw = {f.name: cols.get(f.name) for f in dataclasses.fields(cls) if f.name not in _JSON_FIELDS}
        for name, (col, _, load) in _JSON_FIELDS.items():
            kw[name] = load(cols.get(col))
        kw["epoch"] = kw["epoch"] or 0
        kw["served"] = kw["served"] or 0
        return cls(**kw)

    def columns(self) -> dict:
        """The ``deployments`` table columns of this row."""
        return _columns(dataclasses.asdict(self))

    def replace(self, **changes: Any) -> "DeploymentRow":
        """A copy with ``changes`` (field names)."""
        return dataclasses.replace(self, **changes)

    def refuse_if_stopped(self) -> None:
        """Raise ApiError deployment_stopped (503, not retryable) while ``seq policy stop`` holds this
        deployment (``halted_at`` set)."""
        if self.halted_at:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.halted_at))
            raise ApiError("deployment_stopped", f"deployment {self.name!r} was stopped (`seq policy stop`, {when}); "
                           "it refuses every connect until it is started again",
                           details={"reason": "stopped", "stopped_at": self.halted_at},
                           hint=f"`seq policy start {self.name}` lets robots connect again")

    def spec_value(self, key: str, default: Any) -> Any:
        """The loaded spec's ``key`` (``idle_timeout``, ``min_workers``, ...), ``default`` when the
        spec is not loaded yet or the value is None."""
        value = (self.spec or {}).get(key)
        return default if value is None else value


def _columns(fields: dict) -> dict:
    out = {}
    for k, v in fields.items():
        if k in _JSON_FIELDS:
            col, dump, _ = _JSON_FIELDS[k]
            out[col] = dump(v)
        else:
            out[k] = v
    return out


@dataclass
class VersionRow:
    """One kept version of a deployment: ``file`` its snapshot under ``<data_dir>/versions``,
    ``source_file`` the file it was deployed from; ``status`` building | ready | failed |
    superseded | retired."""
    name: str
    version: int
    file: str
    source_file: str
    class_name: Optional[str] = None
    file_sha: Optional[str] = None
    status: str = "building"
    error: Optional[str] = None
    load_s: Optional[float] = None
    created_at: float = 0.0


class Store:
    """SQLite state, one connection guarded by one lock (every call is short). It is also the
    :class:`~sequence_ai_server.common.state_db.StateDB` the other stores of state.db take
    (``transaction``, ``read``, ``ensure_schema``): they share this connection and lock, and never
    hold either."""

    def __init__(self, path: Path):
        self._conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn_lock = threading.Lock()
        with self._conn_lock:           # autocommit: journal_mode cannot change inside a transaction
            db = self._conn
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            cols = {r[1] for r in db.execute("PRAGMA table_info(deployments)")}
            if "build_json" not in cols:   # a state.db from before versions were built beside
                db.execute("ALTER TABLE deployments ADD COLUMN build_json TEXT")
            if "defaults_json" not in cols:  # deployment default params (`seq policy params`)
                db.execute("ALTER TABLE deployments ADD COLUMN defaults_json TEXT")
            if "traffic_json" not in cols:   # canary split and pins (`seq policy traffic`, traffic.py)
                db.execute("ALTER TABLE deployments ADD COLUMN traffic_json TEXT")
            if "worker_host" not in cols:    # the host a worker listens on (Ray: its node's IP)
                db.execute("ALTER TABLE deployments ADD COLUMN worker_host TEXT")
            if "halted_at" not in cols:      # `seq policy stop` (emergency stop) until `seq policy start`
                db.execute("ALTER TABLE deployments ADD COLUMN halted_at REAL")

    # -- the StateDB of the other stores (common/state_db.py)
    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside ``BEGIN``, under the lock: committed when the block ends, rolled
        back (and the exception re-raised) when it raises."""
        with self._conn_lock:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:    # (an error SQLite already rolled back leaves none)
                    self._conn.execute("ROLLBACK")
                raise

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """The connection under the lock for reads, no transaction opened; fetch the rows inside
        the block."""
        with self._conn_lock:
            yield self._conn

    def ensure_schema(self, script: str) -> None:
        """Run ``script`` (``CREATE TABLE IF NOT EXISTS ...``) under the lock (executescript
        commits on its own, so this is no ``transaction``)."""
        with self._conn_lock:
            self._conn.executescript(script)

    # -- deployments and versions
    def get(self, name: str) -> Optional[DeploymentRow]:
        """The deployment ``name``, or None."""
        with self.read() as db:
            row = db.execute("SELECT * FROM deployments WHERE name = ?", (name,)).fetchone()
        return DeploymentRow.from_columns(dict(row)) if row else None

    def require(self, name: str) -> DeploymentRow:
        """The row of ``name``; raises ApiError not_found (naming the deployed ones) when there is none."""
        row = self.get(name)
        if row is None:
            known = [r.name for r in self.all()]
            raise ApiError("not_found", f"no deployment named {name!r}",
                           hint=f"deployed: {', '.join(known) or 'none'}; deploy one with `seq deploy FILE --name {name}`")
        return row

    def all(self) -> list[DeploymentRow]:
        """Every deployment, by name."""
        with self.read() as db:
            return [DeploymentRow.from_columns(dict(r)) for r in db.execute("SELECT * FROM deployments ORDER BY name")]

    def _put(self, table: str, cols: dict) -> None:
        """``INSERT OR REPLACE`` one row of ``table`` from ``{column: value}``."""
        with self.transaction() as db:
            db.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                       tuple(cols.values()))

    def _set(self, table: str, cols: dict, where: dict) -> None:
        """``UPDATE table SET cols WHERE where`` (both ``{column: value}``)."""
        sets = ", ".join(f"{k} = ?" for k in cols)
        cond = " AND ".join(f"{k} = ?" for k in where)
        with self.transaction() as db:
            db.execute(f"UPDATE {table} SET {sets} WHERE {cond}", (*cols.values(), *where.values()))

    def insert(self, row: DeploymentRow) -> None:
        """Store ``row`` (replacing a deployment of that name)."""
        self._put("deployments", row.columns())

    def update(self, name: str, **fields: Any) -> None:
        """Set ``fields`` (DeploymentRow field names; JSON ones serialised here) of deployment ``name``."""
        self._set("deployments", {**_columns(fields), "updated_at": time.time()}, {"name": name})

    def delete(self, name: str) -> None:
        """Forget deployment ``name`` and its versions."""
        with self.transaction() as db:
            db.execute("DELETE FROM deployments WHERE name = ?", (name,))
            db.execute("DELETE FROM versions WHERE name = ?", (name,))

    def versions(self, name: str) -> list[VersionRow]:
        """The kept versions of ``name``, newest first."""
        with self.read() as db:
            return [VersionRow(**dict(r)) for r in db.execute(
                "SELECT * FROM versions WHERE name = ? ORDER BY version DESC", (name,))]

    def kept(self, name: str) -> dict[int, VersionRow]:
        """``{version: VersionRow}`` of the kept versions of ``name``."""
        return {v.version: v for v in self.versions(name)}

    def put_version(self, row: VersionRow) -> None:
        """Store ``row`` (replacing that version)."""
        self._put("versions", dataclasses.asdict(row))

    def update_version(self, name: str, version: int, **fields: Any) -> None:
        """Set ``fields`` (VersionRow field names) of version ``version`` of ``name``."""
        self._set("versions", fields, {"name": name, "version": version})

    def delete_version(self, name: str, version: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM versions WHERE name = ? AND version = ?", (name, version))

    def _records(self, table: str) -> list[dict]:
        """The ``record_json`` column of every row of ``table``, parsed."""
        with self.read() as db:
            return [json.loads(r["record_json"]) for r in db.execute(f"SELECT record_json FROM {table}")]

    # worker processes (what a restarted gateway needs to adopt them; Gateway._save_workers)
    def worker_records(self) -> list[dict]:
        return self._records("workers")

    def put_worker_records(self, records: list[dict]) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM workers")
            db.executemany("INSERT INTO workers (key, name, role, pid, record_json) VALUES (?, ?, ?, ?, ?)",
                           [(r["key"], r["name"], r["role"], r["pid"], json.dumps(r)) for r in records])

    # open sessions (SessionTable)
    def session_records(self) -> list[dict]:
        return self._records("sessions")

    def put_session(self, record: dict) -> None:
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO sessions (id, model, record_json) VALUES (?, ?, ?)",
                       (record["id"], record["model"], json.dumps(record)))

    def delete_sessions(self, ids: list[str]) -> None:
        with self.transaction() as db:
            db.executemany("DELETE FROM sessions WHERE id = ?", [(i,) for i in ids])

    def close(self) -> None:
        with self._conn_lock:
            self._conn.close()
