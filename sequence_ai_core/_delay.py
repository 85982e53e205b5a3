"""The inference delay, in control steps, and the committed prefix a request carries.

While a request is in flight the robot keeps playing the rows it already holds; by the time the
answer lands, some of them have been executed. A delay-aware policy (``delay_modes`` guided /
trained) is told which: the committed prefix, and how many control steps the delay is.

Decisions, in one place:

- The delay is counted in control steps actually consumed: the actions executed between the
  request's observation and its answer (``_loop._harvest``: an index delta), at whatever rate
  the loop plays, which is the policy's declared ``control_frequency_hz``. Never a wall-clock
  latency multiplied by an assumed rate (a default 30 Hz turns 0.3 s at 10 Hz into 9 steps
  instead of 3).
- The steps planned for are the MAXIMUM of the run's last ``WINDOW`` requests (like the refill
  plan, ``_prefetch.py``): a policy told too short a delay plans rows that are already gone. The
  window is bounded, so a warm-up spike is forgotten after ``WINDOW`` further requests instead
  of staying the maximum forever; the connection's first request is cold (connect, load) and
  never enters it (nor is it sent as the next request's delay). A run starts a fresh window.
- Before any motion no action has been consumed: a start-up measurement is the turnaround in
  seconds times the declared control frequency, rounded up (``steps_for``).
- The prefix is the rows the buffer will play from the observation on, as they will be played;
  it holds at least ``delay_steps`` rows, padded by holding its last row (never zeros, which a
  normalised policy decodes to the dataset mean). Before the first chunk there is none (None).
- Delta action spaces (a row is one step): each prefix row is re-anchored to the pose at the
  observation, the sum of the committed steps up to it, so it does not depend on the frame of
  the chunk it came from, and holding the last row means standing still (holding a raw delta
  row would keep moving).
"""
from __future__ import annotations

import math
from collections import deque
from typing import Deque, List, Optional, Sequence

__all__ = ["DelayEstimate", "committed_prefix", "steps_for", "is_delta", "WINDOW"]

#: How many recent requests the delay maximum is taken over.
WINDOW = 16


def is_delta(action_space: Optional[str]) -> bool:
    """True for a delta action space (``joint_delta``, ``ee_delta``): a row is one step."""
    return bool(action_space) and "delta" in str(action_space)


def steps_for(seconds: float, control_frequency_hz: float) -> int:
    """Control steps a delay of ``seconds`` (s) spans at ``control_frequency_hz`` (Hz), rounded up.

    Raises ValueError for a frequency that is not a positive number."""
    if not control_frequency_hz or control_frequency_hz <= 0:
        raise ValueError(f"control_frequency_hz must be > 0, not {control_frequency_hz!r}")
    return max(0, math.ceil(max(0.0, float(seconds)) * float(control_frequency_hz) - 1e-9))


class DelayEstimate:
    """The worst of the last ``window`` inference delays (control steps), the first excluded.

    One per connected policy (``AsyncPolicy._delay``), kept across its runs.

    Args:
        window: how many recent requests to keep (default ``WINDOW``); must be >= 1.

    Raises:
        ValueError: window < 1.
    """

    def __init__(self, window: int = WINDOW) -> None:
        if int(window) < 1:
            raise ValueError(f"window must be at least 1 request, not {window!r}")
        self._samples: Deque[int] = deque(maxlen=int(window))
        self._cold: Optional[int] = None

    def add(self, steps: int) -> None:
        """Record one request's delay: the actions consumed while it was in flight (steps).

        The first call records the cold request (``cold``), which is not planned for."""
        value = max(0, int(steps))
        if self._cold is None:
            self._cold = value
            return
        self._samples.append(value)

    def new_run(self) -> None:
        """Forget the window (a new run plans from its own delays); the cold request stays
        recorded, so a later run's first request is a steady sample."""
        self._samples.clear()

    @property
    def cold(self) -> Optional[int]:
        """The first (cold) request's delay (steps), or None before any request."""
        return self._cold

    @property
    def samples(self) -> int:
        """Steady-state samples in the window (the cold request not counted)."""
        return len(self._samples)

    @property
    def steps(self) -> Optional[int]:
        """The delay to plan for (steps): the window's maximum; None before a steady sample."""
        return max(self._samples) if self._samples else None


def committed_prefix(upcoming: Sequence[Sequence[float]], delay_steps: int, action_space: Optional[str],
                     last_action: Optional[Sequence[float]] = None) -> Optional[List[List[float]]]:
    """The prefix a request carries: ``upcoming`` (the rows the buffer will play from the
    observation on, in order) padded to at least ``delay_steps`` rows by holding the last row.

    With nothing upcoming, the last executed action held (``last_action``); with neither,
    None (a cold start). For delta spaces each row is re-anchored: row j is the sum of the
    steps 0..j (the displacement from the pose at the observation), and the padding holds it.
    """
    rows = [list(map(float, r)) for r in upcoming]
    if not rows:
        if last_action is None:
            return None
        rows = [[0.0] * len(last_action)] if is_delta(action_space) else [list(map(float, last_action))]
    elif is_delta(action_space):
        total = [0.0] * len(rows[0])
        anchored = []
        for r in rows:
            total = [t + v for t, v in zip(total, r)]
            anchored.append(list(total))
        rows = anchored
    while len(rows) < max(1, int(delay_steps)):
        rows.append(list(rows[-1]))
    return rows
