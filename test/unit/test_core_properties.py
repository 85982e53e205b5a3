"""Property tests (hypothesis) of the control loop's safety promises, over many generated runs:

- nothing reaches ``act`` after ``hold`` (whatever ends the run: interrupt, validate, an
  exception from act, max_actions);
- no action outside the declared bounds reaches ``act``, and consecutive absolute actions never
  move more than ``max_delta``, seams included;
- delta chunks within their limits are never modified (not by smoothing, not by the seam
  guard), and no delta value beyond ``max_delta`` reaches ``act`` (a delta row is the step).

Hundreds of runs do not fit a real server's round trips, so here the worker's answers come from
``ScriptedWire``, an in-process stand-in for ``_wire.Wire.act`` that returns generated chunks
after generated delays; everything else (AsyncPolicy, ControlLoop, buffer, seam, limits,
pacing, interrupt) is the real engine, timed on virtual time (``test/_vclock.py``): each run is
seconds of 15 Hz control that costs milliseconds, with the same steps every time. test_core_client.py checks the same promises against the
real worker.
"""
from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import _vclock
from _core_support import InProcessWire
from sequence_ai_core import ActionChunk, AsyncPolicy

HZ = 15.0  # the pick-place rate: on virtual time (test/_vclock.py) a run costs milliseconds however slow
DIM = 3


class ScriptedWire(InProcessWire):
    """Answers /act with the next generated chunk after its generated delay (s)."""

    def __init__(self, chunks, delays, contract):
        super().__init__(contract)
        self.chunks = list(chunks)
        self.delays = list(delays)
        self.reconnects = 0

    def answer(self, i):
        return self.delays[i % len(self.delays)], self.chunks[i % len(self.chunks)]


def make_policy(chunks, delays, contract):
    policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
    policy._wire = ScriptedWire(chunks, delays, contract)
    return policy


def observe():
    return {"images": [], "proprioception": {"joint_positions": [0.0] * DIM}, "instruction": "x"}


value = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)
row = st.lists(value, min_size=DIM, max_size=DIM)
rows = st.lists(row, min_size=1, max_size=6)


def chunks_of(space):
    return st.lists(
        st.builds(lambda r, h: ActionChunk(actions=r, action_space=space, robot="r",
                                           control_frequency_hz=HZ, open_loop_horizon=h),
                  rows, st.one_of(st.none(), st.integers(1, 6))),
        min_size=1, max_size=4)


# turnarounds of 0, 1/2, 2 and 6 control periods (s)
delays = st.lists(st.sampled_from([0.0, 0.5 / HZ, 2.0 / HZ, 6.0 / HZ]), min_size=1, max_size=4)
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(chunks=chunks_of("joint_absolute"), delays=delays,
       stop_at=st.integers(0, 30), how=st.sampled_from(["interrupt", "validate", "raise", "none"]),
       prefetch=st.booleans(), lookahead=st.integers(1, 3), smooth=st.integers(0, 3))
def test_no_act_after_hold(chunks, delays, stop_at, how, prefetch, lookahead, smooth):
    events = []
    policy = make_policy(chunks, delays, {"action": None})
    n = {"acted": 0}

    def act(r):
        events.append("act")
        n["acted"] += 1
        if how == "interrupt" and n["acted"] == stop_at:
            policy.interrupt()
        if how == "raise" and n["acted"] == stop_at:
            raise RuntimeError("robot fault")

    def validate(r):
        return not (how == "validate" and n["acted"] == stop_at)

    async def main():
        try:
            return await policy.run(observe, act, max_actions=25, validate=validate,
                                    hold=lambda: events.append("hold"), prefetch=prefetch,
                                    lookahead=lookahead, smooth_seam=smooth, progress=False)
        except RuntimeError:
            return None

    out = _vclock.drive(policy, main)
    if "hold" in events:
        assert events.count("hold") == 1
        assert "act" not in events[events.index("hold"):]
    if out is not None and out.reason in ("interrupted", "validate"):
        assert "hold" in events


@SETTINGS
@given(chunks=chunks_of("joint_absolute"), delays=delays, prefetch=st.booleans(),
       smooth=st.integers(0, 3),
       bounds=st.lists(st.tuples(st.floats(-2.0, -0.1), st.floats(0.1, 2.0)), min_size=DIM, max_size=DIM),
       max_delta=st.one_of(st.none(), st.floats(0.05, 1.0)))
def test_no_action_outside_the_declared_limits_reaches_act(chunks, delays, prefetch, smooth, bounds, max_delta):
    contract = {"action": {"action_space": "joint_absolute", "bounds": [list(b) for b in bounds],
                           "max_delta": max_delta}}
    policy = make_policy(chunks, delays, contract)
    acted = []

    async def main():
        return await policy.run(observe, acted.append, max_actions=20, validate=lambda r: True,
                                prefetch=prefetch, smooth_seam=smooth, progress=False)

    _vclock.drive(policy, main)
    assert acted
    for r in acted:
        for v, (lo, hi) in zip(r, bounds):
            assert lo <= v <= hi
    if max_delta is not None:
        for a, b in zip(acted, acted[1:]):
            assert max(abs(x - y) for x, y in zip(a, b)) <= max_delta + 1e-9


@SETTINGS
@given(space=st.sampled_from(["joint_delta", "ee_delta", "joint_velocity"]),
       chunk_rows=st.lists(st.lists(st.lists(st.floats(-0.5, 0.5, allow_nan=False), min_size=DIM, max_size=DIM),
                                    min_size=1, max_size=6), min_size=1, max_size=4),
       delays=delays, prefetch=st.booleans(), smooth=st.integers(0, 4), lookahead=st.integers(1, 3))
def test_delta_chunks_are_never_modified(space, chunk_rows, delays, prefetch, smooth, lookahead):
    chunks = [ActionChunk(actions=r, action_space=space, control_frequency_hz=HZ) for r in chunk_rows]
    # rows within their limits (a delta row's magnitude is what max_delta bounds; velocity rows
    # are bounded by their change, so no max_delta for them here): smoothing never touches them
    max_delta = None if space == "joint_velocity" else 0.5
    contract = {"action": {"action_space": space, "bounds": [[-0.5, 0.5]] * DIM, "max_delta": max_delta}}
    policy = make_policy(chunks, delays, contract)
    acted = []
    total = 20

    async def main():
        return await policy.run(observe, acted.append, max_actions=total, validate=lambda r: True,
                                prefetch=prefetch, smooth_seam=smooth, lookahead=lookahead, progress=False)

    out = _vclock.drive(policy, main)
    # every acted row is, in order, a row the policy sent: chunk after chunk, whole chunks
    expected = []
    i = 0
    while len(expected) < total:
        expected.extend(chunk_rows[i % len(chunk_rows)])
        i += 1
    assert acted == [list(map(float, r)) for r in expected[:total]]
    assert out.clipped == 0 and not math.isnan(out.max_seam_jump)


@SETTINGS
@given(space=st.sampled_from(["joint_delta", "ee_delta"]),
       chunk_rows=st.lists(st.lists(st.lists(st.floats(-0.5, 0.5, allow_nan=False), min_size=DIM, max_size=DIM),
                                    min_size=1, max_size=6), min_size=1, max_size=4),
       delays=delays, prefetch=st.booleans(), smooth=st.integers(0, 4), max_delta=st.floats(0.01, 0.4))
def test_no_delta_step_over_max_delta_reaches_act(space, chunk_rows, delays, prefetch, smooth, max_delta):
    chunks = [ActionChunk(actions=r, action_space=space, control_frequency_hz=HZ) for r in chunk_rows]
    contract = {"action": {"action_space": space, "bounds": [[-0.5, 0.5]] * DIM, "max_delta": max_delta}}
    policy = make_policy(chunks, delays, contract)
    acted = []

    async def main():
        return await policy.run(observe, acted.append, max_actions=20, validate=lambda r: True,
                                prefetch=prefetch, smooth_seam=smooth, progress=False)

    _vclock.drive(policy, main)
    expected = []
    i = 0
    while len(expected) < 20:
        expected.extend(chunk_rows[i % len(chunk_rows)])
        i += 1
    # each value is the policy's, clipped to +-max_delta: nothing else changes it, seams included
    assert acted == [[min(max(float(v), -max_delta), max_delta) for v in r] for r in expected[:20]]
