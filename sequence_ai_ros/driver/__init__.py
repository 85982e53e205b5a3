"""The policy driver, split by concern (``policy_driver``; ``sequence_ai_ros.driver_node`` is its entry point).

* :mod:`.params` -- the parameter table (default, description, range, validator, read-only) and
  the frozen ``Params`` it yields;
* :mod:`.gate` -- ``CommandGate``: the one pacing path and the hold latch (no rclpy);
* :mod:`.outputs` -- action rows -> command messages (``joint_commands``, ros2_control's
  forward_command_controller and joint_trajectory_controller, the gripper's own output);
* :mod:`.goal` -- ``GoalRun``: one Act goal's stop token, trace, counters and result; ``RunSlot``;
* :mod:`.latency` -- the observation-to-action figure: camera stamp -> first command of its chunk
  (no rclpy);
* :mod:`.execution` -- ``GoalExecution``, held by the node: the Act action (accept, run, cancel,
  preempt, every ending's result);
* :mod:`.node` -- ``PolicyDriver``, the lifecycle node that wires them.
"""
