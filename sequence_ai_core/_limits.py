"""The client's last guard: declared bounds and max_delta, applied across chunk boundaries.

The worker already clips every chunk into the model's declared limits (``bounds``,
``max_delta``) and names each clipped value in the response's warnings. It sees one chunk at
a time, though, so it cannot know the step from the last action *executed* on the robot to the
first row of the next chunk. This module closes that gap, right before a row reaches ``act``:

- ``bounds`` (one ``[low, high]`` per dimension): every row, every action space. A conforming
  worker never sends a value outside them, so for it this changes nothing; it is what makes
  "no action outside the declared bounds reaches act" true whatever the server did.
- ``max_delta`` (the most one step may move from the last, a float or one per dimension):
  absolute action spaces only, measured from the last executed row, so it holds across seams.
  A delta or velocity row *is* the step; bounding "the change between two increments" would
  rewrite increments the model chose, so delta chunks pass through untouched (their
  magnitude is what ``bounds`` limits).

Pure Python, no numpy: rows are short lists and this runs once per action.
"""
from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Tuple

from ._types import is_absolute_action_space

__all__ = ["Limits"]


def _per_dim(value: Any, dim: int) -> Optional[List[float]]:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return [abs(float(value))] * dim
    values = [abs(float(v)) for v in value]
    return values if values else None


class Limits:
    """Declared limits of one model's action contract.

    Args:
        bounds: ``[[low, high], ...]`` one pair per dimension (units of the action space), or None.
        max_delta: the largest change between consecutive executed rows, one float for every
            dimension or one per dimension (action-space units per step), or None.
        action_space: the declared action space; ``max_delta`` applies only when it is absolute.
    """

    def __init__(self, bounds: Optional[Sequence[Sequence[float]]] = None,
                 max_delta: Any = None, action_space: Optional[str] = None) -> None:
        self.low: Optional[List[float]] = None
        self.high: Optional[List[float]] = None
        if bounds:
            self.low = [float(pair[0]) for pair in bounds]
            self.high = [float(pair[1]) for pair in bounds]
        self.action_space = action_space
        self.absolute = is_absolute_action_space(action_space)
        dim = len(self.low) if self.low is not None else (
            len(max_delta) if isinstance(max_delta, (list, tuple)) else 0)
        self.max_delta = _per_dim(max_delta, dim) if isinstance(max_delta, (list, tuple)) else (
            None if max_delta is None else abs(float(max_delta)))

    @classmethod
    def from_contract(cls, action: Optional[Mapping[str, Any]]) -> Optional["Limits"]:
        """Limits from the handshake's action contract; None when it declares none."""
        if not action or (not action.get("bounds") and action.get("max_delta") is None):
            return None
        return cls(action.get("bounds"), action.get("max_delta"), action.get("action_space"))

    def _delta(self, i: int) -> Optional[float]:
        md = self.max_delta
        if md is None:
            return None
        if isinstance(md, list):
            return md[i] if i < len(md) else None
        return md

    def apply(self, row: Sequence[float], last: Optional[Sequence[float]],
              action_space: Optional[str] = None) -> Tuple[List[float], int]:
        """The row as it may reach the robot, and how many values were changed.

        Args:
            row: the next action (floats).
            last: the last action executed, or None at the start of a run (no step to bound).
            action_space: the chunk's own action space (falls back to the declared one).

        Returns:
            ``(row, n_clipped)``: a new list when anything changed, ``row`` itself otherwise.
        """
        absolute = is_absolute_action_space(action_space) if action_space else self.absolute
        out: Optional[List[float]] = None
        clipped = 0
        for i, value in enumerate(row):
            v = float(value)
            if absolute and last is not None and i < len(last):
                md = self._delta(i)
                if md is not None:
                    prev = float(last[i])
                    if v > prev + md:
                        v = prev + md
                    elif v < prev - md:
                        v = prev - md
            if self.low is not None and i < len(self.low):
                if v < self.low[i]:
                    v = self.low[i]
                elif v > self.high[i]:  # type: ignore[index]
                    v = self.high[i]  # type: ignore[index]
            if v != value and v == v:  # changed (NaN compares unequal to itself: not ours to fix)
                if out is None:
                    out = [float(x) for x in row]
                out[i] = v
                clipped += 1
        return (out if out is not None else list(row)), clipped
