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

Which observation a chunk came from: the core tags each buffered chunk with the time its
observation was taken (its loop clock, ``time.monotonic()`` in the driver); :class:`ObservationMarks`
keeps the last observations the driver built, by their monotonic time, and picks the newest one
taken at or before that tag. Nothing here imports rclpy.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Iterable, List, Optional, Tuple

__all__ = ["ChunkMark", "ObservationMarks", "chunk_observed_at", "observation_start_s", "p50_p99"]


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


def chunk_observed_at(policy, chunk) -> Optional[float]:
    """When the observation ``chunk`` was computed on was taken (the core's loop clock, monotonic s),
    read from the core's tag on the buffer entry now playing ``chunk`` (``sequence_ai.Policy`` or
    its engine); None when that entry is not ``chunk``'s or carries no such time."""
    engine = getattr(policy, "_engine", policy)
    entry = getattr(getattr(engine, "_buffer", None), "current", None)
    if entry is None or getattr(entry, "chunk", None) is not chunk:
        return None
    tag = getattr(entry, "tag", None)
    return float(tag[2]) if isinstance(tag, tuple) and len(tag) > 2 else None


class ChunkMark:
    """What the gate carries with a chunk's first row: the output plan and its observation's start.

    Attributes:
        plan: the outputs' plan for the chunk (chunk-native trajectories), or None.
        obs_start_s: start of the chunk's observation (s, ROS clock), None when unknown.
    """

    __slots__ = ("plan", "obs_start_s")

    def __init__(self, plan, obs_start_s: Optional[float]) -> None:
        self.plan = plan
        self.obs_start_s = obs_start_s


class ObservationMarks:
    """The last observations built, as ``(monotonic s when built, start s on the ROS clock)``.

    Args:
        keep: how many to remember (one request is in flight at a time: a few are plenty).
    """

    def __init__(self, keep: int = 16) -> None:
        self._marks: deque = deque(maxlen=int(keep))

    def clear(self) -> None:
        """Forget every mark (a new run)."""
        self._marks.clear()

    def add(self, built_mono_s: float, start_ros_s: float) -> None:
        """One observation handed to the core at ``built_mono_s`` (monotonic s), starting at ``start_ros_s``."""
        self._marks.append((float(built_mono_s), float(start_ros_s)))

    def start_for(self, taken_mono_s: Optional[float]) -> Optional[float]:
        """The start (ROS s) of the newest observation built at or before ``taken_mono_s`` (the
        core's tag on a chunk, monotonic s); None when it is unknown or none was built by then."""
        if taken_mono_s is None:
            return None
        found = None
        for built, start in list(self._marks):
            if built <= taken_mono_s + 1e-9:
                found = start
        return found


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
