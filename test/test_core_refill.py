"""The refill plan (``_prefetch.LatencyEstimate``): the next request starts when the playback
left falls to the worst of the recent turnarounds plus one control period. Pure units, no
server; the fleet-level effect is measured by bench/bench_robots_per_worker.py."""
from __future__ import annotations

import pytest

from sequence_ai_core._prefetch import WINDOW, LatencyEstimate

PERIOD = 1 / 15  # s: the pick-place control period


def warmed(*turnarounds: float, window: int = WINDOW, cold: float = 0.05) -> LatencyEstimate:
    """An estimate that has seen a cold first request, then ``turnarounds`` (s)."""
    est = LatencyEstimate(window)
    est.add(cold)
    for s in turnarounds:
        est.add(s)
    return est


def test_the_trigger_is_the_worst_turnaround_plus_a_period_not_the_mean():
    # seven requests served at once and one that queued behind seven other robots (5 ms each)
    est = warmed(*[0.05] * 7, 0.40, window=8)
    assert est.mean_s == pytest.approx((7 * 0.05 + 0.40) / 8)
    # the mean (0.094 s; 0.33 s with two standard deviations) says wait; the queued robot's
    # 0.40 s says the request is due once 0.40 s + one period are left
    assert est.should_start(time_left_s=0.45, period_s=PERIOD)
    assert est.should_start(time_left_s=0.40 + PERIOD - 1e-6, period_s=PERIOD)
    assert not est.should_start(time_left_s=0.40 + PERIOD + 1e-3, period_s=PERIOD)
    assert est.budget_s == pytest.approx(0.40) and est.max_s == pytest.approx(0.40)


def test_the_window_forgets_a_spike_after_window_requests():
    est = warmed(0.90, window=8)  # one warm-up spike
    for i in range(7):
        est.add(0.05)
        assert est.budget_s == pytest.approx(0.90), i  # still within the last 8 requests
    assert est.should_start(time_left_s=0.5, period_s=PERIOD)
    est.add(0.05)  # the eighth request after it pushes it out
    assert est.samples == 8
    assert est.budget_s == pytest.approx(0.05)
    assert not est.should_start(time_left_s=0.5, period_s=PERIOD)
    assert est.should_start(time_left_s=0.05 + PERIOD, period_s=PERIOD)


def test_the_default_window_is_bounded_to_recent_requests():
    est = warmed(1.5)
    for _ in range(WINDOW):
        est.add(0.02)
    assert 8 <= WINDOW <= 16 and est.samples == WINDOW
    assert est.budget_s == pytest.approx(0.02)


def test_the_cold_first_request_is_not_planned_for():
    est = LatencyEstimate()
    est.add(3.0)  # the connection's first request: connect, a whole fleet starting at once
    # no steady sample yet: the next refill starts at once (it is the one that measures)
    assert est.should_start(time_left_s=10.0, period_s=PERIOD)
    assert est.samples == 0 and est.budget_s is None and est.max_s is None
    assert est.cold_s == pytest.approx(3.0)
    est.add(0.1)
    assert est.samples == 1 and est.budget_s == pytest.approx(0.1)
    assert not est.should_start(time_left_s=1.0, period_s=PERIOD)  # 3.0 s would say yes
    assert est.should_start(time_left_s=0.1 + PERIOD, period_s=PERIOD)
    assert est.cold_s == pytest.approx(3.0)  # kept apart, for reports


def test_a_negative_turnaround_counts_as_zero_and_a_window_must_hold_a_request():
    est = warmed(-0.5)
    assert est.budget_s == 0.0
    with pytest.raises(ValueError, match="window must be at least 1 request"):
        LatencyEstimate(0)
