"""A test policy with the richer contract: a depth camera, history=2, constrained params.

Cameras: ``front`` 32x24 with depth, ``side`` 32x24; history 2 frames per view; proprio
``joint_positions`` (3). Actions: joint_absolute, 4 wide, 10 Hz, max_delta 0.5.

Each chunk is one row ``[n_front_frames, mean red of the oldest front frame, depth mean (m), speed]``;
``kind="velocity"`` labels the chunk joint_velocity (refused: the contract says joint_absolute),
``kind="jump"`` returns two rows 2.0 apart (clipped by max_delta).
"""
from typing import Annotated

import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=4, control_frequency_hz=10.0,
                              max_delta=0.5),
    observation=seq.ObservationContract(cameras={"front": seq.Camera(32, 24, depth=True), "side": seq.Camera(32, 24)},
                                        proprio={"joint_positions": 3}, history=2),
)
class ContractPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs: seq.Observation, *, speed: Annotated[float, seq.Range(0.0, 2.0)] = 1.0,
              style: Annotated[str, seq.OneOf("fast", "careful")] = "fast", kind: str = "ok") -> seq.ActionChunk:
        front = obs.images["front"]
        row = [float(front.shape[0]), float(front[0, :, :, 0].mean()), float(obs.depth["front"].mean()), speed]
        if kind == "velocity":
            return seq.ActionChunk([row], action_space=seq.ActionSpace.JOINT_VELOCITY)
        if kind == "jump":
            return seq.ActionChunk([[0.0] * 4, [2.0] * 4])
        return seq.ActionChunk([row])
