"""Pacing: the monotonic schedule actions are released on.

Action k is due at ``base_t + (k - base_k) * period``: deadlines are computed, never
accumulated from sleeps, so the rate does not drift however long each act() takes. Three
events re-base the schedule, and only these:

- the control frequency changes (a chunk at another rate starts): the next deadline is the
  previous one plus the *old* period, and the new period applies from there;
- an underrun: the action that waited for its chunk is released on arrival, and the schedule
  continues from that instant;
- the loop fell more than one period behind (a slow act() or observe()): it does not burst to
  catch up; it resyncs to now and the caller counts a late tick.
"""
from __future__ import annotations

__all__ = ["Pacer"]


class Pacer:
    """Deadlines on ``time.monotonic()`` seconds for action indices 0, 1, 2 ..."""

    def __init__(self, start_t: float, period_s: float) -> None:
        self.base_t = start_t
        self.base_k = 0
        self.period_s = period_s

    def deadline(self, k: int) -> float:
        """When action ``k`` is due (monotonic seconds)."""
        return self.base_t + (k - self.base_k) * self.period_s

    def set_period(self, k: int, period_s: float) -> None:
        """From action ``k`` on, use ``period_s``; action k keeps the deadline it had."""
        if period_s != self.period_s:
            self.base_t = self.deadline(k)
            self.base_k = k
            self.period_s = period_s

    def resync(self, k: int, t: float) -> None:
        """Action ``k`` is due at ``t``; later ones follow at the current period."""
        self.base_t = t
        self.base_k = k

    def is_late(self, k: int, now: float) -> bool:
        """More than one full period behind action ``k``'s deadline."""
        return now - self.deadline(k) > self.period_s
