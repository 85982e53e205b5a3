"""How a worker orders and times its inference calls: the cost curve and deadline order.

* :class:`CostCurve` -- the worker's own measured time per ``infer`` call by batch size (the
  median of the last calls of each size), and a prediction for a size it has not run yet.
  ``/ping`` reports it as ``{"batch_ms": {"1": 41.2, "2": 43.0, ...}, "calls": n}``; the
  gateway's admission reads it.
* :class:`DeadlineQueue` -- a replica's waiting requests, earliest deadline first; a request
  without a deadline is ordered by its arrival plus :data:`NO_DEADLINE_MS` (so a worker whose
  clients send none serves them first-come first-served, as before deadlines existed).
* :class:`RobotTimes` -- each robot's (session's) recent queued-to-answered times and their p99,
  which ``/ping`` reports as ``"robots"`` (the gateway never sees a robot's /act).
* :class:`DeadlineClamp` -- how a robot's requests are ordered: each is due ``CLAMP_SHARE`` of
  its declared period after it arrived, at most two per period (the rule and why it is not the
  deadline the request claims are in the class docstring).

All times are ``time.monotonic()`` seconds unless a name says ms.
"""
from __future__ import annotations

import collections
import heapq
import itertools
import math
import queue
import threading
import time
from typing import Any, Optional

__all__ = ["CLAMP_SHARE", "CostCurve", "DeadlineClamp", "DeadlineQueue", "LateCounter", "NO_DEADLINE_MS",
           "MIN_PERIOD_MS", "RobotTimes"]

NO_DEADLINE_MS = 1000.0      # a request without a deadline is ordered as if due this long after it arrived
CLAMP_SHARE = 0.5            # a session's request is ordered as due this share of its declared period after it came
MIN_PERIOD_MS = 10.0         # the shortest period a session may declare (100 chunks/s)
_SAMPLES_PER_SIZE = 32       # calls kept per batch size for the median
ROBOT_SAMPLES = 128          # answers kept per robot (session) for its p99
ROBOTS_REPORTED = 512        # robots a /ping reports at most


class CostCurve:
    """Milliseconds per ``infer`` call by batch size, from this worker's own measured calls
    (the median of the last 32 of each size; thread-safe). ``predict_ms(n)`` for a size not
    measured yet: interpolated between the measured sizes around it, extrapolated along the
    least-squares line beyond them; None before any call."""

    def __init__(self) -> None:
        self._ms: dict[int, collections.deque] = {}
        self._median: dict[int, float] = {}
        self.calls = 0
        self._lock = threading.Lock()

    def add(self, batch_size: int, seconds: float) -> None:
        """One measured call of ``batch_size`` items that took ``seconds``."""
        if batch_size < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        with self._lock:
            window = self._ms.setdefault(batch_size, collections.deque(maxlen=_SAMPLES_PER_SIZE))
            window.append(seconds * 1000.0)
            ordered = sorted(window)
            mid = len(ordered) // 2
            self._median[batch_size] = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
            self.calls += 1

    def snapshot(self) -> dict[str, Any]:
        """``{"batch_ms": {"<size>": median ms, ...}, "calls": calls measured}`` (sizes ascending)."""
        with self._lock:
            return {"batch_ms": {str(n): round(self._median[n], 3) for n in sorted(self._median)},
                    "calls": self.calls}

    def predict_ms(self, batch_size: int) -> Optional[float]:
        """Predicted ms for a call of ``batch_size`` items; None before any call was measured."""
        with self._lock:
            points = sorted(self._median.items())
        if not points:
            return None
        if batch_size in self._median:
            return self._median[batch_size]
        if len(points) == 1:
            return points[0][1]
        below = [p for p in points if p[0] < batch_size]
        above = [p for p in points if p[0] > batch_size]
        if below and above:
            (n0, m0), (n1, m1) = below[-1], above[0]
            return m0 + (m1 - m0) * (batch_size - n0) / (n1 - n0)
        n = len(points)
        mx = sum(p[0] for p in points) / n
        my = sum(p[1] for p in points) / n
        sxx = sum((p[0] - mx) ** 2 for p in points)
        slope = max(0.0, sum((p[0] - mx) * (p[1] - my) for p in points) / sxx) if sxx else 0.0
        return max(0.0, my + slope * (batch_size - mx))


class DeadlineQueue:
    """A replica's queue, earliest deadline first (the ``queue.SimpleQueue`` calls a replica
    makes: ``put``, ``get(timeout=)``, ``get_nowait``, ``qsize``). ``put(item, due)``: ``due``
    is the item's deadline (monotonic s) or None (arrival + :data:`NO_DEADLINE_MS`); ties and
    equal deadlines go first-come first-served. ``put_last(item)`` orders an item after every
    one waiting now (an episode end, the stop sentinel). ``peek_due()`` -> the earliest
    deadline waiting, or None when empty. ``get`` raises ``queue.Empty`` as SimpleQueue does."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._count = itertools.count()
        self._cond = threading.Condition(threading.Lock())

    def put(self, item: Any, due: Optional[float] = None) -> None:
        key = due if due is not None else time.monotonic() + NO_DEADLINE_MS / 1000.0
        with self._cond:
            heapq.heappush(self._heap, (key, next(self._count), item))
            self._cond.notify()

    def put_last(self, item: Any) -> None:
        with self._cond:
            key = max((k for k, _, _ in self._heap), default=time.monotonic())
            heapq.heappush(self._heap, (max(key, time.monotonic() + NO_DEADLINE_MS / 1000.0), next(self._count), item))
            self._cond.notify()

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        with self._cond:
            if block:
                end = None if timeout is None else time.monotonic() + timeout
                while not self._heap:
                    left = None if end is None else end - time.monotonic()
                    if left is not None and left <= 0:
                        raise queue.Empty
                    self._cond.wait(left)
            elif not self._heap:
                raise queue.Empty
            return heapq.heappop(self._heap)[2]

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def peek_due(self) -> Optional[float]:
        with self._cond:
            return self._heap[0][0] if self._heap else None

    def qsize(self) -> int:
        return len(self._heap)


class DeadlineClamp:
    """How a robot's requests are ordered, and the rule that keeps a session from buying priority.

    A session (the lease's session id; the worker secret, the gateway's own, is not clamped)
    declares its period -- the time between its chunks, ``replan rows / control Hz``, the rate
    it was admitted for -- as ``period_ms`` with its requests (at least :data:`MIN_PERIOD_MS`;
    the latest one declared counts). Each of its requests is ordered as due ``CLAMP_SHARE`` of
    that period after it arrived, and no earlier than one period after the session's ordering
    deadline two requests before: robots of one rate are served in arrival order, and a robot
    that needs a chunk every 160 ms goes ahead of one that needs one every 540 ms that arrived
    up to 190 ms before it. A robot may send two requests back to back (its start: the first
    chunk, then at once the one behind it) without either being moved; one that sends more often
    than its declared rate holds no more of the front of the queue than two requests per period.
    (A spacing of half a period between any two, the rule before, moved the second request of
    every robot that started with a round trip under half a period behind the others' first
    ones: the fleet bench at 96 robots had 27-50 underruns where arrival order had none.)
    Declaring a longer period than it needs only moves its own requests back. A session's first
    request (its robot has no chunk yet; it cannot know its period) is ordered as due when it
    arrives: ahead of the robots already playing, in arrival order with the other first ones.

    The deadline a request claims (``deadline_ms``: the playback its robot has left) does not
    order it; lateness is measured against it. Ordered by their claims, robots of one rate did
    worse than in arrival order near a replica's limit (the fleet bench at 96 robots: 25-100
    underruns against none): a robot whose claims are short is served first, so its round trips
    stay short, so its client's prefetch (which plans for the worst recent round trip) keeps
    sending late with a thin margin, and a burst of such robots then makes them late together;
    one whose claims are long waits until just before them, so it sends earlier still. In
    arrival order every robot meets the queue as it is and its prefetch plans for it.

    A session that has never declared a period gets no priority from its claims: its requests
    after the first are ordered as requests without a deadline (:data:`NO_DEADLINE_MS` after
    they arrive, or their claim if later), so leaving ``period_ms`` out cannot buy the front of
    the queue either, and such a request counts toward none of the spacing above.
    Sessions unseen for a minute are forgotten."""

    def __init__(self, forget_s: float = 60.0) -> None:
        # session -> (period s, its last ordering deadline, the one before, last seen)
        self._last: dict[str, tuple[float, float, float, float]] = {}
        self._forget_s = forget_s
        self._lock = threading.Lock()

    def order_due(self, session: str, due: float, period_ms: Optional[float], now: float) -> float:
        """The deadline (monotonic s) a request claiming ``due`` is ordered by; remembers it."""
        with self._lock:
            first = session not in self._last
            period, last, before, _ = self._last.get(session, (0.0, -math.inf, -math.inf, now))
            if period_ms is not None:
                period = max(MIN_PERIOD_MS, period_ms) / 1000.0
            if first:                # its robot has nothing to play yet: due as it comes
                ordered = last = now
            elif period:             # due a share of its period after it came (not its claim); two per period
                ordered = max(now + CLAMP_SHARE * period, before + period)
                last, before = ordered, last
            else:                    # nothing declared to clamp against: no priority from the claim
                ordered = max(due, now + NO_DEADLINE_MS / 1000.0)
            self._last[session] = (period, last, before, now)
            if len(self._last) > 4096 or now - min(v[3] for v in self._last.values()) > 10 * self._forget_s:
                self._last = {k: v for k, v in self._last.items() if now - v[3] <= self._forget_s}
            return ordered


class LateCounter:
    """Requests that carried a deadline, and how many of those were answered after it."""

    def __init__(self) -> None:
        self.requests = self.late = 0
        self._lock = threading.Lock()

    def count(self, late: bool) -> None:
        with self._lock:
            self.requests += 1
            self.late += int(late)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"requests": self.requests, "late": self.late}


class RobotTimes:
    """Each session's last :data:`ROBOT_SAMPLES` queued-to-answered times (ms) on this worker
    (thread-safe). ``snapshot(now)`` -> ``{session: {"p99_ms", "requests"}}`` for the sessions
    answered in the last ``forget_s`` (60 s), at most :data:`ROBOTS_REPORTED` of them (the most
    recently answered); ``requests`` counts every answer since the session was first seen."""

    def __init__(self, forget_s: float = 60.0) -> None:
        self._seen: dict[str, list] = {}          # session -> [deque of ms, answers, last answered]
        self._forget_s = forget_s
        self._lock = threading.Lock()

    def add(self, session: Optional[str], ms: float, now: float) -> None:
        """One answer to ``session`` (None: not a robot's; ignored) that took ``ms``."""
        if not session or not math.isfinite(ms) or ms < 0:
            return
        with self._lock:
            seen = self._seen.get(session)
            if seen is None:
                if len(self._seen) >= 4 * ROBOTS_REPORTED:
                    self._seen = {k: v for k, v in self._seen.items() if now - v[2] <= self._forget_s}
                seen = self._seen[session] = [collections.deque(maxlen=ROBOT_SAMPLES), 0, now]
            seen[0].append(ms)
            seen[1] += 1
            seen[2] = now

    def snapshot(self, now: float) -> dict[str, dict[str, float]]:
        with self._lock:
            live = sorted(((v[2], k, sorted(v[0]), v[1]) for k, v in self._seen.items()
                           if now - v[2] <= self._forget_s), reverse=True)[:ROBOTS_REPORTED]
        return {k: {"p99_ms": round(ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)], 1), "requests": n}
                for _, k, ms, n in live}
