"""Episode datasets, without ROS: the frame model and the LeRobot dataset writer.

* ``episode`` -- :class:`~sequence_ai_data.episode.EpisodeFrames`, one frame per control step
  (the writer's one input), and ``ExportError``
* ``lerobot`` -- ``write_dataset`` (LeRobot v3.0 / v2.1: parquet + H.264 video) and
  ``write_export`` (``sequence-ai bag export``: checked target, signed, swapped into place)
* ``kept`` -- episodes a worker kept (capture) -> ``EpisodeFrames`` (the gateway's export)
* ``marker`` -- export markers: how an exporting tool recognizes a folder it wrote
* ``evals`` -- the eval records under ``<data_dir>/evals`` (``EvalStore``: written by the eval
  runner, read by ``seq eval`` and the gateway's account usage)

Robot bags become ``EpisodeFrames`` in ``sequence_ai_ros.bag.frames`` (that needs ROS messages).
Needs the ``data`` extra (numpy, pyarrow, av, simplejpeg, Pillow), imported only when used.
"""
