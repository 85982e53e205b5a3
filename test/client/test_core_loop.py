"""The control loop against the real gateway and worker on loopback (echo policy): one real
proof of each promise (pacing within a period with rows, chunks and prefetch, early endings and
hold, act()'s time bound, one interrupt, warming, the sync and async faces and their threads).

The loop's logic in detail (exact pacing, horizons, seams, prefetch and lookahead, every ending,
instructions, interrupts mid-fetch and in warming) is test/unit/test_core_loop_logic.py, on
virtual time in process.

The echo policy's rows are ``[chunk counter, row index, joints[2:7]..., gripper]`` at 15 Hz, so
what act() received says which chunk and which row each action came from.
"""
from __future__ import annotations

import statistics
import threading
import time

import pytest

import sequence_ai
from _core_support import ECHO, Recorder, after, connect, observation, slow_loading_copy, unique

PERIOD = 1 / 15
SLACK = 0.05  # scheduling slack on a busy CI box, added to "within one control period"

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


@pytest.fixture(scope="module")
def echo(shared_module_gateway):
    name = unique("echo-loop")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    return name


def run(gateway, echo, rec, params=None, **kw):
    with connect(gateway, echo, params=params or {}) as policy:
        return policy.run(observation, rec, hold=rec.hold, progress=False, **kw)


# ------------------------------------------------------------------ pacing

def test_actions_are_paced_at_the_control_frequency_without_drift_row_by_row_with_prefetch(shared_module_gateway, echo):
    rec = Recorder()
    out = run(shared_module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 8, "latency_ms": 150}, max_actions=32,
              on_underrun=lambda: None)
    # 150 ms refills against 533 ms chunks: prefetch keeps the buffer from running dry
    assert out.reason == "completed" and out.actions == 32 and out.underruns == 0 and out.underrun_s == 0.0
    periods = [b - a for a, b in zip(rec.times, rec.times[1:])]
    assert abs(statistics.median(periods) - PERIOD) < 0.003
    # no drift: every action sits on t0 + k/f (not an accumulation of sleeps). A loop stalled more
    # than a period by a loaded machine re-bases the schedule on purpose and counts a late tick
    # (the exact schedule, resyncs included, is test_core_loop_logic.py's, on virtual time)
    if out.late_ticks == 0:
        t0 = rec.times[0]
        offsets = [t - (t0 + k * PERIOD) for k, t in enumerate(rec.times)]
        assert statistics.median(abs(o) for o in offsets) < 0.005
        assert abs(offsets[-1]) < PERIOD / 2
    # the open-loop horizon: rows 0..7 of each chunk, chunk after chunk
    assert rec.row_indices == list(range(8)) * 4
    ids = rec.chunk_ids
    assert all(len(set(ids[i:i + 8])) == 1 for i in range(0, 32, 8)) and len(set(ids)) == 4
    assert out.chunks == 4 and out.max_seam_jump == pytest.approx(7.0)


# ------------------------------------------------------------------ endings

def test_validate_false_stops_before_acting_and_holds(shared_module_gateway, echo):
    rec = Recorder()
    checked = []

    def validate(row):
        checked.append(row)
        return len(checked) < 5

    out = run(shared_module_gateway, echo, rec, max_actions=50, validate=validate)
    assert out.reason == "validate" and out.actions == 4 and len(rec.rows) == 4
    assert rec.holds == 1


def test_an_exception_in_act_holds_once_and_is_raised(shared_module_gateway, echo):
    rec = Recorder()

    def act(row):
        rec(row)
        if len(rec.rows) == 3:
            raise RuntimeError("motor fault")

    with connect(shared_module_gateway, echo) as policy:
        with pytest.raises(RuntimeError, match="motor fault"):
            policy.run(observation, act, hold=rec.hold, max_actions=50, progress=False)
    assert rec.holds == 1


def test_act_pins_the_instruction_and_times_out(shared_module_gateway, echo):
    rec = Recorder()
    seen = []

    def observe():
        obs = observation(instruction="something else")
        seen.append(obs)
        return obs

    with connect(shared_module_gateway, echo, params={"chunk_len": 10}) as policy:
        t0 = time.monotonic()
        out = policy.act("pick up the cube", observe, rec, hold=rec.hold, max_seconds=1.0, progress=False)
        elapsed = time.monotonic() - t0
        assert policy.instruction is None  # the pin lasts for the call
    assert out.reason == "timeout" and rec.holds == 1
    assert 14 <= out.actions <= 16
    assert elapsed < 1.0 + 1.0  # startup + max_seconds of motion
    assert seen and all(o.instruction == "something else" for o in seen)  # caller's object untouched


# ------------------------------------------------------------------ interrupt

class _Marks(dict):
    """Times the interrupting thread noted; reading one first waits for that thread, which a
    loaded machine can preempt between interrupt() returning and noting the time."""

    thread = None

    def __getitem__(self, key):
        if self.thread is not None:
            self.thread.join(10.0)
        return super().__getitem__(key)


def _interrupt_and_measure(policy, rec, when):
    marks = _Marks()

    def fire():
        policy.interrupt()
        marks["returned"] = time.monotonic()

    marks.thread = after(when, fire)
    return marks


def test_interrupt_during_playback(shared_module_gateway, echo):
    rec = Recorder()
    with connect(shared_module_gateway, echo, params={"chunk_len": 10, "horizon": 8}) as policy:
        marks = _interrupt_and_measure(policy, rec, 0.6)
        out = policy.run(observation, rec, hold=rec.hold, max_actions=500, progress=False)
        end = time.monotonic()
    assert out.reason == "interrupted" and rec.holds == 1
    assert all(t <= marks["returned"] for t in rec.times)  # no act after interrupt() returned
    assert rec.hold_times[0] - marks["returned"] < PERIOD + SLACK
    assert end - marks["returned"] < PERIOD + SLACK
    assert 0 < out.actions < 500


def test_warming_raises_at_once_under_startup_timeout_zero_and_is_waited_out_before_the_first_action(
        shared_module_gateway, tmp_path):
    name = unique("echo-warm")
    shared_module_gateway.deploy(slow_loading_copy(tmp_path, 1), name, wait=False)
    rec = Recorder()
    waits = []
    with connect(shared_module_gateway, name, on_warming=lambda w, eta: waits.append((w, eta))) as policy:
        with pytest.raises(sequence_ai.Unavailable) as info:   # the worker is still starting
            policy.run(observation, rec, hold=rec.hold, max_actions=5, startup_timeout_s=0, progress=False)
        assert info.value.warming and info.value.retry_after_s is not None
        assert rec.holds == 1 and rec.rows == [] and waits == []
        out = policy.run(observation, rec, max_actions=5, progress=False)
    assert out.reason == "completed" and out.actions == 5
    assert waits and waits[0][1] is not None


# ------------------------------------------------------------------ one driver

def test_a_second_thread_driving_the_same_policy_raises(shared_module_gateway, echo):
    errors = []
    with connect(shared_module_gateway, echo) as policy:
        def second():
            try:
                policy.run(observation, Recorder(), max_actions=3, progress=False)
            except sequence_ai.SequencesError as exc:
                errors.append(exc)

        t = after(0.3, second)
        out = policy.run(observation, Recorder(), max_actions=15, progress=False)
        t.join()
    assert out.reason == "completed"
    assert len(errors) == 1 and errors[0].code == "busy"


def test_callbacks_run_on_the_thread_that_called_run(shared_module_gateway, echo):
    threads = set()
    me = threading.get_ident()
    with connect(shared_module_gateway, echo) as policy:
        policy.run(lambda: (threads.add(threading.get_ident()), observation())[1],
                   lambda row: threads.add(threading.get_ident()),
                   validate=lambda row: threads.add(threading.get_ident()) or True,
                   max_actions=12, progress=False)
    assert threads == {me}


# ------------------------------------------------------------------ async face

def test_async_policy_runs_with_async_callables(shared_module_gateway, echo):
    import asyncio

    rec = Recorder()

    async def main():
        async def observe():
            return observation()

        async def act(row):
            rec(row)

        async with sequence_ai.aconnect(echo, api_key=shared_module_gateway.api_key, gateway_url=shared_module_gateway.url,
                                        params={"chunk_len": 5}) as policy:
            return await policy.run(observe, act, max_actions=10, progress=False)

    out = asyncio.run(main())
    assert out.reason == "completed" and rec.row_indices == list(range(5)) * 2


def test_a_policy_connected_on_one_thread_runs_on_another(shared_module_gateway, echo):
    policy = connect(shared_module_gateway, echo)
    result = {}
    try:
        t = threading.Thread(target=lambda: result.update(out=policy.run(
            observation, Recorder(), max_actions=5, progress=False)))
        t.start()
        t.join(30)
    finally:
        policy.close()
    assert result["out"].reason == "completed"
