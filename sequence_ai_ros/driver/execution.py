"""The ``Act`` action of the policy driver: accepting goals, running one, and its result.

:class:`GoalExecution` is held by :class:`~sequence_ai_ros.driver.node.PolicyDriver` (``goals``); it
uses the node's gate, outputs, assembler and policy, which exist while the node is configured.
Every goal ends with a result and a terminal status, whatever ends it:

* the run's own end (``completed`` / ``until`` / ``timeout``: succeeded; ``validate`` / ``error``:
  aborted, ``message`` naming the stream, bound or error);
* a frozen or stalled camera (no fresh frame within its ``camera_max_frame_age_s``, checked at
  the control rate for the whole run, chunk waits included): no new request goes out, the arm
  holds, and the goal aborts with reason ``stale_camera``, ``message`` naming the view;
* the client's cancel (``interrupted``, canceled) -- before the run started too;
* the goal's stop condition (``stop_when``: a name from ``stop_conditions`` or a CheckSuccess
  service; succeeded) or the driver's ``success_service`` (``until``; succeeded);
* the operator (``operator_topic`` true): a goal that arrives meanwhile is accepted and ends at
  once with reason ``operator`` (nothing published); a run under way holds within one control
  period and aborts with ``operator``;
* a newer goal (``goal_policy: preempt``: ``interrupted``, aborted, "preempted by a new goal");
* the driver ending it: deactivate, shutdown, SIGINT/SIGTERM (``interrupted``, aborted, the
  message says which); a lost gateway (``error``, aborted, the transport error).

Each early ending publishes the hold first (the core unwinds through ``hold``); the result's
``actions`` counts commands actually published.

Stopping a goal is stopping its ``GoalRun.stop`` token, made when the goal is accepted and handed
to the core's run: whenever the stop comes (before the run starts, while it waits for the goal
before it to unwind, mid-run), that run sees it and no other. Preemption happens where
ros2/examples' single-goal server does it, in the handle-accepted callback: the goal accepted
last is the one that runs; every older one still waiting or running is stopped (it holds, then
aborts), and the new one starts once the older run has unwound.
"""
from __future__ import annotations

import json
import math
import threading
import time
from typing import Dict, Optional, Tuple

from rclpy.action import CancelResponse, GoalResponse
from std_msgs.msg import String

from sequence_ai_msgs.srv import CheckSuccess

from ..bag import events as _capture
from ..observation import SensorError, StaleCameraError
from . import params as _params
from .latency import ChunkMark, ObservationMarks, chunk_observation, observation_start_s
from .goal import CANCELED, OPERATOR_MESSAGE, SUCCEED, TYPED_ENDINGS, GoalRun, RunSlot, RunTrace

PREEMPT_WAIT_S = 10.0
"""How long a new goal waits for the goal it preempted to unwind (s); then it aborts."""
START_MARKER_REPEAT_S = (1.0, 3.0)
"""When a run's start marker is published again, unchanged (s after the first). A recorder whose
reader matched the driver's marker publisher a moment too late (discovery runs both ways; a
volatile reader gets nothing sent before its own match: a recorder started just before the goal)
misses the first one and would record no episode; a repeat starts its bag then (its pre-roll and
its command backlog since the marker's ``t_ns`` fill the start), and a recorder that has the
episode already ignores it (same ``goal_id`` and ``t_ns``)."""
STOP_SERVICE_WAIT_S = 5.0
"""How long a goal waits for the CheckSuccess service its stop_when names (s); then it ends error."""


def _stop_service_lapsed(logger, run: GoalRun, client, why: str) -> None:
    """Warn once per run that its stop condition cannot be asked: the run then ends only by its
    time bound, a cancel, the operator or a fault, and whoever watches should know."""
    if run.stop_lapse_warned:
        return
    run.stop_lapse_warned = True
    logger.warning(f"stop condition {client.srv_name} is not answering ({why}): the run goes on until its "
                   f"{run.max_seconds:g} s bound or a cancel; check the node that serves it")


def _ros_seconds(node) -> float:
    """Now on ``node``'s ROS clock (s; sim time under ``use_sim_time``)."""
    return node.get_clock().now().nanoseconds * 1e-9


class GoalExecution:
    """The Act action server's callbacks and the callbacks handed to the core, for one node.

    Held by the node (``PolicyDriver.goals``); it owns everything about goals (the accepted
    ones, the run slot, the running and the last run, their timings) and reads the node's
    configured parts (``policy``, ``assembler``, the gate, the outputs, the parameters, the
    publishers) through ``node``, which owns their lifecycle.

    Args:
        node: the PolicyDriver.
    Attributes:
        run: the running goal's GoalRun, else None; ``last_run``: the last one to end.
        last_outcome: the core's RunOutcome of the last run that reached the core, else None.
        obs_to_chunk_s: seconds from the observation the last chunk to start was computed on
            (built by the driver) to that chunk's start (its first row handed to the gate), else None.
        slot: the RunSlot (one run at a time; the ready service holds it while it warms up).
    """

    def __init__(self, node) -> None:
        self.node = node
        self.slot = RunSlot()
        self.run: Optional[GoalRun] = None
        self._watch_lock = threading.Lock()
        self._watching = False             # the camera watch is on (a run is driving)
        self.last_run: Optional[GoalRun] = None
        self.last_outcome = None
        self.obs_to_chunk_s: Optional[float] = None
        self._goals: Dict[int, GoalRun] = {}        # accepted and not yet concluded, by id(goal handle)
        self._goals_lock = threading.Lock()
        self._obs_marks = ObservationMarks()       # the observations built, for the latency figure
        self._success_call = None
        self._success_call_t = 0.0

    @property
    def trace(self) -> RunTrace:
        """The trace of the running goal, else of the last one (empty before any)."""
        run = self.run or self.last_run
        return run.trace if run is not None else RunTrace()

    # -- goal / cancel callbacks -------------------------------------------------------------
    def on_goal(self, goal_request) -> GoalResponse:
        """Reject a goal that cannot run (see :meth:`refusal`). A goal while the operator holds the
        robot is accepted and ends at once with reason ``operator``, so the client reads why."""
        why = self.refusal(goal_request)
        if why is not None:
            self.node.get_logger().warning(f"rejected Act goal: {why[1]}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def refusal(self, goal_request) -> Optional[Tuple[str, str]]:
        """``(word, message)`` when a goal (or a ~/start_policy request) cannot run: ``inactive``,
        ``busy`` (goal_policy reject) or ``invalid`` (the message names the field); else None."""
        if not self.node._active:
            return "inactive", f"the driver is not active (lifecycle state {self.node._lifecycle_label()})"
        if self.slot.busy and self.node._params.goal_policy == "reject":
            return "busy", "a run is already active (goal_policy=reject)"
        if not goal_request.instruction.strip():
            return "invalid", "empty instruction"
        if not (goal_request.max_seconds >= 0 and math.isfinite(goal_request.max_seconds)):
            return "invalid", f"max_seconds={goal_request.max_seconds}: give a time bound > 0 s (0 = default_max_seconds)"
        if goal_request.params_json:
            try:
                if not isinstance(json.loads(goal_request.params_json), dict):
                    raise ValueError("not an object")
            except ValueError as exc:
                return "invalid", f"params_json is not a JSON object ({exc})"
        try:
            _params.stop_service(self.node._params, goal_request.stop_when)
        except ValueError as exc:
            return "invalid", str(exc)
        return None

    def accepted_runs(self) -> list:
        """Every goal accepted and not yet concluded, oldest first: the running one and any still
        waiting for the run slot (a goal that preempts another waits there until it unwinds)."""
        with self._goals_lock:
            return list(self._goals.values())

    def _goal_run(self, goal_handle) -> GoalRun:
        """The GoalRun of an accepted goal, made (with its stop token) the first time it is asked
        for: at acceptance, or by a cancel that overtook the handle-accepted callback."""
        with self._goals_lock:
            run = self._goals.get(id(goal_handle))
            if run is None:
                goal = goal_handle.request
                max_s = goal.max_seconds if goal.max_seconds > 0 else float(self.node._params.default_max_seconds)
                run = self._goals[id(goal_handle)] = GoalRun(goal_handle, goal.instruction, max_s)
            return run

    def on_accepted(self, goal_handle) -> None:
        """Handle-accepted callback: preempt every older goal (it holds, then aborts), then execute."""
        run = self._goal_run(goal_handle)
        with self._goals_lock:
            for key in [k for k, r in self._goals.items() if not r.handle.is_active]:
                del self._goals[key]   # a cancel that came after its goal had ended left it here
            older = [r for r in self._goals.values() if r is not run]
            active = self.node._active
        for other in older:
            other.request_end("preempted", "preempted by a new goal")
        if not active:   # a deactivate / shutdown came between the goal callback and now
            run.request_end("inactive", self.node._end_message or "the driver is not active")
        goal_handle.execute()

    def on_cancel(self, goal_handle) -> CancelResponse:
        # Noted on the run before rclpy moves the goal to CANCELING (after this returns): the run
        # can end (interrupted) first, and its result must still say canceled.
        if goal_handle.is_active:
            self._goal_run(goal_handle).cancel()
        return CancelResponse.ACCEPT

    @staticmethod
    def _cancel_confirmed(run: GoalRun, wait_s: float = 2.0) -> bool:
        """True when this goal's cancel was accepted; waits briefly for rclpy's CANCELING state."""
        handle = run.handle
        if not run.cancel_accepted:
            return handle.is_cancel_requested
        deadline = time.monotonic() + wait_s
        while not handle.is_cancel_requested and time.monotonic() < deadline:
            time.sleep(0.002)
        return handle.is_cancel_requested

    # -- one goal ----------------------------------------------------------------------------
    def execute(self, goal_handle):
        """The action's execute callback: run the goal, then give it its result and status.

        The run slot is taken once the goal this one preempted has unwound (its token was
        stopped at acceptance); a goal stopped meanwhile ends without running."""
        run = self._goal_run(goal_handle)
        try:
            if not self.slot.take(run, PREEMPT_WAIT_S):
                result, status = self._before_start(run) or run.early(
                    "error", f"could not preempt the running goal within {PREEMPT_WAIT_S:g} s")
                return self._conclude(run, result, status)
            self.run = run
            try:
                try:
                    result, status = self._before_start(run) or self._drive(run, goal_handle.request)
                except Exception as exc:  # noqa: BLE001 - a goal always gets a result
                    self._hold()
                    self.node.get_logger().error(f"Act goal failed: {type(exc).__name__}: {exc}")
                    result, status = run.early("error", f"{type(exc).__name__}: {exc}")
                return self._conclude(run, result, status)
            finally:
                self.last_run, self.run = run, None
                self.slot.release(run)
        finally:
            with self._goals_lock:
                self._goals.pop(id(goal_handle), None)

    def _before_start(self, run: GoalRun):
        """``(result, status)`` for a goal stopped before its run started (nothing was published,
        nothing to hold), else None."""
        if self.node.operator.active:
            return run.early("operator", OPERATOR_MESSAGE)
        if run.end_request is not None:
            why, message = run.end_request
            return run.early(why if why in TYPED_ENDINGS else "interrupted", message)
        if not self.node._active:   # accepted just before a deactivate / shutdown reached it
            return run.early("interrupted", self.node._end_message or "the driver is not active")
        if run.cancel_accepted and self._cancel_confirmed(run):
            return run.early("interrupted", "cancelled before the run started", CANCELED)
        return None

    def _conclude(self, run: GoalRun, result, status: str):
        """Episode end marker, the terminal status, the log line; returns the result."""
        if run.episode_started:  # capture: the end marker, with the result and the success label
            run.episode_started = False
            label = bool(run.task_done) if run.stop_client is not None else None
            self.node._episode_pub.publish(String(data=_capture.end_event(result, label)))
        handle = run.handle
        if status == CANCELED and handle.is_cancel_requested:
            handle.canceled()
        elif status == SUCCEED:
            handle.succeed()
        else:
            handle.abort()
        run.ended.set()
        self.node.get_logger().info(f"Act '{run.instruction}': {result.reason}, {result.actions} actions, "
                               f"{result.seconds:.1f} s" + (f" ({result.message})" if result.message else ""))
        return result

    def _drive(self, run: GoalRun, goal):
        """Wait for sensors, run the policy, and turn the outcome into ``(result, status)``."""
        self.node.assembler.clear_faults()
        sensors_ok = self.wait_for_sensors(run)
        early = self._before_start(run)
        if early is not None:
            return early
        if not sensors_ok:
            faults = self.node.assembler.faults
            if faults:
                return run.early("validate", "; ".join(faults.values()))
            return run.early("error", f"no camera/joint data within {self.node._params.sensor_wait_s:g} s: "
                                      f"check the topic parameters")
        p = self.node._params
        stopped = self._stop_client(run, goal)
        if stopped is not None:
            return stopped
        self.node._gate.open(1.0 / self.node.control_rate_hz if self.node.control_rate_hz else None)
        until = (lambda: run.task_done) if run.stop_client is not None else None
        run.start_marker = _capture.start_event(self.node, p, goal, getattr(run.handle, "goal_id", None),
                                                self.node.control_rate_hz)
        self.node._episode_pub.publish(String(data=run.start_marker))
        run.start_marker_t, run.start_marker_sent = time.monotonic(), 1
        run.episode_started = True
        self._arm_freshness(True)
        self._obs_marks.clear()
        try:
            outcome = self.node.policy.act(
                goal.instruction, observe=lambda: self._observe(run), act=self._send, max_seconds=run.max_seconds,
                until=until, validate=self._validate, hold=self._hold, on_underrun=self._on_underrun,
                prefetch=bool(p.prefetch), lookahead=int(p.lookahead), smooth_seam=int(p.smooth_seam),
                on_chunk=self._on_chunk, params=json.loads(goal.params_json) if goal.params_json else None,
                progress=False, stop=run.stop,
            )
        except Exception as exc:  # noqa: BLE001 - the core ran hold; the gateway may be gone
            self._hold()
            if isinstance(exc, StaleCameraError) and run.end_request is not None:
                return run.early(*run.end_request)   # stale_camera: observe refused to send a request
            self.node.get_logger().error(f"Act goal failed: {type(exc).__name__}: {exc}")
            return run.early("error", f"{type(exc).__name__}: {exc}")
        finally:
            self._arm_freshness(False)
            # a normal ending lets its last queued row go out (an early one has latched already)
            gate = self.node._gate
            gate.drain(timeout_s=gate.delay_s + (1.0 / (self.node.control_rate_hz or 15.0)) + 0.5,
                       finish=self.node._outputs.end)
        self.last_outcome = outcome
        confirmed = outcome.reason == "interrupted" and run.end_request is None and self._cancel_confirmed(run)
        return run.finish(outcome, confirmed)

    def _stop_client(self, run: GoalRun, goal):
        """Give ``run`` the CheckSuccess client of its stop condition; ``(result, status)`` (error)
        when the service the goal named is not there within STOP_SERVICE_WAIT_S, else None."""
        run.stop_when = (goal.stop_when or "").strip()
        service = _params.stop_service(self.node._params, goal.stop_when)
        if service is None:
            return None
        client = self.node.check_success_client(service)
        if run.stop_when and not client.wait_for_service(timeout_sec=STOP_SERVICE_WAIT_S):
            return run.early("error", f"stop_when {run.stop_when!r}: no CheckSuccess service {service} "
                                      f"within {STOP_SERVICE_WAIT_S:g} s")
        run.stop_client = client
        return None

    def wait_for_sensors(self, run: Optional[GoalRun] = None) -> bool:
        """Wait (up to ``sensor_wait_s``) for every stream; False on timeout, a fault, a cancel
        or an end request (``run``'s: its stop ends the wait at once)."""
        deadline = time.monotonic() + float(self.node._params.sensor_wait_s)
        while not self.node.assembler.ready():
            if time.monotonic() > deadline or self.node.assembler.faults:
                return False
            if run is None:
                time.sleep(0.02)
            elif run.stop.wait(0.02):
                return False
        return True

    def end_run(self, why: str, message: str, timeout_s: float = 3.0) -> bool:
        """End the running goal (if any) for ``why``: it unwinds through the hold and gets its
        result (aborted, ``message``); so does every goal accepted and not started yet. Returns
        True when no run is left after ``timeout_s`` (s)."""
        self.node._end_message = message
        with self._goals_lock:
            runs = list(self._goals.values())
        for run in runs:
            run.request_end(why, message)
        if not self.slot.wait_free(timeout_s):
            self.node.get_logger().error(f"the active run did not unwind within {timeout_s:g} s ({why})")
            return False
        return True

    # -- the callbacks handed to the core -------------------------------------------------
    def publish(self, values: list) -> None:
        """Publish one row from the gate (its lock held); a chunk's first row records its
        observation-to-action sample (ROS clock s, see ``latency.py``)."""
        due, mark = self.node._gate.emitting   # (due, ChunkMark) of this row; no mark past a chunk's first
        self.node._outputs.publish(values, due, None if mark is None else mark.plan)
        if mark is not None and mark.obs_start_s is not None:
            run = self.run
            if run is not None:
                run.obs_to_action.append(_ros_seconds(self.node) - mark.obs_start_s)
                run.trace.chunk_obs.append((mark.obs_built_s, mark.obs_start_s))

    def published(self, t: float, values: list, due: Optional[float]) -> None:
        """The gate published ``values`` at monotonic ``t`` (s; ``due`` unused): record it."""
        run = self.run
        if run is not None:
            run.trace.commands.append((t, values))

    def _send(self, action) -> None:
        """Hand one action to the gate (called by the core at the action's deadline).

        Dropped when a hold has latched the gate; see ``CommandGate`` for when it is published.
        """
        if self.node._gate.submit([float(x) for x in action]):
            run = self.run
            if run is not None:
                run.status = "running"

    def _hold_target(self, last: Optional[list]) -> Optional[list]:
        """The hold command for ``hold_mode``, from the last published command (or the arm's state)."""
        target = last
        if target is None:  # stopped before the first command: hold where the arm is
            q = self.node.assembler.latest_joint_positions()
            g = self.node.assembler.latest_gripper()
            target = None if q is None else q + ([g] if g is not None else [])
        n_arm = len(self.node._params.joint_names)
        if target is not None and self.node._params.hold_mode == "zeros":
            # velocity interface: stop the arm joints; the gripper keeps its last command
            target = [0.0] * min(n_arm, len(target)) + list(target[n_arm:])
        return target

    def _hold(self) -> None:
        """Publish one hold command, then latch: nothing is published after it (queued rows are dropped)."""
        if self.node._gate is None:
            return
        target = self.node._gate.hold(self._hold_target)
        run = self.run
        if target is not None and run is not None:
            run.trace.hold_time = time.monotonic()
            run.trace.hold_command = target or None

    def _stale_camera(self, run: GoalRun) -> Optional[StaleCameraError]:
        """A frozen or stalled camera ends the run (``stale_camera``, naming the view); else None."""
        stale = self.node.assembler.stale_cameras()
        if not stale:
            return None
        view, text = next(iter(stale.items()))
        if run is not None:
            run.request_end("stale_camera", text)
            run.stop_reason = text
        self.node.get_logger().error(f"stopping the run (stale_camera): {text}")
        return StaleCameraError(view, text)

    def _arm_freshness(self, on: bool) -> None:
        """Start (a run began) or stop the control-rate camera check (:meth:`watch_cameras`).

        Stopping only marks it: the timer cancels itself at its next tick, on the thread that
        runs it. Cancelled from this (the run's) thread, it could be cancelled between the wait
        that found it due and its call, where rclpy raises "timer is canceled" on the spinning
        thread and leaves the timer and its group marked busy."""
        timer = self.node._freshness_timer
        if timer is None:
            return
        with self._watch_lock:
            self._watching = on
            if not on:
                return
            try:
                timer.reset()
            except Exception:  # noqa: BLE001 - released meanwhile (cleanup / shutdown)
                return
        executor = self.node.executor
        if executor is not None:
            executor.wake()   # a wait already under way does not know the timer is due again

    def watch_cameras(self) -> None:
        """Timer at the control rate while a run is on: a frozen or stalled camera ends it within its
        ``camera_max_frame_age_s`` plus one control period, whatever the loop is doing (``validate``
        sees it only at an action's deadline, not while the loop waits for a chunk). Between runs
        it cancels itself (an idle driver wakes for nothing)."""
        with self._watch_lock:
            if not self._watching:
                timer = self.node._freshness_timer
                if timer is not None:
                    timer.cancel()
                return
        run = self.run
        if run is None or not run.episode_started or run.ending or self.node.assembler is None:
            return
        self._stale_camera(run)   # stops the run's token: the core holds; the result says stale_camera

    def _validate(self, action) -> bool:
        """Cameras fresh; sensors fresh and well-formed; action finite and inside the configured bounds."""
        run = self.run
        if self._stale_camera(run) is not None:
            return False
        problems = self.node.assembler.problems()
        if problems:
            run.stop_reason = "; ".join(problems)
            self.node.get_logger().error(f"stopping the run (validate): {run.stop_reason}")
            return False
        if not all(math.isfinite(float(x)) for x in action):
            run.stop_reason = f"non-finite action {list(action)}"
            return False
        lower, upper = self.node._params.joint_lower, self.node._params.joint_upper
        for i, x in enumerate(action):
            if lower is not None and i < len(lower) and x < lower[i]:
                run.stop_reason = f"action dim {i} = {x:.4f} below joint_lower {lower[i]}"
                return False
            if upper is not None and i < len(upper) and x > upper[i]:
                run.stop_reason = f"action dim {i} = {x:.4f} above joint_upper {upper[i]}"
                return False
        return True

    def _observe(self, run: GoalRun):
        """The observation for the next request; never raises for stale data (see the package docstring)."""
        stale = self._stale_camera(run)
        if stale is not None:
            raise stale   # no request goes out on a frozen picture; the core holds
        with run.instruction_lock:          # what this request carries
            run.instruction_now = self.node.policy.instruction or run.instruction
        try:
            obs = self.node.assembler.build(run.instruction)
            run.last_good = obs
        except SensorError as exc:
            self.node.get_logger().warning(f"observation refused ({exc}); the next validate stops the run",
                                      throttle_duration_sec=2.0)
            fallback = run.last_good
            obs = fallback if fallback is not None else self.node.assembler.build(run.instruction, strict=False)
        self._obs_marks.add(obs, time.monotonic(), observation_start_s(obs, _ros_seconds(self.node)))
        return obs

    def _on_chunk(self, chunk, first_action_index) -> None:
        hz = chunk.control_frequency_hz
        if hz and self.node.control_rate_hz and abs(hz - self.node.control_rate_hz) > 1e-6 * hz:
            raise ValueError(f"chunk at {hz} Hz contradicts the control rate {self.node.control_rate_hz} Hz")
        # the chunk's own observation, carried by its request (prefetch built newer ones meanwhile)
        found = self._obs_marks.find(chunk_observation(self.node.policy, chunk))
        built, start = found if found is not None else (None, None)
        if built is not None:
            self.obs_to_chunk_s = time.monotonic() - built
        if hz:
            self.node._gate.set_period(1.0 / float(hz))
        plan = self.node._outputs.plan(chunk, self.node.policy)   # chunk-native trajectories
        self.node._gate.attach(ChunkMark(plan, start, built))
        run = self.run
        if run is not None:
            run.trace.seams.append(self.node._gate.accepted)  # this chunk's first row is the next one accepted

    def _on_underrun(self) -> None:
        run = self.run
        if run is not None:
            run.underruns += 1

    # -- success service ------------------------------------------------------------------
    def poll_success(self) -> None:
        """Ask the success service (never blocks: the answer lands in a done-callback)."""
        run = self.run
        client = None if run is None else (run.stop_client or (None if run.stop_when else self.node._success_client))
        if client is None or run.task_done or self.node.policy is None:
            return
        pending = self._success_call
        ready = client.service_is_ready()
        if pending is not None:
            if ready and time.monotonic() - self._success_call_t < STOP_SERVICE_WAIT_S:
                return
            # a service that hangs, or went away with our request in flight (it will never answer:
            # waiting out STOP_SERVICE_WAIT_S could outlast a short run): ask again, and say so once
            client.remove_pending_request(pending)
            self._success_call = None
            _stop_service_lapsed(self.node.get_logger(), run, client,
                                 "the service is gone" if not ready else f"no answer in {STOP_SERVICE_WAIT_S:g} s")
            return
        if not ready:
            _stop_service_lapsed(self.node.get_logger(), run, client, "the service is gone")
            return
        instruction = self.node.policy.instruction
        if instruction is None:      # the goal's run has not pinned its instruction yet: next tick
            return
        call = client.call_async(CheckSuccess.Request(instruction=instruction))
        self._success_call, self._success_call_t = call, time.monotonic()

        def done(fut, asked=instruction, for_run=run):
            self._success_call = None
            res = fut.result()
            policy = self.node.policy
            if res is not None and res.success and policy is not None and policy.instruction == asked:
                for_run.task_done = True

        call.add_done_callback(done)

    def publish_feedback(self) -> None:
        """The running goal's feedback; and its start marker again at each of
        START_MARKER_REPEAT_S into the run (see there)."""
        run = self.run
        if run is None or self.node.policy is None:
            return
        sent = run.start_marker_sent
        if (run.episode_started and 0 < sent <= len(START_MARKER_REPEAT_S)
                and time.monotonic() - run.start_marker_t >= START_MARKER_REPEAT_S[sent - 1]):
            run.start_marker_sent = sent + 1
            self.node._episode_pub.publish(String(data=run.start_marker))
        try:
            run.handle.publish_feedback(run.feedback())
        except Exception:  # noqa: BLE001 - the goal ended between the check and the publish
            pass


__all__ = ["GoalExecution", "PREEMPT_WAIT_S"]
