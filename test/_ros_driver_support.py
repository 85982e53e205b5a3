"""The ROS driver tests' shared parts: a fake robot node, a per-test rclpy context (``ros``), the
echo deployment (``echo_server``), an Act goal sender and the driver's parameters.

Used by test/ros/test_ros_driver*.py, test_mcp_ros.py and bench/bench_ros_nodes.py /
bench_publish_jitter.py. The robot node publishes a 64x64 rgb8 camera and Panda joint states at
30 Hz and records every command it receives with its arrival time. Like a real sensor's noise,
one pixel changes from frame to frame; ``freeze`` makes the camera repeat one picture
(``"pixels"``) or stop advancing its header stamps (``"stamp"``); ``camera_lag_s`` stamps its
frames that long in the past (a camera's own delay). The echo policy declares 15 Hz
joint_absolute chunks.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import rclpy
from rclpy.action import ActionClient
from rclpy.duration import Duration
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from _servers import ECHO_POLICY
from _wait import eventually
from sequence_ai_msgs.action import Act
from sequence_ai_ros._spin import destroy_node, spin
from sequence_ai_ros.driver_node import PolicyDriver

PERIOD_S = 1.0 / 15.0
JOINTS = [f"panda_joint{i}" for i in range(1, 8)]
KEY_ENV = "SEQ_TEST_DRIVER_KEY"


@pytest.fixture(scope="module")
def echo_server(module_gateway):
    dep = module_gateway.deploy(ECHO_POLICY, name="echo-ros")
    assert dep["status"] == "ready", dep
    os.environ[KEY_ENV] = module_gateway.api_key
    yield module_gateway


class FakeRobot(Node):
    """Publishes camera + joint states at 30 Hz; records commands (monotonic arrival time, values)."""

    def __init__(self, context, namespace=""):
        super().__init__("fake_robot", namespace=namespace, context=context)
        self.img_pub = self.create_publisher(Image, "camera/exterior_1/image_raw", qos_profile_sensor_data)
        self.js_pub = self.create_publisher(JointState, "joint_states", 10)
        self.create_subscription(Float64MultiArray, "joint_commands", self._on_cmd, 100)
        self.commands = []
        self.cameras_on = True
        self.bad_image = None   # an Image to publish instead of the good one, once
        self.freeze = None      # None | "pixels" (the same picture again) | "stamp" (the header stamp stops)
        self.camera_lag_s = 0.0  # camera frames are stamped this long before they are published (s)
        self.frames = 0
        self._stuck_stamp = None
        self.create_timer(1.0 / 30.0, self._tick)

    def _on_cmd(self, msg):
        self.commands.append((time.monotonic(), list(msg.data)))

    def _tick(self):
        stamp = self.get_clock().now().to_msg()
        if self.bad_image is not None:
            msg, self.bad_image = self.bad_image, None
            msg.header.stamp = stamp
            self.img_pub.publish(msg)
        elif self.cameras_on:
            pixels = np.full((64, 64, 3), 90, np.uint8)
            if self.freeze != "pixels":
                self.frames += 1
            pixels[0, 0, 0] = self.frames % 256      # sensor noise: no two live frames are equal
            msg = Image(height=64, width=64, encoding="rgb8", step=64 * 3, data=pixels.tobytes())
            if self.freeze == "stamp":
                self._stuck_stamp = self._stuck_stamp or stamp
            live = stamp if not self.camera_lag_s else (
                self.get_clock().now() - Duration(nanoseconds=int(self.camera_lag_s * 1e9))).to_msg()
            msg.header.stamp = self._stuck_stamp if self.freeze == "stamp" else live
            self.img_pub.publish(msg)
        js = JointState(name=JOINTS + ["panda_gripper"], position=[0.1 * i for i in range(7)] + [0.5])
        js.header.stamp = stamp
        self.js_pub.publish(js)


def driver_params(gateway, **extra):
    # sensor age 1 s: the fake robot publishes from the test's own process, whose camera can be
    # 0.4 s late under the suite's load, and a driver at 0.3 s then (rightly) ends the run with a
    # stale camera; the freshness tests pass their own age
    base = dict(model="echo-ros", gateway_url=gateway.url, api_key_env=KEY_ENV,
                camera_views=["exterior_1"], camera_topics=["camera/exterior_1/image_raw"],
                max_sensor_age_s=1.0)
    base.update(extra)
    return [rclpy.parameter.Parameter(k, value=v) for k, v in base.items()]


class Harness:
    """Own Context per test; the executor is shut down and its thread joined before rclpy.shutdown."""

    def __init__(self):
        self.ctx = rclpy.context.Context()
        rclpy.init(context=self.ctx)
        self.executor = MultiThreadedExecutor(num_threads=8, context=self.ctx)
        self.nodes = []
        self.thread = None

    def add(self, node):
        self.nodes.append(node)
        self.executor.add_node(node)
        return node

    def start(self):
        # spin() of _spin: the driver's cleanup / shutdown transitions destroy entities while this
        # thread builds wait sets, which can end a bare executor.spin() (no reply is seen after it)
        self.thread = threading.Thread(target=spin, args=(self.executor,), daemon=True)
        self.thread.start()

    def close(self):
        for n in self.nodes:
            if isinstance(n, PolicyDriver) and n.policy is not None:
                n.policy.interrupt()
        self.executor.shutdown(timeout_sec=10.0)
        if self.thread is not None:
            self.thread.join(timeout=10.0)
        for n in self.nodes:
            destroy_node(n)        # with its action clients: none is left for a later GC to finalize
        rclpy.shutdown(context=self.ctx)


@pytest.fixture
def ros():
    h = Harness()
    try:
        yield h
    finally:
        h.close()


def wait(pred, timeout, what):
    """eventually() in the argument order of the driver tests (test_mcp_ros, test_ros_driver_* import it)."""
    return eventually(pred, timeout, 0.01, what=what)


class Goal:
    """Sends one Act goal; collects feedback, the accept answer and the result."""

    def __init__(self, client, instruction="put the red cube on the green pad", max_seconds=3.0, params_json=""):
        self.feedback = []
        self.result = None
        self.handle = None
        self.sent_t = time.monotonic()
        fut = client.send_goal_async(Act.Goal(instruction=instruction, max_seconds=max_seconds, params_json=params_json),
                                     feedback_callback=lambda m: self.feedback.append((time.monotonic(), m.feedback)))
        wait(fut.done, 20.0, "goal answer")
        self.handle = fut.result()
        if self.handle.accepted:
            self._res = self.handle.get_result_async()

    def wait_result(self, timeout=30.0, ask_again_s=5.0):
        """The goal's result, within ``timeout`` s. A result request is asked again every
        ``ask_again_s`` s without an answer: the action server keeps a finished goal's result, and
        a reply sent before DDS matched its writer to this client's reader is lost (once in about
        a thousand goals in a loaded run); the repeated request gets the same stored result."""
        deadline = time.monotonic() + timeout
        asked = [self._res]
        while not any(f.done() for f in asked):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out after {timeout} s waiting for goal result ({len(asked)} requests)"
            t_end = time.monotonic() + min(ask_again_s, left)
            while not any(f.done() for f in asked) and time.monotonic() < t_end:
                time.sleep(0.01)
            if not any(f.done() for f in asked) and time.monotonic() < deadline:
                asked.append(self.handle.get_result_async())
        self._res = next(f for f in asked if f.done())
        self.result = self._res.result()
        return self.result


def wait_goal_path(client, timeout=60.0):
    """Sends refused goals (an empty instruction) until one is answered.

    A driver in another process may drop the answer to a goal sent before its reply writer has
    discovered this client (wait_for_server only sees the request side); a refusal is safe to repeat.
    """
    deadline = time.monotonic() + timeout
    while True:
        fut = client.send_goal_async(Act.Goal(instruction=" ", max_seconds=1.0))
        t_ask = time.monotonic()
        while not fut.done() and time.monotonic() - t_ask < 2.0:
            time.sleep(0.02)
        if fut.done():
            assert not fut.result().accepted
            return
        assert time.monotonic() < deadline, "no answer to a goal from the driver"


def setup_driver(ros, gateway, namespace="", **params):
    robot = ros.add(FakeRobot(ros.ctx, namespace))
    driver = ros.add(PolicyDriver(namespace=namespace, context=ros.ctx, parameter_overrides=driver_params(gateway, **params)))
    client_node = ros.add(rclpy.create_node("act_client", namespace=namespace, context=ros.ctx))
    client = ActionClient(client_node, Act, "policy_driver/act")
    ros.start()
    assert client.wait_for_server(timeout_sec=20.0)
    wait(driver.assembler.ready, 20.0, "sensor data at the driver")
    return robot, driver, client, client_node




# -- joint_trajectory_controller rules (ros2_controllers, Jazzy), for the controller-output tests --

def duration_s(d) -> float:
    """A ``builtin_interfaces`` Duration or Time in seconds."""
    return d.sec + d.nanosec * 1e-9


def jtc_refusal(msg, joints, now_s: float):
    """None when a joint_trajectory_controller over ``joints`` with its default settings takes
    ``msg`` (``validate_trajectory_msg``: ``allow_partial_joints_goal`` false), else its complaint."""
    names = list(msg.joint_names)
    if len(names) != len(joints):
        return "Joints on incoming trajectory don't match the controller joints."
    if not names:
        return "Empty joint names on incoming trajectory."
    start = duration_s(msg.header.stamp)
    if start != 0.0 and start + max((duration_s(p.time_from_start) for p in msg.points), default=0.0) < now_s:
        return "Received trajectory with non zero time start time that ends on the past"
    for name in names:
        if name not in joints:
            return f"Incoming joint {name} doesn't match the controller's joints."
    previous = 0.0
    for i, point in enumerate(msg.points):
        t = duration_s(point.time_from_start)
        if i > 0 and t <= previous:
            return f"Time between points {i - 1} and {i} is not strictly increasing"
        previous = t
        if len(point.positions) != len(names):
            return f"Mismatch between joint_names ({len(names)}) and positions ({len(point.positions)}) at point #{i}."
        for field in ("velocities", "accelerations", "effort"):
            values = getattr(point, field)
            if len(values) and len(values) != len(names):
                return f"Mismatch between joint_names ({len(names)}) and {field} ({len(values)}) at point #{i}."
    return None


def jtc_timeline(received, seam_tol_s: float = 1e-4):
    """The points a joint_trajectory_controller reaches from ``received`` = ``[(receipt s, msg)]``
    (ROS clock, arrival order), by its trajectory-replacement rules: a trajectory starts at its
    ``header.stamp`` (zero: on receipt); its points are due ``time_from_start`` after that; the
    playing trajectory is kept up to the new one's start (``seam_tol_s`` absorbs the stamp's
    clock conversion) and the new one's points still in the future follow; one whose points are
    all past is rejected. Returns ``[(t s, positions, velocities or None, message index)]``."""
    played = []
    for idx, (receipt, msg) in enumerate(received):
        stamp = duration_s(msg.header.stamp)
        start = stamp if stamp != 0.0 else receipt
        points = [(start + duration_s(p.time_from_start), list(p.positions),
                   list(p.velocities) if len(p.velocities) else None, idx) for p in msg.points]
        future = [pt for pt in points if pt[0] > receipt]
        if future:
            played = [pt for pt in played if pt[0] <= start + seam_tol_s] + future
    return played
