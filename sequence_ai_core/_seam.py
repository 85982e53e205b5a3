"""The seam: where one chunk hands over to the next.

Two things happen at a seam and they are kept apart on purpose:

- ``seam_jump`` *measures* the largest per-dimension distance between the last executed action
  and the first row of the next chunk. It is computed before any blending, so smoothing can
  never hide what it smooths. ``RunOutcome.max_seam_jump`` is the largest over a run, in the
  action space's own units.
- ``smooth`` *changes* numbers on their way to the motors, so it is opt-in (``smooth_seam=N``)
  and guarded twice by the caller: only absolute action spaces, and never the first chunk of a
  run. A delta or velocity chunk passes through untouched: blending increments would move the
  arm somewhere the model never asked for.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

__all__ = ["seam_jump", "smooth", "should_smooth"]


def seam_jump(last_action: Optional[Sequence[float]], first_row: Sequence[float]) -> float:
    """max_i |first_row[i] - last_action[i]| over the shared dimensions; 0.0 with no last action."""
    if last_action is None:
        return 0.0
    n = min(len(last_action), len(first_row))
    return max((abs(float(first_row[i]) - float(last_action[i])) for i in range(n)), default=0.0)


def should_smooth(steps: int, *, absolute: bool, first_chunk: bool) -> bool:
    """The two guards: smoothing asked for, an absolute action space, not the run's first chunk."""
    return steps > 0 and absolute and not first_chunk


def smooth(rows: Sequence[Sequence[float]], last_action: Sequence[float], steps: int) -> List[List[float]]:
    """Ramp the first ``steps`` rows linearly out of ``last_action``; later rows are copied as is.

    Row j (0-based, j < steps) becomes ``last + (j + 1) / (steps + 1) * (row_j - last)``, so the
    blend weight climbs 1/(N+1), 2/(N+1), ... and row N is the model's own row again.
    """
    out = [list(map(float, row)) for row in rows]
    n = min(steps, len(out))
    for j in range(n):
        w = (j + 1) / (steps + 1)
        row = out[j]
        for i in range(min(len(row), len(last_action))):
            row[i] = float(last_action[i]) + w * (row[i] - float(last_action[i]))
    return out
