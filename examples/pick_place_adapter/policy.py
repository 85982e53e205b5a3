"""A pick-place policy with another observation layout: the demo's controller behind one camera
named ``scene`` and one 8-wide ``state`` vector (7 joint positions in rad, then the gripper,
0 open .. 1 closed). It cannot run on the ``pick-place`` benchmark as it is (that renders
``exterior_1`` and ``wrist_left`` and reports ``joint_positions`` and ``gripper`` apart):
``seq eval run`` refuses the pair without an adapter, and ``adapter.py`` beside this file
bridges it.

Actions are the demo's: 16 x 8 absolute joint targets (rad) + gripper at 15 Hz, replanned every
``open_loop_horizon`` steps.
"""
from __future__ import annotations

import os
import sys

_PICK_PLACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pick_place")
if _PICK_PLACE not in sys.path:
    sys.path.insert(0, os.path.abspath(_PICK_PLACE))

import numpy as np  # noqa: E402

import seq  # noqa: E402
from controller import PickPlaceController  # noqa: E402
from kinematics import JOINT_LOWER, JOINT_UPPER  # noqa: E402

BOUNDS = [(float(lo), float(hi)) for lo, hi in zip(JOINT_LOWER, JOINT_UPPER)] + [(0.0, 1.0)]


@seq.policy(
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=15.0, bounds=BOUNDS),
    observation=seq.ObservationContract(cameras={"scene": seq.Camera(224, 224)}, proprio={"state": 8}),
)
class FusedStatePickPlace(seq.Policy):
    """The demo controller reading one camera ("scene") and state = joints (7) + gripper (1)."""

    @seq.load
    def load(self, weights_dir):
        self.controller = PickPlaceController(chunk_len=16)

    @seq.infer
    def infer(self, obs: seq.Observation, *, open_loop_horizon: int = 8) -> seq.ActionChunk:
        state = np.asarray(obs.proprio["state"], dtype=np.float64)
        try:
            actions = self.controller.plan({"exterior_1": obs.images["scene"]}, state[:7], state[7:8],
                                           obs.instruction)
        except ValueError as exc:
            raise seq.PolicyInputError(str(exc)) from exc
        actions = np.asarray(actions, dtype=np.float64)
        return seq.ActionChunk(actions=actions, open_loop_horizon=int(max(1, min(open_loop_horizon, len(actions)))))
