"""The client's last guard: declared bounds and max_delta, applied across chunk boundaries.

The worker already clips every chunk into the model's declared limits (``bounds``,
``max_delta``) and names each clipped value in the response's warnings. It sees one chunk at
a time, though, so it cannot know the step from the last action *executed* on the robot to the
first row of the next chunk. This module closes that gap, right before a row reaches ``act``.

What ``max_delta`` bounds depends on what a row means (``max_delta_rule``); the worker's
``finish_chunk`` applies the same rule inside a chunk:

- absolute spaces (``joint_absolute``, ``ee_absolute``) and velocity spaces (``joint_velocity``):
  a row is a level the robot is commanded to (a target, a speed), so a step is the change
  between consecutive commanded rows. It is measured from the last *executed* row, seams
  included: the first row of a new chunk may move at most ``max_delta`` from it.
- delta spaces (``joint_delta``, ``ee_delta``): a row *is* the step, so ``max_delta`` bounds each
  value's magnitude, ``|row[d]| <= max_delta[d]``. A seam adds nothing (the previous increment
  does not change what this one moves), and the row-to-row difference of two increments is not
  a motion, so it is not bounded.

``bounds`` (one ``[low, high]`` per dimension) apply to every row of every action space.
With ``on_violation="refuse"`` a row that would need clipping is not clipped: ``apply`` raises
``PolicyError`` (``details.reason = "bounds"``), as the worker refuses such a chunk, and the run
ends through ``hold``.

Pure Python, no numpy: rows are short lists and this runs once per action.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ._errors import PolicyError
from .protocol import ActionSpec

__all__ = ["Limits", "LimitWarning", "max_delta_rule"]


class LimitWarning(UserWarning):
    """The client clipped a row into the declared bounds / max_delta before it reached ``act``."""


def max_delta_rule(action_space: Optional[str]) -> str:
    """What ``max_delta`` bounds for rows of ``action_space``.

    Returns ``"magnitude"`` for delta spaces (each value is a step: ``|v| <= max_delta``) and
    ``"change"`` for every other space (absolute, velocity, unknown): the difference between
    consecutive commanded rows, across chunk seams too.
    """
    name = (action_space or "").lower()
    return "magnitude" if "delta" in name else "change"


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
        max_delta: the largest step, one float for every dimension or one per dimension
            (action-space units per step), or None; what a step is follows ``max_delta_rule``.
        action_space: the declared action space (a chunk's own label overrides it per row).
        on_violation: ``"clip"`` (default) clips; ``"refuse"`` makes ``apply`` raise instead.
    """

    def __init__(self, bounds: Optional[Sequence[Sequence[float]]] = None,
                 max_delta: Any = None, action_space: Optional[str] = None,
                 on_violation: str = "clip") -> None:
        self.low: Optional[List[float]] = None
        self.high: Optional[List[float]] = None
        if bounds:
            self.low = [float(pair[0]) for pair in bounds]
            self.high = [float(pair[1]) for pair in bounds]
        self.action_space = action_space
        self.on_violation = on_violation or "clip"
        dim = len(self.low) if self.low is not None else (
            len(max_delta) if isinstance(max_delta, (list, tuple)) else 0)
        self.max_delta = _per_dim(max_delta, dim) if isinstance(max_delta, (list, tuple)) else (
            None if max_delta is None else abs(float(max_delta)))
        #: what the last ``apply`` changed, one line per value ("dim 3: ..."); empty when nothing
        self.last_violations: List[str] = []

    @classmethod
    def from_contract(cls, action: Optional[ActionSpec]) -> Optional["Limits"]:
        """Limits from the handshake's action contract (``Contract.from_wire(...).action``); None
        when it declares no bounds and no max_delta."""
        if action is None or (not action.bounds and action.max_delta is None):
            return None
        return cls(action.bounds, action.max_delta, action.action_space, action.on_violation)

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
            last: the last action executed, or None at the start of a run (no change to bound).
            action_space: the chunk's own action space (falls back to the declared one).

        Returns:
            ``(row, n_clipped)``: a new list when anything changed, ``row`` itself otherwise;
            ``last_violations`` names each changed value.

        Raises:
            PolicyError: ``on_violation="refuse"`` and the row is outside the limits
                (``code="policy_error"``, ``details = {"reason": "bounds", "violations": [...]}``).
        """
        rule = max_delta_rule(action_space or self.action_space)
        out: Optional[List[float]] = None
        clipped = 0
        violations: List[str] = []
        for i, value in enumerate(row):
            v = float(value)
            md = self._delta(i)
            if md is not None:
                if rule == "magnitude":
                    if v > md or v < -md:
                        violations.append(f"dim {i}: a step of {v:.6g}, max_delta {md:.6g}")
                        v = md if v > 0 else -md
                elif last is not None and i < len(last):
                    prev = float(last[i])
                    if v > prev + md or v < prev - md:
                        violations.append(f"dim {i}: moves {v - prev:.6g} from the last executed action, "
                                          f"max_delta {md:.6g}")
                        v = prev + md if v > prev else prev - md
            if self.low is not None and i < len(self.low):
                if v < self.low[i] or v > self.high[i]:  # type: ignore[index]
                    violations.append(f"dim {i}: {v:.6g} outside [{self.low[i]:.6g}, {self.high[i]:.6g}]")  # type: ignore[index]
                    v = min(max(v, self.low[i]), self.high[i])  # type: ignore[index]
            if v != value and v == v:  # changed (NaN compares unequal to itself: not ours to fix)
                if out is None:
                    out = [float(x) for x in row]
                out[i] = v
                clipped += 1
        self.last_violations = violations
        if violations and self.on_violation == "refuse":
            more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
            raise PolicyError(
                f"action violates the declared limits before it reached act(): {violations[0]}{more}",
                details={"reason": "bounds", "violations": violations},
                hint='the contract says on_violation="refuse"; declare "clip" to have the client clip instead')
        return (out if out is not None else list(row)), clipped
