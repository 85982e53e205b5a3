"""The I/O contract a policy declares: what its infer() reads and what it returns.

``ActionContract`` and ``ObservationContract`` are validated when constructed, so a malformed
declaration fails at import time with a ``DeclarationError``. Their ``to_dict()`` form is the
wire form: the gateway returns it from ``/v1/connect`` and ``/v1/models`` and the worker checks
every observation (before inference) and every action chunk (after) against it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from ._errors import DeclarationError

__all__ = ["ActionSpace", "Camera", "ActionContract", "ObservationContract", "DELAY_MODES"]

_MAX_FRAME_EDGE = 8192

#: What a policy may declare about the inference delay (``ActionContract.delay_modes``):
#: ``chunk`` plain chunks (the prefix is ignored), ``guided`` inference-time guidance (RTC)
#: inpaints the committed prefix, ``trained`` the model was trained to condition on it.
DELAY_MODES = ("chunk", "guided", "trained")


class ActionSpace(str, Enum):
    """What one row of an action chunk means to the robot."""

    JOINT_ABSOLUTE = "joint_absolute"
    JOINT_DELTA = "joint_delta"
    JOINT_VELOCITY = "joint_velocity"
    EE_ABSOLUTE = "ee_absolute"
    EE_DELTA = "ee_delta"

    def __str__(self) -> str:  # "joint_absolute", not "ActionSpace.JOINT_ABSOLUTE"
        return self.value

    @property
    def is_absolute(self) -> bool:
        return self in (ActionSpace.JOINT_ABSOLUTE, ActionSpace.EE_ABSOLUTE)

    @classmethod
    def parse(cls, value: Any, argument: str = "action_space") -> "ActionSpace":
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower()
            for member in cls:
                if member.value == key:
                    return member
        allowed = ", ".join(m.value for m in cls)
        raise DeclarationError(argument, f"unknown action space {value!r}",
                               f"use seq.ActionSpace.<NAME> or one of: {allowed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive_int(value: Any, argument: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeclarationError(argument, f"expected an integer, got {type(value).__name__} {value!r}",
                               f"write e.g. {argument}={max(minimum, 1)}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise DeclarationError(argument, f"{value} is out of range", f"it must be {bound}")
    return value


@dataclass(frozen=True)
class Camera:
    """One camera view the policy reads: the exact frame size it expects, and whether a depth
    map comes with it."""

    width: int
    height: int
    depth: bool = False

    def __post_init__(self) -> None:
        _positive_int(self.width, "Camera.width", maximum=_MAX_FRAME_EDGE)
        _positive_int(self.height, "Camera.height", maximum=_MAX_FRAME_EDGE)
        if not isinstance(self.depth, bool):
            raise DeclarationError("Camera.depth", f"expected True or False, got {self.depth!r}")

    def to_dict(self) -> dict:
        return {"width": self.width, "height": self.height, "depth": self.depth}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Camera":
        return cls(width=data["width"], height=data["height"], depth=bool(data.get("depth", False)))


@dataclass(frozen=True)
class ActionContract:
    """What every action chunk is: robot, action space, width of a row, rate, and optional limits.

    bounds: one ``(low, high)`` per dimension, in the action space's units. max_delta: the most
    one step may move, one number for all dimensions or one per dimension; what a step is
    depends on the action space:

    - ``JOINT_ABSOLUTE`` / ``EE_ABSOLUTE`` (targets) and ``JOINT_VELOCITY`` (speeds): the change
      between consecutive commanded rows. The worker bounds it inside each chunk; the robot
      client bounds it from the last executed row, so it holds across chunk seams too.
    - ``JOINT_DELTA`` / ``EE_DELTA``: a row is itself the step, so max_delta bounds each value's
      magnitude (``|row[d]| <= max_delta[d]``), and a seam adds nothing. It applies to every
      dimension, a gripper included: give one number per dimension (e.g. ``[0.05] * 7 + [1.0]``)
      to leave a gripper that takes positions its full range.

    delay_modes: what the policy does with the committed prefix and the inference delay
    (``DELAY_MODES``): ``("chunk",)`` (the default) ignores them; ``"guided"`` / ``"trained"``
    make the chunk's first ``delay_steps`` rows continue the prefix (infer() must then declare
    ``prefix``). max_delay_steps: the largest delay, in control steps at
    ``control_frequency_hz``, the policy was built for (int >= 0); required with ``guided`` or
    ``trained``, None (no limit) only for plain chunks. A robot client refuses to start, or
    holds and ends the run, when its measured delay exceeds it.

    Outside them a chunk is clipped (the response's warnings name each step and dimension; the
    client warns with ``sequence_ai.LimitWarning``) or, with ``on_violation="refuse"``, refused:
    the worker answers 500 policy_error ``details.reason="bounds"``, and the client ends the run
    through ``hold`` with ``PolicyError`` rather than send a row it would have had to clip.
    """

    robot: str
    action_space: ActionSpace | str
    action_dim: int
    control_frequency_hz: float
    bounds: Any = None
    max_delta: Any = None
    on_violation: str = "clip"
    delay_modes: Any = ("chunk",)
    max_delay_steps: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.robot, str) or not self.robot.strip():
            raise DeclarationError("ActionContract.robot", f"expected a non-empty robot name, got {self.robot!r}",
                                   'write e.g. robot="panda"')
        object.__setattr__(self, "action_space", ActionSpace.parse(self.action_space, "ActionContract.action_space"))
        dim = _positive_int(self.action_dim, "ActionContract.action_dim", maximum=4096)
        hz = self.control_frequency_hz
        if not _is_number(hz) or hz <= 0:
            raise DeclarationError("ActionContract.control_frequency_hz",
                                   f"expected a positive number of actions per second, got {hz!r}",
                                   "write e.g. control_frequency_hz=15.0")
        object.__setattr__(self, "control_frequency_hz", float(hz))
        object.__setattr__(self, "bounds", self._check_bounds(self.bounds, dim))
        object.__setattr__(self, "max_delta", self._check_max_delta(self.max_delta, dim))
        if self.on_violation not in ("clip", "refuse"):
            raise DeclarationError("ActionContract.on_violation", f"unknown value {self.on_violation!r}",
                                   'use "clip" (the default) or "refuse"')
        self._check_delay()

    def _check_delay(self) -> None:
        arg = "ActionContract.delay_modes"
        modes = (self.delay_modes,) if isinstance(self.delay_modes, str) else self.delay_modes
        try:
            modes = tuple(modes)
        except TypeError:
            raise DeclarationError(arg, f"expected a tuple of modes, got {self.delay_modes!r}",
                                   'write e.g. delay_modes=("chunk", "guided")') from None
        unknown = [m for m in modes if m not in DELAY_MODES]
        if not modes or unknown:
            raise DeclarationError(arg, f"unknown or missing mode(s) {unknown or list(modes)!r}",
                                   f"use one or more of {', '.join(DELAY_MODES)}")
        object.__setattr__(self, "delay_modes", tuple(dict.fromkeys(modes)))
        if self.max_delay_steps is None:
            if set(modes) - {"chunk"}:
                raise DeclarationError("ActionContract.max_delay_steps",
                                       f"delay_modes {list(modes)} need the largest delay the policy handles",
                                       "write e.g. max_delay_steps=12 (control steps at control_frequency_hz)")
        else:
            _positive_int(self.max_delay_steps, "ActionContract.max_delay_steps", minimum=0, maximum=100000)

    @property
    def delay_aware(self) -> bool:
        """True when the policy declares ``guided`` or ``trained``: it reads the committed prefix."""
        return bool(set(self.delay_modes) - {"chunk"})

    @staticmethod
    def _check_bounds(bounds: Any, dim: int) -> tuple[tuple[float, float], ...] | None:
        if bounds is None:
            return None
        arg = "ActionContract.bounds"
        try:
            pairs = [tuple(pair) for pair in bounds]
        except TypeError:
            raise DeclarationError(arg, f"expected one (low, high) pair per dimension, got {bounds!r}",
                                   f"write e.g. bounds=[(-1.0, 1.0)] * {dim}") from None
        if len(pairs) != dim:
            raise DeclarationError(arg, f"{len(pairs)} pairs for action_dim={dim}",
                                   f"give exactly {dim} (low, high) pairs, one per dimension")
        out = []
        for i, pair in enumerate(pairs):
            if len(pair) != 2 or not all(_is_number(v) for v in pair):
                raise DeclarationError(arg, f"dimension {i}: {pair!r} is not a (low, high) pair of finite numbers")
            low, high = float(pair[0]), float(pair[1])
            if low > high:
                raise DeclarationError(arg, f"dimension {i}: low {low} is above high {high}", "swap them")
            out.append((low, high))
        return tuple(out)

    @staticmethod
    def _check_max_delta(max_delta: Any, dim: int) -> float | tuple[float, ...] | None:
        if max_delta is None:
            return None
        arg = "ActionContract.max_delta"
        if _is_number(max_delta):
            if max_delta <= 0:
                raise DeclarationError(arg, f"{max_delta} is not positive", "give the largest step, e.g. 0.05")
            return float(max_delta)
        try:
            values = list(max_delta)
        except TypeError:
            raise DeclarationError(arg, f"expected a number or one number per dimension, got {max_delta!r}") from None
        if len(values) != dim or not all(_is_number(v) and v > 0 for v in values):
            raise DeclarationError(arg, f"expected {dim} positive numbers, got {max_delta!r}")
        return tuple(float(v) for v in values)

    def max_delta_per_dim(self) -> tuple[float, ...] | None:
        if self.max_delta is None:
            return None
        if isinstance(self.max_delta, float):
            return (self.max_delta,) * self.action_dim
        return tuple(self.max_delta)

    def to_dict(self) -> dict:
        return {
            "robot": self.robot,
            "action_space": self.action_space.value,
            "action_dim": self.action_dim,
            "control_frequency_hz": self.control_frequency_hz,
            "bounds": [list(p) for p in self.bounds] if self.bounds is not None else None,
            "max_delta": list(self.max_delta) if isinstance(self.max_delta, tuple) else self.max_delta,
            "on_violation": self.on_violation,
            "delay": {"modes": list(self.delay_modes), "max_delay_steps": self.max_delay_steps},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ActionContract":
        return cls(robot=data["robot"], action_space=data["action_space"], action_dim=data["action_dim"],
                   control_frequency_hz=data["control_frequency_hz"], bounds=data.get("bounds"),
                   max_delta=data.get("max_delta"), on_violation=data.get("on_violation", "clip"),
                   delay_modes=tuple((data.get("delay") or {}).get("modes") or ("chunk",)),
                   max_delay_steps=(data.get("delay") or {}).get("max_delay_steps"))


@dataclass(frozen=True)
class ObservationContract:
    """What infer() reads: camera views with their exact frame sizes, proprioception fields with
    their widths (e.g. ``{"joint_positions": 7, "gripper": 1}``), and frames per camera."""

    cameras: Mapping[str, Camera] = field(default_factory=dict)
    proprio: Mapping[str, int] = field(default_factory=dict)
    history: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.cameras, Mapping):
            raise DeclarationError("ObservationContract.cameras", f"expected a dict of view name -> seq.Camera, got {self.cameras!r}",
                                   'write e.g. cameras={"exterior": seq.Camera(224, 224)}')
        cameras = {}
        for view, cam in self.cameras.items():
            if not isinstance(view, str) or not view.strip():
                raise DeclarationError("ObservationContract.cameras", f"view name {view!r} is not a non-empty string")
            if isinstance(cam, Mapping):
                cam = Camera.from_dict(cam)
            if not isinstance(cam, Camera):
                raise DeclarationError(f"ObservationContract.cameras[{view!r}]", f"expected seq.Camera, got {cam!r}",
                                       "write seq.Camera(width=224, height=224)")
            cameras[view] = cam
        object.__setattr__(self, "cameras", cameras)
        if not isinstance(self.proprio, Mapping):
            raise DeclarationError("ObservationContract.proprio", f"expected a dict of field -> width, got {self.proprio!r}",
                                   'write e.g. proprio={"joint_positions": 7, "gripper": 1}')
        proprio = {}
        for name, width in self.proprio.items():
            if not isinstance(name, str) or not name.strip():
                raise DeclarationError("ObservationContract.proprio", f"field name {name!r} is not a non-empty string")
            proprio[name] = _positive_int(width, f"ObservationContract.proprio[{name!r}]", maximum=4096)
        object.__setattr__(self, "proprio", proprio)
        _positive_int(self.history, "ObservationContract.history", maximum=64)

    def to_dict(self) -> dict:
        return {"cameras": {v: c.to_dict() for v, c in self.cameras.items()},
                "proprio": dict(self.proprio), "history": self.history}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ObservationContract":
        return cls(cameras={v: Camera.from_dict(c) for v, c in (data.get("cameras") or {}).items()},
                   proprio=dict(data.get("proprio") or {}), history=data.get("history", 1))
