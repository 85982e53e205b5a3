"""Limits per account or per key (``seq account limits``): concurrent workers, cards, and
worker-hours per day. Reaching one refuses new connects and builds with ``quota_exceeded``
(HTTP 402) naming the limit; nothing that already runs is cut: open sessions keep renewing their
leases and acting on their worker until the robot closes them.

A limit's scope is the account (every deployment) or one key (``key:<id>``: the deployments that
key reaches, its own one for a key bound to a deployment). What counts:

- ``max_workers``: worker processes running in the scope (serving, building, side); a connect is
  refused only when it would start one, a build always starts one.
- ``max_cards``: cards those workers declare (``gpu="TYPE:N"`` is N; ``cpu`` is none); checked
  like ``max_workers`` against what the new worker declares.
- ``worker_hours_per_day``: worker-hours metered in the scope since 00:00 UTC (usage.py); once
  reached, every new connect and build is refused until the day turns.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Optional

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.state_db import StateDB

__all__ = ["Limits", "LimitStore", "LIMIT_NAMES", "refusal"]

LIMIT_NAMES = {"max_workers": "concurrent workers", "max_cards": "cards",
               "worker_hours_per_day": "worker-hours per day"}
_FLAGS = {"max_workers": "--workers", "max_cards": "--cards", "worker_hours_per_day": "--worker-hours"}


@dataclass(frozen=True)
class Limits:
    """The limits of one scope (``account`` or ``key:<id>``); None is no limit."""
    scope: str
    max_workers: Optional[int] = None
    max_cards: Optional[int] = None
    worker_hours_per_day: Optional[float] = None
    updated_at: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class LimitStore:
    """The ``limits`` table of state.db (through the gateway's Store, a StateDB)."""

    def __init__(self, state: StateDB):
        self._sql = state
        with self._sql.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS limits (scope TEXT PRIMARY KEY, max_workers INTEGER, "
                       "max_cards INTEGER, worker_hours_per_day REAL, updated_at REAL NOT NULL)")

    def set(self, scope: str, **values: Optional[float]) -> Limits:
        """Set the given limits of ``scope`` (a None value removes that limit; the others stay).
        Raises ValueError for a negative value."""
        for k, v in values.items():
            if v is not None and v < 0:
                raise ValueError(f"{_FLAGS.get(k, k)} {v} is negative; give 0 or more, or --clear")
        old = self.get(scope) or Limits(scope)
        fields = {k: (values[k] if k in values else getattr(old, k)) for k in LIMIT_NAMES}
        new = Limits(scope, **fields, updated_at=time.time())
        with self._sql.transaction() as db:
            db.execute("INSERT OR REPLACE INTO limits (scope, max_workers, max_cards, worker_hours_per_day, "
                       "updated_at) VALUES (?, ?, ?, ?, ?)",
                       (scope, new.max_workers, new.max_cards, new.worker_hours_per_day, new.updated_at))
        return new

    def get(self, scope: str) -> Optional[Limits]:
        """The limits of ``scope``, or None."""
        with self._sql.read() as db:
            r = db.execute("SELECT scope, max_workers, max_cards, worker_hours_per_day, updated_at FROM limits "
                           "WHERE scope = ?", (scope,)).fetchone()
        return Limits(*tuple(r)) if r else None

    def all(self) -> list[Limits]:
        """Every scope's limits, account first."""
        with self._sql.read() as db:
            rows = db.execute("SELECT scope, max_workers, max_cards, worker_hours_per_day, updated_at "
                              "FROM limits ORDER BY scope != 'account', scope").fetchall()
        return [Limits(*tuple(r)) for r in rows]

    def clear(self, scope: str) -> bool:
        """Remove every limit of ``scope``; whether it had any."""
        with self._sql.transaction() as db:
            return db.execute("DELETE FROM limits WHERE scope = ?", (scope,)).rowcount > 0


def refusal(lim: Limits, *, action: str, model: str, starts_worker: bool, workers: int, cards: int,
            new_cards: int, worker_hours_today: float) -> Optional[ApiError]:
    """The ``quota_exceeded`` error when ``action`` (``connect`` or ``build``) of deployment
    ``model`` would pass a limit of ``lim``, else None. ``workers`` / ``cards``: what runs in the
    scope now; ``new_cards``: what a new worker of ``model`` declares; ``worker_hours_today``:
    metered in the scope since 00:00 UTC."""
    whose = "the account's" if lim.scope == "account" else f"key {lim.scope[4:]}'s"
    flag_scope = "" if lim.scope == "account" else f" --key {lim.scope[4:]}"
    hit = None
    if lim.worker_hours_per_day is not None and worker_hours_today >= lim.worker_hours_per_day:
        hit = ("worker_hours_per_day", lim.worker_hours_per_day, round(worker_hours_today, 4),
               f"{worker_hours_today:.3g} worker-hours were used today (UTC)")
    elif starts_worker and lim.max_workers is not None and workers + 1 > lim.max_workers:
        hit = ("max_workers", lim.max_workers, workers, f"{workers} worker(s) run")
    elif starts_worker and new_cards and lim.max_cards is not None and cards + new_cards > lim.max_cards:
        hit = ("max_cards", lim.max_cards, cards, f"{cards} card(s) are held and {model!r} asks for {new_cards}")
    if hit is None:
        return None
    limit, value, used, what = hit
    verb = "start a worker" if action == "connect" else "build a new version"
    return ApiError("quota_exceeded",
                    f"{whose} limit of {value:g} {LIMIT_NAMES[limit]} ({limit}) is reached: {what}; "
                    f"{model!r} cannot {verb}. Sessions already open keep running.",
                    details={"reason": "quota_reached", "limit": limit, "scope": lim.scope, "value": value,
                             "used": used, "action": action, "deployment": model},
                    hint=f"stop a deployment (`seq policy stop NAME`) or raise it: "
                         f"`seq account limits {_FLAGS[limit]} N{flag_scope}`")
