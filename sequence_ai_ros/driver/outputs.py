"""Command outputs: one action row (arm joints + gripper) -> the messages the robot takes.

``command_mode`` picks the arm output:

* ``joint_commands`` (default): one message on ``command_topic`` holding the whole row, encoded
  by ``command_type`` (``std_msgs/Float64MultiArray`` of len(joint_names) + 1 values,
  ``trajectory_msgs/JointTrajectory``, ``sensor_msgs/JointState`` or a registered encoder). The
  demo, the simulated cell and the capture recorder use it.
* ``forward_command_controller``: ``<arm_controller>/commands``, ``std_msgs/Float64MultiArray``
  with exactly ``len(arm_joints)`` values -- ros2_control's forward controllers refuse any other
  size ("command size (8) does not match number of interfaces (7)").
* ``joint_trajectory_controller``: ``<arm_controller>/joint_trajectory``, one
  ``trajectory_msgs/JointTrajectory`` per row that the controller's default settings accept:
  ``joint_names`` = ``arm_joints`` (all of them: ``allow_partial_joints_goal`` is false by
  default), one point with ``positions`` for every joint and empty velocities / accelerations /
  effort, ``time_from_start`` one control period (> 0), ``header.stamp`` zero ("start now": a
  non-zero stamp whose end has passed is refused).

With a controller arm output, ``gripper_output`` sends the gripper value (x ``gripper_scale``)
to ``<gripper_controller>/commands`` (forward, one value per ``gripper_joints`` entry) or
``<gripper_controller>/joint_trajectory`` (trajectory over ``gripper_joints``), or nowhere
(``none``). Topic names are relative: a namespace moves them with the controllers.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

from builtin_interfaces.msg import Duration
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from .. import codecs

__all__ = ["CommandOutputs", "trajectory_message", "forward_message"]


def _duration(seconds: float) -> Duration:
    ns = max(1, int(round(seconds * 1e9)))   # > 0: a trajectory point due "now" is a jump
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def forward_message(values: Sequence[float]) -> Float64MultiArray:
    """A forward_command_controller command: ``data`` = ``values`` (one per controller joint)."""
    return Float64MultiArray(data=[float(v) for v in values])


def trajectory_message(joints: Sequence[str], positions: Sequence[float], period_s: float) -> JointTrajectory:
    """A one-point ``JointTrajectory`` over ``joints`` reaching ``positions`` (rad, or m for a
    finger) ``period_s`` seconds from now (header stamp zero = start on receipt)."""
    point = JointTrajectoryPoint(positions=[float(v) for v in positions], time_from_start=_duration(period_s))
    return JointTrajectory(joint_names=list(joints), points=[point])


class CommandOutputs:
    """The publishers for one configuration and :meth:`publish` for one row.

    Args:
        node: the rclpy node that owns the publishers.
        p: the driver's :class:`~sequence_ai_ros.driver.params.Params`.
        period_s: ``period_s()`` -> the control period (s), read at each publish.
        stamp: ``stamp()`` -> a ``builtin_interfaces/Time`` for encoders that stamp their header.
    Raises:
        ValueError: ``command_type`` names no registered encoder (joint_commands mode).
    """

    def __init__(self, node, p, period_s: Callable[[], float], stamp: Callable[[], object]) -> None:
        self._node = node
        self._p = p
        self._period_s = period_s
        self._stamp = stamp
        self._n_arm = len(p.joint_names)
        self._pubs: List[object] = []
        self.topics: List[str] = []           # resolved names, for the log and the episode marker
        self._arm = self._gripper = None
        if p.command_mode == "joint_commands":
            self._encoder = codecs.command_encoder(str(p.command_type))
            self._names = list(p.command_joint_names or []) or (
                list(p.joint_names) + ([p.gripper_joint] if p.gripper_joint else []))
            self._arm = self._publisher(codecs.message_class(self._encoder.msg_type), p.command_topic)
            return
        arm_kind = "commands" if p.command_mode == "forward_command_controller" else "joint_trajectory"
        arm_type = Float64MultiArray if arm_kind == "commands" else JointTrajectory
        self._arm = self._publisher(arm_type, f"{p.arm_controller}/{arm_kind}")
        if p.gripper_output != "none" and p.gripper_joint:
            grip_kind = "commands" if p.gripper_output == "forward_command_controller" else "joint_trajectory"
            grip_type = Float64MultiArray if grip_kind == "commands" else JointTrajectory
            self._gripper = self._publisher(grip_type, f"{p.gripper_controller}/{grip_kind}")

    def _publisher(self, msg_type, topic: str):
        pub = self._node.create_publisher(msg_type, topic, 10)
        self._pubs.append(pub)
        self.topics.append(self._node.resolve_topic_name(topic))
        return pub

    def messages(self, values: Sequence[float]) -> List[tuple]:
        """``[(publisher, message)]`` for one row (arm first), without publishing."""
        p = self._p
        period = self._period_s()
        if p.command_mode == "joint_commands":
            msg = self._encoder.encode(values, self._names, period, p.command_interface, self._stamp())
            return [(self._arm, msg)]
        arm = list(values[: self._n_arm])
        if p.command_mode == "forward_command_controller":
            out = [(self._arm, forward_message(arm))]
        else:
            out = [(self._arm, trajectory_message(p.arm_joints, arm, period))]
        if self._gripper is not None and len(values) > self._n_arm:
            g = float(values[self._n_arm]) * float(p.gripper_scale)
            grip = [g] * len(p.gripper_joints)
            if p.gripper_output == "forward_command_controller":
                out.append((self._gripper, forward_message(grip)))
            else:
                out.append((self._gripper, trajectory_message(p.gripper_joints, grip, period)))
        return out

    def publish(self, values: Sequence[float]) -> None:
        """Publish one row (arm joints, then the gripper value when there is one)."""
        for pub, msg in self.messages(values):
            pub.publish(msg)

    def destroy(self) -> None:
        """Destroy the publishers (cleanup)."""
        for pub in self._pubs:
            self._node.destroy_publisher(pub)
        self._pubs.clear()

    @staticmethod
    def describe(p) -> Optional[str]:
        """One line naming where commands go, for the log."""
        if p.command_mode == "joint_commands":
            return f"{p.command_type} on {p.command_topic}"
        grip = "" if p.gripper_output == "none" else f", gripper -> {p.gripper_controller} ({p.gripper_output})"
        return f"{p.command_mode} {p.arm_controller} over {list(p.arm_joints)}{grip}"
