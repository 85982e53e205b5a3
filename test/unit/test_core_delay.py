"""Delay-aware chunks in the engine: the delay in control steps, the committed prefix, the
aligned merges, generations, the typed refusals outside the declared delay, and camera
freshness; with property tests (hypothesis) that the prefix sent is what the robot executed, that
no row is played twice, and that delta chunks are never changed by a merge.

Many generated runs do not fit a real server's round trips, so the worker's answers come from
``DelayWire``, an in-process stand-in for ``_wire.Wire.act`` that echoes request_id and
generation like the worker does and records the delay fields of every request; everything
else (AsyncPolicy, ControlLoop, buffer, merge, pacing) is the real engine, on virtual time
(``test/_vclock.py``): the same steps every run, seconds of control in milliseconds.
test_delay_wire.py checks the same promises against a real worker process.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sequence_ai_core import (ActionChunk, AsyncPolicy, DelayUnsupported, InvalidRequest, Prediction,
                              StaleCamera)
from sequence_ai_core._delay import WINDOW, DelayEstimate, committed_prefix, steps_for
from sequence_ai_core._wire import Session

import _vclock

DIM = 3


def contract(space="joint_absolute", hz=10.0, modes=("chunk", "guided"), max_delay=None):
    return {"action": {"robot": "r", "action_space": space, "action_dim": DIM, "control_frequency_hz": hz,
                       "delay": {"modes": list(modes), "max_delay_steps": max_delay}},
            "observation": None}


def numbered(i, rows=10, hz=10.0, space="joint_absolute", horizon=None):
    """Chunk i: row t is [i * 1000 + t, t, 0.5]."""
    return ActionChunk(actions=[[i * 1000.0 + t, float(t), 0.5] for t in range(rows)], action_space=space,
                       robot="r", control_frequency_hz=hz, open_loop_horizon=horizon)


class DelayWire:
    """Answers /act after ``delays[i]`` seconds with ``make(i)`` (i counts from 1); echoes the
    request's request_id and generation (``echo(i, sent)`` may change them); keeps every
    request's delay fields in ``sent``."""

    def __init__(self, make, delays, contract, echo=None):
        self.make = make
        self.delays = list(delays)
        self.echo = echo or (lambda i, sent: (sent["request_id"], sent["generation"]))
        self.sent = []
        self.session = Session(session_id="s", worker_url="http://in-process", direct_secret="x",
                               contract=contract)
        self.reconnects = 0

    async def act(self, observation, *, params=None, episode_id=None, delay=None):
        self.sent.append(dict(delay))
        i = len(self.sent)
        await asyncio.sleep(self.delays[min(i - 1, len(self.delays) - 1)])
        rid, gen = self.echo(i, delay)
        return Prediction(action_chunk=self.make(i), latency_s=0.0, request_id=rid, extra={"generation": gen})

    async def join(self):
        return self.session

    def end_episode_soon(self, episode_id):
        pass

    async def settle(self, wait_s):
        pass

    async def aclose(self):
        pass


class Robot:
    """observe/act/hold targets; ``obs_k`` is the action index at each observation."""

    def __init__(self, frames=None):
        self.rows, self.obs_k, self.events, self.starts = [], [], [], []
        self.frames = frames

    def observe(self):
        self.obs_k.append(len(self.rows))
        images = []
        if self.frames is not None:
            images = [self.frames(len(self.obs_k))]
        return {"images": images, "proprioception": {"joint_positions": [0.0] * DIM}, "instruction": "x"}

    def act(self, row):
        self.rows.append(list(row))
        self.events.append("act")

    def hold(self):
        self.events.append("hold")

    def on_chunk(self, chunk, first):
        self.starts.append((first, chunk))


def drive(wire, robot, **options):
    policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
    policy._wire = wire
    options.setdefault("max_actions", 30)

    async def main():
        return await policy.run(robot.observe, robot.act, hold=robot.hold, on_chunk=robot.on_chunk,
                                progress=False, **options)

    return _vclock.drive(policy, main)


pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


# ------------------------------------------------------------------ the delay estimate

def test_the_delay_is_counted_in_steps_at_the_policy_rate_not_30_hz():
    # 10 Hz policy, 0.25 s turnaround: about 3 actions are consumed per request (not 8, 0.25 x 30)
    wire = DelayWire(numbered, [0.25], contract(hz=10.0))
    out = drive(wire, Robot(), max_actions=25)
    assert out.reason == "completed"
    later = [s["delay_steps"] for s in wire.sent[2:]]
    assert later and all(2 <= d <= 4 for d in later), later
    assert steps_for(0.25, 10.0) == 3 and steps_for(0.25, 30.0) == 8


def test_the_first_cold_request_is_excluded_and_a_spike_is_forgotten():
    est = DelayEstimate()
    est.add(40)          # the connection's cold first request
    assert est.steps is None and est.cold == 40
    est.add(2)
    assert est.steps == 2
    est.add(15)          # a warm-up spike
    for _ in range(WINDOW - 1):
        est.add(3)
        assert est.steps == 15
    est.add(3)           # WINDOW requests after it, it is gone
    assert est.steps == 3


def test_a_cold_first_request_beyond_the_limit_does_not_refuse_the_run():
    # first inference 1.5 s (15 steps at 10 Hz) against max_delay_steps 4; then 0.1 s
    wire = DelayWire(numbered, [1.5, 0.1], contract(max_delay=4))
    robot = Robot()
    out = drive(wire, robot, max_actions=12)
    assert out.reason == "completed" and len(robot.rows) == 12
    assert wire.sent[0]["prefix"] is None and wire.sent[0]["delay_steps"] == 0


# ------------------------------------------------------------------ the prefix

def test_the_prefix_is_padded_by_holding_the_last_row_never_zeros():
    assert committed_prefix([[1.0, 2.0, 3.0]], 3, "joint_absolute") == [[1.0, 2.0, 3.0]] * 3
    assert committed_prefix([], 2, "joint_absolute", last_action=[0.4, 0.5, 0.6]) == [[0.4, 0.5, 0.6]] * 2
    assert committed_prefix([], 2, "joint_absolute") is None
    rows = [[0.1, 0.2, 0.3], [0.2, 0.3, 0.4]]
    assert committed_prefix(rows, 1, "joint_absolute") == rows   # the whole committed tail


def test_a_delta_prefix_is_re_anchored_to_the_observation():
    steps = [[0.1, 0.0, -0.1]] * 3
    got = committed_prefix(steps, 5, "joint_delta")
    assert np.allclose(got, [[0.1, 0.0, -0.1], [0.2, 0.0, -0.2], [0.3, 0.0, -0.3], [0.3, 0.0, -0.3],
                             [0.3, 0.0, -0.3]])
    assert committed_prefix([], 2, "ee_delta", last_action=[0.1, 0.1, 0.1]) == [[0.0] * 3] * 2


# ------------------------------------------------------------------ merges

def test_aligned_drops_the_rows_whose_time_passed_and_starts_at_the_row_due_now():
    wire = DelayWire(numbered, [0.0, 0.3], contract(hz=10.0))
    robot = Robot()
    out = drive(wire, robot, max_actions=25, merge="aligned")
    assert out.merge == "aligned" and out.seams.count >= 2
    for record in out.seams.records:
        assert record.trimmed == record.consumed >= 2
    ids = [int(r[0] // 1000) for r in robot.rows]
    for n in range(1, len(ids)):
        if ids[n] != ids[n - 1]:   # a seam: the new chunk's first played row is the one due now
            first_t = int(robot.rows[n][1])
            assert first_t >= 2, (n, robot.rows[n])
            assert n - robot.obs_k[ids[n] - 1] == first_t   # row t is due t actions after its observation


def test_replace_is_the_default_for_plain_chunks_and_aligned_for_a_guided_policy():
    out = drive(DelayWire(numbered, [0.0], contract(modes=("chunk",))), Robot(), max_actions=5)
    assert (out.merge, out.delay_mode) == ("replace", "chunk")
    out = drive(DelayWire(numbered, [0.0], contract(modes=("chunk", "guided"), max_delay=50)), Robot(), max_actions=5)
    assert (out.merge, out.delay_mode) == ("aligned", "guided")


def test_aligned_blend_blends_only_the_named_continuous_dimensions():
    def make(i):
        level = 0.0 if i == 1 else 1.0
        return ActionChunk(actions=[[level, level, level]] * 10, action_space="joint_absolute", robot="r",
                           control_frequency_hz=20.0)
    robot = Robot()
    out = drive(DelayWire(make, [0.0, 0.1], contract(hz=20.0)), robot, max_actions=12,
                merge="aligned_blend", blend_dims=[0, 1], smooth_seam=3)
    seam = next(n for n, r in enumerate(robot.rows) if r[2] == 1.0)
    first = robot.rows[seam]
    assert 0.0 < first[0] < 1.0 and first[0] == first[1] == pytest.approx(0.25)   # (1) / (3 + 1)
    assert first[2] == 1.0                                                        # the gripper: untouched
    assert robot.rows[seam + 3] == [1.0, 1.0, 1.0]
    assert out.seams.records[0].blended == 3
    assert out.seams.records[0].jump_before == pytest.approx(1.0)
    assert out.seams.records[0].jump_after == pytest.approx(1.0)   # the gripper's own jump stays
    with pytest.raises(ValueError, match="blend_dims"):
        drive(DelayWire(make, [0.0], contract()), Robot(), merge="aligned_blend")


def test_aligned_blend_never_changes_a_delta_chunk():
    def make(i):
        return ActionChunk(actions=[[0.01 * i, 0.02 * i, 1.0]] * 10, action_space="joint_delta", robot="r",
                           control_frequency_hz=20.0)
    robot = Robot()
    out = drive(DelayWire(make, [0.0, 0.1], contract(space="joint_delta", hz=20.0)), robot, max_actions=20,
                merge="aligned_blend", blend_dims=[0, 1], smooth_seam=3)
    originals = {tuple(make(i).actions[0]) for i in range(1, 20)}
    assert all(tuple(r) in originals for r in robot.rows)
    assert out.seams.count >= 1 and out.seams.blended == 0


# ------------------------------------------------------------------ generations

def test_a_late_answer_of_an_older_generation_is_dropped_never_played():
    def echo(i, sent):
        return sent["request_id"], (sent["generation"] - 1 if i == 2 else sent["generation"])
    wire = DelayWire(numbered, [0.0, 0.05], contract(modes=("chunk",)), echo=echo)
    robot = Robot()
    out = drive(wire, robot, max_actions=25)
    played = {int(r[0] // 1000) for r in robot.rows}
    assert 2 not in played and {1, 3} <= played
    assert out.stale_answers == 1 and out.reason == "completed"


def test_an_answer_to_another_request_is_dropped():
    wire = DelayWire(numbered, [0.0, 0.05], contract(modes=("chunk",)),
                     echo=lambda i, sent: ("someone-else" if i == 2 else sent["request_id"], sent["generation"]))
    robot = Robot()
    out = drive(wire, robot, max_actions=25)
    assert 2 not in {int(r[0] // 1000) for r in robot.rows} and out.stale_answers == 1


# ------------------------------------------------------------------ delay limits and modes

def test_a_delay_beyond_the_maximum_is_refused_before_motion():
    robot = Robot()
    with pytest.raises(DelayUnsupported) as err:
        drive(DelayWire(numbered, [0.6], contract(max_delay=4)), robot)
    assert robot.rows == [] and robot.events == ["hold"]
    assert err.value.max_delay_steps == 4 and err.value.delay_steps >= 6
    assert isinstance(err.value, __import__("sequence_ai").InvalidRequest)


def test_a_delay_beyond_the_maximum_mid_run_holds_and_ends_typed():
    robot = Robot()
    out = drive(DelayWire(numbered, [0.05, 0.05, 0.05, 1.2], contract(max_delay=4)), robot, max_actions=60)
    assert out.reason == out.end_reason == "delay_exceeded"
    assert isinstance(out.fault, DelayUnsupported) and out.fault.delay_steps > 4
    assert robot.events.count("hold") == 1 and robot.events[-1] == "hold"


def test_an_aligned_merge_with_lookahead_asks_no_faster_than_the_refill_plan():
    """An aligned answer replaces the plan, so nothing queues behind it: lookahead=2 counts as 1
    there. Before, each answer that landed left the queue one short and the loop asked again at
    once: back-to-back requests (60 in a 3 s run at 50 ms turnarounds; on virtual time an instant
    answer never let time move at all)."""
    for delays in ([0.05], [0.05, 0.0]):
        wire = DelayWire(numbered, delays, contract(max_delay=8))
        out = drive(wire, Robot(), max_actions=30, lookahead=2)
        assert out.reason == "completed" and out.merge == "aligned"
        # 10-row chunks: one request per chunk played, the startup's two included
        assert len(wire.sent) <= 6, len(wire.sent)


def test_a_mode_the_policy_does_not_declare_is_refused_before_the_first_action():
    robot = Robot()
    with pytest.raises(DelayUnsupported, match="trained"):
        drive(DelayWire(numbered, [0.0], contract(modes=("chunk", "guided"), max_delay=8)), robot,
              delay_mode="trained")
    assert robot.rows == []
    with pytest.raises(ValueError, match="delay_mode"):
        drive(DelayWire(numbered, [0.0], contract()), Robot(), delay_mode="fast")


# ------------------------------------------------------------------ camera freshness

def frames(kind):
    def frame(n):
        if kind == "frozen" and n >= 3:
            return {"view": "wrist", "data": b"same", "timestamp_ms": 300.0}
        if kind == "stamp" and n >= 3:
            return {"view": "wrist", "data": b"frame %d" % n, "timestamp_ms": 300.0}
        return {"view": "wrist", "data": b"frame %d" % n, "timestamp_ms": 100.0 * n}
    return frame


@pytest.mark.parametrize("kind", ["frozen", "stamp"])
def test_a_frozen_camera_stops_requests_holds_and_names_the_stream(kind):
    robot = Robot(frames(kind))
    wire = DelayWire(lambda i: numbered(i, rows=3, hz=20.0), [0.0], contract(hz=20.0, modes=("chunk",)))
    taken_at_send = []          # observations taken when each request went out
    send = wire.act
    wire.act = lambda obs, **kw: (taken_at_send.append(len(robot.obs_k)), send(obs, **kw))[1]
    out = drive(wire, robot, max_actions=200, max_frame_age_s={"wrist": 0.2})
    assert out.reason == "stale_camera"
    assert isinstance(out.fault, StaleCamera) and out.fault.stream == "wrist"
    assert robot.events.count("hold") == 1 and robot.events[-1] == "hold"
    # the loop observes every control period; the observation that found it stale was never sent
    assert taken_at_send and taken_at_send[-1] < len(robot.obs_k)
    assert out.fault.age_s <= 0.2 + 3 * 0.15 and out.seconds < 1.0 and out.actions < 20


def test_a_live_camera_runs_to_the_end():
    robot = Robot(frames("live"))
    out = drive(DelayWire(lambda i: numbered(i, rows=3, hz=20.0), [0.0], contract(hz=20.0, modes=("chunk",))),
                robot, max_actions=30, max_frame_age_s=0.2)
    assert out.reason == "completed" and out.fault is None


def test_a_view_the_contract_lacks_is_refused_before_motion_listing_its_views():
    declared = contract(hz=20.0, modes=("chunk",))
    declared["observation"] = {"cameras": {"exterior_1": {"width": 64, "height": 64},
                                           "wrist_left": {"width": 64, "height": 64}}}
    robot = Robot(frames("live"))
    wire = DelayWire(lambda i: numbered(i, rows=3, hz=20.0), [0.0], declared)
    with pytest.raises(InvalidRequest) as err:
        drive(wire, robot, max_actions=30, max_frame_age_s={"wrist": 0.5})
    assert err.value.code == "unknown_view" and "'wrist'" in str(err.value)
    assert err.value.details == {"unknown": ["wrist"], "views": ["exterior_1", "wrist_left"]}
    assert "wrist_left" in err.value.hint
    assert robot.rows == [] and wire.sent == [] and robot.events == ["hold"]
    out = drive(DelayWire(lambda i: numbered(i, rows=3, hz=20.0), [0.0], declared), Robot(frames("live")),
                max_actions=5, max_frame_age_s={"wrist_left": 0.5})
    assert out.reason == "completed"


# ------------------------------------------------------------------ properties

HZ = 10.0   # on virtual time (test/_vclock.py) a generated run at a real rate costs milliseconds
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def generated(lengths, horizons, space):
    def make(i):
        n = lengths[(i - 1) % len(lengths)]
        h = horizons[(i - 1) % len(horizons)]
        return ActionChunk(actions=[[i * 1000.0 + t, 0.001 * i * (t + 1), -0.002 * t] for t in range(n)],
                           action_space=space, robot="r", control_frequency_hz=HZ,
                           open_loop_horizon=min(h, n) if h else None)
    return make


lengths = st.lists(st.integers(1, 8), min_size=1, max_size=4)
horizons = st.lists(st.one_of(st.none(), st.integers(1, 8)), min_size=1, max_size=4)
# turnarounds of 0, 0.8, 2.4 and 6 control periods (s)
delays = st.lists(st.sampled_from([0.0, 0.8 / HZ, 2.4 / HZ, 6.0 / HZ]), min_size=1, max_size=5)


@SETTINGS
@given(lengths=lengths, horizons=horizons, delays=delays, merge=st.sampled_from(["replace", "aligned"]),
       lookahead=st.integers(1, 2))
def test_the_prefix_sent_is_what_the_robot_executed_and_no_row_plays_twice(lengths, horizons, delays, merge,
                                                                         lookahead):
    wire = DelayWire(generated(lengths, horizons, "joint_absolute"), delays, contract(hz=HZ))
    robot = Robot()
    out = drive(wire, robot, max_actions=30, merge=merge, lookahead=lookahead)
    assert out.reason == "completed"
    keys = [(int(r[0] // 1000), int(round(r[0] % 1000))) for r in robot.rows]
    assert len(keys) == len(set(keys))                       # no row played twice
    starts = [(int(chunk.actions[0][0] // 1000), first) for first, chunk in robot.starts]
    for i, sent in enumerate(wire.sent):   # sent[i] is request i + 1
        prefix, k = sent["prefix"], robot.obs_k[i]
        if prefix is None:
            assert k == 0
            continue
        assert len(prefix) >= sent["delay_steps"]
        # until a chunk of this request or a later one starts, the robot plays what was buffered
        end = min([first for n, first in starts if n >= i + 1] + [len(robot.rows)])
        executed = robot.rows[k:end]
        assert prefix[:len(executed)] == executed, (i, k, end)


@SETTINGS
@given(lengths=lengths, horizons=horizons, delays=delays,
       merge=st.sampled_from(["replace", "aligned", "aligned_blend"]), smooth=st.integers(0, 3))
def test_delta_chunks_are_never_modified_by_a_merge(lengths, horizons, delays, merge, smooth):
    make = generated(lengths, horizons, "joint_delta")
    wire = DelayWire(make, delays, contract(space="joint_delta", hz=HZ))
    robot = Robot()
    out = drive(wire, robot, max_actions=30, merge=merge, blend_dims=[0, 1, 2], smooth_seam=smooth)
    assert out.reason == "completed"
    for r in robot.rows:
        i, t = int(r[0] // 1000), int(round(r[0] % 1000))
        assert r == make(i).actions[t]
