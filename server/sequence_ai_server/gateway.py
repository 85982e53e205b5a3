"""The gateway: deployments, API keys and connect. It is not on the /act path.

Where it sits: a client calls ``POST /v1/connect`` once, gets the worker's URL and direct
secret, and from then on talks to the worker directly. The gateway

  - keeps its state in SQLite under the data dir (``state.db``: deployments, keys),
  - creates an API key on first start (hash stored, plaintext written to ``<data_dir>/api_key``, 0600),
  - spawns one worker process per deployment (log in ``<data_dir>/logs/<name>.log``) and
    supervises it: a worker that exits while loading marks the deployment failed with the
    policy's own error; one that dies after serving is marked failed and restarted by the next connect,
  - answers connect with 503 warming + Retry-After while a worker loads (estimated from the
    last measured load, else 30 s), and starts the worker of a deployment stopped for idleness (not one stopped with
    `seq policy stop`: that refuses connects until `seq policy start`),
  - terminates every worker when it shuts down; a gateway that dies instead (crash, SIGKILL)
    leaves its workers serving the leases robots hold, and the next gateway started on the same
    data dir adopts them (``workers`` and ``sessions`` tables; ``_adopt_workers``).

Endpoints (see docs/design.md for the bodies):
    GET    /v1/models                  no key (deployments, then templates; ?kind= ?endpoint=; catalogue.py)
    GET    /v1/deployments             key
    POST   /v1/deployments             key
    GET    /v1/deployments/{name}      key
    DELETE /v1/deployments/{name}      key   (emergency stop: connects refused until POST .../start)
    POST   /v1/connect                 key
    GET|POST /v1/deployments/{name}/traffic   account key (canary split and pins; traffic.py)
    GET    /v1/deployments/{name}/logs        account key (JSON logs merged by time; logs.py)
    /v1/volumes ...                    account key (volumes.py)
    /v1/adapters ...                   account key (adapters.py)
    (and keys, secrets, sessions, versions, params, doctor: see docs/design.md)

Who may call each route (none / robot key bound to its deployment / account key / a worker's
direct secret) is the table in docs/design.md ("Who may call what"); each route states it with its
key dependency (``account_key``, ``require_key``, ``worker_secret``), and ``CredentialsFirst``
checks that from the headers before any body is read.

A health task pings every serving worker each 2 s; one whose /ping says ``degraded`` (an
inference ran past timeouts.request) is replaced by a fresh worker of the same version
(``replace_jammed``). Request bodies over 32 MiB are refused with 413 (``BodyLimit``).

    python -m sequence_ai_server.gateway [--host 127.0.0.1] [--port 8470] [--data-dir DIR] [--ready-file F]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import signal
import socket
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
from fastapi import APIRouter, Depends, FastAPI, Header, Request
from pydantic import BaseModel

from seq._params import InferParam, ParamError, cast_params

from . import catalogue   # the /v1/models rows: contract-derived fields and templates
from .errors import CODES as _CODES
from ._proc import EXIT_UNKNOWN, AdoptedProcess, process_alive, process_cmdline, process_start, stop_process
from .errors import ApiError, install_error_handlers, new_request_id
from .keys import KeyRecord, KeyStore
from .leases import RevocationList, push_revocations, sign_lease
from .slots import SlotQueue, slots_of   # issue 5: slots and the waiting line
from .secrets_store import SecretStore   # issue 5: encrypted secrets, injected only when declared
from .metrics import CONTENT_TYPE_LATEST, GatewayMetrics   # issue 5: Prometheus /metrics
from .logs import DEPLOYMENT, GATEWAY_LOG, REQUEST_ID, install_json_log, read_logs
from .volumes import VolumeError, VolumeStore
from .traffic import TrafficError, TrafficRouter, dump_policy, load_policy, parse_split, parse_version

__all__ = ["Gateway", "create_app", "serve", "main", "default_data_dir", "DEFAULT_HOST", "DEFAULT_PORT"]

log = logging.getLogger("sequence_ai_server.gateway")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
DEFAULT_LOAD_ESTIMATE_S = 30.0
LEASE_TTL_S = 300.0            # default lease; $SEQ_LEASE_TTL_S overrides (tests use a few seconds)
DEFAULT_IDLE_TIMEOUT_S = 600.0  # when the policy declares none (seq._policy default)
STOP_GRACE_S = 10.0
JAMMED_GRACE_S = 2.0        # a jammed worker (replace_jammed) is killed this long after SIGTERM
KEEP_VERSIONS = 5
BUILD_SUFFIX = ".build"     # workers[name + BUILD_SUFFIX]: the version building beside the serving one
SIDE_MARK = "@v"            # workers[f"{name}@v{N}"]: a kept version serving a traffic split or a pin
HEALTH_INTERVAL_S = 2.0     # how often running workers are pinged for a jammed inference ($SEQ_HEALTH_INTERVAL_S)
_CODES.setdefault("deployment_stopped", (503, False))   # `seq policy stop`, until `seq policy start`
MAX_BODY_BYTES = 32 * 1024 * 1024   # the largest request body the gateway reads (the worker's cap too)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_DEPLOYMENT_PATH = re.compile(r"^/v1/deployments/([a-z0-9][a-z0-9_-]{0,62})(?:/|$)")
_QUIET_ROUTES = {"/metrics", "/healthz", "/v1/deployments/{name}/logs", "/v1/deployments/{name}",
                 "/v1/internal/revocations"}  # polled: not logged


class DataDirInUse(OSError):
    """Another live gateway supervises the workers of this data dir (raised when a gateway starts)."""


def default_data_dir() -> Path:
    return Path(os.environ.get("SEQUENCES_HOME") or Path.home() / ".sequence-ai").expanduser()


def _hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# ---------------------------------------------------------------- wire models

class DeployRequest(BaseModel):
    name: str
    file: str
    class_name: Optional[str] = None


class Deployment(BaseModel):
    name: str
    version: int
    status: str                      # starting | ready | failed | stopped
    phase: Optional[str] = None      # spawning | importing | loading | warmup | checking | ready | failed | stopped
    worker_url: Optional[str] = None
    error: Optional[str] = None
    load_s: Optional[float] = None
    file: str
    class_name: Optional[str] = None
    pid: Optional[int] = None
    started_at: Optional[float] = None
    ready_at: Optional[float] = None
    contract: Optional[dict[str, Any]] = None
    params: list[dict[str, Any]] = []
    spec: Optional[dict[str, Any]] = None
    details: Optional[dict[str, Any]] = None
    build: Optional[dict[str, Any]] = None     # the version building beside the serving one (or the last one that did)
    health: Optional[dict[str, Any]] = None    # a jammed worker seen by the health check: state jammed | replaced
    stopped_at: Optional[float] = None          # `seq policy stop` (unix s): connects refused until `seq policy start`
    sessions: Optional[list[dict[str, Any]]] = None   # GET one deployment: each connected robot and what it runs with


class DeploymentList(BaseModel):
    deployments: list[Deployment]


class ModelEntry(BaseModel):
    """One catalogue row; the fields after ``params`` are read off the contract (catalogue.py)."""
    name: str
    version: Optional[int]
    status: str
    contract: Optional[dict[str, Any]]
    params: list[dict[str, Any]]
    short_id: str
    kind: str                                   # model | template
    template_kind: Optional[str] = None         # policy (a template's kind)
    endpoint: Optional[str] = None              # act; None for a template (deploy it first)
    description: Optional[str] = None
    camera_views: Optional[list[str]] = None
    state_dim: Optional[int] = None
    state_layout: Optional[dict[str, int]] = None
    action_dim: Optional[int] = None
    action_space: Optional[str] = None
    action_semantics: Optional[str] = None
    robot: Optional[str] = None
    control_frequency_hz: Optional[float] = None
    client_resize: Optional[dict[str, Any]] = None
    input_aspect_ratio: Optional[float] = None
    input_resize: Optional[str] = None
    history: Optional[int] = None
    pass_raw: bool = True


class ModelList(BaseModel):
    models: list[ModelEntry]


class ConnectRequest(BaseModel):
    model: str
    params: dict[str, Any] = {}
    ticket: Optional[str] = None     # a queued robot's place in line (details.ticket of a 503 queued)


class SecretSet(BaseModel):
    env: dict[str, str]


class WorkerSecretsRequest(BaseModel):
    names: list[str]


class ParamsUpdate(BaseModel):
    set: dict[str, Any] = {}
    clear: list[str] = []


class RollbackRequest(BaseModel):
    to: Optional[int] = None


class VolumeUpload(BaseModel):
    """``seq volume put``: the manifest of a directory, ``[{"path", "size", "md5"}]`` (volumes.py)."""
    files: list[dict[str, Any]]


class TrafficUpdate(BaseModel):
    """``seq policy traffic``: one of a split (``{"v5": 10, "v4": 90}``), a pin, an unpin or clear."""
    split: Optional[dict[str, Any]] = None   # shares are checked by traffic.parse_split
    pin: Optional[str] = None          # key id or name (a key bound to this deployment)
    version: Optional[str] = None      # the pin's version, "v5" or "5"
    unpin: Optional[str] = None
    clear: bool = False


class KeyCreate(BaseModel):
    name: Optional[str] = None
    deployment: Optional[str] = None


class Lease(BaseModel):
    ttl_s: float
    expires_at: float
    epoch: int


class ConnectResponse(BaseModel):
    session_id: str
    worker_url: str
    direct_secret: str
    lease: Lease
    contract: dict[str, Any]
    params: dict[str, Any]
    version: int


# ---------------------------------------------------------------- state

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


@dataclass
class WorkerProc:
    name: str
    proc: subprocess.Popen
    ready_file: Path
    log_path: Path
    started_at: float
    startup_timeout_s: float = 1800.0
    phase_mtime: float = 0.0
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
    port: Optional[int] = None          # a side worker (SIDE_MARK) once ready; serving ones keep it in the row
    host: Optional[str] = None          # with port: the side worker's host (from its ready file)
    epoch: int = 0                      # a side worker's lease epoch
    error: Optional[str] = None         # a side worker that failed to load: why
    proc_start: Optional[int] = None    # the process's start time (_proc.process_start): its identity with the pid
    supervisor_file: Optional[Path] = None   # {pid, start} of the gateway supervising it (worker --supervisor-file)


@dataclass
class SessionRec:
    """One admitted robot session. Times are unix seconds."""
    id: str
    model: str
    key_id: str
    epoch: int
    version: int
    params: dict
    created_at: float
    expires_at: float
    requested: dict = field(default_factory=dict)   # the robot's own params; deployment defaults fill the rest
    side: str = ""     # workers key of the side worker (a split/pinned version); "" = the serving worker


class SessionTable(dict):
    """``session_id -> SessionRec``, written through to the ``sessions`` table of state.db on every
    set and removal, so a restarted gateway still knows the sessions whose leases robots hold
    (renewals go on, slots stay counted). A changed record is stored by setting it again."""

    def __init__(self, store: "Store"):
        super().__init__()
        self._store = store

    def load(self) -> list[SessionRec]:
        """The stored sessions (into this table, without writing); returns them."""
        out = []
        for rec in self._store.session_records():
            with contextlib.suppress(TypeError):
                sess = SessionRec(**rec)
                dict.__setitem__(self, sess.id, sess)
                out.append(sess)
        return out

    def __setitem__(self, key: str, value: SessionRec) -> None:
        super().__setitem__(key, value)
        self._store.put_session(dict(value.__dict__))

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._store.delete_sessions([key])

    def pop(self, key: str, *default: Any) -> Any:
        had = key in self
        value = super().pop(key, *default)
        if had:
            self._store.delete_sessions([key])
        return value

    def clear(self) -> None:
        ids = list(self)
        super().clear()
        self._store.delete_sessions(ids)


def _write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` with mode 0600 (atomic replace)."""
    tmp = Path(f"{path}.tmp")
    fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)
    os.replace(tmp, path)


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


# ---------------------------------------------------------------- the gateway

class Gateway:
    """Owns the state and the worker processes; the routers call into it."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("logs", "run", "weights"):
            (self.data_dir / sub).mkdir(exist_ok=True)
        self.store = Store(self.data_dir / "state.db")
        self._json_log = install_json_log(self.data_dir / "logs" / GATEWAY_LOG, "gateway")   # logs.py
        self.keys = KeyStore(self.store._db, self.store._lock)
        self.workers: dict[str, WorkerProc] = {}
        # scale-out hook (ray_backend.py): $SEQ_BACKEND=ray starts workers as Ray actors through a
        # launcher whose start() returns a Popen look-alike; None keeps plain local subprocesses
        from .ray_backend import launcher_from_env
        self.launcher = launcher_from_env()
        self._lock = threading.RLock()
        self.api_key_file = self.data_dir / "api_key"
        self._ensure_key()
        self.lease_ttl_s = float(os.environ.get("SEQ_LEASE_TTL_S") or LEASE_TTL_S)
        self.sessions: dict[str, SessionRec] = SessionTable(self.store)   # persisted: survives a restart
        self.revoked = RevocationList()              # sessions ended early; workers refuse their tokens (leases.py)
        self._activity: dict[str, float] = {}      # deployment -> last connect / renew / /v1/act (unix s)
        self.cold_starts = 0
        self._retiring: list[WorkerProc] = []        # replaced workers draining after a version switch
        self.queue = SlotQueue()                     # robots waiting for a slot (slots.py)
        self.secrets = SecretStore(self.store._db, self.store._lock, self.data_dir / "secret.key")
        self.volumes = VolumeStore(self.store._db, self.store._lock, self.data_dir / "volumes", self.volume_users)
        self.url: Optional[str] = None               # this gateway's own URL once bound (workers fetch secrets)
        self._session_s: list[float] = []            # lengths of recent closed sessions (queue estimate)
        self.max_gpus = int(os.environ["SEQ_MAX_GPUS"]) if os.environ.get("SEQ_MAX_GPUS") else None
        self.traffic = TrafficRouter()               # canary split between versions (traffic.py)
        self._side_failed: dict[str, dict] = {}      # side worker key -> why its last start failed
        self._health: dict[str, dict] = {}           # deployment -> the last jammed-worker event (replace_jammed)
        self.health_interval_s = float(os.environ.get("SEQ_HEALTH_INTERVAL_S") or HEALTH_INTERVAL_S)
        self._saved_workers: Optional[str] = None     # the last worker records written (_save_workers)
        self._me = {"pid": os.getpid(), "start": process_start(os.getpid())}   # what supervisor files name
        # workers of a previous gateway process on this data dir keep serving through its death:
        # the ones still running are adopted, the rest of what it left is cleaned up
        self._adopt_workers()

    # -- surviving a gateway restart: what each worker needs recorded, and adopting it again
    # A local worker does not die with its gateway (worker.py --supervisor-file): robots keep acting
    # on it with the leases they hold. The ``workers`` table of state.db records every running
    # worker (pid + start time, ready file, secret files, version, role); a gateway started on the
    # same data dir adopts each one still running that is really that worker, stops any other
    # worker of this data dir, and keeps the ``sessions`` table's open sessions of adopted workers.
    def _write_supervisor(self, path: Path) -> None:
        """Name this gateway as the supervisor in a worker's supervisor file (atomic replace)."""
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(self._me))
        os.replace(tmp, path)

    @staticmethod
    def _role(key: str) -> str:
        if key.endswith(BUILD_SUFFIX):
            return "build"
        return "side" if SIDE_MARK in key else "serving"

    @staticmethod
    def _worker_record(key: str, w: WorkerProc, role: str) -> dict:
        rec = {"key": key, "name": w.name, "role": role, "pid": w.proc.pid, "start": w.proc_start,
               "ready_file": str(w.ready_file), "log_path": str(w.log_path), "started_at": w.started_at,
               "startup_timeout_s": w.startup_timeout_s, "secret": w.secret,
               "secret_file": str(w.secret_file) if w.secret_file else None,
               "activity_file": str(w.activity_file) if w.activity_file else None,
               "supervisor_file": str(w.supervisor_file) if w.supervisor_file else None,
               "version": w.version, "file": w.file, "class_name": w.class_name, "file_sha": w.file_sha,
               "spec": w.spec, "port": w.port, "host": w.host, "epoch": w.epoch}
        if role == "retiring":
            rec.update(retired_at=getattr(w, "retired_at", time.time()), grace_s=getattr(w, "grace_s", STOP_GRACE_S))
        return rec

    def _save_workers(self) -> None:
        """Record the running workers (serving, building, side, retiring) in the ``workers`` table,
        when they changed. Ray workers are not recorded: they stop with their actors."""
        if self.launcher:
            return
        with self._lock:
            records = [self._worker_record(k, w, self._role(k)) for k, w in self.workers.items()]
            records += [self._worker_record(f"{w.name}.retiring.{w.proc.pid}", w, "retiring") for w in self._retiring]
            blob = json.dumps(records, sort_keys=True, default=str)
            if blob == self._saved_workers:
                return
            self.store.put_worker_records(records)
            self._saved_workers = blob

    def _is_worker(self, url: str, name: str, pid: int) -> bool:
        """True when ``url``'s ``/ping`` answers as worker ``name`` with process id ``pid``."""
        for _ in range(3):
            try:
                r = httpx.get(f"{url}/ping", timeout=3.0, trust_env=False)
                body = r.json() if r.status_code == 200 else {}
                return body.get("name") == name and body.get("pid") == pid
            except (httpx.HTTPError, ValueError):
                time.sleep(0.2)
        return False

    def _stop_in_background(self, proc: Any, why: str) -> None:
        log.warning("stopping worker pid %d: %s", proc.pid, why)
        threading.Thread(target=stop_process, args=(proc,), kwargs={"grace_s": STOP_GRACE_S},
                         name=f"stop-{proc.pid}", daemon=True).start()

    def _adopt_one(self, rec: dict) -> Optional[WorkerProc]:
        """A WorkerProc over the recorded worker ``rec`` when it still runs and is that worker (same
        pid and start time, our ready file on its command line, and, once serving, ``/ping`` naming
        it with that pid); None otherwise (one that is ours but no longer wanted is stopped)."""
        pid, start = int(rec["pid"]), rec.get("start")
        if not process_alive(pid, start):
            return None
        argv = process_cmdline(pid)
        if "sequence_ai_server.worker" not in argv or rec.get("ready_file") not in argv:
            return None
        proc = AdoptedProcess(pid, start)
        url = None
        if rec["role"] == "serving":
            row = self.store.get(rec["name"])
            if row is None or row["worker_pid"] != pid or row["status"] not in ("starting", "ready"):
                self._stop_in_background(proc, f"{rec['name']} no longer runs it")
                return None
            if row["status"] == "ready" and row["worker_port"]:
                url = _worker_url(row)
        elif rec["role"] == "side" and rec.get("port"):
            url = f"http://{rec.get('host') or '127.0.0.1'}:{rec['port']}"
        if url is not None and not self._is_worker(url, rec["name"], pid):
            self._stop_in_background(proc, f"it does not answer as the worker of {rec['name']} at {url}")
            return None

        def path(k: str) -> Optional[Path]:
            return Path(rec[k]) if rec.get(k) else None
        w = WorkerProc(rec["name"], proc, Path(rec["ready_file"]), Path(rec["log_path"]), float(rec["started_at"]),
                       startup_timeout_s=float(rec.get("startup_timeout_s") or 1800.0), secret=rec.get("secret") or "",
                       secret_file=path("secret_file"), activity_file=path("activity_file"),
                       version=int(rec.get("version") or 0), file=rec.get("file") or "", class_name=rec.get("class_name"),
                       file_sha=rec.get("file_sha"), spec=rec.get("spec"), port=rec.get("port"), host=rec.get("host"),
                       epoch=int(rec.get("epoch") or 0), proc_start=start, supervisor_file=path("supervisor_file"))
        if w.supervisor_file is not None:
            self._write_supervisor(w.supervisor_file)
        log.info("adopted the running %s worker of %s v%d (pid %d)", rec["role"], w.name, w.version, pid)
        return w

    def _adopt_workers(self) -> None:
        """At start: adopt the recorded workers still running, settle the deployment rows and
        builds whose worker is gone, keep the open sessions of adopted workers, and stop any other
        worker process of this data dir (one the previous run started but had not recorded)."""
        kept: set[int] = set()
        records = [] if self.launcher else self.store.worker_records()
        for rec in records:        # a gateway still running on this data dir keeps its workers
            sup = _read_json(Path(rec["supervisor_file"])) if rec.get("supervisor_file") else None
            with contextlib.suppress(KeyError, TypeError, ValueError):
                if sup and int(sup["pid"]) != os.getpid() and process_alive(int(sup["pid"]), sup.get("start")):
                    raise DataDirInUse(f"another gateway (pid {sup['pid']}) is running on {self.data_dir} "
                                       "and supervises its workers; stop it first, or use another --data-dir")
        for rec in records:
            try:
                w = self._adopt_one(rec)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("a worker record could not be read (%s); not adopted", exc)
                continue
            if w is None:
                continue
            kept.add(w.proc.pid)
            if rec["role"] == "retiring":           # was draining after a version switch: let it finish
                w.stopping, w.retired_at = True, time.time()
                w.grace_s = float(rec.get("grace_s") or STOP_GRACE_S)
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
                self._retiring.append(w)
            else:
                self.workers[rec["key"]] = w
        for row in self.store.all():
            name = row["name"]
            if row["status"] in ("starting", "ready") and name not in self.workers:
                self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
            build = json.loads(row["build_json"]) if row.get("build_json") else None
            if build and build.get("status") == "switching" and not any(w.name == name for w in self._retiring):
                self.store.update(name, build_json=json.dumps({**build, "status": "ready"}))
            elif build and build.get("status") == "building" and (name + BUILD_SUFFIX) not in self.workers:
                msg = "the gateway restarted during the build and its worker was gone"
                self.store.update(name, build_json=json.dumps({**build, "status": "failed", "phase": "failed", "error": msg}))
                self.store.update_version(name, build["version"], status="failed", error=msg)
        now = time.time()
        for sess in self.sessions.load():
            row = self.store.get(sess.model)
            if sess.side:
                alive = sess.side in self.workers
            else:
                alive = (row is not None and row["status"] == "ready" and row["epoch"] == sess.epoch
                         and sess.model in self.workers)
            if sess.expires_at < now or not alive:
                self.sessions.pop(sess.id, None)
        if not self.launcher:
            self._stop_unrecorded(kept)
        self._save_workers()

    def _stop_unrecorded(self, kept: set[int]) -> None:
        """Stop worker processes of this data dir (ready file under ``<data_dir>/run``) not adopted."""
        run = str(self.data_dir / "run") + os.sep
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in kept or int(entry) == os.getpid():
                continue
            argv = process_cmdline(int(entry))
            if "sequence_ai_server.worker" not in argv or "--ready-file" not in argv:
                continue
            i = argv.index("--ready-file")
            if i + 1 < len(argv) and argv[i + 1].startswith(run) and process_alive(int(entry)):
                self._stop_in_background(AdoptedProcess(int(entry), process_start(int(entry))),
                                         "a worker of this data dir that no record names")

    # -- keys
    def _ensure_key(self) -> None:
        if self.keys.count():
            return
        _, key = self.keys.create(name="local")
        fd = os.open(str(self.api_key_file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        os.chmod(self.api_key_file, 0o600)
        log.info("created an API key; it is in %s", self.api_key_file)

    def check_key(self, key: Optional[str]) -> bool:
        rec = self.keys.lookup(key)
        return rec is not None and rec.revoked_at is None

    def authenticate(self, key: Optional[str]) -> KeyRecord:
        """The live key record for ``key``; raises ApiError unauthorized (401) when missing, unknown or revoked."""
        hint = (f"send `Authorization: Bearer <key>`; the local key is in {self.api_key_file} "
                "(or set SEQUENCES_API_KEY)")
        if not key:
            raise ApiError("unauthorized", "no API key was sent", hint=hint)
        rec = self.keys.lookup(key)
        if rec is None:
            raise ApiError("unauthorized", "missing or invalid API key", hint=hint)
        if rec.revoked_at is not None:
            raise ApiError("unauthorized", f"this API key ({rec.id}{' ' + rec.name if rec.name else ''}) was revoked",
                           hint="ask the account owner for a new key (`seq keys create`)", details={"reason": "revoked"})
        return rec

    @staticmethod
    def require_scope(key: KeyRecord, deployment: Optional[str] = None) -> None:
        """Robot keys reach only their own deployment; account-wide actions need an unbound key."""
        if key.deployment is None or (deployment is not None and deployment == key.deployment):
            return
        what = f"deployment {deployment!r}" if deployment else "this endpoint"
        raise ApiError("unauthorized", f"this key is bound to deployment {key.deployment!r} and may not use {what}",
                       hint="use an account key (one made by `seq keys create` without --deployment)",
                       details={"reason": "key_bound", "deployment": key.deployment})

    # -- views
    def describe(self, row: dict) -> Deployment:
        spec = json.loads(row["spec_json"]) if row.get("spec_json") else None
        details = json.loads(row["error_details"]) if row.get("error_details") else None
        return Deployment(
            name=row["name"], version=row["version"], status=row["status"], phase=row["phase"],
            worker_url=_worker_url(row) if row["status"] == "ready" and row["worker_port"] else None,
            error=row["error"], load_s=row["load_s"], file=row["file"], class_name=row["class_name"],
            pid=row["worker_pid"], started_at=row["started_at"], ready_at=row["ready_at"],
            contract=spec["contract"] if spec else None, params=spec["params"] if spec else [],
            spec=spec, details=details, stopped_at=row.get("halted_at"),
            build=json.loads(row["build_json"]) if row.get("build_json") else None,
            health=self._health.get(row["name"]),
        )

    def require(self, name: str) -> dict:
        row = self.store.get(name)
        if row is None:
            known = [r["name"] for r in self.store.all()]
            raise ApiError("not_found", f"no deployment named {name!r}",
                           hint=f"deployed: {', '.join(known) or 'none'}; deploy one with `seq deploy FILE --name {name}`")
        return row

    # -- lifecycle
    def deploy(self, req: DeployRequest) -> Deployment:
        if not _NAME.match(req.name):
            raise ApiError("invalid_request", f"deployment name {req.name!r} is not valid",
                           hint="use lowercase letters, digits, '-' and '_' (up to 63), starting with a letter or digit")
        path = Path(req.file)
        if not path.is_absolute():
            raise ApiError("invalid_request", f"file {req.file!r} is not an absolute path",
                           hint="send the policy file's absolute path (seq deploy resolves it for you)")
        if not path.is_file():
            raise ApiError("invalid_request", f"policy file not found: {req.file}",
                           hint="the gateway reads the file from its own filesystem; check the path")
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        return self._deploy(req.name, path, req.class_name, sha)

    def _deploy(self, name: str, path: Path, class_name: Optional[str], sha: Optional[str],
                version: Optional[int] = None, source: Optional[Path] = None) -> Deployment:
        """Start ``path`` as ``name``. While a version serves, the new one builds beside it and
        takes over only once ready (a failed build changes nothing); otherwise it starts in place.
        ``version`` forces the number (rollback); else the same file keeps it, a changed one bumps it."""
        now = time.time()
        with self._lock:
            old = self.store.get(name)
            known = [v["version"] for v in self.store.versions(name)]
            if version is None:
                if old is None:
                    version = 1
                else:
                    same = old["file_sha"] == sha and old["class_name"] == class_name
                    version = old["version"] if same else max([old["version"], *known]) + 1
            self._record_version(name, version, path, source or path, class_name, sha)
            if old is not None and old["status"] == "ready" and name in self.workers:
                prev = self.workers.get(name + BUILD_SUFFIX)
                if prev is not None and prev.version != version:
                    self.store.update_version(name, prev.version, status="superseded")
                self._stop_process(name + BUILD_SUFFIX)
                w = self._launch(name, name + BUILD_SUFFIX, str(path), class_name, version, source or path)
                w.file_sha = sha
                self.store.update(name, build_json=json.dumps({"version": version, "status": "building",
                                                               "phase": "spawning", "started_at": now}))
                if version == old["version"]:
                    log.info("%s: the same file again (v%d, no new version): a fresh worker of it starts "
                             "beside the serving one", name, version)
                else:
                    log.info("building %s v%d beside the serving v%d", name, version, old["version"])
                return self.describe(self.require(name))
            self._stop_process(name)
            epoch, load_s, created = (0, None, now) if old is None else (old["epoch"], old["load_s"], old["created_at"])
            self.store.insert({
                "name": name, "version": version, "file": str(path), "class_name": class_name,
                "file_sha": sha, "status": "starting", "phase": "spawning", "worker_port": None,
                "worker_pid": None, "secret": None, "epoch": epoch, "error": None, "error_details": None,
                "load_s": load_s, "started_at": None, "ready_at": None, "served": 0, "spec_json": None,
                "created_at": created, "updated_at": now, "build_json": None,
                "defaults_json": old.get("defaults_json") if old else None,
                "halted_at": old.get("halted_at") if old else None,   # a redeploy does not lift a stop
            })
            from .halted import spawn_unless_halted   # HOOK(stopped stays stopped): no worker while halted
            spawn_unless_halted(self, name)
        return self.describe(self.require(name))

    def _record_version(self, name: str, version: int, path: Path, source: Path, class_name: Optional[str],
                        sha: Optional[str]) -> None:
        """Snapshot the policy file as ``<data_dir>/versions/<name>/v<N>/`` and keep the newest
        KEEP_VERSIONS (never dropping the serving one)."""
        snap_dir = self.data_dir / "versions" / name / f"v{version}"
        snap = snap_dir / path.name
        if path.resolve() != snap.resolve():
            snap_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, snap)
        self.store.put_version({"name": name, "version": version, "file": str(snap), "source_file": str(source),
                                "class_name": class_name, "file_sha": sha, "status": "building", "error": None,
                                "load_s": None, "created_at": time.time()})
        serving = (self.store.get(name) or {}).get("version")
        for v in self.store.versions(name)[KEEP_VERSIONS:]:
            if v["version"] != serving:
                self.store.delete_version(name, v["version"])
                shutil.rmtree(self.data_dir / "versions" / name / f"v{v['version']}", ignore_errors=True)

    def versions(self, name: str) -> dict:
        """``{"name", "serving", "versions": [{"version", "status", "serving", "load_s", "created_at", "error", "file"}]}``."""
        row = self.require(name)
        out = []
        for v in self.store.versions(name):
            out.append({"version": v["version"], "status": v["status"], "serving": v["version"] == row["version"],
                        "load_s": v["load_s"], "created_at": v["created_at"], "error": v["error"],
                        "file": v["source_file"]})
        return {"name": name, "serving": row["version"], "versions": out}

    def rollback(self, name: str, to: Optional[int] = None) -> Deployment:
        """Build a kept version beside the serving one (default: the newest older one that was ready)."""
        row = self.require(name)
        kept = {v["version"]: v for v in self.store.versions(name)}
        if to is None:
            older = [n for n, v in kept.items() if n < row["version"] and v["status"] in ("ready", "retired")]
            if not older:
                raise ApiError("invalid_request", f"{name} has no older version that served to roll back to",
                               hint=f"`seq policy versions {name}` lists the kept versions")
            to = max(older)
        if to not in kept:
            raise ApiError("not_found", f"{name} has no kept version v{to}",
                           hint=f"`seq policy versions {name}` lists the {KEEP_VERSIONS} kept versions")
        v = kept[to]
        return self._deploy(name, Path(v["file"]), v["class_name"], v["file_sha"], version=to,
                            source=Path(v["source_file"]))

    def _launch(self, name: str, key: str, file: str, class_name: Optional[str], version: int,
                source: Path) -> WorkerProc:
        """Start a worker process for ``name`` under ``workers[key]``; no state row is touched.
        It runs ``file`` with cwd (and an import path entry) at the original file's directory."""
        run = self.data_dir / "run"
        key = f"{key}.{secrets.token_hex(3)}"   # run files are per launch: a build never touches the serving worker's
        ready = run / f"{key}.ready.json"
        for p in (ready, Path(str(ready) + ".phase"), Path(str(ready) + ".error")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        log_path = self.data_dir / "logs" / f"{name}.log"
        secret = secrets.token_urlsafe(32)
        here = Path(__file__).resolve().parent.parent                       # .../server
        seq_root = Path(__import__("seq").__file__).resolve().parent.parent  # dir holding seq/
        env = dict(os.environ)
        paths = [str(here), str(seq_root)] + ([str(source.parent)] if Path(file).parent != source.parent else [])
        env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONUNBUFFERED"] = "1"
        env["SEQ_WORKER_SECRET"] = secret
        secret_file, activity_file = run / f"{key}.secret", run / f"{key}.activity"
        _write_secret(secret_file, secret)
        with contextlib.suppress(FileNotFoundError):
            activity_file.unlink()
        env["SEQ_WORKER_SECRET_FILE"] = str(secret_file)      # rotation (leases.py)
        env["SEQ_WORKER_ACTIVITY_FILE"] = str(activity_file)  # idle tracking (leases.py)
        if self.url:
            env["SEQ_GATEWAY_URL"] = self.url                 # declared secrets are fetched from here
        env["SEQ_CAPTURE_DIR"] = str(self.data_dir / "capture" / name)  # issue 7: kept episodes (capture.py)
        env["SEQ_VOLUMES_DIR"] = str(self.data_dir / "volumes")   # weights="vol://NAME@vN" (volumes.py)
        env["SEQ_JSON_LOG"] = str(self.data_dir / "logs" / f"{name}.jsonl")   # structured log (logs.py)
        env["SEQ_DEPLOYMENT_VERSION"] = str(version)
        cmd = [sys.executable, "-m", "sequence_ai_server.worker", "--file", file, "--port", "0",
               "--ready-file", str(ready), "--name", name, "--weights-dir", str(self.data_dir / "weights" / name)]
        supervisor_file: Optional[Path] = None
        if self.launcher:       # a Ray actor hosts the worker: it stops with its actor (ray_backend sets the pid)
            cmd += ["--parent-pid", str(os.getpid())]
        else:                   # a local worker outlives a gateway crash; a restarted gateway adopts it
            supervisor_file = run / f"{key}.supervisor"
            self._write_supervisor(supervisor_file)
            cmd += ["--supervisor-file", str(supervisor_file)]
        if class_name:
            cmd += ["--class", class_name]
        handle = open(log_path, "ab", buffering=0)
        handle.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name} v{version} =====\n".encode())
        proc = (self.launcher.start if self.launcher else subprocess.Popen)(cmd, stdout=handle,  # backend hook
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(source.parent), start_new_session=True)
        self.cold_starts += 1
        w = WorkerProc(name, proc, ready, log_path, time.time(), log_handle=handle, secret=secret,
                       secret_file=secret_file, activity_file=activity_file, version=version, file=file,
                       class_name=class_name, supervisor_file=supervisor_file,
                       proc_start=None if self.launcher else process_start(proc.pid))
        self.workers[key.rsplit(".", 1)[0]] = w
        log.info("started worker for %s v%d (pid %d)", name, version, proc.pid)
        self._save_workers()
        return w

    def _spawn(self, name: str) -> None:
        row = self.store.get(name)
        kept = {v["version"]: v for v in self.store.versions(name)}
        source = Path(kept[row["version"]]["source_file"]) if row["version"] in kept else Path(row["file"])
        w = self._launch(name, name, row["file"], row["class_name"], row["version"], source)
        self.store.update(name, status="starting", phase="spawning", worker_pid=w.proc.pid, worker_port=None,
                          secret=w.secret, epoch=row["epoch"] + 1, error=None, error_details=None,
                          started_at=w.started_at, ready_at=None)

    def start(self, name: str) -> Deployment:
        """Lift an emergency stop (``seq policy stop``) and start the serving version's worker
        (no-op when one runs); returns the deployment."""
        with self._lock:
            if self.require(name).get("halted_at"):
                self.store.update(name, halted_at=None)
                log.info("%s: stop lifted; robots may connect again", name)
            if not (name in self.workers and self.workers[name].proc.poll() is None):
                self._spawn(name)
            return self.describe(self.require(name))

    def remove(self, name: str, force: bool = False) -> dict:
        """Delete a deployment, its versions and snapshots. Refused (invalid_request) while its
        worker runs or robots hold sessions, unless ``force`` (which stops it first)."""
        with self._lock:
            row = self.require(name)
            held = sum(1 for x in self.sessions.values() if x.model == name)
            running = name in self.workers or (name + BUILD_SUFFIX) in self.workers or bool(self._sides(name))
            if (held or running) and not force:
                raise ApiError("invalid_request",
                               f"{name} is {'serving ' + str(held) + ' session(s)' if held else row['status']}; not removed",
                               hint=f"stop it first (`seq policy stop {name}`) or pass --force")
            self._stop_process(name + BUILD_SUFFIX)
            self._stop_process(name)
            self._stop_sides(name)
            self.traffic.forget(name)
            self._drop_sessions(name)
            with self.store._lock:
                self.store._db.execute("DELETE FROM deployments WHERE name = ?", (name,))
                self.store._db.execute("DELETE FROM versions WHERE name = ?", (name,))
            shutil.rmtree(self.data_dir / "versions" / name, ignore_errors=True)
            shutil.rmtree(self.data_dir / "capture" / name, ignore_errors=True)   # issue 7: kept episodes go too
        log.info("removed %s", name)
        return {"name": name, "removed": True}

    def _stop_process(self, name: str) -> None:
        w = self.workers.pop(name, None)
        if w is None:
            return
        w.stopping = True
        _terminate(w.proc)
        if w.log_handle:
            w.log_handle.close()

    def status(self, name: str) -> Deployment:
        """The deployment, with ``sessions``: each connected robot's session, its version and the
        params it runs with (its own over the deployment defaults, as of its last lease renewal:
        the client switches to new ones at its next episode)."""
        with self._lock:
            w = self.workers.get(name)
            if w is not None:
                self._poll_one(name, w)
            d = self.describe(self.require(name))
            self._expire_sessions()
            d.sessions = [{"session_id": x.id, "key_id": x.key_id, "version": x.version, "params": dict(x.params),
                           "own_params": dict(x.requested), "connected_at": x.created_at,
                           "lease_expires_at": x.expires_at}
                          for x in sorted(self.sessions.values(), key=lambda x: x.created_at) if x.model == name]
            return d

    def stop(self, name: str) -> Deployment:
        """Emergency stop: every serving worker of ``name`` (side versions too) ends now, its
        sessions are dropped (a robot's next /act finds no worker and its reconnect is refused),
        and every connect is refused with ``deployment_stopped`` until ``start``."""
        with self._lock:
            self.require(name)
            self._stop_process(name)
            self._stop_sides(name)
            self._drop_sessions(name)
            self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None,
                              halted_at=time.time())
        log.warning("%s: emergency stop; connects are refused until `seq policy start %s`", name, name)
        return self.describe(self.require(name))

    def _refuse_if_halted(self, row: dict) -> None:
        """deployment_stopped (503, not retryable) while ``seq policy stop`` holds ``row``."""
        if row.get("halted_at"):
            name = row["name"]
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["halted_at"]))
            raise ApiError("deployment_stopped", f"deployment {name!r} was stopped (`seq policy stop`, {when}); "
                           "it refuses every connect until it is started again",
                           details={"reason": "stopped", "stopped_at": row["halted_at"]},
                           hint=f"`seq policy start {name}` lets robots connect again")

    def stop_all(self) -> None:
        with self._lock:
            workers = list(self.workers.values()) + self._retiring
            self.workers.clear()
            self._retiring = []
        for w in workers:
            w.stopping = True
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            if w.log_handle:
                w.log_handle.close()
            self.store.update(w.name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
        self._save_workers()

    # -- supervision (called every 100 ms)
    def poll(self) -> None:
        with self._lock:
            for key, w in list(self.workers.items()):
                if key.endswith(BUILD_SUFFIX):
                    self._poll_build(key, w)
                elif SIDE_MARK in key:
                    self._poll_side(key, w)
                else:
                    self._poll_one(key, w)
            self._reap_retiring()
            self._reap_side()
            self._expire_sessions()
            self._idle_and_min_workers()
            self._save_workers()

    def _poll_build(self, key: str, w: WorkerProc) -> None:
        """A version building beside the serving one: swap it in once ready; a failed build only
        records why (the serving version is untouched)."""
        name = w.name
        row = self.store.get(name)
        build = json.loads(row["build_json"]) if row and row.get("build_json") else {}
        ph = _read_json(Path(str(w.ready_file) + ".phase")) or {}
        if ph.get("spec"):
            w.spec = ph["spec"]
        code = w.proc.poll()
        now = time.time()
        if code is None and w.ready_file.exists():
            ready = _read_json(w.ready_file)
            if not (ready and ready.get("port")):
                return
            self.workers.pop(key, None)
            old = self.workers.pop(name, None)
            self.workers[name] = w
            load_s = round(now - w.started_at, 3)
            spec = ready.get("spec") or w.spec
            self.store.update(name, version=w.version, file=w.file, class_name=w.class_name, file_sha=w.file_sha,
                              status="ready", phase="ready", worker_port=int(ready["port"]), worker_pid=w.proc.pid,
                              worker_host=_ready_host(ready),
                              secret=w.secret, epoch=row["epoch"] + 1, error=None, error_details=None,
                              load_s=load_s, started_at=w.started_at, ready_at=now, served=1,
                              spec_json=json.dumps(spec) if spec else row["spec_json"],
                              build_json=json.dumps({**build, "status": "switching", "phase": "ready", "load_s": load_s}))
            if row["version"] != w.version:
                self.store.update_version(name, row["version"], status="retired")
            jam = self._health.get(name)
            if jam and jam.get("state") == "jammed":
                self._health[name] = {**jam, "state": "replaced", "replaced_at": now, "new_pid": w.proc.pid}
                log.warning("%s: the jammed worker (pid %s) is replaced by pid %d", name, jam.get("pid"), w.proc.pid)
            pol = load_policy(row.get("traffic_json"))
            if pol["split"]:   # a new serving version takes every new session (pins stay)
                pol["split"] = {}
                self.store.update(name, traffic_json=dump_policy(pol))
                self.traffic.forget(name)
                log.info("%s v%d took over: its traffic split is cleared", name, w.version)
            self.store.update_version(name, w.version, status="ready", load_s=load_s, error=None)
            # the new worker serves from here on; the old one's tokens stop working at once
            # (its clients reconnect to the new version) and it drains and exits in the background
            if old is not None:
                old.stopping = True
                if old.secret_file and old.secret_file != w.secret_file:
                    _write_secret(old.secret_file, secrets.token_urlsafe(32))
                with contextlib.suppress(ProcessLookupError):
                    old.proc.send_signal(signal.SIGTERM)
                old.retired_at = time.time()
                if jam and jam.get("state") == "jammed":
                    old.grace_s = JAMMED_GRACE_S     # its replica thread is stuck: do not wait long
                self._retiring.append(old)
            else:
                self.store.update(name, build_json=json.dumps({**build, "status": "ready", "load_s": load_s}))
            log.info("%s v%d took over after %.2fs", name, w.version, load_s)
            return
        failed_msg = None
        if code is not None and not w.stopping:
            err = _read_json(Path(str(w.ready_file) + ".error"))
            failed_msg = (f"worker failed while {err.get('phase')}: {err.get('detail')}" if err
                          else f"worker {_exit_reason(code)} while {ph.get('phase') or 'starting'}")
            details = {"phase": (err or {}).get("phase") or ph.get("phase"),
                       "exception_type": (err or {}).get("exception_type"),
                       "remote_traceback": (err or {}).get("traceback"), "log_tail": _log_tail(w.log_path),
                       "exit_code": code}
        elif code is None and now - w.started_at > w.startup_timeout_s:
            w.stopping = True
            _terminate(w.proc)
            failed_msg = f"worker did not load within the startup timeout ({w.startup_timeout_s:g} s)"
            details = {"log_tail": _log_tail(w.log_path)}
        if code is not None or failed_msg:
            self.workers.pop(key, None)
            if w.log_handle:
                w.log_handle.close()
        if failed_msg:
            self.store.update(name, build_json=json.dumps({**build, "status": "failed", "phase": "failed",
                                                           "error": failed_msg, "details": details}))
            self.store.update_version(name, w.version, status="failed", error=failed_msg)
            log.warning("%s v%d failed to build; v%s keeps serving: %s", name, w.version, row["version"], failed_msg)
        elif code is None and ph.get("phase") and build.get("phase") != ph["phase"]:
            self.store.update(name, build_json=json.dumps({**build, "phase": ph["phase"]}))

    def _reap_retiring(self) -> None:
        for old in list(self._retiring):
            if old.proc.poll() is None:
                if time.time() - getattr(old, "retired_at", 0.0) < getattr(old, "grace_s", STOP_GRACE_S):
                    continue
                old.proc.kill()
                old.proc.wait()
            self._retiring.remove(old)
            if old.log_handle:
                old.log_handle.close()
            row = self.store.get(old.name)
            build = json.loads(row["build_json"]) if row and row.get("build_json") else None
            if build and build.get("status") == "switching":
                self.store.update(old.name, build_json=json.dumps({**build, "status": "ready"}))

    def _poll_one(self, name: str, w: WorkerProc) -> None:
        row = self.store.get(name)
        if row is None:
            return
        phase_path = Path(str(w.ready_file) + ".phase")
        try:
            mtime = phase_path.stat().st_mtime
        except OSError:
            mtime = 0.0
        if mtime and mtime != w.phase_mtime:
            w.phase_mtime = mtime
            ph = _read_json(phase_path)
            if ph:
                fields: dict[str, Any] = {}
                if ph.get("phase") and row["status"] == "starting":
                    fields["phase"] = ph["phase"]
                if ph.get("spec"):
                    fields["spec_json"] = json.dumps(ph["spec"])
                    w.startup_timeout_s = float(ph["spec"].get("timeouts", {}).get("startup", 1800.0))
                if fields:
                    self.store.update(name, **fields)
        code = w.proc.poll()
        if row["status"] == "starting" and code is None and w.ready_file.exists():
            ready = _read_json(w.ready_file)
            if ready and ready.get("port"):
                now = time.time()
                self.store.update(name, status="ready", phase="ready", worker_port=int(ready["port"]),
                                  worker_host=_ready_host(ready), ready_at=now, load_s=round(now - w.started_at, 3), served=1,
                                  spec_json=json.dumps(ready["spec"]) if ready.get("spec") else row["spec_json"])
                log.info("%s is ready on port %s after %.2fs", name, ready["port"], now - w.started_at)
                self.store.update_version(name, row["version"], status="ready", load_s=round(now - w.started_at, 3))
            return
        if code is not None:
            self.workers.pop(name, None)
            if w.log_handle:
                w.log_handle.close()
            if w.stopping:
                return
            tail = _log_tail(w.log_path)
            err = _read_json(Path(str(w.ready_file) + ".error"))
            if row["status"] == "starting":
                if err:
                    msg = f"worker failed while {err.get('phase')}: {err.get('detail')}"
                    details = {"phase": err.get("phase"), "exception_type": err.get("exception_type"),
                               "remote_traceback": err.get("traceback"), "log_tail": tail, "exit_code": code}
                else:
                    msg = f"worker {_exit_reason(code)} while {row['phase'] or 'starting'}"
                    details = {"phase": row["phase"], "log_tail": tail, "exit_code": code}
                self.store.update(name, status="failed", phase="failed", error=msg, error_details=json.dumps(details),
                                  worker_port=None, worker_pid=None, served=0)
                log.warning("%s failed: %s", name, msg)
            else:
                msg = f"worker {_exit_reason(code)} while serving; the next connect starts a new one"
                self.store.update(name, status="failed", phase="exited", error=msg,
                                  error_details=json.dumps({"log_tail": tail, "exit_code": code}),
                                  worker_port=None, worker_pid=None)
                log.warning("%s: %s", name, msg)
            return
        if row["status"] == "starting" and time.time() - w.started_at > w.startup_timeout_s:
            self.workers.pop(name, None)
            w.stopping = True
            _terminate(w.proc)
            msg = f"worker did not load within the startup timeout ({w.startup_timeout_s:g} s)"
            self.store.update(name, status="failed", phase="failed", error=msg, served=0,
                              error_details=json.dumps({"log_tail": _log_tail(w.log_path)}),
                              worker_port=None, worker_pid=None)

    # -- connect, sessions and leases
    def ensure_ready(self, model: str) -> dict:
        """The deployment row once its worker serves; starts a stopped one. Raises ApiError
        not_found, worker_failed (last start failed), or warming (503 + Retry-After estimated from
        the last measured load, else 30 s)."""
        with self._lock:
            row = self.store.get(model)
            if row is None:
                self.require(model)
            self._refuse_if_halted(row)
            w = self.workers.get(model)
            if w is not None:
                self._poll_one(model, w)
            row = self.store.get(model)
            status = row["status"]
            if status == "failed" and not row["served"]:
                details = json.loads(row["error_details"]) if row["error_details"] else None
                raise ApiError("worker_failed", f"deployment {model!r} failed to start: {row['error']}",
                               details=details, hint=f"fix the policy, then `seq deploy {row['file']} --name {model}`; "
                                                     f"the log is {self.data_dir / 'logs' / (model + '.log')}")
            if status in ("stopped", "failed"):
                self._spawn(model)
                row = self.store.get(model)
                status = row["status"]
            self._activity[model] = time.time()
            jam = self._health.get(model)
            if status == "ready" and jam and jam.get("state") == "jammed":
                self._refuse_jammed(model, row, jam)
            if status == "starting":
                estimate = row["load_s"] or DEFAULT_LOAD_ESTIMATE_S
                elapsed = time.time() - (row["started_at"] or time.time())
                remaining = max(1.0, estimate - elapsed)
                raise ApiError("warming", f"deployment {model!r} is starting ({row['phase']}); about {remaining:.0f} s left",
                               retry_after_s=round(remaining, 1),
                               details={"phase": row["phase"], "elapsed_s": round(elapsed, 1), "estimate_s": estimate},
                               hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")
            return row

    def _refuse_jammed(self, model: str, row: dict, jam: dict) -> None:
        """A connect while a jammed worker is being replaced: 503 warming until the fresh worker
        takes over, worker_failed when the replacement itself failed to load."""
        build = json.loads(row["build_json"]) if row.get("build_json") else {}
        if build.get("status") == "failed":
            raise ApiError("worker_failed", f"the worker of {model!r} is jammed (an inference ran {jam['oldest_request_s']:.0f} s) "
                           f"and its replacement failed: {build.get('error')}", details=build.get("details"),
                           hint=f"`seq policy status {model}`; the log is {self.data_dir / 'logs' / (model + '.log')}")
        estimate = row["load_s"] or DEFAULT_LOAD_ESTIMATE_S
        remaining = max(1.0, estimate - (time.time() - jam["since"]))
        raise ApiError("warming", f"the worker of {model!r} is jammed (an inference has run "
                       f"{jam['oldest_request_s']:.0f} s); a fresh one is starting, about {remaining:.0f} s left",
                       retry_after_s=round(remaining, 1), details={"phase": "replacing", "estimate_s": estimate},
                       hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")

    # -- health: a worker whose inference hangs still answers /ping, with status degraded
    def health_targets(self) -> list[tuple[str, str]]:
        """``(deployment, worker_url)`` of every serving worker not already being replaced."""
        out = []
        with self._lock:
            for name in list(self.workers):
                if name.endswith(BUILD_SUFFIX) or SIDE_MARK in name or (name + BUILD_SUFFIX) in self.workers:
                    continue
                row = self.store.get(name)
                if row and row["status"] == "ready" and row["worker_port"]:
                    out.append((name, _worker_url(row)))
        return out

    def replace_jammed(self, name: str, ping: dict, port: Optional[int] = None) -> bool:
        """``name``'s worker answered /ping ``degraded`` (an inference ran past timeouts.request):
        start a fresh worker of the same version beside it. Until it is ready new connects get 503
        warming; once it is, it takes over like a new version (new sessions go there, the jammed
        worker's secret is rotated so its robots reconnect, and it is stopped). Returns False when
        nothing was done (not serving, or a build already runs beside it)."""
        with self._lock:
            row = self.store.get(name)
            if row is None or row["status"] != "ready" or name not in self.workers or (name + BUILD_SUFFIX) in self.workers:
                return False
            if port is not None and row["worker_port"] != port:
                return False                 # the ping came from a worker that has been replaced since
            now = time.time()
            self._health[name] = {"state": "jammed", "since": now, "pid": row["worker_pid"], "version": row["version"],
                                  "oldest_request_s": float(ping.get("oldest_request_s") or 0.0),
                                  "request_timeout_s": ping.get("request_timeout_s")}
            kept = {v["version"]: v for v in self.store.versions(name)}
            source = Path(kept[row["version"]]["source_file"]) if row["version"] in kept else Path(row["file"])
            w = self._launch(name, name + BUILD_SUFFIX, row["file"], row["class_name"], row["version"], source)
            w.file_sha = row["file_sha"]
            self.store.update(name, build_json=json.dumps({"version": row["version"], "status": "building",
                                                           "phase": "spawning", "started_at": now,
                                                           "reason": "replacing a jammed worker"}))
        log.warning("%s: worker pid %s is jammed (an inference has run %.1f s, timeouts.request %s s); "
                    "starting a fresh one", name, row["worker_pid"], self._health[name]["oldest_request_s"],
                    ping.get("request_timeout_s"))
        return True

    def _lease(self, row: dict, sess: SessionRec) -> ConnectResponse:
        spec = json.loads(row["spec_json"]) if row["spec_json"] else {"contract": {"action": None, "observation": None}}
        token = sign_lease(row["secret"], sess.id, sess.epoch, sess.expires_at)
        return ConnectResponse(
            session_id=sess.id, worker_url=_worker_url(row), direct_secret=token,
            lease=Lease(ttl_s=self.lease_ttl_s, expires_at=sess.expires_at, epoch=sess.epoch),
            contract=spec["contract"], params=sess.params, version=sess.version,
        )

    def connect(self, req: ConnectRequest, key: Optional[KeyRecord] = None) -> ConnectResponse:
        """Admit a session: pick its version (a pin, the traffic split, else the serving one), ensure
        that version's worker, cast params, sign a lease token (the direct secret)."""
        if key is not None:
            self.require_scope(key, req.model)
        current = self.require(req.model)
        self._refuse_if_halted(current)
        version, split = self._route(current, key)      # a traffic split or a pin may pick another version
        if version != current["version"]:
            side = self._connect_on_version(req, key, version, split)
            if side is not None:
                return side
        self._check_gpu_limit(req.model)
        row = self.ensure_ready(req.model)
        spec = json.loads(row["spec_json"]) if row["spec_json"] else {"contract": {"action": None, "observation": None}, "params": []}
        params = self._session_params(row, req.params)
        now = time.time()
        sess = SessionRec(id="sess_" + secrets.token_hex(8), model=req.model, key_id=key.id if key else "",
                          epoch=row["epoch"], version=row["version"], params=params,
                          created_at=now, expires_at=now + self.lease_ttl_s, requested=dict(req.params or {}))
        with self._lock:
            self._expire_sessions()
            held = sum(1 for x in self.sessions.values() if x.model == req.model and not x.side)
            mean_s = sum(self._session_s) / len(self._session_s) if self._session_s else self.lease_ttl_s
            # Slots are counted only for a policy that declares @seq.concurrent: the client opens a
            # new session on every reconnect (rotation, lease expiry) without naming its old one,
            # which would otherwise queue a lone robot behind its own stale session.
            if spec.get("concurrency"):
                self.queue.admit(req.model, key.id if key else "", req.ticket, capacity=slots_of(spec), held=held,
                                 on_full=spec.get("on_full") or "queue",
                                 queue_timeout_s=float(spec.get("queue_timeout_s") or 120.0), mean_session_s=mean_s)
            self.sessions[sess.id] = sess
            if split is not None:
                self.traffic.admitted(req.model, split, sess.version)
        log.info("admitted %s on v%d", sess.id, sess.version, extra={"deployment": req.model, "version": sess.version})
        return self._lease(row, sess)

    # -- traffic: a canary split and key pins between versions (traffic.py)
    def _usable_versions(self, name: str, row: dict) -> dict[int, dict]:
        """The versions a split or pin may name: the serving one and kept ones that served."""
        kept = {v["version"]: v for v in self.store.versions(name)}
        return {n: v for n, v in kept.items() if n == row["version"] or v["status"] in ("ready", "retired")}

    def _route(self, row: dict, key: Optional[KeyRecord]) -> tuple[int, Optional[dict[int, float]]]:
        """The version a new session of ``row`` starts on, and the split it was drawn from (None
        for a pin or no split). A pin or split naming a version no longer kept is ignored."""
        pol = load_policy(row.get("traffic_json"))
        if not pol["split"] and not pol["pins"]:
            return row["version"], None
        usable = self._usable_versions(row["name"], row)
        if key is not None and pol["pins"].get(key.id) in usable:
            return pol["pins"][key.id], None
        split = {v: w for v, w in pol["split"].items() if v in usable}
        if split and sum(split.values()) > 0:
            return self.traffic.pick(row["name"], split), split
        return row["version"], None

    def _sides(self, name: str) -> list[str]:
        prefix = name + SIDE_MARK
        return [k for k in self.workers if k.startswith(prefix)]

    def _stop_sides(self, name: str) -> None:
        for k in self._sides(name):
            self._stop_process(k)
            self._side_failed.pop(k, None)
        for k in [k for k in self._side_failed if k.startswith(name + SIDE_MARK)]:
            self._side_failed.pop(k, None)

    @staticmethod
    def _side_row(row: dict, w: WorkerProc) -> dict:
        """``row`` as seen by a session on side worker ``w`` (its port, secret, epoch and spec)."""
        return {**row, "status": "ready", "worker_port": w.port, "worker_host": w.host, "secret": w.secret, "epoch": w.epoch,
                "version": w.version, "spec_json": json.dumps(w.spec) if w.spec else row.get("spec_json")}

    def _start_side(self, name: str, version: int) -> WorkerProc:
        """Launch kept version ``version`` of ``name`` as a side worker (``workers[name@vN]``)."""
        v = {x["version"]: x for x in self.store.versions(name)}[version]
        sk = f"{name}{SIDE_MARK}{version}"
        self._side_failed.pop(sk, None)
        w = self._launch(name, sk, v["file"], v["class_name"], version, Path(v["source_file"]))
        w.epoch = secrets.randbelow(2 ** 31)
        log.info("started %s v%d beside the serving version for its traffic split/pins", name, version)
        return w

    def _connect_on_version(self, req: ConnectRequest, key: Optional[KeyRecord], version: int,
                            split: Optional[dict[int, float]]) -> Optional[ConnectResponse]:
        """Admit a session on a version other than the serving one (its side worker); None when
        ``version`` turned out to be the serving one. Raises ApiError warming while that version's
        worker loads (it is started here if needed) and worker_failed once when it failed to load."""
        name = req.model
        sk = f"{name}{SIDE_MARK}{version}"
        with self._lock:
            row = self.require(name)
            if version == row["version"]:
                return None
            w = self.workers.get(sk)
            if w is not None:
                self._poll_side(sk, w)
                w = self.workers.get(sk)
            if w is None:
                failed = self._side_failed.pop(sk, None)
                if failed is not None:
                    raise ApiError("worker_failed", f"v{version} of {name!r} failed to start: {failed['error']}",
                                   details=failed.get("details"),
                                   hint=f"`seq policy traffic {name} --clear` sends new sessions to the serving version; "
                                        f"the log is {self.data_dir / 'logs' / (name + '.log')}")
                self._check_gpu_limit(name, sk)
                w = self._start_side(name, version)
            self._activity[sk] = time.time()
            if not w.port:
                kept = {x["version"]: x for x in self.store.versions(name)}.get(version) or {}
                estimate = kept.get("load_s") or row["load_s"] or DEFAULT_LOAD_ESTIMATE_S
                elapsed = time.time() - w.started_at
                remaining = max(1.0, estimate - elapsed)
                raise ApiError("warming", f"v{version} of {name!r} is starting for its traffic share; about {remaining:.0f} s left",
                               retry_after_s=round(remaining, 1),
                               details={"phase": "loading", "version": version, "elapsed_s": round(elapsed, 1),
                                        "estimate_s": estimate},
                               hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")
            srow = self._side_row(row, w)
            params = self._session_params(srow, req.params)
            now = time.time()
            sess = SessionRec(id="sess_" + secrets.token_hex(8), model=name, key_id=key.id if key else "",
                              epoch=w.epoch, version=version, params=params, created_at=now,
                              expires_at=now + self.lease_ttl_s, requested=dict(req.params or {}), side=sk)
            self._expire_sessions()
            self.sessions[sess.id] = sess
            if split is not None:
                self.traffic.admitted(name, split, version)
        log.info("admitted %s on v%d (side worker)", sess.id, version, extra={"deployment": name, "version": version})
        return self._lease(srow, sess)

    def _poll_side(self, key: str, w: WorkerProc) -> None:
        """A side worker: note its port once ready; record why it failed if it exits while loading."""
        code = w.proc.poll()
        if code is None:
            if w.port is None and w.ready_file.exists():
                ready = _read_json(w.ready_file)
                if ready and ready.get("port"):
                    w.port = int(ready["port"])
                    w.host = _ready_host(ready)
                    w.spec = ready.get("spec") or w.spec
                    log.info("%s v%d (side) is ready on port %d after %.2fs", w.name, w.version, w.port,
                             time.time() - w.started_at)
            elif w.port is None and time.time() - w.started_at > w.startup_timeout_s:
                self.workers.pop(key, None)
                w.stopping = True
                _terminate(w.proc)
                self._side_failed[key] = {"error": f"worker did not load within the startup timeout "
                                                   f"({w.startup_timeout_s:g} s)", "details": {"log_tail": _log_tail(w.log_path)}}
            return
        self.workers.pop(key, None)
        if w.log_handle:
            w.log_handle.close()
        if w.stopping:
            return
        err = _read_json(Path(str(w.ready_file) + ".error"))
        where = "while serving" if w.port else f"while {(err or {}).get('phase') or 'starting'}"
        msg = f"worker failed {where}: {err.get('detail')}" if err else f"worker {_exit_reason(code)} {where}"
        self._side_failed[key] = {"error": msg, "details": {"exit_code": code, "log_tail": _log_tail(w.log_path),
                                                            "remote_traceback": (err or {}).get("traceback")}}
        log.warning("%s v%d (side): %s", w.name, w.version, msg)

    def _reap_side(self) -> None:
        """Stop a side worker no session holds once no split or pin names its version (or it has
        become the serving one), or after the policy's idle_timeout without a session."""
        now = time.time()
        for key, w in list(self.workers.items()):
            if SIDE_MARK not in key or any(s.side == key for s in self.sessions.values()):
                continue
            row = self.store.get(w.name)
            if row is not None:
                pol = load_policy(row.get("traffic_json"))
                wanted = w.version != row["version"] and (pol["split"].get(w.version, 0) > 0
                                                          or w.version in pol["pins"].values())
                idle_timeout = float(self._spec_value(row, "idle_timeout", DEFAULT_IDLE_TIMEOUT_S))
                last = max(w.started_at, self._activity.get(key, 0.0))
                with contextlib.suppress(OSError, AttributeError):
                    last = max(last, w.activity_file.stat().st_mtime)
                if wanted and now - last <= idle_timeout:
                    continue
            log.info("stopping the side worker %s v%d (no split or pin needs it)", w.name, w.version)
            self._stop_process(key)

    def traffic_view(self, name: str) -> dict:
        """``{"name", "serving", "split": [{"version", "share_pct", "sessions", "worker"}], "pins": [{"key",
        "key_name", "version", "worker"}], "side_workers": [{"version", "pid", "worker", "sessions"}]}``;
        ``split`` is empty when every new session goes to the serving version; ``side_workers`` are the
        running workers of versions other than the serving one.
        ``sessions`` counts sessions admitted per version since the split was set; ``worker`` is
        serving | ready | loading | failed | not running."""
        with self._lock:
            row = self.require(name)
            pol = load_policy(row.get("traffic_json"))
            total = sum(pol["split"].values()) or 1.0
            counts = self.traffic.counts(name, pol["split"]) if pol["split"] else {}

            def worker(v: int) -> str:
                if v == row["version"]:
                    return "serving"
                sk = f"{name}{SIDE_MARK}{v}"
                w = self.workers.get(sk)
                if w is not None:
                    return "ready" if w.port else "loading"
                return "failed" if sk in self._side_failed else "not running"

            split = [{"version": v, "share_pct": round(share / total * 100, 3), "sessions": counts.get(v, 0),
                      "worker": worker(v)} for v, share in sorted(pol["split"].items(), reverse=True)]
            names = {r.id: r.name for r in self.keys.list()}
            pins = [{"key": k, "key_name": names.get(k), "version": v, "worker": worker(v)}
                    for k, v in sorted(pol["pins"].items())]
            sides = [{"version": self.workers[k].version, "pid": self.workers[k].proc.pid, "worker": worker(self.workers[k].version),
                      "sessions": sum(1 for x in self.sessions.values() if x.side == k)} for k in sorted(self._sides(name))]
        return {"name": name, "serving": row["version"], "split": split, "pins": pins, "side_workers": sides}

    def set_traffic(self, name: str, upd: TrafficUpdate) -> dict:
        """Apply one of: a split, a pin, an unpin, or clear (split and pins). Versions must be the
        serving one or kept ones that served; a pinned key must be bound to ``name``. Workers for
        the named versions start at once while the deployment runs. Raises ApiError
        invalid_request (bad split, several actions, unbound key), not_found (version, key) or
        gpu_limit_reached (those workers would pass $SEQ_MAX_GPUS; nothing is changed)."""
        chosen = [upd.split is not None, upd.pin is not None, upd.unpin is not None, upd.clear]
        if sum(chosen) != 1:
            raise ApiError("invalid_request", "give exactly one of a split, --pin KEY vN, --unpin KEY or --clear",
                           hint=f"e.g. seq policy traffic {name} v5=10 v4=90")
        with self._lock:
            row = self.require(name)
            pol = load_policy(row.get("traffic_json"))
            usable = self._usable_versions(name, row)
            hint_versions = f"`seq policy versions {name}` lists them; serving or kept: " + \
                ", ".join(f"v{v}" for v in sorted(usable, reverse=True))
            try:
                if upd.clear:
                    pol = {"split": {}, "pins": {}}
                elif upd.split is not None:
                    split = parse_split(upd.split)
                    bad = [v for v in split if v not in usable]
                    if bad:
                        raise ApiError("not_found", f"{name} has no serving or kept version {', '.join(f'v{v}' for v in bad)}",
                                       hint=hint_versions)
                    pol["split"] = split
                elif upd.pin is not None:
                    rec = self.keys.find(upd.pin)
                    if rec is None or rec.revoked_at is not None:
                        raise ApiError("not_found", f"no live API key {upd.pin!r}", hint="`seq keys ls` lists keys")
                    if rec.deployment != name:
                        raise ApiError("invalid_request", f"key {upd.pin!r} is not bound to {name}; only a robot key "
                                       "of this deployment can be pinned",
                                       hint=f"seq keys create --name arm-7 --deployment {name}")
                    if upd.version is None:
                        raise ApiError("invalid_request", "a pin needs a version", hint=f"seq policy traffic {name} --pin {upd.pin} v2")
                    v = parse_version(upd.version)
                    if v not in usable:
                        raise ApiError("not_found", f"{name} has no serving or kept version v{v}", hint=hint_versions)
                    pol["pins"][rec.id] = v
                else:
                    rec = self.keys.find(upd.unpin or "")
                    if rec is None or rec.id not in pol["pins"]:
                        raise ApiError("not_found", f"key {upd.unpin!r} is not pinned on {name}",
                                       hint=f"`seq policy traffic {name}` lists the pins")
                    pol["pins"].pop(rec.id)
            except TrafficError as exc:
                raise ApiError("invalid_request", str(exc), hint=f"e.g. seq policy traffic {name} v5=10 v4=90") from None
            # the named versions' workers start now, so the first sessions sent there find them loading
            # or ready; each is one more card, so SEQ_MAX_GPUS is checked before anything is stored
            start: list[int] = []
            if row["status"] in ("ready", "starting"):
                wanted = {v for v, share in pol["split"].items() if share > 0} | set(pol["pins"].values())
                start = [v for v in sorted(wanted - {row["version"]}) if f"{name}{SIDE_MARK}{v}" not in self.workers]
            if start and self.max_gpus is not None:
                running = sum(1 for k in self.workers if not k.endswith(BUILD_SUFFIX))
                if running + len(start) > self.max_gpus:
                    raise ApiError("gpu_limit_reached",
                                   f"{', '.join(f'v{v}' for v in start)} of {name} would need {len(start)} more worker(s); "
                                   f"{running} run and this machine allows {self.max_gpus} (SEQ_MAX_GPUS); traffic unchanged",
                                   details={"max_gpus": self.max_gpus},
                                   hint="stop a deployment (`seq policy stop NAME`) or raise SEQ_MAX_GPUS")
            self.store.update(name, traffic_json=dump_policy(pol))
            self.traffic.forget(name)
            for v in start:
                self._start_side(name, v)
        log.info("traffic of %s is now split=%s pins=%s", name, pol["split"], pol["pins"])
        return self.traffic_view(name)

    def _check_gpu_limit(self, model: str, worker_key: Optional[str] = None) -> None:
        """gpu_limit_reached when ``model`` (or its side worker ``worker_key``) has no worker and
        $SEQ_MAX_GPUS workers already run (each local worker counts as one card)."""
        if self.max_gpus is None:
            return
        with self._lock:
            if (worker_key or model) in self.workers:
                return
            running = sum(1 for k in self.workers if not k.endswith(BUILD_SUFFIX))
            if running >= self.max_gpus:
                raise ApiError("gpu_limit_reached", f"{running} workers run and this machine allows {self.max_gpus} "
                               f"(SEQ_MAX_GPUS); {model!r} cannot start", details={"max_gpus": self.max_gpus},
                               hint="stop a deployment (`seq policy stop NAME`) or raise SEQ_MAX_GPUS")

    def _session_params(self, row: dict, requested: Optional[dict]) -> dict:
        """A session's params: the robot's own over the deployment defaults (those the serving
        version still declares), cast to the declared types. Raises ApiError invalid_request."""
        spec = json.loads(row["spec_json"]) if row.get("spec_json") else {}
        declared = [InferParam.from_dict(p) for p in spec.get("params", [])]
        names = {p.name for p in declared}
        defaults = json.loads(row["defaults_json"]) if row.get("defaults_json") else {}
        merged = {**{k: v for k, v in defaults.items() if k in names}, **(requested or {})}
        try:
            return cast_params(declared, merged)
        except ParamError as exc:
            raise ApiError("invalid_request", str(exc), details={"param": exc.name, "declared": spec.get("params", [])},
                           hint="`seq policy params NAME` lists the params this policy declares") from None

    def params(self, name: str) -> dict:
        """``{"name", "defaults": {k: v}, "declared": [param dicts]}``."""
        row = self.require(name)
        spec = json.loads(row["spec_json"]) if row.get("spec_json") else {}
        return {"name": name, "defaults": json.loads(row["defaults_json"]) if row.get("defaults_json") else {},
                "declared": spec.get("params", [])}

    def doctor(self, name: str) -> dict:
        """Diagnose ``name`` without starting anything: state, serving version, the running worker's
        /ping (status, ms) and one synthetic /act (declared-shape black frames and zero vectors) split
        into ``handler_ms`` (the worker's inference_ms) and ``network_ms`` (the rest of the round
        trip: transport, decoding, queuing). ``worker`` is null when no worker runs."""
        from types import SimpleNamespace
        from seq._contracts import ObservationContract
        from .errors import new_request_id as _rid
        from ._hosting import synthetic_observation
        row = self.require(name)
        out: dict[str, Any] = {"name": name, "status": row["status"], "phase": row["phase"], "version": row["version"],
                               "error": row["error"], "sessions": sum(1 for x in self.sessions.values() if x.model == name),
                               "worker": None}
        if row["status"] != "ready" or not row["worker_port"]:
            return out
        url = _worker_url(row)
        worker: dict[str, Any] = {"url": url, "pid": row["worker_pid"]}
        with httpx.Client(timeout=30.0) as http:
            t0 = time.perf_counter()
            try:
                r = http.get(f"{url}/ping")
                worker["ping"] = {"status": r.status_code, "ms": round((time.perf_counter() - t0) * 1000, 3)}
                with contextlib.suppress(ValueError, AttributeError):
                    body = r.json()
                    worker["ping"].update(state=body.get("status"), oldest_request_s=body.get("oldest_request_s"))
            except httpx.HTTPError as exc:
                worker["ping"] = {"status": None, "error": type(exc).__name__}
            out["health"] = self._health.get(name)
            if worker["ping"].get("state") == "degraded":   # a jammed worker: a synthetic /act would only queue
                out["worker"] = worker
                return out
            spec = json.loads(row["spec_json"]) if row.get("spec_json") else {}
            obs_contract = (spec.get("contract") or {}).get("observation")
            if obs_contract and spec.get("infer_mode", "observation") == "observation":
                obs = synthetic_observation(SimpleNamespace(observation=ObservationContract.from_dict(obs_contract)))
                rid = _rid()
                t0 = time.perf_counter()
                try:
                    r = http.post(f"{url}/act", json={"observation": obs, "params": {}},
                                  headers={"Authorization": f"Bearer {row['secret']}", "X-Request-ID": rid})
                    total = (time.perf_counter() - t0) * 1000
                    body = r.json() if r.status_code == 200 else {}
                    handler = float(body.get("inference_ms") or 0.0)
                    worker["act"] = {"status": r.status_code, "request_id": rid, "total_ms": round(total, 3),
                                     "handler_ms": round(handler, 3), "network_ms": round(max(0.0, total - handler), 3),
                                     "error": None}
                    if r.status_code != 200:   # the worker's typed error, whole: code, detail, hint
                        try:
                            err = r.json()
                        except ValueError:
                            err = {}
                        if not isinstance(err, dict):
                            err = {}
                        worker["act"].update(code=err.get("code"), detail=err.get("detail") or r.text[:2000],
                                             hint=err.get("hint"), error=err.get("detail") or r.text[:2000])
                except httpx.HTTPError as exc:
                    worker["act"] = {"status": None, "error": type(exc).__name__}
        out["worker"] = worker
        return out

    def set_params(self, name: str, update: ParamsUpdate) -> dict:
        """Change deployment default params without a redeploy: new sessions get them at once,
        connected robots at their next lease renewal. Values are cast to the declared types;
        an undeclared name or a bad value is invalid_request."""
        with self._lock:
            row = self.require(name)
            if not row.get("spec_json"):
                raise ApiError("invalid_request", f"{name} has not loaded yet, so its params are unknown",
                               hint=f"wait until `seq policy status {name}` says ready")
            spec = json.loads(row["spec_json"])
            declared = [InferParam.from_dict(p) for p in spec.get("params", [])]
            try:
                cast = cast_params(declared, update.set)
            except ParamError as exc:
                raise ApiError("invalid_request", str(exc), details={"param": exc.name},
                               hint=f"`seq policy params {name}` lists the declared params") from None
            defaults = json.loads(row["defaults_json"]) if row.get("defaults_json") else {}
            unknown = [k for k in update.clear if k not in defaults and k not in cast]
            if unknown:
                raise ApiError("invalid_request", f"no default set for {', '.join(unknown)}",
                               hint=f"set ones: {', '.join(sorted(defaults)) or 'none'}")
            for k in update.clear:
                defaults.pop(k, None)
            defaults.update(cast)
            self.store.update(name, defaults_json=json.dumps(defaults))
        log.info("default params of %s are now %s", name, defaults)
        return self.params(name)

    def _session(self, session_id: str, key: Optional[KeyRecord]) -> SessionRec:
        """The open session ``session_id`` as ``key`` may see it: an account key any session, a
        robot key only the sessions it opened itself (another robot's is not_found, as unknown)."""
        sess = self.sessions.get(session_id)
        if sess is None or (key is not None and key.deployment is not None and key.id != sess.key_id):
            raise ApiError("not_found", f"no open session {session_id!r}",
                           hint="it was closed or its lease ran out; connect again (POST /v1/connect)")
        return sess

    def renew(self, session_id: str, key: Optional[KeyRecord] = None) -> ConnectResponse:
        """Extend a live lease by ttl_s (same session, same version). A lease that ran out, or one
        from a worker that has since restarted, is 401 lease_expired: the client connects again."""
        with self._lock:
            sess = self.sessions.get(session_id)
            if sess is not None:
                self._session(session_id, key)
            now = time.time()
            row = self.store.get(sess.model) if sess else None
            if row is not None and sess is not None and sess.side:    # a split/pinned version: its own worker
                w = self.workers.get(sess.side)
                row = self._side_row(row, w) if w is not None and w.port and w.proc.poll() is None else None
            if sess is None or now > sess.expires_at or row is None or row["status"] != "ready" or row["epoch"] != sess.epoch:
                if sess is not None:
                    self.sessions.pop(session_id, None)
                raise ApiError("lease_expired", f"the lease of session {session_id!r} is no longer valid",
                               hint="connect again (POST /v1/connect) for a new session and lease")
            sess.expires_at = now + self.lease_ttl_s
            self._activity[sess.model] = now
            if sess.side:
                self._activity[sess.side] = now
            with contextlib.suppress(ApiError):   # defaults changed since: the robot gets them now
                sess.params = self._session_params(row, sess.requested)
            self.sessions[session_id] = sess      # stores the new expiry (SessionTable)
            return self._lease(row, sess)

    def close_session(self, session_id: str, key: Optional[KeyRecord] = None) -> dict:
        """End a session at once (frees its slot). Closing an unknown or already-closed one is a no-op.
        A queued robot's ticket (``q_…``) closes its place in line the same way."""
        with self._lock:
            sess = self.sessions.get(session_id)
            if sess is None:
                left = self.queue.leave(session_id, key.id if key else "")
                return {"session_id": session_id, "closed": left}
            self._session(session_id, key)
            self.sessions.pop(session_id, None)
            self._activity[sess.model] = time.time()
            self._session_s = (self._session_s + [time.time() - sess.created_at])[-50:]
        self._revoke_sessions([sess])
        return {"session_id": session_id, "closed": True}

    # -- revocation: an ended session's lease tokens stop working at its worker at once (leases.py)
    def end_key_sessions(self, key_id: str) -> int:
        """End every session admitted with key ``key_id`` (the key was revoked); -> how many."""
        with self._lock:
            ended = [s for s in self.sessions.values() if s.key_id == key_id]
            for s in ended:
                self.sessions.pop(s.id, None)
        self._revoke_sessions(ended)
        return len(ended)

    def _revoke_sessions(self, ended: list) -> None:
        """Record ``ended`` sessions as revoked and push that to the workers holding them before
        returning (at most ~1 s); a worker the push misses learns it from its 1 s poll."""
        if not ended:
            return
        entries = {s.id: s.expires_at for s in ended}
        self.revoked.add(entries)
        targets = []
        with self._lock:
            for s in ended:
                row = self.store.get(s.model)
                w = self.workers.get(s.side) if s.side else None
                if w is not None and w.port:
                    targets.append((f"http://{w.host or '127.0.0.1'}:{w.port}", w.secret))
                elif not s.side and row is not None and row.get("worker_port"):
                    targets.append((_worker_url(row), row["secret"]))
        push_revocations(targets, entries)

    def is_worker_secret(self, token: str) -> bool:
        """Whether ``token`` is the current or launch secret of a worker this gateway runs."""
        with self._lock:
            known = [w.secret for w in list(self.workers.values()) + self._retiring if w.secret]
            known += [r["secret"] for r in self.store.all() if r.get("secret")]
        return bool(token) and any(hmac.compare_digest(token.encode(), k.encode()) for k in known)

    def rotate_secret(self, name: str) -> dict:
        """Give the running worker a new secret: every lease token signed with the old one answers
        401 at the worker and its client reconnects. Sessions stay open."""
        with self._lock:
            self.require(name)
            secret = secrets.token_urlsafe(32)
            self.store.update(name, secret=secret)
            w = self.workers.get(name)
            _write_secret(w.secret_file if w and w.secret_file else self.data_dir / "run" / f"{name}.secret", secret)
        log.info("rotated the direct secret of %s", name)
        return {"name": name, "rotated_at": time.time()}

    def _drop_sessions(self, name: str) -> None:
        for sid in [s.id for s in self.sessions.values() if s.model == name]:
            self.sessions.pop(sid, None)

    def _expire_sessions(self) -> None:
        now = time.time()
        for sid in [s.id for s in self.sessions.values() if s.expires_at < now]:
            self.sessions.pop(sid, None)

    def _spec_value(self, row: dict, key: str, default: Any) -> Any:
        try:
            spec = json.loads(row["spec_json"]) if row.get("spec_json") else {}
        except ValueError:
            spec = {}
        value = spec.get(key)
        return default if value is None else value

    def _idle_and_min_workers(self) -> None:
        """Stop a ready worker after idle_timeout with no request (direct /act included, via its
        activity file, plus connect/renew here); keep min_workers running (restart a stopped-idle
        or crashed one)."""
        now = time.time()
        for row in self.store.all():
            name = row["name"]
            min_workers = int(self._spec_value(row, "min_workers", 0) or 0)
            if row["status"] == "ready" and name in self.workers and min_workers < 1:
                idle_timeout = float(self._spec_value(row, "idle_timeout", DEFAULT_IDLE_TIMEOUT_S))
                last = max(row["ready_at"] or 0.0, self._activity.get(name, 0.0))
                with contextlib.suppress(OSError):
                    last = max(last, self.workers[name].activity_file.stat().st_mtime)
                if now - last > idle_timeout:
                    log.info("%s idle for %.0f s (idle_timeout %g s): stopping its worker", name, now - last, idle_timeout)
                    self._stop_process(name)
                    self._drop_sessions(name)
                    self.store.update(name, status="stopped", phase="idle", worker_port=None, worker_pid=None)
            elif min_workers >= 1 and name not in self.workers and not row.get("halted_at") and (
                    row["phase"] in ("idle", "exited") or (row["status"] == "stopped" and row["phase"] != "stopped")):
                log.info("%s declares min_workers=%d: starting its worker", name, min_workers)
                self._spawn(name)

    def logs(self, name: str, request_id: Optional[str] = None, lines: int = 200,
             since: Optional[float] = None) -> dict:
        """``{"name", "lines": [JSON log records]}``: the gateway's and ``name``'s workers' JSON log
        lines merged by time (logs.read_logs). not_found when neither the deployment nor its log exists."""
        if self.store.get(name) is None and not (self.data_dir / "logs" / f"{name}.jsonl").exists():
            self.require(name)
        if not 1 <= lines <= 10000:
            raise ApiError("invalid_request", f"lines must be between 1 and 10000, got {lines}", hint="e.g. --lines 200")
        return {"name": name, "lines": read_logs(self.data_dir / "logs", name, request_id=request_id, lines=lines,
                                                 since=since)}

    def volume_users(self, volume: str) -> list[str]:
        """Deployments whose declared weights name ``vol://<volume>`` (any version)."""
        users = []
        for row in self.store.all():
            spec = json.loads(row["spec_json"]) if row.get("spec_json") else {}
            weights = spec.get("weights")
            refs = list(weights.values()) if isinstance(weights, dict) else [weights]
            if any(isinstance(r, str) and re.match(rf"^vol://{re.escape(volume)}(@v\d+)?/?$", r) for r in refs):
                users.append(row["name"])
        return users

    def account(self, key: KeyRecord) -> dict:
        """Usage and configured limits of this local account. ``balance`` is None: a self-hosted
        gateway meters nothing in money (the hosted service's prepaid balance has no counterpart).
        ``usage.benchmarks`` counts the benchmarks ``seq eval run`` can name here (the built-in
        ones), ``usage.evals_running`` the evals in this data dir still running; a key bound to
        one deployment sees that deployment only."""
        from .eval.runner import BUILTIN_BENCHMARKS
        from .eval.store import EvalStore
        rows = self.store.all()
        if key.deployment:
            rows = [r for r in rows if r["name"] == key.deployment]
        names = {r["name"] for r in rows}
        try:
            running = sum(1 for e in EvalStore(self.data_dir).all()
                          if e.get("status") not in ("done", "canceled", "failed")
                          and {a.get("policy") for a in e.get("arms", [])} & names)
        except (OSError, ValueError):
            running = None      # unreadable eval records: unknown, never a guess
        return {
            "key": key.to_dict(),
            "balance": None,
            "self_hosted": True,
            "usage": {"policies": len(rows),
                      "running_workers": sum(1 for r in rows if r["status"] in ("starting", "ready")),
                      "sessions": sum(1 for s in self.sessions.values() if s.model in names),
                      "benchmarks": len(BUILTIN_BENCHMARKS), "evals_running": running},
            "limits": {"lease_ttl_s": self.lease_ttl_s, "max_gpus": self.max_gpus,
                       "max_body_bytes": int(os.environ.get("SEQ_GATEWAY_MAX_BODY_BYTES") or MAX_BODY_BYTES),
                       "self_hosted": True},
        }

    def close(self) -> None:
        self.stop_all()
        self.store.close()
        logging.getLogger("sequence_ai_server").removeHandler(self._json_log)
        self._json_log.close()
        if self.launcher:                # backend hook: disconnect from Ray
            self.launcher.close()


class BodyLimit:
    """ASGI middleware: refuse a request body over ``max_bytes`` with 413 payload_too_large in
    the common error shape. A declared Content-Length is checked before anything is read; a
    chunked body is counted as it streams and cut off at the limit (the handler sees the client
    leave; whatever it answers is replaced by the same 413). Default: MAX_BODY_BYTES (32 MiB, the worker's cap); $SEQ_GATEWAY_MAX_BODY_BYTES
    overrides."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = int(max_bytes)

    def _error(self, size: Optional[int]) -> ApiError:
        what = f"the body is {size} bytes" if size is not None else "the body is over the limit"
        return ApiError("payload_too_large", f"{what}; this gateway takes at most {self.max_bytes} bytes",
                        hint="send camera frames as JPEG (see docs) or fewer/smaller views",
                        details={"max_bytes": self.max_bytes}, request_id=new_request_id())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            resp = self._error(int(length)).response()
            resp.headers["Connection"] = "close"
            await resp(scope, receive, send)
            return
        seen, over, started = 0, False, False

        async def counted() -> dict:
            # Past the limit the app is told the client left (it stops reading) and its answer is
            # replaced by the 413 below: raising here would reach the app as a body-parse error
            # (400) or an exception group (500) instead.
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not started:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: dict) -> None:
            nonlocal started
            if over:
                return              # the app's answer to a cut-off body is dropped
            started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not over:
                raise
        if over:
            resp = self._error(None).response()
            resp.headers["Connection"] = "close"
            await resp(scope, receive, send)


def _bearer_or_api_key(authorization: Optional[str], x_api_key: Optional[str]) -> Optional[str]:
    """The API key a request carries: ``Authorization: Bearer <key>``, else ``X-API-Key``."""
    scheme, _, token = (authorization or "").partition(" ")
    return token if scheme.lower() == "bearer" and token else x_api_key


def _check_worker_bearer(gw: "Gateway", authorization: Optional[str]) -> None:
    """The bearer must be the direct secret of a worker this gateway runs; else 401 unauthorized."""
    token = (authorization or "").partition(" ")[2].strip()
    if not token or not gw.is_worker_secret(token):
        raise ApiError("unauthorized", "only a worker of this gateway may call this route")


def route_scopes(routes: Any, markers: dict, prefix: str = "") -> list[tuple[str, str, str]]:
    """``[(method, path, scope)]`` for every route under ``routes`` (FastAPI's included routers
    followed, HEAD left out). A route's scope is read off its dependencies: the first of
    ``markers`` (``{dependency callable: scope}``, in priority order) found among them, else
    ``"none"``."""
    out = []
    for route in routes:
        inner = getattr(route, "original_router", None)       # newer FastAPI keeps included routers as nodes
        if inner is not None:
            context = getattr(route, "include_context", None)
            out += route_scopes(inner.routes, markers, prefix + (getattr(context, "prefix", "") or ""))
            continue
        calls: set = set()
        stack = [getattr(route, "dependant", None)]
        while stack:
            d = stack.pop()
            for sub in getattr(d, "dependencies", None) or ():
                calls.add(sub.call)
                stack.append(sub)
        scope = next((v for k, v in markers.items() if k in calls), "none")
        out += [(m, prefix + route.path, scope) for m in sorted(getattr(route, "methods", None) or ()) if m != "HEAD"]
    return out


class CredentialsFirst:
    """ASGI middleware: the caller's credentials are checked from the headers before any route
    reads its body. Each route's scope comes from its own dependencies (:func:`route_scopes`):
    ``account`` (an account key; a robot key is 401 ``key_bound``), ``key`` (any live key; the
    route narrows a robot key to its deployment itself), ``worker`` (a worker's direct secret),
    ``none``. A missing, unknown or revoked key is 401 here; the route's dependency checks again."""

    def __init__(self, app: Any, gateway: "Gateway", fastapi_app: Any, markers: dict):
        self.app, self.gw, self._fastapi, self._markers = app, gateway, fastapi_app, markers
        self._table: Optional[list] = None

    def _scope_of(self, method: str, path: str) -> Optional[str]:
        if self._table is None:
            from starlette.routing import compile_path
            self._table = [(m, compile_path(p)[0], sc) for m, p, sc in route_scopes(self._fastapi.routes, self._markers)]
        method = "GET" if method == "HEAD" else method
        return next((sc for m, rx, sc in self._table if m == method and rx.match(path)), None)

    def _check(self, scope_name: str, headers: dict) -> None:
        auth = headers.get(b"authorization", b"").decode("latin-1") or None
        if scope_name == "worker":
            _check_worker_bearer(self.gw, auth)
            return
        rec = self.gw.authenticate(_bearer_or_api_key(auth, headers.get(b"x-api-key", b"").decode("latin-1") or None))
        if scope_name == "account":
            self.gw.require_scope(rec)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            needed = self._scope_of(scope["method"], scope["path"])
            if needed not in (None, "none"):
                try:
                    await asyncio.to_thread(self._check, needed, dict(scope.get("headers") or []))
                except ApiError as exc:
                    exc.request_id = exc.request_id or new_request_id()
                    await exc.response()(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _ready_host(ready: dict) -> Optional[str]:
    """The host in a worker's ready file (``host``, else the one in ``url``): 127.0.0.1 for a local
    worker, the node's IP for a Ray worker on another machine. None when it names none."""
    if ready.get("host"):
        return str(ready["host"])
    return urlsplit(str(ready.get("url") or "")).hostname


def _worker_url(row: dict) -> str:
    """Where robots reach a ready deployment's worker: ``http://HOST:PORT`` (HOST defaults to loopback)."""
    return f"http://{row.get('worker_host') or '127.0.0.1'}:{row['worker_port']}"


def _terminate(proc: subprocess.Popen) -> None:
    stop_process(proc, grace_s=STOP_GRACE_S)


# ---------------------------------------------------------------- the app

def create_app(data_dir: Optional[Path] = None) -> FastAPI:
    gw = Gateway(data_dir or default_data_dir())

    def get_gateway() -> Gateway:
        return gw

    def require_key(request: Request, authorization: Optional[str] = Header(default=None),
                    x_api_key: Optional[str] = Header(default=None)) -> KeyRecord:
        rec = gw.authenticate(_bearer_or_api_key(authorization, x_api_key))
        request.state.key = rec
        return rec

    def account_key(rec: KeyRecord = Depends(require_key)) -> KeyRecord:
        gw.require_scope(rec)
        return rec

    models = APIRouter(prefix="/v1/models", tags=["models"])

    @models.get("", response_model=ModelList)
    async def list_models(kind: Optional[str] = None, endpoint: Optional[str] = None) -> ModelList:
        """Deployments (kind=model), then the `seq init` templates (kind=template); ?kind= and
        ?endpoint=act filter."""
        if kind is not None and kind not in catalogue.KINDS:
            raise ApiError("invalid_request", f"unknown kind {kind!r}", hint=f"kind is one of {', '.join(catalogue.KINDS)}")
        if endpoint is not None and endpoint not in catalogue.ENDPOINTS:
            raise ApiError("invalid_request", f"no endpoint {endpoint!r} on a self-hosted gateway",
                           hint=f"endpoint is one of {', '.join(catalogue.ENDPOINTS)} (chat and decide are hosted-only)")
        rows = []
        for row in gw.store.all():
            d = gw.describe(row)
            rows.append(catalogue.model_row(d.name, d.version, d.status, d.contract, d.params))
        if kind != "model":
            rows += await asyncio.to_thread(catalogue.template_rows)
        return ModelList(models=[ModelEntry(**r) for r in catalogue.filter_rows(rows, kind, endpoint)])

    deployments = APIRouter(prefix="/v1/deployments", tags=["deployments"], dependencies=[Depends(require_key)])

    @deployments.get("", response_model=DeploymentList)
    async def list_deployments(key: KeyRecord = Depends(require_key)) -> DeploymentList:
        rows = [r for r in gw.store.all() if key.deployment in (None, r["name"])]
        return DeploymentList(deployments=[gw.describe(r) for r in rows])

    @deployments.post("", response_model=Deployment)
    async def create_deployment(body: DeployRequest, key: KeyRecord = Depends(account_key)) -> Deployment:
        return await asyncio.to_thread(gw.deploy, body)

    @deployments.get("/{name}", response_model=Deployment)
    async def get_deployment(name: str, key: KeyRecord = Depends(require_key)) -> Deployment:
        gw.require_scope(key, name)
        return await asyncio.to_thread(gw.status, name)

    @deployments.delete("/{name}", response_model=Deployment)
    async def stop_deployment(name: str, key: KeyRecord = Depends(account_key)) -> Deployment:
        return await asyncio.to_thread(gw.stop, name)

    @deployments.get("/{name}/versions")
    async def list_versions(name: str, key: KeyRecord = Depends(require_key)) -> dict:
        gw.require_scope(key, name)
        return await asyncio.to_thread(gw.versions, name)

    @deployments.post("/{name}/rollback", response_model=Deployment)
    async def rollback(name: str, body: RollbackRequest, key: KeyRecord = Depends(account_key)) -> Deployment:
        return await asyncio.to_thread(gw.rollback, name, body.to)

    @deployments.post("/{name}/start", response_model=Deployment)
    async def start_deployment(name: str, key: KeyRecord = Depends(account_key)) -> Deployment:
        return await asyncio.to_thread(gw.start, name)

    @deployments.post("/{name}/remove")
    async def remove_deployment(name: str, force: bool = False, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(gw.remove, name, force)

    @deployments.post("/{name}/rotate-secret")
    async def rotate_secret(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(gw.rotate_secret, name)

    @deployments.get("/{name}/doctor")
    async def doctor(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(gw.doctor, name)

    @deployments.get("/{name}/logs")
    async def get_logs(name: str, request_id: Optional[str] = None, lines: int = 200, since: Optional[float] = None,
                       key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(gw.logs, name, request_id, lines, since)

    @deployments.get("/{name}/traffic")
    async def get_traffic(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(gw.traffic_view, name)

    @deployments.post("/{name}/traffic")
    async def set_traffic(name: str, body: TrafficUpdate, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(gw.set_traffic, name, body)

    @deployments.get("/{name}/params")
    async def get_params(name: str, key: KeyRecord = Depends(require_key)) -> dict:
        gw.require_scope(key, name)
        return await asyncio.to_thread(gw.params, name)

    @deployments.post("/{name}/params")
    async def set_params(name: str, body: ParamsUpdate, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(gw.set_params, name, body)

    connect = APIRouter(prefix="/v1/connect", tags=["connect"], dependencies=[Depends(require_key)])

    @connect.post("", response_model=ConnectResponse)
    async def connect_(request: Request, body: ConnectRequest, key: KeyRecord = Depends(require_key)) -> ConnectResponse:
        request.state.deployment = body.model     # the request's log line names it (logs.py)
        return await asyncio.to_thread(gw.connect, body, key)

    sessions = APIRouter(prefix="/v1/sessions", tags=["sessions"])

    @sessions.post("/{session_id}/renew", response_model=ConnectResponse)
    async def renew(session_id: str, key: KeyRecord = Depends(require_key)) -> ConnectResponse:
        return await asyncio.to_thread(gw.renew, session_id, key)

    @sessions.delete("/{session_id}")
    async def close_session(session_id: str, key: KeyRecord = Depends(require_key)) -> dict:
        return await asyncio.to_thread(gw.close_session, session_id, key)

    keys = APIRouter(prefix="/v1/keys", tags=["keys"])

    @keys.post("")
    async def create_key(body: KeyCreate, key: KeyRecord = Depends(account_key)) -> dict:
        if body.deployment is not None:
            gw.require(body.deployment)
        if body.name and gw.keys.find(body.name) is not None:
            raise ApiError("invalid_request", f"a key named {body.name!r} exists already",
                           hint="pick another --name, or revoke the old key first")
        try:
            rec, plaintext = gw.keys.create(body.name, body.deployment)
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc), hint="e.g. --name arm-7") from None
        return {**rec.to_dict(), "key": plaintext}

    @keys.get("")
    async def list_keys(key: KeyRecord = Depends(account_key)) -> dict:
        return {"keys": [r.to_dict() for r in gw.keys.list()]}

    @keys.delete("/{ref}")
    async def revoke_key(ref: str, key: KeyRecord = Depends(account_key)) -> dict:
        rec = gw.keys.find(ref)
        if rec is None:
            raise ApiError("not_found", f"no API key {ref!r}", hint="`seq keys ls` lists key ids and names")
        revoked = gw.keys.revoke(rec.id).to_dict()
        await asyncio.to_thread(gw.end_key_sessions, rec.id)   # its robots' leases stop working now
        return revoked

    secrets_router = APIRouter(prefix="/v1/secrets", tags=["secrets"])
    app_internal = APIRouter(tags=["internal"])

    @secrets_router.put("/{name}")
    async def set_secret(name: str, body: SecretSet, key: KeyRecord = Depends(account_key)) -> dict:
        try:
            return gw.secrets.set(name, body.env)
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc), hint="seq secret set NAME --env VAR [--env VAR ...]") from None

    @secrets_router.get("")
    async def list_secrets(key: KeyRecord = Depends(account_key)) -> dict:
        return {"secrets": gw.secrets.list()}

    @secrets_router.delete("/{name}")
    async def remove_secret(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        if not gw.secrets.remove(name):
            raise ApiError("not_found", f"no secret named {name!r}", hint="`seq secret ls` lists them")
        return {"name": name, "removed": True}

    def worker_secret(authorization: Optional[str] = Header(default=None)) -> None:
        """Dependency: the bearer is the direct secret of a worker this gateway runs."""
        _check_worker_bearer(gw, authorization)

    @app_internal.post("/v1/internal/worker-secrets", include_in_schema=False, dependencies=[Depends(worker_secret)])
    async def worker_secrets(body: WorkerSecretsRequest) -> dict:
        """A worker's declared secrets; the bearer must be the secret of a worker this gateway runs."""
        try:
            return {"env": gw.secrets.environment(body.names)}
        except KeyError as exc:
            raise ApiError("not_found", f"the policy declares secret {exc.args[0]!r}, which is not set",
                           hint=f"seq secret set {exc.args[0]} --env VAR") from None

    @app_internal.get("/v1/internal/revocations", include_in_schema=False, dependencies=[Depends(worker_secret)])
    async def revocations() -> dict:
        """Sessions ended early, polled by workers (leases.RevocationPoller); worker secret only."""
        return {"sessions": gw.revoked.snapshot()}

    volumes_router = APIRouter(prefix="/v1/volumes", tags=["volumes"])

    def _volume_call(fn, *args):
        try:
            return fn(*args)
        except VolumeError as exc:
            raise ApiError(exc.code, str(exc), hint=exc.hint or "seq volume put NAME DIR") from None

    @volumes_router.get("")
    async def list_volumes(limit: int = 50, cursor: Optional[str] = None, key: KeyRecord = Depends(account_key)) -> dict:
        if not 1 <= limit <= 500:
            raise ApiError("invalid_request", f"limit must be 1..500, got {limit}", hint="--limit 50")
        return await asyncio.to_thread(_volume_call, gw.volumes.list, limit, cursor)

    @volumes_router.post("/{name}/uploads")
    async def begin_upload(name: str, body: VolumeUpload, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(_volume_call, gw.volumes.begin, name, body.files)

    @volumes_router.put("/{name}/uploads/{version}")
    async def write_upload(name: str, version: int, path: str, offset: int, request: Request,
                           key: KeyRecord = Depends(account_key)) -> dict:
        data = await request.body()
        return await asyncio.to_thread(_volume_call, gw.volumes.write, name, version, path, offset, data)

    @volumes_router.post("/{name}/uploads/{version}/complete")
    async def complete_upload(name: str, version: int, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(_volume_call, gw.volumes.complete, name, version)

    @volumes_router.delete("/{name}")
    async def remove_volume(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(_volume_call, gw.volumes.remove, name)

    account_router = APIRouter(prefix="/v1/account", tags=["account"])

    @account_router.get("")
    async def account(key: KeyRecord = Depends(require_key)) -> dict:
        return gw.account(key)

    act = APIRouter(prefix="/v1/act", tags=["act"])

    @act.post("")
    async def act_via_gateway(request: Request, key: KeyRecord = Depends(require_key)) -> Any:
        """The worker's /act through the gateway (for curl): body = the worker body plus "model"."""
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
            raise ApiError("invalid_request", "the body is not JSON",
                           hint='send {"model": NAME, "observation": {...}, "params": {}}') from None
        model = body.pop("model", None) if isinstance(body, dict) else None
        if not isinstance(model, str):
            raise ApiError("invalid_request", 'the body needs "model": the deployment name',
                           hint='send {"model": NAME, "observation": {...}, "params": {}}')
        gw.require_scope(key, model)
        request.state.deployment = model
        row = await asyncio.to_thread(gw.ensure_ready, model)
        rid = request.state.request_id
        try:
            resp = await proxy.post(f"{_worker_url(row)}/act", json=body,
                                    headers={"Authorization": f"Bearer {row['secret']}", "X-Request-ID": rid})
        except httpx.HTTPError as exc:
            raise ApiError("worker_failed", f"the worker of {model!r} did not answer: {type(exc).__name__}",
                           hint="retry; `seq policy status NAME` shows the worker") from None
        from fastapi.responses import Response as RawResponse
        return RawResponse(resp.content, status_code=resp.status_code, media_type="application/json",
                           headers={"X-Request-ID": resp.headers.get("x-request-id", rid)})

    proxy = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async def supervise() -> None:
            while True:
                try:
                    await asyncio.to_thread(gw.poll)
                except Exception:
                    log.exception("supervisor poll failed")
                await asyncio.sleep(0.1)
        async def health() -> None:
            """Ping every serving worker each health_interval_s; a degraded one is replaced."""
            async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as http:
                while True:
                    await asyncio.sleep(gw.health_interval_s)
                    try:
                        for name, url in await asyncio.to_thread(gw.health_targets):
                            try:
                                r = await http.get(f"{url}/ping")
                                body = r.json() if r.status_code == 200 else {}
                            except (httpx.HTTPError, ValueError):
                                continue          # a dead worker is the supervisor's business
                            if body.get("status") == "degraded":
                                await asyncio.to_thread(gw.replace_jammed, name, body, int(url.rsplit(":", 1)[1]))
                    except Exception:
                        log.exception("health check failed")
        task = asyncio.create_task(supervise())
        health_task = asyncio.create_task(health())
        try:
            yield
        finally:
            task.cancel()
            health_task.cancel()
            for t in (task, health_task):
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            log.info("stopping all workers")
            await proxy.aclose()
            await asyncio.to_thread(gw.close)

    app = FastAPI(title="sequence-ai gateway", lifespan=lifespan)
    app.state.gateway = gw

    metrics = GatewayMetrics(gw)   # issue 5: Prometheus /metrics (metrics.py)

    @app.middleware("http")
    async def request_id(request: Request, call_next):
        request.state.request_id = new_request_id()
        REQUEST_ID.set(request.state.request_id)              # every log line of this request carries it
        m = _DEPLOYMENT_PATH.match(request.url.path)
        DEPLOYMENT.set(m.group(1) if m else None)
        started = time.perf_counter()
        response = await call_next(request)
        response.headers.setdefault("X-Request-ID", request.state.request_id)
        route = getattr(request.scope.get("route"), "path", None) or "unmatched"
        metrics.observe(route, response.status_code, started)
        if route not in _QUIET_ROUTES:
            log.log(logging.WARNING if response.status_code >= 500 else logging.INFO, "%s %s -> %d in %.1f ms",
                    request.method, request.url.path, response.status_code, (time.perf_counter() - started) * 1000,
                    extra={"deployment": getattr(request.state, "deployment", None) or (m.group(1) if m else None)})
        return response

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Any:
        from fastapi.responses import Response as RawResponse
        body = await asyncio.to_thread(metrics.render)
        return RawResponse(body, media_type=CONTENT_TYPE_LATEST)

    install_error_handlers(app)
    from .json_guard import JsonStringGuard   # HOOK(bad strings): NUL/lone surrogate in JSON -> 400, inside BodyLimit
    app.add_middleware(JsonStringGuard, max_bytes=int(os.environ.get("SEQ_GATEWAY_MAX_BODY_BYTES") or MAX_BODY_BYTES))
    app.add_middleware(BodyLimit, max_bytes=int(os.environ.get("SEQ_GATEWAY_MAX_BODY_BYTES") or MAX_BODY_BYTES))
    # outermost: credentials before any body is read (scopes read off each route's dependencies)
    app.add_middleware(CredentialsFirst, gateway=gw, fastapi_app=app,
                       markers={account_key: "account", worker_secret: "worker", require_key: "key"})
    app.include_router(models)
    app.include_router(deployments)
    app.include_router(connect)
    app.include_router(sessions)
    app.include_router(keys)
    app.include_router(account_router)
    app.include_router(volumes_router)
    app.include_router(secrets_router)
    app.include_router(app_internal)
    app.include_router(act)
    from .capture import create_router as _capture_router   # issue 7: capture, labels, export
    app.include_router(_capture_router(gw, require_key, account_key))
    from .adapters import create_router as _adapter_router   # registered @seq.adapter files
    app.include_router(_adapter_router(gw, require_key, account_key))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict:
        return {"status": "ok"}

    return app


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, data_dir: Optional[Path] = None,
          ready_file: Optional[str] = None, on_ready: Any = None) -> None:
    """Run the gateway in the foreground until SIGINT/SIGTERM; stops every worker on the way out.
    Port 0 binds an ephemeral port; ``ready_file`` then receives ``{"url", "port", "pid"}``."""
    import uvicorn

    data_dir = Path(data_dir or default_data_dir()).expanduser()
    from .datadir_lock import hold_data_dir   # HOOK(one gateway per data dir): lock held until exit
    dir_lock = hold_data_dir(data_dir)         # raises DataDirInUse naming the holder
    app = create_app(data_dir)
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol is
    # IPPROTO_TCP; with 0 every response waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            url = f"http://{host}:{bound}"
            dir_lock.note(port=bound)   # HOOK(one gateway per data dir): the refusal names this port
            app.state.gateway.url = url
            info = {"url": url, "port": bound, "pid": os.getpid(),
                    "api_key_file": str(app.state.gateway.api_key_file), "data_dir": str(app.state.gateway.data_dir)}
            if ready_file:
                tmp = f"{ready_file}.tmp"
                Path(tmp).write_text(json.dumps(info))
                os.replace(tmp, ready_file)
            if on_ready:
                on_ready(info)
        await task

    # uvicorn re-raises the signal it handled once it has shut down; by then we are done.
    signal.signal(signal.SIGTERM, lambda s, f: None)
    signal.signal(signal.SIGINT, lambda s, f: None)
    asyncio.run(run())


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sequence_ai_server.gateway", description="sequence-ai gateway")
    parser.add_argument("--host", default=DEFAULT_HOST)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gateway %(levelname)s %(message)s")
    serve(args.host, args.port, Path(args.data_dir) if args.data_dir else None, args.ready_file,
          on_ready=lambda info: log.info("serving on %s (API key in %s)", info["url"], info["api_key_file"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
