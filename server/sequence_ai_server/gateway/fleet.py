"""A deployment's several serving workers (its fleet): the first one keeps the deployment's
name as its key, the others are ``name#N`` (Role.EXTRA) of the same version. :class:`Fleets`
answers what the fleet is, how big it may grow and how many workers to keep, starts another
worker (with no lock held) and stops the idle ones one at a time. The supervisor owns it and
calls it from its reconcile; sessions and the status view read it. docs/guides/scaling.md
("Several workers per deployment") says what starts and stops one."""
from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from sequence_ai_server.gateway.store import DeploymentRow
from sequence_ai_server.gateway.worker_record import DEFAULT_IDLE_TIMEOUT_S, EXTRA_MARK, Role, WorkerRecord, worker_key
from sequence_ai_server.ops.service import Running

if TYPE_CHECKING:
    from sequence_ai_server.gateway.supervisor import Supervisor

__all__ = ["Fleets", "NO_CAP"]

log = logging.getLogger("sequence_ai_server.gateway")

NO_CAP = 1_000_000      # a GPU policy without max_gpus: no cap of its own (the free cards bound it)


class Fleets:
    """The fleets of the supervisor ``sup``'s deployments (its records, its lock)."""

    def __init__(self, sup: "Supervisor") -> None:
        self.sup = sup

    def of(self, name: str) -> dict[str, WorkerRecord]:
        """``{key: worker}`` of the workers serving ``name``'s serving version: its first one
        (key ``name``) then the others (``name#N``) in the order they started."""
        sup = self.sup
        with sup._locked():
            first = sup.workers.get(name)
            out = {name: first} if first is not None and first.role is Role.SERVING else {}
            out.update(sorted(sup.of(Role.EXTRA, name).items(), key=lambda kw: kw[1].started_at))
            return out

    def size(self, name: str) -> int:
        """Workers serving ``name``'s serving version, counting those that are starting."""
        with self.sup._locked():
            starting = sum(1 for k in self.sup._starting if k == name or k.startswith(name + EXTRA_MARK))
            return len(self.of(name)) + starting

    def cap(self, row: DeploymentRow) -> int:
        """The most workers ``row``'s serving version may run at once: a GPU policy its
        ``max_gpus`` (undeclared: NO_CAP; the free cards and $SEQ_MAX_GPUS still bound it); a
        CPU policy (``gpu="cpu"`` or none) its ``max_gpus`` counted as workers (undeclared: 1),
        at most the supervisor's ``cpu_workers``."""
        res = (row.spec or {}).get("resources") or {}
        declared = res.get("max_gpus")
        if res.get("gpu") in (None, "cpu", "CPU"):
            return max(1, min(int(declared or 1), self.sup.cpu_workers))
        return int(declared) if declared else NO_CAP

    def target(self, row: DeploymentRow, held: set[str] = frozenset()) -> int:
        """Workers to keep for ``row`` now: its warm floor (min_workers, a scheduled or ``seq
        policy scale --min``) and, while robots are connected (``held``: worker keys with a
        session), the workers holding them plus ``buffer_workers`` spares; at most ``cap``."""
        floor = self.sup._warm_floor(row)
        busy = sum(1 for k in self.of(row.name) if k in held)
        want = max(floor, busy + int(row.spec_value("buffer_workers", 0) or 0) if busy else 0)
        return min(want, self.cap(row))

    def start(self, name: str, max_workers: Optional[int] = None,
              admit: Optional[Callable[[list[Running]], None]] = None) -> Optional[WorkerRecord]:
        """Start another worker of ``name``'s serving version (``name#N``, the lowest N >= 2 not
        in use) once its first one serves. None when the fleet is at ``cap`` or the first worker
        does not serve. Raises ApiError as ``Supervisor._start`` does (gpu_limit_reached past
        ``max_workers``, what ``admit`` raises, CardRefused when no card is free)."""
        sup = self.sup
        with sup._locked():
            row = sup.store.get(name)
            if row is None or row.status != "ready" or name not in sup.workers or self.size(name) >= self.cap(row):
                return None
            n = 2
            while worker_key(Role.EXTRA, name, n) in sup.workers or worker_key(Role.EXTRA, name, n) in sup._starting:
                n += 1
            key = worker_key(Role.EXTRA, name, n)
        kept = {v.version: v for v in sup.store.versions(name)}
        source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)
        w = sup._start(key, Role.EXTRA, name, row.file, row.class_name, row.version, source,
                       lambda spec: (lambda: None), max_workers, admit)
        if w is not None:
            w.epoch, w.spec, w.file_sha = secrets.randbelow(2 ** 31), row.spec, row.file_sha
            log.info("%s: started worker %s (%d of at most %d)", name, key, self.size(name), self.cap(row))
        return w

    def stop_others(self, name: str) -> None:
        """Stop ``name``'s workers other than its first (``name#N``)."""
        for k in self.sup.of(Role.EXTRA, name):
            self.sup.stop(k)

    def stop_one_idle(self, row: DeploymentRow, held: set[str], now: float) -> None:
        """Stop the last started of ``row``'s other workers that no session in ``held`` uses and
        that saw no request for its idle_timeout (at most one per call)."""
        sup = self.sup
        idle_timeout = float(row.spec_value("idle_timeout", DEFAULT_IDLE_TIMEOUT_S))
        for key, w in reversed(list(self.of(row.name).items())):
            if key == row.name or key in held:
                continue
            last = max(w.started_at, sup.activity.get(key, 0.0), w.last_activity())
            if now - last > idle_timeout:
                log.info("%s: worker %s idle for %.0f s (idle_timeout %g s): stopping it", row.name, key, now - last,
                         idle_timeout)
                sup.stop(key)
                return
