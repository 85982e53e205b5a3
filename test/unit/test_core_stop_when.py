"""Stop conditions, the operator and camera freshness, each checked every control period.

- ``stop_when(observation)`` is called once per control period, before that period's action, with
  what ``observe()`` returned; true ends the run ``stop_when`` without a hold and before the
  action of that period;
- an ``Operator`` outranks the run: active at the call, the run returns ``operator`` with nothing
  observed, acted or held; taken mid-run, the loop holds within one control period and acts no
  more; released, the next run drives again;
- ``max_frame_age_s`` is checked every control period, not only when a request is built: a camera
  that freezes while a long chunk plays (no request goes out) or while the loop waits for a late
  chunk is caught within its age plus one period.

The worker is an in-process stand-in (``InProcessWire``): the timing under test is the loop's,
not a server's round trip. ``drive`` runs on virtual time (test/_vclock.py), so the freshness
bounds are exact; the operator tests that take the robot from another thread run on real time.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import _vclock
from _core_support import InProcessWire
from sequence_ai_core import ActionChunk, AsyncPolicy, ConnectOptions, Operator, StaleCamera

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")

def chunk(rows: int, hz: float) -> ActionChunk:
    return ActionChunk(actions=[[0.01 * i, 0.0] for i in range(rows)], action_space="joint_absolute",
                       robot="r", control_frequency_hz=hz)


class Wire(InProcessWire):
    """Request ``i`` gets ``rows`` rows at ``hz`` after ``delays[i]`` s (the last delay for later ones);
    a request whose index is in ``held`` waits until ``release`` is set."""

    def __init__(self, rows: int, hz: float, delays=(0.0,), held=()):
        super().__init__()
        self.rows, self.hz, self.delays, self.held = rows, hz, list(delays), set(held)
        self.asked = threading.Event()
        self.release = threading.Event()
        self.reconnects = 0

    def answer(self, i):
        return self.delays[min(i, len(self.delays) - 1)], chunk(self.rows, self.hz)

    async def act(self, observation, *, params=None, episode_id=None, delay=None):
        if self.calls in self.held:
            self.asked.set()
            loop = asyncio.get_running_loop()
            while not self.release.is_set():
                await loop.run_in_executor(None, self.release.wait, 0.05)
        return await super().act(observation, params=params, episode_id=episode_id, delay=delay)


def _now() -> float:
    return asyncio.get_running_loop().time()   # the loop's clock: virtual under drive(), else monotonic


class Robot:
    """observe / act / hold, with the time of each (the event loop's clock); ``frozen_after``: observations after that many
    repeat one frame (a dead camera); ``images=False``: no camera at all."""

    def __init__(self, frozen_after=None, images=True):
        self.observed: list = []
        self.acted: list = []
        self.held: list = []
        self.frozen_after = frozen_after
        self.images = images

    def observe(self):
        n = len(self.observed)
        self.observed.append(_now())
        images = []
        if self.images:
            frozen = self.frozen_after is not None and n >= self.frozen_after
            images = [{"view": "wrist", "data": b"same" if frozen else b"frame %d" % n}]
        return {"images": images, "proprioception": {"joint_positions": [0.0, 0.0]}, "n": n}

    def act(self, row):
        self.acted.append(_now())

    def hold(self):
        self.held.append(_now())


def make_policy(wire, **options) -> AsyncPolicy:
    policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off", **options)
    policy._wire = wire
    return policy


def drive(policy, robot, **options):
    options.setdefault("max_actions", 40)

    async def main():
        return await policy.run(robot.observe, robot.act, hold=robot.hold, progress=False, **options)

    return _vclock.drive(policy, main)


# ------------------------------------------------------------------ stop_when

def test_stop_when_sees_each_periods_observation_and_ends_before_that_periods_action():
    seen = []

    def done(observation):
        seen.append(observation["n"])
        return len(seen) == 6

    robot = Robot(images=False)
    out = drive(make_policy(Wire(rows=50, hz=100.0)), robot, stop_when=done)
    assert out.reason == "stop_when" and out.end_reason == "stop_when"
    assert out.actions == 5 and len(robot.acted) == 5      # the sixth period's action never went out
    assert robot.held == []                                 # an ending the caller asked for: no hold
    assert len(seen) == 6 and seen == sorted(seen)          # one call per control period, in order


def test_stop_when_false_lets_the_run_complete_and_is_asked_once_per_action():
    calls = []
    robot = Robot(images=False)
    out = drive(make_policy(Wire(rows=8, hz=200.0)), robot, max_actions=20,
                stop_when=lambda obs: calls.append(obs) and False)
    assert out.reason == "completed" and out.actions == 20
    assert len(calls) == 20


def test_a_stop_when_that_is_not_callable_is_refused_naming_it():
    robot = Robot(images=False)
    with pytest.raises(TypeError, match="stop_when must be a callable"):
        drive(make_policy(Wire(rows=8, hz=200.0)), robot, stop_when="cube on pad")
    assert robot.observed == [] and robot.acted == [] and robot.held == []


def test_stop_when_is_checked_while_the_loop_waits_for_a_late_chunk():
    wire = Wire(rows=3, hz=20.0, held={1})
    robot = Robot(images=False)
    stop_at = {}

    def done(observation):
        if len(robot.acted) == 3:   # the buffer ran dry: the next request hangs
            stop_at.setdefault("t", _now())
            return True
        return False

    out = drive(make_policy(wire), robot, stop_when=done, prefetch=False)
    wire.release.set()
    assert out.reason == "stop_when" and out.actions == 3 and out.underruns == 1
    # stop_when looks again while the loop waits, first at the deadline it missed: one period
    # after the last action (virtual time, so exactly)
    assert stop_at["t"] == pytest.approx(robot.acted[2] + 1 / 20.0, abs=1e-9)


# ------------------------------------------------------------------ the operator

def test_an_active_operator_refuses_the_run_before_anything_is_observed_or_acted():
    operator = Operator()
    operator.take()
    robot = Robot(images=False)
    policy = make_policy(Wire(rows=8, hz=100.0), operator=operator)
    assert policy.operator is operator
    out = drive(policy, robot)
    assert out.reason == "operator" and out.actions == 0
    assert robot.observed == [] and robot.acted == [] and robot.held == []   # the operator has the robot
    operator.release()
    out = drive(policy, robot, max_actions=5)
    assert out.reason == "completed" and out.actions == 5


def test_taking_the_operator_mid_run_holds_within_one_period_and_nothing_acts_after():
    hz = 10.0
    period = 1.0 / hz
    robot = Robot(images=False)
    policy = make_policy(Wire(rows=20, hz=hz))
    taken = {}

    def act(row):
        robot.act(row)
        if len(robot.acted) == 4:
            def take():
                taken["t"] = time.monotonic()
                policy.operator.take()
            threading.Timer(period / 3, take).start()   # between two deadlines, from another thread

    async def main():
        return await policy.run(robot.observe, act, hold=robot.hold, progress=False, max_actions=40)

    out = asyncio.run(main())
    assert out.reason == "operator"
    assert len(robot.held) == 1
    assert all(t < robot.held[0] for t in robot.acted)          # no action after the hold
    latency = robot.held[0] - taken["t"]
    assert latency < period, f"held {latency * 1000:.1f} ms after the operator took the robot"
    assert out.actions == len(robot.acted) and out.actions <= 5
    policy.operator.release()



def test_a_take_released_before_the_next_check_still_ends_the_run_operator():
    """A take is latched for the run: a bouncing deadman switch (take, 10 ms, release) between
    two control periods, or a take and release while a slow stop_when runs, still holds and ends
    the run operator, and nothing acts after the hold."""
    robot = Robot(images=False)
    policy = make_policy(Wire(rows=20, hz=10.0))

    def act(row):
        robot.act(row)
        if len(robot.acted) == 4:
            policy.operator.take()
            time.sleep(0.01)
            policy.operator.release()

    async def main():
        return await policy.run(robot.observe, act, hold=robot.hold, progress=False, max_actions=12)

    out = asyncio.run(main())
    assert (out.reason, len(robot.held), out.actions) == ("operator", 1, 4), out
    assert all(t < robot.held[0] for t in robot.acted)

    robot = Robot(images=False)
    policy = make_policy(Wire(rows=50, hz=100.0))

    def slow_check(obs):
        if len(robot.acted) == 2:          # taken and released while this predicate runs
            threading.Timer(0.05, policy.operator.take).start()
            threading.Timer(0.15, policy.operator.release).start()
            time.sleep(0.3)
        return False

    out = drive(policy, robot, max_actions=10, stop_when=slow_check)
    assert (out.reason, len(robot.held)) == ("operator", 1), out
    assert policy.operator.active is False       # released: the next run may start
    assert drive(policy, Robot(images=False), max_actions=3).reason == "completed"

def test_an_operator_is_checked_at_connect_options():
    with pytest.raises(TypeError, match="operator must be a sequence_ai.Operator"):
        ConnectOptions(operator=True)
    op = Operator()
    assert repr(op) == "Operator(active=False)"
    op.set(True)
    assert op.active
    op.set(False)
    assert not op.active


# ------------------------------------------------------------------ freshness every period

def test_a_camera_that_dies_while_a_long_chunk_plays_is_caught_within_its_age_plus_one_period():
    hz, age = 20.0, 0.2
    robot = Robot(frozen_after=3)
    wire = Wire(rows=200, hz=hz)           # one 10 s chunk: no request would go out to notice
    out = drive(make_policy(wire), robot, max_actions=200, max_frame_age_s=age)
    assert out.reason == "stale_camera"
    assert isinstance(out.fault, StaleCamera) and out.fault.stream == "wrist"
    assert len(robot.held) == 1 and all(t < robot.held[0] for t in robot.acted)
    frozen_at = robot.observed[3]           # the last new frame: the first of the frozen ones
    assert age < robot.held[0] - frozen_at <= age + 1.0 / hz + 1e-9
    assert wire.calls == 1 and out.seconds < 1.0


def test_a_camera_that_dies_while_the_loop_waits_for_a_chunk_is_caught_within_its_age_plus_one_period():
    hz, age = 20.0, 0.2
    robot = Robot(frozen_after=5)
    wire = Wire(rows=3, hz=hz, held={1})   # the second request hangs: the loop waits, underrun
    out = drive(make_policy(wire), robot, max_actions=50, max_frame_age_s=age, prefetch=False)
    wire.release.set()
    assert out.reason == "stale_camera" and out.underruns == 1 and out.actions == 3
    frozen_at = robot.observed[5]           # the last new frame: the first of the frozen ones
    assert age < robot.held[0] - frozen_at <= age + 1.0 / hz + 1e-9
