"""The gateway's health check, :class:`HealthCheck`: every ``interval_s`` the control tick starts a
ping round (on a thread of its own, one round at a time, so a slow worker never holds up the
tick) over each serving worker; one whose ``/ping`` says ``degraded`` (an inference ran past
timeouts.request) is replaced by a fresh worker of the same version (``replace_jammed``). A worker
that does not answer is left to the supervisor (it notices the exit). Each ping also collects the
worker's /act usage for ops. It owns the jam records; connects ask it (``refuse_if_jammed``)."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.events import WorkerTookOver
from sequence_ai_server.gateway.store import DeploymentRow, Store
from sequence_ai_server.gateway.supervisor import Supervisor
from sequence_ai_server.gateway.worker_record import DEFAULT_LOAD_ESTIMATE_S, Role, _worker_url, worker_key

__all__ = ["HealthCheck"]

log = logging.getLogger("sequence_ai_server.gateway")


class HealthCheck:
    """Jammed-worker detection and replacement over ``supervisor``'s serving workers.

    ``usage_since(name, pid)`` / ``take_usage(name, pid, usage)``: ops' usage collection (plain
    callables). ``interval_s``: seconds between ping rounds. ``clock``: unix s."""

    def __init__(self, store: Store, supervisor: Supervisor, data_dir: Path, *, interval_s: float = 2.0,
                 usage_since: Callable[[str, Optional[int]], int] = lambda name, pid: -1,
                 take_usage: Callable[[str, Optional[int], dict], int] = lambda name, pid, usage: -1,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.supervisor, self.data_dir = store, supervisor, data_dir
        self.interval_s, self._usage_since, self._take_usage, self.clock = interval_s, usage_since, take_usage, clock
        self._jams: dict[str, dict] = {}     # deployment -> the last jammed-worker event
        self._lock = threading.Lock()
        self._due = clock() + interval_s
        self._round: Optional[threading.Thread] = None

    def get(self, name: str) -> Optional[dict]:
        """The last jammed-worker event of ``name`` (``{"state": jammed | replaced, ...}``), or None."""
        with self._lock:
            return self._jams.get(name)

    def check(self, now: float) -> None:
        """From the control tick: start a ping round when one is due and none runs."""
        if now < self._due or (self._round is not None and self._round.is_alive()):
            return
        self._due = now + self.interval_s
        self._round = threading.Thread(target=self.ping_round, name="health", daemon=True)
        self._round.start()

    def targets(self) -> list[tuple[str, str, Optional[int]]]:
        """``(deployment, worker_url, pid)`` of every serving worker not already being replaced."""
        out = []
        for name, w in self.supervisor.of(Role.SERVING).items():
            if self.supervisor.busy(worker_key(Role.BUILD, name)):
                continue
            row = self.store.get(name)
            if row and row.status == "ready" and row.worker_port:
                out.append((name, _worker_url(row), w.proc.pid))
        return out

    def ping_round(self) -> None:
        """Ping every target once (5 s each at most), hand its usage to ops, replace a jammed one."""
        try:
            with httpx.Client(timeout=httpx.Timeout(5.0), trust_env=False) as http:
                for name, url, pid in self.targets():
                    try:
                        r = http.get(f"{url}/ping", params={"usage_since": self._usage_since(name, pid)})
                        body = r.json() if r.status_code == 200 else {}
                    except (httpx.HTTPError, ValueError):
                        continue          # a dead worker is the supervisor's business
                    if body.get("usage") and body.get("pid") == pid:   # /act counters (ops)
                        self._take_usage(name, pid, body["usage"])
                    if body.get("status") == "degraded":
                        self.replace_jammed(name, body, int(url.rsplit(":", 1)[1]))
        except Exception:  # noqa: BLE001 - the next round tries again
            log.exception("health check failed")

    def replace_jammed(self, name: str, ping: dict, port: Optional[int] = None) -> bool:
        """``name``'s worker answered /ping ``degraded`` (an inference ran past timeouts.request):
        start a fresh worker of the same version beside it. Until it is ready new connects get 503
        warming; once it is, it takes over like a new version (new sessions go there, the jammed
        worker's secret is rotated so its robots reconnect, and it is stopped). Returns False when
        nothing was done (not serving, or a build already runs beside it)."""
        row = self.store.get(name)
        if row is None or row.status != "ready" or self.supervisor.get(name) is None \
                or self.supervisor.busy(worker_key(Role.BUILD, name)):
            return False
        if port is not None and row.worker_port != port:
            return False                 # the ping came from a worker that has been replaced since
        now = self.clock()
        jam = {"state": "jammed", "since": now, "pid": row.worker_pid, "version": row.version,
               "oldest_request_s": float(ping.get("oldest_request_s") or 0.0),
               "request_timeout_s": ping.get("request_timeout_s")}
        with self._lock:
            self._jams[name] = jam
        kept = {v.version: v for v in self.store.versions(name)}
        source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)
        self.supervisor.start_build(name, row.file, row.class_name, row.version, source, row.file_sha,
                                    {"version": row.version, "status": "building", "phase": "spawning",
                                     "started_at": now, "reason": "replacing a jammed worker"}, replacing_jammed=True)
        log.warning("%s: worker pid %s is jammed (an inference has run %.1f s, timeouts.request %s s); "
                    "starting a fresh one", name, row.worker_pid, jam["oldest_request_s"], ping.get("request_timeout_s"))
        return True

    def took_over(self, ev: WorkerTookOver) -> None:
        """Event handler: a fresh worker took over from a jammed one, which is now replaced."""
        with self._lock:
            jam = self._jams.get(ev.name)
            if jam and jam.get("state") == "jammed":
                self._jams[ev.name] = {**jam, "state": "replaced", "replaced_at": self.clock(), "new_pid": ev.pid}
                log.warning("%s: the jammed worker (pid %s) is replaced by pid %d", ev.name, jam.get("pid"), ev.pid)

    def refuse_if_jammed(self, model: str, row: DeploymentRow) -> None:
        """While a jammed worker of ready ``row`` is being replaced: raise ApiError warming (503,
        Retry-After in s) until the fresh worker takes over, worker_failed when the replacement
        itself failed to load. Returns when ``model`` is not jammed."""
        jam = self.get(model)
        if row.status != "ready" or not jam or jam.get("state") != "jammed":
            return
        build = row.build if row.build is not None else {}
        if build.get("status") == "failed":
            raise ApiError("worker_failed", f"the worker of {model!r} is jammed (an inference ran {jam['oldest_request_s']:.0f} s) "
                           f"and its replacement failed: {build.get('error')}", details=build.get("details"),
                           hint=f"`seq policy status {model}`; the log is {self.data_dir / 'logs' / (model + '.log')}")
        estimate = row.load_s or DEFAULT_LOAD_ESTIMATE_S
        remaining = max(1.0, estimate - (self.clock() - jam["since"]))
        raise ApiError("warming", f"the worker of {model!r} is jammed (an inference has run "
                       f"{jam['oldest_request_s']:.0f} s); a fresh one is starting, about {remaining:.0f} s left",
                       retry_after_s=round(remaining, 1), details={"phase": "replacing", "estimate_s": estimate},
                       hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")
