"""ROS 2 face of sequence-ai: ROS nodes and ROS message handling, the demo.

Modules (rclpy is imported only by the node modules, not by this package):

* ``observation`` -- sensor messages -> ``sequence_ai.Observation`` (shared with bag export)
* ``driver_node`` -- ``policy_driver``: Act action server, commands at the control frequency
* ``sim_node`` -- the MuJoCo Panda cell (``sequence_ai_sim.panda_sim``) as a ROS 2 robot
* ``recorder_node`` / ``bag`` -- episode bags; ``sequence-ai bag`` exports them with ``sequence_ai_data``
* ``demo`` -- the README's main job, end to end
"""
