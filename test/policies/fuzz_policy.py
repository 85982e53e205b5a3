"""A test policy that never raises, for fuzzing the worker's /act: any 5xx it answers is the
server's own fault, never the policy's (a policy's own error is policy_error 500 by design).

Contract: camera ``front`` at 32x24 with a depth map, camera ``wrist`` at 16x16, history 1;
proprioception ``joint_positions`` (7) and ``gripper`` (1); actions joint_absolute, 8 wide, at
10 Hz, bounded to [-1, 1]. Every parameter type is declared (int with a range, float, str with
a fixed set, bool, nullable float) so the fuzz reaches every cast.

infer returns ``chunk_len`` rows of zeros whatever it is sent.
"""
from typing import Annotated, Optional

import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(
        robot="panda",
        action_space=seq.ActionSpace.JOINT_ABSOLUTE,
        action_dim=8,
        control_frequency_hz=10.0,
        bounds=[(-1.0, 1.0)] * 8,
    ),
    observation=seq.ObservationContract(
        cameras={"front": seq.Camera(32, 24, depth=True), "wrist": seq.Camera(16, 16)},
        proprio={"joint_positions": 7, "gripper": 1},
    ),
)
class FuzzPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.calls = 0

    @seq.infer
    def infer(self, obs: seq.Observation, *, chunk_len: Annotated[int, seq.Range(1, 16)] = 4,
              speed: float = 1.0, mode: Annotated[str, seq.OneOf("fast", "careful")] = "fast",
              verbose: bool = False, scale: Optional[float] = None) -> seq.ActionChunk:
        self.calls += 1
        return seq.ActionChunk(np.zeros((chunk_len, 8)))
