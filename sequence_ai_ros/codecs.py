"""Message codecs: ROS messages in (cameras, joint state), joint commands out.

A small registry keyed by the ROS type name (``"sensor_msgs/msg/Image"``), so a robot with its
own message types plugs in a decoder or encoder from its own module and needs no fork:

    from sequence_ai_ros import codecs

    def decode_my_state(msg):                       # -> JointSample
        return codecs.JointSample(names=list(msg.joint_names), positions=list(msg.q))

    codecs.register_joint_decoder("my_robot_msgs/msg/ArmState", decode_my_state)

and name that module in the driver's ``codec_modules`` parameter (it is imported at start).

Built in:

* image decoders: ``sensor_msgs/msg/Image`` (rgb8, bgr8, rgba8, bgra8) and
  ``sensor_msgs/msg/CompressedImage`` (JPEG or PNG; a JPEG is passed through, not re-encoded);
* joint decoder: ``sensor_msgs/msg/JointState`` (positions, picked later by name);
* command encoders: ``float64_multi_array`` (``std_msgs/Float64MultiArray``, a ros2_control
  forward controller), ``joint_trajectory`` (``trajectory_msgs/JointTrajectory``, one point due
  one control period ahead) and ``joint_state`` (``sensor_msgs/JointState``).

This module imports no rclpy: message classes are imported from their Python packages.
"""
from __future__ import annotations

import importlib
import io
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

__all__ = [
    "DecodedImage", "JointSample", "CommandEncoder", "SensorDataError",
    "register_image_decoder", "register_joint_decoder", "register_command_encoder",
    "image_decoder", "joint_decoder", "command_encoder", "message_class", "IMAGE_TRANSPORTS",
]

#: Short names for the camera transports the driver's ``camera_transports`` parameter accepts.
IMAGE_TRANSPORTS = {"raw": "sensor_msgs/msg/Image", "compressed": "sensor_msgs/msg/CompressedImage"}


class SensorDataError(ValueError):
    """A sensor message cannot be decoded (wrong encoding, truncated data, unreadable JPEG)."""


@dataclass
class DecodedImage:
    """One decoded camera frame.

    rgb: ``(height, width, 3)`` uint8 RGB array; jpeg: the original JPEG bytes when the message
    already carried a JPEG of exactly this frame (sent as is, never re-encoded), else None.
    """

    rgb: np.ndarray
    jpeg: Optional[bytes] = None


@dataclass
class JointSample:
    """One joint reading: names and positions (rad, or m for a prismatic gripper), same order."""

    names: List[str]
    positions: List[float]


@dataclass
class CommandEncoder:
    """How one action row becomes a message.

    msg_type: ``"pkg/msg/Type"``; encode(values, joint_names, period_s, interface, now_msg) -> msg,
    where values are the row (floats), joint_names name each value (arm joints then gripper),
    period_s is the control period (s), interface is ``"position"`` or ``"velocity"`` and now_msg
    a ``builtin_interfaces/Time`` for headers (or None).
    """

    msg_type: str
    encode: Callable[..., object]


_IMAGE: Dict[str, Callable[[object], DecodedImage]] = {}
_JOINT: Dict[str, Callable[[object], JointSample]] = {}
_COMMAND: Dict[str, CommandEncoder] = {}


def message_class(type_name: str):
    """Import a ROS message class from ``"pkg/msg/Type"`` (or ``"pkg/Type"``).

    Raises:
        ValueError: the name is malformed or the package/type is not installed.
    """
    parts = type_name.split("/")
    if len(parts) == 2:
        parts = [parts[0], "msg", parts[1]]
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"message type {type_name!r} must look like 'pkg/msg/Type'")
    try:
        return getattr(importlib.import_module(f"{parts[0]}.{parts[1]}"), parts[2])
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"message type {type_name!r} is not installed: {exc}") from None


def register_image_decoder(type_name: str, decode: Callable[[object], DecodedImage]) -> None:
    """Register ``decode(msg) -> DecodedImage`` for camera messages of ``type_name``; raise
    :class:`SensorDataError` from it for a message that cannot be used."""
    _IMAGE[type_name] = decode


def register_joint_decoder(type_name: str, decode: Callable[[object], JointSample]) -> None:
    """Register ``decode(msg) -> JointSample`` for joint-state messages of ``type_name``."""
    _JOINT[type_name] = decode


def register_command_encoder(name: str, encoder: CommandEncoder) -> None:
    """Register a command encoder under ``name`` (the driver's ``command_type`` parameter)."""
    _COMMAND[name] = encoder


def _lookup(table: dict, key: str, what: str):
    if key not in table:
        raise ValueError(f"no {what} registered for {key!r}; known: {sorted(table)}. "
                         "Register one in a module named by the codec_modules parameter.")
    return table[key]


def image_decoder(type_name: str) -> Callable[[object], DecodedImage]:
    """The decoder for camera messages of ``type_name``. Raises ValueError when none is registered."""
    return _lookup(_IMAGE, type_name, "image decoder")


def joint_decoder(type_name: str) -> Callable[[object], JointSample]:
    """The decoder for joint messages of ``type_name``. Raises ValueError when none is registered."""
    return _lookup(_JOINT, type_name, "joint decoder")


def command_encoder(name: str) -> CommandEncoder:
    """The command encoder called ``name``. Raises ValueError when none is registered."""
    return _lookup(_COMMAND, name, "command encoder")


# -- built-in decoders ---------------------------------------------------------------------

_RAW_CHANNELS = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4}


def decode_raw_image(msg) -> DecodedImage:
    """``sensor_msgs/Image`` (rgb8, bgr8, rgba8, bgra8) -> RGB.

    Raises:
        SensorDataError: another encoding, or data shorter than height * step, or a step
            smaller than width * channels.
    """
    enc = str(msg.encoding).lower()
    channels = _RAW_CHANNELS.get(enc)
    if channels is None:
        raise SensorDataError(
            f"image encoding {msg.encoding!r} is not supported; publish rgb8, bgr8, rgba8 or bgra8")
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    if h <= 0 or w <= 0:
        raise SensorDataError(f"image is {w}x{h}: width and height must be > 0")
    if step < w * channels:
        raise SensorDataError(f"image step {step} is smaller than width*channels = {w * channels}")
    buf = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    if buf.size < h * step:
        raise SensorDataError(f"image data holds {buf.size} bytes, expected {h * step} (height*step)")
    arr = buf[: h * step].reshape(h, step)[:, : w * channels].reshape(h, w, channels)
    if enc.startswith("bgr"):
        arr = arr[:, :, 2::-1]
    return DecodedImage(np.ascontiguousarray(arr[:, :, :3]))


def decode_compressed_image(msg) -> DecodedImage:
    """``sensor_msgs/CompressedImage`` (JPEG or PNG) -> RGB; a JPEG's bytes are kept to send as is.

    Raises:
        SensorDataError: the bytes are not a readable image.
    """
    from PIL import Image, UnidentifiedImageError

    data = bytes(msg.data)
    try:
        img = Image.open(io.BytesIO(data))
        fmt = img.format
        rgb = np.asarray(img.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise SensorDataError(f"compressed image (format {msg.format!r}) cannot be decoded: {exc}") from None
    return DecodedImage(np.ascontiguousarray(rgb), jpeg=data if fmt == "JPEG" else None)


def decode_joint_state(msg) -> JointSample:
    """``sensor_msgs/JointState`` -> names + positions.

    Raises:
        SensorDataError: fewer positions than names.
    """
    names, pos = list(msg.name), list(msg.position)
    if len(pos) < len(names):
        raise SensorDataError(f"joint state has {len(names)} names but {len(pos)} positions")
    return JointSample(names=names, positions=[float(x) for x in pos[: len(names)]])


register_image_decoder("sensor_msgs/msg/Image", decode_raw_image)
register_image_decoder("sensor_msgs/msg/CompressedImage", decode_compressed_image)
register_joint_decoder("sensor_msgs/msg/JointState", decode_joint_state)


# -- built-in encoders ---------------------------------------------------------------------

def _encode_multi_array(values: Sequence[float], joint_names, period_s, interface, now_msg):
    from std_msgs.msg import Float64MultiArray

    return Float64MultiArray(data=[float(v) for v in values])


def _encode_trajectory(values: Sequence[float], joint_names, period_s, interface, now_msg):
    from builtin_interfaces.msg import Duration
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    point = JointTrajectoryPoint()
    if interface == "velocity":
        point.velocities = [float(v) for v in values]
    else:
        point.positions = [float(v) for v in values]
    ns = int(round(period_s * 1e9))
    point.time_from_start = Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)
    msg = JointTrajectory(joint_names=list(joint_names), points=[point])
    if now_msg is not None:
        msg.header.stamp = now_msg
    return msg


def _encode_joint_state(values: Sequence[float], joint_names, period_s, interface, now_msg):
    from sensor_msgs.msg import JointState

    msg = JointState(name=list(joint_names))
    if interface == "velocity":
        msg.velocity = [float(v) for v in values]
    else:
        msg.position = [float(v) for v in values]
    if now_msg is not None:
        msg.header.stamp = now_msg
    return msg


register_command_encoder("float64_multi_array", CommandEncoder("std_msgs/msg/Float64MultiArray", _encode_multi_array))
register_command_encoder("joint_trajectory", CommandEncoder("trajectory_msgs/msg/JointTrajectory", _encode_trajectory))
register_command_encoder("joint_state", CommandEncoder("sensor_msgs/msg/JointState", _encode_joint_state))
