"""The refill plan (``_prefetch.LatencyEstimate``): the next request starts when the playback
left falls to the worst of the recent turnarounds plus one control period. Pure units, no
server; the fleet-level effect is measured by bench/bench_robots_per_worker.py."""
from __future__ import annotations

import pytest

from _core_support import InProcessWire
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


# ------------------------------------------------------------------ the loop wakes for it

class _TimedWire(InProcessWire):
    """Answers /act with a 4-row chunk at 2 Hz after ``delay_s``, recording when each request
    started. An in-process stand-in for ``_wire.Wire`` (as in test_core_properties.py): the
    point is the moment the loop starts a request, which a real server's round trip would blur
    on a loaded machine; test_core_loop.py runs prefetch against the real worker."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def answer(self, i):
        from sequence_ai_core import ActionChunk
        return self.delay_s, ActionChunk(actions=[[0.0]] * 4, action_space="joint_absolute", robot="r",
                                         control_frequency_hz=2.0)


def test_the_loop_starts_the_request_at_max_plus_a_period_not_at_the_next_deadline():
    """2 Hz, 4-row chunks (2 s), a worst recent turnaround of 0.45 s: the buffer of the first
    chunk runs dry 2.0 s after its first action, so the request is due at 2.0 - (0.45 + 0.5) =
    1.05 s. Checking only at action deadlines (0, 0.5, 1.0, 1.5 s) would start it at 1.5 s,
    with 0.5 s left: less than the 0.45 s turnaround plus the period planned for. On virtual time
    (test/_vclock.py), so the moment is exact."""
    import _vclock
    from sequence_ai_core import AsyncPolicy

    policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
    policy._wire = wire = _TimedWire(delay_s=0.01)
    for s in (0.05, 0.45, 0.45, 0.45):  # a cold first request, then three that waited 0.45 s
        policy._latency.add(s)
    acted: list = []

    async def drive():
        return await policy.run(lambda: {"images": [], "proprioception": {"joint_positions": [0.0]}},
                                lambda row: acted.append(_vclock.now()), max_actions=5,
                                validate=lambda row: True,
                                progress=False)

    out = _vclock.drive(policy, drive)
    assert out.reason == "completed" and out.underruns == 0
    assert len(wire.started) == 2
    # due 1.05 s after the first action (2.0 s of rows less 0.45 s + one 0.5 s period)
    assert wire.started[1] - acted[0] == pytest.approx(1.05)
