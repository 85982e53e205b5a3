"""``episode_recorder``: records episodes into rosbag2 bags (MCAP), one bag per episode.

Beside the data path, never in it: it subscribes to the topics the driver reads (cameras, joint
state) and writes (joint commands), with raw subscriptions (CDR bytes, no deserialization in the
callback), and hands every message to :class:`~sequence_ai_ros.bag.writer.BagWriter`, whose
thread compresses camera frames to JPEG and writes. Callbacks only enqueue: a full queue drops
(and counts) instead of waiting, so recording can never slow the control loop.

An episode starts and stops:

* through the ``~/record_episode`` action (``sequence_ai_msgs/action/RecordEpisode``): the goal
  carries the task prompt; cancelling it (or its ``max_seconds``) ends the episode; the result
  carries the bag path;
* automatically around each ``Act`` goal when ``auto_record`` is true: the driver publishes JSON
  start/end markers on ``<driver>/episode`` (``driver_episode_topic``), which the recorder copies
  into the bag and uses to open and close it. The start marker holds the driver's assembly
  settings; the end marker the RunOutcome and the success label.

Pre-roll: the recorder always keeps the latest message of each sensor stream (every camera view
and the joint state), recording or not, and writes those at the start of an episode with their
original receipt times. The driver builds its first observation from samples that arrived before
the goal started, so without them the first command(s) of an episode would have no observation
in force in the bag, and the export would lose those control steps. Once every stream has delivered
a message the recorder logs one INFO line saying so (``every sensor stream has delivered``): an
episode that starts after it has a pre-roll for every stream. Commands are what the
episode does, so only those received at or after the start marker's ``t_ns`` (when the driver
built it) are written from the short backlog kept for this: a command the driver published
before the recorder got round to its start marker is kept, one from before the episode is not.

Post-roll: the recorder's executor lags under load (a camera frame taken before the episode's last
command can reach it 100-250 ms later, after the driver's end marker), and the export gives each
step the samples stamped at or before it. So an ``Act`` end marker does not close the bag at
once: sensor streams keep being written until each has delivered a sample whose sensor time (its
``header.stamp``; its receipt time when unstamped or on another clock) is at or after the receipt
of the episode's last command (the end marker's ``actions``-th; it too may still be on its way),
at most ``post_roll_s`` after the end marker (then a WARN names the streams that fell short).
Commands go on being written up to ``actions`` + 1 (the last action and the hold after it); a
stream delivers in publish order, so every sample in force at the last step is then in the bag.

Rates and times: every bag declares each stream's rate in its start marker (``stream_rates_hz``,
with ``stream_rate_sources`` saying who declared it: the driver's contract, a RecordEpisode goal's
``control_frequency_hz``, this node's ``control_frequency_hz`` / ``camera_rates_hz`` /
``joint_state_rate_hz``, or ``measured`` over the stream's last messages before the episode; see
:mod:`sequence_ai_ros.bag.rates`); the end marker adds ``measured_rates_hz`` over the episode. Each
subscription takes rclpy's ``MessageInfo``: a message's DDS source timestamp (the publisher's send
time) is stored as its MCAP ``publish_time`` beside its receipt (log) time, which is what times
headerless commands in the export. The driver's contract, policy and seam statistics from its
markers also go into ``metadata.yaml`` ``custom_data`` (:mod:`sequence_ai_ros.bag.events`).

Labels: ``~/label_episode`` (``sequence_ai_msgs/srv/LabelEpisode``) gives an episode its success
label (the dataset's ``next.success``): the episode being recorded (a label marker is written at
once and the end marker carries the label), or a closed bag, which is rewritten with a label
marker added (:func:`~sequence_ai_ros.bag.reader.label_bag`). RecordEpisode episodes have no
success check, so this is how they are labeled; for Act episodes it overrides the driver's check.
Only bags this recorder wrote can be relabeled: a folder directly in its ``output_dir`` (after
resolving symlinks and ``..``) whose start marker carries this recorder's id (``recorder``, kept
in ``<output_dir>/.recorder-id``); any other path is refused with a reason and left untouched.

Disk bound (``max_disk_mb``): the same rule decides what may be deleted. Before a bag starts, the
oldest bags this recorder wrote (real folders directly in ``output_dir`` whose start marker
carries its id) are deleted until the rest leave room; anything else there is left alone.

Topics in the bag: see :mod:`sequence_ai_ros.bag`. Parameters: see ``_PARAMS`` below.
"""
from __future__ import annotations

from . import _entry  # noqa: F401  first: a signal during the imports below ends the process quietly

import functools
import json
import os
import secrets
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Optional

import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from rclpy.serialization import deserialize_message, serialize_message
from std_msgs.msg import String

from sequence_ai_msgs.action import RecordEpisode
from sequence_ai_msgs.srv import LabelEpisode

from . import codecs
from ._params import declare_parameters
from ._spin import spin_node
from .bag import COMPRESSED_SUFFIX, EPISODE_TOPIC, INSTRUCTION_TOPIC
from .bag.events import assembly_settings, provenance_custom_data
from .bag.frames import MAX_CLOCK_OFFSET_S
from .bag.reader import BagReadError, label_bag, label_event, read_episode
from .bag.stamps import has_header, header_stamp_ns, source_ns
from .bag.rates import STREAM_RATES_KEY, RateMeter, configured_rates, declare_rates, rates_summary
from .bag.writer import BagWriter, bag_size, own_bags, prune_bags

_PARAMS = {
    # name: (default, description)
    "output_dir": ("bags", "Folder for the bags (one subfolder per episode); relative = from the working directory."),
    "auto_record": (False, "Record around each Act goal of the driver (from its ~/episode markers)."),
    "driver_episode_topic": ("policy_driver/episode", "The driver's JSON episode-marker topic (std_msgs/String)."),
    "driver_instruction_topic": ("policy_driver/instruction", "Instruction swaps sent to the driver (std_msgs/String)."),
    "camera_views": (["exterior_1", "wrist_left"], "Camera view names (as the driver's camera_views)."),
    "camera_topics": (["camera/exterior_1/image_raw", "camera/wrist_left/image_raw"],
                      "Camera topic per view, same order as camera_views."),
    "camera_transports": ([""], "Per view: raw (sensor_msgs/Image, JPEG-compressed here) or compressed (stored as is); [''] = raw."),
    "joint_state_topic": ("joint_states", "sensor_msgs/JointState topic."),
    "joint_names": (["panda_joint1", "panda_joint2", "panda_joint3", "panda_joint4", "panda_joint5",
                     "panda_joint6", "panda_joint7"], "Arm joints in the policy's order (for RecordEpisode episodes)."),
    "gripper_joint": ("panda_gripper", "Joint-state name of the gripper; empty = none."),
    "max_sensor_age_s": (0.5, "Max sensor age written into RecordEpisode start markers (s)."),
    "command_topic": ("joint_commands", "The driver's command topic (as the driver's command_topic, or "
                                        "<arm_controller>/commands | /joint_trajectory for a ros2_control mode)."),
    "command_type": ("float64_multi_array", "Message type on command_topic: float64_multi_array "
                                            "(std_msgs/Float64MultiArray) or joint_trajectory (trajectory_msgs/JointTrajectory)."),
    "jpeg_quality": (90, "JPEG quality of recorded camera frames (1-100)."),
    "max_disk_mb": (2048.0, "Disk bound of the bags this recorder wrote in output_dir (MiB): before a bag starts, "
                            "the oldest of them are deleted until the rest leave room (a quarter of the bound, at "
                            "most 64 MiB); a bag that fills the bound drops further messages (counted in the end "
                            "marker and RecordEpisode result). Bags it did not write (another tool's or "
                            "recorder's, symlinks) are never deleted and do not count."),
    "max_episode_s": (600.0, "Time bound of a RecordEpisode goal whose max_seconds is 0 (s)."),
    "queue_size": (256, "Writer queue length (messages); when full, messages are dropped and counted."),
    "chunk_kib": (256, "MCAP chunk size bound (KiB): a SIGKILL loses at most the chunk being filled."),
    "chunk_s": (1.0, "MCAP chunk age bound (s)."),
    "control_frequency_hz": (0.0, "Rate the commands are published at (Hz), declared in RecordEpisode bags whose goal "
                                  "names none; 0 = measured (see Rates in the module docstring)."),
    "camera_rates_hz": ([0.0], "Per view, the camera's frame rate (Hz) declared in every bag; [0.0] = measured."),
    "joint_state_rate_hz": (0.0, "Joint-state rate (Hz) declared in every bag; 0 = measured."),
    "post_roll_s": (1.0, "After an Act end marker, the bag stays open (at most this long, s) until every sensor "
                         "stream has delivered a sample taken at or after the episode's last command (the "
                         "samples in force at the last step; see Post-roll in the module docstring); 0 = close at once."),
}

_COMMAND_TYPES = {"float64_multi_array": "std_msgs/msg/Float64MultiArray",
                  "joint_trajectory": "trajectory_msgs/msg/JointTrajectory"}
"""command_type -> the ROS type recorded from command_topic (a JointTrajectory command is read back
as its first point's positions, or velocities when it has none: ``bag.events.command_values``)."""


class EpisodeRecorder(Node):
    """Records episodes to bags (see the module docstring).

    Attributes useful to tests and tools: ``writer`` (the :class:`BagWriter`, with ``stats``),
    ``last_bag`` (path of the last closed bag), ``taps`` (callables ``(kind, key, raw, t_ns)``
    called from the subscription callbacks after enqueueing: ``kind`` is ``image``, ``joints`` or
    ``command``, ``key`` the view for images), ``preroll`` (bag topic -> the latest sensor
    message, written at the next episode start; see the module docstring).
    """

    def __init__(self, node_name: str = "episode_recorder", **kwargs) -> None:
        super().__init__(node_name, **kwargs)
        p = declare_parameters(self, _PARAMS)   # floats accept YAML integers (_params.py)
        self._p = p
        views, topics = list(p["camera_views"]), list(p["camera_topics"])
        if len(views) != len(topics):
            raise ValueError(f"camera_views has {len(views)} entries but camera_topics has {len(topics)}")
        transports = [t for t in (p["camera_transports"] or []) if t] or ["raw"] * len(views)
        if len(transports) != len(views) or any(t not in ("raw", "compressed") for t in transports):
            raise ValueError(f"camera_transports must be raw or compressed per view, got {p['camera_transports']}")
        if not 1 <= int(p["jpeg_quality"]) <= 100:
            raise ValueError(f"jpeg_quality must be 1..100, got {p['jpeg_quality']}")
        if float(p["max_disk_mb"]) <= 0:
            raise ValueError("max_disk_mb must be > 0")
        self.output_dir = Path(p["output_dir"]).expanduser().resolve()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.recorder_id = _recorder_id(self.output_dir)   # in every start marker: labels check it
        self._max_bytes = int(float(p["max_disk_mb"]) * 1024 * 1024)
        self.writer = BagWriter(queue_size=int(p["queue_size"]), chunk_bytes=int(p["chunk_kib"]) * 1024,
                                chunk_s=float(p["chunk_s"]), max_bag_bytes=self._max_bytes)
        self.taps: list = []
        self.last_bag: Optional[Path] = None
        self._episode: Optional[dict] = None      # start marker of the open episode
        self._episode_lock = threading.Lock()
        # pre-roll: bag topic -> (topic, msgtype, receipt t_ns, raw CDR, transform, source t_ns); guarded by
        # _stream_lock together with the recording switch, so each message is written once
        self.preroll: dict = {}
        self._recent_commands: deque = deque(maxlen=64)   # (receipt t_ns, raw CDR, source t_ns), for the start race
        self._command_times: list = []            # receipt t_ns of the commands written to the open bag
        self._command_cap: Optional[int] = None   # during the post-roll: at most this many commands
        self._stream_lock = threading.Lock()
        self._label: Optional[dict] = None        # label given while the open episode records
        self._quality = int(p["jpeg_quality"])

        # raw subscriptions: bytes in, bytes to the queue
        sensors = MutuallyExclusiveCallbackGroup()
        self._image_topics = {}
        for view, topic, transport in zip(views, topics, transports):
            # (raw, MessageInfo) callbacks: rclpy passes the info to a callable taking two arguments
            resolved, raw_images = self.resolve_topic_name(topic), transport == "raw"
            bag_topic = resolved + COMPRESSED_SUFFIX if raw_images else resolved
            kind = "sensor_msgs/msg/Image" if raw_images else "sensor_msgs/msg/CompressedImage"
            self.create_subscription(codecs.message_class(kind), topic,
                                     functools.partial(self._on_image, view, bag_topic, raw_images),
                                     qos_profile_sensor_data, callback_group=sensors, raw=True)
            self._image_topics[view] = bag_topic
        from sensor_msgs.msg import JointState

        if p["command_type"] not in _COMMAND_TYPES:
            raise ValueError(f"command_type must be one of {sorted(_COMMAND_TYPES)}, got {p['command_type']!r}")
        self._command_msgtype = _COMMAND_TYPES[p["command_type"]]
        self._joint_topic = self.resolve_topic_name(p["joint_state_topic"])
        self._command_topic = self.resolve_topic_name(p["command_topic"])
        self.create_subscription(JointState, p["joint_state_topic"], self._on_joints, qos_profile_sensor_data,
                                 callback_group=sensors, raw=True)
        self.create_subscription(codecs.message_class(self._command_msgtype), p["command_topic"], self._on_command, 50,
                                 callback_group=sensors, raw=True)
        self.rates = RateMeter()   # sensor times per stream: the rates a bag declares when none is configured
        self._configured = configured_rates(p, views, self._image_topics, self._joint_topic, self._command_topic)
        events = MutuallyExclusiveCallbackGroup()
        if p["auto_record"]:
            self.create_subscription(String, p["driver_episode_topic"], self._on_driver_episode, 10,
                                     callback_group=events)
        self.create_subscription(String, p["driver_instruction_topic"], self._on_instruction, 10,
                                 callback_group=events)
        labels, record = MutuallyExclusiveCallbackGroup(), ReentrantCallbackGroup()
        self.create_service(LabelEpisode, "~/label_episode", self._on_label, callback_group=labels)
        self._action_server = ActionServer(
            self, RecordEpisode, "~/record_episode", execute_callback=self._execute,
            goal_callback=self._on_goal, cancel_callback=lambda gh: CancelResponse.ACCEPT,
            callback_group=record)
        # what blocks runs on threads of its own (_spin.NodeExecutor): opening / closing a bag
        # (pruning, the writer's flush), a bag's rewrite for a label, a RecordEpisode goal's
        # episode; the sensor and command callbacks (enqueue only) run on the spinning thread
        self.blocking_callback_groups = [events, labels, record]
        self.get_logger().info(
            f"recording to {self.output_dir} ({'one bag per Act goal (auto_record)' if p['auto_record'] else 'on RecordEpisode goals'}); "
            f"cameras {dict(zip(views, topics))}, joints {self._joint_topic}, commands {self._command_topic}")

    # -- episodes ------------------------------------------------------------------------------
    @property
    def recording(self) -> bool:
        """True while an episode's bag is open."""
        return self._episode is not None

    def start_episode(self, start: dict) -> Path:
        """Open a bag for an episode and write its start marker and instruction.

        Args:
            start: the start marker (``event``, ``source``, ``task`` and assembly settings; see
                :mod:`sequence_ai_ros.bag.events`). ``image_topics`` is added.
        Returns:
            the bag directory.
        Raises:
            RuntimeError: an episode is already being recorded.
        """
        with self._episode_lock:
            if self._episode is not None:
                raise RuntimeError("an episode is already being recorded; stop it first")
            # disk bound: older bags keep at most max_disk_mb minus a margin for this one (a quarter,
            # at most 64 MiB); this bag may use what is left, then drops (counted) instead of growing
            margin = min(64 * 1024 * 1024, self._max_bytes // 4)
            # (only bags this recorder wrote count and are deleted: see prune_bags)
            deleted = prune_bags(self.output_dir, self._max_bytes - margin, self.recorder_id)
            for d in deleted:
                self.get_logger().warning(f"disk bound max_disk_mb={self._p['max_disk_mb']}: deleted old bag {d}")
            others = sum(bag_size(d) for d in own_bags(self.output_dir, self.recorder_id))
            self.writer.max_bag_bytes = max(margin, self._max_bytes - others)
            name = time.strftime("episode-%Y%m%d-%H%M%S") + f"-{time.time_ns() % 1_000_000_000:09d}"
            path = self.output_dir / name
            start = declare_rates({**start, "image_topics": dict(self._image_topics), "recorder": self.recorder_id},
                                  [*self._image_topics.values(), self._joint_topic, self._command_topic],
                                  self._configured, self.rates, self._command_topic)
            self.writer.open(path)
            t = time.time_ns()
            self._put_string(EPISODE_TOPIC, json.dumps(start), t)
            self._put_string(INSTRUCTION_TOPIC, str(start.get("task", "")), t)
            self._label = None
            with self._stream_lock:
                # the pre-roll, queued before any live message (callbacks wait for this lock)
                for entry in self.preroll.values():
                    self.writer.put(*entry[:5], source_ns=entry[5])
                since = start.get("t_ns")
                self._command_times, self._command_cap = [], None
                if isinstance(since, int):   # commands of this episode that beat its start marker here
                    for t_ns, raw, source in self._recent_commands:
                        if (source or t_ns) >= since:   # published (else received) after the marker was built
                            self._put_command(t_ns, raw, source)
                self.rates.begin()
                self._episode = start
            self.writer.flush()
            return path

    def stop_episode(self, end: Optional[dict] = None):
        """Write the end marker (``end`` plus drop counts) and close the bag; returns its BagStats.

        Raises:
            RuntimeError: no episode is being recorded.
        """
        with self._episode_lock:
            if self._episode is None:
                raise RuntimeError("no episode is being recorded")
            end = {"event": "end", "source": self._episode.get("source"), "t_ns": time.time_ns(),
                   "outcome": None, "label": {"success": None}, **(end or {})}
            if self._label is not None:   # given through ~/label_episode: it wins over the driver's check
                if end.get("label") != self._label:
                    end["label_check"] = end.get("label")
                end["label"] = dict(self._label)
            end["dropped"] = self.writer.stats.dropped
            end["measured_rates_hz"] = self.rates.episode_hz()
            with self._stream_lock:
                episode, self._episode = self._episode, None
            self.writer.set_custom_data(STREAM_RATES_KEY, json.dumps(rates_summary(episode, end["measured_rates_hz"])))
            for key, value in provenance_custom_data(episode, end).items():
                self.writer.set_custom_data(key, value)
            self._put_string(EPISODE_TOPIC, json.dumps(end), time.time_ns(), force=True)
            stats = self.writer.close()
            self.last_bag = stats.path
            self.get_logger().info(
                f"bag {stats.path}: {stats.written} messages, {stats.dropped} dropped, {stats.bytes / 1e6:.1f} MB")
            return stats

    def _put_string(self, topic: str, text: str, t_ns: int, force: bool = False) -> None:
        raw = serialize_message(String(data=text))
        ok = self.writer.put(topic, "std_msgs/msg/String", t_ns, raw, essential=True)
        if not ok and force:  # markers matter: wait for room rather than lose the end marker
            deadline = time.monotonic() + 5.0
            while not ok and time.monotonic() < deadline:
                time.sleep(0.005)
                ok = self.writer.put(topic, "std_msgs/msg/String", t_ns, raw, essential=True)

    # -- driver markers (auto_record) ---------------------------------------------------------
    def _on_driver_episode(self, msg: String) -> None:
        try:
            event = json.loads(msg.data)
        except ValueError:
            self.get_logger().error(f"unreadable episode marker ignored: {msg.data[:80]!r}")
            return
        if event.get("event") == "start":
            if self.recording:
                if self._episode.get("source") != "act":
                    return  # a RecordEpisode goal owns the recorder
                if _same_marker(self._episode, event):
                    return  # the driver's repeat of the marker this bag started on
                self.stop_episode({"outcome": None, "note": "a new Act goal started before this one's end marker"})
            self.start_episode(event)
        elif event.get("event") == "end" and self.recording and self._episode.get("source") == "act":
            self._post_roll(event)
            self.stop_episode(event)

    def _post_roll(self, end: dict) -> None:
        """Keep the open bag recording after an Act end marker until every sensor stream has a
        sample at or after the last command's receipt, at most ``post_roll_s`` (module docstring)."""
        limit = float(self._p["post_roll_s"])
        actions = (end.get("outcome") or {}).get("actions")
        actions = actions if isinstance(actions, int) and actions > 0 else None
        if limit <= 0:
            return
        with self._stream_lock:
            self._command_cap = None if actions is None else actions + 1   # the last action and the hold
        topics = [*self._image_topics.values(), self._joint_topic]
        deadline = time.monotonic() + limit
        while True:
            with self._stream_lock:
                times = self._command_times
                missing = 0 if actions is None else max(0, actions - len(times))
                last = times[min(len(times), actions or len(times)) - 1] if times else None
                behind = [t for t in topics if last is not None and _sensor_time(self.preroll.get(t)) < last]
            if not missing and not behind:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        self.get_logger().warning(
            f"post-roll: {limit:g} s after the end marker, "
            + (f"{missing} of the episode's {actions} commands had not arrived" if missing else
               f"{', '.join(behind)} had no sample taken at or after the last command")
            + ": the bag's last steps may lack their samples (post_roll_s)")

    def _on_instruction(self, msg: String) -> None:
        if self.recording and msg.data.strip():
            self._put_string(INSTRUCTION_TOPIC, msg.data.strip(), time.time_ns())

    # -- sensor / command callbacks: enqueue only ------------------------------------------------
    def _sensor(self, topic: str, msgtype: str, t_ns: int, raw: bytes, transform, info) -> None:
        """Keep a sensor message as its stream's pre-roll and, while recording, queue it (with its
        DDS source timestamp from rclpy's MessageInfo ``info``); the first time every stream has a
        pre-roll, log that once."""
        entry = (topic, msgtype, t_ns, raw, transform, source_ns(info))
        self.rates.add(topic, _sensor_time(entry))
        with self._stream_lock:
            first = topic not in self.preroll
            self.preroll[topic] = entry
            if self._episode is not None:
                self.writer.put(*entry[:5], source_ns=entry[5])
            complete = first and len(self.preroll) == len(self._image_topics) + 1
        if complete:   # once: decided under the lock, by the callback that completed the set
            self.get_logger().info(
                f"every sensor stream has delivered (cameras {sorted(self._image_topics)}, joint states "
                f"{self._joint_topic}): episodes started from now on begin with a pre-roll of each")

    def _on_image(self, view: str, bag_topic: str, compress: bool, raw: bytes, info) -> None:
        t = time.time_ns()
        if compress:
            self._sensor(bag_topic, "sensor_msgs/msg/Image", t, raw, self._compress, info)
        else:
            self._sensor(bag_topic, "sensor_msgs/msg/CompressedImage", t, raw, None, info)
        for tap in self.taps:
            tap("image", view, raw, t)

    def _on_joints(self, raw: bytes, info) -> None:
        t = time.time_ns()
        self._sensor(self._joint_topic, "sensor_msgs/msg/JointState", t, raw, None, info)
        for tap in self.taps:
            tap("joints", None, raw, t)

    def _on_command(self, raw: bytes, info) -> None:
        t, source = time.time_ns(), source_ns(info)
        self.rates.add(self._command_topic, source or t)
        with self._stream_lock:
            self._recent_commands.append((t, raw, source))
            if self._episode is not None and (self._command_cap is None or len(self._command_times) < self._command_cap):
                self._put_command(t, raw, source)
        for tap in self.taps:
            tap("command", None, raw, t)

    def _put_command(self, t_ns: int, raw: bytes, source_ns: Optional[int]) -> None:
        """Queue a command of the open bag and note its receipt time. Caller holds _stream_lock."""
        self.writer.put(self._command_topic, self._command_msgtype, t_ns, raw, source_ns=source_ns)
        self._command_times.append(t_ns)

    def _compress(self, raw: bytes):
        """Writer thread: ``sensor_msgs/Image`` CDR -> ``sensor_msgs/CompressedImage`` (JPEG) CDR."""
        import simplejpeg
        from sensor_msgs.msg import CompressedImage, Image

        from .observation import image_to_array

        img = deserialize_message(raw, Image)
        rgb = image_to_array(img)
        out = CompressedImage(header=img.header, format="rgb8; jpeg compressed rgb8")
        out.data = simplejpeg.encode_jpeg(rgb, quality=self._quality, colorspace="RGB")
        return "sensor_msgs/msg/CompressedImage", serialize_message(out)

    # -- labels ----------------------------------------------------------------------------------
    def label_episode(self, success: Optional[bool], notes: str = "", bag_path: str = "") -> Path:
        """Give an episode its success label (the dataset's ``next.success``).

        Args:
            success: the label (``None`` = unlabeled).
            notes: free text kept with the label.
            bag_path: empty = the episode being recorded (its end marker will carry the label;
                a label marker is written now too), or, when none is, the last bag closed;
                else a bag directory this recorder wrote (absolute, or relative to ``output_dir``),
                rewritten with a label marker added.
        Returns:
            the labeled bag's directory.
        Raises:
            RuntimeError: nothing to label (no episode recorded yet by this node).
            BagReadError: ``bag_path`` is not an episode bag, or not one this recorder wrote in its
                ``output_dir`` (checked after resolving symlinks; nothing is touched then).
        """
        label = {"success": None if success is None else bool(success), "notes": str(notes)}
        with self._episode_lock:
            open_bag = self.writer.stats.path if self._episode is not None else None
            target = (self.output_dir / Path(bag_path).expanduser()).resolve() if bag_path else None
            if self._episode is not None and (target is None or target == Path(open_bag).resolve()):
                self._label = label
                self._put_string(EPISODE_TOPIC, label_event(label["success"], label["notes"]), time.time_ns(),
                                 force=True)
                self.writer.flush()
                return Path(open_bag)
            if target is None:
                if self.last_bag is None:
                    raise RuntimeError("no episode has been recorded yet: nothing to label")
                target = Path(self.last_bag)
            else:
                self._check_own_bag(bag_path, target)
        label_bag(target, label["success"], label["notes"])
        return target

    def _check_own_bag(self, given: str, target: Path) -> None:
        """Refuse (BagReadError) a ``target`` that is not a bag folder directly in ``output_dir``
        whose start marker carries this recorder's id."""
        where = given if str(target) == given else f"{given} (resolves to {target})"
        if target.parent != self.output_dir:
            raise BagReadError(f"refused: {where} is not in this recorder's output_dir {self.output_dir}; "
                               "only bags this recorder wrote there can be labeled (label a copy with "
                               "`sequence-ai bag label PATH`)")
        start = read_episode(target).start   # BagReadError for what is not an episode bag
        if start.get("recorder") != self.recorder_id:
            raise BagReadError(f"refused: {where} was not written by this recorder (its start marker has "
                               f"recorder {start.get('recorder')!r}, this one is {self.recorder_id!r}); "
                               "label it with `sequence-ai bag label PATH`")

    def _on_label(self, request, response):
        try:
            response.bag_path = str(self.label_episode(request.success, request.notes, request.bag_path.strip()))
            response.ok = True
            self.get_logger().info(f"labeled {response.bag_path}: success={request.success}")
        except Exception as exc:   # BagReadError, OSError, ...: answered, never raised into the executor
            response.ok, response.bag_path = False, ""
            response.message = f"{type(exc).__name__}: {exc}"
            self.get_logger().warning(f"label refused: {response.message}")
        return response

    # -- RecordEpisode action --------------------------------------------------------------------
    def _on_goal(self, goal_request) -> GoalResponse:
        if not goal_request.task.strip():
            self.get_logger().warning("rejected RecordEpisode goal: empty task")
            return GoalResponse.REJECT
        hz = float(getattr(goal_request, "control_frequency_hz", 0.0))
        if self.recording or not (goal_request.max_seconds >= 0) or not (0.0 <= hz < float("inf")):
            self.get_logger().warning("rejected RecordEpisode goal: already recording, or a bad max_seconds "
                                      f"({goal_request.max_seconds}) or control_frequency_hz ({hz}; 0 or finite > 0)")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _execute(self, goal_handle):
        goal = goal_handle.request
        result = RecordEpisode.Result()
        limit = goal.max_seconds if goal.max_seconds > 0 else float(self._p["max_episode_s"])
        start = {"event": "start", "source": "record_episode", "task": goal.task.strip(),
                 "max_seconds": float(limit), "t_ns": time.time_ns(), **assembly_settings(self, self._p)}
        hz = float(getattr(goal, "control_frequency_hz", 0.0))
        if hz > 0:   # the goal's command rate wins over the parameter (bag.rates)
            start.update(stream_rates_hz={self._command_topic: hz}, stream_rate_sources={self._command_topic: "goal"})
        t0 = time.monotonic()
        try:
            self.start_episode(start)
        except Exception as exc:
            result.message = f"{type(exc).__name__}: {exc}"
            goal_handle.abort()
            return result
        while not goal_handle.is_cancel_requested and time.monotonic() - t0 < limit and rclpy.ok(context=self.context):
            time.sleep(0.05)
            fb = RecordEpisode.Feedback(elapsed_s=time.monotonic() - t0, messages=self.writer.stats.written,
                                        dropped=self.writer.stats.dropped)
            goal_handle.publish_feedback(fb)
        stats = self.stop_episode({"outcome": {"reason": "canceled" if goal_handle.is_cancel_requested else "timeout",
                                               "seconds": time.monotonic() - t0}})
        result.bag_path, result.messages, result.dropped = str(stats.path), stats.written, stats.dropped
        result.bytes, result.seconds = int(stats.bytes or bag_size(stats.path)), time.monotonic() - t0
        if goal_handle.is_cancel_requested:
            goal_handle.canceled()
        else:
            goal_handle.succeed()
        return result

    def destroy_node(self) -> None:
        try:
            if self.recording:
                self.stop_episode({"note": "recorder shut down"})
            self.writer.shutdown()
        finally:
            self._action_server.destroy()
            super().destroy_node()


def _sensor_time(entry) -> int:
    """Sensor time (ns) of a pre-roll entry ``(topic, msgtype, receipt t_ns, raw, transform,
    source t_ns)``: its header stamp when it has one on the receipts' clock (as the export places
    it), else its DDS source timestamp, else its receipt time; -1 for no entry."""
    if entry is None:
        return -1
    _, msgtype, t_ns, raw, _, source = entry
    stamp = header_stamp_ns(raw) if has_header(msgtype) else None
    if stamp is None or abs(t_ns - stamp) > MAX_CLOCK_OFFSET_S * 1e9:
        return source or t_ns
    return stamp


def _recorder_id(output_dir: Path) -> str:
    """This output_dir's recorder id (``<output_dir>/.recorder-id``, created 0600 on first start):
    every bag the recorder starts there carries it in its start marker."""
    path = output_dir / ".recorder-id"
    if not path.exists():
        tmp = output_dir / f".recorder-id.{os.getpid()}.{threading.get_ident()}"
        fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("rec-" + secrets.token_hex(8))
        try:
            os.link(tmp, path)       # appears whole, once: two recorders starting together agree
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


def main(args=None) -> int:
    """``ros2 run sequence_ai episode_recorder``: spin until Ctrl-C, close the open bag, shut down."""
    return spin_node(EpisodeRecorder, args=args)


def _same_marker(episode: dict, event: dict) -> bool:
    """True when start marker ``event`` is the one ``episode`` (the open bag's start) began on:
    the driver publishes each run's start marker again a moment later (``driver/execution.py``,
    ``START_MARKER_REPEAT_S``) for a recorder that missed the first."""
    return all(episode.get(k) == event.get(k) for k in ("goal_id", "t_ns", "task"))


if __name__ == "__main__":
    sys.exit(main(sys.argv))

