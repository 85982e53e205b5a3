"""``--ros`` mode: each ``act`` tool call becomes an ``Act`` goal on the policy driver's action server.

The only module of this package that imports rclpy, ``sequence_ai_msgs`` and ``sequence_ai_ros``
(``cli.py`` imports it only for ``--ros``). One node (``sequence_ai_mcp``) spins on a
multi-threaded executor in a thread of its own; the MCP handlers wait on its futures.

* ``act`` sends ``Act.Goal(instruction, max_seconds)`` and returns the goal's status and result;
  a cancelled call or dropped session cancels the goal and waits (shielded) for its result -- the
  driver publishes a hold within one control period and nothing after.
* ``interrupt`` cancels the active goal; ``set_instruction`` publishes on the driver's
  ``~/instruction`` topic (``<driver>/instruction``).
* ``snapshot(view)`` is the last ``sensor_msgs/Image`` of that view's topic, as JPEG.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence

import anyio

from .backend import Backend

__all__ = ["RosBackend", "DEFAULT_CAMERA_TOPICS"]

#: view -> sensor_msgs/Image topic of the simulated cell (config/panda_sim.yaml)
DEFAULT_CAMERA_TOPICS = {"exterior_1": "camera/exterior_1/image_raw", "wrist_left": "camera/wrist_left/image_raw"}
_STATUS = {4: "SUCCEEDED", 5: "CANCELED", 6: "ABORTED"}   # action_msgs/GoalStatus


class RosBackend(Backend):
    """Act goals through ``rclpy.action.ActionClient``.

    Args:
        action: the Act action name (default ``policy_driver/act``); the driver's node name is
            its first part (its ``~/instruction`` topic is ``<that>/instruction``).
        camera_topics: ``{view: sensor_msgs/Image topic}`` for snapshot (default
            :data:`DEFAULT_CAMERA_TOPICS`).
        server_timeout_s: how long the first act waits for the action server (s, default 10).
        stop_conditions: the names of the driver's ``stop_conditions`` an agent may pass as
            ``act(stop_when=...)`` (sent as the Act goal's ``stop_when``; the driver asks the
            CheckSuccess service behind it). An operator on the driver's ``operator_topic``
            ends goals with reason ``operator``.

    Raises RuntimeError when rclpy or sequence_ai_msgs cannot be imported (source scripts/env.sh
    or the ROS 2 workspace).
    """

    def __init__(self, action: str = "policy_driver/act", camera_topics: Optional[Dict[str, str]] = None,
                 server_timeout_s: float = 10.0, stop_conditions: Sequence[str] = ()) -> None:
        import rclpy
        from rclpy.action import ActionClient
        from rclpy.executors import MultiThreadedExecutor
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image as RosImage
        from std_msgs.msg import String

        from sequence_ai_msgs.action import Act

        self._Act, self._String = Act, String
        self._own_context = not rclpy.ok()
        if self._own_context:
            rclpy.init()
        self.node = rclpy.create_node("sequence_ai_mcp")
        self.client = ActionClient(self.node, Act, action)
        driver = action.rsplit("/", 1)[0] if "/" in action else ""
        self._instruction_pub = self.node.create_publisher(String, f"{driver}/instruction" if driver else "instruction", 10)
        self.camera_topics = dict(camera_topics or DEFAULT_CAMERA_TOPICS)
        self._frames: Dict[str, Any] = {}
        for view, topic in self.camera_topics.items():
            self.node.create_subscription(RosImage, topic, lambda msg, v=view: self._frames.__setitem__(v, msg),
                                          qos_profile_sensor_data)
        self.server_timeout_s = float(server_timeout_s)
        #: the names of the driver's stop_conditions an agent may pass as act(stop_when=...)
        self._stop_conditions = [str(n) for n in stop_conditions]
        self.description = f"Act goals on {action} (ROS 2)"
        self.period_s = None
        self._handle = None
        self._cancel_requested = False
        self._feedback: Any = None
        self._executor = MultiThreadedExecutor(num_threads=2)
        self._executor.add_node(self.node)
        self._spin = threading.Thread(target=self._executor.spin, name="sequence-ai-mcp-ros", daemon=True)
        self._spin.start()

    @property
    def views(self) -> List[str]:
        return list(self.camera_topics)

    @staticmethod
    async def _wait(future, timeout_s: Optional[float] = None) -> Any:
        done = threading.Event()
        future.add_done_callback(lambda _f: done.set())
        ok = await anyio.to_thread.run_sync(done.wait, timeout_s, abandon_on_cancel=True)
        if not ok:
            raise TimeoutError("no answer from the action server")
        return future.result()

    def progress(self) -> Dict[str, Any]:
        fb = self._feedback
        if fb is None:
            return {}
        return {"actions": int(fb.actions), "chunks": int(fb.chunks), "phase": fb.status,
                "driver_elapsed_s": float(fb.elapsed_s)}

    @property
    def stop_conditions(self) -> List[str]:
        return list(self._stop_conditions)

    async def act(self, instruction: str, max_seconds: float, stop: Any = None,
                  stop_when: Optional[str] = None) -> Dict[str, Any]:
        import sequence_ai

        ok = await anyio.to_thread.run_sync(self.client.wait_for_server, self.server_timeout_s)
        if not ok:
            raise sequence_ai.Unavailable(
                f"no Act action server answered within {self.server_timeout_s:g} s",
                hint="start the policy driver (ros2 run sequence_ai policy_driver) or check --action")
        self._feedback = None
        if stop is not None and stop.stopped:      # stopped before the goal went out: nothing moved
            return {"status": "CANCELED", "outcome": {"reason": "interrupted", "actions": 0, "chunks": 0,
                                                      "seconds": 0.0}, "task_done": None,
                    "message": "stopped before the Act goal was sent"}
        goal = self._Act.Goal(instruction=instruction, max_seconds=float(max_seconds), stop_when=stop_when or "")
        self._cancel_requested = False
        handle = await self._wait(self.client.send_goal_async(
            goal, feedback_callback=lambda msg: setattr(self, "_feedback", msg.feedback)), 30.0)
        if not handle.accepted:
            raise sequence_ai.InvalidRequest("the policy driver rejected the Act goal",
                                             hint="see the driver's log (a goal needs max_seconds > 0)")
        self._handle = handle
        # a stop from now on (or one that came while the goal was on its way) cancels the goal
        unwatch = stop.watch(self.interrupt) if stop is not None else (lambda: None)
        result_future = handle.get_result_async()
        try:
            wrapped = await self._wait(result_future)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                self._cancel_requested = True
                await self._wait(handle.cancel_goal_async(), 10.0)
                await self._wait(result_future, 10.0)
            raise
        finally:
            unwatch()
            self._handle = None
        r = wrapped.result
        outcome = {"reason": r.reason, "actions": r.actions, "chunks": r.chunks, "seconds": r.seconds,
                   "underruns": r.underruns, "underrun_s": r.underrun_s, "max_seam_jump": r.max_seam_jump,
                   "instruction_swaps": r.instruction_swaps,
                   "max_instruction_lag_s": r.max_instruction_lag_s or None,
                   "action_space": r.action_space or None,
                   "obs_to_action_p50_s": r.obs_to_action_p50_s or None,
                   "obs_to_action_p99_s": r.obs_to_action_p99_s or None}
        return {"status": _STATUS.get(wrapped.status, f"status {wrapped.status}"), "outcome": outcome,
                "task_done": None, "message": r.message}

    def interrupt(self) -> bool:
        handle = self._handle
        if handle is None:
            return False
        self._cancel_requested = True
        handle.cancel_goal_async()
        return True

    def set_instruction(self, text: str) -> None:
        self._instruction_pub.publish(self._String(data=text))

    async def snapshot(self, view: str) -> bytes:
        from sequence_ai_ros.observation import encode_jpeg, image_to_array

        if view not in self.camera_topics:
            raise ValueError(f"no camera view {view!r}: this server reads {list(self.camera_topics)}")
        msg = self._frames.get(view)
        if msg is None:
            raise ValueError(f"no frame yet on {self.camera_topics[view]!r} (is the camera publishing?)")
        return encode_jpeg(image_to_array(msg))

    def close(self) -> None:
        import rclpy

        self.interrupt()
        self._executor.shutdown(timeout_sec=5.0)
        self._spin.join(timeout=5.0)
        self.node.destroy_node()
        # rclpy's destroy_node leaves action clients alive, and this one kept the node and its
        # DDS participant alive until some later garbage collection (sequence_ai_ros._spin.destroy_node)
        self.client.destroy()
        if self._own_context and rclpy.ok():
            rclpy.shutdown()
