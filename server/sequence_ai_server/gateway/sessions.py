"""The gateway's robot sessions: :class:`SessionRec` (one admitted session: its version, lease
expiry, params), :class:`SessionTable` (``session_id -> SessionRec``, written through to state.db
so a restarted gateway keeps the sessions whose leases robots hold), and :class:`SessionService`,
mixed into the Gateway: connect (slot admission, the waiting line, GPU cap, lease signing),
renew, close, and revocation pushed to the workers when a session ends early."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
import logging
import secrets
import time
from typing import Any, Optional

from seq.spec import InferParam, ParamError, cast_params

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.common.leases import push_revocations, sign_lease
from sequence_ai_server.gateway.schemas import ConnectRequest, ConnectResponse, Lease
from sequence_ai_server.gateway.slots import slots_of
from sequence_ai_server.gateway.store import DeploymentRow
from sequence_ai_server.gateway.worker_record import DEFAULT_LOAD_ESTIMATE_S, Role, _worker_url

log = logging.getLogger("sequence_ai_server.gateway")

from sequence_ai_server.gateway.store import Store

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
    """Connect, renew and close sessions; revocation. Gateway state it uses: ``store``,
    ``workers``, ``sessions``, ``queue``, ``_lock`` and the others set in ``Gateway.__init__``."""

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
        with self._lock:        # check and start as one step: two connects at a limit start one worker
            self._check_gpu_limit(req.model)
            self.check_quota(key, req.model, "connect")     # limits per account / key (quotas.py)
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

    def _drop_sessions(self, name: str) -> None:
        for sid in [s.id for s in self.sessions.values() if s.model == name]:
            self.sessions.pop(sid, None)

    def _expire_sessions(self) -> None:
        now = time.time()
        for sid in [s.id for s in self.sessions.values() if s.expires_at < now]:
            self.sessions.pop(sid, None)
