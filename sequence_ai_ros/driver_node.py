"""``policy_driver``: drives a robot with a deployed policy, as a ROS 2 node.

The whole data path passes through here, in order:

1. subscriptions keep the latest camera frames and joint state (``observation.py``);
2. an ``Act`` goal (``sequence_ai_msgs/action/Act``, what a VLM calls as a tool) starts
   ``Policy.act()`` from ``sequence_ai`` -- the core fetches action chunks from the worker's
   ``/act``, prefetches the next while one plays, and paces actions on the monotonic clock at
   the chunk's control frequency;
3. each action is published as a joint-position command (``std_msgs/Float64MultiArray``, the
   input of a ros2_control forward position controller).

Stopping: cancelling the goal calls ``Policy.interrupt()``; the core unwinds through ``hold``,
which publishes the last commanded position once and latches the publisher shut, so no command
can follow the hold. Every early ending (cancel, validate, error, timeout) goes through ``hold``.
"""
from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

import sequence_ai
from sequence_ai_msgs.action import Act
from sequence_ai_msgs.srv import CheckSuccess

from .observation import ObservationAssembler

_PARAMS = {
    # name: (default, description)
    "model": ("pick-place", "Deployment name to connect to (sequence_ai.connect(model=...))."),
    "gateway_url": ("", "Gateway URL; empty = $SEQUENCES_GATEWAY_URL or http://127.0.0.1:8470."),
    "api_key_env": ("SEQUENCES_API_KEY", "Name of the environment variable holding the API key (never the key itself)."),
    "camera_views": (["exterior_1", "wrist_left"], "Camera view names, in the policy's vocabulary."),
    "camera_topics": (
        ["camera/exterior_1/image_raw", "camera/wrist_left/image_raw"],
        "sensor_msgs/Image topic per camera view, same order as camera_views.",
    ),
    "joint_state_topic": ("joint_states", "sensor_msgs/JointState topic."),
    "joint_names": (
        ["panda_joint1", "panda_joint2", "panda_joint3", "panda_joint4", "panda_joint5", "panda_joint6", "panda_joint7"],
        "Arm joints in the policy's joint_positions order.",
    ),
    "gripper_joint": ("panda_gripper", "JointState name carrying the gripper value; empty = none."),
    "command_topic": ("joint_commands", "std_msgs/Float64MultiArray joint-position command topic."),
    "max_sensor_age_s": (0.5, "A frame or joint state older than this (s) stops the run with a hold."),
    "sensor_wait_s": (10.0, "How long a goal waits for the first frames and joint state (s)."),
    "default_max_seconds": (60.0, "Time bound used when a goal's max_seconds is 0 (s); must be > 0."),
    "prefetch": (True, "Request the next chunk while the current one plays."),
    "lookahead": (1, "Chunks held ahead in the buffer."),
    "smooth_seam": (0, "Ramp the first N steps of each new chunk out of the last action (absolute spaces only)."),
    "joint_lower": (Parameter.Type.DOUBLE_ARRAY, "Lower bound per command dimension for validate (rad / gripper units); empty = none."),
    "joint_upper": (Parameter.Type.DOUBLE_ARRAY, "Upper bound per command dimension for validate; empty = none."),
    "feedback_every": (5, "Publish Act feedback every N actions."),
    "success_service": (
        "",
        "Optional sequence_ai_msgs/srv/CheckSuccess service polled during a run; success ends it "
        "early with reason 'until'. Empty = run until max_seconds.",
    ),
    "success_poll_hz": (2.0, "How often the success service is asked during a run (Hz)."),
}


@dataclass
class RunTrace:
    """What one goal commanded: for plots and tests.

    ``commands``: (monotonic time s, 8 values) per published command; ``seams``: index into
    ``commands`` where each chunk started; ``hold_time``: monotonic time of the hold, if any.
    """

    commands: list = field(default_factory=list)
    seams: list = field(default_factory=list)
    hold_time: Optional[float] = None
    hold_command: Optional[list] = None


class PolicyDriver(Node):
    """Drives a robot from ``Act`` goals with a deployed policy (see the module docstring)."""

    def __init__(self, node_name: str = "policy_driver", **kwargs) -> None:
        super().__init__(node_name, **kwargs)
        for name, (default, description) in _PARAMS.items():
            self.declare_parameter(name, default, ParameterDescriptor(description=description))
        p = {name: self.get_parameter(name).value for name in _PARAMS}
        self._p = p
        views, topics = list(p["camera_views"]), list(p["camera_topics"])
        if len(views) != len(topics):
            raise ValueError(f"camera_views has {len(views)} entries but camera_topics has {len(topics)}")
        if p["default_max_seconds"] <= 0:
            raise ValueError("default_max_seconds must be > 0: every run is bounded")
        self._lower = list(p["joint_lower"] or []) or None   # typed, unset by default
        self._upper = list(p["joint_upper"] or []) or None

        self.assembler = ObservationAssembler(
            views, p["joint_names"], p["gripper_joint"] or None, max_age_s=float(p["max_sensor_age_s"])
        )
        sensors = MutuallyExclusiveCallbackGroup()
        for view, topic in zip(views, topics):
            self.create_subscription(
                Image, topic, lambda msg, v=view: self.assembler.on_image(v, msg), qos_profile_sensor_data,
                callback_group=sensors,
            )
        self.create_subscription(JointState, p["joint_state_topic"], self._on_joint_state, 10, callback_group=sensors)
        self._cmd_pub = self.create_publisher(Float64MultiArray, p["command_topic"], 10)

        api_key = os.environ.get(p["api_key_env"]) or None
        self.policy = sequence_ai.connect(
            p["model"], api_key=api_key, gateway_url=p["gateway_url"] or None
        )
        self.policy.__enter__()

        self._pub_lock = threading.Lock()
        self._latched = True           # no command before a run starts, none after its hold
        self._last_command: Optional[list] = None
        self._goal_handle = None
        self._busy = threading.Lock()
        self.trace = RunTrace()
        self._instruction: Optional[str] = None   # set while a run is active
        self._task_done = False
        self._success_client = None
        self._success_call = None
        if p["success_service"]:
            group = MutuallyExclusiveCallbackGroup()
            self._success_client = self.create_client(CheckSuccess, p["success_service"], callback_group=group)
            self.create_timer(1.0 / float(p["success_poll_hz"]), self._poll_success, callback_group=group)
        self._action_server = ActionServer(
            self, Act, "~/act",
            execute_callback=self._execute,
            goal_callback=self._on_goal,
            cancel_callback=self._on_cancel,
            callback_group=ReentrantCallbackGroup(),
        )

    # -- sensors --------------------------------------------------------------------------
    def _on_joint_state(self, msg: JointState) -> None:
        try:
            self.assembler.on_joint_state(msg)
        except ValueError as exc:
            self.get_logger().error(str(exc), throttle_duration_sec=5.0)

    def _poll_success(self) -> None:
        """Ask the success service (never blocks: the answer lands in a done-callback)."""
        instruction = self._instruction
        if instruction is None or self._task_done or self._success_call is not None:
            return
        if not self._success_client.service_is_ready():
            return
        call = self._success_client.call_async(CheckSuccess.Request(instruction=instruction))
        self._success_call = call

        def done(fut, asked=instruction):
            self._success_call = None
            res = fut.result()
            if res is not None and res.success and self._instruction == asked:
                self._task_done = True

        call.add_done_callback(done)

    # -- the three callbacks handed to the core -------------------------------------------------
    def _send(self, action) -> None:
        """Publish one action (7 joint targets rad + gripper) unless a hold has latched."""
        values = [float(x) for x in action]
        with self._pub_lock:
            if self._latched:
                return
            self._cmd_pub.publish(Float64MultiArray(data=values))
            self._last_command = values
            self.trace.commands.append((time.monotonic(), values))
        gh = self._goal_handle
        n = len(self.trace.commands)
        if gh is not None and n % max(1, int(self._p["feedback_every"])) == 0:
            fb = Act.Feedback()
            fb.actions = n
            fb.chunks = len(self.trace.seams)
            fb.elapsed_s = time.monotonic() - self._run_t0
            fb.progress = float(min(1.0, fb.elapsed_s / self._run_max_s))
            gh.publish_feedback(fb)

    def _hold(self) -> None:
        """Publish the last commanded position once, then latch: nothing is published after."""
        with self._pub_lock:
            if self._latched:
                return
            self._latched = True
            target = self._last_command
            if target is None:  # stopped before the first action: hold where the arm is
                q = self.assembler.latest_joint_positions()
                g = self.assembler.latest_gripper()
                target = None if q is None else q + ([g] if g is not None else [])
            if target is not None:
                self._cmd_pub.publish(Float64MultiArray(data=target))
            self.trace.hold_time = time.monotonic()
            self.trace.hold_command = target

    def _validate(self, action) -> bool:
        """Finite and inside the configured per-dimension bounds."""
        if not all(math.isfinite(float(x)) for x in action):
            return False
        if self._lower is not None and any(x < lo for x, lo in zip(action, self._lower)):
            return False
        if self._upper is not None and any(x > hi for x, hi in zip(action, self._upper)):
            return False
        return True

    def _on_chunk(self, chunk, first_action_index) -> None:
        self.trace.seams.append(len(self.trace.commands))

    # -- the Act action ---------------------------------------------------------------------
    def _on_goal(self, goal_request) -> GoalResponse:
        if self._busy.locked():
            self.get_logger().warning("rejected Act goal: a run is already active")
            return GoalResponse.REJECT
        if not goal_request.instruction.strip():
            self.get_logger().warning("rejected Act goal: empty instruction")
            return GoalResponse.REJECT
        if not (goal_request.max_seconds >= 0 and math.isfinite(goal_request.max_seconds)):
            self.get_logger().warning(f"rejected Act goal: max_seconds={goal_request.max_seconds}")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_cancel(self, goal_handle) -> CancelResponse:
        self.policy.interrupt()  # thread-safe; the loop stops within one control period
        return CancelResponse.ACCEPT

    def _wait_for_sensors(self) -> bool:
        deadline = time.monotonic() + float(self._p["sensor_wait_s"])
        while not self.assembler.ready():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _execute(self, goal_handle):
        goal = goal_handle.request
        result = Act.Result()
        with self._busy:
            max_s = goal.max_seconds if goal.max_seconds > 0 else float(self._p["default_max_seconds"])
            if not self._wait_for_sensors():
                result.reason, result.message = "error", (
                    f"no camera/joint data within {self._p['sensor_wait_s']} s: check the topic parameters"
                )
                goal_handle.abort()
                return result
            self.trace = RunTrace()
            self._goal_handle, self._run_t0, self._run_max_s = goal_handle, time.monotonic(), max_s
            with self._pub_lock:
                self._latched, self._last_command = False, None
            self._task_done, self._instruction = False, goal.instruction
            until = (lambda: self._task_done) if self._success_client is not None else None
            try:
                outcome = self.policy.act(
                    goal.instruction,
                    observe=lambda: self.assembler.build(goal.instruction),
                    act=self._send,
                    max_seconds=max_s,
                    until=until,
                    validate=self._validate,
                    hold=self._hold,
                    prefetch=bool(self._p["prefetch"]),
                    lookahead=int(self._p["lookahead"]),
                    smooth_seam=int(self._p["smooth_seam"]),
                    on_chunk=self._on_chunk,
                    progress=False,
                )
            except Exception as exc:  # the core already ran hold; report, do not crash the node
                self._hold()
                self.get_logger().error(f"Act goal failed: {type(exc).__name__}: {exc}")
                result.reason, result.message = "error", f"{type(exc).__name__}: {exc}"
                goal_handle.abort()
                return result
            finally:
                self._goal_handle, self._instruction = None, None
                with self._pub_lock:
                    self._latched = True  # nothing is published between runs
            _fill_result(result, outcome)
            if outcome.reason == "interrupted" and goal_handle.is_cancel_requested:
                goal_handle.canceled()
            else:
                goal_handle.succeed()
            self.get_logger().info(f"Act '{goal.instruction}': {outcome!r}")
            return result

    def destroy_node(self) -> None:
        try:
            self.policy.interrupt()
            self.policy.__exit__(None, None, None)
        finally:
            self._action_server.destroy()
            super().destroy_node()


def _fill_result(result, outcome) -> None:
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


def main(args=None) -> int:
    """``ros2 run sequence_ai policy_driver``: spin until Ctrl-C, then shut down cleanly."""
    rclpy.init(args=args)
    node = None
    executor = MultiThreadedExecutor(num_threads=4)
    try:
        node = PolicyDriver()
        executor.add_node(node)
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.policy.interrupt()
        executor.shutdown()
        if node is not None:
            node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
