"""The publisher thread's GIL lead (``CommandGate(gil_lead_s=...)``, the driver's
``publish_gil_lead_ms``): it sleeps to a row's due time holding the GIL, so no other Python thread
runs in that window, and rows still leave in order, one period apart, never before they are due.
In-process, no ROS (the gate imports no rclpy)."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from sequence_ai_ros.driver.gate import CommandGate, sleep_holding_gil


def test_sleep_holding_gil_keeps_other_python_threads_out_until_the_deadline():
    stop, gaps = threading.Event(), [0.0]

    def other():
        last = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            gaps[0], last = max(gaps[0], now - last), now

    th = threading.Thread(target=other, daemon=True)
    th.start()
    time.sleep(0.05)
    gaps[0] = 0.0
    start = time.monotonic()
    assert sleep_holding_gil(start + 0.05)
    assert time.monotonic() >= start + 0.05                 # never early
    stop.set()
    th.join(5)
    assert gaps[0] >= 0.045                                  # the other thread stood still meanwhile


def test_rows_with_a_gil_lead_leave_in_order_on_the_grid_and_never_early():
    period = 0.02
    sent = []
    gate = CommandGate(lambda v: sent.append((time.monotonic(), list(v), gate.emitting[0])), 0.004,
                       lambda *a: None, gil_lead_s=0.002)
    try:
        gate.open(period)
        t0 = time.monotonic()
        for k in range(25):
            left = t0 + k * period - time.monotonic()
            if left > 0:
                time.sleep(left)
            assert gate.submit([float(k)])
        assert gate.drain(2.0)
    finally:
        gate.stop()
    assert [v for _, v, _ in sent] == [[float(k)] for k in range(25)]
    t = np.array([s[0] for s in sent])
    due = np.array([s[2] for s in sent])
    assert np.all(t >= due)
    gaps = np.diff(due)
    assert np.all(gaps >= period - 1e-9)
    assert np.count_nonzero(gaps > period + 1e-4) == gate.regrids


def test_a_gil_lead_that_is_not_a_finite_number_of_seconds_is_refused():
    for bad in (-0.001, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="GIL lead must be a finite number of seconds >= 0"):
            CommandGate(lambda v: None, 0.002, lambda *a: None, gil_lead_s=bad)


def test_the_publisher_thread_runs_at_the_driver_default_fifo_priority_or_says_why_not():
    from sequence_ai_ros.driver.params import REALTIME_PRIORITY, TABLE

    assert TABLE["realtime_priority"].default == REALTIME_PRIORITY == 40     # below ros2_control's 50
    refused, seen = [], {}
    gate = CommandGate(lambda v: seen.setdefault("policy", os.sched_getscheduler(0)), 0.002, lambda *a: None,
                       rt_priority=REALTIME_PRIORITY, on_rt_error=refused.append)
    try:
        gate.open(0.02)
        assert gate.submit([0.0])
        assert gate.drain(2.0)
        tid = gate._thread.native_id
        if refused:                      # no CAP_SYS_NICE / rtprio limit here: normal priority, said why
            assert "CAP_SYS_NICE" in refused[0] and os.sched_getscheduler(tid) != os.SCHED_FIFO
        else:
            assert os.sched_getscheduler(tid) == os.SCHED_FIFO == seen["policy"]
            assert os.sched_getparam(tid).sched_priority == REALTIME_PRIORITY
    finally:
        gate.stop()
    assert os.sched_getscheduler(0) != os.SCHED_FIFO                        # the caller's thread untouched
