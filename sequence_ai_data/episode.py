"""Episodes as dataset writers see them: one frame per control step, whatever the source.

:class:`EpisodeFrames` is the one input of the dataset writer (:mod:`sequence_ai_data.lerobot`):
a robot bag becomes one in ``sequence_ai_ros.bag.frames`` (``frames_from_bag``), an episode kept
by a worker in :mod:`sequence_ai_data.kept`. ROS-free: numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np


class ExportError(RuntimeError):
    """An episode cannot be turned into dataset frames (the message says which and why)."""


class StreamRateError(ExportError):
    """A stream's times disagree with its declared rate, so one frame per message at that rate
    would compress or stretch the episode's time.

    Attributes: ``source`` (the bag), ``stream`` (its topic), ``declared_hz`` and ``measured_hz``
    (Hz), ``time_source`` (``"header"``: from its header stamps; ``"receive"``: receipt times).
    """

    def __init__(self, message: str, *, source: str = "", stream: str = "", declared_hz: Optional[float] = None,
                 measured_hz: Optional[float] = None, time_source: str = "") -> None:
        super().__init__(message)
        self.source, self.stream, self.time_source = source, stream, time_source
        self.declared_hz, self.measured_hz = declared_hz, measured_hz


@dataclass
class EpisodeFrames:
    """One episode, one frame per control step (the dataset writer's input).

    Attributes:
        task: the task string (the instruction in force at the start).
        fps: frames per second (Hz); frame ``k`` is at ``k / fps`` s.
        images: ``{view: (T, H, W, 3) uint8 RGB}`` -> ``observation.images.<view>``.
        state: ``(T, D) float32`` (joint positions rad, then the gripper) -> ``observation.state``.
        action: ``(T, A) float32`` commands -> ``action``.
        success: the episode's label -> ``next.success`` (True on the last frame only when
            True; ``None`` = unlabeled, written as all False).
        state_names / action_names: names per dimension (``info.json`` ``names``).
        source: where it came from (bag path or episode id), for messages.
        tasks: per-frame task (instruction in force), length T; defaults to ``task`` everywhere.
        cut: the bag had no end marker (the recording was cut, e.g. by a crash): the episode has
            no outcome and its last chunk may be missing. False for synthetic episodes.
        timing: how the frames were timed (a bag's: declared and measured rates per stream, time
            sources, recorded vs exported duration in s; ``warnings``: what the user should know);
            ``None`` for sources that do not report it.
        provenance: the contract the episode was recorded under, as its bag carried it:
            ``{"contract": {"observation", "action"} | None, "policy": {"model", "version"} | None,
            "seams": {seam statistics} | None, "stream_rates": {topic: {"hz", "origin",
            "measured_hz"}}}`` (``sequence_ai_ros.bag.events.provenance``); ``None`` = unknown.
        state_groups / action_groups: ``{name: [start, end)}`` index ranges of ``state`` / ``action``
            by body part (GR00T's ``meta/modality.json``); ``None`` = one group over all of it.
    """

    task: str
    fps: float
    images: dict
    state: np.ndarray
    action: np.ndarray
    success: Optional[bool] = None
    state_names: List[str] = field(default_factory=list)
    action_names: List[str] = field(default_factory=list)
    source: str = ""
    tasks: Optional[List[str]] = None
    cut: bool = False
    timing: Optional[dict] = None
    provenance: Optional[dict] = None
    state_groups: Optional[dict] = None
    action_groups: Optional[dict] = None

    def __post_init__(self) -> None:
        n = len(self.state)
        if n == 0:
            raise ExportError(f"{self.source or 'episode'}: no frames")
        if len(self.action) != n or any(len(v) != n for v in self.images.values()):
            raise ExportError(f"{self.source}: frame counts differ (state {n}, action {len(self.action)}, "
                              f"images { {k: len(v) for k, v in self.images.items()} })")
        if self.tasks is None:
            self.tasks = [self.task] * n

    @property
    def length(self) -> int:
        """Number of frames (control steps)."""
        return len(self.state)


def control_rate_hz(times_ns: List[int]) -> float:
    """Control rate measured from command log times: 1 / median period (Hz).

    Raises:
        ExportError: fewer than 2 commands.
    """
    if len(times_ns) < 2:
        raise ExportError("fewer than 2 commands: cannot measure the control rate; pass --fps")
    return float(1e9 / np.median(np.diff(np.asarray(times_ns, dtype=np.int64))))
