"""Virtual time for the engine's tests: an asyncio event loop whose clock jumps when it is idle.

``VirtualTimeLoop`` is an ordinary selector event loop except for two things: ``time()`` is a
number it keeps itself, and when no callback is ready, no descriptor is readable and the next
timer is ``t`` seconds away, it moves its clock forward by ``t`` at once instead of waiting.
Everything that waits on the loop's clock (``asyncio.sleep``, ``call_at``, and the engine's
timed waits under a ``LoopClock``: ``sequence_ai_core/_clock.py``) therefore wakes exactly on its
deadline, in deadline order, and a 5 s run at 15 Hz takes a few milliseconds. The order of
events depends only on the program, never on the machine's load: the same test takes the same
steps every time.

Only what runs on the loop is virtual. A thread's ``time.sleep`` or ``threading.Timer`` is real
time: in a virtual test, schedule events on the loop (``loop.call_at``) instead.

``drive(policy, main)`` runs ``main()`` (a coroutine function) on a fresh virtual loop with the
policy's engine on that loop's clock; ``run(main)`` does the same without a policy.
"""
from __future__ import annotations

import asyncio
import selectors
from typing import Any, Awaitable, Callable, Optional, TypeVar

from sequence_ai_core._clock import LoopClock

T = TypeVar("T")

#: Virtual seconds at which a loop's clock starts (any number: the engine only takes differences).
START_S = 1000.0
#: Real seconds the loop may sit with nothing ready and no timer before it calls it a deadlock.
STUCK_S = 30.0
#: Loop iterations at one virtual instant before the loop calls it a livelock (tasks that keep
#: each other busy without ever waiting for time: on a real clock they would spin the CPU).
SPIN_LIMIT = 100_000


class _JumpSelector(selectors.DefaultSelector):
    """The loop's selector: polls without waiting; an idle wait for a timer moves the clock instead."""

    def __init__(self, loop: "VirtualTimeLoop") -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: Optional[float] = None):
        events = super().select(0)
        if events or timeout == 0:
            self._vloop.spin()
            return events
        if timeout is None:  # no timer at all: only another thread can wake the loop now
            events = super().select(STUCK_S)
            if not events:
                raise RuntimeError(f"virtual-time loop idle for {STUCK_S:g} s of real time with no timer: "
                                   "every task waits on something that never comes")
            return events
        self._vloop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (s): idle waits for a timer cost no wall time.

    Args:
        start_s: the clock's first reading (s).
    """

    def __init__(self, start_s: float = START_S) -> None:
        self._virtual_s = float(start_s)
        self._spins = 0
        super().__init__(selector=_JumpSelector(self))

    def time(self) -> float:
        return self._virtual_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (>= 0)."""
        if seconds < 0:
            raise ValueError(f"virtual time only moves forward, not by {seconds!r} s")
        self._virtual_s += seconds
        self._spins = 0

    def spin(self) -> None:
        """Count one loop iteration that did not wait for time; RuntimeError past ``SPIN_LIMIT``."""
        self._spins += 1
        if self._spins > SPIN_LIMIT:
            raise RuntimeError(f"virtual time stuck at {self._virtual_s:.6f} s: {SPIN_LIMIT} loop iterations "
                               "without waiting for a timer (tasks that keep each other busy: a livelock)")


def now() -> float:
    """The running loop's clock (s): virtual under a ``VirtualTimeLoop`` (call on the loop's thread)."""
    return asyncio.get_running_loop().time()


def run(main: Callable[[], Awaitable[T]], loop: Optional[VirtualTimeLoop] = None) -> T:
    """``main()`` to completion on a virtual-time loop (a fresh one unless given); the loop is
    closed afterwards, tasks still pending cancelled first (as ``asyncio.run`` does)."""
    loop = loop if loop is not None else VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main())
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def drive(policy: Any, main: Callable[[], Awaitable[T]]) -> T:
    """``run(main)`` with ``policy`` (an AsyncPolicy) timed on the virtual loop's clock."""
    loop = VirtualTimeLoop()
    policy._use_clock(LoopClock(loop))
    return run(main, loop)
