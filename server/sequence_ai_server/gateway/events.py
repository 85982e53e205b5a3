"""What the supervisor tells the services above it, as typed events.

The gateway's services call one way (deployments -> sessions -> traffic/health -> supervisor);
where a lower one must let a higher one know something, it emits one of these and the
composition root (``Gateway.__init__``) subscribes the handler:

    WorkerStopped   a serving worker was stopped for idleness   -> sessions drop theirs
    WorkerCrashed   a serving worker exited while serving       -> sessions drop theirs, ops alerts
    WorkerTookOver  a build (a new version, or a jammed worker's
                    replacement) became the serving worker       -> traffic restarts its counts,
                                                                    health marks a jam replaced

Events raised while the supervisor holds its lock are queued and handed out once it let go, so
a handler may take its own service's lock and call the supervisor again.
"""
from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Optional, Union

__all__ = ["WorkerStopped", "WorkerCrashed", "WorkerTookOver", "SupervisorEvent", "EventBus"]

log = logging.getLogger("sequence_ai_server.gateway")


@dataclass(frozen=True)
class WorkerStopped:
    """The serving worker of deployment ``name`` was stopped by the supervisor (``reason``: ``idle``)."""
    name: str
    reason: str


@dataclass(frozen=True)
class WorkerCrashed:
    """The serving worker ``pid`` of ``name`` (version ``version``) exited while serving;
    ``exit_code`` is its status (None when unknown), ``error`` the message the row now carries."""
    name: str
    version: int
    pid: int
    exit_code: Optional[int]
    error: str


@dataclass(frozen=True)
class WorkerTookOver:
    """A build of ``name`` became its serving worker: version ``version``, process ``pid``;
    ``replaced_pid`` is the worker it replaced (None when none served)."""
    name: str
    version: int
    pid: int
    replaced_pid: Optional[int]


SupervisorEvent = Union[WorkerStopped, WorkerCrashed, WorkerTookOver]


class EventBus:
    """Handlers by event type; ``emit`` queues, ``dispatch`` runs the queued events' handlers in
    order on the calling thread. A handler that raises is logged; the others still run."""

    def __init__(self) -> None:
        self._handlers: dict[type, list[Callable]] = defaultdict(list)
        self._queue: list = []
        self._lock = threading.Lock()

    def on(self, kind: type, handler: Callable[[SupervisorEvent], None]) -> None:
        """Call ``handler(event)`` for every event of type ``kind``."""
        self._handlers[kind].append(handler)

    def emit(self, event: SupervisorEvent) -> None:
        """Queue ``event`` for the next ``dispatch``."""
        with self._lock:
            self._queue.append(event)

    def dispatch(self) -> None:
        """Hand every queued event to its handlers (call it holding no supervisor lock)."""
        while True:
            with self._lock:
                if not self._queue:
                    return
                event = self._queue.pop(0)
            for handler in list(self._handlers.get(type(event), ())):
                try:
                    handler(event)
                except Exception:  # noqa: BLE001 - one handler's failure must not hide the event from the rest
                    log.exception("handler of %s failed", type(event).__name__)
