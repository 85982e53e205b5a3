"""Checking the action chunk a policy's ``infer()`` returned against its ActionContract.

``check_chunk(result, spec)``: shape, action_dim, action_space, finite values,
open_loop_horizon, then bounds / max_delta clipped with a warning per step and dimension or
refused (``details.reason = "bounds"``). max_delta bounds the change between consecutive rows
for absolute and velocity spaces, each value's magnitude for delta spaces.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

import seq
from seq.spec import PolicySpec

from sequence_ai_server.common.errors import ApiError

__all__ = ["check_chunk", "policy_error", "spec_bounds", "MAX_WARNINGS"]

MAX_WARNINGS = 32


def policy_error(detail: str, reason: str, **details: Any) -> ApiError:
    return ApiError("policy_error", detail, details={"reason": reason, **details},
                    hint="the chunk infer() returned does not fit the declared ActionContract")


def check_chunk(result: Any, spec: PolicySpec, as_array: bool = False) -> tuple[Optional[dict], list[str], Any]:
    """Check infer's result against the ActionContract; clip or refuse.

    -> (chunk dict for the wire or None, warnings, outputs); the chunk's ``actions`` are T lists
    of D floats, or with ``as_array`` the T x D float64 array itself (the binary answer and
    openpi's pack it without a list in between). A policy with no contract whose
    infer is not written for Observation/ActionChunk gets its return value back as ``outputs``.
    Raises ApiError(policy_error) with ``details.reason`` in type | shape | action_dim |
    action_space | non_finite | open_loop_horizon | bounds.
    """
    if not isinstance(result, seq.ActionChunk):
        if spec.infer_mode == "raw" and spec.action is None:
            return None, [], result
        result = _as_chunk(result)
    arr = np.array(result.actions, dtype=np.float64)
    action = spec.action
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise policy_error(f"action chunk has shape {tuple(arr.shape)}; expected T x "
                            f"{action.action_dim if action else 'D'} with T >= 1", "shape", shape=list(arr.shape))
    if action is not None and arr.shape[1] != action.action_dim:
        raise policy_error(f"action chunk rows have {arr.shape[1]} values; the contract declares action_dim={action.action_dim}",
                            "action_dim", shape=list(arr.shape))
    if action is not None and result.action_space is not None and result.action_space != action.action_space.value:
        raise policy_error(f"action chunk is {result.action_space}; the contract declares {action.action_space.value}",
                            "action_space", got=result.action_space, expected=action.action_space.value)
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[:5].tolist()
        raise policy_error(f"action chunk contains NaN or infinity at (step, dim) {bad}", "non_finite")
    olh = result.open_loop_horizon
    if olh is not None and not (1 <= olh <= arr.shape[0]):
        raise policy_error(f"open_loop_horizon={olh} is outside 1..{arr.shape[0]} (the chunk's length)", "open_loop_horizon")
    warnings: list[str] = []
    if action is not None:
        arr, warnings = _apply_limits(arr, action)
    chunk = {
        "actions": arr if as_array else arr.tolist(),
        "action_space": action.action_space.value if action else result.action_space,
        "robot": action.robot if action else None,
        "control_frequency_hz": action.control_frequency_hz if action else None,
        "open_loop_horizon": olh,
    }
    return chunk, warnings, None


def _apply_limits(arr: np.ndarray, action: Any) -> tuple[np.ndarray, list[str]]:
    """Clip ``arr`` (T x D) to the contract's bounds and max_delta -> (the chunk, a warning per
    clipped value, at most MAX_WARNINGS); ``on_violation="refuse"`` raises ApiError(policy_error)."""
    warnings: list[str] = []
    violations: list[str] = []
    if action.bounds is not None:
        lo, hi = spec_bounds(action)
        outside = (arr < lo) | (arr > hi)
        if outside.any():
            for t, d in np.argwhere(outside).tolist():
                violations.append(f"step {t} dim {d}: {arr[t, d]:.6g} outside [{lo[d]:.6g}, {hi[d]:.6g}]")
            arr = np.clip(arr, lo, hi)
    md = action.max_delta_per_dim()
    # max_delta follows the action space (the client's seam guard uses the same rule,
    # sequence_ai_core._limits.max_delta_rule): a delta row IS the step, so each value's
    # magnitude is bounded; any other row is a level, so the change between rows is.
    if md is not None and "delta" in action.action_space.value:
        limit = np.asarray(md)
        over = np.abs(arr) > limit
        if over.any():
            for t, d in np.argwhere(over).tolist():
                violations.append(f"step {t} dim {d}: a step of {arr[t, d]:.6g}, max_delta {limit[d]:.6g}")
            arr = np.clip(arr, -limit, limit)
    elif md is not None and arr.shape[0] > 1:
        limit = np.asarray(md)
        if (np.abs(np.diff(arr, axis=0)) > limit).any():
            for t in range(1, arr.shape[0]):
                step = arr[t] - arr[t - 1]
                over = np.abs(step) > limit
                if over.any():
                    for d in np.flatnonzero(over).tolist():
                        violations.append(f"step {t} dim {d}: moves {step[d]:.6g} from the previous step, "
                                          f"max_delta {limit[d]:.6g}")
                    arr[t] = arr[t - 1] + np.clip(step, -limit, limit)
    if violations:
        if action.on_violation == "refuse":
            raise ApiError("policy_error", f"action chunk violates the declared limits: {violations[0]}"
                           + (f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""),
                           details={"reason": "bounds", "violations": violations[:MAX_WARNINGS]},
                           hint='the contract says on_violation="refuse"; use "clip" to clip instead')
        warnings = [f"clipped {v}" for v in violations[:MAX_WARNINGS]]
        if len(violations) > MAX_WARNINGS:
            warnings.append(f"... and {len(violations) - MAX_WARNINGS} more clipped values")
    return arr, warnings


def _as_chunk(result: Any) -> seq.ActionChunk:
    """A chunk dict (``{"actions": ...}``) or an array/list as a ``seq.ActionChunk``; raises
    ApiError(policy_error, reason type) for anything else."""
    if isinstance(result, dict) and "actions" in result:
        try:
            return seq.ActionChunk(result["actions"], result.get("open_loop_horizon"), result.get("action_space"))
        except (TypeError, ValueError) as exc:
            raise policy_error(f"infer() returned an unusable chunk dict ({exc})", "type") from None
    if isinstance(result, (np.ndarray, list, tuple)):
        try:
            return seq.ActionChunk(result)
        except (TypeError, ValueError) as exc:
            raise policy_error(f"infer() returned an array that is not numeric ({exc})", "type") from None
    raise policy_error(f"infer() returned {type(result).__name__}; return seq.ActionChunk(actions=...)", "type")


_BOUNDS_CACHE: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def spec_bounds(action: Any) -> tuple[np.ndarray, np.ndarray]:
    """The declared bounds of an ActionContract as (low, high) arrays of D values, built once."""
    key = id(action)
    cached = _BOUNDS_CACHE.get(key)
    if cached is None:
        cached = (np.array([b[0] for b in action.bounds]), np.array([b[1] for b in action.bounds]))
        _BOUNDS_CACHE[key] = cached
    return cached
