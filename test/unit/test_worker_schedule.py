"""The worker's scheduling pieces in process: the cost curve, the earliest-deadline-first queue,
and the clamp that keeps a session from buying priority with short deadlines."""
from __future__ import annotations

import queue
import threading

import pytest

from sequence_ai_server.worker.schedule import (CLAMP_SHARE, MIN_PERIOD_MS, CostCurve, DeadlineClamp, DeadlineQueue,
                                                LateCounter)


def test_cost_curve_reports_the_median_per_batch_size_and_the_calls():
    curve = CostCurve()
    assert curve.snapshot() == {"batch_ms": {}, "calls": 0} and curve.predict_ms(4) is None
    for s in (0.040, 0.042, 0.500):          # one outlier: the median ignores it
        curve.add(1, s)
    curve.add(4, 0.048)
    snap = curve.snapshot()
    assert snap == {"batch_ms": {"1": 42.0, "4": 48.0}, "calls": 4}
    assert list(snap["batch_ms"]) == ["1", "4"]


def test_cost_curve_predicts_between_and_beyond_the_measured_sizes():
    curve = CostCurve()
    curve.add(1, 0.042)
    assert curve.predict_ms(16) == pytest.approx(42.0)        # one size known: flat
    curve.add(5, 0.050)
    assert curve.predict_ms(3) == pytest.approx(46.0)         # interpolated
    assert curve.predict_ms(9) == pytest.approx(58.0)         # along the line: 2 ms per item
    assert curve.predict_ms(5) == pytest.approx(50.0)


def test_cost_curve_ignores_nonsense_samples():
    curve = CostCurve()
    curve.add(0, 0.01)
    curve.add(2, float("nan"))
    curve.add(2, -1.0)
    assert curve.snapshot()["calls"] == 0


def test_deadline_queue_serves_earliest_deadline_first_and_ties_in_arrival_order():
    q = DeadlineQueue()
    q.put("late", 30.0)
    q.put("soon", 10.0)
    q.put("soon-2", 10.0)
    q.put("mid", 20.0)
    assert q.qsize() == 4 and q.peek_due() == 10.0
    assert [q.get_nowait() for _ in range(4)] == ["soon", "soon-2", "mid", "late"]
    with pytest.raises(queue.Empty):
        q.get_nowait()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)


def test_deadline_queue_without_deadlines_is_first_come_first_served():
    q = DeadlineQueue()
    for i in range(5):
        q.put(i)
    assert [q.get() for _ in range(5)] == [0, 1, 2, 3, 4]


def test_put_last_goes_behind_everything_waiting_now():
    q = DeadlineQueue()
    q.put("a", 1e9)
    q.put_last("end")
    q.put("b", 5.0)                   # a later arrival with an earlier deadline still goes first
    assert [q.get() for _ in range(3)] == ["b", "a", "end"]


def test_deadline_queue_get_wakes_on_put_from_another_thread():
    q = DeadlineQueue()
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(timeout=30)))
    t.start()
    q.put("x", 1.0)
    t.join(30)
    assert got == ["x"]


def test_clamp_leaves_a_robot_that_asks_once_per_declared_period_alone():
    clamp = DeadlineClamp()
    period_ms = 533.0
    for k in range(5):
        due = 100.0 + k * 0.533
        assert clamp.order_due("s1", due, period_ms, now=due - 0.4) == pytest.approx(due)


def test_clamp_spaces_a_session_claiming_short_deadlines_by_its_period():
    clamp = DeadlineClamp()
    got = [clamp.order_due("greedy", 100.001, 100.0, now=100.0) for _ in range(4)]
    step = CLAMP_SHARE * 0.1
    assert got == pytest.approx([100.001, 100.001 + step, 100.001 + 2 * step, 100.001 + 3 * step])
    # another session is not affected, and a declared period below the floor is raised to it
    assert clamp.order_due("other", 100.002, None, now=100.0) == 100.002
    tiny = [clamp.order_due("tiny", 100.0, 0.001, now=100.0) for _ in range(2)]
    assert tiny[1] - tiny[0] == pytest.approx(CLAMP_SHARE * MIN_PERIOD_MS / 1000.0)


def test_clamp_keeps_the_first_declared_period():
    clamp = DeadlineClamp()
    clamp.order_due("s", 10.0, 500.0, now=10.0)
    assert clamp.order_due("s", 10.0, 1.0, now=10.0) == pytest.approx(10.0 + CLAMP_SHARE * 0.5)


def test_late_counter():
    late = LateCounter()
    late.count(False)
    late.count(True)
    assert late.snapshot() == {"requests": 2, "late": 1}
