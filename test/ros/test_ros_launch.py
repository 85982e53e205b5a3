"""The launch files under the real launch / launch_ros / launch_pytest (ROS 2 Jazzy) and ros2cli.

What a user does with the package, end to end, against a real gateway with the pick-place policy:

- ``demo.launch.py record:=true``: the sim, the driver and the recorder come up from the ament
  index (``install/`` as scripts/bootstrap.sh lays it out); an ``Act`` goal sent through a real
  action client reaches SUCCEEDED and the recorder writes the episode's bag;
- ``driver.launch.py namespace:=arm config:=franka_droid.yaml`` beside ``namespace:=sim
  config:=panda_sim.yaml``: two drivers side by side, each with its own file's parameters
  (read back with the real ``ros2 param dump``) and its own Act action server;
- ``ros2 launch`` (the CLI) stopped with SIGINT or SIGTERM exits 0, every node it started is gone
  within about a second, and no process printed a traceback (sim_robot's EGL context, the
  recorder, the driver); ``driver.launch.py`` whose model is not deployed waits with a warning.

Needs the ROS 2 tools from ../shared/ros-jazzy-extras (scripts/bootstrap.sh installs them).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import launch_pytest
import psutil
import pytest
import yaml
from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import GroupAction, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch_pytest.tools import process as process_tools

from _servers import GatewayProcess
from _wait import eventually
from sequence_ai_ros._spin import destroy_node

ROOT = Path(__file__).resolve().parents[2]
PICK_PLACE = ROOT / "examples" / "pick_place" / "policy.py"
SHARE = Path(get_package_share_directory("sequence_ai"))
INSTRUCTION = "put the red cube on the green pad"


@pytest.fixture(scope="module")
def pick_place_gateway(tmp_path_factory):
    """A gateway with ``pick-place`` deployed; its URL and key are exported to this process's
    environment, which the launched nodes inherit."""
    gw = GatewayProcess.start(tmp_path_factory.mktemp("gateway"))
    saved = {k: os.environ.get(k) for k in gw.env()}
    try:
        d = gw.deploy(str(PICK_PLACE), "pick-place", timeout=240.0)
        assert d["status"] == "ready", (d, gw.log("pick-place")[-2000:])
        os.environ.update(gw.env())
        yield gw
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        gw.close()


def _include(name: str, **args: str):
    """``IncludeLaunchDescription`` of one of the package's launch files, its arguments scoped."""
    source = PythonLaunchDescriptionSource(str(SHARE / "launch" / name))
    return GroupAction([IncludeLaunchDescription(source, launch_arguments=list(args.items()))], scoped=True)


class _Ros:
    """An rclpy context and node of the test's own, for goals and probes."""

    def __init__(self, name: str):
        import rclpy

        self.rclpy = rclpy
        self.ctx = rclpy.context.Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node(name, context=self.ctx)

    def wait(self, future, timeout_s: float):
        from rclpy.executors import SingleThreadedExecutor

        executor = SingleThreadedExecutor(context=self.ctx)
        executor.add_node(self.node)
        deadline = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        executor.remove_node(self.node)
        executor.shutdown()
        assert future.done(), f"no answer within {timeout_s} s"
        return future.result()

    def close(self):
        destroy_node(self.node)
        self.rclpy.shutdown(context=self.ctx)


# -- demo.launch.py: an Act goal to SUCCEEDED, recorded --------------------------------------------

@pytest.fixture
def bag_dir(tmp_path):
    return tmp_path / "bags"


@launch_pytest.fixture
def demo_launch(pick_place_gateway, bag_dir):
    return LaunchDescription([
        _include("demo.launch.py", seed="0", record="true", record_dir=str(bag_dir)),
        launch_pytest.actions.ReadyToTest(),
    ])


@pytest.mark.launch(fixture=demo_launch)
def test_demo_launch_runs_an_act_goal_to_succeeded_and_records_it(bag_dir):
    from action_msgs.msg import GoalStatus
    from rclpy.action import ActionClient
    from sequence_ai_msgs.action import Act

    ros = _Ros("demo_launch_probe")
    try:
        client = ActionClient(ros.node, Act, "/policy_driver/act")
        assert client.wait_for_server(timeout_sec=90.0), "/policy_driver/act never appeared"
        # the recorder must hear the driver's start marker or it writes no bag (a goal sent as soon as
        # the action server was up, at load 14, left none): its subscription in the graph, then 1 s for
        # the driver's publisher to match it and for the driver's first frames and joint state
        eventually(lambda: ros.node.count_subscribers("/policy_driver/episode") >= 1, 60.0, 0.1,
                   what="the recorder's subscription to /policy_driver/episode")
        time.sleep(1.0)
        handle = ros.wait(client.send_goal_async(Act.Goal(instruction=INSTRUCTION, max_seconds=45.0)), 30.0)
        assert handle.accepted
        wrapped = ros.wait(handle.get_result_async(), 120.0)
        res = wrapped.result
        assert wrapped.status == GoalStatus.STATUS_SUCCEEDED, (wrapped.status, res.reason, res.message)
        assert res.reason == "until" and res.actions >= 8 and res.chunks >= 2, res
        client.destroy()
    finally:
        ros.close()
    # the recorder the launch file started (record:=true) closed the episode's bag
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and not list(bag_dir.glob("*/metadata.yaml")):
        time.sleep(0.2)
    bags = list(bag_dir.glob("*/metadata.yaml"))
    assert len(bags) == 1, list(bag_dir.rglob("*"))
    meta = yaml.safe_load(bags[0].read_text())["rosbag2_bagfile_information"]
    topics = {t["topic_metadata"]["name"] for t in meta["topics_with_message_count"]}
    assert {"/joint_commands", "/joint_states"} <= topics, topics
    assert meta["message_count"] > res.actions, meta["message_count"]


# -- driver.launch.py twice: namespaces, each with its own config ---------------------------------

@launch_pytest.fixture
def two_drivers(pick_place_gateway):
    return LaunchDescription([
        _include("driver.launch.py", namespace="arm", config="franka_droid.yaml", model="pick-place"),
        _include("driver.launch.py", namespace="sim", config="panda_sim.yaml", model="pick-place"),
        launch_pytest.actions.ReadyToTest(),
    ])


KEYS = ("model", "hold_mode", "command_topic", "command_interface", "joint_lower", "joint_upper", "camera_topics",
        "joint_state_topic", "max_sensor_age_s", "success_service")


def _params(ros: "_Ros", node: str, names=KEYS) -> dict:
    """``node``'s parameters ``names`` through its parameter service (rcl_interfaces GetParameters)."""
    from rclpy.parameter import parameter_value_to_python
    from rclpy.parameter_client import AsyncParameterClient

    client = AsyncParameterClient(ros.node, node)
    assert client.wait_for_services(timeout_sec=60.0), f"{node}: no parameter services"
    values = ros.wait(client.get_parameters(list(names)), 30.0).values
    return {n: parameter_value_to_python(v) for n, v in zip(names, values)}


@pytest.mark.launch(fixture=two_drivers)
def test_namespaced_drivers_side_by_side_each_apply_their_config():
    from rclpy.action import ActionClient
    from sequence_ai_msgs.action import Act

    ros = _Ros("namespace_probe")
    try:   # both Act servers, under their namespaces
        for ns in ("arm", "sim"):
            client = ActionClient(ros.node, Act, f"/{ns}/policy_driver/act")
            assert client.wait_for_server(timeout_sec=90.0), f"/{ns}/policy_driver/act never appeared"
            client.destroy()
        arm, sim = _params(ros, "/arm/policy_driver"), _params(ros, "/sim/policy_driver")
    finally:
        ros.close()
    droid = yaml.safe_load((ROOT / "config" / "franka_droid.yaml").read_text())["/**"]["ros__parameters"]
    for key in KEYS[1:]:
        assert arm[key] == droid[key], (key, arm[key], droid[key])
    assert arm["hold_mode"] == "zeros" and arm["command_topic"] == "joint_velocity_controller/commands"
    assert arm["joint_upper"][0] == 2.62 and arm["model"] == "pick-place"    # model:= overrides the file's
    assert sim["hold_mode"] == "hold_last" and sim["command_topic"] == "joint_commands"
    assert sim["joint_upper"][:2] == [2.8973, 1.7628] and sim["success_service"] == "sim_robot/check_success"
    # and as a user reads it: the real ros2 CLI. Without a daemon each of its two nodes spins the
    # whole --spin-time before it looks (5 s each made 10 s of fixed wait); --timeout is how long it
    # waits for the driver to appear, and it asks as soon as it has (then up to 5 s for its services)
    out = subprocess.run(["ros2", "param", "get", "--no-daemon", "--spin-time", "1", "--timeout", "60",
                          "/arm/policy_driver", "hold_mode"], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "String value is: zeros", out.stdout + out.stderr


# -- ros2 launch (the CLI): SIGINT and SIGTERM ----------------------------------------------------

STOP_GOAL_S = 1.0    # every process gone after the signal, idle machine (printed beside each measurement)
STOP_WITHIN_S = 4.0  # what the tests allow: the goal with room for a loaded 2-core machine


def _ros2_launch(log_path, *args):
    with open(log_path, "wb") as log:
        return subprocess.Popen(["ros2", "launch", "sequence_ai", *args], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _running(p: psutil.Process) -> bool:
    """True while ``p`` runs (not exited, not a zombie); a process that exits between the two
    checks is gone, not an error."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _all_gone_after(proc, sig, kids) -> float:
    """Send ``sig`` to the launch process alone; seconds until it and every node it started have exited."""
    procs = [psutil.Process(proc.pid)] + kids
    t0 = time.monotonic()
    proc.send_signal(sig)
    deadline = t0 + 60.0
    while True:
        proc.poll()
        alive = [p for p in procs if _running(p)]
        if not alive:
            return time.monotonic() - t0
        assert time.monotonic() < deadline, f"still running 60 s after {sig!r}: {[p.pid for p in alive]}"
        time.sleep(0.005)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_ros2_launch_stops_every_node_cleanly_within_about_a_second(pick_place_gateway, tmp_path, sig):
    """SIGINT is what Ctrl-C sends the launch process; SIGTERM what systemd, docker or ``kill`` send
    (upstream launch died of it at once and left the nodes running)."""
    log_path = tmp_path / "launch.log"
    proc = _ros2_launch(log_path, "sim.launch.py", "namespace:=cell", "record:=true", f"record_dir:={tmp_path / 'bags'}")
    try:
        ready = ("sim_robot ready", "active: Act goals accepted", "recording to")
        deadline = time.monotonic() + 120.0
        text = ""
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            kids = psutil.Process(proc.pid).children(recursive=True)
            if len(kids) >= 3 and all(r in text for r in ready) and _act_server_up("/cell/policy_driver/act"):
                break
            assert proc.poll() is None, text
            time.sleep(0.5)
        else:
            raise AssertionError(f"the nodes did not come up within 120 s:\n{text}")
        deadline = time.monotonic() + 30.0   # sim_robot rendering and publishing, the recorder buffering
        while "every sensor stream has delivered" not in log_path.read_text(errors="replace"):
            assert time.monotonic() < deadline and proc.poll() is None, log_path.read_text(errors="replace")
            time.sleep(0.1)
        kids = psutil.Process(proc.pid).children(recursive=True)
        took = _all_gone_after(proc, sig, kids)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait(timeout=10)
    text = log_path.read_text(errors="replace")
    print(f"ros2 launch {signal.Signals(sig).name}: every process gone {took:.3f} s after the signal "
          f"(goal {STOP_GOAL_S:g} s)")
    assert code == 0, text
    for bad in ("Traceback", "KeyboardInterrupt", "EGL_BAD_ACCESS", "InvalidHandle", "process has died",
                "terminate called", "orphaned", "escalating"):
        assert bad not in text, text
    for node in ("sim_robot", "policy_driver", "episode_recorder"):
        assert re.search(rf"\[INFO\] \[{node}-\d+\]: process has finished cleanly", text), (node, text)
    assert took < STOP_WITHIN_S, (took, text)


def test_driver_launch_with_its_model_not_deployed_waits_with_a_warning_and_stops_on_sigterm(pick_place_gateway,
                                                                                            tmp_path):
    """The default ``driver.launch.py`` (franka_droid.yaml: ``pi05-droid``) against a gateway that
    does not serve that model: the driver stays up in configure, saying which model and how to
    deploy it (it used to exit with code 2), and SIGTERM to the launch stops it cleanly."""
    log_path = tmp_path / "launch.log"
    proc = _ros2_launch(log_path, "driver.launch.py")
    warning = "model 'pi05-droid' is not deployed on the gateway"
    try:
        deadline = time.monotonic() + 120.0
        while log_path.read_text(errors="replace").count(warning) < 2:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")
            time.sleep(0.2)
        kids = psutil.Process(proc.pid).children(recursive=True)
        assert kids, "the driver is gone"
        took = _all_gone_after(proc, signal.SIGTERM, kids)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait(timeout=10)
    text = log_path.read_text(errors="replace")
    print(f"driver.launch.py waiting for pi05-droid: every process gone {took:.3f} s after SIGTERM")
    assert "`seq deploy <policy file> --name pi05-droid`" in text and "[WARN]" in text, text
    assert code == 0 and "Traceback" not in text and "process has died" not in text, text
    assert re.search(r"\[INFO\] \[policy_driver-\d+\]: process has finished cleanly", text), text
    assert took < STOP_WITHIN_S, (took, text)


def _act_server_up(name: str) -> bool:
    from rclpy.action import ActionClient
    from sequence_ai_msgs.action import Act

    ros = _Ros("sigint_probe")
    try:
        client = ActionClient(ros.node, Act, name)
        up = client.wait_for_server(timeout_sec=2.0)
        client.destroy()
        return up
    finally:
        ros.close()
