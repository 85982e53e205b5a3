"""The gateway's robot sessions: :class:`SessionRec` (one admitted session: its version, lease
expiry, params), :class:`SessionTable` (``session_id -> SessionRec``, written through to state.db
so a restarted gateway keeps the sessions whose leases robots hold), and :class:`SessionService`:
connect (version pick, slot admission, the waiting line, GPU cap, lease signing), renew, close,
expiry on the control tick, and revocation pushed to the workers when a session ends early. It
owns the session table, the waiting line and its lock; it calls the supervisor, traffic, health
and ops services it is given, never the other way round (a stopped or crashed worker reaches it
as a supervisor event, ``drop_for``)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
import logging
import secrets
import threading
import time
from typing import Any, Callable, Optional, Union

from seq.spec import InferParam, ParamError, cast_params

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.leases import RevocationList, push_revocations, sign_lease
from sequence_ai_server.gateway.admission import DEADLINE_SHARE, Admission, request_hz, start_after
from sequence_ai_server.gateway.events import WorkerCrashed, WorkerStopped
from sequence_ai_server.gateway.health import HealthCheck
from sequence_ai_server.gateway.keys import KeyRecord, require_scope
from sequence_ai_server.gateway.schemas import ConnectRequest, ConnectResponse, Lease
from sequence_ai_server.gateway.slots import SlotQueue
from sequence_ai_server.gateway.store import DeploymentRow, Store
from sequence_ai_server.gateway.supervisor import Supervisor
from sequence_ai_server.gateway.traffic import TrafficService
from sequence_ai_server.gateway.worker_record import (DEFAULT_LOAD_ESTIMATE_S, EXTRA_MARK, Role, WorkerRecord, _worker_url,
                                                      worker_key)
from sequence_ai_server.ops.service import OpsService

log = logging.getLogger("sequence_ai_server.gateway")

__all__ = ["SessionRec", "SessionTable", "SessionService"]


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
    rate_hz: Optional[float] = None   # its requests/s as admission counts it (admission.request_hz); None: unknown


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


class SessionService:
    """Connect, renew, close and expire sessions; revocation.

    ``lease_ttl_s``: how long a lease lasts (s); ``max_gpus``: the most workers that may run at once
    (None: no cap); ``clock``: unix s."""

    def __init__(self, store: Store, supervisor: Supervisor, traffic: TrafficService, health: HealthCheck,
                 ops: OpsService, *, data_dir: Any, lease_ttl_s: float, max_gpus: Optional[int] = None,
                 clock: Callable[[], float] = time.time, admission: Optional[Admission] = None) -> None:
        self.store, self.supervisor, self.traffic, self.health, self.ops = store, supervisor, traffic, health, ops
        self.admission = admission or Admission()    # the workers' cost curves and the deadline check (admission.py)
        self.data_dir, self.lease_ttl_s, self.max_gpus, self.clock = data_dir, lease_ttl_s, max_gpus, clock
        self.table: dict[str, SessionRec] = SessionTable(store)   # persisted: survives a restart
        self.revoked = RevocationList()              # sessions ended early; workers refuse their tokens (leases.py)
        self.queue = SlotQueue()                     # robots waiting for a slot (slots.py)
        self._closed_s: list[float] = []             # lengths of recent closed sessions (queue estimate)
        self._lock = threading.RLock()

    def load(self) -> None:
        """At start, after the supervisor adopted its workers: keep the stored sessions whose
        lease still runs on a worker that is still there (same epoch), drop the rest."""
        now = self.clock()
        with self._lock:
            for sess in self.table.load():
                row = self.store.get(sess.model)
                if sess.side:
                    alive = self.supervisor.get(sess.side) is not None
                else:
                    alive = (row is not None and row.status == "ready" and row.epoch == sess.epoch
                             and self.supervisor.get(sess.model) is not None)
                if sess.expires_at < now or not alive:
                    self.table.pop(sess.id, None)

    # -- views
    def of(self, name: str) -> list[SessionRec]:
        """The open sessions of deployment ``name``, oldest first."""
        with self._lock:
            return sorted((s for s in self.table.values() if s.model == name), key=lambda s: s.created_at)

    def held(self) -> dict[str, int]:
        """Open sessions per worker key (``name`` for the serving worker, ``name@vN`` for a side one)."""
        out: dict[str, int] = {}
        with self._lock:
            for s in self.table.values():
                k = s.side or s.model
                out[k] = out.get(k, 0) + 1
        return out

    # -- connect
    def ready_or_warming(self, model: str, key: Optional[KeyRecord] = None, quota: bool = False) -> DeploymentRow:
        """The deployment row once its worker serves; starts a stopped one (with ``quota``, checking
        the limits of the account and of ``key`` with the start, as one step: two connects at a
        limit start one worker). Raises ApiError not_found, deployment_stopped, worker_failed (last start
        failed), gpu_limit_reached (a start would pass $SEQ_MAX_GPUS), quota_exceeded, or warming
        (503 + Retry-After in s, estimated from the last measured load, else 30 s)."""
        row = self.store.require(model)
        row.refuse_if_stopped()
        self.supervisor.poll(model)
        row = self.store.require(model)
        if row.status == "failed" and not row.served:
            raise ApiError("worker_failed", f"deployment {model!r} failed to start: {row.error}",
                           details=row.details, hint=f"fix the policy, then `seq deploy {row.file} --name {model}`; "
                                                     f"the log is {self.data_dir / 'logs' / (model + '.log')}")
        if row.status in ("stopped", "failed"):
            key_id = key.id if key else None
            admit = (lambda running: self.ops.check_quota(key_id, model, "connect", running, starts_worker=True)) \
                if quota else None
            self.supervisor.start_serving(model, max_workers=self.max_gpus, admit=admit)
            row = self.store.require(model)
        now = self.clock()
        self.supervisor.touch(model, now)
        self.health.refuse_if_jammed(model, row)
        if row.status == "starting":
            estimate = row.load_s or DEFAULT_LOAD_ESTIMATE_S
            elapsed = now - (row.started_at or now)
            remaining = max(1.0, estimate - elapsed)
            raise ApiError("warming", f"deployment {model!r} is starting ({row.phase}); about {remaining:.0f} s left",
                           retry_after_s=round(remaining, 1),
                           details={"phase": row.phase, "elapsed_s": round(elapsed, 1), "estimate_s": estimate},
                           hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")
        return row

    def _lease(self, row: DeploymentRow, sess: SessionRec) -> ConnectResponse:
        spec = row.spec if row.spec is not None else {"contract": {"action": None, "observation": None}}
        period_ms = 1000.0 / sess.rate_hz if sess.rate_hz else None   # the worker's floor for its period_ms
        token = sign_lease(row.secret, sess.id, sess.epoch, sess.expires_at, period_ms)
        return ConnectResponse(
            session_id=sess.id, worker_url=_worker_url(row), direct_secret=token,
            lease=Lease(ttl_s=self.lease_ttl_s, expires_at=sess.expires_at, epoch=sess.epoch),
            contract=spec["contract"], params=sess.params, version=sess.version,
        )

    def _new(self, req: ConnectRequest, key: Optional[KeyRecord], row: DeploymentRow, side: str = "") -> SessionRec:
        now = self.clock()
        params = self._session_params(row, req.params)
        return SessionRec(id="sess_" + secrets.token_hex(8), model=req.model, key_id=key.id if key else "",
                          epoch=row.epoch, version=row.version, params=params,
                          created_at=now, expires_at=now + self.lease_ttl_s, requested=dict(req.params or {}), side=side,
                          rate_hz=request_hz(row.spec, params, req.request_hz))

    def connect(self, req: ConnectRequest, key: Optional[KeyRecord] = None) -> ConnectResponse:
        """Admit a session: pick its version (a pin, the traffic split, else the serving one), make
        sure that version's worker serves, cast params, sign a lease token (the direct secret).
        Raises ApiError as ``ready_or_warming`` does, plus unauthorized (a key bound elsewhere),
        quota_exceeded, invalid_request (params), queued / deployment_full / queue_timeout (slots)."""
        if key is not None:
            require_scope(key, req.model)
        current = self.store.require(req.model)
        current.refuse_if_stopped()
        version, split = self.traffic.pick_version(current, key)   # a traffic split or a pin may pick another version
        if version != current.version:
            side = self._connect_on_version(req, key, version, split)
            if side is not None:
                return side
        self.ops.check_quota(key.id if key else None, req.model, "connect", self.supervisor.running(),
                             starts_worker=not self.supervisor.busy(req.model))   # limits per account / key (quotas.py)
        row = self._others_with_room(current, req) or self.ready_or_warming(req.model, key, quota=True)
        spec = row.spec if row.spec is not None else {"contract": {"action": None, "observation": None}, "params": []}
        rate = request_hz(spec, self._session_params(row, req.params), req.request_hz)
        if self._grow_if_full(row, spec, key, rate):
            raise self._growing(row)
        with self._lock:
            self.expire(self.clock())
            fleet = self._fleet_rows(row)
            rooms, reason = self._rooms(row.name, fleet, rate)
            wk, row = next(((k, r) for k, r in fleet if rooms[k] > 0), fleet[0])
            held = sum(len(v) for v in self._rates_on(fleet).values())
            # Robots are counted (max_inputs or the slots, and the deadline check once measured)
            # only for a policy that declares @seq.concurrent: the client opens a new session on
            # every reconnect (rotation, lease expiry) without naming its old one, which would
            # otherwise queue a lone robot behind its own stale session.
            if spec.get("concurrency"):
                mean_s = sum(self._closed_s) / len(self._closed_s) if self._closed_s else self.lease_ttl_s
                self.queue.admit(req.model, key.id if key else "", req.ticket, capacity=held + sum(rooms.values()),
                                 held=held, on_full=spec.get("on_full") or "queue",
                                 queue_timeout_s=float(spec.get("queue_timeout_s") or 120.0), mean_session_s=mean_s,
                                 reason=reason["text"] if reason else None,
                                 extra={"admission": reason["numbers"]} if reason else None)
            sess = self._new(req, key, row, side="" if wk == req.model else wk)
            self.table[sess.id] = sess
            if split is not None:
                self.traffic.admitted(req.model, split, sess.version)
        if sess.side:
            self.supervisor.touch(sess.side, self.clock())
        log.info("admitted %s on v%d (worker %s)", sess.id, sess.version, wk,
                 extra={"deployment": req.model, "version": sess.version})
        return self._lease(row, sess)

    # -- a deployment's several serving workers (its fleet: ``name``, then ``name#N``)
    def _fleet_rows(self, row: DeploymentRow) -> list[tuple[str, DeploymentRow]]:
        """``[(worker key, row as a session there sees it)]`` of the ready workers serving
        ``row``'s serving version, its first worker first (when it serves)."""
        out = []
        for k, w in self.supervisor.fleets.of(row.name).items():
            if k == row.name:
                if row.status == "ready":
                    out.append((k, row))
            elif w.port and w.proc.poll() is None and w.version == row.version:
                out.append((k, self._side_row(row, w)))
        return out or [(row.name, row)]

    def _held_on(self, fleet: list[tuple[str, DeploymentRow]]) -> dict[str, int]:
        """Open sessions per worker of ``fleet`` (``_fleet_rows``), counting only those of the
        worker's current epoch (a session of a replaced worker holds no slot on its successor)."""
        return {k: len(v) for k, v in self._robots_on(fleet).items()}

    def _robots_on(self, fleet: list[tuple[str, DeploymentRow]]) -> dict[str, list[str]]:
        return {k: [s.id for s in v] for k, v in self._sessions_on(fleet).items()}

    def _sessions_on(self, fleet: list[tuple[str, DeploymentRow]]) -> dict[str, list[SessionRec]]:
        epochs = dict((k, r.epoch) for k, r in fleet)
        out: dict[str, list[SessionRec]] = {}
        with self._lock:
            for s in sorted(self.table.values(), key=lambda s: s.created_at):
                k = s.side or s.model
                if epochs.get(k) == s.epoch:
                    out.setdefault(k, []).append(s)
        return out

    def _rates_on(self, fleet: list[tuple[str, DeploymentRow]]) -> dict[str, list[Optional[float]]]:
        """The request rates (requests/s; None unknown) of the robots each worker of ``fleet`` holds."""
        return {k: [s.rate_hz for s in v] for k, v in self._sessions_on(fleet).items()}

    def _pid_of(self, name: str, key: str) -> Optional[int]:
        w = self.supervisor.fleets.of(name).get(key)
        return w.proc.pid if w is not None else None

    def _rooms(self, name: str, fleet: list[tuple[str, DeploymentRow]],
               rate: Optional[float]) -> tuple[dict[str, int], Optional[dict]]:
        """``({worker key: robots at ``rate`` it admits now}, why none does)``. The why (``{"text", "numbers"}``) names the least loaded
        worker's prediction with the robot added; None when a worker admits or slot counting
        refused (SlotQueue then says the slots are taken)."""
        rates = self._rates_on(fleet)
        rooms: dict[str, int] = {}
        best = None
        # a worker that has measured nothing yet (just started) is predicted with its siblings' curve
        like = self.admission.fleet_curve([(k, self._pid_of(name, k)) for k, _ in fleet])
        for k, r in fleet:
            pid = self._pid_of(name, k)
            rooms[k] = self.admission.room(k, pid, r.spec, rates.get(k, []), rate, like)
            ok, load = self.admission.admits(k, pid, r.spec, rates.get(k, []), rate, like)
            if not ok and load is not None and (best is None or load.worst_ms < best[1].worst_ms):
                best = (k, load)
        if any(rooms.values()) or best is None:
            return rooms, None
        k, load = best
        text = (f"another robot at {rate:.3g} requests/s would make the robots of worker {k} late: with it "
                f"{load.robots} robots ask {load.rate_hz:.3g} requests/s, a predicted worst round trip of "
                f"{load.worst_ms:.0f} ms, over {DEADLINE_SHARE:.0%} of the shortest deadline ({load.deadline_ms:.0f} ms), "
                f"predicted utilisation {load.utilisation:.0%}")
        return rooms, {"text": text, "numbers": {"worker": k, **load.to_dict()}}

    def robots_by_worker(self, name: str) -> dict[str, list[str]]:
        """``{worker key: [session id, ...]}``: the robots each worker serving ``name``'s serving
        version holds now (its first worker ``name``, the others ``name#N``)."""
        return {k: [s.id for s in v] for k, v in self.sessions_by_worker(name).items()}

    def sessions_by_worker(self, name: str) -> dict[str, list[SessionRec]]:
        """``robots_by_worker`` with the session records."""
        row = self.store.require(name)
        return self._sessions_on([(k, r) for k, r in self._fleet_rows(row)] +
                                 [(k, self._side_row(row, w)) for k, w in self.supervisor.fleets.of(name).items()
                                  if k != name and not w.port])

    def _others_with_room(self, row: DeploymentRow, req: ConnectRequest) -> Optional[DeploymentRow]:
        """``row`` when its first worker does not serve but another ready one admits the robot (a
        crash of the first one): the robot lands there without waiting for a restart."""
        if row.status == "ready" or not row.served or not (row.spec or {}).get("concurrency"):
            return None
        self.supervisor.poll(row.name)
        others = [(k, r) for k, r in self._fleet_rows(row) if k != row.name]
        rate = request_hz(row.spec, self._session_params(row, req.params), req.request_hz)
        return row if any(self._rooms(row.name, others, rate)[0].values()) else None

    def _grow_if_full(self, row: DeploymentRow, spec: dict, key: Optional[KeyRecord], rate: Optional[float]) -> bool:
        """When no ready worker of ``row`` admits a robot at ``rate`` (its slots, max_inputs or
        deadlines: admission.py), start another worker (up to the fleet's cap, the free cards
        and $SEQ_MAX_GPUS); True when one is starting now, so the robot is told to retry
        (warming) rather than queued. When one admits it but every worker holds its
        target_inputs (default: its slots), another starts beside them and this returns False.
        A policy without ``@seq.concurrent`` counts no robots: False."""
        if not spec.get("concurrency"):
            return False
        with self._lock:
            self.expire(self.clock())
            fleet = self._fleet_rows(row)
            rooms, _ = self._rooms(row.name, fleet, rate)
            held = self._held_on(fleet)
            busy = all(held.get(k, 0) >= start_after(r.spec) for k, r in fleet)
            if any(rooms.values()) and not busy:
                return False
        loading = any(w.port is None for k, w in self.supervisor.fleets.of(row.name).items() if k != row.name)
        if loading:
            return not any(rooms.values())          # one is loading already
        key_id = key.id if key else None
        try:
            w = self.supervisor.fleets.start(
                row.name, max_workers=self.max_gpus,
                admit=lambda running: self.ops.check_quota(key_id, row.name, "connect", running, starts_worker=True))
        except ApiError as exc:
            if exc.code in ("gpu_limit_reached", "gpu_busy", "gpu_low_stock", "deployment_full", "quota_exceeded"):
                log.info("%s: no worker admits another robot and no other worker may start: %s", row.name, exc.detail)
                return False
            raise
        return w is not None and not any(rooms.values())

    def _growing(self, row: DeploymentRow) -> ApiError:
        """The retryable answer while another worker of ``row`` loads for a robot that found every slot taken."""
        estimate = row.load_s or DEFAULT_LOAD_ESTIMATE_S
        return ApiError("warming", f"every slot of {row.name!r} is taken; another worker is starting, about "
                        f"{estimate:.0f} s", retry_after_s=round(max(1.0, min(estimate, 5.0)), 1),
                        details={"phase": "loading", "estimate_s": estimate, "workers": self.supervisor.fleets.size(row.name)},
                        hint="retry after Retry-After seconds (run()/act() wait this out before their first action)")

    @staticmethod
    def _side_row(row: DeploymentRow, w: WorkerRecord) -> DeploymentRow:
        """``row`` as seen by a session on side worker ``w`` (its port, secret, epoch and spec)."""
        return row.replace(status="ready", worker_port=w.port, worker_host=w.host, secret=w.secret, epoch=w.epoch,
                           version=w.version, spec=w.spec or row.spec)

    def _connect_on_version(self, req: ConnectRequest, key: Optional[KeyRecord], version: int,
                            split: Optional[dict[int, float]]) -> Optional[ConnectResponse]:
        """Admit a session on a version other than the serving one (its side worker); None when
        ``version`` turned out to be the serving one. Raises ApiError warming while that version's
        worker loads (it is started here if needed) and worker_failed once when it failed to load."""
        name = req.model
        sk = worker_key(Role.SIDE, name, version)
        row = self.store.require(name)
        if version == row.version:
            return None
        w = self.supervisor.poll(sk)
        if w is None and not self.supervisor.busy(sk):
            failed = self.supervisor.side_failed.pop(sk, None)
            if failed is not None:
                raise ApiError("worker_failed", f"v{version} of {name!r} failed to start: {failed['error']}",
                               details=failed.get("details"),
                               hint=f"`seq policy traffic {name} --clear` sends new sessions to the serving version; "
                                    f"the log is {self.data_dir / 'logs' / (name + '.log')}")
            w = self.supervisor.start_side(name, version, max_workers=self.max_gpus)
        now = self.clock()
        self.supervisor.touch(sk, now)
        if w is None or not w.port:
            kept = self.store.kept(name).get(version)
            estimate = (kept.load_s if kept else None) or row.load_s or DEFAULT_LOAD_ESTIMATE_S
            elapsed = now - (w.started_at if w is not None else now)
            remaining = max(1.0, estimate - elapsed)
            raise ApiError("warming", f"v{version} of {name!r} is starting for its traffic share; about {remaining:.0f} s left",
                           retry_after_s=round(remaining, 1),
                           details={"phase": "loading", "version": version, "elapsed_s": round(elapsed, 1),
                                    "estimate_s": estimate},
                           hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")
        srow = self._side_row(row, w)
        sess = self._new(req, key, srow, side=sk)
        with self._lock:
            self.expire(now)
            self.table[sess.id] = sess
            if split is not None:
                self.traffic.admitted(name, split, version)
        log.info("admitted %s on v%d (side worker)", sess.id, version, extra={"deployment": name, "version": version})
        return self._lease(srow, sess)

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

    def _session(self, session_id: str, key: Optional[KeyRecord]) -> SessionRec:
        """The open session ``session_id`` as ``key`` may see it: an account key any session, a
        robot key only the sessions it opened itself (another robot's is not_found, as unknown)."""
        sess = self.table.get(session_id)
        if sess is None or (key is not None and key.deployment is not None and key.id != sess.key_id):
            raise ApiError("not_found", f"no open session {session_id!r}",
                           hint="it was closed or its lease ran out; connect again (POST /v1/connect)")
        return sess

    def renew(self, session_id: str, key: Optional[KeyRecord] = None) -> ConnectResponse:
        """Extend a live lease by ttl_s (same session, same version). A lease that ran out, or one
        from a worker that has since restarted, is 401 lease_expired: the client connects again.
        The session's worker is reconciled first (as a connect does): a robot renews right after
        its connection was refused, usually before the control tick has seen the worker exit."""
        held = self.table.get(session_id)
        if held is not None:
            self.supervisor.poll(held.side or held.model)
        with self._lock:
            sess = self.table.get(session_id)
            if sess is not None:
                self._session(session_id, key)
            now = self.clock()
            row = self.store.get(sess.model) if sess else None
            if row is not None and sess is not None and sess.side:    # a split/pinned version: its own worker
                w = self.supervisor.get(sess.side)
                row = self._side_row(row, w) if w is not None and w.port and w.proc.poll() is None else None
            if sess is None or now > sess.expires_at or row is None or row.status != "ready" or row.epoch != sess.epoch:
                if sess is not None:
                    self.table.pop(session_id, None)
                raise ApiError("lease_expired", f"the lease of session {session_id!r} is no longer valid",
                               hint="connect again (POST /v1/connect) for a new session and lease")
            sess.expires_at = now + self.lease_ttl_s
            self.supervisor.touch(sess.model, now)
            if sess.side:
                self.supervisor.touch(sess.side, now)
            with contextlib.suppress(ApiError):   # defaults changed since: the robot gets them now
                sess.params = self._session_params(row, sess.requested)
            self.table[session_id] = sess         # stores the new expiry (SessionTable)
            return self._lease(row, sess)

    def close_session(self, session_id: str, key: Optional[KeyRecord] = None) -> dict:
        """End a session at once (frees its slot). Closing an unknown or already-closed one is a no-op.
        A queued robot's ticket (``q_…``) closes its place in line the same way."""
        with self._lock:
            sess = self.table.get(session_id)
            if sess is None:
                left = self.queue.leave(session_id, key.id if key else "")
                return {"session_id": session_id, "closed": left}
            self._session(session_id, key)
            self.table.pop(session_id, None)
            now = self.clock()
            self.supervisor.touch(sess.model, now)
            self._closed_s = (self._closed_s + [now - sess.created_at])[-50:]
        self._revoke([sess])
        return {"session_id": session_id, "closed": True}

    # -- revocation: an ended session's lease tokens stop working at its worker at once (leases.py)
    def end_key_sessions(self, key_id: str) -> int:
        """End every session admitted with key ``key_id`` (the key was revoked); -> how many."""
        with self._lock:
            ended = [s for s in self.table.values() if s.key_id == key_id]
            for s in ended:
                self.table.pop(s.id, None)
        self._revoke(ended)
        return len(ended)

    def _revoke(self, ended: list) -> None:
        """Record ``ended`` sessions as revoked and push that to the workers holding them before
        returning (at most ~1 s); a worker the push misses learns it from its 1 s poll."""
        if not ended:
            return
        entries = {s.id: s.expires_at for s in ended}
        self.revoked.add(entries)
        targets = []
        for s in ended:
            row = self.store.get(s.model)
            w = self.supervisor.get(s.side) if s.side else None
            if w is not None and w.port:
                targets.append((f"http://{w.host or '127.0.0.1'}:{w.port}", w.secret))
            elif not s.side and row is not None and row.worker_port:
                targets.append((_worker_url(row), row.secret))
        push_revocations(targets, entries)

    def drop_for(self, what: Union[str, WorkerStopped, WorkerCrashed]) -> None:
        """Drop every session of a deployment (its name), or those of the worker a supervisor
        event says stopped or crashed: its first serving worker's (the sessions on its other
        workers, ``name#N``, stay), or, when the first one still runs, the crashed other one's."""
        name = what if isinstance(what, str) else what.name
        mine = (lambda s: True) if isinstance(what, str) else (lambda s: not s.side.startswith(name + EXTRA_MARK))
        first = self.supervisor.get(name)
        if not isinstance(what, str) and first is not None and first.proc.pid != what.pid:
            self.expire(self.clock())     # another worker of the fleet ended: only its own sessions go
            return
        with self._lock:
            for sid in [s.id for s in self.table.values() if s.model == name and mine(s)]:
                self.table.pop(sid, None)

    def expire(self, now: float) -> None:
        """Drop the sessions whose lease ran out before ``now`` (unix s), and those on another
        worker of a fleet (``name#N``) that is gone or was replaced (another epoch under its
        key): a worker that dies takes its own robots only."""
        def gone(s: SessionRec) -> bool:
            w = self.supervisor.get(s.side) if EXTRA_MARK in s.side else None
            return EXTRA_MARK in s.side and (w is None or w.epoch != s.epoch)
        with self._lock:
            for sid in [s.id for s in self.table.values() if s.expires_at < now or gone(s)]:
                self.table.pop(sid, None)
