"""ROS 2 face of sequence-ai: the simulated Franka cell, the policy driver, the demo.

Modules (rclpy is imported only by the node modules, not by this package):

* ``observation`` -- sensor messages -> ``sequence_ai.Observation`` (shared with bag export)
* ``driver_node`` -- ``policy_driver``: Act action server, commands at the control frequency
* ``sim_node`` / ``panda_sim`` -- the MuJoCo Panda pick-and-place cell as a ROS 2 robot
* ``demo`` -- the README's main job, end to end
"""
