"""The gateway's health check: every ``health_interval_s`` it pings each serving worker; one whose
``/ping`` says ``degraded`` (an inference ran past timeouts.request) is replaced by a fresh worker
of the same version (``Gateway.replace_jammed``). A worker that does not answer is left to the
supervisor (it notices the exit)."""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.store import DeploymentRow
from sequence_ai_server.gateway.worker_record import DEFAULT_LOAD_ESTIMATE_S, Role, _worker_url, worker_key

__all__ = ["health_loop", "HealthCheck"]

log = logging.getLogger("sequence_ai_server.gateway")


async def health_loop(gw: Any) -> None:
    """Ping every serving worker of ``gw`` each ``gw.health_interval_s`` s, forever (cancel to stop);
    each ping also collects the worker's /act usage (``Gateway.take_worker_usage``)."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as http:
        while True:
            await asyncio.sleep(gw.health_interval_s)
            try:
                for name, url in await asyncio.to_thread(gw.health_targets):
                    pid = gw.workers[name].proc.pid if name in gw.workers else None
                    try:
                        r = await http.get(f"{url}/ping", params={"usage_since": gw.usage_since(name, pid)})
                        body = r.json() if r.status_code == 200 else {}
                    except (httpx.HTTPError, ValueError):
                        continue          # a dead worker is the supervisor's business
                    if body.get("usage") and body.get("pid") == pid:   # /act counters (operations.py)
                        await asyncio.to_thread(gw.take_worker_usage, name, pid, body["usage"])
                    if body.get("status") == "degraded":
                        await asyncio.to_thread(gw.replace_jammed, name, body, int(url.rsplit(":", 1)[1]))
            except Exception:
                log.exception("health check failed")


class HealthCheck:
    """Jammed-worker detection and replacement, mixed into the Gateway (its ``store``,
    ``workers``, ``_health`` and ``_lock``)."""

    # -- health: a worker whose inference hangs still answers /ping, with status degraded
    def health_targets(self) -> list[tuple[str, str]]:
        """``(deployment, worker_url)`` of every serving worker not already being replaced."""
        out = []
        with self._lock:
            for name, w in list(self.workers.items()):
                if w.role is not Role.SERVING or worker_key(Role.BUILD, name) in self.workers:
                    continue
                row = self.store.get(name)
                if row and row.status == "ready" and row.worker_port:
                    out.append((name, _worker_url(row)))
        return out

    def replace_jammed(self, name: str, ping: dict, port: Optional[int] = None) -> bool:
        """``name``'s worker answered /ping ``degraded`` (an inference ran past timeouts.request):
        start a fresh worker of the same version beside it. Until it is ready new connects get 503
        warming; once it is, it takes over like a new version (new sessions go there, the jammed
        worker's secret is rotated so its robots reconnect, and it is stopped). Returns False when
        nothing was done (not serving, or a build already runs beside it)."""
        with self._lock:
            row = self.store.get(name)
            if row is None or row.status != "ready" or name not in self.workers or worker_key(Role.BUILD, name) in self.workers:
                return False
            if port is not None and row.worker_port != port:
                return False                 # the ping came from a worker that has been replaced since
            now = time.time()
            self._health[name] = {"state": "jammed", "since": now, "pid": row.worker_pid, "version": row.version,
                                  "oldest_request_s": float(ping.get("oldest_request_s") or 0.0),
                                  "request_timeout_s": ping.get("request_timeout_s")}
            kept = {v.version: v for v in self.store.versions(name)}
            source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)
            w = self._launch(name, Role.BUILD, row.file, row.class_name, row.version, source)
            w.file_sha = row.file_sha
            self.store.update(name, build=({"version": row.version, "status": "building",
                                                           "phase": "spawning", "started_at": now,
                                                           "reason": "replacing a jammed worker"}))
        log.warning("%s: worker pid %s is jammed (an inference has run %.1f s, timeouts.request %s s); "
                    "starting a fresh one", name, row.worker_pid, self._health[name]["oldest_request_s"],
                    ping.get("request_timeout_s"))
        return True

    def _refuse_jammed(self, model: str, row: DeploymentRow, jam: dict) -> None:
        """A connect while a jammed worker is being replaced: 503 warming until the fresh worker
        takes over, worker_failed when the replacement itself failed to load."""
        build = row.build if row.build is not None else {}
        if build.get("status") == "failed":
            raise ApiError("worker_failed", f"the worker of {model!r} is jammed (an inference ran {jam['oldest_request_s']:.0f} s) "
                           f"and its replacement failed: {build.get('error')}", details=build.get("details"),
                           hint=f"`seq policy status {model}`; the log is {self.data_dir / 'logs' / (model + '.log')}")
        estimate = row.load_s or DEFAULT_LOAD_ESTIMATE_S
        remaining = max(1.0, estimate - (time.time() - jam["since"]))
        raise ApiError("warming", f"the worker of {model!r} is jammed (an inference has run "
                       f"{jam['oldest_request_s']:.0f} s); a fresh one is starting, about {remaining:.0f} s left",
                       retry_after_s=round(remaining, 1), details={"phase": "replacing", "estimate_s": estimate},
                       hint="retry after Retry-After seconds (run()/act() wait this out before their first action; predict() does not)")
