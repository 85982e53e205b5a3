"""Observation-to-action latency of the driver: camera stamp -> first command published from that chunk.

For each chunk the driver plays, one sample (s, on the node's ROS clock, so sim time when
``use_sim_time`` is set):

    sample = (ROS time the chunk's first command was published) - (start of its observation)

where the start of an observation is the OLDEST camera header stamp among the frames it carried
(what the policy saw was at least that old); a frame stamped zero, or stamped after the
observation was taken (a camera on another clock), counts as taken at the observation's own time.
The publish time is read where the command leaves the driver (the gate's publisher thread,
``publish_delay_ms`` after the core's deadline, or the core's callback without it), so the
sample holds the frame's transport, the request's turnaround, the chunk's wait in the buffer
and the publish delay. A chunk whose first row never went out (a hold dropped it) gives none.

Which observation a chunk came from is carried by the request, never guessed from order or
time: the core tags each buffered chunk with the observation object its request was built from
(``observe()``'s own return value, kept with the request); :class:`ObservationMarks` keeps the
last observations the driver built with their start and build time, and finds a chunk's by that
object's identity. With prefetch (or ``lookahead`` >= 2) the driver has usually built the NEXT
request's observation before a chunk starts playing; pairing a chunk with "the last observation"
would credit it with that newer one. Nothing here imports rclpy.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Iterable, List, Optional, Tuple

__all__ = ["ChunkMark", "ObservationMarks", "chunk_observation", "observation_start_s", "p50_p99"]


def observation_start_s(observation, now_ros_s: float) -> float:
    """The start of ``observation`` (s, ROS clock): its oldest camera frame's ``timestamp_ms`` / 1000,
    ignoring frames stamped zero or after ``now_ros_s`` (the observation's own time, s), which is
    returned when no frame qualifies."""
    start = float(now_ros_s)
    for image in getattr(observation, "images", None) or ():
        ms = getattr(image, "timestamp_ms", None)
        if ms is None or not math.isfinite(float(ms)) or ms <= 0:
            continue
        start = min(start, float(ms) / 1000.0)
    return start


def chunk_observation(policy, chunk):
    """The observation ``chunk`` was computed on (the object ``observe()`` returned for its request),
    read from the core's tag on the buffer entry now playing ``chunk`` (``sequence_ai.Policy`` or its
    engine); None when that entry is not ``chunk``'s or its tag carries no observation."""
    engine = getattr(policy, "_engine", policy)
    entry = getattr(getattr(engine, "_buffer", None), "current", None)
    if entry is None or getattr(entry, "chunk", None) is not chunk:
        return None
    tag = getattr(entry, "tag", None)
    return tag[3] if isinstance(tag, tuple) and len(tag) > 3 else None


class ChunkMark:
    """What the gate carries with a chunk's first row: the output plan and its observation's times.

    Attributes:
        plan: the outputs' plan for the chunk (chunk-native trajectories), or None.
        obs_start_s: start of the chunk's observation (s, ROS clock), None when unknown.
        obs_built_s: when the driver built that observation (``time.monotonic()`` s), None when unknown.
    """

    __slots__ = ("plan", "obs_start_s", "obs_built_s")

    def __init__(self, plan, obs_start_s: Optional[float], obs_built_s: Optional[float] = None) -> None:
        self.plan = plan
        self.obs_start_s = obs_start_s
        self.obs_built_s = obs_built_s


class ObservationMarks:
    """The last observations built: ``(observation, monotonic s when built, start s on the ROS clock)``.

    Args:
        keep: how many to remember: more than the requests that can be in flight or queued at
            once (``lookahead`` <= 64, plus the one playing).
    """

    def __init__(self, keep: int = 80) -> None:
        self._marks: deque = deque(maxlen=int(keep))

    def clear(self) -> None:
        """Forget every mark (a new run)."""
        self._marks.clear()

    def add(self, observation, built_mono_s: float, start_ros_s: float) -> None:
        """``observation`` handed to the core at ``built_mono_s`` (monotonic s), starting at ``start_ros_s``."""
        self._marks.append((observation, float(built_mono_s), float(start_ros_s)))

    def find(self, observation) -> Optional[Tuple[float, float]]:
        """``(built monotonic s, start ROS s)`` of the newest mark of this very object (identity),
        None when ``observation`` is None or no longer remembered."""
        if observation is None:
            return None
        for obs, built, start in reversed(list(self._marks)):
            if obs is observation:
                return built, start
        return None


def p50_p99(values: Iterable[float]) -> Tuple[float, float]:
    """(median, 99th percentile) of ``values`` (s), linear between ranks; (0.0, 0.0) when empty."""
    xs: List[float] = sorted(float(v) for v in values)
    if not xs:
        return 0.0, 0.0

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = int(math.floor(pos))
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return q(0.5), q(0.99)
