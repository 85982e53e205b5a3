"""What infer() receives (``Observation``) and what it returns (``ActionChunk``).

The worker builds an ``Observation`` from each /act request after checking it against the
policy's ObservationContract, and checks the returned ``ActionChunk`` against the ActionContract
(shape, finite values, bounds) before it leaves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

__all__ = ["Observation", "ActionChunk"]


@dataclass
class Observation:
    """One observation, decoded.

    images: ``{view: HxWx3 uint8 RGB}`` (``history`` > 1: ``NxHxWx3``, oldest first).
    proprio: ``{field: 1-D float array}`` for every proprioception field sent.
    depth: ``{view: HxW float32 metres}`` for views that declare depth.
    """

    images: dict[str, np.ndarray] = field(default_factory=dict)
    proprio: dict[str, np.ndarray] = field(default_factory=dict)
    instruction: str = ""
    episode_id: Optional[str] = None
    depth: dict[str, np.ndarray] = field(default_factory=dict)
    timestamps_ms: dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def joint_positions(self) -> Optional[np.ndarray]:
        return self.proprio.get("joint_positions")

    @property
    def gripper(self) -> Optional[np.ndarray]:
        return self.proprio.get("gripper")

    @property
    def joint_velocities(self) -> Optional[np.ndarray]:
        return self.proprio.get("joint_velocities")

    @property
    def end_effector_pose(self) -> Optional[np.ndarray]:
        return self.proprio.get("end_effector_pose")


class ActionChunk:
    """A block of future actions: ``actions`` is T rows of D values (array-like).

    open_loop_horizon: how many rows the robot runs before observing again (None: all of them).
    action_space: optional; when given it must equal the ActionContract's, or the worker refuses
    the chunk (500 policy_error, ``details.reason = "action_space"``). The worker fills in
    action_space, robot and control_frequency_hz from the ActionContract.
    """

    __slots__ = ("actions", "open_loop_horizon", "action_space")

    def __init__(self, actions: Any, open_loop_horizon: Optional[int] = None, action_space: Any = None):
        self.actions = np.asarray(actions, dtype=np.float64)
        self.action_space = None if action_space is None else str(getattr(action_space, "value", action_space))
        if open_loop_horizon is not None and (isinstance(open_loop_horizon, bool)
                                              or not isinstance(open_loop_horizon, (int, np.integer))):
            raise TypeError(f"ActionChunk.open_loop_horizon must be an int or None, got {open_loop_horizon!r}")
        self.open_loop_horizon = None if open_loop_horizon is None else int(open_loop_horizon)

    def __len__(self) -> int:
        return int(self.actions.shape[0]) if self.actions.ndim else 0

    def __repr__(self) -> str:
        return f"ActionChunk(shape={tuple(self.actions.shape)}, open_loop_horizon={self.open_loop_horizon})"
