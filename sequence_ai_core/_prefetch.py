"""When to start the next request: the worst recent refill turnaround against buffer time left.

The next chunk has to arrive before the current rows run out. The loop knows how many seconds
of actions it still holds; this module knows how long a refill has been taking. The request
starts once the buffer's time left falls to the planned refill time plus one control period:
starting earlier only makes the observation staler (the overlap is open loop), starting later
risks an underrun.

Decisions, in one place:

- The figure planned for is the MAXIMUM of the recent turnarounds, not their mean (nor a mean
  plus some spread). Turnarounds on a shared worker are not noise around a mean: robots whose
  requests land together queue behind each other on the replica, so the late ones wait several
  inference times while the early ones wait none, and which robot is late changes from chunk to
  chunk. A mean-based plan sizes the slack for the typical wait and underruns on every
  queued one; the maximum sizes it for the queue the robot has actually met.
- A turnaround is request start to chunk in hand, as the loop measures it (``_loop._harvest``):
  ``observe()``, encoding, the round trip, the queue at the worker, the inference, and the
  loop noticing the answer. That is everything that must fit into the time left.
- The window is bounded (``WINDOW`` = 16 requests, about 8.5 s at 15 Hz with 8-row chunks), so a
  one-off spike (a GC pause, a start-up burst of robots) is planned for while it is recent and
  forgotten after ``WINDOW`` further requests instead of staying the maximum forever. 16 rather
  than 8: stalls of a shared host recur every few seconds, and remembering one costs only an
  earlier request (an observation older by at most the spike), while forgetting it too soon
  costs an underrun the next time.
- The first request of a connection is cold (it opens the connection to the worker, and when a
  fleet starts together every robot's first request lands on the replica at once) and is not
  a sample of the steady state: it is kept apart (``cold_s``) and never enters the window.
- One control period on top, for what the turnaround does not measure: the client's own
  scheduling (a wake that comes late on a busy machine, the answer read and the chunk harvested
  only when the loop next runs). The loop wakes at the trigger itself (``_loop._prefetch_at``),
  not only at action deadlines, so the request starts with the whole ``max + period`` ahead.
- Before any steady-state sample the answer is "start now": the refill that measures is the
  earliest one possible.
- This module plans for one refill, the chunk behind the playing one (``lookahead=1``, the
  default). A deeper ``lookahead`` is the loop's: it fills every free slot of the queue at
  once (``_loop._prefetch_at``), and this lead would only delay that.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Deque, Optional

from .protocol import MAX_DEADLINE_MS

__all__ = ["DeadlineEstimate", "LatencyEstimate", "MAX_DEADLINE_MS", "WINDOW"]

#: How many recent refills the maximum is taken over (requests).
WINDOW = 16


class LatencyEstimate:
    """The worst of the last ``window`` refill turnarounds (s), the connection's first excluded.

    One per connected policy (``AsyncPolicy._latency``), kept across its runs.

    Args:
        window: how many recent refills to keep (default ``WINDOW``); must be >= 1.

    Raises:
        ValueError: window < 1.
    """

    def __init__(self, window: int = WINDOW) -> None:
        if int(window) < 1:
            raise ValueError(f"window must be at least 1 request, not {window!r}")
        self._samples: Deque[float] = deque(maxlen=int(window))
        self._cold: Optional[float] = None

    def add(self, seconds: float) -> None:
        """Record one measured refill (request start to chunk in hand), in seconds.

        The first call records the cold request (``cold_s``), which is not planned for.
        A negative figure (a clock oddity) is recorded as 0.
        """
        value = max(0.0, float(seconds))
        if self._cold is None:
            self._cold = value
            return
        self._samples.append(value)

    @property
    def samples(self) -> int:
        """Steady-state samples in the window (the cold request not counted)."""
        return len(self._samples)

    @property
    def cold_s(self) -> Optional[float]:
        """The first (cold) request's turnaround (s), or None before any request."""
        return self._cold

    @property
    def mean_s(self) -> Optional[float]:
        """Mean of the window (s), for reports only; None before the first steady sample."""
        return statistics.fmean(self._samples) if self._samples else None

    @property
    def max_s(self) -> Optional[float]:
        """The worst turnaround in the window (s); None before the first steady sample."""
        return max(self._samples) if self._samples else None

    @property
    def budget_s(self) -> Optional[float]:
        """The refill time to plan for (s): the window's maximum; None before a steady sample."""
        return self.max_s

    def lead_s(self, period_s: float) -> Optional[float]:
        """How long before the buffer runs dry the next request starts (s): ``max_s + period_s``;
        None before the first steady-state sample (start now)."""
        budget = self.budget_s
        return None if budget is None else budget + period_s

    def should_start(self, time_left_s: float, period_s: float) -> bool:
        """Start the next request now?

        Args:
            time_left_s: seconds until the buffer runs dry (the deadline of the first action
                it cannot supply, minus now).
            period_s: one control period (s): the loop checks once per period, so this much
                is added to cover the gap between two checks.

        Returns True when ``time_left_s <= max_s + period_s``, and always before the first
        steady-state sample (the refill that measures starts as early as it can).
        """
        lead = self.lead_s(period_s)
        return lead is None or time_left_s <= lead


class DeadlineEstimate:
    """The deadline each /act carries, so a shared worker serves the robot about to run dry first.

    ``deadline_ms`` = the playback the robot has left when it sends, less its network round
    trip: the time the worker has to answer. The round trip planned for is the median of the
    last ``window`` answers' ``round trip - server_ms`` (the worker reports ``server_ms``, the
    time from queueing to answering; what is left is the network and both ends' handling), 0
    before any. The median, not the worst: on a loaded client the worst sample is a stall of
    its own event loop, and planning for it made every robot claim about 1 ms in the fleet
    bench, which orders nothing (the prefetch's lead already plans for the worst turnaround). It is at least 1 ms (a robot already out of actions asks for the soonest
    answer) and at most ``MAX_DEADLINE_MS``. ``period_ms``, the robot's declared time between
    chunks, is the median gap between its recent requests (the worker orders a session's
    requests at least half of it apart: a robot cannot buy priority by claiming short
    deadlines more often than twice a period). A worker that predates deadlines ignores both.

    When the robot declared its rate at connect (``request_hz``), ``period_s`` is 1 / that rate
    and is the ``period_ms`` sent, from the first request on: the worker orders a robot's
    requests by a share of its period, and the gaps between requests (short at the start, when
    the first chunk and the one behind it are fetched back to back, and moving with the
    prefetch's lead after) made robots of one rate look like different rates.

    Args:
        window: how many recent answers the round trip is taken over (default ``WINDOW``).
        period_s: the declared time between chunks (s), or None (the median gap is sent).
    """

    def __init__(self, window: int = WINDOW, period_s: Optional[float] = None) -> None:
        self._network: Deque[float] = deque(maxlen=max(1, int(window)))
        self.period_s = period_s

    def note_answer(self, round_trip_s: float, server_ms: object) -> None:
        """One answer: its round trip as the client measured it (s) and the worker's
        ``server_ms`` (a number, or None from a worker that does not report it: not counted)."""
        if isinstance(server_ms, (int, float)) and not isinstance(server_ms, bool) and server_ms >= 0:
            self._network.append(max(0.0, float(round_trip_s) - float(server_ms) / 1000.0))

    @property
    def network_s(self) -> Optional[float]:
        """The median recent network round trip (s); None before an answer reported ``server_ms``."""
        return statistics.median(self._network) if self._network else None

    def fields(self, playback_left_s: float, intervals_s: "list[float]") -> "dict[str, float]":
        """The body fields for a request sent with ``playback_left_s`` (s) of actions left, by a
        robot whose recent gaps between requests were ``intervals_s`` (s) ->
        ``{"deadline_ms": ms, "period_ms": ms}`` (no ``period_ms`` before two requests, unless
        ``period_s`` is declared)."""
        left_ms = (float(playback_left_s) - (self.network_s or 0.0)) * 1000.0
        out = {"deadline_ms": round(min(MAX_DEADLINE_MS, max(1.0, left_ms)), 3)}
        if self.period_s or intervals_s:
            period_ms = (self.period_s or statistics.median(intervals_s)) * 1000.0
            if 0.0 < period_ms <= MAX_DEADLINE_MS:
                out["period_ms"] = round(period_ms, 3)
        return out
