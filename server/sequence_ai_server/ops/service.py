"""Platform operations, mixed into the Gateway: scheduled warm floors (schedule.py), usage
metering (usage.py), limits (quotas.py), alerts (alerts.py) and the card inventory (gpus.py).
This module wires those services to the gateway's state; each keeps its own job.

``ops_tick`` runs once a second (app.py's ops loop): it meters worker-seconds, notices failed
builds and crashed workers, and judges each webhook's error-rate and p95 thresholds. The health
loop hands each serving worker's ``/ping`` usage to ``take_worker_usage``. The supervisor asks
``warm_floor`` how many workers to keep warm; connect and deploy ask ``check_quota``; a worker
whose declared ``gpu=`` names a card this machine lacks is refused by ``refuse_missing_card``.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Any, Optional

from sequence_ai_server.ops.alerts import Dispatcher, WebhookStore
from sequence_ai_server.ops.gpus import declared_cards, gpu_refusal, holdings, inventory
from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.ops.quotas import LimitStore, refusal
from sequence_ai_server.ops.schedule import ScaleStore
from sequence_ai_server.gateway.store import DeploymentRow
from sequence_ai_server.ops.usage import Recent, UsageStore, card_of, dir_bytes
from sequence_ai_server.gateway.worker_record import Role, _terminate

__all__ = ["Operations"]

log = logging.getLogger("sequence_ai_server.gateway")

_FLUSH_S = 5.0           # worker-seconds are written to state.db this often


class Operations:
    """Gateway state it uses: ``store``, ``workers``, ``_retiring``, ``_activity``, ``_lock``,
    ``config``, ``data_dir``, ``keys``."""

    def _init_operations(self) -> None:
        db, lock = self.store._db, self.store._lock
        self.scales = ScaleStore(db, lock)
        self.usage = UsageStore(db, lock)
        self.limits = LimitStore(db, lock)
        self.webhooks = WebhookStore(db, lock)
        self.alerts = Dispatcher(self.webhooks, backoff_s=self.config.alert_backoff_s)
        self.recent = Recent()
        self._inventory: Optional[dict] = None
        self._metered_at: Optional[float] = None
        self._pending: dict[tuple, float] = {}       # (deployment, card) -> worker-seconds not yet written
        self._flushed_at = time.time()
        self._seen_seq: dict[tuple, int] = {}         # (deployment, worker pid) -> last usage sample collected
        self._seen_counts: dict[tuple, dict] = {}     # (deployment, worker pid) -> its counters last collected
        self._alerted: set = set()                    # events already sent (build/crash keys, rate crossings)
        for row in self.store.all():                  # what failed before this gateway started is not news
            self._alerted.update(self._failure_keys(row))

    # -- the clock of schedules (a test may point $SEQ_TEST_CLOCK_FILE at a file holding unix s)
    def clock(self) -> float:
        """Unix s for scheduled scaling: the test clock file's number when configured and readable,
        else the real time."""
        path = self.config.test_clock_file
        if path is not None:
            try:
                return float(path.read_text().strip())
            except (OSError, ValueError):
                pass
        return time.time()

    # -- scheduled scaling
    def warm_floor(self, row: DeploymentRow) -> int:
        """Workers to keep warm for ``row`` now: its ``min_workers`` or, while its scheduled window
        is open, the scheduled ``--min`` (the larger). While the window is open the deployment counts
        as active, so its worker idles out only ``idle_timeout`` after the window closes."""
        spec_min = int(self._spec_value(row, "min_workers", 0) or 0)
        scale = self.scales.get(row.name)
        if scale is not None and scale.active(self.clock()):
            self._activity[row.name] = time.time()
            return max(spec_min, scale.min)
        return spec_min

    def scale_view(self, name: str) -> dict:
        """``{"name", "scale": Scale.view or None, "min_workers": declared}``."""
        row = self.require(name)
        scale = self.scales.get(name)
        return {"name": name, "scale": scale.view(self.clock()) if scale else None,
                "min_workers": int(self._spec_value(row, "min_workers", 0) or 0)}

    # -- the card inventory
    def card_inventory(self, refresh: bool = False) -> dict:
        """The machine's cards (gpus.inventory), read once and kept."""
        if self._inventory is None or refresh:
            self._inventory = inventory()
        return self._inventory

    def _running(self) -> list[tuple[str, str, Any, Any]]:
        """``(deployment, role, gpu=, WorkerProc)`` of every running worker."""
        out = []
        with self._lock:
            for w in list(self.workers.values()) + list(self._retiring):
                row = self.store.get(w.name)
                spec = w.spec or (row.spec if row else None) or {}
                out.append((w.name, w.role.value, (spec.get("resources") or {}).get("gpu"), w))
        return out

    def gpus_view(self) -> dict:
        """``GET /v1/gpus``: the inventory, what each deployment holds and what is free."""
        inv = self.card_inventory()
        return {**inv, **holdings([(n, r, g) for n, r, g, _ in self._running()], inv),
                "check": "local" if not self.launcher.places_cards else "off (the Ray cluster places cards)"}

    def refuse_missing_card(self, key: str, w: Any, spec: Optional[dict]) -> bool:
        """Stop worker ``w`` (``workers[key]``) and record why when its ``spec`` declares a ``gpu=``
        this machine lacks; returns whether it did. A serving worker's deployment is marked failed, a
        build's version failed (the serving one stays). With the Ray backend the cluster decides."""
        if self.launcher.places_cards or not spec:
            return False
        why = gpu_refusal((spec.get("resources") or {}).get("gpu"), self.card_inventory())
        if why is None:
            return False
        w.stopping = True
        _terminate(w.proc)
        self.workers.pop(key, None)
        if w.log_handle:
            w.log_handle.close()
        msg = f"refused at deploy: {why['detail']}"
        hint = "declare a card this machine has (`seq gpus` lists them) or gpu=\"cpu\", then deploy again"
        details = {**why, "hint": hint}
        if w.role is Role.BUILD:
            row = self.store.get(w.name)
            self.store.update(w.name, build={**((row.build if row else None) or {}), "status": "failed",
                                             "phase": "failed", "error": msg, "details": details})
        else:
            self.store.update(w.name, status="failed", phase="failed", error=msg, details=details, served=0,
                              worker_port=None, worker_pid=None)
        self.store.update_version(w.name, w.version, status="failed", error=msg)
        log.warning("%s v%d: %s", w.name, w.version, msg)
        return True

    # -- usage
    def take_worker_usage(self, name: str, pid: Optional[int], usage: Optional[dict]) -> int:
        """Fold one serving worker's ``/ping`` usage (usage.ActMeter.snapshot) into the meter;
        returns the last sample number taken (the next ping's ``usage_since``)."""
        if not usage:
            return -1
        key = (name, pid)
        last = self._seen_counts.get(key) or {}
        if usage.get("requests", 0) < last.get("requests", 0):
            last = {}                                   # a new process under a reused pid
        delta = {c: usage.get(c, 0) - last.get(c, 0) for c in ("requests", "errors", "bytes_in", "bytes_out")}
        self._seen_counts[key] = {c: usage.get(c, 0) for c in delta}
        self._seen_seq[key] = int(usage.get("seq", -1))
        now = time.time()
        self.recent.add(name, usage.get("samples") or [], now)
        if any(delta.values()):
            row = self.store.get(name)
            self.usage.add([(name, card_of(row.spec if row else None), now, delta)])
        return self._seen_seq[key]

    def usage_since(self, name: str, pid: Optional[int]) -> int:
        """The ``usage_since`` to ask worker ``pid`` of ``name`` for (-1: everything it kept)."""
        return self._seen_seq.get((name, pid), -1)

    def _meter_workers(self, now: float) -> None:
        """Add the seconds since the last tick to every running worker's (deployment, card)."""
        if self._metered_at is not None:
            dt = max(0.0, min(now - self._metered_at, 10.0))
            for name, _role, gpu, _w in self._running():
                card = card_of({"resources": {"gpu": gpu}})
                self._pending[(name, card)] = self._pending.get((name, card), 0.0) + dt
        self._metered_at = now
        if now - self._flushed_at >= _FLUSH_S:
            self.flush_usage(now)

    def flush_usage(self, now: Optional[float] = None) -> None:
        """Write the pending worker-seconds to state.db."""
        now = now or time.time()
        pending, self._pending = self._pending, {}
        self._flushed_at = now
        self.usage.add([(n, c, now, {"worker_s": s}) for (n, c), s in pending.items() if s > 0])

    def usage_view(self, name: str, since: float = 0.0) -> dict:
        """``seq policy usage NAME --since``: ``{"name", "since", "totals", "hours", "captured_bytes",
        "last_hour"}`` (worker-seconds by card type; the unflushed seconds included)."""
        self.require(name)
        self.flush_usage()
        totals = self.usage.totals({name}, since).get(name) or {"worker_s": {}, "requests": 0, "errors": 0,
                                                                  "bytes_in": 0, "bytes_out": 0}
        return {"name": name, "since": since, "totals": totals, "hours": self.usage.hours(name, since),
                "captured_bytes": dir_bytes(self.data_dir / "capture" / name),
                "last_hour": self.recent.stats(name, time.time())}

    def account_usage(self, names: set) -> dict:
        """Per deployment in ``names``: today's and all-time usage, and captured bytes."""
        self.flush_usage()
        today = self._day_start()
        all_time, day = self.usage.totals(names), self.usage.totals(names, today)
        return {n: {"total": all_time.get(n), "today": day.get(n),
                    "captured_bytes": dir_bytes(self.data_dir / "capture" / n)} for n in sorted(names)}

    @staticmethod
    def _day_start() -> float:
        d = datetime.now(timezone.utc)
        return datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()

    # -- limits
    def _scope_names(self, scope: str) -> Optional[set]:
        """The deployments a limit scope covers (None: every one)."""
        if scope == "account":
            return None
        rec = next((k for k in self.keys.list() if k.id == scope[4:]), None)
        return {rec.deployment} if rec is not None and rec.deployment else None

    def check_quota(self, key: Optional[KeyRecord], model: str, action: str) -> None:
        """Raise ``quota_exceeded`` (and alert ``quota_reached``) when ``action`` (``connect`` /
        ``build``) of ``model`` would pass a limit of the account or of ``key``."""
        scopes = ["account"] + ([f"key:{key.id}"] if key is not None else [])
        row = self.store.get(model)
        new_cards = 0
        if row is not None and row.spec:
            new_cards = declared_cards((row.spec.get("resources") or {}).get("gpu"))[1]
        running = self._running()
        for scope in scopes:
            lim = self.limits.get(scope)
            if lim is None:
                continue
            names = self._scope_names(scope)
            mine = [r for r in running if names is None or r[0] in names]
            starts = action == "build" or model not in self.workers
            if self._pending:
                self.flush_usage()
            used_h = self.usage.worker_s_since(names, self._day_start()) / 3600.0
            err = refusal(lim, action=action, model=model, starts_worker=starts, workers=len(mine),
                          cards=sum(declared_cards(r[2])[1] for r in mine), new_cards=new_cards,
                          worker_hours_today=used_h)
            if err is not None:
                self.alerts.emit("quota_reached", model, err.details, once_per_s=60.0,
                                 key=(scope, err.details["limit"]))
                log.warning("%s: %s", model, err.detail)
                raise err

    def limits_view(self) -> dict:
        """Every scope's limits with what is used now in it."""
        running = self._running()
        out = []
        for lim in self.limits.all():
            names = self._scope_names(lim.scope)
            mine = [r for r in running if names is None or r[0] in names]
            out.append({**lim.to_dict(), "used": {
                "max_workers": len(mine), "max_cards": sum(declared_cards(r[2])[1] for r in mine),
                "worker_hours_per_day": round(self.usage.worker_s_since(names, self._day_start()) / 3600.0, 4)}})
        return {"limits": out}

    # -- alerts
    @staticmethod
    def _failure_keys(row: DeploymentRow) -> list[tuple]:
        keys = []
        b = row.build or {}
        if b.get("status") == "failed":
            keys.append(("build_failed", row.name, b.get("version"), b.get("started_at")))
        if row.status == "failed" and row.phase != "exited" and not row.served:
            keys.append(("build_failed", row.name, row.version, row.started_at))
        return keys

    def _watch_failures(self) -> None:
        """Alert ``build_failed`` for each failed version not alerted yet (a failed first start,
        or a build beside the serving version)."""
        for row in self.store.all():
            for k in self._failure_keys(row):
                if k in self._alerted:
                    continue
                self._alerted.add(k)
                b = row.build or {}
                if b.get("status") == "failed" and k[2] == b.get("version") and k[3] == b.get("started_at"):
                    details = {"version": b.get("version"), "error": b.get("error"), "serving": row.version}
                else:
                    details = {"version": row.version, "error": row.error, "serving": None}
                self.alerts.emit(k[0], row.name, details)

    def alert_crash(self, name: str, version: int, pid: int, code: Optional[int], error: str) -> None:
        """The serving worker ``pid`` of ``name`` exited while serving: alert ``worker_crashed``."""
        self.alerts.emit("worker_crashed", name, {"version": version, "pid": pid, "exit_code": code, "error": error})

    def _watch_rates(self, now: float) -> None:
        hooks = [h for h in self.webhooks.all() if h.error_rate is not None or h.p95_ms is not None]
        if not hooks:
            return
        for row in self.store.all():
            stats = self.recent.stats(row.name, now)
            for h in hooks:
                if stats["requests"] < h.min_requests:
                    continue
                for event, value, limit in (("error_rate", stats["error_rate"], h.error_rate),
                                            ("p95_latency", stats["p95_ms"], h.p95_ms)):
                    if limit is None or not h.wants(event, row.name):
                        continue
                    k = (event, h.id, row.name)
                    if value > limit and k not in self._alerted:
                        self._alerted.add(k)
                        self.alerts.send(h, event, row.name, {**stats, "threshold": limit, "window_s": self.recent.window_s})
                    elif value <= limit:
                        self._alerted.discard(k)           # back below: the next crossing alerts again

    def ops_tick(self) -> None:
        """Once a second: meter worker-seconds, alert on new failures and crossed thresholds."""
        now = time.time()
        self._meter_workers(now)
        self._watch_failures()
        self._watch_rates(now)
