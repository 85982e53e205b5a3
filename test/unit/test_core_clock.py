"""The engine's clock seam (``sequence_ai_core/_clock.py``) and the tests' virtual time
(test/_vclock.py).

Production reads ``time.monotonic`` itself and waits on the timerfd (test_core_interrupt.py checks
that wait on real time); a ``LoopClock`` reads the event loop's ``time()`` and waits on its timers,
which a ``VirtualTimeLoop`` jumps to as soon as every task is waiting.
"""
from __future__ import annotations

import asyncio
import math
import time

import pytest

import _vclock
from sequence_ai_core import AsyncPolicy
from sequence_ai_core._clock import MONOTONIC, Clock, LoopClock
from sequence_ai_core._interrupt import Interrupt


def test_production_reads_time_monotonic_itself_and_waits_on_the_timerfd():
    policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
    assert policy._clock is MONOTONIC and policy._interrupt.clock is MONOTONIC
    assert MONOTONIC.now is time.monotonic   # the very call the loop made before the seam
    assert MONOTONIC.on_loop is False and Interrupt().clock is MONOTONIC


def test_a_clock_that_is_not_one_is_a_type_error():
    policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
    with pytest.raises(TypeError, match="Clock"):
        policy._use_clock(time.monotonic)
    with pytest.raises(TypeError, match="event loop"):
        LoopClock("not a loop")
    assert policy._clock is MONOTONIC


def test_use_clock_times_the_policy_and_its_wait_point_on_the_loop():
    loop = _vclock.VirtualTimeLoop(start_s=50.0)
    try:
        clock = LoopClock(loop)
        policy = AsyncPolicy("scripted", api_key="k", gateway_url="http://127.0.0.1:9", validate="off")
        policy._use_clock(clock)
        assert policy._clock is clock and policy._interrupt.clock is clock
        assert isinstance(clock, Clock) and clock.on_loop and clock.now() == 50.0
    finally:
        loop.close()


def test_a_timed_wait_on_virtual_time_wakes_exactly_at_its_deadline_in_deadline_order():
    woke = []

    async def sleeper(it, deadline, name):
        it.bind()
        await it.sleep_until(deadline)
        woke.append((name, _vclock.now()))

    async def main():
        loop = asyncio.get_running_loop()
        clock = LoopClock(loop)
        t0 = loop.time()
        a, b = Interrupt(clock), Interrupt(clock)
        await asyncio.gather(sleeper(a, t0 + 3600.0, "hour"), sleeper(b, t0 + 0.25, "quarter"))
        return t0

    t0 = _vclock.run(main)
    assert woke == [("quarter", t0 + 0.25), ("hour", t0 + 3600.0)]


def test_poke_and_stop_end_a_virtual_wait_early():
    async def main():
        loop = asyncio.get_running_loop()
        it = Interrupt(LoopClock(loop))
        token = it.bind()
        t0 = loop.time()
        loop.call_later(2.0, it.poke)
        await it.sleep_until(t0 + 10.0)
        poked_at = loop.time() - t0
        loop.call_later(1.0, token.stop)
        await it.sleep_until(math.inf)
        stopped_at = loop.time() - t0
        assert it.is_set
        await it.sleep_until(t0 + 100.0)   # a stopped token returns at once
        return poked_at, stopped_at, loop.time() - t0

    assert _vclock.run(main) == (2.0, 3.0, 3.0)


def test_the_virtual_loop_only_moves_forward_and_names_a_deadlock(monkeypatch):
    loop = _vclock.VirtualTimeLoop()
    with pytest.raises(ValueError, match="forward"):
        loop.advance(-1.0)
    loop.close()
    monkeypatch.setattr(_vclock, "STUCK_S", 0.05)

    async def forever():
        await asyncio.get_running_loop().create_future()   # nothing will ever resolve it

    with pytest.raises(RuntimeError, match="no timer"):
        _vclock.run(forever)


def test_the_virtual_loop_names_tasks_that_spin_without_ever_waiting_for_time(monkeypatch):
    monkeypatch.setattr(_vclock, "SPIN_LIMIT", 1000)

    async def spin():
        while True:
            await asyncio.sleep(0)   # busy forever at one instant: time can never move

    with pytest.raises(RuntimeError, match="livelock"):
        _vclock.run(spin)

    async def paced():
        for _ in range(5000):       # as many iterations, each waiting for time: fine
            await asyncio.sleep(0.001)
        return _vclock.now()

    assert _vclock.run(paced) == pytest.approx(_vclock.START_S + 5.0)
