"""One ``Act`` goal's run: its trace, counters, why it was asked to stop, and its result.

:class:`GoalRun` is created when a goal starts executing and owns everything that belongs to
that goal alone, so the node holds no per-goal fields. The node's callbacks (the core's ``act``,
``validate``, ``hold``, ``on_chunk``, ``on_underrun``; the feedback timer) write into the active
``GoalRun``; when the run ends :meth:`GoalRun.finish` turns the core's ``RunOutcome`` into the
``Act`` result and the terminal status (succeed / abort / canceled).

Each goal has its own ``sequence_ai.StopToken`` (``GoalRun.stop``), made when the goal is
accepted, before its run starts, and handed to the core's ``act(stop=...)``: a cancel, a newer
goal or the driver ending it stops that token, whenever it comes, and no other goal's.

Endings that do not come from the core (a cancel before the run started, sensors never arrived,
the driver deactivated or shutting down before the run started) use :meth:`GoalRun.early`.
Every ending fills ``Act.Result`` -- the same fields as ``sequence_ai_msgs/msg/RunOutcome``.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Optional, Tuple

from sequence_ai import StopToken
from sequence_ai_msgs.action import Act

from .latency import p50_p99

__all__ = ["RunTrace", "GoalRun", "RunSlot", "fill_result", "fill_seams", "SUCCEED", "ABORT", "CANCELED",
           "TYPED_ENDINGS", "OPERATOR_MESSAGE"]

SUCCEED, ABORT, CANCELED = "succeed", "abort", "canceled"
#: Endings the driver itself decides and reports as the result's reason (aborted).
TYPED_ENDINGS = ("stale_camera", "operator")
#: The result's message when the operator holds the robot.
OPERATOR_MESSAGE = "an operator holds the robot (operator_topic is true): the run was refused or held"


@dataclass
class RunTrace:
    """What one goal commanded: for plots and tests.

    ``commands``: (monotonic time s, values) per published command; ``seams``: index into
    ``commands`` where each chunk started; ``hold_time``: monotonic time of the hold, if any;
    ``stop_time``: monotonic time the run was first asked to stop (a cancel accepted or an end
    request: preempted, deactivated, a stop service), if it was;
    ``chunk_obs``: per chunk whose first command went out, ``(monotonic s the driver built its
    observation, that observation's start on the ROS clock s)``, the pair its sample used.
    """

    commands: list = field(default_factory=list)
    seams: list = field(default_factory=list)
    hold_time: Optional[float] = None
    stop_time: Optional[float] = None
    hold_command: Optional[list] = None
    chunk_obs: list = field(default_factory=list)


def fill_result(result, outcome) -> None:
    """Copy a ``sequence_ai.RunOutcome`` into an ``Act.Result`` (or a ``RunOutcome`` message)."""
    result.reason = str(outcome.reason)
    result.actions = int(outcome.actions)
    result.chunks = int(outcome.chunks)
    result.seconds = float(outcome.seconds)
    result.underruns = int(outcome.underruns)
    result.underrun_s = float(outcome.underrun_s)
    result.max_seam_jump = float(outcome.max_seam_jump or 0.0)
    result.instruction_swaps = int(outcome.instruction_swaps or 0)
    result.max_instruction_lag_s = float(outcome.max_instruction_lag_s or 0.0)
    result.action_space = str(outcome.action_space or "")
    fill_seams(result, getattr(outcome, "seams", None))
    result.merge = str(getattr(outcome, "merge", "") or "")
    result.delay_mode = str(getattr(outcome, "delay_mode", "") or "")


def _get(source, *names, default=None):
    """The first of ``names`` present in ``source`` (a dict or an object), else ``default``."""
    for name in names:
        value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
        if value is not None:
            return value
    return default


def fill_seams(result, seams) -> None:
    """Copy the per-seam telemetry summary (``RunOutcome.seams``: a dict or an object; None =
    no seams) into the message's seam fields: count, jump p50/p99 as played and before any
    blend (action units), the largest delay used (control steps), rows trimmed by the aligned
    merge, the least playback left at a chunk's arrival (s)."""
    if seams is None:
        return
    result.seams = int(_get(seams, "count", default=0))
    result.seam_jump_p50 = float(_get(seams, "jump_p50", "p50_jump", default=0.0))
    result.seam_jump_p99 = float(_get(seams, "jump_p99", "p99_jump", default=0.0))
    result.seam_jump_before_blend_p99 = float(_get(seams, "jump_before_p99", "raw_jump_p99",
                                                   "jump_p99", "p99_jump", default=0.0))
    result.seam_max_delay_steps = int(_get(seams, "max_delay_steps", "max_delay", default=0))
    result.seam_rows_trimmed = int(_get(seams, "rows_trimmed", "total_trimmed", "trimmed", default=0))
    result.seam_min_playback_left_s = float(_get(seams, "min_playback_left_s", "playback_left_min_s", default=0.0))


class GoalRun:
    """The state of one executing ``Act`` goal.

    Args:
        handle: the rclpy ``ServerGoalHandle``.
        max_seconds: the run's time bound (s; the goal's, or ``default_max_seconds``).
    Attributes:
        trace: :class:`RunTrace` of what was published.
        underruns: control ticks without an action so far.
        stop_reason: why ``validate`` stopped the run (the stream or bound), else None.
        status: ``starting`` (waiting for sensors / the first chunk) or ``running``.
        task_done: the success service said the task is done (``until``).
        obs_to_action: observation-to-action samples (s, ROS clock), one per chunk whose first
            command was published (``latency.py``); the result's p50 / p99 come from it.
        stop_when: the goal's stop condition as asked ("" = the driver's success_service, if any);
        stop_client: the CheckSuccess client polled for this run, else None.
        end_request: ``(why, message)`` when something other than the client ended the run
            (``preempted``, ``deactivated``, ``shutdown``, ``stale_camera``); None otherwise.
        stop: this goal's ``StopToken``: stopped by :meth:`cancel` and :meth:`request_end`, never
            cleared; the core's run of this goal watches it.
    """

    def __init__(self, handle, instruction: str, max_seconds: float) -> None:
        self.handle = handle
        self.instruction = instruction
        #: the instruction in force for this run, for its feedback: the goal's, then each swap on
        #: ~/instruction, as the core sends it (read at each request). Never taken from the
        #: policy after the run returned: act() restores the instruction it found by then.
        self.instruction_now = instruction
        #: held while the policy's instruction is read or set and ``instruction_now`` written with
        #: it (the run thread at each request, the ~/instruction callback), so a swap is never
        #: overwritten by a read from just before it
        self.instruction_lock = threading.Lock()
        self.max_seconds = float(max_seconds)
        self.t0 = time.monotonic()
        self.trace = RunTrace()
        self.underruns = 0
        self.stop_reason: Optional[str] = None
        self.last_good = None
        self.status = "starting"
        self.task_done = False
        self.stop_when = ""
        self.stop_client = None
        self.stop_lapse_warned = False   # a stop-condition service stopped answering: warned once
        self.episode_started = False
        #: the start marker as published and when (monotonic s): re-sent at START_MARKER_REPEAT_S
        self.start_marker: Optional[str] = None
        self.start_marker_t = 0.0
        self.start_marker_sent = 0
        self.end_request: Optional[Tuple[str, str]] = None
        self.cancel_accepted = False     # this node's cancel callback accepted a cancel for it
        self.stop = StopToken()
        self.ended = threading.Event()   # set once the result is final
        self.obs_to_action: list = []    # s per chunk played, camera stamp -> first command published

    # -- asked to end ------------------------------------------------------------------------
    def request_end(self, why: str, message: str) -> None:
        """End the run for ``why`` (the first request's reason and message are kept): stops its
        token, so the run holds within one control period, or never starts."""
        if self.end_request is None:
            self.end_request = (why, message)
        self._stopping()

    def cancel(self) -> None:
        """The client's cancel was accepted: stop the run (it holds; the result says canceled)."""
        self.cancel_accepted = True
        self._stopping()

    def _stopping(self) -> None:
        if self.trace.stop_time is None:
            self.trace.stop_time = time.monotonic()
        self.stop.stop()

    @property
    def ending(self) -> bool:
        """True once a cancel or an end request came in (a waiting run should give up)."""
        return self.stop.stopped

    # -- feedback ----------------------------------------------------------------------------
    def feedback(self):
        """An ``Act.Feedback`` for now: counts, elapsed time (s), progress (0..1), the instruction
        in force (``instruction_now``)."""
        fb = Act.Feedback()
        fb.actions = len(self.trace.commands)
        fb.chunks = len(self.trace.seams)
        fb.underruns = self.underruns
        fb.elapsed_s = time.monotonic() - self.t0
        fb.progress = float(min(1.0, fb.elapsed_s / self.max_seconds))
        fb.instruction = self.instruction_now or self.instruction
        fb.status = self.status
        return fb

    # -- the result --------------------------------------------------------------------------
    def early(self, reason: str, message: str, status: str = ABORT):
        """The result of a run that ended before the core started: ``(Act.Result, status)``."""
        result = Act.Result()
        result.reason, result.message = reason, message
        result.seconds = time.monotonic() - self.t0
        result.actions = len(self.trace.commands)
        self.fill_latency(result)
        return result, status

    def fill_latency(self, result) -> None:
        """Set the result's ``obs_to_action_p50_s`` / ``_p99_s`` (s) from this run's samples; 0.0 when none."""
        result.obs_to_action_p50_s, result.obs_to_action_p99_s = p50_p99(self.obs_to_action)

    def finish(self, outcome, cancel_confirmed: bool):
        """``(Act.Result, status)`` from the core's ``RunOutcome``.

        ``cancel_confirmed``: the client's cancel was accepted (the goal is CANCELING). A frozen or
        stalled camera (``end_request`` ``stale_camera``) aborts with that reason whatever the
        core reported (it stopped through validate or observe). An
        ``interrupted`` run is canceled when the client asked, aborted with the end request's
        message when the driver ended it (preempt, deactivate, shutdown); ``validate`` and
        ``error`` abort; ``completed`` / ``until`` / ``timeout`` succeed; ``until`` reads
        ``stop_when`` when the goal named its stop condition; ``operator`` aborts.
        """
        result = Act.Result()
        fill_result(result, outcome)
        result.actions = len(self.trace.commands)   # published: a row queued at the hold was dropped
        self.fill_latency(result)
        reason = str(outcome.reason)
        if self.end_request is not None and self.end_request[0] in TYPED_ENDINGS:
            result.reason, result.message = self.end_request
            return result, ABORT
        if reason == "operator":   # the core saw the operator first
            result.message = OPERATOR_MESSAGE
            return result, ABORT
        if reason == "until" and self.stop_when:
            result.reason, result.message = "stop_when", f"stop condition {self.stop_when!r} answered success"
            return result, SUCCEED
        if reason == "interrupted" and self.end_request is not None:
            result.message = self.end_request[1]
            return result, ABORT
        if reason == "interrupted" and cancel_confirmed:
            return result, CANCELED
        if reason == "validate":
            result.message = self.stop_reason or ""
            return result, ABORT
        if reason == "error":
            result.message = str(getattr(outcome, "error", "") or self.stop_reason or "")
            return result, ABORT
        return result, SUCCEED


class RunSlot:
    """The driver's one run slot: one goal's run at a time (or the ready service's warm-up).

    ``take(run, timeout_s)`` waits until the slot is free and holds it for ``run`` (True), or
    gives up at once when ``run`` is stopped first, or after ``timeout_s`` (s) (False): a goal
    preempted or cancelled while it waits for the one before never runs. Thread-safe; waits
    are woken by ``release`` and by the waiting run's stop, never polled.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holder = None

    @property
    def busy(self) -> bool:
        """True while something holds the slot."""
        return self._holder is not None

    def take(self, run: GoalRun, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` (s) for the slot and hold it for ``run``: True; False when
        ``run`` was stopped first (at once) or the time ran out."""
        unwatch = run.stop.watch(self._wake)
        try:
            with self._cond:
                self._cond.wait_for(lambda: run.ending or self._holder is None, timeout_s)
                if self._holder is None and not run.ending:
                    self._holder = run
                    return True
                return False
        finally:
            unwatch()

    def try_take(self, owner) -> bool:
        """Hold the slot for ``owner`` if it is free now; never waits."""
        with self._cond:
            if self._holder is not None:
                return False
            self._holder = owner
            return True

    def release(self, owner) -> None:
        """Free the slot if ``owner`` holds it, and wake the waiters."""
        with self._cond:
            if self._holder is owner:
                self._holder = None
                self._cond.notify_all()

    def wait_free(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` (s) for the slot to be free; True when it is."""
        with self._cond:
            return self._cond.wait_for(lambda: self._holder is None, timeout_s)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()
