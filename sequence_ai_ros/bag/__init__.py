"""Episode capture and export: rosbag2 bags on the robot, LeRobot datasets for training.

Where it sits: beside the data path, never in it. The recorder node
(``sequence_ai_ros/recorder_node.py``) listens to the same topics the driver uses and hands raw
CDR bytes to :class:`~sequence_ai_ros.bag.writer.BagWriter`, which writes one rosbag2 bag per
episode (MCAP + ``metadata.yaml``, through the ``rosbags`` library) on its own thread. Later,
``sequence-ai bag export`` reads bags back (:mod:`.reader`), rebuilds one observation per control
step with the driver's own :class:`~sequence_ai_ros.observation.ObservationAssembler`
(:mod:`.frames`) and writes a LeRobot dataset (:mod:`sequence_ai_data.lerobot`).

Topics inside a bag (names are the recorder's resolved topic names; the defaults shown):

=====================================  =================================  =============================
topic                                  type                               what
=====================================  =================================  =============================
``/camera/<view>/image_raw/compressed`` ``sensor_msgs/msg/CompressedImage`` every camera frame, JPEG
                                                                          (header copied from the raw
                                                                          frame)
``/joint_states``                      ``sensor_msgs/msg/JointState``     as published (raw CDR)
``/joint_commands``                    ``std_msgs/msg/Float64MultiArray`` every command published
                                       (recorder ``command_type``         (raw CDR), the hold included
                                       ``joint_trajectory``:
                                       ``trajectory_msgs/msg/
                                       JointTrajectory``)
``/sequence_ai/instruction``           ``std_msgs/msg/String``            the instruction in force,
                                                                          written at the start and on
                                                                          every change
``/sequence_ai/episode``               ``std_msgs/msg/String``            JSON episode markers: first
                                                                          ``{"event": "start", ...}``
                                                                          (task, views, topics, joint
                                                                          names), last ``{"event":
                                                                          "end", "outcome": {RunOutcome
                                                                          fields}, "label": {"success":
                                                                          bool|null}, "dropped": n}``;
                                                                          between or after them, label
                                                                          markers ``{"event": "label",
                                                                          "success", "notes"}`` (the
                                                                          newest one is the label)
=====================================  =================================  =============================

Message log times are the recorder's receipt times (ns, ``time.time_ns()``), as ``ros2 bag
record`` does; each record's MCAP ``publish_time`` is the message's DDS source timestamp (the
publisher's send time, from rclpy's ``MessageInfo``), as rosbag2's ``send_timestamp``. The start
marker declares every stream's rate (``stream_rates_hz``, with ``stream_rate_sources``: see
:mod:`.rates`), and ``metadata.yaml`` ``custom_data`` keeps the time sources, the stamp lags, the
stream rates and the driver's contract, policy and seam statistics (:mod:`.events`). The first message of each sensor stream (camera views, joint states) may be logged
before the start marker: it is the recorder's pre-roll, the sample in force when the episode
started (see ``recorder_node``). Chunks are closed and flushed small (``chunk_bytes``/``chunk_s``), so a bag cut by
SIGKILL loses at most its last chunk: :func:`.reader.repair_bag` (``sequence-ai bag repair``)
rewrites it whole, and the reader recovers such a bag on the fly.

One dataset writer serves every source: :class:`.episode.EpisodeFrames` is what it consumes, so
episodes kept by a worker can be exported by building the same objects.
"""
from __future__ import annotations

#: Topic of the JSON episode markers inside a bag.
EPISODE_TOPIC = "/sequence_ai/episode"
#: Topic of the instruction in force inside a bag.
INSTRUCTION_TOPIC = "/sequence_ai/instruction"
#: Suffix appended to a camera topic for its compressed frames (image_transport's convention).
COMPRESSED_SUFFIX = "/compressed"

__all__ = ["EPISODE_TOPIC", "INSTRUCTION_TOPIC", "COMPRESSED_SUFFIX"]
