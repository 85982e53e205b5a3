"""Scheduled scaling (``seq policy scale NAME --min N [--during "Mon-Fri 08:00-18:00" --tz ZONE]``):
a warm floor per deployment, optionally only inside a weekly window in a time zone.

Inside the window (or always, without ``--during``) the supervisor keeps the deployment's worker
running with no robot connected, as ``min_workers`` does; outside it the worker idles out after
its ``idle_timeout`` like any other. A deployment runs one serving worker on this gateway, so any
``--min`` of 1 or more keeps that worker warm; the number is kept and shown as given.

Windows: ``DAYS HH:MM-HH:MM``; DAYS is a day (``Mon``), a range (``Mon-Fri``, ``Fri-Mon`` wraps)
or a comma list of those (``Mon,Wed,Sat-Sun``), or ``daily``. The end is exclusive; an end at or
before the start runs past midnight into the next day (the window belongs to the day it opens).
Minute granularity. The clock is the gateway's (``Gateway.clock``), which a test may replace.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Optional
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sequence_ai_server.common.state_db import StateDB

__all__ = ["Window", "parse_window", "zone", "Scale", "ScaleStore"]

_DAYS = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
_WINDOW = re.compile(r"^\s*(?P<days>[A-Za-z,\- ]+?)\s+(?P<h1>\d{1,2}):(?P<m1>\d{2})\s*-\s*(?P<h2>\d{1,2}):(?P<m2>\d{2})\s*$")
# the longest window text read: the pattern backtracks over runs of spaces (cubic in the length),
# so a long string is refused before matching (a real window is a few dozen characters)
MAX_WINDOW_CHARS = 120
_HINT = 'write e.g. "Mon-Fri 08:00-18:00", "Sat,Sun 10:00-14:00" or "daily 22:00-06:00"'


@dataclass(frozen=True)
class Window:
    """A weekly window: ``days`` (0 = Monday) it opens on, ``start`` and ``end`` in minutes after
    midnight (end exclusive; ``end <= start`` runs past midnight)."""
    days: frozenset
    start: int
    end: int

    def active(self, local: datetime) -> bool:
        """Whether the local time ``local`` is inside the window."""
        minute = local.hour * 60 + local.minute
        if self.end > self.start:
            return local.weekday() in self.days and self.start <= minute < self.end
        if local.weekday() in self.days and minute >= self.start:
            return True
        return (local.weekday() - 1) % 7 in self.days and minute < self.end

    def next_change(self, local: datetime) -> datetime:
        """The first minute after ``local`` at which :meth:`active` changes (at most a week on)."""
        now = self.active(local)
        t = local.replace(second=0, microsecond=0)
        for _ in range(7 * 24 * 60 + 1):
            t += timedelta(minutes=1)
            if self.active(t) != now:
                return t
        return t


def _day(word: str, text: str) -> int:
    w = word.strip().lower()[:3]
    if w not in _DAYS:
        raise ValueError(f"{word.strip()!r} in {text!r} is not a day (Mon..Sun); {_HINT}")
    return _DAYS.index(w)


def parse_window(text: str) -> Window:
    """The :class:`Window` ``text`` spells (see the module docstring). Raises ValueError naming
    what is wrong and showing the form (also for a text over ``MAX_WINDOW_CHARS``)."""
    if not isinstance(text, str) or len(text) > MAX_WINDOW_CHARS:
        raise ValueError(f"a window is at most {MAX_WINDOW_CHARS} characters, got "
                         f"{len(text) if isinstance(text, str) else type(text).__name__}; {_HINT}")
    m = _WINDOW.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a window; {_HINT}")
    days: set[int] = set()
    spec = m.group("days").strip()
    if spec.lower() in ("daily", "every day", "all"):
        days = set(range(7))
    else:
        for part in spec.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                i, j = _day(a, text), _day(b, text)
                days.update((i + k) % 7 for k in range((j - i) % 7 + 1))
            else:
                days.add(_day(part, text))
    h1, m1, h2, m2 = (int(m.group(k)) for k in ("h1", "m1", "h2", "m2"))
    for h, mm in ((h1, m1), (h2, m2)):
        if not (0 <= h <= 24 and 0 <= mm < 60) or (h == 24 and mm):
            raise ValueError(f"{h:02d}:{mm:02d} in {text!r} is not a time of day (00:00-24:00); {_HINT}")
    start, end = h1 * 60 + m1, h2 * 60 + m2
    if start == end:
        raise ValueError(f"{text!r} opens and closes at the same minute; {_HINT}")
    return Window(frozenset(days), start, end % (24 * 60) if end == 24 * 60 and start == 0 else end)


def zone(name: Optional[str]) -> ZoneInfo:
    """The IANA time zone ``name`` (default ``UTC``). Raises ValueError for an unknown one."""
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}; give an IANA name such as Europe/Berlin or "
                         "America/Los_Angeles") from None


@dataclass(frozen=True)
class Scale:
    """One deployment's scheduled floor: ``min`` workers warm during ``during`` (None: always)
    in time zone ``tz``; ``updated_at`` unix s."""
    name: str
    min: int
    during: Optional[str]
    tz: str
    updated_at: float

    def active(self, now: float) -> bool:
        """Whether the floor applies at unix time ``now``."""
        if self.min < 1:
            return False
        if not self.during:
            return True
        return parse_window(self.during).active(datetime.fromtimestamp(now, zone(self.tz)))

    def view(self, now: float) -> dict:
        """``{"min", "during", "tz", "active", "warm_now", "next_change"}`` at unix time ``now``
        (``next_change``: unix s, None without a window)."""
        active = self.active(now)
        nxt = None
        if self.during:
            local = datetime.fromtimestamp(now, zone(self.tz))
            nxt = parse_window(self.during).next_change(local).timestamp()
        return {"min": self.min, "during": self.during, "tz": self.tz, "active": active,
                "warm_now": self.min if active else 0, "next_change": nxt, "updated_at": self.updated_at}


class ScaleStore:
    """The ``scale`` table of state.db (through the gateway's Store, a StateDB)."""

    def __init__(self, state: StateDB):
        self._sql = state
        with self._sql.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS scale (name TEXT PRIMARY KEY, min INTEGER NOT NULL, "
                       "during TEXT, tz TEXT NOT NULL, updated_at REAL NOT NULL)")

    def set(self, name: str, minimum: int, during: Optional[str], tz: Optional[str]) -> Scale:
        """Store the floor of ``name``. Raises ValueError for a negative ``minimum``, a bad window
        or an unknown zone (nothing is stored then)."""
        if minimum < 0:
            raise ValueError(f"--min {minimum} is negative; give 0 or more workers")
        if during:
            parse_window(during)
        zone(tz)
        s = Scale(name, int(minimum), during or None, tz or "UTC", time.time())
        with self._sql.transaction() as db:
            db.execute("INSERT OR REPLACE INTO scale (name, min, during, tz, updated_at) VALUES (?, ?, ?, ?, ?)",
                       (s.name, s.min, s.during, s.tz, s.updated_at))
        return s

    def get(self, name: str) -> Optional[Scale]:
        """The floor of ``name``, or None."""
        with self._sql.read() as db:
            r = db.execute("SELECT name, min, during, tz, updated_at FROM scale WHERE name = ?", (name,)).fetchone()
        return Scale(*tuple(r)) if r else None

    def all(self) -> dict[str, Scale]:
        """``{deployment: Scale}``."""
        with self._sql.read() as db:
            rows = db.execute("SELECT name, min, during, tz, updated_at FROM scale").fetchall()
        return {r[0]: Scale(*tuple(r)) for r in rows}

    def clear(self, name: str) -> bool:
        """Remove the floor of ``name``; whether there was one."""
        with self._sql.transaction() as db:
            return db.execute("DELETE FROM scale WHERE name = ?", (name,)).rowcount > 0
