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

One control tick (``Gateway.tick``, every 100 ms from app.py) reconciles the workers, expires
leases, starts a health round when one is due and runs ops each second. A health round pings every serving worker each 2 s; one whose /ping says ``degraded`` (an
inference ran past timeouts.request) is replaced by a fresh worker of the same version
(``replace_jammed``). Request bodies over 32 MiB are refused with 413 (``BodyLimit``).

Where each part lives (this module is the composition root: it builds each service with what it
calls, subscribes the services to the supervisor's events and runs the control tick; every job
is a service of its own):

    config.py       ServerConfig: every SEQ_* setting, read once
    main.py         serve() and main(): the process (``python -m sequence_ai_server.gateway``)
    app.py          create_app: middleware, the control-tick loop, one router per resource
    routes/         models, deployments, sessions (connect), keys, secrets (+ internal), volumes,
                    account, act_proxy, capture, adapters, operations; each gets the services it needs
    middleware.py   CredentialsFirst (route scopes), BodyLimit, the request log
    schemas.py      request and response bodies
    store.py        state.db: DeploymentRow / VersionRow (JSON columns parsed once), workers, sessions
    events.py       the supervisor's events: WorkerStopped, WorkerCrashed, WorkerTookOver
    supervisor.py   Supervisor: launching (no lock held), reconciling by Role, switch-over, idle stops, warm floors
    fleet.py        Fleets: a deployment's several serving workers (name, name#2, ...): cap, warm target, grow, idle stop
    roles.py        the build, side and retiring passes of a reconcile
    adoption.py     adopting the workers a previous gateway left running
    sessions.py     SessionService: connect (version pick, slots, waiting line, GPU cap), leases, renew, close, revocation
    traffic.py      TrafficService: traffic split and pins, the side workers they need
    deployments.py  DeploymentService: deploy, versions, rollback, start/stop/remove, status, params, doctor, logs
    health.py       HealthCheck: the ping rounds and jammed-worker replacement
    worker_record.py WorkerRecord, Role (SERVING | BUILD | SIDE | RETIRING), the run-file protocol
    ops/service.py  OpsService: warm floors, usage, limits, alerts, cards

    python -m sequence_ai_server.gateway [--host 127.0.0.1] [--port 8470] [--data-dir DIR] [--ready-file F]
"""
from __future__ import annotations

import dataclasses
import hmac
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

from sequence_ai_core.protocol import MAX_BODY_BYTES  # the largest request body the gateway reads (the worker's cap too)
from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.logs import GATEWAY_LOG, install_json_log
from sequence_ai_server.common.volumes import VolumeStore
from sequence_ai_server.gateway.admission import Admission
from sequence_ai_server.gateway.deployments import DeploymentService
from sequence_ai_server.gateway.events import WorkerCrashed, WorkerStopped, WorkerTookOver
from sequence_ai_server.gateway.health import HealthCheck
from sequence_ai_server.gateway.keys import KeyRecord, KeyStore, require_scope
from sequence_ai_server.gateway.secrets import SecretStore   # encrypted secrets, injected only when declared
from sequence_ai_server.gateway.sessions import SessionService
from sequence_ai_server.gateway.store import Store
from sequence_ai_server.gateway.supervisor import DataDirInUse, Supervisor
from sequence_ai_server.gateway.traffic import TrafficService
from sequence_ai_server.launchers.base import Launcher
from sequence_ai_server.ops.service import OpsService   # scheduled scaling, usage, limits, alerts, cards

__all__ = ["Gateway", "DataDirInUse", "MAX_BODY_BYTES"]

log = logging.getLogger("sequence_ai_server.gateway")

_OPS_EVERY_S = 1.0      # ops (usage metering, alerts) runs at most this often on the control tick


class Gateway:
    """The composition root: builds each service with what it calls, wires the supervisor's events
    to the services above it, and runs the control tick. Routes get the service(s) they need.

    ``config``: the settings (default ``ServerConfig.from_env(data_dir)``); ``data_dir`` overrides
    its data dir. ``launcher``: how workers start (default: from the config, launchers/base.py's
    ``launcher_for``, in launchers/base.py); ``clock``: unix s, for every service. Raises DataDirInUse when another live
    gateway supervises the workers of this data dir."""

    def __init__(self, data_dir: Optional[Path] = None, config: Optional[ServerConfig] = None, *,
                 launcher: Optional[Launcher] = None, clock: Callable[[], float] = time.time):
        config = config or ServerConfig.from_env(data_dir)
        if data_dir is not None and Path(data_dir).expanduser() != config.data_dir:
            config = dataclasses.replace(config, data_dir=Path(data_dir).expanduser())
        self.config, self.clock = config, clock
        self.data_dir = config.data_dir.expanduser().resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("logs", "run", "weights"):
            (self.data_dir / sub).mkdir(exist_ok=True)
        self.store = Store(self.data_dir / "state.db")
        self._json_log = install_json_log(self.data_dir / "logs" / GATEWAY_LOG, "gateway")   # logs.py
        self.keys = KeyStore(self.store)
        self.api_key_file = self.data_dir / "api_key"
        self._ensure_key()
        if launcher is None:     # local subprocesses, or Ray actors with $SEQ_BACKEND=ray
            from sequence_ai_server.launchers.base import launcher_for
            launcher = launcher_for(config, self.data_dir)
        self.launcher = launcher
        self.ops = OpsService(self.store, self.store, self.data_dir, require=self.store.require,
                              key_deployment=self._key_deployment, places_cards=launcher.places_cards,
                              alert_backoff_s=config.alert_backoff_s,
                              fake_gpus=config.fake_gpus, clock=clock)
        self.supervisor = Supervisor(self.store, launcher, self.data_dir, warm_floor=self.ops.warm_floor,
                                     card_refusal=self.ops.card_refusal,
                                     cards=None if launcher.places_cards else self.ops.cards,
                                     cpu_workers=config.cpu_workers, clock=clock)
        self.traffic = TrafficService(self.store, self.supervisor, self.keys, config.max_gpus)
        self.admission = Admission()     # the workers' measured cost curves, the deadline check
        self.health = HealthCheck(self.store, self.supervisor, self.data_dir, interval_s=config.health_interval_s,
                                  ping_timeout_s=config.ping_timeout_s, usage_since=self.ops.usage_since,
                                  take_usage=self.ops.take_worker_usage, observe=self.admission.observe, clock=clock)
        self.sessions = SessionService(self.store, self.supervisor, self.traffic, self.health, self.ops,
                                       data_dir=self.data_dir, lease_ttl_s=config.lease_ttl_s,
                                       max_gpus=config.max_gpus, clock=clock, admission=self.admission)
        self.deployments = DeploymentService(self.store, self.supervisor, self.sessions, self.traffic, self.health,
                                             self.ops, self.data_dir, clock)
        self.secrets = SecretStore(self.store, self.data_dir / "secret.key")
        self.volumes = VolumeStore(self.store, self.data_dir / "volumes",
                                   self.deployments.volume_users)
        # the back-edges: what the supervisor noticed reaches the services above it as events
        self.supervisor.on(WorkerStopped, self.sessions.drop_for)
        self.supervisor.on(WorkerCrashed, self.sessions.drop_for)
        self.supervisor.on(WorkerCrashed, lambda ev: self.ops.alert_crash(ev.name, ev.version, ev.pid,
                                                                          ev.exit_code, ev.error))
        self.supervisor.on(WorkerTookOver, lambda ev: self.traffic.forget(ev.name))
        self.supervisor.on(WorkerTookOver, self.health.took_over)
        # workers of a previous gateway process on this data dir keep serving through its death:
        # the ones still running are adopted (and their open sessions kept), the rest cleaned up
        self.supervisor.adopt()
        self.sessions.load()
        self._ops_at = 0.0

    @property
    def url(self) -> Optional[str]:
        """This gateway's own URL once bound (workers fetch declared secrets from it)."""
        return self.supervisor.gateway_url

    @url.setter
    def url(self, value: Optional[str]) -> None:
        self.supervisor.gateway_url = value

    def tick(self, now: float) -> None:
        """One control step at ``now`` (unix s): reconcile the workers (the side workers sessions
        hold are kept), expire leases, start a health round when one is due, and run ops (usage,
        alerts) once a second. Called every 100 ms by app.py; tests call it with their own clock."""
        self.supervisor.reconcile(now, held=set(self.sessions.held()))
        self.sessions.expire(now)
        self.health.check(now)
        if now - self._ops_at >= _OPS_EVERY_S:
            self._ops_at = now
            self.ops.tick(now, self.supervisor.running())

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

    def _key_deployment(self, key_id: str) -> Optional[str]:
        rec = next((k for k in self.keys.list() if k.id == key_id), None)
        return rec.deployment if rec is not None else None

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

    require_scope = staticmethod(require_scope)

    def is_worker_secret(self, token: str) -> bool:
        """Whether ``token`` is the current or launch secret of a worker this gateway runs."""
        known = self.supervisor.secrets() + [r.secret for r in self.store.all() if r.secret]
        return bool(token) and any(hmac.compare_digest(token.encode(), k.encode()) for k in known)

    def account(self, key: KeyRecord) -> dict:
        """Usage and configured limits of this local account. ``balance`` is None: a self-hosted
        gateway meters nothing in money (the hosted service's prepaid balance has no counterpart).
        ``usage.deployments``: per deployment, ``{"total", "today", "captured_bytes"}`` (usage.py:
        worker-seconds by card type, requests, errors, bytes in/out); ``limits.quotas``: the
        account's and this key's limits with what they use (quotas.py). ``usage.benchmarks`` counts
        the benchmarks ``seq eval run`` can name here (the built-in ones), ``usage.evals_running``
        the evals in this data dir still running; a key bound to one deployment sees that deployment only."""
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
                      "sessions": sum(len(self.sessions.of(n)) for n in names),
                      "benchmarks": len(BUILTIN_BENCHMARKS), "evals_running": running,
                      "deployments": self.ops.account_usage(names)},
            "limits": {"lease_ttl_s": self.config.lease_ttl_s, "max_gpus": self.config.max_gpus,
                       "max_body_bytes": self.config.max_body_bytes or MAX_BODY_BYTES,
                       "self_hosted": True,
                       "quotas": [q for q in self.ops.limits_view(self.supervisor.running())["limits"]
                                  if q["scope"] in ("account", f"key:{key.id}")]},
        }

    def close(self) -> None:
        """Stop every worker, close state.db and the JSON log, and let go of the launcher."""
        self.supervisor.stop_all()
        self.store.close()
        logging.getLogger("sequence_ai_server").removeHandler(self._json_log)
        self._json_log.close()
        self.launcher.close()             # a Ray launcher disconnects from its cluster
