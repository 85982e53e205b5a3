"""Observation assembly: robot sensor messages -> one ``sequence_ai.Observation``.

The first hop of the data path (robot topics -> observation -> core -> worker ``/act``). The live
driver node uses it and so does the rosbag exporter, so what a policy sees live and what a
dataset holds are built by the same code (no train/serve skew).

Rules kept here, per stream (each camera view, and ``joint_state``):

* time base (:class:`StreamRule.time_base`): ``"receive"`` -- a sample's time is when it arrived
  (monotonic clock); ``"header"`` -- its ``header.stamp``, compared with ``header_clock`` (the
  node's ROS clock live, the bag's clock offline). Receive time is the default: it survives
  robots whose clocks are not synchronised with this machine.
* alignment (:class:`StreamRule.align`), applied when an observation is built at time *t*:
  ``"latest"`` -- the newest sample; ``"asof"`` -- the newest sample whose time is <= *t* (a
  sample stamped after the control tick is not used yet); ``"drop"`` -- each sample feeds at
  most one observation, and a stream with no new sample since the last observation is a
  problem (for sensors that must be fresh every chunk).
* age: a selected sample older than ``max_age_s`` is stale. :meth:`ObservationAssembler.build`
  raises :class:`StaleSensorError`; :meth:`ObservationAssembler.problems` lists it, which is
  how the driver ends a run with reason ``validate`` and a hold (stale sensors never feed the
  policy silently).
* camera freshness (when ``max_frame_age_s`` is given, as the live driver does): each view has a
  maximum frame age: the time since its last *fresh* frame -- one whose pixels differ from the
  frame before it (unless ``frozen_pixels=False``) and whose header stamp advanced. A frozen camera (the same picture again, or stamps
  that stop advancing) and a stalled one (no frames) both exceed it; :meth:`ObservationAssembler.stale_cameras`
  names them and :meth:`ObservationAssembler.build` raises :class:`StaleCameraError` for the first,
  so the driver stops requesting chunks, holds and ends the run with reason ``stale_camera``.
* malformed data (wrong encoding, wrong size, truncated bytes, a joint missing): the message is
  dropped, the stream records a *fault* (a sentence naming the stream and what is wrong) that
  stays until :meth:`ObservationAssembler.clear_faults`; the driver turns it into a ``validate``
  ending.
* each camera frame is JPEG-encoded at most once (quality 95, the codec every policy receives), lazily, the
  first time an observation needs it; a frame that arrived as a JPEG is sent as is.
* joint states are reordered into the policy's joint order by name, never by position.

It imports no rclpy: messages are read by attribute and decoded through
:mod:`sequence_ai_ros.codecs`, so the same code runs on deserialized bag messages.
"""
from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from sequence_ai import ImageFrame, Observation, Proprioception, encode_jpeg_bytes

from . import codecs
from .codecs import DecodedImage, SensorDataError

#: JPEG quality used for every frame sent to a policy: every camera frame goes out as JPEG at quality 95.
JPEG_QUALITY = 95
#: The stream name of the joint state in rules, faults and problems.
JOINT_STREAM = "joint_state"
TIME_BASES = ("receive", "header")
ALIGNMENTS = ("latest", "asof", "drop")
_HISTORY = 16  # samples kept per stream for the asof / drop rules


class SensorError(RuntimeError):
    """A sensor stream cannot be turned into an observation (base class)."""


class MissingSensorError(SensorError):
    """A camera or the joint state has not been received yet (or has no usable sample)."""


class StaleSensorError(SensorError):
    """A camera frame or joint state is older than the allowed age, or (``drop``) not new."""


class StaleCameraError(StaleSensorError):
    """A camera has had no fresh frame (new pixels, an advancing stamp) for longer than its
    ``max_frame_age_s``: frozen or stalled. ``stream`` names the view."""

    def __init__(self, stream: str, message: str) -> None:
        super().__init__(message)
        self.stream = stream


def frame_digest(rgb: np.ndarray) -> bytes:
    """A 16-byte BLAKE2b digest of a frame's pixels ``(H, W, 3)`` uint8, to tell a repeated frame."""
    return hashlib.blake2b(np.ascontiguousarray(rgb).data, digest_size=16).digest()


@dataclass
class _Freshness:
    """Per camera: the last frame's digest and stamp, when a fresh frame last came, and the
    frames since then that were not fresh (``repeats``: same pixels; ``stuck``: stamp did not
    advance)."""

    digest: bytes
    stamp_s: float
    fresh_mono_s: float
    repeats: int = 0
    stuck: int = 0


def image_to_array(msg) -> np.ndarray:
    """Convert a ``sensor_msgs/Image`` (rgb8, bgr8, rgba8, bgra8) to a ``(H, W, 3)`` uint8 RGB copy.

    Raises:
        ValueError (:class:`codecs.SensorDataError`): another encoding or truncated data.
    """
    return codecs.decode_raw_image(msg).rgb


def encode_jpeg(rgb: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    """Raw JPEG bytes of an ``(H, W, 3)`` uint8 RGB array, by the client's own encoder
    (``sequence_ai.encode_jpeg_bytes``: simplejpeg / libjpeg-turbo, else Pillow)."""
    return encode_jpeg_bytes(rgb, quality, size=(rgb.shape[1], rgb.shape[0]))


def stamp_to_s(stamp) -> float:
    """``builtin_interfaces/Time`` -> seconds (float)."""
    return float(stamp.sec) + float(stamp.nanosec) * 1e-9


@dataclass(frozen=True)
class StreamRule:
    """Time base and alignment of one stream (see the module docstring).

    Raises:
        ValueError: an unknown time base or alignment (names the allowed values).
    """

    time_base: str = "receive"
    align: str = "latest"

    def __post_init__(self) -> None:
        if self.time_base not in TIME_BASES:
            raise ValueError(f"time base {self.time_base!r} is not one of {TIME_BASES}")
        if self.align not in ALIGNMENTS:
            raise ValueError(f"alignment {self.align!r} is not one of {ALIGNMENTS}")


@dataclass
class _Frame:
    rgb: np.ndarray
    stamp_s: float          # header stamp (s)
    received_mono_s: float  # monotonic clock at receipt (s)
    _jpeg: Optional[bytes] = field(default=None, repr=False)

    def jpeg(self, quality: int) -> bytes:
        """The frame as raw JPEG bytes, encoded once however many observations use it (a frame
        that arrived as a JPEG is sent as is); the /act body carries them unchanged."""
        if self._jpeg is None:
            self._jpeg = encode_jpeg(self.rgb, quality)
        return self._jpeg


@dataclass
class _Joints:
    q: List[float]
    gripper: Optional[float]
    stamp_s: float
    received_mono_s: float


@dataclass
class _Sample:
    value: object          # _Frame or _Joints
    used: bool = False


class ObservationAssembler:
    """Keeps recent camera frames and joint states per stream; builds observations.

    Args:
        views: camera view names in the policy's vocabulary (e.g. ``["exterior_1", "wrist_left"]``).
        joint_names: the arm joints in the policy's order (``joint_positions``, rad).
        gripper_joint: the joint-state name carrying the gripper value, or ``None`` for no
            gripper field.
        max_age_s: a selected sample older than this (s, in its stream's time base) is stale.
            Default 0.5 s (7 periods at 15 Hz); the driver's ``max_sensor_age_s`` sets it.
        jpeg_quality: JPEG quality for frames (default 95, the codec every policy receives).
        clock: monotonic clock (s) for receive times, injectable for tests.
        rules: ``{stream: StreamRule}`` per view and/or ``"joint_state"``; missing streams use
            ``StreamRule()`` (receive time, latest).
        header_clock: "now" in the header stamps' time base (s); default ``time.time`` (a ROS
            node passes its clock; the bag exporter the bag's time).
        camera_sizes: ``{view: (width, height)}`` (px) the policy declared; a frame of another
            size is a fault. Empty = any size.
        max_frame_age_s: ``{view: s}``, the most a camera may go without a fresh frame (see the
            module docstring; views not given use ``max_age_s``); None (default) checks no
            camera's freshness (the bag exporter: recorded frames are what they are).
        frozen_pixels: a frame with the same pixels as the one before is not fresh (default;
            a real sensor's noise makes every frame differ). False for simulated cameras, which
            render a still scene identically: then only stamps and arrivals count.

    Raises:
        ValueError: no views, no joint names, or max_age_s <= 0.

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
        rules: Optional[Mapping[str, StreamRule]] = None,
        header_clock: Callable[[], float] = time.time,
        camera_sizes: Optional[Mapping[str, Tuple[int, int]]] = None,
        max_frame_age_s: Optional[Mapping[str, float]] = None,
        frozen_pixels: bool = True,
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
        self.rules: Dict[str, StreamRule] = {s: StreamRule() for s in self.streams}
        for stream, rule in (rules or {}).items():
            if stream not in self.rules:
                raise ValueError(f"rule for unknown stream {stream!r}; streams are {self.streams}")
            self.rules[stream] = rule
        self.camera_sizes = dict(camera_sizes or {})
        self.max_frame_age_s: Optional[Dict[str, float]] = None
        if max_frame_age_s is not None:
            self.set_max_frame_age(max_frame_age_s)
        self.frozen_pixels = bool(frozen_pixels)
        self._fresh: Dict[str, _Freshness] = {}
        self._clock = clock
        self._header_clock = header_clock
        self._lock = threading.Lock()
        self._hist: Dict[str, deque] = {s: deque(maxlen=_HISTORY) for s in self.streams}
        self._faults: Dict[str, str] = {}

    @property
    def streams(self) -> List[str]:
        """Stream names: the camera views, then ``"joint_state"``."""
        return [*self.views, JOINT_STREAM]

    # -- inputs (subscription callbacks) --------------------------------------------------
    def on_image(self, view: str, msg, type_name: str = "sensor_msgs/msg/Image") -> None:
        """Decode and store a camera message for ``view`` (JPEG encoding happens lazily).

        Raises:
            SensorDataError: the message cannot be used (also recorded as the view's fault).
        """
        try:
            decoded = codecs.image_decoder(type_name)(msg)
        except SensorDataError as exc:
            self._fault(view, f"camera {view!r}: {exc}")
            raise
        self.on_frame(view, decoded, stamp_to_s(msg.header.stamp))

    def on_frame(self, view: str, image: DecodedImage, stamp_s: float) -> None:
        """Store an already decoded frame for ``view`` (``stamp_s``: its header time, s).

        Raises:
            SensorDataError: the view is unknown or the frame is not the declared size.
        """
        if view not in self._hist or view == JOINT_STREAM:
            raise SensorDataError(f"unknown camera view {view!r}; views are {self.views}")
        h, w = int(image.rgb.shape[0]), int(image.rgb.shape[1])
        want = self.camera_sizes.get(view)
        if want is not None and (w, h) != (int(want[0]), int(want[1])):
            text = (f"camera {view!r}: frame is {w}x{h} px but the policy declares {want[0]}x{want[1]}; "
                    "resize it upstream or fix the camera topic")
            self._fault(view, text)
            raise SensorDataError(text)
        frame = _Frame(image.rgb, float(stamp_s), self._clock(), _jpeg=image.jpeg)
        digest = frame_digest(image.rgb) if self.max_frame_age_s is not None and self.frozen_pixels else b""
        with self._lock:
            self._hist[view].append(_Sample(frame))
            self._note_freshness(view, digest, frame)

    def _note_freshness(self, view: str, digest: bytes, frame: "_Frame") -> None:
        """Record whether ``frame`` is fresh (new pixels and, for stamped streams, a later
        stamp than the last frame's). Caller holds the lock."""
        last = self._fresh.get(view)
        if last is None:
            self._fresh[view] = _Freshness(digest, frame.stamp_s, frame.received_mono_s)
            return
        same = self.frozen_pixels and digest == last.digest
        stuck = frame.stamp_s <= last.stamp_s and not (frame.stamp_s == 0.0 and last.stamp_s == 0.0)
        if same or stuck:
            last.repeats += int(same)
            last.stuck += int(stuck)
        else:
            last.fresh_mono_s, last.repeats, last.stuck = frame.received_mono_s, 0, 0
        last.digest, last.stamp_s = digest, max(last.stamp_s, frame.stamp_s)

    def set_max_frame_age(self, ages: Mapping[str, float]) -> None:
        """Check camera freshness with ``{view: s}`` maximum frame ages (others: ``max_age_s``).
        Raises ValueError for an unknown view or an age <= 0."""
        for view, age in ages.items():
            if view not in self.views:
                raise ValueError(f"max_frame_age_s for unknown camera view {view!r}; views are {self.views}")
            if not float(age) > 0:
                raise ValueError(f"max_frame_age_s for {view!r} must be > 0 s, got {age}")
        self.max_frame_age_s = {v: float(a) for v, a in ages.items()}

    def frame_age_limit(self, view: str) -> float:
        """The maximum frame age of ``view`` (s): its own, else ``max_age_s``."""
        return (self.max_frame_age_s or {}).get(view, self.max_age_s)

    def stale_cameras(self) -> Dict[str, str]:
        """``{view: sentence}`` for each camera whose last fresh frame is older than its maximum
        frame age: frozen (frames keep coming, the same picture or a stamp that does not advance)
        or stalled (no frames). Views that never delivered are not listed (see :meth:`ready`);
        empty when freshness is not checked (``max_frame_age_s=None``)."""
        if self.max_frame_age_s is None:
            return {}
        now = self._clock()
        out: Dict[str, str] = {}
        with self._lock:
            for view in self.views:
                f = self._fresh.get(view)
                if f is None:
                    continue
                age, limit = now - f.fresh_mono_s, self.frame_age_limit(view)
                if age <= limit:
                    continue
                if f.repeats:
                    how = f"frozen: {f.repeats} identical frame(s) since the last new picture"
                elif f.stuck:
                    how = f"frozen: header stamp stuck at {f.stamp_s:.3f} s for {f.stuck} frame(s)"
                else:
                    how = "stalled: no frame received"
                out[view] = (f"camera {view!r} {how}; no fresh frame for {age * 1000:.0f} ms "
                             f"(max_frame_age_s={limit:g}); check the camera and its driver")
        return out

    def on_joint_state(self, msg, type_name: str = "sensor_msgs/msg/JointState") -> None:
        """Decode and store a joint-state message; joints are picked by name.

        Raises:
            SensorDataError: undecodable, or a configured joint is missing (names it; recorded
                as the ``joint_state`` fault).
        """
        try:
            sample = codecs.joint_decoder(type_name)(msg)
            index = {name: i for i, name in enumerate(sample.names)}
            missing = [n for n in self.joint_names if n not in index]
            if self.gripper_joint is not None and self.gripper_joint not in index:
                missing.append(self.gripper_joint)
            if missing:
                raise SensorDataError(
                    f"joint state lacks {missing}; it has {sample.names}. "
                    "Set the driver's joint_names / gripper_joint parameters to match the robot.")
        except SensorDataError as exc:
            self._fault(JOINT_STREAM, f"joint_state: {exc}")
            raise
        q = [float(sample.positions[index[n]]) for n in self.joint_names]
        g = float(sample.positions[index[self.gripper_joint]]) if self.gripper_joint else None
        header = getattr(msg, "header", None)
        stamp = stamp_to_s(header.stamp) if header is not None else self._header_clock()
        with self._lock:
            self._hist[JOINT_STREAM].append(_Sample(_Joints(q, g, stamp, self._clock())))

    def _fault(self, stream: str, text: str) -> None:
        with self._lock:
            self._faults.setdefault(stream, text)

    def clear_faults(self) -> None:
        """Forget recorded faults (the driver calls it when a run starts)."""
        with self._lock:
            self._faults.clear()

    @property
    def faults(self) -> Dict[str, str]:
        """``{stream: sentence}`` for streams that delivered a malformed message since the last clear."""
        with self._lock:
            return dict(self._faults)

    # -- outputs ------------------------------------------------------------------------------
    def _latest_joints(self) -> Optional[_Joints]:
        with self._lock:
            hist = self._hist[JOINT_STREAM]
            return hist[-1].value if hist else None

    def latest_joint_positions(self) -> Optional[List[float]]:
        """Latest arm joint positions in policy order (rad), or ``None`` before the first one."""
        j = self._latest_joints()
        return None if j is None else list(j.q)

    def latest_gripper(self) -> Optional[float]:
        """Latest gripper value, or ``None`` (none configured or none received)."""
        j = self._latest_joints()
        return None if j is None else j.gripper

    def ready(self) -> bool:
        """True once every view and the joint state have been received at least once."""
        with self._lock:
            return all(self._hist[s] for s in self.streams)

    def _time_of(self, stream: str, value) -> Tuple[float, float]:
        """(sample time, now) in the stream's time base (s)."""
        if self.rules[stream].time_base == "header":
            return value.stamp_s, self._header_clock()
        return value.received_mono_s, self._clock()

    def _select(self, stream: str, consume: bool) -> Tuple[Optional[object], Optional[str]]:
        """The sample the stream's alignment rule picks now, or (None, why not). Caller holds the lock."""
        hist = self._hist[stream]
        if not hist:
            return None, "no data received yet"
        rule = self.rules[stream].align
        if rule == "latest":
            return hist[-1].value, None
        if rule == "asof":
            for sample in reversed(hist):
                t, now = self._time_of(stream, sample.value)
                if t <= now:
                    return sample.value, None
            return None, "every sample is stamped after the control tick"
        last = hist[-1]  # drop
        if last.used:
            return None, "no new sample since the last observation (alignment 'drop')"
        if consume:
            for sample in hist:
                sample.used = True
        return last.value, None

    def problems(self) -> List[str]:
        """Why an observation built now would be refused: faults, then missing or stale streams.

        Empty when all is well. Each entry is a sentence naming the stream (ms ages). Reading
        it consumes nothing.
        """
        out = [text for text in self.faults.values()]
        with self._lock:
            for stream in self.streams:
                if self.rules[stream].align == "drop":  # 'not new' is judged per observation, not per tick
                    value, why = (self._hist[stream][-1].value, None) if self._hist[stream] else (None, "no data received yet")
                else:
                    value, why = self._select(stream, consume=False)
                if value is None:
                    out.append(f"{stream}: {why}")
                    continue
                t, now = self._time_of(stream, value)
                if now - t > self.max_age_s:
                    out.append(f"{stream}: stale, {(now - t) * 1000:.0f} ms old (max_sensor_age_s={self.max_age_s})")
        return out

    def build(self, instruction: str, strict: bool = True) -> Observation:
        """Assemble the observation the policy reads now.

        Args:
            instruction: the task text carried in the observation.
            strict: refuse stale samples (default). ``strict=False`` uses whatever each stream
                holds (the driver's fallback for the very first request, whose actions
                ``validate`` then refuses).

        Returns:
            ``sequence_ai.Observation`` with one JPEG frame per view (``timestamp_ms`` from the
            header stamp), ``joint_positions`` (rad, policy order), ``gripper`` (1 value) when
            configured, and ``instruction``.

        Raises:
            MissingSensorError: a stream has never delivered (or has no sample the rule allows).
            StaleSensorError: a selected sample is older than ``max_age_s`` (strict only).
            StaleCameraError: a camera had no fresh frame within its maximum frame age (strict only).
        """
        if strict:
            frozen = self.stale_cameras()
            if frozen:
                view = next(iter(frozen))
                raise StaleCameraError(view, frozen[view])
        chosen: Dict[str, object] = {}
        missing, stale = [], []
        with self._lock:
            for stream in self.streams:
                value, why = self._select(stream, consume=False)
                if value is None:
                    if strict or why == "no data received yet":
                        (missing if why == "no data received yet" else stale).append(f"{stream} ({why})")
                    if why == "no data received yet" or strict:
                        continue
                    value = self._hist[stream][-1].value
                t, now = self._time_of(stream, value)
                if strict and now - t > self.max_age_s:
                    stale.append(f"{stream} {(now - t) * 1000:.0f} ms old")
                chosen[stream] = value
            if missing:
                raise MissingSensorError(f"no usable data from {missing}")
            if stale:
                raise StaleSensorError(f"stale sensor data ({', '.join(stale)}; max_age_s={self.max_age_s})")
            for stream in self.streams:
                self._select(stream, consume=True)
        images = [
            ImageFrame(view=v, data=chosen[v].jpeg(self.jpeg_quality), timestamp_ms=int(chosen[v].stamp_s * 1000))
            for v in self.views
        ]
        j = chosen[JOINT_STREAM]
        proprio = Proprioception(joint_positions=list(j.q), gripper=None if j.gripper is None else [j.gripper])
        return Observation(images=images, proprioception=proprio, instruction=instruction)
