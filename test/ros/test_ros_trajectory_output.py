"""Chunk-native trajectory output (``trajectory_output: chunk``), read with the documented
semantics of ros2_controllers' joint_trajectory_controller (``jtc_timeline`` in
_ros_driver_support: ``time_from_start`` counts from ``header.stamp``, stamp zero = on receipt, a
new trajectory keeps the playing one up to its own start and replaces the rest).

What is checked: one trajectory per chunk (not one point per tick), every message valid under the
controller's defaults, each row reached once, in order, one control period apart (the seam
included), joint velocity continuous across a seam with ``trajectory_velocities``, the hold (a
one-point trajectory stamped zero) replacing what plays and nothing after it, a normal end that
cuts the playing trajectory at the last row handed over, a trajectory cut before a row the driver
would refuse, and delta chunks sent row by row, unchanged.

The first tests drive the real CommandOutputs + CommandGate (its publisher thread) on a real
rclpy node, as the driver does for each chunk; the last one runs the whole driver against the
echo policy (gateway + worker processes).
"""
from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
import rclpy
from rclpy.action import ActionClient
from trajectory_msgs.msg import JointTrajectory

import sequence_ai
from sequence_ai_msgs.action import Act
from sequence_ai_ros.driver.gate import CommandGate
from sequence_ai_ros.driver.outputs import CommandOutputs, monotonic_to_ros
from sequence_ai_ros.driver.params import FR3_ARM_JOINTS, TABLE, Params
from _ros_driver_support import (FakeRobot, Goal, driver_params, duration_s, echo_server, jtc_refusal,  # noqa: F401
                                 jtc_timeline, ros, wait)
from sequence_ai_ros.driver_node import PolicyDriver
from sequence_ai_ros._spin import destroy_node

PERIOD = 0.02          # 50 Hz: short tests
ROWS = 10              # rows per chunk
JOINTS = [f"panda_joint{i}" for i in range(1, 8)]


def _params(**extra):
    values = {k: ([] if s.default in ("string_array", "double_array") else s.default) for k, s in TABLE.items()}
    values.update(command_mode="joint_trajectory_controller", arm_controller="fr3_arm_controller",
                  arm_joints=list(FR3_ARM_JOINTS), joint_names=JOINTS, trajectory_output="chunk")
    values.update(extra)
    return Params(values)


def _sine(k: int) -> list:
    """Row k of a smooth motion: joint j at 0.3 sin(2 pi 0.7 t + j), gripper 0.5."""
    t = k * PERIOD
    return [0.3 * math.sin(2 * math.pi * 0.7 * t + j) for j in range(7)] + [0.5]


def _sine_velocity(k: int) -> list:
    t = k * PERIOD
    return [0.3 * 2 * math.pi * 0.7 * math.cos(2 * math.pi * 0.7 * t + j) for j in range(7)]


class Cell:
    """A real node with the driver's outputs and gate, and a subscriber where the controller listens."""

    def __init__(self, ctx, **params):
        self.node = rclpy.create_node("trajectory_cell", context=ctx)
        self.received = []            # (receipt ROS s, JointTrajectory)
        self.lock = threading.Lock()
        self.node.create_subscription(JointTrajectory, "fr3_arm_controller/joint_trajectory", self._on_msg, 100)
        self.outputs = CommandOutputs(self.node, _params(**params), lambda: PERIOD,
                                      lambda: self.node.get_clock().now().to_msg())
        self.gate = CommandGate(lambda v: self.outputs.publish(v, *self.gate.emitting), 0.002, lambda *a: None)
        self.executor = rclpy.executors.SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.spinner = threading.Thread(target=self._spin, daemon=True)
        self._stop = threading.Event()
        self.spinner.start()

    def _spin(self):
        while not self._stop.is_set():
            self.executor.spin_once(timeout_sec=0.05)

    def _on_msg(self, msg):
        now = self.node.get_clock().now().nanoseconds * 1e-9
        stamp = duration_s(msg.header.stamp)
        with self.lock:   # a stamped trajectory is taken as received at its stamp (published then)
            self.received.append((stamp if stamp else now, msg, jtc_refusal(msg, FR3_ARM_JOINTS, now)))

    def play(self, chunks, space="joint_absolute", stop_after=None, changed=None):
        """Hand ``chunks`` (lists of rows) to the gate as the core does: attach the plan at each
        chunk's first row, submit each row at its deadline. ``stop_after``: rows, then return;
        ``changed``: ``{k: row}`` submitted instead of the plan's row k (as a core clip would)."""
        self.gate.open(PERIOD)
        t0, k = time.monotonic(), 0
        for rows in chunks:
            chunk = sequence_ai.ActionChunk(actions=rows, action_space=space, control_frequency_hz=1 / PERIOD)
            for j, row in enumerate(rows):
                if stop_after is not None and k >= stop_after:
                    return k
                left = t0 + k * PERIOD - time.monotonic()
                if left > 0:
                    time.sleep(left)
                if j == 0:
                    self.gate.attach(self.outputs.plan(chunk, None))
                assert self.gate.submit(list((changed or {}).get(k, row)))
                k += 1
        return k

    def messages(self, n, timeout=5.0):
        wait(lambda: len(self.received) >= n, timeout, f"{n} trajectories")
        with self.lock:
            return list(self.received)

    def close(self):
        self.gate.stop()
        self._stop.set()
        self.spinner.join(5)
        self.outputs.destroy()
        destroy_node(self.node)


@pytest.fixture
def ctx():
    c = rclpy.context.Context()
    rclpy.init(context=c)
    yield c
    rclpy.shutdown(context=c)


def _timeline(received):
    return jtc_timeline([(r, m) for r, m, _ in received])


def test_a_chunk_stamp_stays_on_the_grid_when_its_clock_read_is_preempted():
    # A trajectory is stamped with its first row's due time converted to the ROS clock; the
    # conversion reads both clocks. A read preempted between them (a loaded machine: clean-clone
    # CI lost one row of 40 at a seam to it) moved the stamp by the time lost: here a ROS clock
    # whose first read stalls 5 ms. Within 0.1 ms the seam rule below counts as on time.
    offset, stalls = 1000.0, [0.005]

    def now_ros():
        value = time.monotonic() + offset
        if stalls:
            time.sleep(stalls.pop())
        return value

    due = time.monotonic() + 0.5
    assert monotonic_to_ros(now_ros, due) == pytest.approx(due + offset, abs=1e-4)
    assert not stalls


def test_each_chunk_is_one_trajectory_and_every_row_is_reached_once_a_period_apart(ctx):
    cell = Cell(ctx, trajectory_velocities=True)
    try:
        rows = [_sine(k) for k in range(4 * ROWS)]
        n = cell.play([rows[i:i + ROWS] for i in range(0, len(rows), ROWS)])
        assert cell.gate.drain(1.0, finish=cell.outputs.end)
        got = cell.messages(4)
        time.sleep(0.3)
        assert len(cell.received) == 4 == cell.outputs.trajectories        # one per chunk, not one per row
        assert [why for _, _, why in got if why is not None] == []
        assert [len(m.points) for _, m, _ in got] == [ROWS] * 4
        for _, m, _ in got:   # time_from_start (j + 1) periods after the stamp
            assert [duration_s(p.time_from_start) for p in m.points] == \
                pytest.approx([(j + 1) * PERIOD for j in range(ROWS)], abs=1e-9)
        played = _timeline(got)
        np.testing.assert_allclose([pos for _, pos, _, _ in played], [r[:7] for r in rows[:n]])  # once each, in order
        gaps = np.diff([t for t, _, _, _ in played])
        assert np.all(gaps > PERIOD - 1e-4)
        assert np.count_nonzero(np.abs(gaps - PERIOD) > 1e-4) <= cell.gate.regrids    # the grid moves only later
        # the seam: the new trajectory starts where the old one's last row is reached
        stamps = [duration_s(m.header.stamp) for _, m, _ in got]
        for a, b in zip(stamps, stamps[1:]):
            assert b - a >= ROWS * PERIOD - 1e-4
        # velocities from the rows: continuous across seams, no stop at a seam (the motion's own speed)
        vel = np.array([v for _, _, v, _ in played])
        truth = np.array([_sine_velocity(k) for k in range(n)])
        step = 0.3 * (2 * math.pi * 0.7) ** 2 * PERIOD                 # the motion's velocity change per row
        assert np.max(np.abs(np.diff(vel, axis=0))) <= 1.5 * step
        seams = [i for i in range(1, n) if played[i][3] != played[i - 1][3]]
        assert len(seams) == 3
        for i in seams:
            np.testing.assert_allclose(vel[i - 1], truth[i - 1], atol=2 * step)   # the old one's last point
            np.testing.assert_allclose(vel[i], truth[i], atol=0.05 * step)       # central difference over the seam
    finally:
        cell.close()


def test_a_normal_end_cuts_the_playing_trajectory_at_the_last_row_handed_over(ctx):
    cell = Cell(ctx, trajectory_velocities=True)
    try:
        rows = [_sine(k) for k in range(2 * ROWS)]
        n = cell.play([rows[:ROWS], rows[ROWS:]], stop_after=ROWS + 4)
        assert n == ROWS + 4
        assert cell.gate.drain(1.0, finish=cell.outputs.end)
        got = cell.messages(3)
        last = got[-1][1]
        assert duration_s(last.header.stamp) == pytest.approx(duration_s(got[-2][1].header.stamp), abs=1e-9)
        assert len(last.points) == 4 and list(last.points[-1].velocities) == [0.0] * 7
        played = _timeline(got)
        np.testing.assert_allclose([pos for _, pos, _, _ in played], [r[:7] for r in rows[:n]])
        assert not cell.gate.submit(rows[n])                                   # latched: nothing after the end
        time.sleep(0.2)
        assert len(cell.received) == 3
    finally:
        cell.close()


def test_the_hold_replaces_the_playing_trajectory_and_nothing_follows_it(ctx):
    cell = Cell(ctx)
    try:
        rows = [_sine(k) for k in range(ROWS)]
        n = cell.play([rows], stop_after=5)
        hold = cell.gate.hold(lambda last: last)
        assert hold in rows[:n]                                  # the last row out (any still queued is dropped)
        got = cell.messages(2)
        msg = got[-1][1]
        assert duration_s(msg.header.stamp) == 0.0 and len(msg.points) == 1     # start now, one point
        assert list(msg.points[0].positions) == pytest.approx(hold[:7])
        played = _timeline(got)
        assert played[-1][3] == len(got) - 1                                     # the hold is the last reached
        assert len(played) <= rows.index(hold) + 2                               # no row past the hold
        assert not cell.gate.submit(rows[n])
        assert cell.gate.drain(0.5, finish=cell.outputs.end)                    # already latched: no end trajectory
        time.sleep(0.2)
        assert len(cell.received) == 2
    finally:
        cell.close()


def test_a_trajectory_stops_before_a_row_the_driver_refuses_and_a_changed_row_starts_a_new_one(ctx):
    cell = Cell(ctx, joint_upper=[0.37] + [1e3] * 7)
    try:
        rows = [[0.05 * j] + _sine(j)[1:] for j in range(ROWS)]       # dim 0: 0.35 at row 7, 0.40 at row 8 > 0.37
        clipped = [0.12] + rows[3][1:]
        n = cell.play([rows], stop_after=6, changed={3: clipped})
        got = cell.messages(2)
        first, second = got[0][1], got[1][1]
        assert len(first.points) == 8                                  # rows 0..7: row 8 is over joint_upper
        assert list(second.points[0].positions) == pytest.approx(clipped[:7])   # the changed row starts a new one
        assert len(second.points) == 5                                 # clipped row 3, then rows 4..7 of the plan
        assert duration_s(second.header.stamp) - duration_s(first.header.stamp) >= 3 * PERIOD - 1e-4
        played = _timeline(got)
        want = [r[:7] for r in rows[:3]] + [clipped[:7]] + [r[:7] for r in rows[4:8]]
        np.testing.assert_allclose([pos for _, pos, _, _ in played], want)
        assert n == 6 and cell.outputs.trajectories == 2               # rows 4, 5 rode on the second one
    finally:
        cell.close()


def test_delta_chunks_go_out_row_by_row_unchanged(ctx):
    cell = Cell(ctx)
    try:
        rows = [[0.01 * (k + 1)] * 7 + [0.0] for k in range(ROWS)]
        n = cell.play([rows], space="joint_delta")
        assert cell.gate.drain(1.0, finish=cell.outputs.end)
        got = cell.messages(n)
        time.sleep(0.2)
        assert len(cell.received) == n
        for (_, m, _), row in zip(got, rows):
            assert len(m.points) == 1 and list(m.points[0].positions) == row[:7]
    finally:
        cell.close()


def test_the_driver_sends_each_echo_chunk_as_one_trajectory_that_takes_over_at_the_seam(ros, echo_server):
    """The whole driver (core, gate, outputs) against the echo policy: column 0 of a row is its
    chunk's number, column 1 its row in the chunk, so a duplicated or skipped row shows."""
    robot = ros.add(FakeRobot(ros.ctx))
    node = ros.add(rclpy.create_node("fake_jtc", context=ros.ctx))
    received = []

    def on_msg(msg):
        now = node.get_clock().now().nanoseconds * 1e-9
        stamp = duration_s(msg.header.stamp)
        received.append((stamp if stamp else now, msg, jtc_refusal(msg, FR3_ARM_JOINTS, now)))

    node.create_subscription(JointTrajectory, "fr3_arm_controller/joint_trajectory", on_msg, 100)
    driver = ros.add(PolicyDriver(context=ros.ctx, parameter_overrides=driver_params(
        echo_server, command_mode="joint_trajectory_controller", arm_controller="fr3_arm_controller",
        trajectory_output="chunk")))
    client = ActionClient(node, Act, "policy_driver/act")
    ros.start()
    assert client.wait_for_server(timeout_sec=20.0)
    wait(driver.assembler.ready, 20.0, "sensors")
    res = Goal(client, max_seconds=2.0).wait_result().result
    wait(lambda: len(received) >= 2, 10.0, "trajectories")
    time.sleep(0.5)
    count = len(received)
    assert res.reason == "timeout" and res.actions > 15 and res.chunks >= 2
    assert [why for _, _, why in received if why is not None] == []
    *chunks, hold = [m for _, m, _ in received]
    assert duration_s(hold.header.stamp) == 0.0 and len(hold.points) == 1       # the hold, last
    assert len(chunks) == res.chunks                                              # one trajectory per chunk
    for m in chunks:   # one chunk each (column 0), its rows in order (column 1), one period apart
        assert len({p.positions[0] for p in m.points}) == 1
        assert [p.positions[1] for p in m.points] == list(range(int(m.points[0].positions[1]),
                                                                int(m.points[0].positions[1]) + len(m.points)))
        assert [duration_s(p.time_from_start) for p in m.points] == \
            pytest.approx([(j + 1) / 15.0 for j in range(len(m.points))], abs=1e-9)
    sent = [row[:7] for _, row in driver.trace.commands]
    played = jtc_timeline([(r, m) for r, m, _ in received])
    assert played[-1][3] == len(received) - 1                                    # nothing reached after the hold
    reached = [pos for _, pos, _, i in played if i < len(chunks)]
    np.testing.assert_allclose(reached, sent[:len(reached)])                      # each row once, in order
    assert len(reached) >= len(sent) - 1                                          # (the hold may cut the last)
    gaps = np.diff([t for t, _, _, i in played if i < len(chunks)])
    assert np.all(gaps > 1 / 15.0 - 1e-4)
    assert np.count_nonzero(np.abs(gaps - 1 / 15.0) > 1e-4) <= driver._gate.regrids + res.underruns
    time.sleep(0.3)
    assert len(received) == count and robot.commands == []                       # nothing after the hold
