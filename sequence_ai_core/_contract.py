"""Local contract checks: does an observation, or the model's declaration, match what is expected?

The worker is the authority (it refuses a mismatched /act with 400); these checks only move
the same refusal earlier, before anything is sent, and name what is wrong. ``connect(
validate="warn")`` warns once per distinct problem, ``"strict"`` raises ContractMismatch,
``"off"`` skips. ``connect(expect={...})`` compares the declared action contract.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from .protocol import ActionSpec, ObservationSpec

__all__ = ["check_expect", "check_observation", "drop_undeclared_views"]


def check_expect(expect: Mapping[str, Any], action: Optional[ActionSpec]) -> List[str]:
    """Differences between ``expect`` (e.g. ``{"action_space": "joint_absolute", "action_dim": 8}``)
    and the model's declared action contract (``Contract.from_wire(...).action``); empty when
    they agree. Floats compare to 1e-9."""
    if action is None:
        return ["the model declares no action contract"]
    problems = []
    for key, want in expect.items():
        have = action.declared(key)
        if isinstance(want, float) or isinstance(have, float):
            same = have is not None and want is not None and abs(float(have) - float(want)) < 1e-9
        else:
            same = have == want
        if not same:
            problems.append(f"{key}: expected {want!r}, model declares {have!r}")
    return problems


def drop_undeclared_views(wire: Dict[str, Any], observation: Optional[ObservationSpec]) -> List[str]:
    """Remove frames of views the model does not declare from ``wire`` (in place); their names.

    An undeclared camera would be uploaded and then ignored; it is never worth the bytes.
    """
    declared = list(observation.cameras) if observation is not None else []
    images = wire.get("images")
    if not declared or not images:
        return []
    dropped = [img.get("view") for img in images if img.get("view") not in declared]
    if dropped:
        wire["images"] = [img for img in images if img.get("view") in declared]
    return dropped


def check_observation(wire: Mapping[str, Any], observation: Optional[ObservationSpec]) -> List[str]:
    """What the worker would refuse in this wire observation, as sentences; empty when fine."""
    if observation is None:
        return []
    problems: List[str] = []
    if observation.cameras:
        sent = [img.get("view") for img in wire.get("images") or []]
        missing = [v for v in observation.cameras if v not in sent]
        if missing:
            problems.append(f"missing view(s) {missing}")
    have: Dict[str, Any] = wire.get("proprioception") or {}
    for name, width in observation.proprio.items():
        values = have.get(name)
        if values is None:
            problems.append(f"proprioception.{name} missing (model reads {width})")
        elif isinstance(width, int) and len(values) != width:
            problems.append(f"proprioception.{name} has {len(values)} values, model reads {width}")
    return problems
