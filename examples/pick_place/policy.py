"""Demo policy: scripted pick-and-place for the simulated Franka Panda.

Deploy with ``seq deploy examples/pick_place/policy.py``. Sees the exterior camera, finds
the cube and pad named in the instruction by colour, and plans joint-space chunks with its
own Panda kinematics (see controller.py). No weights.

Actions: 16 x 8 rows of absolute joint targets (rad) for panda_joint1..7 plus the gripper
(0.0 open .. 1.0 closed) at 15 Hz; replan every ``open_loop_horizon`` (default 8) steps.

Seams: with prefetch, a chunk is computed from an observation taken before the previous chunk
finished playing, and the measured joints lag the commands, so a chunk planned from the
measured joints starts behind where the arm is being sent: a backwards step at every seam. The
policy is therefore a streaming one: per episode it remembers the chunk it returned last and
continues the next one from that chunk's last executed row (``controller.plan(start_command=)``;
ignored when the arm is evidently not following it). ``on_episode`` forgets the episode.
"""
from __future__ import annotations

import os
import sys

# The worker loads this file by path: make its sibling modules importable.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402
import seq  # noqa: E402

from controller import PickPlaceController  # noqa: E402
from kinematics import JOINT_LOWER, JOINT_UPPER  # noqa: E402

BOUNDS = [(float(lo), float(hi)) for lo, hi in zip(JOINT_LOWER, JOINT_UPPER)] + [(0.0, 1.0)]


@seq.policy(
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=15.0, bounds=BOUNDS),
    observation=seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224),
                                                 "wrist_left": seq.Camera(224, 224)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
    streaming=True,   # per-episode memory of the last chunk (see the module docstring)
)
class PickPlacePolicy(seq.Policy):
    """Colour-segmentation + IK pick-and-place ("put the red cube on the green pad")."""

    @seq.load
    def load(self, weights_dir):
        self.controller = PickPlaceController(chunk_len=16)
        self._last = {}  # episode_id -> (last chunk (T, 8), its open_loop_horizon)

    @seq.infer
    def infer(self, obs: seq.Observation, *, open_loop_horizon: int = 8) -> seq.ActionChunk:
        previous = self._last.get(obs.episode_id) if obs.episode_id else None
        start = previous[0][previous[1] - 1, :7] if previous is not None else None
        try:
            actions = self.controller.plan(obs.images, obs.joint_positions, obs.gripper,
                                           obs.instruction, start_command=start)
        except ValueError as exc:
            raise seq.PolicyInputError(str(exc)) from exc
        actions = np.asarray(actions, dtype=np.float64)
        horizon = int(max(1, min(open_loop_horizon, len(actions))))
        if obs.episode_id:
            self._last[obs.episode_id] = (actions, horizon)
        return seq.ActionChunk(actions=actions, open_loop_horizon=horizon)

    @seq.on_episode
    def on_episode(self, episode_id):
        """The episode ended (run returned, or 5 min idle): forget its last chunk."""
        self._last.pop(episode_id, None)
