"""Deployments and their versions, :class:`DeploymentService`: deploy (a new version builds beside
the serving one), the kept versions and rollback, start (``start_unless_stopped``: a stopped
deployment, ``seq policy stop``, runs no worker until ``seq policy start``), emergency stop,
remove, status, default params, secret rotation, doctor, logs and the volumes a deployment uses.
It calls the supervisor, the sessions, traffic, health and ops it is given; none of them calls it."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

from seq.spec import InferParam, ParamError, cast_params

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.logs import read_logs
from sequence_ai_server.common.plain_http import client_options
from sequence_ai_server.gateway.admission import UNCOUNTED, robot_cap
from sequence_ai_server.gateway.health import HealthCheck
from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.gateway.schemas import Deployment, DeployRequest, ParamsUpdate
from sequence_ai_server.gateway.sessions import SessionService
from sequence_ai_server.gateway.store import DeploymentRow, Store, VersionRow
from sequence_ai_server.gateway.supervisor import Supervisor
from sequence_ai_server.gateway.traffic import TrafficService
from sequence_ai_server.gateway.worker_record import KEEP_VERSIONS, Role, _worker_url, _write_secret, worker_key
from sequence_ai_server.ops.service import OpsService

log = logging.getLogger("sequence_ai_server.gateway")

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_DOCTOR_PING_S = 3.0        # doctor's /ping of the worker: past this it reports the worker not answering


class DeploymentService:
    """Deploy, versions, rollback, start/stop/remove, status, params, doctor, logs. Its lock
    orders the changes to one deployment's versions; no worker starts while it is held."""

    def __init__(self, store: Store, supervisor: Supervisor, sessions: SessionService, traffic: TrafficService,
                 health: HealthCheck, ops: OpsService, data_dir: Path, clock: Callable[[], float] = time.time) -> None:
        self.store, self.supervisor, self.sessions, self.traffic = store, supervisor, sessions, traffic
        self.health, self.ops, self.data_dir, self.clock = health, ops, data_dir, clock
        self._lock = threading.RLock()

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
            health=self.health.get(row.name),
        )

    def require(self, name: str) -> DeploymentRow:
        """The row of ``name``; raises ApiError not_found when there is none."""
        return self.store.require(name)

    def check_build_quota(self, key: KeyRecord, name: str) -> None:
        """Raise ApiError quota_exceeded when deploying ``name`` with ``key`` would pass a limit (ops)."""
        self.ops.check_quota(key.id, name, "build", self.supervisor.running(), starts_worker=True)

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
        image = self.supervisor.image_of(str(path))   # an image= that cannot be built here is refused now
        if image:
            self.supervisor.launcher.check_image(image)
        now = self.clock()
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
            beside = old is not None and old.status == "ready" and self.supervisor.get(name) is not None
            if not beside:
                self.supervisor.stop(name)
                epoch, load_s, created = (0, None, now) if old is None else (old.epoch, old.load_s, old.created_at)
                self.store.insert(DeploymentRow(
                    name=name, version=version, file=str(path), class_name=class_name, file_sha=sha,
                    status="starting", phase="spawning", epoch=epoch, load_s=load_s, created_at=created, updated_at=now,
                    defaults=dict(old.defaults) if old else {},
                    halted_at=old.halted_at if old else None,   # a redeploy does not lift a stop
                ))
        if beside:      # the build's process starts with no lock held
            self.supervisor.start_build(name, str(path), class_name, version, source or path, sha,
                                        {"version": version, "status": "building", "phase": "spawning", "started_at": now})
            if version == old.version:
                log.info("%s: the same file again (v%d, no new version): a fresh worker of it starts "
                         "beside the serving one", name, version)
            else:
                log.info("building %s v%d beside the serving v%d", name, version, old.version)
        else:
            self.start_unless_stopped(name)     # no worker while stopped (seq policy stop)
        return self.describe(self.require(name))

    def start_unless_stopped(self, name: str) -> bool:
        """Start ``name``'s serving worker unless the deployment is stopped (``seq policy stop``);
        a stopped one keeps status/phase ``stopped`` (its new version serves at ``start``).
        Returns True when a worker was started. Raises ApiError as ``Supervisor.start_serving``."""
        row = self.store.get(name)
        if row is not None and row.halted_at:
            self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
            log.info("%s: v%s recorded; it is stopped, so no worker starts until `seq policy start %s`",
                     name, row.version, name)
            return False
        return self.supervisor.start_serving(name)


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
                                class_name=class_name, file_sha=sha, status="building", created_at=self.clock()))
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

    def start(self, name: str) -> Deployment:
        """Lift an emergency stop (``seq policy stop``) and start the serving version's worker
        (no-op when one runs); returns the deployment."""
        with self._lock:
            if self.require(name).halted_at:
                self.store.update(name, halted_at=None)
                log.info("%s: stop lifted; robots may connect again", name)
        w = self.supervisor.get(name)
        if not (w is not None and w.proc.poll() is None):
            self.supervisor.start_serving(name)
        return self.describe(self.require(name))

    def remove(self, name: str, force: bool = False) -> dict:
        """Delete a deployment, its versions and snapshots. Refused (invalid_request) while its
        worker runs or robots hold sessions, unless ``force`` (which stops it first)."""
        with self._lock:
            row = self.require(name)
            held = len(self.sessions.of(name))
            running = (self.supervisor.busy(name) or self.supervisor.busy(worker_key(Role.BUILD, name))
                       or bool(self.supervisor.of(Role.SIDE, name)))
            if (held or running) and not force:
                raise ApiError("invalid_request",
                               f"{name} is {'serving ' + str(held) + ' session(s)' if held else row.status}; not removed",
                               hint=f"stop it first (`seq policy stop {name}`) or pass --force")
            self.supervisor.stop(worker_key(Role.BUILD, name))
            self.supervisor.stop(name)
            self.supervisor.stop_sides(name)
            self.traffic.forget(name)
            self.sessions.drop_for(name)
            self.store.delete(name)
            shutil.rmtree(self.data_dir / "versions" / name, ignore_errors=True)
            shutil.rmtree(self.data_dir / "capture" / name, ignore_errors=True)   # kept episodes go too
        log.info("removed %s", name)
        return {"name": name, "removed": True}

    def status(self, name: str) -> Deployment:
        """The deployment, with ``sessions``: each connected robot's session, its version and the
        params it runs with (its own over the deployment defaults, as of its last lease renewal:
        the client switches to new ones at its next episode)."""
        self.supervisor.poll(name)
        d = self.describe(self.require(name))
        self.sessions.expire(self.clock())
        d.sessions = [{"session_id": x.id, "key_id": x.key_id, "version": x.version, "params": dict(x.params),
                       "own_params": dict(x.requested), "connected_at": x.created_at,
                       "lease_expires_at": x.expires_at, "worker": x.side or name} for x in self.sessions.of(name)]
        d.workers = self._workers_view(self.require(name), self.sessions.sessions_by_worker(name))
        return d

    def _workers_view(self, row: DeploymentRow, on: dict[str, list]) -> list[dict]:
        """Each worker serving ``row``'s serving version: ``{"worker": key, "pid", "version",
        "url", "ready", "cards": [index, ...] ([] for a CPU worker), "node": the cluster machine
        its launcher placed it on (a Ray node id; None for a worker on this machine), "slots":
        {"used", "total"}, "robots": [session id, ...]}``, plus what admission knows of it (admission.py
        ``Admission.view``: ``cost``, ``mean_batch``, ``act_p99_ms``, ``robot_p99_ms``, ``admission``), ``jammed``
        (when the health check last retired a jammed worker under this key), and ``"max_workers"``
        on the first (the fleet's cap; None: no cap of its own). ``on``: the sessions each
        worker holds (``SessionService.sessions_by_worker``)."""
        from sequence_ai_server.gateway.fleet import NO_CAP
        from sequence_ai_server.gateway.slots import slots_of
        try:
            claims = [] if self.supervisor.launcher.places_cards else self.ops.cards.pool.claims()
        except Exception:  # noqa: BLE001 - no card inventory readable: the view shows none
            claims = []
        per = slots_of(row.spec)
        out = []
        for key, w in self.supervisor.fleets.of(row.name).items():
            first = key == row.name
            port = row.worker_port if first else w.port
            host = row.worker_host if first else w.host
            ready = (row.status == "ready") if first else bool(w.port)
            robots = [x.id for x in on.get(key, [])]
            cards = sorted({i for c in claims if c.worker == key or (c.pid and c.pid == w.proc.pid) for i in c.cards})
            out.append({"worker": key, "pid": w.proc.pid, "version": w.version, "ready": ready,
                        "url": f"http://{host or '127.0.0.1'}:{port}" if ready and port else None,
                        "cards": cards, "node": w.node, "slots": {"used": len(robots), "total": _robot_slots(w.spec or row.spec, per)},
                        "robots": robots,
                        **self.sessions.admission.view(key, w.proc.pid, w.spec or row.spec,
                                                       [x.rate_hz for x in on.get(key, [])], robots),
                        "jammed": self.health.others_jammed.get(key)})
        if out:
            cap = self.supervisor.fleets.cap(row)
            out[0]["max_workers"] = None if cap >= NO_CAP else cap
        return out

    def stop(self, name: str) -> Deployment:
        """Emergency stop: every serving worker of ``name`` (side versions too) ends now, its
        sessions are dropped (a robot's next /act finds no worker and its reconnect is refused),
        and every connect is refused with ``deployment_stopped`` until ``start``."""
        with self._lock:
            self.require(name)
            self.store.update(name, halted_at=self.clock())     # first: a worker starting now is not kept
            self.supervisor.stop(name)
            self.supervisor.stop_sides(name)
            self.sessions.drop_for(name)
            self.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
        log.warning("%s: emergency stop; connects are refused until `seq policy start %s`", name, name)
        return self.describe(self.require(name))

    def params(self, name: str) -> dict:
        """``{"name", "defaults": {k: v}, "declared": [param dicts]}``."""
        row = self.require(name)
        spec = row.spec if row.spec is not None else {}
        return {"name": name, "defaults": dict(row.defaults),
                "declared": spec.get("params", [])}

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

    def doctor(self, name: str) -> dict:
        """Diagnose ``name`` without starting anything: state, serving version, the running worker's
        /ping (status, ms) and one synthetic /act (declared-shape black frames and zero vectors) split
        into ``handler_ms`` (the worker's inference_ms) and ``network_ms`` (the rest of the round
        trip: transport, decoding, queuing). ``worker`` is null when no worker runs. A worker that
        does not answer /ping within ``_DOCTOR_PING_S`` is reported ``not_answering`` (no /act sent)."""
        from types import SimpleNamespace
        from seq.spec import ObservationContract
        from sequence_ai_server.common.errors import new_request_id as _rid
        from sequence_ai_server.worker.host import synthetic_observation
        row = self.require(name)
        out: dict[str, Any] = {"name": name, "status": row.status, "phase": row.phase, "version": row.version,
                               "error": row.error, "sessions": len(self.sessions.of(name)),
                               "worker": None}
        if row.status != "ready" or not row.worker_port:
            return out
        url = _worker_url(row)
        worker: dict[str, Any] = {"url": url, "pid": row.worker_pid}
        with httpx.Client(timeout=30.0, **client_options(url)) as http:
            t0 = time.perf_counter()
            try:   # a healthy worker answers /ping in ms; a frozen one must not hold doctor up
                r = http.get(f"{url}/ping", timeout=_DOCTOR_PING_S)
                worker["ping"] = {"status": r.status_code, "ms": round((time.perf_counter() - t0) * 1000, 3)}
                with contextlib.suppress(ValueError, AttributeError):
                    body = r.json()
                    worker["ping"].update(state=body.get("status"), oldest_request_s=body.get("oldest_request_s"))
            except httpx.HTTPError as exc:
                worker["ping"] = {"status": None, "state": "not_answering", "ms": round((time.perf_counter() - t0) * 1000, 3),
                                  "error": f"not answering: no /ping answer within {_DOCTOR_PING_S:g} s "
                                           f"({type(exc).__name__}; the process may be frozen)"}
            out["health"] = self.health.get(name)
            if worker["ping"].get("state") in ("degraded", "not_answering"):   # jammed or frozen: an /act would only queue
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

    def build_log(self, name: str, offset: int = 0) -> dict:
        """``{"name", "text", "offset", "size"}``: ``name``'s image build output (envs.py) from
        byte ``offset`` (at most 1 MiB; ``offset`` is where to ask next; ``size`` the whole
        log's). not_found when neither the deployment nor a build log exists; invalid_request
        for a negative offset."""
        path = self.data_dir / "logs" / f"{name}.build.log"
        if not path.exists():
            self.require(name)
        if offset < 0:
            raise ApiError("invalid_request", f"offset must be >= 0, got {offset}", hint="start at 0")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(min(offset, size))
                chunk = f.read(1 << 20)
        except FileNotFoundError:
            size, chunk = 0, b""
        return {"name": name, "text": chunk.decode(errors="replace"), "offset": min(offset, size) + len(chunk),
                "size": size}

    def rotate_secret(self, name: str) -> dict:
        """Give the running worker a new secret: every lease token signed with the old one answers
        401 at the worker and its client reconnects. Sessions stay open. ``{"name", "rotated_at"}``
        (unix s); raises ApiError not_found."""
        with self._lock:
            self.require(name)
            secret = secrets.token_urlsafe(32)
            self.store.update(name, secret=secret)
            if not self.supervisor.set_secret(name, secret):
                _write_secret(self.data_dir / "run" / f"{name}.secret", secret)
        log.info("rotated the direct secret of %s", name)
        return {"name": name, "rotated_at": self.clock()}


def _robot_slots(spec: Optional[dict], per: int) -> int:
    """The robots one worker takes, as status shows them: ``max_inputs`` where the policy declares
    it (the admission cap), else its replicas' slots."""
    cap = robot_cap(spec)
    return per if cap >= UNCOUNTED else cap
