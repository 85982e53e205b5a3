"""``~/start_policy`` and ``~/cancel_policy``: the Act action for clients that cannot call actions.

A ``~/start_policy`` request is an Act goal without an action client: it passes the same checks
(:meth:`~.execution.GoalExecution.refusal`, and the operator), and once accepted it is handed to
the same :class:`~.execution.GoalExecution` as an Act goal, through :class:`ServiceGoal`, a goal
handle of our own. So it gets the same run slot, preemption (``goal_policy``), bounds, validate,
camera freshness, interrupt and hold, and the same result, published as a
``sequence_ai_msgs/msg/RunOutcome`` on ``~/outcome`` (``run_id`` set; transient-local, so a
client that subscribes late still reads the last ones) when the run ends.

``~/cancel_policy`` stops a run as an Act cancel does (hold within one control period, nothing
sent after) and answers with its outcome once it has unwound. Who may call them: anyone on the
ROS graph who may send the Act goal (the same trust: the driver's domain / namespace).
"""
from __future__ import annotations

import threading
import time
import uuid
from typing import Dict, Optional

from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.qos import DurabilityPolicy, QoSProfile

from unique_identifier_msgs.msg import UUID

from sequence_ai_msgs.action import Act
from sequence_ai_msgs.msg import RunOutcome
from sequence_ai_msgs.srv import CancelPolicy, StartPolicy

from .goal import OPERATOR_MESSAGE

__all__ = ["PolicyServices", "ServiceGoal", "CANCEL_WAIT_S"]

CANCEL_WAIT_S = 10.0
"""How long ``~/cancel_policy`` waits for the stopped run to unwind before it answers (s)."""
_KEEP = 32   # outcomes kept for cancel_policy answers about runs that already ended


def outcome_message(result, run_id: str) -> RunOutcome:
    """A ``RunOutcome`` message with the fields of an ``Act.Result`` (same names) and ``run_id``."""
    msg = RunOutcome()
    for name in RunOutcome.get_fields_and_field_types():
        if hasattr(result, name):
            setattr(msg, name, getattr(result, name))
    msg.run_id = run_id
    return msg


class ServiceGoal:
    """A goal handle for a run started by ``~/start_policy``: what :class:`GoalExecution` asks of
    rclpy's ``ServerGoalHandle`` (request, goal_id, is_active, is_cancel_requested, execute,
    succeed / abort / canceled, publish_feedback), with the run executed on a thread of its own."""

    def __init__(self, request, run_id: str, execute, finished) -> None:
        self.request = request
        self.goal_id = UUID(uuid=list(bytes.fromhex(run_id)))   # as an Act goal's (the bag's goal_id)
        self.run_id = run_id
        self.is_active = True
        self.is_cancel_requested = False
        self.status = ""
        self.outcome: Optional[RunOutcome] = None
        self.done = threading.Event()
        self._execute, self._finished = execute, finished

    def execute(self) -> None:
        threading.Thread(target=self._run, name=f"start_policy-{self.run_id}", daemon=True).start()

    def _run(self) -> None:
        try:
            result = self._execute(self)
            self.outcome = outcome_message(result, self.run_id)
            self._finished(self)
        finally:
            self.is_active = False
            self.done.set()

    def succeed(self) -> None:
        self.status, self.is_active = "succeeded", False

    def abort(self) -> None:
        self.status, self.is_active = "aborted", False

    def canceled(self) -> None:
        self.status, self.is_active = "canceled", False

    def publish_feedback(self, feedback) -> None:
        """No feedback channel without an action: ``~/status`` carries the run's figures."""


class PolicyServices:
    """The two services and the ``~/outcome`` publisher of one driver node."""

    def __init__(self, node) -> None:
        self.node = node
        group = ReentrantCallbackGroup()   # cancel waits for the run to unwind: a thread of its own
        node.blocking_callback_groups.append(group)
        self._lock = threading.Lock()
        self._runs: Dict[str, ServiceGoal] = {}
        qos = QoSProfile(depth=10, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self._outcome_pub = node.create_publisher(RunOutcome, "~/outcome", qos)
        node.create_service(StartPolicy, "~/start_policy", self._on_start, callback_group=group)
        node.create_service(CancelPolicy, "~/cancel_policy", self._on_cancel, callback_group=group)

    def _on_start(self, request, response):
        goal = Act.Goal(instruction=request.instruction, max_seconds=request.max_seconds,
                        params_json=request.params_json, stop_when=request.stop_when)
        why = ("operator", OPERATOR_MESSAGE) if self.node.operator.active else self.node.goals.refusal(goal)
        if why is not None:
            response.accepted, (response.reason, response.message) = False, why
            self.node.get_logger().warning(f"refused ~/start_policy ({why[0]}): {why[1]}")
            return response
        run_id = uuid.uuid4().hex
        handle = ServiceGoal(goal, run_id, self.node.goals.execute, self._finished)
        with self._lock:
            self._runs[run_id] = handle
            for old in list(self._runs)[:-_KEEP]:
                del self._runs[old]
        self.node.goals.on_accepted(handle)   # preempts an older run as an Act goal would, then executes
        response.accepted, response.reason, response.message, response.run_id = True, "", "started", run_id
        return response

    def _finished(self, handle: ServiceGoal) -> None:
        try:
            self._outcome_pub.publish(handle.outcome)
        except Exception:  # noqa: BLE001 - the context is going away
            pass

    def _on_cancel(self, request, response):
        run_id = request.run_id.strip()
        with self._lock:
            handle = self._runs.get(run_id) if run_id else None
        if run_id and handle is None:
            response.stopped, response.message = False, f"no run {run_id!r} was started here"
            return response
        if handle is not None:
            ended = self._cancel_one(handle, response, time.monotonic() + CANCEL_WAIT_S)
        else:   # "" = every run accepted here, an Act goal's too, and one still waiting to preempt the running one
            runs = self.node.goals.accepted_runs()
            if not runs:
                response.stopped, response.message = False, "no run is active"
                return response
            deadline = time.monotonic() + CANCEL_WAIT_S
            ended = all([self._cancel_one(run.handle, response, deadline) for run in reversed(runs)])
        response.stopped = bool(ended)
        response.message = "stopped: the robot held" if ended else f"the run did not unwind within {CANCEL_WAIT_S:g} s"
        return response

    def _cancel_one(self, handle, response, deadline: float) -> bool:
        """Stop one accepted run (a run started here or an Act goal) and wait for it until
        ``deadline`` (monotonic s); True once it ended. The response's outcome is the first one
        stopped (the newest, when ``""`` stops several)."""
        if isinstance(handle, ServiceGoal):
            if handle.is_active:
                handle.is_cancel_requested = True
                self.node.goals.on_cancel(handle)
            ended = handle.done.wait(max(0.0, deadline - time.monotonic()))
            if handle.outcome is not None and not response.outcome.reason:
                response.outcome = handle.outcome
            return ended
        # an Act goal: it aborts with this message (its own client did not cancel it)
        run = self.node.goals._goal_run(handle)
        run.request_end("cancelled", "stopped by ~/cancel_policy")
        ended = run.ended.wait(max(0.0, deadline - time.monotonic()))
        last = self.node.goals.last_outcome
        if last is not None and not response.outcome.reason:
            response.outcome.reason = str(last.reason)
        return ended
