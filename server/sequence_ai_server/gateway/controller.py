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

Where each part lives (this module keeps :class:`Gateway`'s shared state, the keys, ``serve`` and
``main``; every job is a module of its own, mixed into Gateway):

    config.py       ServerConfig: every SEQ_* setting, read once
    app.py          create_app: middleware, the background loops, one router per resource
    routes/         models, deployments, sessions (connect), keys, secrets (+ internal), volumes,
                    account, act_proxy, capture, adapters
    middleware.py   CredentialsFirst (route scopes), BodyLimit, the request log
    schemas.py      request and response bodies
    store.py        state.db: DeploymentRow / VersionRow (JSON columns parsed once), workers, sessions
    deployments.py  deploy, versions, rollback, start/stop/remove, status, params, doctor, logs
    sessions.py     connect (slots, waiting line, GPU cap), leases, renew, close, revocation
    routing.py      traffic split and pins, side workers of other versions
    supervisor.py   launching, polling by Role, build switch-over, idle/min_workers, adoption
    workers.py      WorkerProc, Role (SERVING | BUILD | SIDE | RETIRING), the run-file protocol
    health.py       the ping loop and jammed-worker replacement

    python -m sequence_ai_server.gateway [--host 127.0.0.1] [--port 8470] [--data-dir DIR] [--ready-file F]
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from sequence_ai_server.common.processes import process_start
from sequence_ai_server.gateway.app import create_app
from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.gateway.deployments import DeploymentService
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.health import HealthCheck
from sequence_ai_server.gateway.keys import KeyRecord, KeyStore
from sequence_ai_server.common.leases import RevocationList
from sequence_ai_server.common.logs import GATEWAY_LOG, install_json_log
from sequence_ai_server.ops.service import Operations     # scheduled scaling, usage, limits, alerts, cards
from sequence_ai_server.gateway.routing import TrafficRouting
from sequence_ai_server.gateway.secrets import SecretStore   # encrypted secrets, injected only when declared
from sequence_ai_server.gateway.sessions import SessionRec, SessionService, SessionTable
from sequence_ai_server.gateway.slots import SlotQueue             # robots waiting for a slot
from sequence_ai_server.gateway.store import DeploymentRow, Store  # Store re-exported
from sequence_ai_server.gateway.supervisor import DataDirInUse, WorkerSupervision
from sequence_ai_server.gateway.traffic import TrafficRouter
from sequence_ai_server.common.volumes import VolumeStore
from sequence_ai_server.gateway.worker_record import WorkerProc, _worker_url, _write_secret

__all__ = ["Gateway", "DataDirInUse", "create_app", "serve", "main", "DEFAULT_HOST", "DEFAULT_PORT"]

log = logging.getLogger("sequence_ai_server.gateway")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8470
from sequence_ai_core.protocol import MAX_BODY_BYTES  # noqa: E402  the largest request body the gateway reads (the worker's cap too)


# ---------------------------------------------------------------- the gateway

class Gateway(DeploymentService, SessionService, TrafficRouting, WorkerSupervision, HealthCheck, Operations):
    """Owns the state and the worker processes; the routers call into it. Its jobs live in one
    module each and are mixed in here: deployments and versions (deployments.py), sessions and
    leases (sessions.py), traffic and side workers (routing.py), worker supervision
    (supervisor.py), jammed-worker replacement (health.py). This class holds the shared state,
    the keys, the direct secrets and the account view."""

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
        # how workers start (launch.py): local subprocesses, or Ray actors with $SEQ_BACKEND=ray
        from sequence_ai_server.launchers.ray import launcher_for
        self.launcher = launcher_for(config, self.data_dir)
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
        self._init_operations()                      # schedules, usage, limits, alerts (operations.py)
        # workers of a previous gateway process on this data dir keep serving through its death:
        # the ones still running are adopted, the rest of what it left is cleaned up
        self._adopt_workers()

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
            if w is not None:
                w.proc.set_secret(secret)
            else:
                _write_secret(self.data_dir / "run" / f"{name}.secret", secret)
        log.info("rotated the direct secret of %s", name)
        return {"name": name, "rotated_at": time.time()}

    def _spec_value(self, row: DeploymentRow, key: str, default: Any) -> Any:
        spec = row.spec or {}
        value = spec.get(key)
        return default if value is None else value

    def account(self, key: KeyRecord) -> dict:
        """Usage and configured limits of this local account. ``balance`` is None: a self-hosted
        gateway meters nothing in money (the hosted service's prepaid balance has no counterpart).
        ``usage.deployments``: per deployment, ``{"total", "today", "captured_bytes"}`` (usage.py:
        worker-seconds by card type, requests, errors, bytes in/out); ``limits.quotas``: the
        account's and this key's limits with what they use (quotas.py). ``usage.benchmarks`` counts the benchmarks ``seq eval run`` can name here (the built-in
        ones), ``usage.evals_running`` the evals in this data dir still running; a key bound to
        one deployment sees that deployment only."""
        from sequence_ai_data.evals import EvalStore
        from seq.spec import BUILTIN_BENCHMARKS
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
                      "benchmarks": len(BUILTIN_BENCHMARKS), "evals_running": running,
                      "deployments": self.account_usage(names)},
            "limits": {"lease_ttl_s": self.lease_ttl_s, "max_gpus": self.max_gpus,
                       "max_body_bytes": self.config.max_body_bytes or MAX_BODY_BYTES,
                       "self_hosted": True,
                       "quotas": [q for q in self.limits_view()["limits"]
                                  if q["scope"] in ("account", f"key:{key.id}")]},
        }

    def close(self) -> None:
        self.stop_all()
        self.store.close()
        logging.getLogger("sequence_ai_server").removeHandler(self._json_log)
        self._json_log.close()
        self.launcher.close()             # a Ray launcher disconnects from its cluster


def serve(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, data_dir: Optional[Path] = None,
          ready_file: Optional[str] = None, on_ready: Any = None) -> None:
    """Run the gateway in the foreground until SIGINT/SIGTERM; stops every worker on the way out.
    Port 0 binds an ephemeral port; ``ready_file`` then receives ``{"url", "port", "pid"}``.
    Every setting is read once, here (``ServerConfig.from_env(data_dir)``); ``data_dir``
    overrides ``$SEQUENCES_HOME``. Raises DataDirInUse when another gateway holds the data dir,
    and OSError when the address cannot be bound: both before the data dir gets a key, a store or
    a log (a data dir this call created is removed again when the bind fails)."""
    import uvicorn

    config = ServerConfig.from_env(data_dir)
    from sequence_ai_server.gateway.datadir_lock import hold_data_dir   # one gateway per data dir: the lock is held until exit
    created = not config.data_dir.expanduser().exists()
    dir_lock = hold_data_dir(config.data_dir)  # raises DataDirInUse naming the holder
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol is
    # IPPROTO_TCP; with 0 every response waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))                # before create_app: a busy port creates no API key
    except OSError:
        sock.close()
        dir_lock.release()
        if created:                            # leave no half-made data dir behind
            dir_lock.path.unlink(missing_ok=True)
            try:
                config.data_dir.expanduser().rmdir()
            except OSError:
                pass
        raise
    bound = sock.getsockname()[1]
    app = create_app(config=config)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))

    async def run() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            url = f"http://{host}:{bound}"
            dir_lock.note(port=bound)   # a second gateway's refusal names this port
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
