"""StopToken: one run's stop request; Operator: the human who outranks it; Interrupt: the one
place the control loop sleeps.

A ``StopToken`` belongs to one run. It is made before the run starts (by the caller, who hands
it to ``run(stop=...)`` / ``act(stop=...)``, or by ``run()`` itself on entry), can be stopped
from any thread at any time, and is never cleared: a stop that arrives before the run's first
chunk stops that run before any action, and a stop meant for one run cannot reach the next,
which has a token of its own.

The loop never calls ``asyncio.sleep`` directly. It waits in ``Interrupt.sleep_until()``, which
returns at the deadline *or* as soon as something pokes it: the bound run's token stopped from
any thread, or ``poke()`` from inside the loop (a fetch finished). That single wait point is why
a stop ends the loop within one control period whether it is waiting for the next tick, blocked
on a stalled fetch, or waiting out a warming worker.

How a timed wait wakes on time without blocking the event loop:

- asyncio's own timers (``call_later``) wake up to ~1 ms late: the selector's timeout is rounded
  up to whole milliseconds (a median 1.3 ms at 100 Hz, bench/bench_publish_jitter.py). On Linux
  each ``Interrupt`` therefore owns a ``timerfd`` armed at the deadline on CLOCK_MONOTONIC (the
  clock of ``time.monotonic()``) and registered with ``loop.add_reader``: the kernel makes it
  readable at the deadline with nanosecond resolution, which ends the selector's wait at once.
  The event loop keeps serving every other task (the other robots of the process, their
  requests and answers) right up to the deadline; nothing blocks.
- Elsewhere (no timerfd, or a loop without ``add_reader``) the wait falls back to ``call_later``
  up to ``FINE_WAIT_S`` before the deadline and a blocking ``time.sleep`` for the rest, and only
  while no other ``Interrupt`` of the same event loop is in a timed wait: a blocking sleep holds
  up every other task of the loop, and with many robots in one process those sleeps add up to a
  large share of the loop's time (16 robots at 15 Hz: ~36 %) and delay every other robot's
  request start and answer. With company the fallback wakes on ``call_later`` alone (up to ~1 ms
  late).
"""
from __future__ import annotations

import asyncio
import ctypes
import math
import os
import threading
import time
import weakref
from typing import Callable, Dict, Optional

from ._clock import MONOTONIC, Clock

__all__ = ["Interrupt", "StopToken", "Operator", "FINE_WAIT_S", "precise_timer_available"]

FINE_WAIT_S = 0.0015
"""Fallback only (no timerfd): the last stretch of a timed wait is a blocking ``time.sleep`` (s),
when no other ``Interrupt`` of the loop is in a timed wait. It blocks the event loop for at most
this long."""

_CLOCK_MONOTONIC = 1      # <time.h>
_TFD_TIMER_ABSTIME = 1    # <sys/timerfd.h>


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _timerfd_api() -> Optional[Dict[str, Callable]]:
    """``create() -> fd`` and ``arm(fd, ns)`` (absolute CLOCK_MONOTONIC ns) for a non-blocking
    timerfd, or None where there is none. ``os.timerfd_*`` (Python >= 3.13) when present, else
    the C library's through ctypes (Linux, glibc or musl); and only where ``time.monotonic()`` is
    CLOCK_MONOTONIC, so that a deadline on it is a deadline for the kernel timer."""
    try:
        if "CLOCK_MONOTONIC" not in time.get_clock_info("monotonic").implementation:
            return None
    except Exception:  # noqa: BLE001 - an unknown platform: no precise timer
        return None
    if hasattr(os, "timerfd_create"):
        flags = os.TFD_NONBLOCK | os.TFD_CLOEXEC

        def create() -> int:
            return os.timerfd_create(time.CLOCK_MONOTONIC, flags=flags)

        def arm(fd: int, ns: int) -> None:
            os.timerfd_settime_ns(fd, flags=os.TFD_TIMER_ABSTIME, initial=ns)

        return {"create": create, "arm": arm}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        c_create, c_settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    c_create.argtypes, c_create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    c_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
    c_settime.restype = ctypes.c_int
    nonblock_cloexec = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK / TFD_CLOEXEC have these values

    def create() -> int:
        fd = c_create(_CLOCK_MONOTONIC, nonblock_cloexec)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_create: {os.strerror(err)}")
        return fd

    def arm(fd: int, ns: int) -> None:
        spec = _Itimerspec()
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        if c_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    try:  # one real round: a platform whose libc lacks a working timerfd falls back here
        os.close(create())
    except OSError:
        return None
    return {"create": create, "arm": arm}


_TIMERFD = _timerfd_api()


def precise_timer_available() -> bool:
    """True where timed waits wake on a timerfd (Linux): on time, the event loop never blocked."""
    return _TIMERFD is not None


# Fallback bookkeeping: how many Interrupts are in a timed wait on each event loop (our own
# count; asyncio has no public view of what else is scheduled on a loop).
_timed_waits: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, int]" = weakref.WeakKeyDictionary()


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class _DeadlineTimer:
    """One timerfd, armed per wait and watched by the running loop only during that wait.

    ``wait(loop, deadline_s, fut)`` arms it at ``deadline_s`` (``time.monotonic()`` seconds)
    and resolves ``fut`` when it fires; the returned callable stops watching. ``close()`` frees
    the descriptor (also done when the object is collected). Raises OSError when the kernel
    refuses a timer, NotImplementedError when the loop cannot watch a descriptor.
    """

    def __init__(self) -> None:
        self._fd = _TIMERFD["create"]()
        self._finalizer = weakref.finalize(self, os.close, self._fd)
        self.pid = os.getpid()  # a forked child shares the kernel timer: it makes its own
        self.busy = False  # a wait is watching it (a second, concurrent wait uses the fallback)

    def wait(self, loop: asyncio.AbstractEventLoop, deadline_s: float,
             fut: "asyncio.Future[None]") -> Callable[[], None]:
        fd = self._fd
        # rounded up, plus 1 ns for the float product's rounding: the timer never fires before
        # the deadline the caller compares time.monotonic() against
        _TIMERFD["arm"](fd, max(1, math.ceil(deadline_s * 1e9) + 1))

        def fired() -> None:
            try:
                os.read(fd, 8)  # the expiration count; reading it clears readiness
            except BlockingIOError:  # not expired yet (a spurious wake): keep watching
                return
            _wake(fut)

        loop.add_reader(fd, fired)
        self.busy = True

        def stop() -> None:
            self.busy = False
            loop.remove_reader(fd)
            _TIMERFD["arm"](fd, 0)  # disarm, so that a later wait starts from a quiet fd
            try:
                os.read(fd, 8)
            except BlockingIOError:
                pass

        return stop

    def close(self) -> None:
        self._finalizer()


class _WatchedFlag:
    """A flag raised from any thread that wakes its watchers (the base of StopToken and Operator)."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._lock = threading.Lock()
        self._watchers: "list[Callable[[], None]]" = []

    def _raise(self) -> None:
        """Set the flag and call every watcher (from this thread); nothing when it is set already."""
        with self._lock:
            if self._flag.is_set():
                return
            self._flag.set()
            watchers = list(self._watchers)
        for wake in watchers:
            wake()

    def _watch(self, wake: Callable[[], None], again: bool) -> Callable[[], None]:
        """Call ``wake()`` each time the flag is raised (``again``; else once); at once when it is
        raised already. Returns the callable that stops watching."""
        with self._lock:
            already = self._flag.is_set()
            if again or not already:
                self._watchers.append(wake)
        if already:
            wake()

        def unwatch() -> None:
            with self._lock:
                if wake in self._watchers:
                    self._watchers.remove(wake)

        return unwatch


class StopToken(_WatchedFlag):
    """One run's stop request: made before the run starts, stopped from any thread, never cleared.

    Hand it to ``run(stop=token)`` / ``act(stop=token)``; ``token.stop()`` then ends that run
    (``reason="interrupted"``, after ``hold()``) within one control period, or, when it came
    before the run's first chunk, before any action. A stopped token stays stopped: a run given
    one returns ``interrupted`` without observing or acting. Thread-safe throughout.
    """

    @property
    def stopped(self) -> bool:
        """True once ``stop()`` was called."""
        return self._flag.is_set()

    def stop(self) -> None:
        """Ask the run to stop; returns at once. Idempotent."""
        self._raise()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Block this thread until stopped or ``timeout_s`` (s) passed; returns ``stopped``."""
        return self._flag.wait(timeout_s)

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` (from the stopping thread) when stopped; at once when already stopped.
        Returns the callable that stops watching."""
        return self._watch(wake, again=False)

    def __repr__(self) -> str:
        return f"StopToken(stopped={self.stopped})"


class Operator(_WatchedFlag):
    """A human operator who outranks the code driving the robot (an agent, a script, a ROS goal).

    One per robot: hand it to ``connect(..., operator=op)`` (every run of that Policy obeys it;
    without one, each Policy has its own, ``policy.operator``). While ``active``:

    - ``run()`` / ``act()`` refuse to start: they return at once with ``reason="operator"``,
      nothing observed, acted or held (the operator has the robot);
    - a run under way holds within one control period (``hold()`` once, no action after it)
      and returns ``reason="operator"``.

    ``take()`` / ``release()`` (or ``set(bool)``) from any thread, any time; unlike a
    ``StopToken`` it is cleared again by ``release()``, after which new runs may start (a run
    that ended ``operator`` stays ended). Thread-safe throughout.
    """

    @property
    def active(self) -> bool:
        """True while the operator holds the robot."""
        return self._flag.is_set()

    def take(self) -> None:
        """The operator takes the robot: runs under way hold and end, new ones are refused."""
        self._raise()

    def release(self) -> None:
        """The operator gives the robot back: new runs may start."""
        self._flag.clear()

    def set(self, active: bool) -> None:
        """``take()`` when ``active`` is true, else ``release()`` (e.g. from a ROS Bool topic)."""
        if active:
            self.take()
        else:
            self.release()

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` (from the taking thread) each time the operator takes the robot; at once
        when it holds it already. Returns the callable that stops watching."""
        return self._watch(wake, again=True)

    def __repr__(self) -> str:
        return f"Operator(active={self.active})"


class Interrupt:
    """The loop's wait point, watching one run's ``StopToken`` at a time.

    ``bind(token)`` at the start of a run (inside its event loop) watches that token and never
    clears it: a token stopped before the run began is seen at the first check. ``unbind()`` at
    the run's end lets it go, so nothing set afterwards reaches the next run.
    """

    def __init__(self, clock: Clock = MONOTONIC) -> None:
        #: where deadlines are read (``_clock.py``): the monotonic clock and a timerfd by default
        self.clock = clock
        self._token: Optional[StopToken] = None
        self._unwatch: Optional[Callable[[], None]] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._waiter: Optional[asyncio.Future] = None
        self._poked = False
        self._timer: Optional[_DeadlineTimer] = None
        self._timer_failed = _TIMERFD is None

    def bind(self, token: Optional[StopToken] = None) -> StopToken:
        """Watch ``token`` (a fresh one when None) for one run; call inside the run's event loop.

        Returns the token watched. A token already stopped stays stopped: the run sees it at its
        first check. Raises RuntimeError when no event loop is running."""
        loop = asyncio.get_running_loop()
        self.unbind()
        token = token if token is not None else StopToken()
        self._loop = loop
        self._poked = False
        self._token = token
        self._unwatch = token.watch(self._wake_from_any_thread)
        return token

    def unbind(self) -> None:
        """Stop watching the run's token (the run ended)."""
        unwatch, self._unwatch = self._unwatch, None
        if unwatch is not None:
            unwatch()
        self._loop = None

    @property
    def token(self) -> Optional[StopToken]:
        """The token of the bound run, else the last bound one (None before any)."""
        return self._token

    @property
    def is_set(self) -> bool:
        """True when the bound run's token is stopped."""
        token = self._token
        return token is not None and token.stopped

    def set(self) -> None:
        """Stop the bound run's token and wake the loop. Safe from any thread, and from inside
        the loop. With no run bound there is nothing to stop: a no-op."""
        token = self._token if self._loop is not None else None
        if token is not None:
            token.stop()

    def _wake_from_any_thread(self) -> None:
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
        """Sleep until ``self.clock.now()`` (``time.monotonic()`` unless a test gave another clock)
        reaches ``deadline`` (s; ``math.inf``: until poked).

        Returns early, without error, when poked or interrupted; the caller re-checks its state.
        On Linux a timerfd wakes it at the deadline while the event loop serves other tasks; the
        fallback is described in the module docstring. A ``LoopClock`` waits on the loop's timer.
        """
        if self._poked or self.is_set:
            self._poked = False
            return
        clock = self.clock
        delay = deadline - clock.now()
        if delay <= 0:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        stop: Optional[Callable[[], None]] = None
        fine = False  # fallback: woken FINE_WAIT_S early, to block for the rest
        if not math.isinf(delay):
            if clock.on_loop:   # the loop's time() is the clock: its own timer wakes on it
                stop = loop.call_at(deadline, _wake, fut).cancel
            else:
                stop = self._precise(loop, deadline, fut)
                if stop is None:
                    stop, fine = self._coarse(loop, delay, fut)
        self._waiter = fut
        try:
            await fut
        finally:
            self._waiter = None
            woken = self._poked or self.is_set
            self._poked = False
            if stop is not None:
                stop()
        if fine and not woken:
            rest = deadline - time.monotonic()
            if rest <= 0:
                return
            if _timed_waits.get(loop, 0) == 0:
                time.sleep(rest)  # alone on this loop: blocking holds up no other robot
            else:  # company arrived meanwhile: wait out the rest on the loop's own timer
                await self.sleep_until(deadline)

    def _precise(self, loop: asyncio.AbstractEventLoop, deadline: float,
                 fut: "asyncio.Future[None]") -> Optional[Callable[[], None]]:
        """Watch a timerfd armed at ``deadline``; None where that is not possible (fallback)."""
        if self._timer_failed or (self._timer is not None and self._timer.busy):
            return None
        try:
            if self._timer is not None and self._timer.pid != os.getpid():
                self._timer = None  # inherited across fork(); its copy of the fd closes with it
            if self._timer is None:
                self._timer = _DeadlineTimer()
            return self._timer.wait(loop, deadline, fut)
        except (OSError, NotImplementedError, RuntimeError):
            # out of descriptors, or a loop that cannot watch one (e.g. Windows' proactor):
            # this Interrupt uses the fallback from now on
            self._timer_failed = True
            if self._timer is not None:
                self._timer.close()
                self._timer = None
            return None

    @staticmethod
    def _coarse(loop: asyncio.AbstractEventLoop, delay: float,
                fut: "asyncio.Future[None]") -> "tuple[Callable[[], None], bool]":
        """Fallback: ``call_later``, counted as a timed wait of ``loop`` while it runs. Alone on
        the loop it fires ``FINE_WAIT_S`` early (the caller blocks for the rest: returns
        ``(stop, True)``); with other timed waits on the loop, at the deadline itself."""
        fine = _timed_waits.get(loop, 0) == 0
        wait_s = delay - FINE_WAIT_S if fine else delay
        handle = loop.call_later(wait_s, _wake, fut) if wait_s > 0 else None
        if handle is None:
            _wake(fut)
        _timed_waits[loop] = _timed_waits.get(loop, 0) + 1

        def stop() -> None:
            left = _timed_waits.get(loop, 1) - 1
            if left > 0:
                _timed_waits[loop] = left
            else:
                _timed_waits.pop(loop, None)
            if handle is not None:
                handle.cancel()

        return stop, fine
