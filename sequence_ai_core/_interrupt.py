"""Interrupt: a thread-safe stop flag, and the one place the control loop sleeps.

The loop never calls ``asyncio.sleep`` directly. It waits in ``Interrupt.sleep_until()``, which
returns at the deadline *or* as soon as something pokes it: ``set()`` from any thread (the
interrupt itself) or ``poke()`` from inside the loop (a fetch finished). That single wait point
is why an interrupt stops the loop within one control period whether it is waiting for the next
tick, blocked on a stalled fetch, or waiting out a warming worker.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Optional

__all__ = ["Interrupt"]

FINE_WAIT_S = 0.0015
"""The last stretch of a timed wait is a blocking ``time.sleep`` (s). asyncio's epoll timeout is
rounded to whole milliseconds, so a ``call_later`` wakes up to ~1 ms late (a median 1.3 ms at
100 Hz measured by bench/bench_publish_jitter.py's author); the loop wakes this much early and
sleeps the rest with the OS's nanosecond timer. It blocks the event loop for at most this long."""


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class Interrupt:
    """Stop flag shared between the driving loop and any other thread."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiter: Optional[asyncio.Future] = None
        self._poked = False

    def bind(self) -> None:
        """Called by the loop at the start of a run, inside its event loop: clears the flag."""
        self._loop = asyncio.get_running_loop()
        self._flag.clear()
        self._poked = False

    def unbind(self) -> None:
        self._loop = None

    @property
    def is_set(self) -> bool:
        return self._flag.is_set()

    def set(self) -> None:
        """Raise the flag and wake the loop. Safe from any thread, and from inside the loop."""
        self._flag.set()
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self.poke)
            except RuntimeError:  # the loop has closed: nothing to wake
                pass

    def poke(self) -> None:
        """Wake a pending ``sleep_until`` (loop thread only): something changed, look again."""
        self._poked = True
        if self._waiter is not None:
            _wake(self._waiter)

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``time.monotonic()`` reaches ``deadline`` (``math.inf``: until poked).

        Returns early, without error, when poked or interrupted; the caller re-checks its state.
        The event loop runs until ``FINE_WAIT_S`` before the deadline; the rest is a blocking sleep.
        """
        if self._poked or self._flag.is_set():
            self._poked = False
            return
        delay = deadline - time.monotonic()
        if delay <= 0:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        coarse = delay - FINE_WAIT_S
        handle = None
        if math.isinf(delay):
            pass
        elif coarse > 0:
            handle = loop.call_later(coarse, _wake, fut)
        else:
            _wake(fut)
        self._waiter = fut
        try:
            await fut
        finally:
            self._waiter = None
            woken = self._poked or self._flag.is_set()
            self._poked = False
            if handle is not None:
                handle.cancel()
        if not woken and not math.isinf(deadline):
            rest = deadline - time.monotonic()
            if 0 < rest <= FINE_WAIT_S:
                time.sleep(rest)
