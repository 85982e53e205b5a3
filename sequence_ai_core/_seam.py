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

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

__all__ = ["seam_jump", "smooth", "should_smooth", "blend", "SeamRecord", "SeamSummary"]


@dataclass(frozen=True)
class SeamRecord:
    """One seam: where a new chunk took over.

    Attributes:
        delay_steps: the delay its request was sent with (control steps; 0 when none was known).
        consumed: actions executed while its request was in flight (control steps).
        trimmed: rows dropped because their time had passed (aligned merges; 0 for replace).
        jump_before: max per-dimension |row due - last executed action|, before any blend
            (the action space's units).
        jump_after: the same after the blend / smoothing (equal to jump_before without one).
        playback_left_s: seconds of motion still buffered when the chunk arrived (s).
        blended: rows changed by a blend or ramp.
    """

    delay_steps: int
    consumed: int
    trimmed: int
    jump_before: float
    jump_after: float
    playback_left_s: float
    blended: int = 0


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class SeamSummary:
    """The seams of one run (``RunOutcome.seams``): the run's first chunk is not a seam.

    Attributes:
        count: seams.
        jump_p50 / jump_p99: median / 99th percentile of the jump after any blend (units of
            the action space); ``jump_before_p99`` the same before it.
        max_jump: the largest jump after any blend.
        max_delay_steps: the largest delay a request was sent with (control steps).
        trimmed: rows dropped over the run because their time had passed.
        blended: rows changed by a blend or ramp over the run.
        min_playback_left_s: the least motion still buffered when a chunk arrived (s); None
            without seams.
        records: every ``SeamRecord``, in order.
    """

    count: int = 0
    jump_p50: float = 0.0
    jump_p99: float = 0.0
    jump_before_p99: float = 0.0
    max_jump: float = 0.0
    max_delay_steps: int = 0
    trimmed: int = 0
    blended: int = 0
    min_playback_left_s: Optional[float] = None
    records: List[SeamRecord] = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, records: Sequence[SeamRecord]) -> "SeamSummary":
        """Summarise ``records``."""
        records = list(records)
        if not records:
            return cls()
        after = [r.jump_after for r in records]
        return cls(count=len(records), jump_p50=_quantile(after, 0.5), jump_p99=_quantile(after, 0.99),
                   jump_before_p99=_quantile([r.jump_before for r in records], 0.99), max_jump=max(after),
                   max_delay_steps=max(r.delay_steps for r in records), trimmed=sum(r.trimmed for r in records),
                   blended=sum(r.blended for r in records),
                   min_playback_left_s=min(r.playback_left_s for r in records), records=records)


def blend(new_rows: Sequence[Sequence[float]], old_rows: Sequence[Sequence[float]], dims: Sequence[int],
          steps: int) -> List[List[float]]:
    """Cross-fade the first ``steps`` rows of ``new_rows`` from ``old_rows`` (the plan they
    replace, row for row at the same times) on dimensions ``dims`` only; other dimensions and
    later rows are the new chunk's own. Row j's weight on the new plan is (j + 1) / (steps + 1).
    Where the old plan is shorter, its last row is held."""
    out = [list(map(float, row)) for row in new_rows]
    if not old_rows:
        return out
    for j in range(min(steps, len(out))):
        w = (j + 1) / (steps + 1)
        old = old_rows[min(j, len(old_rows) - 1)]
        row = out[j]
        for i in dims:
            if 0 <= i < len(row) and i < len(old):
                row[i] = float(old[i]) + w * (row[i] - float(old[i]))
    return out


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
