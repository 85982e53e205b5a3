"""``policy_driver``: drives a robot with a deployed policy, as a ROS 2 node.

The whole data path passes through here, in order:

1. subscriptions keep recent camera frames and joint states (``observation.py``; decoders from
   ``codecs.py``: ``sensor_msgs/Image`` or ``sensor_msgs/CompressedImage`` per camera, or a
   registered custom type);
2. an ``Act`` goal (``sequence_ai_msgs/action/Act``, what a VLM calls as a tool) starts
   ``Policy.act()`` from ``sequence_ai`` -- the core fetches action chunks from the worker's
   ``/act``, prefetches the next while one plays, and paces actions on the monotonic clock at
   the chunk's control frequency;
3. each action is published as a joint command (``command_mode``, ``driver/outputs.py``): the
   8-wide ``joint_commands`` message (default; ``command_type`` ``std_msgs/Float64MultiArray``,
   ``trajectory_msgs/JointTrajectory`` or ``sensor_msgs/JointState``), or sized for ros2_control:
   a forward_command_controller's ``<arm_controller>/commands`` (exactly ``len(arm_joints)``
   values) or a joint_trajectory_controller's ``<arm_controller>/joint_trajectory``, with the
   gripper on its own controller (``gripper_output``). ``config/fr3_forward.yaml`` and
   ``config/fr3_jtc.yaml`` wire a Franka FR3.

The node is a managed (lifecycle) node; ``autostart`` (default true) configures and activates it
at start. Its code lives in ``sequence_ai_ros/driver/`` (see that package): the parameter table
with ranges and validators (``params.py``; changes at run time are applied or refused with a
reason), the command gate (``gate.py``: the one pacing path, ROS-free), the outputs, the per-goal
state (``goal.py``), the Act action (``execution.py``) and the node (``node.py``). This module
keeps the entry point and the names other code imports.

Publishing and pacing. The core owns the schedule: action *k* is due at
``t0 + k / control_frequency_hz`` on ``time.monotonic()``; it calls ``act(row)`` then, and the
gate publishes the row on its own monotonic grid ``publish_delay_ms`` later, absorbing the core's
wake-up jitter (``publish_delay_ms: 0`` publishes from the core's callback). The process's GIL
switch interval is lowered in ``main()`` (``GIL_SWITCH_INTERVAL_S``).
``bench/bench_publish_jitter.py`` measures the publish period error.

Control rate. It comes from the policy's contract (``control_frequency_hz``). The
``control_rate_hz`` parameter is a cross-check only: 0 (default) accepts the contract, any
other value that disagrees with it makes configure refuse (``ValueError`` from the constructor
with ``autostart``).

Stopping. Every ending of a goal gives the Act client a result (the RunOutcome fields) after the
hold: the run's own end, a cancel, a preempting goal, deactivate, Ctrl-C / SIGTERM of the process
(``main()`` keeps the executor spinning until the result has gone out), a lost gateway. The hold
(``hold_mode``: the last command, or zeros for the arm joints of a velocity interface) latches
the gate, so no command follows it. The result's ``actions`` counts commands actually published.

Sensors. Before every action ``validate`` asks the assembler for problems: a stale stream
(older than ``max_sensor_age_s``) or a malformed message ends the run with reason ``validate``
and a hold; the result's ``message`` names the stream.

Other interfaces: ``~/act``; ``~/instruction`` (``std_msgs/String``) swaps the instruction
without stopping; diagnostics (``diagnostic_msgs/DiagnosticArray``) on ``/diagnostics`` and
``~/status`` at ``status_hz`` (lifecycle state, gateway wait, latency figures);
``~/wait_until_ready`` (``std_srvs/Trigger``). Every name is relative, so a namespace
(``-r __ns:=/left``) gives two drivers in one process their own robots.
"""
from __future__ import annotations

from . import _entry  # noqa: F401  first: a signal during the imports below ends the process quietly

import sys
import time

from .driver.gate import CommandGate, set_thread_realtime
from .driver.goal import RunTrace, fill_result
from .driver.node import ConfigureError, PolicyDriver
from .driver.params import TABLE as _PARAMS
from ._spin import spin_node

__all__ = ["PolicyDriver", "_PARAMS", "ConfigureError", "CommandGate", "RunTrace", "set_thread_realtime",
           "outcome_message", "main", "GIL_SWITCH_INTERVAL_S"]

_CommandGate = CommandGate   # the name tests and benchmarks import
_fill_result = fill_result

GIL_SWITCH_INTERVAL_S = 0.0005
"""sys.setswitchinterval() that ``main()`` sets for the driver process (s; CPython's default is
0.005): a thread woken at its publish deadline waits at most about this long for the GIL held by
an rclpy executor thread running Python code. A process-wide setting, so the node's constructor
leaves it alone; an embedding process (the demo, the benchmark) may set it the same way."""

RESULT_FLUSH_S = 1.0
"""After Ctrl-C / SIGTERM, how long (s) the executor keeps spinning once the run has unwound so
the Act result reaches the client (rclpy sends it from an executor task)."""

HOLD_DELIVERY_S = 0.5
"""After Ctrl-C / SIGTERM, how long (s) the exit waits for the controllers to acknowledge the
hold (and the commands before it): DDS sends in the background and drops what is unsent at exit."""


def outcome_message(result, run_id: str = ""):
    """An ``Act.Result`` as a ``sequence_ai_msgs/msg/RunOutcome`` (same fields, ``run_id`` as given),
    e.g. to log or record it; ``~/outcome`` publishes these for ``~/start_policy`` runs."""
    from .driver.services import outcome_message as _outcome

    return _outcome(result, run_id)


def _pending_tasks(executor) -> bool:
    tasks = getattr(executor, "_tasks", None)
    if tasks is None:
        return False
    return any(not entry[0].done() for entry in list(tasks))


def _stop_runs(node: PolicyDriver) -> None:
    """Ctrl-C / SIGTERM: end the active run (hold first), let the goal's result go out to the Act
    client (bounded: 3 s to unwind + ``RESULT_FLUSH_S``; the executor keeps spinning on its own
    thread meanwhile, see ``_spin.spin_node``), then take the lifecycle shutdown transition."""
    if not node.stop_runs(timeout_s=3.0, message="driver shutting down (SIGINT/SIGTERM): "
                                                 "the run was stopped and the arm held"):
        node.get_logger().error("the active run did not unwind within 3 s of the shutdown request")
    outputs = getattr(node, "_outputs", None)
    if outputs is not None and not outputs.wait_delivered(HOLD_DELIVERY_S):   # the hold reaches the arm before exit
        node.get_logger().warning(f"the last commands (the hold) were not acknowledged within {HOLD_DELIVERY_S:g} s")
    executor = node.executor
    if executor is not None:
        flush_until = time.monotonic() + RESULT_FLUSH_S
        while _pending_tasks(executor) and time.monotonic() < flush_until:
            time.sleep(0.01)
    try:
        node.trigger_shutdown()   # lifecycle: -> finalized (releases the gateway session)
    except Exception as exc:  # noqa: BLE001 - a transition already under way; destroy_node releases
        node.get_logger().warning(f"shutdown transition not taken: {exc}")


def main(args=None) -> int:
    """``ros2 run sequence_ai policy_driver``: spin until Ctrl-C / SIGTERM, then shut down cleanly.

    On the signal the active run is interrupted, its hold published and its Act result sent
    (waiting up to about 4 s) while the ROS context is still valid; then the node shuts down
    (``_spin.spin_node``). The process's GIL switch interval is set to ``GIL_SWITCH_INTERVAL_S``
    first (see there). Exit code 2 with one ``error:`` line when a parameter is refused.
    """
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return spin_node(PolicyDriver, args=args, on_stop=_stop_runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
