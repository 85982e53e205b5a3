"""Traffic between a deployment's versions, mixed into the Gateway: which version a new session
starts on (a key pin, the canary split, else the serving version), the side workers that serve
the other versions (started, polled, reaped when no split or pin needs them), and the traffic
view and update behind ``/v1/deployments/{name}/traffic``. The split arithmetic is traffic.py's."""
from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Optional

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.gateway.schemas import ConnectRequest, ConnectResponse, TrafficUpdate
from sequence_ai_server.gateway.sessions import SessionRec
from sequence_ai_server.gateway.store import DeploymentRow, VersionRow
from sequence_ai_server.gateway.traffic import TrafficError, parse_split, parse_version
from sequence_ai_server.gateway.worker_record import (DEFAULT_IDLE_TIMEOUT_S, DEFAULT_LOAD_ESTIMATE_S, SIDE_MARK, Role, WorkerProc, _exit_reason, _log_tail, _ready_host, worker_key)

log = logging.getLogger("sequence_ai_server.gateway")


class TrafficRouting:
    """Version routing and side workers. Gateway state it uses: ``store``, ``workers``,
    ``sessions``, ``traffic``, ``_side_failed``, ``_lock`` and the others set in ``Gateway.__init__``."""

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
            ready = w.ready_report() if w.port is None else None
            if ready:
                w.port = int(ready["port"])
                w.host = _ready_host(ready)
                w.spec = ready.get("spec") or w.spec
                log.info("%s v%d (side) is ready on port %d after %.2fs", w.name, w.version, w.port,
                         time.time() - w.started_at)
            elif w.port is None and w.startup_expired(time.time()):
                self.workers.pop(key, None)
                msg, details = w.abandon()
                self._side_failed[key] = {"error": msg, "details": details}
            return
        self.workers.pop(key, None)
        if w.log_handle:
            w.log_handle.close()
        if w.stopping:
            return
        err = w.error_report()
        where = "while serving" if w.port else f"while {err.get('phase') or 'starting'}"
        msg = f"worker failed {where}: {err.get('detail')}" if err else f"worker {_exit_reason(code)} {where}"
        self._side_failed[key] = {"error": msg, "details": {"exit_code": code, "log_tail": _log_tail(w.log_path),
                                                            "remote_traceback": err.get("traceback")}}
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
                last = max(last, w.last_activity())
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
