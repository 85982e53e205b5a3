"""``sim_robot``: the MuJoCo Franka Panda pick-and-place scene, published as a ROS 2 robot.

Where it sits: it *is* the robot of the data path. It publishes what a real Franka cell would
(camera images, joint states) and takes what a ros2_control forward position controller takes
(a ``std_msgs/Float64MultiArray`` of joint-position targets).

Topics (relative names, so namespaces and remaps work):

* ``camera/<view>/image_raw`` -- ``sensor_msgs/Image`` rgb8, 224x224, per view
  (``exterior_1``, ``wrist_left``), at ``publish_rate_hz`` (15 Hz default)
* ``joint_states`` -- ``sensor_msgs/JointState``: 7 arm joints (rad) + the gripper
* ``joint_commands`` (subscribed) -- ``std_msgs/Float64MultiArray``: 7 joint targets (rad) then
  the gripper command, the same convention as the gripper entry of ``joint_states``

Services: ``~/reset`` (``sequence_ai_msgs/srv/ResetScene``) and ``~/check_success``
(``sequence_ai_msgs/srv/CheckSuccess``).

Physics runs in real time on a dedicated thread that also owns the OpenGL context (MuJoCo's
offscreen renderer is bound to the thread that created it): each tick advances the simulation to
the wall-clock time elapsed since the last reset, renders, and publishes.
"""
from __future__ import annotations

from . import _entry  # noqa: F401  first: a signal during the imports below ends the process quietly

import json
import os
import sys
import threading
import time
from typing import Optional

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from sequence_ai_msgs.srv import CheckSuccess, ResetScene
from sequence_ai_sim.panda_sim import PandaPickPlaceSim, check_light_jitter
from sequence_ai_sim.task import TaskError, parse_pick_place

from ._params import declare_parameters
from ._spin import spin_node

VIEWS = ("exterior_1", "wrist_left")


class SimRobotNode(Node):
    """The simulated Franka cell as a ROS 2 node (see the module docstring for its interface)."""

    def __init__(self, node_name: str = "sim_robot", **kwargs) -> None:
        super().__init__(node_name, **kwargs)
        p = declare_parameters(self, {
            "seed": (0, "Scene seed: cube and pad placement (and the light, with light_jitter > 0)."),
            "publish_rate_hz": (15.0, "Camera and joint-state publishing rate (Hz); physics steps in real time."),
            "image_size": (224, "Square camera resolution (px)."),
            "frame_id_prefix": ("", "Prefix for header frame ids."),
            "light_jitter": (0.0, "0 = the fixed light; up to 1 draws brightness, tint and the sun's direction "
                                  "from the seed (the pick-place benchmark's default is 1)."),
        })
        self._rate = p["publish_rate_hz"]
        if self._rate <= 0:
            raise ValueError(f"publish_rate_hz must be > 0, got {self._rate}")
        self._seed = int(p["seed"])
        self._size = int(p["image_size"])
        self._prefix = str(p["frame_id_prefix"])
        self._light_jitter = check_light_jitter(p["light_jitter"])

        self._image_pubs = {
            v: self.create_publisher(Image, f"camera/{v}/image_raw", qos_profile_sensor_data) for v in VIEWS
        }
        self._joint_pub = self.create_publisher(JointState, "joint_states", 10)
        self.create_subscription(Float64MultiArray, "joint_commands", self._on_command, 10)
        # reset and check wait for the physics thread's next tick: on a thread of their own
        # (_spin.NodeExecutor), so commands keep arriving meanwhile
        services = MutuallyExclusiveCallbackGroup()
        self.blocking_callback_groups = [services]
        self.create_service(ResetScene, "~/reset", self._on_reset, callback_group=services)
        self.create_service(CheckSuccess, "~/check_success", self._on_check, callback_group=services)

        self._lock = threading.Lock()
        self._pending_command: Optional[tuple[np.ndarray, float]] = None
        self._pending_reset: Optional[tuple[int, threading.Event, dict]] = None
        self._pending_checks: list[tuple[str, threading.Event, dict]] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: Optional[BaseException] = None
        self.commands_received = 0
        self._thread = threading.Thread(target=self._physics_loop, name="sim_physics", daemon=True)
        self._thread.start()
        try:
            ready = self._ready.wait(timeout=120.0)
        except BaseException:   # Ctrl-C / SIGTERM while MuJoCo loads: let the thread free its GL context
            self._stop.set()
            self._thread.join(timeout=30.0)
            raise
        if not ready or self._error is not None:
            raise RuntimeError(f"simulation failed to start: {self._error!r}")
        self.get_logger().info(f"sim_robot ready: cameras {list(VIEWS)} and joint states at {self._rate:g} Hz, "
                               f"seed {self._seed}")

    # -- ROS callbacks (never touch MuJoCo directly; hand work to the physics thread) ----------
    def _on_command(self, msg: Float64MultiArray) -> None:
        data = np.asarray(msg.data, dtype=float)
        if data.shape != (8,) or not np.all(np.isfinite(data)):
            self.get_logger().error(
                f"ignored joint command: expected 8 finite values (7 joints rad + gripper), got {data.shape}"
            )
            return
        with self._lock:
            self._pending_command = (data[:7].copy(), float(data[7]))
            self.commands_received += 1

    def _on_reset(self, request, response):
        done, box = threading.Event(), {}
        with self._lock:
            self._pending_reset = (int(request.seed), done, box)
        if not done.wait(timeout=30.0):
            response.success, response.message = False, "reset timed out (physics thread stalled)"
            return response
        response.success = True
        response.scene_json = json.dumps(box["scene"])
        return response

    def _on_check(self, request, response):
        try:
            cube, pad = parse_pick_place(request.instruction)
        except TaskError as exc:
            response.success, response.message = False, str(exc)
            return response
        done, box = threading.Event(), {}
        with self._lock:
            self._pending_checks.append(((cube, pad), done, box))
        if not done.wait(timeout=30.0):
            response.success, response.message = False, "check timed out (physics thread stalled)"
            return response
        ok, info = box["result"]
        response.success = bool(ok)
        response.distance_m = float(info["xy_dist_m"])
        response.resting = bool(info.get("resting", False))
        response.message = json.dumps(info, default=float)
        return response

    # -- the physics thread ---------------------------------------------------------------------
    def _physics_loop(self) -> None:
        try:
            sim = PandaPickPlaceSim(seed=self._seed, image_size=self._size, light_jitter=self._light_jitter)
        except BaseException as exc:  # reported by __init__
            self._error = exc
            self._ready.set()
            return
        self.sim = sim
        self._ready.set()
        try:
            self._run(sim)
        finally:
            # The renderer's EGL context is current on this thread only: free it here. Left to the
            # garbage collector it was freed from the main thread at interpreter exit, where
            # eglMakeCurrent fails and MuJoCo printed an EGL_BAD_ACCESS traceback at every shutdown.
            sim.close()

    def _run(self, sim: PandaPickPlaceSim) -> None:
        period = 1.0 / self._rate
        t0 = time.monotonic()
        sim_t0 = sim.time
        tick = 0
        while not self._stop.is_set():
            with self._lock:
                command, self._pending_command = self._pending_command, None
                reset, self._pending_reset = self._pending_reset, None
                checks, self._pending_checks = self._pending_checks, []
            if reset is not None:
                seed, done, box = reset
                sim.reset(seed)
                box["scene"] = {k: np.asarray(v).tolist() for k, v in sim.object_positions().items()}
                t0, sim_t0, tick = time.monotonic(), sim.time, 0
                done.set()
            if command is not None:
                sim.set_command(command[0], command[1])
            # Real time: bring the simulation up to the wall clock (bounded catch-up).
            lag = (time.monotonic() - t0) - (sim.time - sim_t0)
            if lag > 0:
                sim.step(min(lag, 4 * period))
            for (cube, pad), done, box in checks:
                box["result"] = sim.success(cube, pad)
                done.set()
            self._publish(sim)
            tick += 1
            next_t = t0 + tick * period
            delay = next_t - time.monotonic()
            if delay < -period:  # fell behind by more than a tick: resync, do not burst
                t0 = time.monotonic() - tick * period
            elif delay > 0:
                self._stop.wait(delay)

    def _publish(self, sim: PandaPickPlaceSim) -> None:
        stamp = self.get_clock().now().to_msg()
        for view, pub in self._image_pubs.items():
            rgb = sim.render(view)
            msg = Image()
            msg.header.stamp = stamp
            msg.header.frame_id = f"{self._prefix}{view}_optical_frame"
            msg.height, msg.width = int(rgb.shape[0]), int(rgb.shape[1])
            msg.encoding = "rgb8"
            msg.is_bigendian = 0
            msg.step = int(rgb.shape[1]) * 3
            msg.data = np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()
            pub.publish(msg)
        js = JointState()
        js.header.stamp = stamp
        js.name = list(sim.joint_names)
        js.position = [float(x) for x in sim.joint_positions()] + [float(sim.gripper())]
        self._joint_pub.publish(js)

    def destroy_node(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        super().destroy_node()


def main(args=None) -> int:
    """``ros2 run sequence_ai sim_robot``: spin until Ctrl-C / SIGTERM, then shut down cleanly."""
    return spin_node(SimRobotNode, args=args)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
