"""The supervisor's passes over the workers that are not a deployment's serving one: a build
loading beside it (switched in once ready), a side worker serving a traffic split or pin, and
the retiring workers draining after a switch. Each runs inside ``Supervisor.reconcile`` with the
supervisor's lock held, and changes only the supervisor's records and the store."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sequence_ai_server.gateway.events import WorkerCrashed
from sequence_ai_server.gateway.worker_record import (DEFAULT_IDLE_TIMEOUT_S, Role, WorkerRecord, _exit_reason,
                                                      _log_tail, _ready_host)

if TYPE_CHECKING:
    from sequence_ai_server.gateway.supervisor import Supervisor

__all__ = ["poll_build", "poll_side", "poll_extra", "reap_retiring", "reap_sides"]

log = logging.getLogger("sequence_ai_server.gateway")


def poll_build(sup: "Supervisor", key: str, w: WorkerRecord, now: float) -> None:
    """A version building beside the serving one: switch it in once ready; a failed build only
    records why (the serving version is untouched)."""
    name = w.name
    row = sup.store.get(name)
    build = (row.build if row else None) or {}
    ph = w.phase_report()
    if ph.get("spec"):
        w.spec = ph["spec"]
        if sup.refuse_missing_card(key, w, w.spec):   # gpu= names no card here (ops)
            return
    code = w.proc.poll()
    if code is None:
        ready = w.ready_report()
        if ready is not None:
            sup.take_over(key, w, row, build, ready, now)
        return
    sup.workers.pop(key, None)
    if w.log_handle:
        w.log_handle.close()
    if w.stopping:
        return
    failed_msg, details = w.load_failure(code, ph.get("phase"))
    sup.store.update(name, build={**build, "status": "failed", "phase": "failed", "error": failed_msg,
                                  "details": details})
    sup.store.update_version(name, w.version, status="failed", error=failed_msg)
    log.warning("%s v%d failed to build; v%s keeps serving: %s", name, w.version, row.version if row else "?",
                failed_msg)


def poll_side(sup: "Supervisor", key: str, w: WorkerRecord, now: float) -> None:
    """A side worker: note its port once ready; record why it failed if it exits while loading
    (``sup.side_failed``) or loads past its startup timeout."""
    code = w.proc.poll()
    if code is None:
        ready = w.ready_report() if w.port is None else None
        if ready:
            w.port = int(ready["port"])
            w.host = _ready_host(ready)
            w.spec = ready.get("spec") or w.spec
            log.info("%s v%d (side) is ready on port %d after %.2fs", w.name, w.version, w.port, now - w.started_at)
        elif w.port is None and w.startup_expired(now):
            sup.workers.pop(key, None)
            msg, details = w.abandon()
            sup.side_failed[key] = {"error": msg, "details": details}
        return
    sup.workers.pop(key, None)
    if w.log_handle:
        w.log_handle.close()
    if w.stopping:
        return
    err = w.error_report()
    where = "while serving" if w.port else f"while {err.get('phase') or 'starting'}"
    msg = f"worker failed {where}: {err.get('detail')}" if err else f"worker {_exit_reason(code)} {where}"
    sup.side_failed[key] = {"error": msg, "details": {"exit_code": code, "log_tail": _log_tail(w.log_path),
                                                      "remote_traceback": err.get("traceback")}}
    log.warning("%s v%d (side): %s", w.name, w.version, msg)


def poll_extra(sup: "Supervisor", key: str, w: WorkerRecord, now: float) -> None:
    """Another worker of the serving version (``name#N``): note its port once ready; one that
    exits or loads past its startup timeout is forgotten (its own sessions go with it: their
    renewals find no worker and the robots connect again, landing on a worker with room); an
    exit nobody asked for emits WorkerCrashed (the alert), which drops no other worker's sessions."""
    code = w.proc.poll()
    if code is None:
        ready = w.ready_report() if w.port is None else None
        if ready:
            w.port = int(ready["port"])
            w.host = _ready_host(ready)
            w.spec = ready.get("spec") or w.spec
            log.info("%s: worker %s (pid %d) is ready on port %d after %.2fs", w.name, key, w.proc.pid, w.port,
                     now - w.started_at)
        elif w.port is None and w.startup_expired(now):
            sup.workers.pop(key, None)
            msg, _ = w.abandon()
            log.warning("%s: worker %s: %s", w.name, key, msg)
        return
    sup.workers.pop(key, None)
    if w.log_handle:
        w.log_handle.close()
    if not w.stopping:
        msg = f"worker {key} {_exit_reason(code)} {'while serving' if w.port else 'while loading'}"
        log.warning("%s: %s", w.name, msg)
        sup._events.emit(WorkerCrashed(w.name, w.version, w.proc.pid, code, msg))   # alerts; its sessions only


def reap_retiring(sup: "Supervisor", now: float) -> None:
    """Forget retiring workers that exited; SIGKILL one past its grace. A switch whose old worker
    is gone is done (build status ready)."""
    for old in list(sup.retiring):
        if old.proc.poll() is None:
            if now - old.retired_at < old.grace_s:
                continue
            old.proc.kill()
            old.proc.wait()
        sup.retiring.remove(old)
        if old.log_handle:
            old.log_handle.close()
        row = sup.store.get(old.name)
        build = row.build if row else None
        if build and build.get("status") == "switching":
            sup.store.update(old.name, build=({**build, "status": "ready"}))


def reap_sides(sup: "Supervisor", held: set, now: float) -> None:
    """Stop a side worker no session holds (``held``: worker keys) once no split or pin names its
    version (or it has become the serving one), or after the policy's idle_timeout without a session."""
    for key, w in list(sup.workers.items()):
        if w.role is not Role.SIDE or key in held:
            continue
        row = sup.store.get(w.name)
        if row is not None:
            pol = row.traffic
            wanted = w.version != row.version and (pol["split"].get(w.version, 0) > 0
                                                      or w.version in pol["pins"].values())
            idle_timeout = float(row.spec_value("idle_timeout", DEFAULT_IDLE_TIMEOUT_S))
            last = max(w.started_at, sup.activity.get(key, 0.0), w.last_activity())
            if wanted and now - last <= idle_timeout:
                continue
        log.info("stopping the side worker %s v%d (no split or pin needs it)", w.name, w.version)
        sup.stop(key)
