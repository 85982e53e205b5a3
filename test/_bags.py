"""Episode bags built by hand, as the recorder writes them (the pre-roll, the start and end markers,
labels): test_capture_units.py and test_bag_export_paths.py read them."""
from __future__ import annotations

import json

import numpy as np
from rclpy.serialization import serialize_message
from std_msgs.msg import Float64MultiArray, String

from sequence_ai_ros.bag import EPISODE_TOPIC
from sequence_ai_ros.bag.writer import BagWriter

_JOINTS = ["j1", "j2", "j3"]
START_NS = 1_000_000_000_000          # the start marker's log time
_PERIOD_NS = 66_666_667                # 15 Hz


def episode_bag(path, n_commands: int = 10, label=None, end_marker: bool = True):
    """A recorder-style bag: one joint state and one camera frame logged *before* the start marker
    (the pre-roll), then commands and sensors at 15 Hz, then an end marker carrying ``label``
    (none with ``end_marker=False``: a recording cut before its end). Returns the pre-roll joint
    positions."""
    import simplejpeg
    from sensor_msgs.msg import CompressedImage, JointState

    def joints(t_ns, q):
        return serialize_message(JointState(name=_JOINTS, position=q))

    def frame(t_ns):
        msg = CompressedImage(format="rgb8; jpeg compressed rgb8")
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(t_ns, 1_000_000_000)
        msg.data = simplejpeg.encode_jpeg(np.full((32, 48, 3), 120, np.uint8), colorspace="RGB")
        return serialize_message(msg)

    start = {"event": "start", "source": "record_episode", "task": "stack the cups", "views": ["front"],
             "image_topics": {"front": "/cam/front/compressed"}, "joint_names": _JOINTS, "gripper_joint": None,
             "joint_state_topic": "/joint_states", "command_topic": "/joint_commands", "max_sensor_age_s": 0.5}
    w = BagWriter()
    w.open(path)
    pre_q = [0.1, 0.2, 0.3]
    w.put("/joint_states", "sensor_msgs/msg/JointState", START_NS - 40_000_000, joints(0, pre_q))
    w.put("/cam/front/compressed", "sensor_msgs/msg/CompressedImage", START_NS - 30_000_000, frame(START_NS - 30_000_000))
    w.put(EPISODE_TOPIC, "std_msgs/msg/String", START_NS, serialize_message(String(data=json.dumps(start))))
    for i in range(n_commands):
        t = START_NS + 5_000_000 + i * _PERIOD_NS          # the first command precedes every in-episode sample
        w.put("/joint_commands", "std_msgs/msg/Float64MultiArray", t, serialize_message(Float64MultiArray(data=[float(i)] * 3)))
        w.put("/joint_states", "sensor_msgs/msg/JointState", t + 20_000_000, joints(t, [float(i)] * 3))
        w.put("/cam/front/compressed", "sensor_msgs/msg/CompressedImage", t + 25_000_000, frame(t + 25_000_000))
    end = {"event": "end", "source": "record_episode", "outcome": {"reason": "canceled"}, "label": {"success": label}}
    if end_marker:
        w.put(EPISODE_TOPIC, "std_msgs/msg/String", START_NS + (n_commands + 1) * _PERIOD_NS,
              serialize_message(String(data=json.dumps(end))))
    w.close()
    w.shutdown()
    return pre_q
