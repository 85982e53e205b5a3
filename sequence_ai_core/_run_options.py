"""LoopConfig: every keyword of one ``run()`` / ``act()``, checked once before the loop starts.

``AsyncPolicy.run`` builds it from its keywords (``_policy.py``); ``ControlLoop`` (``_loop.py``)
reads it. Kept apart from the loop so the loop module stays about driving.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ._freshness import CameraWatch

__all__ = ["LoopConfig", "MERGES"]

MERGES = ("replace", "aligned", "aligned_blend")


@dataclass
class LoopConfig:
    """Everything one run() / act() was asked to do (see AsyncPolicy.run for the meaning).

    The delay-aware options, documented here for ``run()``:

    - ``merge``: ``"replace"`` (queue each chunk behind the buffer), ``"aligned"`` (drop the
      rows whose time passed while the request was in flight; the row due now plays next, in
      place of the old plan) or ``"aligned_blend"`` (aligned, then cross-fade the first
      ``smooth_seam`` rows, ``BLEND_STEPS`` when 0, from the old plan on ``blend_dims`` only;
      never a delta space). None: ``aligned`` when the contract declares ``guided`` or
      ``trained``, else ``replace``.
    - ``delay_mode``: ``"chunk"``, ``"guided"`` or ``"trained"``; one the contract does not
      declare raises ``DelayUnsupported`` before the first action. None: the most capable
      declared (trained, guided, chunk).
    - ``blend_dims``: the continuous action dimensions (indices) ``aligned_blend`` may blend;
      required with it; leave a gripper out.
    - ``max_frame_age_s``: the most a camera stream may go without a new frame (s), one number
      or ``{view: s}``; a stale one ends the run with ``stale_camera`` (checked every control
      period). None: not checked. A view the contract does not declare is refused before motion
      (``InvalidRequest``, code ``unknown_view``).
    - ``stop_when``: ``(observation) -> bool``, called with what ``observe()`` returned once every
      control period, before that period's action; true ends the run ``stop_when`` (no hold).
    """

    observe: Callable[[], Any]
    act: Callable[[Any], Any]
    max_actions: Optional[int] = None
    max_seconds: Optional[float] = None
    validate: Optional[Callable[[Any], Any]] = None
    hold: Optional[Callable[[], Any]] = None
    on_underrun: Optional[Callable[[], Any]] = None
    until: Optional[Callable[[], Any]] = None
    prefetch: bool = True
    lookahead: int = 1
    smooth_seam: int = 0
    startup_timeout_s: float = 1800.0
    on_status: Optional[Callable[[str], Any]] = None
    on_chunk: Optional[Callable[[Any, int], Any]] = None
    on_warming: Optional[Callable[[float, Optional[float]], Any]] = None
    progress: Any = "auto"
    params: Optional[Dict[str, Any]] = None
    merge: Optional[str] = None
    delay_mode: Optional[str] = None
    blend_dims: Optional[Any] = None
    max_frame_age_s: Any = None
    stop_when: Optional[Callable[[Any], Any]] = None

    def check(self) -> None:
        """Raise ValueError for a merge / delay_mode / blend_dims that cannot work, TypeError for a
        stop_when that is not callable."""
        if self.stop_when is not None and not callable(self.stop_when):
            raise TypeError(f"stop_when must be a callable (observation) -> bool, or None, not "
                            f"{type(self.stop_when).__name__}")
        if self.merge is not None and self.merge not in MERGES:
            raise ValueError(f"merge must be one of {', '.join(MERGES)}, not {self.merge!r}")
        if self.delay_mode is not None and self.delay_mode not in ("chunk", "guided", "trained"):
            raise ValueError(f'delay_mode must be "chunk", "guided" or "trained", not {self.delay_mode!r}')
        if self.merge == "aligned_blend" and not self.blend_dims:
            raise ValueError('merge="aligned_blend" needs blend_dims=[...]: the continuous dimensions it may '
                             "blend (leave the gripper out)")
        if self.blend_dims is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                   for i in self.blend_dims):
            raise ValueError(f"blend_dims must be action dimension indices (ints >= 0), not {self.blend_dims!r}")
        CameraWatch(self.max_frame_age_s)
