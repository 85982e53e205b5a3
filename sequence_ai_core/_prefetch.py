"""When to start the next request: a moving estimate of refill latency against buffer time left.

The next chunk has to arrive before the current rows run out. The loop knows how many seconds
of actions it still holds; this module knows how long a refill has been taking (a moving window
of measured round trips, observe() included). The request starts once the buffer's time left
drops to the expected latency plus slack: starting earlier would only make the observation
staler (the overlap is open loop), starting later risks an underrun.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Deque, Optional

__all__ = ["LatencyEstimate"]


class LatencyEstimate:
    """Moving window of refill latencies (s).

    Args:
        window: how many recent refills to average.
        spread: how many standard deviations of jitter to budget for on top of the mean.
    """

    def __init__(self, window: int = 8, spread: float = 2.0) -> None:
        self._samples: Deque[float] = deque(maxlen=window)
        self._spread = spread

    def add(self, seconds: float) -> None:
        """Record one measured refill (request start to chunk in hand), in seconds."""
        self._samples.append(max(0.0, float(seconds)))

    @property
    def samples(self) -> int:
        return len(self._samples)

    @property
    def mean_s(self) -> Optional[float]:
        """Mean of the window, or None before the first sample."""
        return statistics.fmean(self._samples) if self._samples else None

    @property
    def budget_s(self) -> Optional[float]:
        """Mean plus ``spread`` standard deviations: the latency to plan for (s)."""
        if not self._samples:
            return None
        sd = statistics.pstdev(self._samples) if len(self._samples) > 1 else 0.0
        return self.mean_s + self._spread * sd

    def should_start(self, time_left_s: float, period_s: float) -> bool:
        """Start the next request now?

        Args:
            time_left_s: seconds until the buffer runs dry (the deadline of the first action
                it cannot supply, minus now).
            period_s: one control period (s), kept as slack for scheduling jitter.

        With no measurement yet the answer is yes: the first refill is the one that measures.
        """
        budget = self.budget_s
        if budget is None:
            return True
        return time_left_s <= budget + period_s
