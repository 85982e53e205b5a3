"""Each run's stop request (``StopToken``): made before the run, never cleared, never shared.

- a token stopped before the run's first chunk -- before the call, while the first observation is
  taken, while the first request is in flight -- ends the run ``interrupted`` with no action and
  one hold;
- a stop for one run never reaches the next (a late stop of the old token, ``interrupt()``
  between runs);
- a stop during the run holds within one control period, also while the loop waits on a
  stalled request, and nothing reaches ``act`` after it.

The worker's answers come from ``GatedWire``, an in-process stand-in for ``_wire.Wire.act``
whose requests are answered at once or held until the test lets them go; the ordering is set
by events between threads, never by sleeping in the test.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import sequence_ai
from _core_support import InProcessWire
from sequence_ai_core import ActionChunk, AsyncPolicy, Prediction, StopToken

HZ = 2.0                  # a long period (0.5 s): "within one period" is far from scheduling noise
PERIOD_S = 1.0 / HZ
FAST_HZ = 200.0           # runs that only count what happened finish in milliseconds
WAIT_S = 10.0             # a bound on every cross-thread wait: a hang fails instead of blocking


def chunk(rows: int, hz: float) -> ActionChunk:
    return ActionChunk(actions=[[0.1 * i, 0.0] for i in range(rows)], action_space="joint_absolute",
                       robot="r", control_frequency_hz=hz)


class GatedWire(InProcessWire):
    """Answers request ``i`` with ``chunks[i]`` (the last one for later requests). A request whose
    index is in ``held`` waits until ``release`` is set (or the run cancels it); ``asked`` is set
    when a held request has gone out."""

    def __init__(self, chunks, held=()):
        super().__init__()
        self.chunks = list(chunks)
        self.held = set(held)
        self.asked = threading.Event()
        self.release = threading.Event()
        self.reconnects = 0

    async def act(self, observation, *, params=None, episode_id=None, delay=None):
        i = self.calls
        self.calls += 1
        self.started.append(time.monotonic())
        if i in self.held:
            self.asked.set()
            loop = asyncio.get_running_loop()
            while not self.release.is_set():   # polled on the loop, so a cancel ends it at once
                await loop.run_in_executor(None, self.release.wait, 0.05)
        return Prediction(action_chunk=self.chunks[min(i, len(self.chunks) - 1)], latency_s=0.0)


def make_policy(wire) -> AsyncPolicy:
    policy = AsyncPolicy("gated", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
    policy._wire = wire
    return policy


class Robot:
    """observe / act / hold for the loop, recording the order of events and the time of each."""

    def __init__(self, on_act=None, on_observe=None):
        self.events: list = []
        self.times: dict = {"act": [], "hold": []}
        self.on_act = on_act
        self.on_observe = on_observe

    def observe(self):
        self.events.append("observe")
        if self.on_observe is not None:
            self.on_observe()
        return {"images": [], "proprioception": {"joint_positions": [0.0, 0.0]}, "instruction": "x"}

    def act(self, row):
        self.events.append("act")
        self.times["act"].append(time.monotonic())
        if self.on_act is not None:
            self.on_act(self.events.count("act"))

    def hold(self):
        self.events.append("hold")
        self.times["hold"].append(time.monotonic())


def drive(policy, robot, **options):
    options.setdefault("max_actions", 50)
    return asyncio.run(asyncio.wait_for(
        policy.run(robot.observe, robot.act, hold=robot.hold, validate=lambda r: True, progress=False,
                   **options), WAIT_S))


def on_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


# ------------------------------------------------------------------ before the first chunk

def test_a_token_stopped_before_the_call_ends_the_run_before_anything_is_observed_or_acted():
    wire = GatedWire([chunk(20, FAST_HZ)])
    robot = Robot()
    token = StopToken()
    token.stop()
    out = drive(make_policy(wire), robot, stop=token)
    assert out.reason == "interrupted" and out.actions == 0
    assert robot.events == ["hold"]
    assert wire.calls == 0


def test_the_sync_face_passes_the_token_through():
    wire = GatedWire([chunk(20, FAST_HZ)])
    robot = Robot()
    token = StopToken()
    token.stop()
    with sequence_ai.Policy(make_policy(wire)) as policy:
        out = policy.act("x", robot.observe, robot.act, hold=robot.hold, validate=lambda r: True,
                         max_seconds=5.0, progress=False, stop=token)
    assert out.reason == "interrupted" and out.actions == 0 and robot.events == ["hold"]


def test_a_stop_while_the_first_observation_is_taken_ends_the_run_before_any_action():
    wire = GatedWire([chunk(20, FAST_HZ)])
    token = StopToken()
    robot = Robot(on_observe=token.stop)
    out = drive(make_policy(wire), robot, stop=token)
    assert out.reason == "interrupted" and out.actions == 0
    assert robot.events == ["observe", "hold"]


def test_a_stop_while_the_first_request_is_in_flight_ends_the_run_before_any_action():
    wire = GatedWire([chunk(20, FAST_HZ)], held={0})
    token = StopToken()
    stopped = {}

    def stop_when_asked():
        assert wire.asked.wait(WAIT_S)
        token.stop()
        stopped["at"] = time.monotonic()
        wire.release.set()   # the answer may land now: it must not be played

    helper = on_thread(stop_when_asked)
    robot = Robot()
    out = drive(make_policy(wire), robot, stop=token)
    helper.join(WAIT_S)
    assert out.reason == "interrupted" and out.actions == 0
    assert robot.events == ["observe", "hold"]
    assert robot.times["hold"][0] - stopped["at"] < PERIOD_S


def test_run_rejects_a_stop_that_is_not_a_token():
    with pytest.raises(TypeError, match="StopToken"):
        drive(make_policy(GatedWire([chunk(2, FAST_HZ)])), Robot(), stop=threading.Event())


# ------------------------------------------------------------------ one run's stop, not the next

def test_a_stop_for_one_run_never_reaches_the_next():
    wire = GatedWire([chunk(20, FAST_HZ)])
    policy = make_policy(wire)
    first = StopToken()
    out1 = drive(policy, Robot(on_act=lambda n: n == 3 and first.stop()), stop=first)
    assert out1.reason == "interrupted" and out1.actions == 3

    first.stop()                         # a late cancel of the first run, after it ended
    policy.interrupt()                   # and an interrupt while no run is under way
    second = StopToken()
    robot = Robot(on_act=lambda n: first.stop())   # the old token again, mid-run
    out2 = drive(policy, robot, stop=second, max_actions=10)
    assert out2.reason == "completed" and out2.actions == 10
    assert "hold" not in robot.events and not second.stopped

    out3 = drive(policy, Robot(), max_actions=5)   # a run with a token of its own
    assert out3.reason == "completed" and out3.actions == 5


def test_interrupt_stops_the_run_under_way_through_its_token():
    wire = GatedWire([chunk(20, FAST_HZ)])
    policy = make_policy(wire)
    token = StopToken()
    out = drive(policy, Robot(on_act=lambda n: n == 2 and policy.interrupt()), stop=token)
    assert out.reason == "interrupted" and out.actions == 2 and token.stopped


# ------------------------------------------------------------------ during the run

def test_a_stop_during_playback_holds_within_one_control_period_and_nothing_is_acted_after_it():
    wire = GatedWire([chunk(40, HZ)])
    token = StopToken()
    second_act = threading.Event()
    stopped = {}

    def stop_after_the_second_action():
        assert second_act.wait(WAIT_S)
        token.stop()                     # the loop is asleep until the third action's deadline
        stopped["at"] = time.monotonic()

    helper = on_thread(stop_after_the_second_action)
    robot = Robot(on_act=lambda n: n == 2 and second_act.set())
    out = drive(make_policy(wire), robot, stop=token)
    helper.join(WAIT_S)
    assert out.reason == "interrupted" and robot.events.count("hold") == 1
    assert all(t <= stopped["at"] for t in robot.times["act"])
    assert robot.times["hold"][0] - stopped["at"] < PERIOD_S
    assert robot.events[-1] == "hold"


def test_a_stop_while_the_loop_waits_on_a_stalled_request_holds_within_one_control_period():
    wire = GatedWire([chunk(2, HZ), chunk(40, HZ)], held={1})
    token = StopToken()
    stopped = {}
    underrun = threading.Event()

    def stop_in_the_stall():
        assert underrun.wait(WAIT_S)
        token.stop()
        stopped["at"] = time.monotonic()

    helper = on_thread(stop_in_the_stall)
    robot = Robot()
    out = drive(make_policy(wire), robot, stop=token, on_underrun=underrun.set, prefetch=False)
    helper.join(WAIT_S)
    wire.release.set()
    assert out.reason == "interrupted" and out.actions == 2 and out.underruns == 1
    assert robot.events.count("hold") == 1 and robot.events[-1] == "hold"
    assert robot.times["hold"][0] - stopped["at"] < PERIOD_S
