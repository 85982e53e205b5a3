"""The worker's scheduling pieces in process: the cost curve, the earliest-deadline-first queue,
and the clamp that keeps a session from buying priority with short deadlines."""
from __future__ import annotations

import json
import math
import queue
import threading
import time

import pytest

import seq
from _wait import eventually
from sequence_ai_server.worker.host import PolicyHost
from sequence_ai_server.worker.schedule import (CLAMP_SHARE, MIN_PERIOD_MS, NO_DEADLINE_MS, CostCurve, DeadlineClamp,
                                                DeadlineQueue, LateCounter, RobotTimes)


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


def test_a_robot_asking_once_per_declared_period_is_due_half_a_period_after_each_request():
    clamp = DeadlineClamp()
    period_ms = 533.0
    assert clamp.order_due("s1", 100.001, None, now=100.0) == 100.0         # the first: nothing to play yet
    for k in range(1, 5):
        now = 100.0 + k * 0.533
        assert clamp.order_due("s1", now + 0.02 * k, period_ms, now=now) == pytest.approx(now + CLAMP_SHARE * 0.533)
    # robots of one rate are served in arrival order whatever they claim; a faster one goes ahead
    for s in ("long-claim", "short-claim", "fast", "slow"):
        clamp.order_due(s, 100.0, None, now=100.0)
    assert clamp.order_due("long-claim", 130.0, 533.0, now=110.0) < clamp.order_due("short-claim", 110.001, 533.0,
                                                                                      now=110.001)
    assert clamp.order_due("fast", 110.2, 160.0, now=110.1) < clamp.order_due("slow", 110.5, 540.0, now=110.0)


def test_clamp_lets_a_session_hold_at_most_two_requests_per_period_at_the_front():
    clamp = DeadlineClamp()
    got = [clamp.order_due("greedy", 100.001, 100.0, now=100.0) for _ in range(6)]
    assert got == pytest.approx([100.0 + k * CLAMP_SHARE * 0.1 for k in range(6)])   # two per period, no more
    back_to_back = [clamp.order_due("pair", 100.0, 100.0, now=100.0 + k * 0.1) for k in (0, 1, 1.1)]
    assert back_to_back[2] == pytest.approx(100.11 + CLAMP_SHARE * 0.1)     # two in 10 ms: neither moved
    # another session is not affected, and a declared period below the floor is raised to it
    assert clamp.order_due("other", 100.002, 100.0, now=100.0) == pytest.approx(100.0)
    tiny = [clamp.order_due("tiny", 100.0, 0.001, now=100.0) for _ in range(3)]
    assert tiny[2] - tiny[0] == pytest.approx(MIN_PERIOD_MS / 1000.0)


def test_a_session_that_never_declared_a_period_gets_no_priority_from_its_claims():
    clamp = DeadlineClamp()
    got = [clamp.order_due("quiet", 100.000001, None, now=100.0) for _ in range(3)]
    assert got == pytest.approx([100.0] + [100.0 + NO_DEADLINE_MS / 1000.0] * 2)   # after its first: as if none
    clamp.order_due("late", 105.0, None, now=99.0)
    assert clamp.order_due("late", 105.0, None, now=100.0) == 105.0           # a later claim stands


def test_a_first_request_without_a_period_does_not_push_the_next_ones_back():
    # a robot's first request claims the soonest answer before it knows its period: it is ordered
    # as one without a deadline, but its next ones (period declared) keep their own deadlines
    clamp = DeadlineClamp()
    assert clamp.order_due("s", 100.001, None, now=100.0) == pytest.approx(100.0)   # nothing to play: as it comes
    assert clamp.order_due("s", 100.6, 533.0, now=100.3) == pytest.approx(100.3 + CLAMP_SHARE * 0.533)
    assert clamp.order_due("s", 100.8, 533.0, now=100.4) == pytest.approx(100.4 + CLAMP_SHARE * 0.533)
    assert clamp.order_due("s", 100.9, 533.0, now=100.5) == pytest.approx(100.3 + CLAMP_SHARE * 0.533 + 0.533)


def test_clamp_follows_the_latest_declared_period_and_keeps_it_when_none_is_sent():
    clamp = DeadlineClamp()
    assert clamp.order_due("s", 10.0, 500.0, now=10.0) == 10.0
    assert clamp.order_due("s", 10.0, None, now=10.0) == pytest.approx(10.0 + CLAMP_SHARE * 0.5)
    assert clamp.order_due("s", 10.0, None, now=10.0) == pytest.approx(10.0 + 0.5)
    assert clamp.order_due("s", 10.0, 100.0, now=10.0) == pytest.approx(10.0 + CLAMP_SHARE * 0.5 + 0.1)


def test_robot_times_report_each_sessions_p99_and_forget_quiet_ones():
    times = RobotTimes(forget_s=60.0)
    for ms in range(1, 101):
        times.add("a", float(ms), now=10.0)
    times.add("b", 7.0, now=50.0)
    times.add(None, 1e6, now=50.0)                     # not a robot's request: not kept
    times.add("b", math.nan, now=50.0)
    assert times.snapshot(now=60.0) == {"a": {"p99_ms": 99.0, "requests": 100}, "b": {"p99_ms": 7.0, "requests": 1}}
    assert set(times.snapshot(now=100.0)) == {"b"}     # a answered nothing for over a minute


def test_late_counter():
    late = LateCounter()
    late.count(False)
    late.count(True)
    assert late.snapshot() == {"requests": 2, "late": 1}


# ---------------------------------------------------------------- a real PolicyHost, in process

@seq.policy(action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=1,
                                      control_frequency_hz=10.0))
class _Batched(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.calls = []
        self.release = threading.Event()

    @seq.batched(max_batch_size=2)
    @seq.infer
    def infer(self, obs, *, tag: float = 0.0, hold: bool = False) -> list:
        if any(hold):
            self.release.wait(30)
        self.calls.append(list(tag))
        return [seq.ActionChunk([[t]]) for t in tag]


def _body(tag: float, **extra) -> bytes:
    return json.dumps({"observation": {}, "params": {"tag": tag, **extra}}).encode()


def test_a_replica_batches_the_earliest_deadlines_first_and_counts_the_late(tmp_path):
    host = PolicyHost(_Batched)
    host.start(str(tmp_path))
    try:
        policy = host.replicas[0].instance
        policy.calls.clear()
        blocker = host.submit(host.prepare(_body(0.0, hold=True)))
        assert eventually(lambda: host.replicas[0].busy, what="the blocking call runs")
        now = time.monotonic()
        futures = [host.submit(host.prepare(_body(tag)), due=now + due, order=now + due)
                   for tag, due in ((1.0, 50.0), (2.0, 10.0), (3.0, 40.0), (4.0, 0.0), (5.0, 20.0))]
        none = host.submit(host.prepare(_body(6.0)))        # no deadline: due 1 s after it came
        policy.release.set()
        blocker.result(30)
        for f in futures + [none]:
            f.result(30)
        assert policy.calls[1:] == [[4.0, 6.0], [2.0, 5.0], [3.0, 1.0]]
        assert host.late.snapshot() == {"requests": 5, "late": 1}      # only the one already due at 0 s
        assert host.cost.snapshot()["calls"] >= 4
    finally:
        host.stop()


def test_a_session_is_never_ordered_by_a_shorter_period_than_its_lease_was_admitted_at():
    from sequence_ai_server.common.errors import ApiError
    from sequence_ai_server.common.leases import DirectAuth, period_floor_ms, sign_lease
    from sequence_ai_server.worker.act import deadline_of

    class Host:
        clamp = DeadlineClamp()

    expires = time.time() + 60
    admitted = sign_lease("s3cret", "sess_a", 1, expires, period_ms=533.0)    # 15 Hz, 8 rows a chunk
    unbound = sign_lease("s3cret", "sess_b", 1, expires)                       # an older gateway's token
    auth = DirectAuth("s3cret")
    auth.check(admitted), auth.check(unbound)
    assert period_floor_ms(admitted) == 533.0 and period_floor_ms(unbound) is None
    assert period_floor_ms("s3cret") is None
    head, _, sig = admitted.rsplit(".", 2)
    with pytest.raises(ApiError):                    # the floor is signed: a shorter one is refused
        auth.check(f"{head}.10000.{sig}")

    def order_gap(token, claimed_ms):
        body = json.dumps({"deadline_ms": 5, "period_ms": claimed_ms, "observation": {}}).encode()
        deadline_of(Host, body, "application/json", token)                 # the first: due as it comes
        now = time.monotonic()
        _, order = deadline_of(Host, body, "application/json", token)
        return order - now

    # declaring 10 ms does not put the admitted 533 ms robot half of 10 ms ahead: it keeps its own period
    assert order_gap(admitted, 10.0) >= CLAMP_SHARE * 0.533 - 0.01
    assert order_gap(unbound, 10.0) < 0.05               # without a signed floor the claim stands, as before
