"""The engine's clock: where the control loop reads the time and how its timed waits wake.

Everything the loop times (action deadlines, the prefetch trigger, turnarounds, ``max_seconds``,
camera ages, instruction lag, the warming wait) reads one clock, ``AsyncPolicy._clock``:

- ``MONOTONIC`` (the default, and the only one production uses): ``time.monotonic()`` seconds;
  ``Interrupt.sleep_until`` wakes on a timerfd armed on CLOCK_MONOTONIC (``_interrupt.py``).
  Reading it is the same call the loop made before this seam existed.
- ``LoopClock(loop)``: the event loop's own clock, ``loop.time()`` seconds; timed waits are that
  loop's timers (``loop.call_at``). Under an ordinary event loop this is the monotonic clock
  woken about a millisecond late; under a virtual-time event loop (the tests' ``test/_vclock.py``:
  when every task waits on a timer, time jumps to the earliest one) a 5 s run at 15 Hz takes
  milliseconds of wall time and the same steps every time.

A clock is chosen per policy before a run (``AsyncPolicy._use_clock``), never during one.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

__all__ = ["Clock", "MONOTONIC", "LoopClock"]


class Clock:
    """Seconds on a monotonic scale (``now()``) and whether timed waits are the event loop's timers.

    ``on_loop`` False: waits are the precise timerfd wait of ``_interrupt.Interrupt`` on
    ``time.monotonic()``. True: waits are ``loop.call_at(deadline)`` of the loop whose ``time()``
    this clock reads.
    """

    on_loop = False
    now: Callable[[], float] = staticmethod(time.monotonic)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


MONOTONIC = Clock()
"""The real clock: ``time.monotonic()`` and timerfd waits (the default of every policy)."""


class LoopClock(Clock):
    """The clock of one event loop: ``now()`` is ``loop.time()`` (s); waits are its timers.

    Args:
        loop: the event loop the runs will be driven on (its ``time()`` may be virtual).

    Raises:
        TypeError: ``loop`` is not an asyncio event loop.
    """

    on_loop = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        if not isinstance(loop, asyncio.AbstractEventLoop):
            raise TypeError(f"LoopClock needs an asyncio event loop, not {type(loop).__name__}")
        self.loop = loop
        self.now = loop.time  # type: ignore[assignment]  # read from any thread: a float

    def __repr__(self) -> str:
        return f"LoopClock({type(self.loop).__name__})"
