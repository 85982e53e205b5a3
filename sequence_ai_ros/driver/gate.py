"""The command gate: where every joint command leaves the driver, ROS-free.

The core (``sequence_ai``) owns the schedule: action *k* is due at ``t0 + k / control_frequency_hz``
on ``time.monotonic()`` and it calls ``act(row)`` at that instant on the goal's thread -- an asyncio
loop whose timers wake up to 1 ms late (epoll's millisecond timeout) and later still when another
thread holds the GIL. :class:`CommandGate` is the one pacing path after that: it publishes each row
on its own monotonic grid, one control period apart, ``delay_s`` after the core's deadline (the
core's wake-up jitter is absorbed by that small fixed delay instead of reaching the robot), and it
owns the hold latch, so no command can follow a hold. ``delay_s == 0`` publishes straight from the
core's callback (no thread). ``bench/bench_publish_jitter.py`` measures the publish period error.

Nothing here imports rclpy: ``publish`` is any callable.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import threading
import time
from collections import deque
from typing import Optional

__all__ = ["CommandGate", "set_thread_realtime", "sleep_holding_gil"]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _clock_nanosleep():
    """libc's ``clock_nanosleep`` called through ``ctypes.PyDLL`` (which keeps the GIL), or None."""
    if not hasattr(time, "CLOCK_MONOTONIC") or os.name != "posix":
        return None
    try:
        fn = ctypes.PyDLL(ctypes.util.find_library("c") or "libc.so.6").clock_nanosleep
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Timespec), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_NANOSLEEP = _clock_nanosleep()
_TIMER_ABSTIME = 1


def sleep_holding_gil(until: float) -> bool:
    """Sleep until ``time.monotonic()`` reaches ``until`` (s) WITHOUT releasing the GIL: no other
    Python thread of the process runs meanwhile, so the caller has the GIL the moment it wakes.
    Returns False (nothing done) where libc's ``clock_nanosleep`` is not available."""
    if _NANOSLEEP is None:
        return False
    ns = int(until * 1e9)
    ts = _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)
    while _NANOSLEEP(time.CLOCK_MONOTONIC, _TIMER_ABSTIME, ctypes.byref(ts), None) == 4:   # EINTR: again
        pass
    return True


def set_thread_realtime(priority: int) -> Optional[str]:
    """Put the calling thread under ``SCHED_FIFO`` at ``priority`` (1..99); 0 = leave it alone.

    Returns None on success (or for 0), else why not (the OS said no: needs CAP_SYS_NICE or an
    ``rtprio`` limit, e.g. ``ulimit -r 99`` / ``/etc/security/limits.conf``; or not Linux).
    """
    if priority <= 0:
        return None
    if not hasattr(os, "sched_setscheduler"):
        return "SCHED_FIFO is not available on this OS"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(priority)))  # 0: this thread (Linux)
    except OSError as exc:
        return f"SCHED_FIFO priority {priority} refused ({exc.strerror}): grant CAP_SYS_NICE or an rtprio limit"
    return None


class CommandGate:
    """Where every joint command leaves the driver: the publisher thread and the hold latch.

    The core calls ``submit(values)`` at each action's paced deadline, on its asyncio thread.

    - ``delay_s == 0``: the row is published right there, inside the core's callback.
    - ``delay_s > 0`` and the period known (``open`` / ``set_period``): the row is queued with a
      due time on the gate's own grid and the gate's thread publishes it then
      (``time.monotonic()`` seconds)::

          d = min(delay_s, period_s / 2)
          due(0) = arrival(0) + d
          due(k) = max(due(k-1) + period_s, arrival(k))

      so rows leave exactly one control period apart, ``d`` after the core's deadlines (plus
      the first row's lateness): a row the core hands over up to ``d`` later than the first one
      was still makes its slot, so the core's wake-up jitter (asyncio's millisecond timers,
      another thread holding the GIL) never reaches the robot. Only a row that arrives after
      its slot (the core woke more than ``d`` late, or resynced after an underrun) moves the
      grid later -- one irregular period, counted in ``regrids`` -- and never earlier, so there
      is no burst and no catching up. The first row of a run waits ``d``: at most half a period;
      a row leaves at most about ``d`` + one period after the core's deadline.

    Safety, all under one lock (``cond``): ``hold(target)`` latches the gate, drops whatever is
    queued and publishes the hold once; the thread re-checks the latch and the queue under the
    same lock immediately before it publishes. So a queued row never follows a hold, a cancel or
    a stop; nothing is published while latched (between runs). ``open()`` starts a run;
    ``drain()`` ends one that finished normally (its last rows go out, then the latch).

    Args:
        publish: ``publish(values)`` sends one command (called with the lock held).
        delay_s: see above (s, >= 0).
        on_published: ``on_published(t, values, due)`` after each published row: when it went
            out and when it was due (monotonic s; ``due`` is None without the thread).
        rt_priority: SCHED_FIFO priority of the publisher thread (0 = normal scheduling).
        on_rt_error: called with the reason when ``rt_priority`` could not be applied.
        gil_lead_s: how long before a row's due time (s, >= 0) the thread takes the GIL back and
            then sleeps to the due time holding it (:func:`sleep_holding_gil`): another thread's
            long C call (a JPEG encode, a JSON dump, an executor's wait-set rebuild) cannot delay
            the publish then, at the price of pausing the process's other Python threads for at
            most this long per row. 0 = wake at the due time and wait for the GIL like any thread.
    """

    def __init__(self, publish, delay_s: float, on_published, rt_priority: int = 0, on_rt_error=None,
                 gil_lead_s: float = 0.0) -> None:
        if not (delay_s >= 0.0 and math.isfinite(delay_s)):
            raise ValueError(f"publish delay must be a finite number of seconds >= 0, got {delay_s}")
        if not (gil_lead_s >= 0.0 and math.isfinite(gil_lead_s)):
            raise ValueError(f"GIL lead must be a finite number of seconds >= 0, got {gil_lead_s}")
        self.gil_lead_s = float(gil_lead_s)
        self._publish = publish
        self._on_published = on_published
        self.delay_s = float(delay_s)
        self.cond = threading.Condition()
        self.latched = True               # no command before a run starts, none after its hold
        self.last: Optional[list] = None  # the last published row of this run
        self.accepted = 0                 # rows handed over by the core in this run
        self.regrids = 0                  # rows that moved the grid later (diagnostics)
        self._queue: deque = deque()      # (due monotonic s, values, plan)
        self._plan = None                 # attached to the next row submitted (attach)
        #: (due, plan) of the row being published, for ``publish`` to read (it runs under the
        #: lock): due = its slot (monotonic s), None for the hold; plan = what attach() gave it
        self.emitting: tuple = (None, None)
        self._next_due: Optional[float] = None
        self._period_s: Optional[float] = None
        self._stopped = False
        self._thread = None
        self._rt_priority = int(rt_priority)
        self._on_rt_error = on_rt_error
        if self.delay_s > 0:
            self._thread = threading.Thread(target=self._run, name="policy_driver_publisher", daemon=True)
            self._thread.start()

    def open(self, period_s: Optional[float]) -> None:
        """Start a run: unlatch, empty grid; ``period_s`` (s) is the control period, None = unknown yet."""
        with self.cond:
            self.latched, self.last, self.accepted, self.regrids = False, None, 0, 0
            self._queue.clear()
            self._plan = None
            self._next_due = None
            self._period_s = period_s

    def set_period(self, period_s: float) -> None:
        """The control period (s) of the chunk that is starting (the node refuses rate changes)."""
        with self.cond:
            self._period_s = float(period_s)

    def attach(self, plan) -> None:
        """Hand ``plan`` (opaque: a chunk's planned rows) to ``publish`` with the next row submitted."""
        with self.cond:
            self._plan = None if self.latched else plan

    def submit(self, values: list) -> bool:
        """Take one row from the core (at its deadline); False when latched (the row is dropped)."""
        arrival = time.monotonic()
        with self.cond:
            if self.latched:
                return False
            self.accepted += 1
            plan, self._plan = self._plan, None
            if self._thread is None or self._period_s is None:
                self._emit(values, None, plan, arrival)
                return True
            due = arrival + min(self.delay_s, 0.5 * self._period_s)  # the first row: < one period late
            if self._next_due is not None:    # later rows: their slot, unless they missed it
                if arrival > self._next_due + 1e-4:
                    self.regrids += 1
                due = max(arrival, self._next_due)
            self._next_due = due + self._period_s
            self._queue.append((due, values, plan))
            self.cond.notify_all()
            return True

    def hold(self, target_for) -> Optional[list]:
        """Latch, drop queued rows and publish ``target_for(last)`` once; None if already latched.

        ``target_for(last_published_or_None)`` returns the hold command (or None: nothing to send).
        Returns the command published (or [] when there was nothing to publish).
        """
        with self.cond:
            if self.latched:
                return None
            self.latched = True
            self._queue.clear()
            self._plan = None
            self.cond.notify_all()
            target = target_for(self.last)
            if target is None:
                return []
            self.emitting = (None, None)
            self._publish(target)
            return target

    def drain(self, timeout_s: float, finish=None) -> bool:
        """End a run that finished normally: wait (up to ``timeout_s``) for queued rows, then latch.

        ``finish()``, when given, is called under the lock just before the latch unless a hold
        latched first (an output that sent rows ahead cuts them at the last one published).
        Returns True when every queued row went out (rows left after the timeout are dropped).
        """
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while self._queue and not self.latched and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            flushed = not self._queue
            self._queue.clear()
            if finish is not None and not self.latched:
                finish()
            self.latched = True
            self._plan = None
            return flushed

    def stop(self) -> None:
        """Latch and end the publisher thread (joined, up to 2 s)."""
        with self.cond:
            self._stopped = True
            self.latched = True
            self._queue.clear()
            self.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _emit(self, values: list, due: Optional[float], plan=None, slot: Optional[float] = None) -> None:
        self.emitting = (due if due is not None else slot, plan)
        self._publish(values)
        self.last = values
        self._on_published(time.monotonic(), values, due)

    def _run(self) -> None:
        why = set_thread_realtime(self._rt_priority)
        if why is not None and self._on_rt_error is not None:
            self._on_rt_error(why)
        with self.cond:
            while not self._stopped:
                if self.latched or not self._queue:
                    self.cond.wait()
                    continue
                due, values, plan = self._queue[0]
                left = due - time.monotonic()
                if left > self.gil_lead_s:
                    # a hold, a stop or a new row wakes it: everything is re-checked
                    self.cond.wait(left - self.gil_lead_s)
                    continue
                if left > 0 and not sleep_holding_gil(due):   # the lock and the GIL held: nothing changes
                    self.cond.wait(left)
                    continue
                self._queue.popleft()
                self._emit(values, due, plan)
                self.cond.notify_all()    # drain() waits for the queue to empty

