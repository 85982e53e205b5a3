"""The control loop's logic on virtual time: pacing, which chunk and row each action came from,
the open-loop horizon, seams, prefetch and lookahead, endings, instructions, interrupts and
warming.

The engine is the real one (AsyncPolicy, ControlLoop, ChunkBuffer, Pacer, LatencyEstimate,
Interrupt); the worker is ``EchoWire``, an in-process stand-in for ``_wire.Wire`` that answers
like test/policies/echo_policy.py (row t of request n is ``[n, t, 0, 0, 0, 0, 0, gripper]``, with
its ``chunk_len`` / ``horizon`` / ``latency_ms`` / ``fail`` parameters), and time is the virtual
clock of test/_vclock.py: every deadline is met exactly, a 4 s run takes milliseconds, and the
same test takes the same steps however loaded the machine is. So the figures here are exact
(no scheduling slack). test/client/test_core_loop.py keeps a real-gateway, real-worker proof of
each promise (pacing within a period, rows and chunks, one interrupt, warming).
"""
from __future__ import annotations

import asyncio

import pytest

import _vclock
from _core_support import InProcessWire, Recorder, observation
from sequence_ai_core import ActionChunk, AsyncPolicy, SequencesError, Unavailable

HZ = 15.0
PERIOD = 1 / HZ
EXACT = 1e-9       # virtual time: a deadline is met to the float's rounding

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")

ECHO_CONTRACT = {
    "action": {"robot": "panda", "action_space": "joint_absolute", "action_dim": 8, "control_frequency_hz": HZ,
               "bounds": [[-1e6, 1e6]] * 7 + [[0.0, 1.0]]},
    "observation": None,
}


class EchoWire(InProcessWire):
    """The echo policy in process: request n (counted from 1) answers after ``latency_ms`` of
    virtual time with ``chunk_len`` rows ``[n, t, 0 x5, 0.5]`` (``horizon`` > 0: that open-loop
    horizon). Until ``warm_at`` (loop seconds) every request is a 503 warming."""

    def __init__(self, warm_for_s: float = 0.0) -> None:
        super().__init__(ECHO_CONTRACT)
        self.warm_for_s = warm_for_s
        self.warm_at = None
        self.warming_answers = 0
        self.params_seen: list = []

    async def act(self, observation, *, params=None, episode_id=None, delay=None):
        loop = asyncio.get_running_loop()
        if self.warm_at is None:
            self.warm_at = loop.time() + self.warm_for_s
        if loop.time() < self.warm_at:
            self.warming_answers += 1
            raise Unavailable("echo is loading", warming=True, retry_after_s=1.0)
        self.params_seen.append(dict(params or {}))
        self._params = params or {}
        return await super().act(observation, params=params, episode_id=episode_id, delay=delay)

    def answer(self, i):
        params = self._params
        if params.get("fail"):
            raise RuntimeError(f"asked to fail with {params['fail']}")
        rows = int(params.get("chunk_len", 10))
        horizon = int(params.get("horizon", 0)) or None
        actions = [[float(i + 1), float(t), 0.0, 0.0, 0.0, 0.0, 0.0, 0.5] for t in range(rows)]
        chunk = ActionChunk(actions=actions, action_space="joint_absolute", robot="panda",
                            control_frequency_hz=HZ, open_loop_horizon=horizon)
        return float(params.get("latency_ms", 0.0)) / 1000.0, chunk


def echo_policy(wire=None, **params) -> AsyncPolicy:
    policy = AsyncPolicy("echo", api_key="k", gateway_url="http://127.0.0.1:9", validate="off", params=params)
    policy._wire = wire if wire is not None else EchoWire()
    policy._wire.session.params = dict(params)   # as the handshake hands a session's params back
    return policy


def drive(policy, body):
    """``body(loop)`` (a coroutine) on virtual time with ``policy`` timed on it."""
    async def main():
        return await body(asyncio.get_running_loop())

    return _vclock.drive(policy, main)


def run(rec, params=None, wire=None, at=(), **kw):
    """One run() of the echo policy on virtual time; ``at``: ``(seconds after start, fn(policy))``
    events scheduled on the loop. Returns (RunOutcome, policy)."""
    policy = echo_policy(wire, **(params or {}))

    async def body(loop):
        for delay_s, fn in at:
            loop.call_later(delay_s, fn, policy)
        return await policy.run(observation, rec, hold=rec.hold, progress=False, **kw)

    return drive(policy, body), policy


def recorder() -> Recorder:
    return Recorder(now=_vclock.now)


# ------------------------------------------------------------------ pacing

def test_actions_are_released_exactly_on_t0_plus_k_periods_without_drift():
    rec = recorder()
    out, _ = run(rec, {"chunk_len": 10, "horizon": 8, "latency_ms": 150}, max_actions=60)
    assert out.reason == "completed" and out.actions == 60 and out.underruns == 0 and out.late_ticks == 0
    t0 = rec.times[0]
    assert max(abs(t - (t0 + k * PERIOD)) for k, t in enumerate(rec.times)) < EXACT


def test_a_slow_act_resyncs_instead_of_bursting_and_counts_late_ticks():
    rec = recorder()
    policy = echo_policy(chunk_len=10)

    async def slow_act(row):
        rec(row)
        if len(rec.rows) == 3:
            await asyncio.sleep(3.5 * PERIOD)   # act() itself took 3.5 periods

    async def body(loop):
        return await policy.run(observation, slow_act, max_actions=6, progress=False)

    out = drive(policy, body)
    assert out.late_ticks == 1 and out.actions == 6
    gaps = [b - a for a, b in zip(rec.times, rec.times[1:])]
    # action 3 is released when act 2 returns (late), then the schedule continues from there
    assert gaps[:2] == pytest.approx([PERIOD] * 2)
    assert gaps[2] == pytest.approx(3.5 * PERIOD)
    assert gaps[3:] == pytest.approx([PERIOD] * 2)


# ------------------------------------------------------------------ horizon, chunks, seams

def test_open_loop_horizon_rows_are_played_then_the_next_chunk():
    rec = recorder()
    out, _ = run(rec, {"chunk_len": 10, "horizon": 4}, max_actions=20)
    assert out.chunks == 5
    assert rec.row_indices == [0, 1, 2, 3] * 5
    assert rec.chunk_ids == [n for n in range(1, 6) for _ in range(4)]


def test_whole_chunk_is_played_when_it_declares_no_horizon():
    rec = recorder()
    run(rec, {"chunk_len": 6}, max_actions=12)
    assert rec.row_indices == list(range(6)) * 2


def test_on_chunk_reports_each_chunk_and_its_first_action_index():
    seen = []
    run(recorder(), {"chunk_len": 10, "horizon": 5}, max_actions=15,
        on_chunk=lambda c, i: seen.append((i, len(c), c.action_space)))
    assert seen == [(0, 10, "joint_absolute"), (5, 10, "joint_absolute"), (10, 10, "joint_absolute")]


def test_max_seam_jump_is_reported_over_a_run():
    out, _ = run(recorder(), {"chunk_len": 10, "horizon": 8}, max_actions=24)
    # row index goes 7 -> 0 and the chunk counter +1 at each seam: the largest jump is 7
    assert out.max_seam_jump == pytest.approx(7.0)
    assert out.action_space == "joint_absolute"


def test_smooth_seam_blends_absolute_chunks_after_the_first():
    rec = recorder()
    out, _ = run(rec, {"chunk_len": 10, "horizon": 8}, max_actions=16, smooth_seam=3)
    assert rec.row_indices[:8] == list(range(8))  # first chunk untouched
    assert [r[1] for r in rec.rows[8:12]] == pytest.approx([7 + (j + 1) / 4 * (j - 7) for j in range(3)] + [3.0])
    assert out.max_seam_jump == pytest.approx(7.0)  # measured before blending


# ------------------------------------------------------------------ prefetch

def test_prefetch_gives_no_underruns_when_latency_is_below_the_horizon():
    rec = recorder()
    out, policy = run(rec, {"chunk_len": 10, "horizon": 8, "latency_ms": 150}, max_actions=40,
                      on_underrun=lambda: None)
    assert out.underruns == 0 and out.underrun_s == 0.0 and out.actions == 40
    assert policy._wire.max_in_flight == 1


def test_without_prefetch_the_loop_stalls_once_per_chunk_for_the_whole_turnaround():
    rec = recorder()
    stalls = []
    out, _ = run(rec, {"chunk_len": 10, "horizon": 5, "latency_ms": 100}, max_actions=20, prefetch=False,
                 on_underrun=lambda: stalls.append(_vclock.now()))
    assert out.chunks == 4
    assert out.underruns == 3 and len(stalls) == 3  # every chunk after the first
    # each stall is observed at the missed deadline and waits the 100 ms turnaround
    assert out.underrun_s == pytest.approx(3 * 0.1)
    seams = [rec.times[k] - rec.times[k - 1] for k in (5, 10, 15)]
    assert seams == pytest.approx([PERIOD + 0.1] * 3)


@pytest.mark.parametrize("lookahead", [1, 3])
def test_lookahead_caps_chunks_ahead_with_one_request_in_flight(lookahead):
    """With a refill budget far above the buffer (seeded: 2 s against 133 ms chunks) the loop
    wants every chunk it can get: exactly ``lookahead`` are held or requested ahead of the
    playing one, never more, and never two requests at once."""
    counts = {"requests": 0, "started": 0}
    ahead = []

    def observe():
        counts["requests"] += 1
        ahead.append(counts["requests"] - counts["started"])  # this request included
        return observation()

    def on_chunk(chunk, first):
        counts["started"] += 1

    policy = echo_policy(chunk_len=2, latency_ms=5)
    for _ in range(8):
        policy._latency.add(2.0)
    rec = recorder()

    async def body(loop):
        return await policy.run(observe, rec, on_chunk=on_chunk, max_actions=24, lookahead=lookahead,
                                progress=False)

    out = drive(policy, body)
    assert out.reason == "completed" and out.actions == 24
    assert policy._wire.max_in_flight == 1
    assert max(ahead) == lookahead, ahead
    assert rec.row_indices == [0, 1] * 12


def test_lookahead_holds_more_chunks_and_keeps_the_horizon():
    rec = recorder()
    out, _ = run(rec, {"chunk_len": 10, "horizon": 4, "latency_ms": 50}, max_actions=24, lookahead=2)
    assert out.reason == "completed" and out.underruns == 0, out
    assert out.chunks == 6
    assert rec.row_indices == [0, 1, 2, 3] * 6


# ------------------------------------------------------------------ endings

def test_completed_does_not_hold():
    rec = recorder()
    out, policy = run(rec, max_actions=5)
    assert (out.reason, out.actions, rec.holds) == ("completed", 5, 0)
    assert policy._wire.ended is not None   # the worker is told the episode ended


def test_max_actions_zero_completes_without_a_request():
    rec = recorder()
    out, policy = run(rec, max_actions=0)
    assert (out.reason, out.actions, out.chunks, rec.holds) == ("completed", 0, 0, 0)
    assert policy._wire.calls == 0


def test_validate_false_stops_before_acting_and_holds():
    rec = recorder()
    checked = []

    def validate(row):
        checked.append(row)
        return len(checked) < 5

    out, _ = run(rec, max_actions=50, validate=validate)
    assert out.reason == "validate" and out.actions == 4 and len(rec.rows) == 4
    assert rec.holds == 1


def test_until_stops_the_run_without_hold():
    rec = recorder()
    out, _ = run(rec, max_actions=50, until=lambda: len(rec.rows) >= 7)
    assert (out.reason, out.actions, rec.holds) == ("until", 7, 0)


def test_an_exception_in_act_holds_once_and_is_raised():
    rec = recorder()
    policy = echo_policy()

    def act(row):
        rec(row)
        if len(rec.rows) == 3:
            raise RuntimeError("motor fault")

    async def body(loop):
        return await policy.run(observation, act, hold=rec.hold, max_actions=50, progress=False)

    with pytest.raises(RuntimeError, match="motor fault"):
        drive(policy, body)
    assert rec.holds == 1 and len(rec.rows) == 3


def test_a_policy_error_holds_and_is_raised():
    rec = recorder()
    with pytest.raises(RuntimeError, match="asked to fail"):
        run(rec, {"fail": "RuntimeError"}, max_actions=5)
    assert rec.holds == 1 and rec.rows == []


def test_act_pins_the_instruction_and_times_out_after_max_seconds_of_motion():
    rec = recorder()
    seen = []

    def observe():
        obs = observation(instruction="something else")
        seen.append(obs)
        return obs

    policy = echo_policy(chunk_len=10, latency_ms=300)

    async def body(loop):
        t0 = loop.time()
        out = await policy.act("pick up the cube", observe, rec, hold=rec.hold, max_seconds=1.0, progress=False)
        return out, loop.time() - t0

    out, elapsed = drive(policy, body)
    assert policy.instruction is None  # the pin lasts for the call
    assert out.reason == "timeout" and rec.holds == 1
    assert out.actions == 15           # 1 s of motion at 15 Hz: actions at 0, 1/15 ... 14/15 s
    assert elapsed == pytest.approx(0.3 + 1.0)   # the first chunk's turnaround, then max_seconds
    assert seen and all(o.instruction == "something else" for o in seen)  # caller's object untouched


def test_act_requires_max_seconds():
    policy = echo_policy()
    with pytest.raises(TypeError):
        drive(policy, lambda loop: policy.act("go", observation, recorder()))  # type: ignore[call-arg]


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_act_refuses_a_time_bound_that_is_not_a_finite_positive_number(bad):
    rec = recorder()
    policy = echo_policy()
    with pytest.raises(ValueError, match="max_seconds"):
        drive(policy, lambda loop: policy.act("go", observation, rec, max_seconds=bad, progress=False))
    with pytest.raises(ValueError, match="max_seconds"):
        drive(policy, lambda loop: policy.run(observation, rec, max_actions=10, max_seconds=bad, progress=False))
    assert rec.rows == [] and policy._wire.calls == 0


def test_set_instruction_counts_swaps_and_the_lag_to_the_first_chunk_under_it():
    rec = recorder()
    policy = echo_policy(chunk_len=10, horizon=5)
    asked = {}

    async def body(loop):
        loop.call_later(0.4, lambda: (asked.setdefault("t", loop.time()),
                                      policy.set_instruction("now the blue one")))
        return await policy.act("pick up the red one", observation, rec, max_seconds=1.5, progress=False)

    out = drive(policy, body)
    assert out.instruction_swaps == 1
    # the first chunk observed after the swap plays at most lookahead + 1 = 2 chunks later
    assert 0 < out.max_instruction_lag_s <= 2 * (5 / 15)


# ------------------------------------------------------------------ interrupt

def test_interrupt_during_playback_holds_within_one_period_and_nothing_acts_after():
    rec = recorder()
    marks = {}

    def fire(policy):
        policy.interrupt()
        marks["t"] = _vclock.now()

    out, _ = run(rec, {"chunk_len": 10, "horizon": 8}, max_actions=500, at=[(0.6, fire)])
    assert out.reason == "interrupted" and rec.holds == 1
    assert all(t <= marks["t"] for t in rec.times)
    assert 0 <= rec.hold_times[0] - marks["t"] < PERIOD
    assert out.actions == 9   # the first chunk landed at once: actions at 0 ... 8/15 s, then 0.6 s


def test_interrupt_cuts_through_a_stalled_fetch():
    rec = recorder()
    underruns = []
    marks = {}

    def fire(policy):
        policy.interrupt()
        marks["t"] = _vclock.now()

    # first chunk at 1.5 s, plays 4 actions (0.27 s), then the buffer is dry until ~3 s
    out, policy = run(rec, {"chunk_len": 4, "latency_ms": 1500}, max_actions=500, at=[(2.3, fire)],
                      on_underrun=lambda: underruns.append(_vclock.now()))
    assert out.reason == "interrupted" and rec.holds == 1
    assert out.underruns == 1 and underruns and underruns[0] < marks["t"]
    assert out.actions == 4
    assert rec.hold_times[0] == pytest.approx(marks["t"])   # woken at once, not at the answer
    assert policy._wire.in_flight == 0                       # the stalled request was cancelled


def test_interrupt_during_warming_ends_before_any_action():
    rec = recorder()
    status = []
    marks = {}

    def fire(policy):
        policy.interrupt()
        marks["t"] = _vclock.now()

    wire = EchoWire(warm_for_s=60.0)
    out, _ = run(rec, wire=wire, max_actions=10, on_status=status.append, at=[(1.5, fire)])
    assert out.reason == "interrupted" and out.actions == 0 and rec.holds == 1
    assert status and "starting" in status[0]
    assert wire.warming_answers >= 2
    assert rec.hold_times[0] == pytest.approx(marks["t"])


def test_warming_is_waited_out_before_the_first_action():
    rec = recorder()
    waits = []
    wire = EchoWire(warm_for_s=2.0)
    policy = AsyncPolicy("echo", api_key="k", gateway_url="http://127.0.0.1:9", validate="off",
                         on_warming=lambda w, eta: waits.append((w, eta)))
    policy._wire = wire

    async def body(loop):
        t0 = loop.time()
        out = await policy.run(observation, rec, max_actions=5, progress=False)
        return out, rec.times[0] - t0

    out, first_after = drive(policy, body)
    assert out.reason == "completed" and out.actions == 5 and out.underruns == 0
    assert waits and waits[0][1] == 1.0
    assert 2.0 <= first_after <= 2.0 + 1.0   # retried each retry_after_s (1 s) until it was warm


def test_startup_timeout_zero_raises_warming_at_once():
    rec = recorder()
    with pytest.raises(Unavailable) as info:
        run(rec, wire=EchoWire(warm_for_s=60.0), max_actions=5, startup_timeout_s=0)
    assert info.value.warming and info.value.retry_after_s is not None
    assert rec.holds == 1


def test_interrupt_between_runs_does_not_reach_the_next_run():
    rec = recorder()
    policy = echo_policy()

    async def body(loop):
        policy.interrupt()  # between runs: must not cancel the next one
        return await policy.run(observation, rec, max_actions=3, progress=False)

    assert drive(policy, body).reason == "completed"


def test_async_callables_are_awaited():
    rec = recorder()
    policy = echo_policy(chunk_len=5)

    async def observe():
        return observation()

    async def act(row):
        await asyncio.sleep(0)
        rec(row)

    async def body(loop):
        return await policy.run(observe, act, max_actions=10, progress=False)

    out = drive(policy, body)
    assert out.reason == "completed" and rec.row_indices == list(range(5)) * 2


def test_an_empty_chunk_is_a_typed_error():
    class Empty(EchoWire):
        def answer(self, i):
            return 0.0, ActionChunk(actions=[], action_space="joint_absolute", robot="panda",
                                    control_frequency_hz=HZ)

    rec = recorder()
    with pytest.raises(SequencesError) as info:
        run(rec, wire=Empty(), max_actions=5)
    assert info.value.code == "empty_chunk" and rec.holds == 1
