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
import dataclasses
import enum
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
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

from seq._params import InferParam, ParamError, cast_params

from .app import create_app
from .config import ServerConfig, default_data_dir
from .errors import CODES as _CODES
from .middleware import route_scopes  # noqa: F401  (re-exported: test_route_scopes.py)
from .sessions import SessionRec, SessionTable
from .store import DeploymentRow, Store, VersionRow
from .schemas import ConnectRequest, ConnectResponse, Deployment, DeployRequest, Lease, ParamsUpdate, TrafficUpdate
from ._proc import EXIT_UNKNOWN, AdoptedProcess, process_alive, process_cmdline, process_start, stop_process
from .errors import ApiError
from .keys import KeyRecord, KeyStore
from .leases import RevocationList, push_revocations, sign_lease
from .slots import SlotQueue, slots_of   # slots and the waiting line
from .secrets_store import SecretStore   # encrypted secrets, injected only when declared
from .logs import GATEWAY_LOG, install_json_log, read_logs
from .volumes import VolumeStore
from .traffic import TrafficError, TrafficRouter, parse_split, parse_version

__all__ = ["Gateway", "create_app", "serve", "main", "default_data_dir", "DEFAULT_HOST", "DEFAULT_PORT"]

log = logging.getLogger("sequence_ai_server.gateway")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
DEFAULT_LOAD_ESTIMATE_S = 30.0
DEFAULT_IDLE_TIMEOUT_S = 600.0  # when the policy declares none (seq._policy default)
STOP_GRACE_S = 10.0
JAMMED_GRACE_S = 2.0        # a jammed worker (replace_jammed) is killed this long after SIGTERM
KEEP_VERSIONS = 5
BUILD_SUFFIX = ".build"     # worker_key(BUILD, name): the version building beside the serving one
SIDE_MARK = "@v"            # worker_key(SIDE, name, N): a kept version serving a traffic split or a pin
_CODES.setdefault("deployment_stopped", (503, False))   # `seq policy stop`, until `seq policy start`
MAX_BODY_BYTES = 32 * 1024 * 1024   # the largest request body the gateway reads (the worker's cap too)
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class DataDirInUse(OSError):
    """Another live gateway supervises the workers of this data dir (raised when a gateway starts)."""


def _hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Role(str, enum.Enum):
    """What a worker process is for (``WorkerProc.role``; stored as its value in state.db)."""
    SERVING = "serving"     # the deployment's serving version
    BUILD = "build"         # a version (or a jammed worker's replacement) loading beside the serving one
    SIDE = "side"           # a kept version serving a traffic split or a pin
    RETIRING = "retiring"   # replaced: draining its requests, then stopped


def worker_key(role: Role, name: str, version: int = 0) -> str:
    """The ``Gateway.workers`` key of ``name``'s worker in ``role``: ``name`` (serving),
    ``name.build``, ``name@vN`` (side, version N); the one place the key is spelled."""
    if role is Role.BUILD:
        return name + BUILD_SUFFIX
    if role is Role.SIDE:
        return f"{name}{SIDE_MARK}{version}"
    return name


@dataclass
class WorkerProc:
    """One worker process the gateway supervises (its role, version, files and secret).
    Times are unix seconds."""
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
    role: Role = Role.SERVING
    retired_at: float = 0.0             # RETIRING: when it was told to stop (unix s)
    grace_s: float = STOP_GRACE_S       # RETIRING: how long it may drain before it is killed


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

    worker_url = staticmethod(lambda row: _worker_url(row))

    def __init__(self, data_dir: Optional[Path] = None, config: Optional[ServerConfig] = None):
        """``config``: the settings (default ``ServerConfig.from_env(data_dir)``); ``data_dir``
        overrides its data dir. Raises DataDirInUse when another live gateway supervises the
        workers of this data dir."""
        config = config or ServerConfig.from_env(data_dir)
        if data_dir is not None and Path(data_dir).expanduser() != config.data_dir:
            config = dataclasses.replace(config, data_dir=Path(data_dir).expanduser())
        self.config = config
        self.data_dir = config.data_dir.expanduser().resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("logs", "run", "weights"):
            (self.data_dir / sub).mkdir(exist_ok=True)
        self.store = Store(self.data_dir / "state.db")
        self._json_log = install_json_log(self.data_dir / "logs" / GATEWAY_LOG, "gateway")   # logs.py
        self.keys = KeyStore(self.store._db, self.store._lock)
        self.workers: dict[str, WorkerProc] = {}
        # scale-out hook (ray_backend.py): $SEQ_BACKEND=ray starts workers as Ray actors through a
        # launcher whose start() returns a Popen look-alike; None keeps plain local subprocesses
        from .ray_backend import launcher_for
        self.launcher = launcher_for(config)
        self._lock = threading.RLock()
        self.api_key_file = self.data_dir / "api_key"
        self._ensure_key()
        self.lease_ttl_s = config.lease_ttl_s
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
        self.max_gpus = config.max_gpus
        self.traffic = TrafficRouter()               # canary split between versions (traffic.py)
        self._side_failed: dict[str, dict] = {}      # side worker key -> why its last start failed
        self._health: dict[str, dict] = {}           # deployment -> the last jammed-worker event (replace_jammed)
        self.health_interval_s = config.health_interval_s
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
    def _worker_record(key: str, w: WorkerProc) -> dict:
        rec = {"key": key, "name": w.name, "role": w.role.value, "pid": w.proc.pid, "start": w.proc_start,
               "ready_file": str(w.ready_file), "log_path": str(w.log_path), "started_at": w.started_at,
               "startup_timeout_s": w.startup_timeout_s, "secret": w.secret,
               "secret_file": str(w.secret_file) if w.secret_file else None,
               "activity_file": str(w.activity_file) if w.activity_file else None,
               "supervisor_file": str(w.supervisor_file) if w.supervisor_file else None,
               "version": w.version, "file": w.file, "class_name": w.class_name, "file_sha": w.file_sha,
               "spec": w.spec, "port": w.port, "host": w.host, "epoch": w.epoch}
        if w.role is Role.RETIRING:
            rec.update(retired_at=w.retired_at, grace_s=w.grace_s)
        return rec

    def _save_workers(self) -> None:
        """Record the running workers (serving, building, side, retiring) in the ``workers`` table,
        when they changed. Ray workers are not recorded: they stop with their actors."""
        if self.launcher:
            return
        with self._lock:
            records = [self._worker_record(k, w) for k, w in self.workers.items()]
            records += [self._worker_record(f"{w.name}.retiring.{w.proc.pid}", w) for w in self._retiring]
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
        if rec["role"] == Role.SERVING.value:
            row = self.store.get(rec["name"])
            if row is None or row.worker_pid != pid or row.status not in ("starting", "ready"):
                self._stop_in_background(proc, f"{rec['name']} no longer runs it")
                return None
            if row.status == "ready" and row.worker_port:
                url = _worker_url(row)
        elif rec["role"] == Role.SIDE.value and rec.get("port"):
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
                       epoch=int(rec.get("epoch") or 0), proc_start=start, supervisor_file=path("supervisor_file"),
                       role=Role(rec["role"]))
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
            if w.role is Role.RETIRING:             # was draining after a version switch: let it finish
                w.stopping, w.retired_at = True, time.time()
                w.grace_s = float(rec.get("grace_s") or STOP_GRACE_S)
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
                self._retiring.append(w)
            else:
                self.workers[rec["key"]] = w
        for row in self.store.all():
            name = row.name
            if row.status in ("starting", "ready") and name not in self.workers:
                self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
            build = row.build if row.build is not None else None
            if build and build.get("status") == "switching" and not any(w.name == name for w in self._retiring):
                self.store.update(name, build=({**build, "status": "ready"}))
            elif build and build.get("status") == "building" and worker_key(Role.BUILD, name) not in self.workers:
                msg = "the gateway restarted during the build and its worker was gone"
                self.store.update(name, build=({**build, "status": "failed", "phase": "failed", "error": msg}))
                self.store.update_version(name, build["version"], status="failed", error=msg)
        now = time.time()
        for sess in self.sessions.load():
            row = self.store.get(sess.model)
            if sess.side:
                alive = sess.side in self.workers
            else:
                alive = (row is not None and row.status == "ready" and row.epoch == sess.epoch
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
    def describe(self, row: DeploymentRow) -> Deployment:
        spec = row.spec if row.spec is not None else None
        details = row.details
        return Deployment(
            name=row.name, version=row.version, status=row.status, phase=row.phase,
            worker_url=_worker_url(row) if row.status == "ready" and row.worker_port else None,
            error=row.error, load_s=row.load_s, file=row.file, class_name=row.class_name,
            pid=row.worker_pid, started_at=row.started_at, ready_at=row.ready_at,
            contract=spec["contract"] if spec else None, params=spec["params"] if spec else [],
            spec=spec, details=details, stopped_at=row.halted_at,
            build=row.build if row.build is not None else None,
            health=self._health.get(row.name),
        )

    def require(self, name: str) -> DeploymentRow:
        row = self.store.get(name)
        if row is None:
            known = [r.name for r in self.store.all()]
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
            known = [v.version for v in self.store.versions(name)]
            if version is None:
                if old is None:
                    version = 1
                else:
                    same = old.file_sha == sha and old.class_name == class_name
                    version = old.version if same else max([old.version, *known]) + 1
            self._record_version(name, version, path, source or path, class_name, sha)
            if old is not None and old.status == "ready" and name in self.workers:
                bk = worker_key(Role.BUILD, name)
                prev = self.workers.get(bk)
                if prev is not None and prev.version != version:
                    self.store.update_version(name, prev.version, status="superseded")
                self._stop_process(bk)
                w = self._launch(name, Role.BUILD, str(path), class_name, version, source or path)
                w.file_sha = sha
                self.store.update(name, build=({"version": version, "status": "building",
                                                               "phase": "spawning", "started_at": now}))
                if version == old.version:
                    log.info("%s: the same file again (v%d, no new version): a fresh worker of it starts "
                             "beside the serving one", name, version)
                else:
                    log.info("building %s v%d beside the serving v%d", name, version, old.version)
                return self.describe(self.require(name))
            self._stop_process(name)
            epoch, load_s, created = (0, None, now) if old is None else (old.epoch, old.load_s, old.created_at)
            self.store.insert(DeploymentRow(
                name=name, version=version, file=str(path), class_name=class_name, file_sha=sha,
                status="starting", phase="spawning", epoch=epoch, load_s=load_s, created_at=created, updated_at=now,
                defaults=dict(old.defaults) if old else {},
                halted_at=old.halted_at if old else None,   # a redeploy does not lift a stop
            ))
            self._spawn(name)
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
        self.store.put_version(VersionRow(name=name, version=version, file=str(snap), source_file=str(source),
                                class_name=class_name, file_sha=sha, status="building", created_at=time.time()))
        serving = getattr(self.store.get(name), "version", None)
        for v in self.store.versions(name)[KEEP_VERSIONS:]:
            if v.version != serving:
                self.store.delete_version(name, v.version)
                shutil.rmtree(self.data_dir / "versions" / name / f"v{v.version}", ignore_errors=True)

    def versions(self, name: str) -> dict:
        """``{"name", "serving", "versions": [{"version", "status", "serving", "load_s", "created_at", "error", "file"}]}``."""
        row = self.require(name)
        out = []
        for v in self.store.versions(name):
            out.append({"version": v.version, "status": v.status, "serving": v.version == row.version,
                        "load_s": v.load_s, "created_at": v.created_at, "error": v.error,
                        "file": v.source_file})
        return {"name": name, "serving": row.version, "versions": out}

    def rollback(self, name: str, to: Optional[int] = None) -> Deployment:
        """Build a kept version beside the serving one (default: the newest older one that was ready)."""
        row = self.require(name)
        kept = {v.version: v for v in self.store.versions(name)}
        if to is None:
            older = [n for n, v in kept.items() if n < row.version and v.status in ("ready", "retired")]
            if not older:
                raise ApiError("invalid_request", f"{name} has no older version that served to roll back to",
                               hint=f"`seq policy versions {name}` lists the kept versions")
            to = max(older)
        if to not in kept:
            raise ApiError("not_found", f"{name} has no kept version v{to}",
                           hint=f"`seq policy versions {name}` lists the {KEEP_VERSIONS} kept versions")
        v = kept[to]
        return self._deploy(name, Path(v.file), v.class_name, v.file_sha, version=to,
                            source=Path(v.source_file))

    def _launch(self, name: str, role: Role, file: str, class_name: Optional[str], version: int,
                source: Path) -> WorkerProc:
        """Start a worker process for ``name`` in ``role`` (under ``workers[worker_key(role, name,
        version)]``); no state row is touched.
        It runs ``file`` with cwd (and an import path entry) at the original file's directory."""
        run = self.data_dir / "run"
        key = f"{worker_key(role, name, version)}.{secrets.token_hex(3)}"   # run files are per launch: a build never touches the serving worker's
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
                       proc_start=None if self.launcher else process_start(proc.pid), role=role)
        self.workers[worker_key(role, name, version)] = w
        log.info("started worker for %s v%d (pid %d)", name, version, proc.pid)
        self._save_workers()
        return w

    def _spawn(self, name: str) -> None:
        row = self.store.get(name)
        kept = {v.version: v for v in self.store.versions(name)}
        source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)
        w = self._launch(name, Role.SERVING, row.file, row.class_name, row.version, source)
        self.store.update(name, status="starting", phase="spawning", worker_pid=w.proc.pid, worker_port=None,
                          secret=w.secret, epoch=row.epoch + 1, error=None, details=None,
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
            running = name in self.workers or worker_key(Role.BUILD, name) in self.workers or bool(self._sides(name))
            if (held or running) and not force:
                raise ApiError("invalid_request",
                               f"{name} is {'serving ' + str(held) + ' session(s)' if held else row.status}; not removed",
                               hint=f"stop it first (`seq policy stop {name}`) or pass --force")
            self._stop_process(worker_key(Role.BUILD, name))
            self._stop_process(name)
            self._stop_sides(name)
            self.traffic.forget(name)
            self._drop_sessions(name)
            self.store.delete(name)
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

    def _refuse_if_halted(self, row: DeploymentRow) -> None:
        """deployment_stopped (503, not retryable) while ``seq policy stop`` holds ``row``."""
        if row.halted_at:
            name = row.name
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.halted_at))
            raise ApiError("deployment_stopped", f"deployment {name!r} was stopped (`seq policy stop`, {when}); "
                           "it refuses every connect until it is started again",
                           details={"reason": "stopped", "stopped_at": row.halted_at},
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
                if w.role is Role.BUILD:
                    self._poll_build(key, w)
                elif w.role is Role.SIDE:
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
        build = (row.build if row else None) or {}
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
            w.role = Role.SERVING
            self.workers[name] = w
            load_s = round(now - w.started_at, 3)
            spec = ready.get("spec") or w.spec
            self.store.update(name, version=w.version, file=w.file, class_name=w.class_name, file_sha=w.file_sha,
                              status="ready", phase="ready", worker_port=int(ready["port"]), worker_pid=w.proc.pid,
                              worker_host=_ready_host(ready),
                              secret=w.secret, epoch=row.epoch + 1, error=None, details=None,
                              load_s=load_s, started_at=w.started_at, ready_at=now, served=1,
                              spec=spec or row.spec,
                              build=({**build, "status": "switching", "phase": "ready", "load_s": load_s}))
            if row.version != w.version:
                self.store.update_version(name, row.version, status="retired")
            jam = self._health.get(name)
            if jam and jam.get("state") == "jammed":
                self._health[name] = {**jam, "state": "replaced", "replaced_at": now, "new_pid": w.proc.pid}
                log.warning("%s: the jammed worker (pid %s) is replaced by pid %d", name, jam.get("pid"), w.proc.pid)
            pol = row.traffic
            if pol["split"]:   # a new serving version takes every new session (pins stay)
                pol["split"] = {}
                self.store.update(name, traffic=pol)
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
                old.role, old.retired_at = Role.RETIRING, time.time()
                if jam and jam.get("state") == "jammed":
                    old.grace_s = JAMMED_GRACE_S     # its replica thread is stuck: do not wait long
                self._retiring.append(old)
            else:
                self.store.update(name, build=({**build, "status": "ready", "load_s": load_s}))
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
            self.store.update(name, build=({**build, "status": "failed", "phase": "failed",
                                                           "error": failed_msg, "details": details}))
            self.store.update_version(name, w.version, status="failed", error=failed_msg)
            log.warning("%s v%d failed to build; v%s keeps serving: %s", name, w.version, row.version, failed_msg)
        elif code is None and ph.get("phase") and build.get("phase") != ph["phase"]:
            self.store.update(name, build=({**build, "phase": ph["phase"]}))

    def _reap_retiring(self) -> None:
        for old in list(self._retiring):
            if old.proc.poll() is None:
                if time.time() - old.retired_at < old.grace_s:
                    continue
                old.proc.kill()
                old.proc.wait()
            self._retiring.remove(old)
            if old.log_handle:
                old.log_handle.close()
            row = self.store.get(old.name)
            build = row.build if row else None
            if build and build.get("status") == "switching":
                self.store.update(old.name, build=({**build, "status": "ready"}))

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
                if ph.get("phase") and row.status == "starting":
                    fields["phase"] = ph["phase"]
                if ph.get("spec"):
                    fields["spec"] = ph["spec"]
                    w.startup_timeout_s = float(ph["spec"].get("timeouts", {}).get("startup", 1800.0))
                if fields:
                    self.store.update(name, **fields)
        code = w.proc.poll()
        if row.status == "starting" and code is None and w.ready_file.exists():
            ready = _read_json(w.ready_file)
            if ready and ready.get("port"):
                now = time.time()
                self.store.update(name, status="ready", phase="ready", worker_port=int(ready["port"]),
                                  worker_host=_ready_host(ready), ready_at=now, load_s=round(now - w.started_at, 3), served=1,
                                  spec=ready.get("spec") or row.spec)
                log.info("%s is ready on port %s after %.2fs", name, ready["port"], now - w.started_at)
                self.store.update_version(name, row.version, status="ready", load_s=round(now - w.started_at, 3))
            return
        if code is not None:
            self.workers.pop(name, None)
            if w.log_handle:
                w.log_handle.close()
            if w.stopping:
                return
            tail = _log_tail(w.log_path)
            err = _read_json(Path(str(w.ready_file) + ".error"))
            if row.status == "starting":
                if err:
                    msg = f"worker failed while {err.get('phase')}: {err.get('detail')}"
                    details = {"phase": err.get("phase"), "exception_type": err.get("exception_type"),
                               "remote_traceback": err.get("traceback"), "log_tail": tail, "exit_code": code}
                else:
                    msg = f"worker {_exit_reason(code)} while {row.phase or 'starting'}"
                    details = {"phase": row.phase, "log_tail": tail, "exit_code": code}
                self.store.update(name, status="failed", phase="failed", error=msg, details=details,
                                  worker_port=None, worker_pid=None, served=0)
                log.warning("%s failed: %s", name, msg)
            else:
                msg = f"worker {_exit_reason(code)} while serving; the next connect starts a new one"
                self.store.update(name, status="failed", phase="exited", error=msg,
                                  details=({"log_tail": tail, "exit_code": code}),
                                  worker_port=None, worker_pid=None)
                log.warning("%s: %s", name, msg)
            return
        if row.status == "starting" and time.time() - w.started_at > w.startup_timeout_s:
            self.workers.pop(name, None)
            w.stopping = True
            _terminate(w.proc)
            msg = f"worker did not load within the startup timeout ({w.startup_timeout_s:g} s)"
            self.store.update(name, status="failed", phase="failed", error=msg, served=0,
                              details=({"log_tail": _log_tail(w.log_path)}),
                              worker_port=None, worker_pid=None)

    # -- connect, sessions and leases
    def ensure_ready(self, model: str) -> DeploymentRow:
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
            status = row.status
            if status == "failed" and not row.served:
                details = row.details
                raise ApiError("worker_failed", f"deployment {model!r} failed to start: {row.error}",
                               details=details, hint=f"fix the policy, then `seq deploy {row.file} --name {model}`; "
                                                     f"the log is {self.data_dir / 'logs' / (model + '.log')}")
            if status in ("stopped", "failed"):
                self._spawn(model)
                row = self.store.get(model)
                status = row.status
            self._activity[model] = time.time()
            jam = self._health.get(model)
            if status == "ready" and jam and jam.get("state") == "jammed":
                self._refuse_jammed(model, row, jam)
            if status == "starting":
                estimate = row.load_s or DEFAULT_LOAD_ESTIMATE_S
                elapsed = time.time() - (row.started_at or time.time())
                remaining = max(1.0, estimate - elapsed)
                raise ApiError("warming", f"deployment {model!r} is starting ({row.phase}); about {remaining:.0f} s left",
                               retry_after_s=round(remaining, 1),
                               details={"phase": row.phase, "elapsed_s": round(elapsed, 1), "estimate_s": estimate},
                               hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")
            return row

    def _refuse_jammed(self, model: str, row: DeploymentRow, jam: dict) -> None:
        """A connect while a jammed worker is being replaced: 503 warming until the fresh worker
        takes over, worker_failed when the replacement itself failed to load."""
        build = row.build if row.build is not None else {}
        if build.get("status") == "failed":
            raise ApiError("worker_failed", f"the worker of {model!r} is jammed (an inference ran {jam['oldest_request_s']:.0f} s) "
                           f"and its replacement failed: {build.get('error')}", details=build.get("details"),
                           hint=f"`seq policy status {model}`; the log is {self.data_dir / 'logs' / (model + '.log')}")
        estimate = row.load_s or DEFAULT_LOAD_ESTIMATE_S
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
            for name, w in list(self.workers.items()):
                if w.role is not Role.SERVING or worker_key(Role.BUILD, name) in self.workers:
                    continue
                row = self.store.get(name)
                if row and row.status == "ready" and row.worker_port:
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
            if row is None or row.status != "ready" or name not in self.workers or worker_key(Role.BUILD, name) in self.workers:
                return False
            if port is not None and row.worker_port != port:
                return False                 # the ping came from a worker that has been replaced since
            now = time.time()
            self._health[name] = {"state": "jammed", "since": now, "pid": row.worker_pid, "version": row.version,
                                  "oldest_request_s": float(ping.get("oldest_request_s") or 0.0),
                                  "request_timeout_s": ping.get("request_timeout_s")}
            kept = {v.version: v for v in self.store.versions(name)}
            source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)
            w = self._launch(name, Role.BUILD, row.file, row.class_name, row.version, source)
            w.file_sha = row.file_sha
            self.store.update(name, build=({"version": row.version, "status": "building",
                                                           "phase": "spawning", "started_at": now,
                                                           "reason": "replacing a jammed worker"}))
        log.warning("%s: worker pid %s is jammed (an inference has run %.1f s, timeouts.request %s s); "
                    "starting a fresh one", name, row.worker_pid, self._health[name]["oldest_request_s"],
                    ping.get("request_timeout_s"))
        return True

    def _lease(self, row: DeploymentRow, sess: SessionRec) -> ConnectResponse:
        spec = row.spec if row.spec is not None else {"contract": {"action": None, "observation": None}}
        token = sign_lease(row.secret, sess.id, sess.epoch, sess.expires_at)
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
        if version != current.version:
            side = self._connect_on_version(req, key, version, split)
            if side is not None:
                return side
        self._check_gpu_limit(req.model)
        row = self.ensure_ready(req.model)
        spec = row.spec if row.spec is not None else {"contract": {"action": None, "observation": None}, "params": []}
        params = self._session_params(row, req.params)
        now = time.time()
        sess = SessionRec(id="sess_" + secrets.token_hex(8), model=req.model, key_id=key.id if key else "",
                          epoch=row.epoch, version=row.version, params=params,
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
    def _usable_versions(self, name: str, row: DeploymentRow) -> dict[int, VersionRow]:
        """The versions a split or pin may name: the serving one and kept ones that served."""
        kept = {v.version: v for v in self.store.versions(name)}
        return {n: v for n, v in kept.items() if n == row.version or v.status in ("ready", "retired")}

    def _route(self, row: DeploymentRow, key: Optional[KeyRecord]) -> tuple[int, Optional[dict[int, float]]]:
        """The version a new session of ``row`` starts on, and the split it was drawn from (None
        for a pin or no split). A pin or split naming a version no longer kept is ignored."""
        pol = row.traffic
        if not pol["split"] and not pol["pins"]:
            return row.version, None
        usable = self._usable_versions(row.name, row)
        if key is not None and pol["pins"].get(key.id) in usable:
            return pol["pins"][key.id], None
        split = {v: w for v, w in pol["split"].items() if v in usable}
        if split and sum(split.values()) > 0:
            return self.traffic.pick(row.name, split), split
        return row.version, None

    def _sides(self, name: str) -> list[str]:
        """The ``workers`` keys of ``name``'s side workers."""
        return [k for k, w in self.workers.items() if w.role is Role.SIDE and w.name == name]

    def _stop_sides(self, name: str) -> None:
        for k in self._sides(name):
            self._stop_process(k)
            self._side_failed.pop(k, None)
        for k in [k for k in self._side_failed if k.rsplit(SIDE_MARK, 1)[0] == name]:
            self._side_failed.pop(k, None)

    @staticmethod
    def _side_row(row: DeploymentRow, w: WorkerProc) -> DeploymentRow:
        """``row`` as seen by a session on side worker ``w`` (its port, secret, epoch and spec)."""
        return row.replace(status="ready", worker_port=w.port, worker_host=w.host, secret=w.secret, epoch=w.epoch,
                           version=w.version, spec=w.spec or row.spec)

    def _start_side(self, name: str, version: int) -> WorkerProc:
        """Launch kept version ``version`` of ``name`` as a side worker (``workers[name@vN]``)."""
        v = {x.version: x for x in self.store.versions(name)}[version]
        sk = worker_key(Role.SIDE, name, version)
        self._side_failed.pop(sk, None)
        w = self._launch(name, Role.SIDE, v.file, v.class_name, version, Path(v.source_file))
        w.epoch = secrets.randbelow(2 ** 31)
        log.info("started %s v%d beside the serving version for its traffic split/pins", name, version)
        return w

    def _connect_on_version(self, req: ConnectRequest, key: Optional[KeyRecord], version: int,
                            split: Optional[dict[int, float]]) -> Optional[ConnectResponse]:
        """Admit a session on a version other than the serving one (its side worker); None when
        ``version`` turned out to be the serving one. Raises ApiError warming while that version's
        worker loads (it is started here if needed) and worker_failed once when it failed to load."""
        name = req.model
        sk = worker_key(Role.SIDE, name, version)
        with self._lock:
            row = self.require(name)
            if version == row.version:
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
                kept = self.store.kept(name).get(version)
                estimate = (kept.load_s if kept else None) or row.load_s or DEFAULT_LOAD_ESTIMATE_S
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
            if w.role is not Role.SIDE or any(s.side == key for s in self.sessions.values()):
                continue
            row = self.store.get(w.name)
            if row is not None:
                pol = row.traffic
                wanted = w.version != row.version and (pol["split"].get(w.version, 0) > 0
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
            pol = row.traffic
            total = sum(pol["split"].values()) or 1.0
            counts = self.traffic.counts(name, pol["split"]) if pol["split"] else {}

            def worker(v: int) -> str:
                if v == row.version:
                    return "serving"
                sk = worker_key(Role.SIDE, name, v)
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
        return {"name": name, "serving": row.version, "split": split, "pins": pins, "side_workers": sides}

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
            pol = row.traffic
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
            if row.status in ("ready", "starting"):
                wanted = {v for v, share in pol["split"].items() if share > 0} | set(pol["pins"].values())
                start = [v for v in sorted(wanted - {row.version}) if worker_key(Role.SIDE, name, v) not in self.workers]
            if start and self.max_gpus is not None:
                running = sum(1 for w in self.workers.values() if w.role is not Role.BUILD)
                if running + len(start) > self.max_gpus:
                    raise ApiError("gpu_limit_reached",
                                   f"{', '.join(f'v{v}' for v in start)} of {name} would need {len(start)} more worker(s); "
                                   f"{running} run and this machine allows {self.max_gpus} (SEQ_MAX_GPUS); traffic unchanged",
                                   details={"max_gpus": self.max_gpus},
                                   hint="stop a deployment (`seq policy stop NAME`) or raise SEQ_MAX_GPUS")
            self.store.update(name, traffic=pol)
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
            running = sum(1 for w in self.workers.values() if w.role is not Role.BUILD)
            if running >= self.max_gpus:
                raise ApiError("gpu_limit_reached", f"{running} workers run and this machine allows {self.max_gpus} "
                               f"(SEQ_MAX_GPUS); {model!r} cannot start", details={"max_gpus": self.max_gpus},
                               hint="stop a deployment (`seq policy stop NAME`) or raise SEQ_MAX_GPUS")

    def _session_params(self, row: DeploymentRow, requested: Optional[dict]) -> dict:
        """A session's params: the robot's own over the deployment defaults (those the serving
        version still declares), cast to the declared types. Raises ApiError invalid_request."""
        spec = row.spec if row.spec is not None else {}
        declared = [InferParam.from_dict(p) for p in spec.get("params", [])]
        names = {p.name for p in declared}
        defaults = dict(row.defaults)
        merged = {**{k: v for k, v in defaults.items() if k in names}, **(requested or {})}
        try:
            return cast_params(declared, merged)
        except ParamError as exc:
            raise ApiError("invalid_request", str(exc), details={"param": exc.name, "declared": spec.get("params", [])},
                           hint="`seq policy params NAME` lists the params this policy declares") from None

    def params(self, name: str) -> dict:
        """``{"name", "defaults": {k: v}, "declared": [param dicts]}``."""
        row = self.require(name)
        spec = row.spec if row.spec is not None else {}
        return {"name": name, "defaults": dict(row.defaults),
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
        out: dict[str, Any] = {"name": name, "status": row.status, "phase": row.phase, "version": row.version,
                               "error": row.error, "sessions": sum(1 for x in self.sessions.values() if x.model == name),
                               "worker": None}
        if row.status != "ready" or not row.worker_port:
            return out
        url = _worker_url(row)
        worker: dict[str, Any] = {"url": url, "pid": row.worker_pid}
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
            spec = row.spec if row.spec is not None else {}
            obs_contract = (spec.get("contract") or {}).get("observation")
            if obs_contract and spec.get("infer_mode", "observation") == "observation":
                obs = synthetic_observation(SimpleNamespace(observation=ObservationContract.from_dict(obs_contract)))
                rid = _rid()
                t0 = time.perf_counter()
                try:
                    r = http.post(f"{url}/act", json={"observation": obs, "params": {}},
                                  headers={"Authorization": f"Bearer {row.secret}", "X-Request-ID": rid})
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
            if row.spec is None:
                raise ApiError("invalid_request", f"{name} has not loaded yet, so its params are unknown",
                               hint=f"wait until `seq policy status {name}` says ready")
            spec = row.spec
            declared = [InferParam.from_dict(p) for p in spec.get("params", [])]
            try:
                cast = cast_params(declared, update.set)
            except ParamError as exc:
                raise ApiError("invalid_request", str(exc), details={"param": exc.name},
                               hint=f"`seq policy params {name}` lists the declared params") from None
            defaults = dict(row.defaults)
            unknown = [k for k in update.clear if k not in defaults and k not in cast]
            if unknown:
                raise ApiError("invalid_request", f"no default set for {', '.join(unknown)}",
                               hint=f"set ones: {', '.join(sorted(defaults)) or 'none'}")
            for k in update.clear:
                defaults.pop(k, None)
            defaults.update(cast)
            self.store.update(name, defaults=defaults)
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
            if sess is None or now > sess.expires_at or row is None or row.status != "ready" or row.epoch != sess.epoch:
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
                elif not s.side and row is not None and row.worker_port:
                    targets.append((_worker_url(row), row.secret))
        push_revocations(targets, entries)

    def is_worker_secret(self, token: str) -> bool:
        """Whether ``token`` is the current or launch secret of a worker this gateway runs."""
        with self._lock:
            known = [w.secret for w in list(self.workers.values()) + self._retiring if w.secret]
            known += [r.secret for r in self.store.all() if r.secret]
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

    def _spec_value(self, row: DeploymentRow, key: str, default: Any) -> Any:
        spec = row.spec or {}
        value = spec.get(key)
        return default if value is None else value

    def _idle_and_min_workers(self) -> None:
        """Stop a ready worker after idle_timeout with no request (direct /act included, via its
        activity file, plus connect/renew here); keep min_workers running (restart a stopped-idle
        or crashed one)."""
        now = time.time()
        for row in self.store.all():
            name = row.name
            min_workers = int(self._spec_value(row, "min_workers", 0) or 0)
            if row.status == "ready" and name in self.workers and min_workers < 1:
                idle_timeout = float(self._spec_value(row, "idle_timeout", DEFAULT_IDLE_TIMEOUT_S))
                last = max(row.ready_at or 0.0, self._activity.get(name, 0.0))
                with contextlib.suppress(OSError):
                    last = max(last, self.workers[name].activity_file.stat().st_mtime)
                if now - last > idle_timeout:
                    log.info("%s idle for %.0f s (idle_timeout %g s): stopping its worker", name, now - last, idle_timeout)
                    self._stop_process(name)
                    self._drop_sessions(name)
                    self.store.update(name, status="stopped", phase="idle", worker_port=None, worker_pid=None)
            elif min_workers >= 1 and name not in self.workers and not row.halted_at and (
                    row.phase in ("idle", "exited") or (row.status == "stopped" and row.phase != "stopped")):
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
            spec = row.spec if row.spec is not None else {}
            weights = spec.get("weights")
            refs = list(weights.values()) if isinstance(weights, dict) else [weights]
            if any(isinstance(r, str) and re.match(rf"^vol://{re.escape(volume)}(@v\d+)?/?$", r) for r in refs):
                users.append(row.name)
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
            rows = [r for r in rows if r.name == key.deployment]
        names = {r.name for r in rows}
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
                      "running_workers": sum(1 for r in rows if r.status in ("starting", "ready")),
                      "sessions": sum(1 for s in self.sessions.values() if s.model in names),
                      "benchmarks": len(BUILTIN_BENCHMARKS), "evals_running": running},
            "limits": {"lease_ttl_s": self.lease_ttl_s, "max_gpus": self.max_gpus,
                       "max_body_bytes": self.config.max_body_bytes or MAX_BODY_BYTES,
                       "self_hosted": True},
        }

    def close(self) -> None:
        self.stop_all()
        self.store.close()
        logging.getLogger("sequence_ai_server").removeHandler(self._json_log)
        self._json_log.close()
        if self.launcher:                # backend hook: disconnect from Ray
            self.launcher.close()


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


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, data_dir: Optional[Path] = None,
          ready_file: Optional[str] = None, on_ready: Any = None) -> None:
    """Run the gateway in the foreground until SIGINT/SIGTERM; stops every worker on the way out.
    Port 0 binds an ephemeral port; ``ready_file`` then receives ``{"url", "port", "pid"}``."""
    import uvicorn

    data_dir = Path(data_dir or default_data_dir()).expanduser()
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


if __name__ == "__main__":   # run through the package module, so there is one copy of it
    from sequence_ai_server.gateway import main as _main
    sys.exit(_main())
