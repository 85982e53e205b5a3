"""Observation assembly: ROS sensor messages -> one ``sequence_ai.Observation``.

This is the first hop of the data path (robot topics -> observation -> core -> worker ``/act``).
The live driver node uses it, and so will the rosbag exporter, so what a policy sees live and
what a dataset holds are built by the same code.

Rules kept here:

* each camera frame is JPEG-encoded at most once (quality 95, the spec's codec), lazily, the
  first time an observation needs it, and cached with the frame;
* joint states are reordered into the policy's joint order by name, never by position;
* a stream older than ``max_age_s`` raises :class:`StaleSensorError` instead of feeding the
  policy an old picture of the world.

It imports no rclpy: messages are read by attribute (``sensor_msgs/Image``,
``sensor_msgs/JointState``), so the same code runs on deserialized bag messages.
"""
from __future__ import annotations

import base64
import io
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from sequence_ai import ImageFrame, Observation, Proprioception

#: JPEG quality used for every frame sent to a policy (spec 002: "encodes JPEG at quality 95").
JPEG_QUALITY = 95


class SensorError(RuntimeError):
    """A sensor stream cannot be turned into an observation (base class)."""


class MissingSensorError(SensorError):
    """A camera or the joint state has not been received yet."""


class StaleSensorError(SensorError):
    """A camera frame or joint state is older than the allowed age."""


def image_to_array(msg) -> np.ndarray:
    """Convert a ``sensor_msgs/Image`` (rgb8, bgr8, rgba8, bgra8) to an RGB array.

    Returns:
        ``(height, width, 3)`` uint8 RGB array (a copy; safe to keep).

    Raises:
        ValueError: the encoding is not one of the four above.
    """
    enc = msg.encoding.lower()
    channels = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4}.get(enc)
    if channels is None:
        raise ValueError(
            f"image encoding {msg.encoding!r} is not supported; publish rgb8, bgr8, rgba8 or bgra8"
        )
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    buf = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    if buf.size < h * step:
        raise ValueError(f"image data holds {buf.size} bytes, expected {h * step} (height*step)")
    arr = buf[: h * step].reshape(h, step)[:, : w * channels].reshape(h, w, channels)
    if enc.startswith("bgr"):
        arr = arr[:, :, 2::-1]
    return np.ascontiguousarray(arr[:, :, :3])


def encode_jpeg_b64(rgb: np.ndarray, quality: int = JPEG_QUALITY) -> str:
    """JPEG-encode an ``(H, W, 3)`` uint8 RGB array and return it base64 (ASCII str)."""
    from PIL import Image  # the 'image' extra; the ROS package always has it

    out = io.BytesIO()
    Image.fromarray(rgb, mode="RGB").save(out, format="JPEG", quality=quality)
    return base64.b64encode(out.getvalue()).decode("ascii")


@dataclass
class _Frame:
    rgb: np.ndarray
    stamp_s: float          # sensor time (header stamp) in s
    received_mono_s: float  # time.monotonic() at receipt
    _jpeg: Optional[str] = field(default=None, repr=False)

    def jpeg_b64(self, quality: int) -> str:
        if self._jpeg is None:  # encode once per frame, however many observations use it
            self._jpeg = encode_jpeg_b64(self.rgb, quality)
        return self._jpeg


def stamp_to_s(stamp) -> float:
    """``builtin_interfaces/Time`` -> seconds (float)."""
    return float(stamp.sec) + float(stamp.nanosec) * 1e-9


class ObservationAssembler:
    """Keeps the latest frame per camera view and the latest joint state; builds observations.

    Args:
        views: camera view names in the policy's vocabulary (e.g. ``["exterior_1", "wrist_left"]``).
        joint_names: the arm joints in the policy's order (``joint_positions``, rad).
        gripper_joint: the ``JointState`` name carrying the gripper value, or ``None`` for no
            gripper field.
        max_age_s: a frame or joint state received longer ago than this (monotonic clock) makes
            :meth:`build` raise :class:`StaleSensorError`. Default 0.5 s (7 periods at 15 Hz).
        jpeg_quality: JPEG quality for frames (default 95, the spec's codec).
        clock: monotonic clock, injectable for tests.
    Thread-safe: subscription callbacks call ``on_*`` while the control loop calls ``build``.
    """

    def __init__(
        self,
        views: Sequence[str],
        joint_names: Sequence[str],
        gripper_joint: Optional[str] = None,
        max_age_s: float = 0.5,
        jpeg_quality: int = JPEG_QUALITY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not views:
            raise ValueError("at least one camera view is required")
        if not joint_names:
            raise ValueError("joint_names is empty: list the arm joints in the policy's order")
        if max_age_s <= 0:
            raise ValueError(f"max_age_s must be > 0 s, got {max_age_s}")
        self.views = list(views)
        self.joint_names = list(joint_names)
        self.gripper_joint = gripper_joint
        self.max_age_s = float(max_age_s)
        self.jpeg_quality = int(jpeg_quality)
        self._clock = clock
        self._lock = threading.Lock()
        self._frames: dict[str, _Frame] = {}
        self._joints: Optional[tuple[list[float], Optional[float], float, float]] = None

    # -- inputs (subscription callbacks) --------------------------------------------------
    def on_image(self, view: str, msg) -> None:
        """Store a ``sensor_msgs/Image`` for ``view`` (decoding only; JPEG happens lazily)."""
        frame = _Frame(image_to_array(msg), stamp_to_s(msg.header.stamp), self._clock())
        with self._lock:
            self._frames[view] = frame

    def on_joint_state(self, msg) -> None:
        """Store a ``sensor_msgs/JointState``; joints are picked by name.

        Raises:
            ValueError: a configured joint is missing from the message (names it).
        """
        index = {name: i for i, name in enumerate(msg.name)}
        missing = [n for n in self.joint_names if n not in index]
        if self.gripper_joint is not None and self.gripper_joint not in index:
            missing.append(self.gripper_joint)
        if missing:
            raise ValueError(
                f"joint state lacks {missing}; it has {list(msg.name)}. "
                "Set the driver's joint_names / gripper_joint parameters to match the robot."
            )
        q = [float(msg.position[index[n]]) for n in self.joint_names]
        g = float(msg.position[index[self.gripper_joint]]) if self.gripper_joint else None
        with self._lock:
            self._joints = (q, g, stamp_to_s(msg.header.stamp), self._clock())

    # -- outputs ------------------------------------------------------------------------------
    def latest_joint_positions(self) -> Optional[list[float]]:
        """Latest arm joint positions in policy order (rad), or ``None`` before the first one."""
        with self._lock:
            return None if self._joints is None else list(self._joints[0])

    def latest_gripper(self) -> Optional[float]:
        with self._lock:
            return None if self._joints is None else self._joints[1]

    def ready(self) -> bool:
        """True once every view and the joint state have been received at least once."""
        with self._lock:
            return self._joints is not None and all(v in self._frames for v in self.views)

    def build(self, instruction: str) -> Observation:
        """Assemble the observation the policy reads now.

        Returns:
            ``sequence_ai.Observation`` with one JPEG frame per view, ``joint_positions`` (rad,
            policy order), ``gripper`` (1 value) when configured, and ``instruction``.

        Raises:
            MissingSensorError: a view or the joint state has never arrived.
            StaleSensorError: one of them is older than ``max_age_s``.
        """
        now = self._clock()
        with self._lock:
            frames = {v: self._frames.get(v) for v in self.views}
            joints = self._joints
        missing = [v for v, f in frames.items() if f is None]
        if joints is None:
            missing.append("joint_state")
        if missing:
            raise MissingSensorError(f"no data received yet from {missing}")
        stale = {v: now - f.received_mono_s for v, f in frames.items() if now - f.received_mono_s > self.max_age_s}
        if now - joints[3] > self.max_age_s:
            stale["joint_state"] = now - joints[3]
        if stale:
            ages = ", ".join(f"{k} {age * 1000:.0f} ms" for k, age in stale.items())
            raise StaleSensorError(f"stale sensor data ({ages} old; max_age_s={self.max_age_s})")
        images = [
            ImageFrame(view=v, data=f.jpeg_b64(self.jpeg_quality), timestamp_ms=int(f.stamp_s * 1000))
            for v, f in frames.items()
        ]
        q, g, _, _ = joints
        proprio = Proprioception(joint_positions=q, gripper=None if g is None else [g])
        return Observation(images=images, proprioception=proprio, instruction=instruction)
