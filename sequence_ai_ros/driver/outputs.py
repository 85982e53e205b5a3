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

``trajectory_output: chunk`` (joint_trajectory_controller mode) sends each chunk as ONE
``JointTrajectory`` instead of one point per control tick, read with the controller's documented
semantics (ros2_controllers' trajectory replacement): ``time_from_start`` counts from
``header.stamp``; a new trajectory keeps the playing one up to its own start and replaces the rest.
A trajectory that starts at row ``k`` of the run is stamped with row ``k``'s due time ``T_k`` on
the gate's grid (ROS clock) and holds rows ``k, k+1, ...`` at ``time_from_start`` ``P, 2P, ...``
(``P`` the control period): row ``i`` is reached at ``T_i + P`` whichever trajectory carries it,
exactly as in row mode, so at a seam the old trajectory plays up to its last row and the new one
takes over from there (no row twice, none skipped). Rows go into a trajectory only when they are
exactly what the core will hand over: finite, inside ``joint_lower`` / ``joint_upper``, the
contract's ``bounds`` and its ``max_delta`` from the row before; the trajectory ends before the
first row that is not (the core clips or refuses that row; when it arrives, a new trajectory
starts from it). A row that differs from the playing trajectory's (a later clip, an aligned
merge) starts a new trajectory from it. With ``trajectory_velocities`` every point also carries
velocities from the rows (central differences, the row before the trajectory included; the last
point a backward difference), so the controller's cubic spline keeps the joint velocity
continuous across seams. The hold is a one-point trajectory stamped zero (start now: it replaces
whatever plays at once); a run that ends normally re-sends its trajectory cut at the last row
the core handed over, so nothing plays after the run. Delta and velocity chunks are never
changed: they go out row by row, as in row mode.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

from builtin_interfaces.msg import Duration, Time
from rclpy.duration import Duration as RclDuration
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from .. import codecs

__all__ = ["CommandOutputs", "Plan", "trajectory_message", "forward_message", "chunk_trajectory_message", "monotonic_to_ros",
           "row_velocities", "planned_rows"]


def _duration(seconds: float) -> Duration:
    ns = max(1, int(round(seconds * 1e9)))   # > 0: a trajectory point due "now" is a jump
    return Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def _time_msg(seconds: float) -> Time:
    ns = max(0, int(round(seconds * 1e9)))
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def chunk_trajectory_message(joints: Sequence[str], rows: Sequence[Sequence[float]], period_s: float,
                             stamp_s: Optional[float] = None,
                             velocities: Optional[Sequence[Sequence[float]]] = None) -> JointTrajectory:
    """A ``JointTrajectory`` over ``joints``: point ``j`` reaches ``rows[j]`` (rad, or m for a finger)
    at ``time_from_start`` ``(j + 1) * period_s`` (s) after ``header.stamp`` = ``stamp_s`` (ROS
    clock, s; None = zero: start on receipt); ``velocities`` (one list per row, units/s) or none."""
    points = []
    for j, row in enumerate(rows):
        point = JointTrajectoryPoint(positions=[float(v) for v in row], time_from_start=_duration((j + 1) * period_s))
        if velocities is not None:
            point.velocities = [float(v) for v in velocities[j]]
        points.append(point)
    msg = JointTrajectory(joint_names=list(joints), points=points)
    if stamp_s is not None:
        msg.header.stamp = _time_msg(stamp_s)
    return msg


def row_velocities(rows: Sequence[Sequence[float]], before: Optional[Sequence[float]],
                   period_s: float) -> List[List[float]]:
    """One velocity per row and dimension (units/s) from rows ``period_s`` apart: central
    differences, the first against ``before`` (the row played just before ``rows[0]``; None: a
    forward difference), the last a backward difference. One row: ``(rows[0] - before) /
    period_s``, zeros without ``before``."""
    n = len(rows)
    ext = ([list(before)] if before is not None else []) + [list(r) for r in rows]
    off = 1 if before is not None else 0
    out = []
    for j in range(n):
        i = j + off
        lo, hi = max(0, i - 1), min(len(ext) - 1, i + 1)
        if hi == lo:
            out.append([0.0] * len(ext[i]))
            continue
        dt = (hi - lo) * period_s
        out.append([(b - a) / dt for a, b in zip(ext[lo], ext[hi])])
    return out


def planned_rows(policy, chunk) -> List[List[float]]:
    """The rows the core will hand to ``act()`` from ``chunk``, read when it starts playing: its
    buffer's rows for it (seam ramp and aligned trim applied), else ``chunk.actions[:playable]``.

    The core clips each row into the declared limits when it hands it over; :class:`CommandOutputs`
    checks the planned rows against them and cuts a trajectory before a row the core would change.
    """
    engine = getattr(policy, "_engine", policy)
    entry = getattr(getattr(engine, "_buffer", None), "current", None)
    if entry is not None and getattr(entry, "chunk", None) is chunk:
        return [list(map(float, r)) for r in entry.rows[max(0, entry.next_row - 1):]]
    return [list(map(float, r)) for r in chunk.actions[: chunk.playable]]


@dataclass
class Plan:
    """A chunk about to play, for a chunk-native trajectory (see the module docstring).

    Attributes:
        rows: the rows the core will hand over, first one included.
        absolute: rows are targets (joint positions); False: delta / velocity rows, sent row by row.
        bounds: the contract's ``[[low, high], ...]`` per dimension, or None.
        max_delta: the contract's largest step (one number or one per dimension), or None.
    """

    rows: List[List[float]]
    absolute: bool = True
    bounds: Optional[List[List[float]]] = None
    max_delta: object = None


@dataclass
class _Playing:
    stamp_s: float                 # ROS seconds the trajectory starts at (its first row's due time)
    rows: List[List[float]]        # the rows it carries
    before: Optional[List[float]]  # the row played just before it (velocities), None after a gap
    sent: int = 1                  # rows whose slot has come (handed over by the core)
    absolute: bool = True
    limits: Optional[Plan] = None
    full: List[List[float]] = field(default_factory=list)   # the plan from its first row on, uncut


def _step_limit(max_delta, i: int) -> Optional[float]:
    if max_delta is None:
        return None
    if isinstance(max_delta, (list, tuple)):
        return abs(float(max_delta[i])) if i < len(max_delta) else None
    return abs(float(max_delta))


CLOCK_PAIR_WINDOW_S = 5e-5     # a ROS clock read bracketed by monotonic reads closer than this is taken
CLOCK_PAIR_TRIES = 5


def monotonic_to_ros(now_ros: Callable[[], float], t_monotonic: float) -> float:
    """``t_monotonic`` (``time.monotonic()`` s) on the ROS clock ``now_ros()`` reads (s).

    The two clocks are read as a pair: ``now_ros()`` between two monotonic reads, taken at their
    midpoint. A thread preempted between the reads would shift the result by the time it lost
    (5 ms and more on a loaded machine), so a pair wider than 50 us is read again, up to 5 times,
    and the narrowest one is used: the error is at most half its width."""
    best = None
    for _ in range(CLOCK_PAIR_TRIES):
        m0 = time.monotonic()
        ros = now_ros()
        m1 = time.monotonic()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, ros - (m0 + m1) / 2)
        if m1 - m0 <= CLOCK_PAIR_WINDOW_S:
            break
    return t_monotonic + best[1]


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
        #: chunk-native trajectories (joint_trajectory_controller mode, trajectory_output chunk)
        self.chunked = (p.command_mode == "joint_trajectory_controller"
                        and getattr(p, "trajectory_output", "rows") == "chunk")
        self._velocities = bool(getattr(p, "trajectory_velocities", False))
        self._playing: Optional[_Playing] = None
        self._last: Optional[tuple] = None    # (due monotonic s, row) of the last row handed over
        self.trajectories = 0                 # trajectories published (chunk mode; diagnostics)
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
            grip = self._grip(values)
            if p.gripper_output == "forward_command_controller":
                out.append((self._gripper, forward_message(grip)))
            else:
                out.append((self._gripper, trajectory_message(p.gripper_joints, grip, period)))
        return out

    def _grip(self, row: Sequence[float]) -> List[float]:
        return [float(row[self._n_arm]) * float(self._p.gripper_scale)] * len(self._p.gripper_joints)

    def plan(self, chunk, policy) -> Optional[Plan]:
        """The :class:`Plan` of a chunk that starts playing (chunk mode), else None.

        ``policy``: the ``sequence_ai.Policy`` playing it (its buffer and its contract's limits)."""
        if not self.chunked:
            return None
        action = None
        contract = getattr(policy, "contract", None)
        if contract:
            import sequence_ai

            action = sequence_ai.Contract.from_wire(contract).action
        return Plan(planned_rows(policy, chunk), absolute=bool(chunk.is_absolute),
                    bounds=getattr(action, "bounds", None), max_delta=getattr(action, "max_delta", None))

    def publish(self, values: Sequence[float], due: Optional[float] = None, plan: Optional[Plan] = None) -> None:
        """Publish one row (arm joints, then the gripper value when there is one).

        Chunk mode: ``due`` is the row's slot on the gate's grid (``time.monotonic()`` s; None =
        the hold, which replaces whatever plays at once); ``plan`` comes with a chunk's first row.
        A row already carried by the playing trajectory publishes nothing (a forward gripper
        still gets its value)."""
        if not self.chunked:
            for pub, msg in self.messages(values):
                pub.publish(msg)
            return
        row = [float(v) for v in values]
        if due is None:   # the hold: a one-point trajectory stamped zero, nothing plays after it
            self._playing, self._last = None, None
            for pub, msg in self.messages(row):
                pub.publish(msg)
            return
        self._publish_chunked(row, due, plan)

    def _publish_chunked(self, row: List[float], due: float, plan: Optional[Plan]) -> None:
        period = self._period_s()
        playing = self._playing
        before = None
        if self._last is not None and due - self._last[0] < 1.5 * period:
            before = self._last[1]        # contiguous: the row played just before this one
        self._last = (due, row)
        if plan is None and playing is not None and playing.sent < len(playing.rows) \
                and playing.rows[playing.sent] == row:
            playing.sent += 1             # already on its way in the playing trajectory
            self._forward_gripper(row)
            return
        if plan is not None:
            limits, tail, absolute = plan, plan.rows[1:], plan.absolute
        elif playing is not None:
            limits, absolute = playing.limits, playing.absolute
            tail = playing.full[playing.sent + 1:]
        else:
            limits, tail, absolute = None, [], True
        if not absolute:                  # delta / velocity rows: row by row, unchanged
            self._playing = _Playing(0.0, [row], before, 1, False, limits, [row] + list(tail))
            for pub, msg in self.messages(row):
                pub.publish(msg)
            return
        full = [row] + [list(r) for r in tail]
        rows = self._checked(full, limits)
        stamp_s = self._ros_seconds(due)
        self._playing = _Playing(stamp_s, rows, before, 1, True, limits, full)
        self._send(rows, stamp_s, before, period)
        self._forward_gripper(row)

    def _send(self, rows: List[List[float]], stamp_s: float, before, period: float, stop: bool = False) -> None:
        p = self._p
        arm = [r[: self._n_arm] for r in rows]
        vel = None
        if self._velocities:
            vel = row_velocities(arm, before[: self._n_arm] if before is not None else None, period)
            if stop:
                vel[-1] = [0.0] * len(vel[-1])
        self._arm.publish(chunk_trajectory_message(p.arm_joints, arm, period, stamp_s, vel))
        self.trajectories += 1
        if self._gripper is not None and p.gripper_output == "joint_trajectory_controller" \
                and all(len(r) > self._n_arm for r in rows):
            self._gripper.publish(chunk_trajectory_message(p.gripper_joints, [self._grip(r) for r in rows],
                                                           period, stamp_s))

    def _forward_gripper(self, row: List[float]) -> None:
        if self._gripper is not None and self._p.gripper_output == "forward_command_controller" \
                and len(row) > self._n_arm:
            self._gripper.publish(forward_message(self._grip(row)))

    def _checked(self, rows: List[List[float]], limits: Optional[Plan]) -> List[List[float]]:
        """``rows`` up to (not including) the first one the core would clip or the driver refuse;
        ``rows[0]`` is the row the core handed over (already checked)."""
        p = self._p
        lower, upper = p.joint_lower or [], p.joint_upper or []
        bounds = (limits.bounds if limits is not None else None) or []
        max_delta = limits.max_delta if limits is not None else None
        out = rows[:1]
        for row in rows[1:]:
            prev = out[-1]
            for i, v in enumerate(row):
                md = _step_limit(max_delta, i)
                if (not math.isfinite(v) or (i < len(lower) and v < lower[i]) or (i < len(upper) and v > upper[i])
                        or (i < len(bounds) and not float(bounds[i][0]) <= v <= float(bounds[i][1]))
                        or (md is not None and i < len(prev) and (v > prev[i] + md or v < prev[i] - md))):
                    return out
            out.append(row)
        return out

    def _ros_seconds(self, due: float) -> float:
        """``due`` (``time.monotonic()`` s) on the node's ROS clock (s)."""
        return monotonic_to_ros(lambda: self._node.get_clock().now().nanoseconds * 1e-9, due)

    def end(self) -> None:
        """A run ended normally (chunk mode): a playing trajectory that carries rows the core did
        not hand over is re-sent cut at the last one (same stamp, velocity zero there), so nothing
        plays after the run."""
        playing, self._playing, self._last = self._playing, None, None
        if not self.chunked or playing is None or not playing.absolute or playing.sent >= len(playing.rows):
            return
        self._send(playing.rows[: playing.sent], playing.stamp_s, playing.before, self._period_s(), stop=True)

    def wait_delivered(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s`` s in all) until every command published so far -- the hold
        above all -- is acknowledged by the controllers subscribed (reliable QoS); True when it is.
        A process about to exit calls it, since DDS sends in the background and drops what is
        still unsent when the process ends."""
        deadline = time.monotonic() + timeout_s
        delivered = True
        for pub in list(self._pubs):
            left = max(0.0, deadline - time.monotonic())
            try:
                delivered = pub.wait_for_all_acked(RclDuration(nanoseconds=int(left * 1e9))) and delivered
            except Exception:  # noqa: BLE001 - destroyed meanwhile (the context is going away)
                return False
        return delivered

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
