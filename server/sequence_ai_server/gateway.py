"""The gateway: deployments, API keys and connect. It is not on the /act path.

Where it sits: a client calls ``POST /v1/connect`` once, gets the worker's URL and direct
secret, and from then on talks to the worker directly. The gateway

  - keeps its state in SQLite under the data dir (``state.db``: deployments, keys),
  - creates an API key on first start (hash stored, plaintext written to ``<data_dir>/api_key``, 0600),
  - spawns one worker process per deployment (log in ``<data_dir>/logs/<name>.log``) and
    supervises it: a worker that exits while loading marks the deployment failed with the
    policy's own error; one that dies after serving is marked failed and restarted by the next connect,
  - answers connect with 503 warming + Retry-After while a worker loads (estimated from the
    last measured load, else 30 s), and starts a stopped deployment's worker,
  - terminates every worker when it shuts down.

Endpoints (see docs/design.md for the bodies):
    GET    /v1/models                  no key
    GET    /v1/deployments             key
    POST   /v1/deployments             key
    GET    /v1/deployments/{name}      key
    DELETE /v1/deployments/{name}      key   (stops the worker)
    POST   /v1/connect                 key

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
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from pydantic import BaseModel

from seq._params import InferParam, ParamError, cast_params

from .errors import ApiError, install_error_handlers, new_request_id

__all__ = ["Gateway", "create_app", "serve", "main", "default_data_dir", "DEFAULT_HOST", "DEFAULT_PORT"]

log = logging.getLogger("sequence_ai_server.gateway")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
DEFAULT_LOAD_ESTIMATE_S = 30.0
LEASE_TTL_S = 300.0
STOP_GRACE_S = 10.0
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


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


class DeploymentList(BaseModel):
    deployments: list[Deployment]


class ModelEntry(BaseModel):
    name: str
    version: int
    status: str
    contract: Optional[dict[str, Any]]
    params: list[dict[str, Any]]


class ModelList(BaseModel):
    models: list[ModelEntry]


class ConnectRequest(BaseModel):
    model: str
    params: dict[str, Any] = {}


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

    def key_hashes(self) -> list[str]:
        with self._lock:
            return [r["hash"] for r in self._db.execute("SELECT hash FROM keys")]

    def add_key(self, key: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO keys (hash, prefix, created_at) VALUES (?, ?, ?)",
                             (_hash_key(key), key[:14], time.time()))

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
        self.workers: dict[str, WorkerProc] = {}
        self._lock = threading.RLock()
        self.api_key_file = self.data_dir / "api_key"
        self._ensure_key()
        self._key_hashes = self.store.key_hashes()
        # workers of a previous gateway process are gone (they watch their parent): nothing serves now
        for row in self.store.all():
            if row["status"] in ("starting", "ready"):
                self.store.update(row["name"], status="stopped", phase="stopped", worker_port=None, worker_pid=None)

    # -- keys
    def _ensure_key(self) -> None:
        if self.store.key_hashes():
            return
        key = "seq_local_" + secrets.token_urlsafe(24)
        self.store.add_key(key)
        fd = os.open(str(self.api_key_file), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key + "\n")
        os.chmod(self.api_key_file, 0o600)
        log.info("created an API key; it is in %s", self.api_key_file)

    def check_key(self, key: Optional[str]) -> bool:
        if not key:
            return False
        digest = _hash_key(key.strip())
        ok = False
        for h in self._key_hashes:
            ok |= hmac.compare_digest(digest, h)
        return ok

    # -- views
    def describe(self, row: dict) -> Deployment:
        spec = json.loads(row["spec_json"]) if row.get("spec_json") else None
        details = json.loads(row["error_details"]) if row.get("error_details") else None
        return Deployment(
            name=row["name"], version=row["version"], status=row["status"], phase=row["phase"],
            worker_url=f"http://127.0.0.1:{row['worker_port']}" if row["status"] == "ready" and row["worker_port"] else None,
            error=row["error"], load_s=row["load_s"], file=row["file"], class_name=row["class_name"],
            pid=row["worker_pid"], started_at=row["started_at"], ready_at=row["ready_at"],
            contract=spec["contract"] if spec else None, params=spec["params"] if spec else [],
            spec=spec, details=details,
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
        now = time.time()
        with self._lock:
            old = self.store.get(req.name)
            self._stop_process(req.name)
            if old is None:
                version, epoch, load_s, created = 1, 0, None, now
            else:
                same = old["file_sha"] == sha and old["file"] == str(path) and old["class_name"] == req.class_name
                version = old["version"] if same else old["version"] + 1
                epoch, load_s, created = old["epoch"], old["load_s"], old["created_at"]
            self.store.insert({
                "name": req.name, "version": version, "file": str(path), "class_name": req.class_name,
                "file_sha": sha, "status": "starting", "phase": "spawning", "worker_port": None,
                "worker_pid": None, "secret": None, "epoch": epoch, "error": None, "error_details": None,
                "load_s": load_s, "started_at": None, "ready_at": None, "served": 0, "spec_json": None,
                "created_at": created, "updated_at": now,
            })
            self._spawn(req.name)
        return self.describe(self.require(req.name))

    def _spawn(self, name: str) -> None:
        row = self.store.get(name)
        run = self.data_dir / "run"
        ready = run / f"{name}.ready.json"
        for p in (ready, Path(str(ready) + ".phase"), Path(str(ready) + ".error")):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        log_path = self.data_dir / "logs" / f"{name}.log"
        secret = secrets.token_urlsafe(32)
        here = Path(__file__).resolve().parent.parent                       # .../server
        seq_root = Path(__import__("seq").__file__).resolve().parent.parent  # dir holding seq/
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(here), str(seq_root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["PYTHONUNBUFFERED"] = "1"
        env["SEQ_WORKER_SECRET"] = secret
        cmd = [sys.executable, "-m", "sequence_ai_server.worker", "--file", row["file"], "--port", "0",
               "--ready-file", str(ready), "--name", name, "--weights-dir", str(self.data_dir / "weights" / name),
               "--parent-pid", str(os.getpid())]
        if row["class_name"]:
            cmd += ["--class", row["class_name"]]
        handle = open(log_path, "ab", buffering=0)
        handle.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name} v{row['version']} =====\n".encode())
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=str(Path(row["file"]).parent), start_new_session=True)
        now = time.time()
        self.workers[name] = WorkerProc(name, proc, ready, log_path, now, log_handle=handle)
        self.store.update(name, status="starting", phase="spawning", worker_pid=proc.pid, worker_port=None,
                          secret=secret, epoch=row["epoch"] + 1, error=None, error_details=None,
                          started_at=now, ready_at=None)
        log.info("started worker for %s (pid %d)", name, proc.pid)

    def start(self, name: str) -> None:
        with self._lock:
            row = self.require(name)
            if name in self.workers and self.workers[name].proc.poll() is None:
                return
            self._spawn(name)

    def _stop_process(self, name: str) -> None:
        w = self.workers.pop(name, None)
        if w is None:
            return
        w.stopping = True
        _terminate(w.proc)
        if w.log_handle:
            w.log_handle.close()

    def status(self, name: str) -> Deployment:
        with self._lock:
            w = self.workers.get(name)
            if w is not None:
                self._poll_one(name, w)
            return self.describe(self.require(name))

    def stop(self, name: str) -> Deployment:
        with self._lock:
            self.require(name)
            self._stop_process(name)
            self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
        return self.describe(self.require(name))

    def stop_all(self) -> None:
        with self._lock:
            workers = list(self.workers.values())
            self.workers.clear()
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

    # -- supervision (called every 100 ms)
    def poll(self) -> None:
        with self._lock:
            for name, w in list(self.workers.items()):
                self._poll_one(name, w)

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
                                  ready_at=now, load_s=round(now - w.started_at, 3), served=1,
                                  spec_json=json.dumps(ready["spec"]) if ready.get("spec") else row["spec_json"])
                log.info("%s is ready on port %s after %.2fs", name, ready["port"], now - w.started_at)
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

    # -- connect
    def connect(self, req: ConnectRequest) -> ConnectResponse:
        with self._lock:
            row = self.store.get(req.model)
            if row is None:
                self.require(req.model)
            w = self.workers.get(req.model)
            if w is not None:
                self._poll_one(req.model, w)
            row = self.store.get(req.model)
            status = row["status"]
            if status == "failed" and not row["served"]:
                details = json.loads(row["error_details"]) if row["error_details"] else None
                raise ApiError("worker_failed", f"deployment {req.model!r} failed to start: {row['error']}",
                               details=details, hint=f"fix the policy, then `seq deploy {row['file']} --name {req.model}`; "
                                                     f"the log is {self.data_dir / 'logs' / (req.model + '.log')}")
            if status in ("stopped", "failed"):
                self._spawn(req.model)
                row = self.store.get(req.model)
                status = row["status"]
            if status == "starting":
                estimate = row["load_s"] or DEFAULT_LOAD_ESTIMATE_S
                elapsed = time.time() - (row["started_at"] or time.time())
                remaining = max(1.0, estimate - elapsed)
                raise ApiError("warming", f"deployment {req.model!r} is starting ({row['phase']}); about {remaining:.0f} s left",
                               retry_after_s=round(remaining, 1),
                               details={"phase": row["phase"], "elapsed_s": round(elapsed, 1), "estimate_s": estimate},
                               hint="retry after Retry-After seconds; the client waits this out for you")
        spec = json.loads(row["spec_json"]) if row["spec_json"] else {"contract": {"action": None, "observation": None}, "params": []}
        declared = [InferParam.from_dict(p) for p in spec.get("params", [])]
        try:
            params = cast_params(declared, req.params)
        except ParamError as exc:
            raise ApiError("invalid_request", str(exc), details={"param": exc.name, "declared": spec.get("params", [])},
                           hint="`seq policy status NAME` lists the params this policy declares") from None
        now = time.time()
        return ConnectResponse(
            session_id="sess_" + secrets.token_hex(8),
            worker_url=f"http://127.0.0.1:{row['worker_port']}",
            direct_secret=row["secret"],
            lease=Lease(ttl_s=LEASE_TTL_S, expires_at=now + LEASE_TTL_S, epoch=row["epoch"]),
            contract=spec["contract"], params=params, version=row["version"],
        )

    def close(self) -> None:
        self.stop_all()
        self.store.close()


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the app

def create_app(data_dir: Optional[Path] = None) -> FastAPI:
    gw = Gateway(data_dir or default_data_dir())

    def get_gateway() -> Gateway:
        return gw

    def require_key(authorization: Optional[str] = Header(default=None),
                    x_api_key: Optional[str] = Header(default=None)) -> None:
        key = x_api_key
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() == "bearer" and token:
            key = token
        if not gw.check_key(key):
            raise ApiError("unauthorized", "missing or invalid API key" if key else "no API key was sent",
                           hint=f"send `Authorization: Bearer <key>`; the local key is in {gw.api_key_file} "
                                "(or set SEQUENCES_API_KEY)")

    models = APIRouter(prefix="/v1/models", tags=["models"])

    @models.get("", response_model=ModelList)
    async def list_models() -> ModelList:
        out = []
        for row in gw.store.all():
            d = gw.describe(row)
            out.append(ModelEntry(name=d.name, version=d.version, status=d.status,
                                  contract=d.contract, params=d.params))
        return ModelList(models=out)

    deployments = APIRouter(prefix="/v1/deployments", tags=["deployments"], dependencies=[Depends(require_key)])

    @deployments.get("", response_model=DeploymentList)
    async def list_deployments() -> DeploymentList:
        return DeploymentList(deployments=[gw.describe(r) for r in gw.store.all()])

    @deployments.post("", response_model=Deployment)
    async def create_deployment(body: DeployRequest) -> Deployment:
        return await asyncio.to_thread(gw.deploy, body)

    @deployments.get("/{name}", response_model=Deployment)
    async def get_deployment(name: str) -> Deployment:
        return await asyncio.to_thread(gw.status, name)

    @deployments.delete("/{name}", response_model=Deployment)
    async def stop_deployment(name: str) -> Deployment:
        return await asyncio.to_thread(gw.stop, name)

    connect = APIRouter(prefix="/v1/connect", tags=["connect"], dependencies=[Depends(require_key)])

    @connect.post("", response_model=ConnectResponse)
    async def connect_(body: ConnectRequest) -> ConnectResponse:
        return await asyncio.to_thread(gw.connect, body)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        async def supervise() -> None:
            while True:
                try:
                    await asyncio.to_thread(gw.poll)
                except Exception:
                    log.exception("supervisor poll failed")
                await asyncio.sleep(0.1)
        task = asyncio.create_task(supervise())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            log.info("stopping all workers")
            await asyncio.to_thread(gw.close)

    app = FastAPI(title="sequence-ai gateway", lifespan=lifespan)
    app.state.gateway = gw

    @app.middleware("http")
    async def request_id(request: Request, call_next):
        request.state.request_id = new_request_id()
        response = await call_next(request)
        response.headers.setdefault("X-Request-ID", request.state.request_id)
        return response

    install_error_handlers(app)
    app.include_router(models)
    app.include_router(deployments)
    app.include_router(connect)

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
    app = create_app(data_dir)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
