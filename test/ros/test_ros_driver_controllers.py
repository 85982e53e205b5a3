"""policy_driver commands sized for ros2_control, checked against what the controllers accept.

The checks below restate the controllers' documented input rules (ros2_controllers, Jazzy):

* forward_command_controller (``forward_controllers_base.cpp``): a ``std_msgs/Float64MultiArray``
  on ``~/commands`` whose ``data`` size differs from the number of its interfaces (one per joint)
  is refused: "command size (%zu) does not match number of interfaces (%zu)".
* joint_trajectory_controller (``validate_trajectory_msg`` with the default parameters
  ``allow_partial_joints_goal: false``, ``allow_integration_in_goal_trajectories: false``):
  ``joint_names`` non-empty, exactly the controller's joints (as many, each one of them);
  ``header.stamp`` zero, or the trajectory must not end in the past; ``time_from_start``
  strictly increasing; per point ``positions`` one per joint, ``velocities`` /
  ``accelerations`` / ``effort`` empty or one per joint.

A fake controller node (real rclpy subscriptions) applies them to every message the driver
publishes; the driver runs against a real gateway + echo-policy worker.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
import yaml
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.node import Node
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from sequence_ai_msgs.action import Act
from sequence_ai_ros.driver_node import _PARAMS, PolicyDriver
from sequence_ai_ros.driver.params import FR3_ARM_JOINTS
from _ros_driver_support import FakeRobot, Goal, driver_params, duration_s, echo_server, jtc_refusal, ros, wait  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
FINGER = ["fr3_finger_joint1"]


def forward_controller_refusal(msg, joints):
    """None when a forward_command_controller over ``joints`` takes ``msg``, else its complaint."""
    if len(msg.data) != len(joints):
        return f"command size ({len(msg.data)}) does not match number of interfaces ({len(joints)})"
    return None


def test_the_checks_refuse_what_the_controllers_refuse():
    """The two checks can fail: today's 8-wide joint_commands row and a velocity-only point."""
    assert forward_controller_refusal(Float64MultiArray(data=[0.0] * 8), FR3_ARM_JOINTS) == \
        "command size (8) does not match number of interfaces (7)"
    velocity_only = JointTrajectory(joint_names=list(FR3_ARM_JOINTS),
                                    points=[JointTrajectoryPoint(velocities=[0.0] * 7)])
    assert "positions (0)" in jtc_refusal(velocity_only, FR3_ARM_JOINTS, time.time())
    with_gripper = JointTrajectory(joint_names=list(FR3_ARM_JOINTS) + ["panda_gripper"],
                                   points=[JointTrajectoryPoint(positions=[0.0] * 8)])
    assert "don't match" in jtc_refusal(with_gripper, FR3_ARM_JOINTS, time.time())


class FakeControllers(Node):
    """Subscribes where ros2_control controllers listen and records (arrival s, message, refusal)."""

    def __init__(self, context, arm_kind, grip_kind):
        super().__init__("fake_controllers", context=context)
        self.arm, self.gripper = [], []
        arm_type = Float64MultiArray if arm_kind == "commands" else JointTrajectory
        self.create_subscription(arm_type, f"fr3_arm_controller/{arm_kind}",
                                 lambda m: self.arm.append((time.monotonic(), m, self._check(m, FR3_ARM_JOINTS))), 100)
        if grip_kind:
            grip_type = Float64MultiArray if grip_kind == "commands" else JointTrajectory
            self.create_subscription(grip_type, f"fr3_gripper_controller/{grip_kind}",
                                     lambda m: self.gripper.append((time.monotonic(), m, self._check(m, FINGER))), 100)

    def _check(self, msg, joints):
        if isinstance(msg, Float64MultiArray):
            return forward_controller_refusal(msg, joints)
        return jtc_refusal(msg, joints, self.get_clock().now().nanoseconds * 1e-9)


def _values(msg):
    return list(msg.data) if isinstance(msg, Float64MultiArray) else list(msg.points[0].positions)


def _run(ros, echo_server, arm_kind, grip_kind, **params):
    robot = ros.add(FakeRobot(ros.ctx))
    controllers = ros.add(FakeControllers(ros.ctx, arm_kind, grip_kind))
    driver = ros.add(PolicyDriver(context=ros.ctx, parameter_overrides=driver_params(echo_server, **params)))
    client = ActionClient(ros.add(rclpy.create_node("act_client", context=ros.ctx)), Act, "policy_driver/act")
    ros.start()
    assert client.wait_for_server(timeout_sec=20.0)
    wait(driver.assembler.ready, 20.0, "sensors")
    goal = Goal(client, max_seconds=20.0)
    wait(lambda: len(controllers.arm) >= 10, 15.0, "arm commands at the controller")
    goal.handle.cancel_goal_async()
    wrapped = goal.wait_result()
    time.sleep(0.6)
    assert wrapped.status == GoalStatus.STATUS_CANCELED
    assert robot.commands == []                     # nothing on the 8-wide joint_commands topic
    return driver, controllers, wrapped.result


@pytest.mark.parametrize("grip", ["forward_command_controller", "joint_trajectory_controller"])
def test_forward_command_controller_gets_one_value_per_arm_joint_and_the_gripper_its_own(ros, echo_server, grip):
    grip_kind = "commands" if grip == "forward_command_controller" else "joint_trajectory"
    driver, ctl, res = _run(ros, echo_server, "commands", grip_kind, command_mode="forward_command_controller",
                            arm_controller="fr3_arm_controller", gripper_output=grip,
                            gripper_controller="fr3_gripper_controller", gripper_scale=0.04)
    assert [r for _, _, r in ctl.arm + ctl.gripper if r is not None] == []
    assert all(len(m.data) == 7 for _, m, _ in ctl.arm)
    assert len(ctl.arm) == res.actions + 1 and len(ctl.gripper) == res.actions + 1     # every row + the hold
    sent = [v for _, v in driver.trace.commands]
    np.testing.assert_allclose([_values(m) for _, m, _ in ctl.arm[:-1]], [row[:7] for row in sent])
    np.testing.assert_allclose([_values(m) for _, m, _ in ctl.gripper[:-1]], [[row[7] * 0.04] for row in sent])
    assert _values(ctl.arm[-1][1]) == pytest.approx(_values(ctl.arm[-2][1]))        # the hold: the last command


def test_joint_trajectory_controller_gets_valid_trajectories_under_its_defaults(ros, echo_server):
    driver, ctl, res = _run(ros, echo_server, "joint_trajectory", None, command_mode="joint_trajectory_controller",
                            arm_controller="fr3_arm_controller")
    assert [r for _, _, r in ctl.arm if r is not None] == []
    assert len(ctl.arm) == res.actions + 1
    for _, msg, _ in ctl.arm:
        assert list(msg.joint_names) == FR3_ARM_JOINTS
        (point,) = msg.points
        assert len(point.positions) == 7 and not len(point.velocities) and not len(point.effort)
        assert duration_s(point.time_from_start) == pytest.approx(1.0 / 15.0, abs=1e-6)
    sent = [v for _, v in driver.trace.commands]
    np.testing.assert_allclose([_values(m) for _, m, _ in ctl.arm[:-1]], [row[:7] for row in sent])


@pytest.mark.parametrize("bad, says", [
    (dict(command_mode="forward_command_controller", arm_joints=FR3_ARM_JOINTS[:6]),
     "arm_joints has 6 names but the policy commands 7 arm joints"),
    (dict(command_mode="joint_trajectory_controller", command_interface="velocity"),
     "needs command_interface position"),
    (dict(hold_mode="zeros"), "hold_mode zeros commands 0 to the arm joints"),
])
def test_an_output_that_cannot_fit_the_controller_is_refused_at_start(ros, echo_server, bad, says):
    with pytest.raises(ValueError, match=says):
        PolicyDriver(context=ros.ctx, parameter_overrides=driver_params(echo_server, **bad))


@pytest.mark.parametrize("name, arm_kind, grip_kind", [
    ("fr3_forward.yaml", "commands", "commands"),
    ("fr3_jtc.yaml", "joint_trajectory", "joint_trajectory"),
])
def test_fr3_configs_wire_the_controllers(name, arm_kind, grip_kind):
    text = (ROOT / "config" / name).read_text()
    params = yaml.safe_load(text)["/**"]["ros__parameters"]
    assert set(params) <= set(_PARAMS), set(params) - set(_PARAMS)
    assert params["arm_joints"] == FR3_ARM_JOINTS == params["joint_names"]
    kinds = {"forward_command_controller": "commands", "joint_trajectory_controller": "joint_trajectory"}
    assert kinds[params["command_mode"]] == arm_kind and kinds[params["gripper_output"]] == grip_kind
    for key in params:   # every key documented on its line or the line above
        lines = text.splitlines()
        i = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{key}:"))
        assert "#" in lines[i] or lines[i - 1].strip().startswith("#"), key


@pytest.mark.parametrize("name", ["fr3_forward.yaml", "fr3_jtc.yaml"])
def test_a_driver_started_from_an_fr3_config_publishes_what_its_controllers_accept(ros, echo_server, name):
    params = yaml.safe_load((ROOT / "config" / name).read_text())["/**"]["ros__parameters"]
    ctl_names = (params["arm_controller"], params["gripper_controller"])
    # the fake robot publishes panda joint names and one camera; the controllers are the config's
    params.update(joint_names=[f"panda_joint{i}" for i in range(1, 8)], gripper_joint="panda_gripper",
                  camera_views=["exterior_1"], camera_topics=["camera/exterior_1/image_raw"],
                  max_sensor_age_s=2.0, model="echo-ros")
    # 2 s, not 0.3: the fake robot publishes from this test's own process, and under the suite's
    # load its camera went 306 ms without a frame (clean-clone CI), which rightly ended the run as
    # stale_camera before its 1.5 s; sensor freshness is the stale-camera tests' subject
    for key in ("gateway_url", "api_key_env"):
        params.pop(key)
    robot = ros.add(FakeRobot(ros.ctx))
    seen = {c: [] for c in ctl_names}
    node = ros.add(rclpy.create_node("fake_controllers", context=ros.ctx))
    kinds = {"forward_command_controller": ("commands", Float64MultiArray),
             "joint_trajectory_controller": ("joint_trajectory", JointTrajectory)}
    for ctl, mode, joints in ((ctl_names[0], params["command_mode"], params["arm_joints"]),
                              (ctl_names[1], params["gripper_output"], params["gripper_joints"])):
        kind, typ = kinds[mode]
        check = (lambda m, j=joints: forward_controller_refusal(m, j)) if typ is Float64MultiArray else \
            (lambda m, j=joints: jtc_refusal(m, j, node.get_clock().now().nanoseconds * 1e-9))
        node.create_subscription(typ, f"{ctl}/{kind}", lambda m, c=ctl, f=check: seen[c].append((m, f(m))), 100)
    driver = ros.add(PolicyDriver(context=ros.ctx, parameter_overrides=driver_params(echo_server, **params)))
    client = ActionClient(node, Act, "policy_driver/act")
    ros.start()
    assert client.wait_for_server(timeout_sec=20.0)
    wait(driver.assembler.ready, 20.0, "sensors")
    res = Goal(client, max_seconds=1.5).wait_result().result
    time.sleep(0.5)
    assert res.reason == "timeout" and res.actions > 5
    for ctl in ctl_names:
        assert len(seen[ctl]) == res.actions + 1, ctl      # every row + the hold at the timeout
        assert [why for _, why in seen[ctl] if why is not None] == [], ctl
    assert robot.commands == []


def test_the_recorder_records_joint_trajectory_commands_and_reads_them_back(ros, echo_server, tmp_path):
    from rclpy.parameter import Parameter

    from sequence_ai_ros.bag.reader import read_episode
    from sequence_ai_ros.recorder_node import EpisodeRecorder

    robot = ros.add(FakeRobot(ros.ctx))
    recorder = ros.add(EpisodeRecorder(context=ros.ctx, parameter_overrides=[
        Parameter("auto_record", value=True), Parameter("output_dir", value=str(tmp_path / "bags")),
        Parameter("camera_views", value=["exterior_1"]), Parameter("camera_topics", value=["camera/exterior_1/image_raw"]),
        Parameter("command_topic", value="fr3_arm_controller/joint_trajectory"),
        Parameter("command_type", value="joint_trajectory")]))
    driver = ros.add(PolicyDriver(context=ros.ctx, parameter_overrides=driver_params(
        echo_server, command_mode="joint_trajectory_controller", arm_controller="fr3_arm_controller")))
    client = ActionClient(ros.add(rclpy.create_node("act_client", context=ros.ctx)), Act, "policy_driver/act")
    ros.start()
    assert client.wait_for_server(timeout_sec=20.0)
    wait(driver.assembler.ready, 20.0, "sensors")
    res = Goal(client, max_seconds=1.5).wait_result().result
    wait(lambda: recorder.last_bag is not None, 20.0, "the bag")
    episode = read_episode(recorder.last_bag)
    assert episode.start["command_topic"] == "/fr3_arm_controller/joint_trajectory"
    assert episode.start["command_type"] == "joint_trajectory"
    assert episode.start["command_joint_names"] == FR3_ARM_JOINTS
    sent = [row[:7] for _, row in driver.trace.commands]
    recorded = [values for _, values in episode.commands]
    assert res.actions == len(sent) > 5
    np.testing.assert_allclose(recorded[:len(sent)], sent)          # then the hold, if it beat the end marker
    assert len(recorded) in (len(sent), len(sent) + 1)
    assert robot.commands == []
