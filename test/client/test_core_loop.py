"""The control loop against the real gateway and worker on loopback (echo policy).

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
def echo(module_gateway):
    name = unique("echo-loop")
    module_gateway.deploy(ECHO, name, wait=True)
    return name


def run(gateway, echo, rec, params=None, **kw):
    with connect(gateway, echo, params=params or {}) as policy:
        return policy.run(observation, rec, hold=rec.hold, progress=False, **kw)


# ------------------------------------------------------------------ pacing

def test_actions_are_paced_at_the_control_frequency_without_drift(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 8}, max_actions=60)
    assert out.reason == "completed" and out.actions == 60 and out.underruns == 0
    periods = [b - a for a, b in zip(rec.times, rec.times[1:])]
    assert abs(statistics.median(periods) - PERIOD) < 0.003
    # no drift: every action sits on t0 + k/f (not an accumulation of sleeps)
    t0 = rec.times[0]
    offsets = [t - (t0 + k * PERIOD) for k, t in enumerate(rec.times)]
    assert statistics.median(abs(o) for o in offsets) < 0.005
    assert abs(offsets[-1]) < PERIOD / 2


# ------------------------------------------------------------------ horizon

def test_open_loop_horizon_rows_are_played_then_the_next_chunk(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 4}, max_actions=20)
    assert out.chunks == 5
    assert rec.row_indices == [0, 1, 2, 3] * 5
    ids = rec.chunk_ids
    assert all(len(set(ids[i:i + 4])) == 1 for i in range(0, 20, 4))
    assert len(set(ids)) == 5


def test_whole_chunk_is_played_when_it_declares_no_horizon(module_gateway, echo):
    rec = Recorder()
    run(module_gateway, echo, rec, params={"chunk_len": 6}, max_actions=12)
    assert rec.row_indices == list(range(6)) * 2


def test_on_chunk_reports_each_chunk_and_its_first_action_index(module_gateway, echo):
    seen = []
    rec = Recorder()
    run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 5}, max_actions=15,
        on_chunk=lambda c, i: seen.append((i, len(c), c.action_space)))
    assert seen == [(0, 10, "joint_absolute"), (5, 10, "joint_absolute"), (10, 10, "joint_absolute")]


def test_max_seam_jump_is_reported_over_a_run(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 8}, max_actions=24)
    # row index goes 7 -> 0 and the chunk counter +1 at each seam: the largest jump is 7
    assert out.max_seam_jump == pytest.approx(7.0)
    assert out.action_space == "joint_absolute"


def test_smooth_seam_blends_absolute_chunks_after_the_first(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 8}, max_actions=16, smooth_seam=3)
    assert rec.row_indices[:8] == list(range(8))  # first chunk untouched
    assert [r[1] for r in rec.rows[8:12]] == pytest.approx([7 + (j + 1) / 4 * (j - 7) for j in range(3)] + [3.0])
    assert out.max_seam_jump == pytest.approx(7.0)  # measured before blending


# ------------------------------------------------------------------ prefetch

def test_prefetch_gives_no_underruns_when_latency_is_below_the_horizon(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 8, "latency_ms": 150},
              max_actions=40, on_underrun=lambda: None)
    assert out.underruns == 0 and out.underrun_s == 0.0 and out.actions == 40


def test_without_prefetch_the_loop_stalls_once_per_chunk(module_gateway, echo):
    rec = Recorder()
    stalls = []
    out = run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 5, "latency_ms": 100},
              max_actions=20, prefetch=False, on_underrun=lambda: stalls.append(time.monotonic()))
    assert out.chunks == 4
    assert out.underruns == 3 and len(stalls) == 3  # every chunk after the first
    assert out.underrun_s >= 3 * 0.1


# ------------------------------------------------------------------ endings

def test_completed_does_not_hold(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, max_actions=5)
    assert (out.reason, out.actions, rec.holds) == ("completed", 5, 0)


def test_validate_false_stops_before_acting_and_holds(module_gateway, echo):
    rec = Recorder()
    checked = []

    def validate(row):
        checked.append(row)
        return len(checked) < 5

    out = run(module_gateway, echo, rec, max_actions=50, validate=validate)
    assert out.reason == "validate" and out.actions == 4 and len(rec.rows) == 4
    assert rec.holds == 1


def test_until_stops_the_run_without_hold(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, max_actions=50, until=lambda: len(rec.rows) >= 7)
    assert (out.reason, out.actions, rec.holds) == ("until", 7, 0)


def test_an_exception_in_act_holds_once_and_is_raised(module_gateway, echo):
    rec = Recorder()

    def act(row):
        rec(row)
        if len(rec.rows) == 3:
            raise RuntimeError("motor fault")

    with connect(module_gateway, echo) as policy:
        with pytest.raises(RuntimeError, match="motor fault"):
            policy.run(observation, act, hold=rec.hold, max_actions=50, progress=False)
    assert rec.holds == 1


def test_act_pins_the_instruction_and_times_out(module_gateway, echo):
    rec = Recorder()
    seen = []

    def observe():
        obs = observation(instruction="something else")
        seen.append(obs)
        return obs

    with connect(module_gateway, echo, params={"chunk_len": 10}) as policy:
        t0 = time.monotonic()
        out = policy.act("pick up the cube", observe, rec, hold=rec.hold, max_seconds=1.0, progress=False)
        elapsed = time.monotonic() - t0
        assert policy.instruction is None  # the pin lasts for the call
    assert out.reason == "timeout" and rec.holds == 1
    assert 14 <= out.actions <= 16
    assert elapsed < 1.0 + 1.0  # startup + max_seconds of motion
    assert seen and all(o.instruction == "something else" for o in seen)  # caller's object untouched


def test_act_requires_max_seconds(module_gateway, echo):
    with connect(module_gateway, echo) as policy:
        with pytest.raises(TypeError):
            policy.act("go", observation, Recorder())  # type: ignore[call-arg]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_act_refuses_a_time_bound_that_is_not_a_finite_positive_number(module_gateway, echo, bad):
    rec = Recorder()
    with connect(module_gateway, echo) as policy:
        with pytest.raises(ValueError, match="max_seconds"):
            policy.act("go", observation, rec, max_seconds=bad, progress=False)
        with pytest.raises(ValueError, match="max_seconds"):
            policy.run(observation, rec, max_actions=10, max_seconds=bad, progress=False)
    assert rec.rows == []


def test_set_instruction_counts_swaps_and_lag(module_gateway, echo):
    rec = Recorder()
    with connect(module_gateway, echo, params={"chunk_len": 10, "horizon": 5}) as policy:
        after(0.4, lambda: policy.set_instruction("now the blue one"))
        out = policy.act("pick up the red one", observation, rec, max_seconds=1.5, progress=False)
    assert out.instruction_swaps == 1
    assert 0 < out.max_instruction_lag_s < 2 * (5 / 15) + 0.3


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


def test_interrupt_during_playback(module_gateway, echo):
    rec = Recorder()
    with connect(module_gateway, echo, params={"chunk_len": 10, "horizon": 8}) as policy:
        marks = _interrupt_and_measure(policy, rec, 0.6)
        out = policy.run(observation, rec, hold=rec.hold, max_actions=500, progress=False)
        end = time.monotonic()
    assert out.reason == "interrupted" and rec.holds == 1
    assert all(t <= marks["returned"] for t in rec.times)  # no act after interrupt() returned
    assert rec.hold_times[0] - marks["returned"] < PERIOD + SLACK
    assert end - marks["returned"] < PERIOD + SLACK
    assert 0 < out.actions < 500


def test_interrupt_cuts_through_a_stalled_fetch(module_gateway, echo):
    rec = Recorder()
    underruns = []
    with connect(module_gateway, echo, params={"chunk_len": 4, "latency_ms": 1500}) as policy:
        # first chunk at ~1.5 s, plays 4 actions (0.27 s), then the buffer is dry until ~3 s
        marks = _interrupt_and_measure(policy, rec, 2.3)
        out = policy.run(observation, rec, hold=rec.hold, max_actions=500, progress=False,
                         on_underrun=lambda: underruns.append(time.monotonic()))
        end = time.monotonic()
    assert out.reason == "interrupted" and rec.holds == 1
    assert out.underruns == 1 and underruns and underruns[0] < marks["returned"]
    assert out.actions == 4
    assert end - marks["returned"] < PERIOD + SLACK


def test_interrupt_during_warming(module_gateway, tmp_path):
    name = unique("echo-cold")
    module_gateway.deploy(slow_loading_copy(tmp_path, 60), name, wait=False)
    rec = Recorder()
    status = []
    with connect(module_gateway, name) as policy:
        assert policy.ready()[0] is False
        marks = _interrupt_and_measure(policy, rec, 1.5)
        out = policy.run(observation, rec, hold=rec.hold, max_actions=10, progress=False,
                         on_status=status.append)
        end = time.monotonic()
    assert out.reason == "interrupted" and out.actions == 0 and rec.holds == 1
    assert status and "starting" in status[0]
    assert end - marks["returned"] < PERIOD + SLACK


def test_interrupt_flag_clears_when_the_next_run_starts(module_gateway, echo):
    rec = Recorder()
    with connect(module_gateway, echo) as policy:
        policy.interrupt()  # between runs: must not cancel the next one
        out = policy.run(observation, rec, max_actions=3, progress=False)
    assert out.reason == "completed"


def test_startup_timeout_zero_raises_warming_at_once(module_gateway, tmp_path):
    name = unique("echo-cold0")
    module_gateway.deploy(slow_loading_copy(tmp_path, 60), name, wait=False)
    rec = Recorder()
    with connect(module_gateway, name) as policy:
        with pytest.raises(sequence_ai.Unavailable) as info:
            policy.run(observation, rec, hold=rec.hold, max_actions=5, startup_timeout_s=0, progress=False)
    assert info.value.warming and info.value.retry_after_s is not None
    assert rec.holds == 1


def test_warming_is_waited_out_before_the_first_action(module_gateway, tmp_path):
    name = unique("echo-warm")
    module_gateway.deploy(slow_loading_copy(tmp_path, 2), name, wait=False)
    rec = Recorder()
    waits = []
    with connect(module_gateway, name, on_warming=lambda w, eta: waits.append((w, eta))) as policy:
        out = policy.run(observation, rec, max_actions=5, progress=False)
    assert out.reason == "completed" and out.actions == 5
    assert waits and waits[0][1] is not None


# ------------------------------------------------------------------ one driver

def test_a_second_thread_driving_the_same_policy_raises(module_gateway, echo):
    errors = []
    with connect(module_gateway, echo) as policy:
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


def test_callbacks_run_on_the_thread_that_called_run(module_gateway, echo):
    threads = set()
    me = threading.get_ident()
    with connect(module_gateway, echo) as policy:
        policy.run(lambda: (threads.add(threading.get_ident()), observation())[1],
                   lambda row: threads.add(threading.get_ident()),
                   validate=lambda row: threads.add(threading.get_ident()) or True,
                   max_actions=12, progress=False)
    assert threads == {me}


# ------------------------------------------------------------------ async face

def test_async_policy_runs_with_async_callables(module_gateway, echo):
    import asyncio

    rec = Recorder()

    async def main():
        async def observe():
            return observation()

        async def act(row):
            rec(row)

        async with sequence_ai.aconnect(echo, api_key=module_gateway.api_key, gateway_url=module_gateway.url,
                                        params={"chunk_len": 5}) as policy:
            return await policy.run(observe, act, max_actions=10, progress=False)

    out = asyncio.run(main())
    assert out.reason == "completed" and rec.row_indices == list(range(5)) * 2


def test_lookahead_holds_more_chunks_and_keeps_the_horizon(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, params={"chunk_len": 10, "horizon": 4, "latency_ms": 50},
              max_actions=24, lookahead=2)
    # 50 ms refills against 267 ms of buffered rows: at most a scheduling hiccup on a loaded machine
    # (underrun figures vs latency are the benchmark's job, bench/bench_client.py)
    assert out.reason == "completed" and out.underruns <= 1, out
    assert out.chunks == 6
    assert rec.row_indices == [0, 1, 2, 3] * 6


@pytest.mark.parametrize("lookahead", [1, 3])
def test_lookahead_caps_chunks_ahead_with_one_request_in_flight(module_gateway, echo, lookahead):
    """With a refill budget far above the buffer (seeded: 2 s against 133 ms chunks) the loop
    wants every chunk it can get: exactly ``lookahead`` are held or requested ahead of the
    playing one, never more, and never two requests at once."""
    counts = {"requests": 0, "started": 0, "in_flight": 0, "max_in_flight": 0}
    ahead = []

    def observe():
        counts["requests"] += 1
        ahead.append(counts["requests"] - counts["started"])  # this request included
        return observation()

    def on_chunk(chunk, first):
        counts["started"] += 1

    with connect(module_gateway, echo, params={"chunk_len": 2, "latency_ms": 5}) as policy:
        wire = policy._engine._wire
        act = wire.act

        async def counted(*args, **kwargs):  # the real request, counted
            counts["in_flight"] += 1
            counts["max_in_flight"] = max(counts["max_in_flight"], counts["in_flight"])
            try:
                return await act(*args, **kwargs)
            finally:
                counts["in_flight"] -= 1

        wire.act = counted
        for _ in range(8):
            policy._engine._latency.add(2.0)
        rec = Recorder()
        out = policy.run(observe, rec, on_chunk=on_chunk, max_actions=24, lookahead=lookahead, progress=False)
    assert out.reason == "completed" and out.actions == 24
    assert counts["max_in_flight"] == 1
    assert max(ahead) == lookahead, ahead
    assert rec.row_indices == [0, 1] * 12


def test_a_policy_connected_on_one_thread_runs_on_another(module_gateway, echo):
    policy = connect(module_gateway, echo)
    result = {}
    try:
        t = threading.Thread(target=lambda: result.update(out=policy.run(
            observation, Recorder(), max_actions=5, progress=False)))
        t.start()
        t.join(30)
    finally:
        policy.close()
    assert result["out"].reason == "completed"


def test_max_actions_zero_completes_without_a_request(module_gateway, echo):
    rec = Recorder()
    out = run(module_gateway, echo, rec, max_actions=0)
    assert (out.reason, out.actions, out.chunks, rec.holds) == ("completed", 0, 0, 0)
