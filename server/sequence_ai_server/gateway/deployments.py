"""Deployments and their versions, mixed into the Gateway: deploy (a new version builds beside
the serving one), the kept versions and rollback, start, emergency stop, remove, status, default
params, doctor, logs and the volumes a deployment uses."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import shutil
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from seq.spec import InferParam, ParamError, cast_params

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.logs import read_logs
from sequence_ai_server.gateway.schemas import Deployment, DeployRequest, ParamsUpdate
from sequence_ai_server.gateway.store import DeploymentRow, VersionRow
from sequence_ai_server.gateway.worker_record import KEEP_VERSIONS, Role, _worker_url, worker_key

log = logging.getLogger("sequence_ai_server.gateway")

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class DeploymentService:
    """Deploy, versions, rollback, start/stop/remove, status, params, doctor, logs. Gateway state
    it uses: ``store``, ``workers``, ``sessions``, ``_lock`` and the others set in ``Gateway.__init__``."""

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
        self._check_image(str(path))       # an image= that cannot be built here is refused now
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
            from sequence_ai_server.gateway.halted import spawn_unless_halted   # no worker while stopped (seq policy stop)
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

    def start(self, name: str) -> Deployment:
        """Lift an emergency stop (``seq policy stop``) and start the serving version's worker
        (no-op when one runs); returns the deployment."""
        with self._lock:
            if self.require(name).halted_at:
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
            shutil.rmtree(self.data_dir / "capture" / name, ignore_errors=True)   # kept episodes go too
        log.info("removed %s", name)
        return {"name": name, "removed": True}

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
        trip: transport, decoding, queuing). ``worker`` is null when no worker runs."""
        from types import SimpleNamespace
        from seq.spec import ObservationContract
        from sequence_ai_server.common.errors import new_request_id as _rid
        from sequence_ai_server.worker.host import synthetic_observation
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
