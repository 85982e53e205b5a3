"""Local contract checks: does an observation, or the model's declaration, match what is expected?

The worker is the authority (it refuses a mismatched /act with 400); these checks only move
the same refusal earlier, before anything is sent, and name what is wrong. ``connect(
validate="warn")`` warns once per distinct problem, ``"strict"`` raises ContractMismatch,
``"off"`` skips. ``connect(expect={...})`` compares the declared action contract.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

__all__ = ["check_expect", "check_observation", "drop_undeclared_views"]


def check_expect(expect: Mapping[str, Any], action: Optional[Mapping[str, Any]]) -> List[str]:
    """Differences between ``expect`` (e.g. ``{"action_space": "joint_absolute", "action_dim": 8}``)
    and the model's declared action contract; empty when they agree."""
    if action is None:
        return ["the model declares no action contract"]
    problems = []
    for key, want in expect.items():
        have = action.get(key)
        if isinstance(want, float) or isinstance(have, float):
            same = have is not None and want is not None and abs(float(have) - float(want)) < 1e-9
        else:
            same = have == want
        if not same:
            problems.append(f"{key}: expected {want!r}, model declares {have!r}")
    return problems


def _declared_views(cameras: Any) -> List[str]:
    if isinstance(cameras, Mapping):
        return list(cameras)
    if isinstance(cameras, (list, tuple)):
        return [c.get("view") or c.get("name") if isinstance(c, Mapping) else str(c) for c in cameras]
    return []


def drop_undeclared_views(wire: Dict[str, Any], contract: Optional[Mapping[str, Any]]) -> List[str]:
    """Remove frames of views the model does not declare from ``wire`` (in place); their names.

    An undeclared camera would be uploaded and then ignored; it is never worth the bytes.
    """
    declared = _declared_views((contract or {}).get("cameras"))
    images = wire.get("images")
    if not declared or not images:
        return []
    dropped = [img.get("view") for img in images if img.get("view") not in declared]
    if dropped:
        wire["images"] = [img for img in images if img.get("view") in declared]
    return dropped


def check_observation(wire: Mapping[str, Any], contract: Optional[Mapping[str, Any]]) -> List[str]:
    """What the worker would refuse in this wire observation, as sentences; empty when fine."""
    if not contract:
        return []
    problems: List[str] = []
    declared = _declared_views(contract.get("cameras"))
    if declared:
        sent = [img.get("view") for img in wire.get("images") or []]
        missing = [v for v in declared if v not in sent]
        if missing:
            problems.append(f"missing view(s) {missing}")
    proprio = contract.get("proprio")
    if isinstance(proprio, Mapping):
        have: Dict[str, Any] = wire.get("proprioception") or {}
        for name, width in proprio.items():
            values = have.get(name)
            if values is None:
                problems.append(f"proprioception.{name} missing (model reads {width})")
            elif isinstance(width, int) and len(values) != width:
                problems.append(f"proprioception.{name} has {len(values)} values, model reads {width}")
    return problems
