"""The simulated cell, without ROS: the MuJoCo Franka Panda pick-and-place scene and its tasks.

* ``panda_sim`` -- :class:`~sequence_ai_sim.panda_sim.PandaPickPlaceSim`: the scene, cameras,
  joint-position servos, reset/step/render and the success check (the ``sim`` extra: mujoco)
* ``meshes`` -- the decimated visual meshes the scene draws the arm with
* ``camera`` -- :class:`~sequence_ai_sim.camera.CameraModel`, the pinhole model of a rendered camera
* ``task`` -- the pick-and-place instruction grammar (colours, ``TaskError``)
* ``picture`` -- the demo's run picture (matplotlib, the ``demo`` extra)
* ``benchmarks`` -- the benchmarks that ship with sequence-ai (``seq eval --benchmark NAME``)

``sequence_ai_ros.sim_node`` puts the cell on ROS topics; the eval harness
(``sequence_ai_eval``) drives it directly. Importing this package imports no simulator.
"""
