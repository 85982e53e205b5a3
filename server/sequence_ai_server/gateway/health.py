"""The gateway's health check, :class:`HealthCheck`: every ``interval_s`` the control tick pings
each serving worker's ``/ping`` (every worker of a deployment's fleet: its first one ``NAME`` and
the others ``NAME#N``), every worker on a thread of its own and at most one ping per
worker in flight, so neither the tick nor one worker's jam detection waits on another worker that
does not answer. A worker is *jammed*, and replaced by a fresh worker of the same version
(``replace_jammed``), when

- its ``/ping`` says ``degraded`` (an inference ran past timeouts.request), or
- its process is alive but it has answered no ``/ping`` (a read or connect timeout, a refused
  connection) for ``unanswered_bound_s``: the smaller of timeouts.request and two ping
  timeouts (``$SEQ_PING_TIMEOUT_S``, 5 s each by default: ``UNANSWERED_JAM_S``), over at least
  two pings in a row. A frozen process (SIGSTOP, a policy holding the GIL in C code) is never noticed by the supervisor,
  which only sees exits; a healthy worker answers /ping in milliseconds even while its
  inferences run, so two whole ping timeouts of silence are not load.

A jammed first worker is replaced as a new version takes over (its robots reconnect to the fresh
one); a jammed other worker ``NAME#N`` alone is retired (SIGTERM, SIGKILL after the jam grace)
and another started in its place, its robots reconnecting to a worker with room: the
deployment's other workers and their robots are untouched.

A worker that has exited is the supervisor's business. Each ping also collects the worker's /act
usage for ops and hands the answer to ``observe`` (admission's cost curves). It owns the jam
records; connects ask it (``refuse_if_jammed``)."""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import httpx

from sequence_ai_server.common.config import PING_TIMEOUT_S
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.plain_http import client_options
from sequence_ai_server.gateway.events import WorkerTookOver
from sequence_ai_server.gateway.store import DeploymentRow, Store
from sequence_ai_server.gateway.supervisor import Supervisor
from sequence_ai_server.gateway.worker_record import (DEFAULT_LOAD_ESTIMATE_S, EXTRA_MARK, JAMMED_GRACE_S, Role,
                                                      _worker_url, worker_key)

__all__ = ["HealthCheck", "PING_TIMEOUT_S", "UNANSWERED_JAM_S"]

log = logging.getLogger("sequence_ai_server.gateway")

UNANSWERED_JAM_S = 2 * PING_TIMEOUT_S     # an alive worker silent this long is jammed (or timeouts.request, if less)
_MIN_MISSES = 2                           # ... over at least this many unanswered pings in a row


class HealthCheck:
    """Jammed-worker detection and replacement over ``supervisor``'s serving workers.

    ``usage_since(name, pid)`` / ``take_usage(name, pid, usage)``: ops' usage collection (plain
    callables). ``observe(key, pid, body)``: each /ping answer of worker ``key`` (admission.py).
    ``interval_s``: seconds between pings of one worker. ``ping_timeout_s``: the timeout of one
    ping. ``clock``: unix s."""

    def __init__(self, store: Store, supervisor: Supervisor, data_dir: Path, *, interval_s: float = 2.0,
                 usage_since: Callable[[str, Optional[int]], int] = lambda name, pid: -1,
                 take_usage: Callable[[str, Optional[int], dict], int] = lambda name, pid, usage: -1,
                 observe: Callable[[str, Optional[int], dict], None] = lambda key, pid, body: None,
                 ping_timeout_s: float = PING_TIMEOUT_S, clock: Callable[[], float] = time.time) -> None:
        self.store, self.supervisor, self.data_dir = store, supervisor, data_dir
        self.interval_s, self._usage_since, self._take_usage, self.clock = interval_s, usage_since, take_usage, clock
        self.ping_timeout_s, self._observe = ping_timeout_s, observe
        self._jams: dict[str, dict] = {}     # deployment -> the last jammed-worker event
        self.others_jammed: dict[str, dict] = {}   # NAME#N -> the last time that other worker was found jammed
        self._lock = threading.Lock()
        self._due = clock() + interval_s
        self._in_flight: set[tuple] = set()              # (deployment, pid) with a ping under way
        self._unanswered: dict[tuple, dict] = {}         # (deployment, pid) -> {"since", "misses", "error"}
        self._client: Optional[httpx.Client] = None

    def get(self, name: str) -> Optional[dict]:
        """The last jammed-worker event of ``name`` (``{"state": jammed | replaced, ...}``), or None."""
        with self._lock:
            return self._jams.get(name)

    def check(self, now: float) -> None:
        """From the control tick: when a round is due, start a ping of every target that has none
        under way (each on its own thread; this returns at once)."""
        if now < self._due:
            return
        self._due = now + self.interval_s
        try:
            self._start_pings(self.targets())
        except Exception:  # noqa: BLE001 - the next round tries again
            log.exception("health check failed")

    def targets(self) -> list[tuple[str, str, Optional[int]]]:
        """``(worker key, worker_url, pid)`` of every serving worker not already being replaced:
        each deployment's first one (key: its name) and its ready others (``NAME#N``)."""
        out = []
        for name, w in self.supervisor.of(Role.SERVING).items():
            if self.supervisor.busy(worker_key(Role.BUILD, name)):
                continue
            row = self.store.get(name)
            if row and row.status == "ready" and row.worker_port:
                out.append((name, _worker_url(row), w.proc.pid))
            for key, x in self.supervisor.of(Role.EXTRA, name).items():
                if x.port and not x.stopping:
                    out.append((key, f"http://{x.host or '127.0.0.1'}:{x.port}", x.proc.pid))
        return out

    def ping_round(self) -> None:
        """Ping every target once, all at once, and return when each ping is handled (so a
        round takes one ping timeout at most, however many workers do not answer)."""
        try:
            threads = self._start_pings(self.targets())
        except Exception:  # noqa: BLE001 - the next round tries again
            log.exception("health check failed")
            return
        for t in threads:
            t.join()

    def _start_pings(self, targets: list[tuple[str, str, Optional[int]]]) -> list[threading.Thread]:
        keys = {(name, pid) for name, _url, pid in targets}
        threads = []
        with self._lock:
            for k in [k for k in self._unanswered if k not in keys]:
                del self._unanswered[k]            # replaced, stopped or gone: its silence is over
            todo = [t for t in targets if (t[0], t[2]) not in self._in_flight]
            self._in_flight.update((name, pid) for name, _url, pid in todo)
        for name, url, pid in todo:
            t = threading.Thread(target=self._ping, args=(name, url, pid), name=f"health {name}", daemon=True)
            threads.append(t)
            t.start()
        return threads

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=httpx.Timeout(self.ping_timeout_s), **client_options(),
                                            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
            return self._client

    def get_ping(self, url: str, usage_since: int) -> httpx.Response:
        """GET ``url``/ping (a test replaces this to play a worker)."""
        return self._http().get(f"{url}/ping", params={"usage_since": usage_since})

    def _ping(self, name: str, url: str, pid: Optional[int]) -> None:
        """One ping of worker ``name`` (a deployment's first worker, or ``NAME#N``), process
        ``pid``: hand its usage to ops and its answer to ``observe``, replace it when it is
        degraded or has been silent past the bound."""
        deployment = name.split(EXTRA_MARK, 1)[0]
        try:
            sent = self.clock()
            try:
                r = self.get_ping(url, self._usage_since(deployment, pid))
            except httpx.HTTPError as exc:
                self._no_answer(name, url, pid, sent, exc)
                return
            with self._lock:
                self._unanswered.pop((name, pid), None)
            try:
                body = r.json() if r.status_code == 200 else {}
            except ValueError:
                body = {}
            if not isinstance(body, dict):
                body = {}
            if body.get("pid") == pid:
                if body.get("usage"):                      # /act counters (ops)
                    self._take_usage(deployment, pid, body["usage"])
                self._observe(name, pid, body)             # its cost curve (admission)
            if body.get("status") == "degraded":
                self._replace(name, body, url, pid)
        except Exception:  # noqa: BLE001 - the next round tries again
            log.exception("health check of %s failed", name)
        finally:
            with self._lock:
                self._in_flight.discard((name, pid))

    def unanswered_bound_s(self, name: str) -> float:
        """How long ``name``'s alive worker may answer no /ping before it counts as jammed: its
        timeouts.request (a worker that could answer would say degraded by then) or two ping
        timeouts (``UNANSWERED_JAM_S`` at the default), whichever is less."""
        row = self.store.get(name)
        spec = (row.spec if row is not None else None) or {}
        two_pings = 2 * self.ping_timeout_s
        try:
            request_s = float((spec.get("timeouts") or {}).get("request") or two_pings)
        except (TypeError, ValueError):
            request_s = two_pings
        return min(request_s, two_pings)

    def _no_answer(self, name: str, url: str, pid: Optional[int], sent: float, exc: Exception) -> None:
        """A ping of ``name``'s worker ``pid`` (sent at ``sent``) got no answer. An exited worker
        is the supervisor's to notice; one that still runs and has been silent past the bound is
        jammed."""
        now = self.clock()
        with self._lock:
            miss = self._unanswered.setdefault((name, pid), {"since": sent, "misses": 0, "error": ""})
            miss["misses"] += 1
            miss["error"] = type(exc).__name__
            silent_s, misses, error = now - miss["since"], miss["misses"], miss["error"]
        w = self.supervisor.get(name)
        if w is None or w.proc.pid != pid or w.stopping or w.proc.poll() is not None:
            return                       # gone or going: the supervisor's business
        bound = self.unanswered_bound_s(name.split(EXTRA_MARK, 1)[0])
        if misses < _MIN_MISSES or silent_s < bound:
            log.info("%s: worker pid %s did not answer /ping (%s; silent %.1f s of %.1f s)",
                     name, pid, error, silent_s, bound)
            return
        self._replace(name, {"status": "not_answering", "unanswered_s": round(silent_s, 3), "error": error,
                             "unanswered_bound_s": bound}, url, pid)

    def _replace(self, key: str, ping: dict, url: str, pid: Optional[int]) -> None:
        """Replace jammed worker ``key``: a deployment's first one as ``replace_jammed`` does,
        another one (``NAME#N``) by ``replace_other``."""
        if EXTRA_MARK in key:
            self.replace_other(key, ping, pid)
        else:
            self.replace_jammed(key, ping, int(url.rsplit(":", 1)[1]))

    def replace_other(self, key: str, ping: dict, pid: Optional[int]) -> bool:
        """A deployment's other worker ``key`` (``NAME#N``, process ``pid``) is jammed (``ping``
        says degraded or not_answering): retire it alone (its secret rotated so its robots'
        tokens stop working, SIGTERM, SIGKILL after the jam grace), forget its sessions (their
        robots reconnect to a worker with room) and start another worker in its place. False
        when it is gone or another process holds the key."""
        name = key.split(EXTRA_MARK, 1)[0]
        now = self.clock()
        with self.supervisor._locked():
            w = self.supervisor.workers.get(key)
            if w is None or w.proc.pid != pid or w.stopping:
                return False
            self.supervisor.workers.pop(key)
            self.supervisor._retire(w, now, JAMMED_GRACE_S)
        self.others_jammed[key] = {"state": "replaced", "since": now, "pid": pid, "reason": ping.get("status"),
                                   "unanswered_s": ping.get("unanswered_s"), "oldest_request_s": ping.get("oldest_request_s")}
        log.warning("%s: its worker %s (pid %s) is jammed (%s); retiring it alone and starting another",
                    name, key, pid, ping.get("status"))
        try:
            self.supervisor.fleets.start(name)
        except ApiError as exc:
            log.warning("%s: no worker could start in place of %s: %s", name, key, exc.detail)
        return True

    def close(self) -> None:
        """Close the ping client (pings under way fail and end)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def replace_jammed(self, name: str, ping: dict, port: Optional[int] = None) -> bool:
        """``name``'s worker answered /ping ``degraded`` (an inference ran past timeouts.request)
        or, with ``ping["status"] == "not_answering"``, runs but has answered no /ping for
        ``ping["unanswered_s"]``: start a fresh worker of the same version beside it. Until it is
        ready new connects get 503 warming (phase ``replacing``); once it is, it takes over like a
        new version (new sessions go there, the jammed worker's secret is rotated so its robots
        reconnect, and it is stopped: SIGTERM, SIGKILL after the jam grace, which also ends a
        stopped process). Returns False when nothing was done (not serving, or a build already
        runs beside it)."""
        row = self.store.get(name)
        if row is None or row.status != "ready" or self.supervisor.get(name) is None \
                or self.supervisor.busy(worker_key(Role.BUILD, name)):
            return False
        if port is not None and row.worker_port != port:
            return False                 # the ping came from a worker that has been replaced since
        now = self.clock()
        silent = ping.get("status") == "not_answering"
        jam = {"state": "jammed", "since": now, "pid": row.worker_pid, "version": row.version,
               "reason": "not_answering" if silent else "degraded",
               "oldest_request_s": float((ping.get("unanswered_s") if silent else ping.get("oldest_request_s")) or 0.0),
               "request_timeout_s": ping.get("request_timeout_s")}
        if silent:
            jam.update(unanswered_s=float(ping.get("unanswered_s") or 0.0), error=ping.get("error"))
            if jam["request_timeout_s"] is None:
                jam["request_timeout_s"] = ((row.spec or {}).get("timeouts") or {}).get("request")
        with self._lock:
            self._jams[name] = jam
        kept = {v.version: v for v in self.store.versions(name)}
        source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)
        why = "replacing a worker that does not answer" if silent else "replacing a jammed worker"
        self.supervisor.start_build(name, row.file, row.class_name, row.version, source, row.file_sha,
                                    {"version": row.version, "status": "building", "phase": "spawning",
                                     "started_at": now, "reason": why}, replacing_jammed=True)
        if silent:
            log.warning("%s: worker pid %s runs but has answered no /ping for %.1f s (%s); starting a fresh one",
                        name, row.worker_pid, jam["unanswered_s"], ping.get("error"))
        else:
            log.warning("%s: worker pid %s is jammed (an inference has run %.1f s, timeouts.request %s s); "
                        "starting a fresh one", name, row.worker_pid, jam["oldest_request_s"],
                        ping.get("request_timeout_s"))
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
            raise ApiError("worker_failed", f"the worker of {model!r} is jammed ({self._why(jam)}) "
                           f"and its replacement failed: {build.get('error')}", details=build.get("details"),
                           hint=f"`seq policy status {model}`; the log is {self.data_dir / 'logs' / (model + '.log')}")
        estimate = row.load_s or DEFAULT_LOAD_ESTIMATE_S
        remaining = max(1.0, estimate - (self.clock() - jam["since"]))
        raise ApiError("warming", f"the worker of {model!r} is jammed ({self._why(jam)}); a fresh one is "
                       f"starting, about {remaining:.0f} s left",
                       retry_after_s=round(remaining, 1), details={"phase": "replacing", "estimate_s": estimate},
                       hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")

    @staticmethod
    def _why(jam: dict) -> str:
        if jam.get("reason") == "not_answering":
            return f"it runs but has answered no /ping for {jam.get('unanswered_s', 0.0):.0f} s"
        return f"an inference has run {jam['oldest_request_s']:.0f} s"
