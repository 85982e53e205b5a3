"""Platform operations as one service, :class:`OpsService`: scheduled warm floors (schedule.py),
usage metering (usage.py), limits (quotas.py), alerts (alerts.py) and the card inventory
(gpus.py). It owns those stores and its own counters; what it reads of the gateway comes in
through its constructor (the deployment rows, a ``require`` and a key lookup, all plain callables
or the :class:`Rows` protocol) or as arguments (the running workers, :class:`Running`), so this
package imports nothing of the gateway's.

``tick(now, running)`` runs once a second from the gateway's control tick: it meters
worker-seconds, notices failed builds, and judges each webhook's error-rate and p95 thresholds.
The health check hands each serving worker's ``/ping`` usage to ``take_worker_usage``. The
supervisor asks ``warm_floor`` how many workers to keep warm, ``card_refusal`` whether a
declared ``gpu=`` names a card this machine lacks and ``cards`` (cards.py) which cards a worker is
pinned to; connect and deploy ask ``check_quota``; a
crashed worker reaches ``alert_crash`` as a supervisor event.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence

from sequence_ai_server.common.state_db import StateDB
from sequence_ai_server.ops.alerts import Dispatcher, WebhookStore
from sequence_ai_server.ops.cards import CardPins, CardPool
from sequence_ai_server.ops.gpus import declared_cards, gpu_refusal, holdings, inventory
from sequence_ai_server.ops.quotas import LimitStore, refusal
from sequence_ai_server.ops.schedule import ScaleStore
from sequence_ai_server.ops.usage import Recent, UsageStore, card_of, dir_bytes
from sequence_ai_server.ops.usage_cursor import COUNTERS, UsageCursors

__all__ = ["OpsService", "Running", "Rows"]

log = logging.getLogger("sequence_ai_server.gateway")

_FLUSH_S = 5.0           # worker-seconds are written to state.db this often


class Running(NamedTuple):
    """One running worker as ops counts it: its deployment, role (``serving``, ``build``, ``side``,
    ``retiring``) and declared ``gpu=`` (None when it declares none)."""
    name: str
    role: str
    gpu: Any


class Rows(Protocol):
    """The deployment rows ops reads (the gateway's store): each row has ``name``, ``version``,
    ``status``, ``phase``, ``served``, ``error``, ``started_at``, ``build``, ``spec``,
    ``worker_pid`` (its serving worker's) and ``spec_value(key, default)``."""

    def get(self, name: str) -> Any: ...
    def all(self) -> list: ...


class OpsService:
    """Schedules, usage, limits, alerts and the card inventory over one state.db connection.

    ``state``: state.db as common/state_db.py's StateDB (the gateway's Store; the stores share its
    connection and lock through it). ``rows``: the deployment rows. ``require(name)``: the row, or
    raises ApiError not_found. ``key_deployment(id)``: the deployment a key id is bound to (None:
    unbound or unknown). ``places_cards``: whether something else (a Ray cluster) places cards, so
    no ``gpu=`` is checked here. ``alert_backoff_s``: waits (s) before each webhook retry.
    ``fake_gpus``: ``SEQ_FAKE_GPUS``'s card names (a fake inventory, gpus.fake_cards). ``clock``:
    unix s, the time of everything here, scheduled scaling's windows included (injectable: a test
    moves it by hand)."""

    def __init__(self, state: StateDB, rows: Rows, data_dir: Path, *, require: Callable[[str], Any],
                 key_deployment: Callable[[str], Optional[str]], places_cards: bool = False,
                 alert_backoff_s: Sequence[float] = (0.5, 1.0, 2.0, 4.0),
                 fake_gpus: Optional[Sequence[str]] = None, clock: Callable[[], float] = time.time) -> None:
        self.rows, self.data_dir, self.require = rows, data_dir, require
        self._key_deployment, self.places_cards = key_deployment, places_cards
        self._now = clock
        self.scales = ScaleStore(state)
        self.usage = UsageStore(state)
        self.limits = LimitStore(state)
        self.webhooks = WebhookStore(state)
        self.alerts = Dispatcher(self.webhooks, backoff_s=tuple(alert_backoff_s))
        self.recent = Recent()
        self._inventory: Optional[dict] = None
        self._fake_gpus = tuple(fake_gpus) if fake_gpus else None
        self._pins: Optional[CardPins] = None
        self._metered_at: Optional[float] = None
        self._pending: dict[tuple, float] = {}       # (deployment, card) -> worker-seconds not yet written
        self._pending_lock = threading.Lock()        # the tick adds to it while request threads flush it
        self._flushed_at = clock()
        # (deployment, worker pid) -> the last usage sample and counters collected, kept in run/ so a
        # restarted gateway goes on from there with the workers it adopts (usage_cursor.py)
        self._cursors = UsageCursors(data_dir / "run" / "usage_cursors.json")
        self._alerted: set = set()                    # events already sent (build/crash keys, rate crossings)
        for row in self.rows.all():                   # what failed before this gateway started is not news
            self._alerted.update(self._failure_keys(row))

    def clock(self) -> float:
        """Unix s for scheduled scaling: the injected clock."""
        return self._now()

    # -- scheduled scaling
    def warm_floor(self, row: Any) -> int:
        """Workers to keep warm for deployment ``row`` now: its ``min_workers`` or, while its
        scheduled window is open, the scheduled ``--min`` (the larger). The supervisor counts a
        deployment with a floor of 1 or more as active, so its worker idles out only
        ``idle_timeout`` after the window closes."""
        spec_min = int(row.spec_value("min_workers", 0) or 0)
        scale = self.scales.get(row.name)
        if scale is not None and scale.active(self.clock()):
            return max(spec_min, scale.min)
        return spec_min

    def scale_view(self, name: str) -> dict:
        """``{"name", "scale": Scale.view or None, "min_workers": declared}``."""
        row = self.require(name)
        scale = self.scales.get(name)
        return {"name": name, "scale": scale.view(self.clock()) if scale else None,
                "min_workers": int(row.spec_value("min_workers", 0) or 0)}

    # -- the card inventory
    def card_inventory(self, refresh: bool = False) -> dict:
        """The machine's cards (gpus.inventory), read once and kept."""
        if self._inventory is None or refresh:
            self._inventory = inventory(fake=self._fake_gpus)
        return self._inventory

    @property
    def cards(self) -> CardPins:
        """Which worker holds which card (cards.py), over this machine's inventory; claims are
        kept in ``run/cards.json`` for a restarted gateway."""
        if self._pins is None:
            (self.data_dir / "run").mkdir(parents=True, exist_ok=True)
            pool = CardPool(self.card_inventory()["cards"], self.data_dir / "run" / "cards.json")
            self._pins = CardPins(pool, lambda gpu: gpu_refusal(gpu, self.card_inventory()),
                                  lambda: {r.name: r.worker_pid for r in self.rows.all() if r.worker_pid})
        return self._pins

    def gpus_view(self, running: list[Running]) -> dict:
        """``GET /v1/gpus``: the inventory, what each deployment holds of it (``running``: the
        running workers) and what is free. Locally each card names its holders (``held_by``:
        deployment, worker key, role, pid) and a deployment's cards are the ones it holds."""
        inv = self.card_inventory()
        out = {**inv, **holdings([tuple(r) for r in running], inv),
               "check": "local" if not self.places_cards else "off (the Ray cluster places cards)"}
        if self.places_cards:
            return out
        cards = self.cards.view()
        for entry in out["held"].values():
            entry["cards"] = {}
        for c in cards:
            for name in sorted({h["deployment"] for h in c["held_by"]}):
                entry = out["held"].setdefault(name, {"workers": 0, "cards": {}})
                entry["cards"][c["type"]] = entry["cards"].get(c["type"], 0) + 1
        out["free"] = {t: sum(1 for c in cards if c["type"] == t and not c["held_by"]) for t in inv["types"]}
        out["cards"] = cards
        return out

    def card_refusal(self, spec: Optional[dict]) -> Optional[dict]:
        """Why a worker whose loaded ``spec`` declares ``gpu=`` cannot run on this machine
        (``{"detail", ..., "hint"}``), or None when it can (or the Ray cluster places cards)."""
        if self.places_cards or not spec:
            return None
        why = gpu_refusal((spec.get("resources") or {}).get("gpu"), self.card_inventory())
        if why is None:
            return None
        hint = "declare a card this machine has (`seq gpus` lists them) or gpu=\"cpu\", then deploy again"
        return {**why, "hint": hint}

    # -- usage
    def take_worker_usage(self, name: str, pid: Optional[int], usage: Optional[dict]) -> int:
        """Fold one serving worker's ``/ping`` usage (usage.ActMeter.snapshot) into the meter;
        returns the last sample number taken (the next ping's ``usage_since``). The cursor is
        written before the delta is added: a gateway killed in between loses that one delta
        rather than counting it twice."""
        if not usage:
            return -1
        last = self._cursors.counts(name, pid)
        if usage.get("requests", 0) < last.get("requests", 0):
            last = {}                                   # a new process under a reused pid
        delta = {c: usage.get(c, 0) - last.get(c, 0) for c in COUNTERS}
        seq = int(usage.get("seq", -1))
        self._cursors.put(name, pid, seq, {c: usage.get(c, 0) for c in COUNTERS})
        now = self._now()
        self.recent.add(name, usage.get("samples") or [], now)
        if any(delta.values()):
            row = self.rows.get(name)
            self.usage.add([(name, card_of(row.spec if row else None), now, delta)])
        return seq

    def usage_since(self, name: str, pid: Optional[int]) -> int:
        """The ``usage_since`` to ask worker ``pid`` of ``name`` for (-1: everything it kept)."""
        return self._cursors.seq(name, pid)

    def _meter_workers(self, now: float, running: list[Running]) -> None:
        """Add the seconds since the last tick to every running worker's (deployment, card)."""
        if self._metered_at is not None:
            dt = max(0.0, min(now - self._metered_at, 10.0))
            with self._pending_lock:
                for name, _role, gpu in running:
                    card = card_of({"resources": {"gpu": gpu}})
                    self._pending[(name, card)] = self._pending.get((name, card), 0.0) + dt
        self._metered_at = now
        if now - self._flushed_at >= _FLUSH_S:
            self.flush_usage(now)

    def flush_usage(self, now: Optional[float] = None) -> None:
        """Write the pending worker-seconds to state.db."""
        now = now or self._now()
        with self._pending_lock:
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
                "last_hour": self.recent.stats(name, self._now())}

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
        bound = self._key_deployment(scope[4:])
        return {bound} if bound else None

    def check_quota(self, key_id: Optional[str], model: str, action: str, running: list[Running],
                    starts_worker: bool) -> None:
        """Raise ApiError ``quota_exceeded`` (and alert ``quota_reached``) when ``action``
        (``connect`` / ``build``) of ``model`` would pass a limit of the account or of the key
        ``key_id`` (None: no key). ``running``: the running workers; ``starts_worker``: whether
        ``model`` has no serving worker yet (a connect would start one)."""
        scopes = ["account"] + ([f"key:{key_id}"] if key_id is not None else [])
        row = self.rows.get(model)
        new_cards = 0
        if row is not None and row.spec:
            new_cards = declared_cards((row.spec.get("resources") or {}).get("gpu"))[1]
        for scope in scopes:
            lim = self.limits.get(scope)
            if lim is None:
                continue
            names = self._scope_names(scope)
            mine = [r for r in running if names is None or r[0] in names]
            starts = action == "build" or starts_worker
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

    def limits_view(self, running: list[Running]) -> dict:
        """Every scope's limits with what is used now in it (``running``: the running workers)."""
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
    def _failure_keys(row: Any) -> list[tuple]:
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
        for row in self.rows.all():
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
        """The serving worker ``pid`` of ``name`` exited while serving (``code``: its exit status,
        None when unknown): alert ``worker_crashed``."""
        self.alerts.emit("worker_crashed", name, {"version": version, "pid": pid, "exit_code": code, "error": error})

    def _watch_rates(self, now: float) -> None:
        hooks = [h for h in self.webhooks.all() if h.error_rate is not None or h.p95_ms is not None]
        if not hooks:
            return
        for row in self.rows.all():
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

    def tick(self, now: float, running: list[Running]) -> None:
        """Once a second (``now``: unix s; ``running``: the running workers): meter worker-seconds,
        alert on new failures and crossed thresholds."""
        self._meter_workers(now, running)
        self._watch_failures()
        self._watch_rates(now)
