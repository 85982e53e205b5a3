"""A test policy that reports the pixels it was given, so a test can tell raw frames from JPEG.

Contract: one camera ``front`` at 32 x 24 (width x height), proprioception ``joint_positions``
(7); actions joint_absolute, 8 wide, at 15 Hz. Its one-row chunk is, for the ``front`` frame:
[sum of all pixel values, pixel (0, 0) R, pixel (23, 31) B, mean G, height, width,
joint_positions[0], 1 if the frame array is writable else 0].
"""
import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=8,
                              control_frequency_hz=15.0),
    observation=seq.ObservationContract(cameras={"front": seq.Camera(32, 24)}, proprio={"joint_positions": 7}),
)
class PixelPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        img = obs.images["front"]
        row = [float(img.astype(np.int64).sum()), float(img[0, 0, 0]), float(img[-1, -1, 2]),
               float(img[:, :, 1].mean()), float(img.shape[0]), float(img.shape[1]),
               float(obs.proprio["joint_positions"][0]), float(img.flags.writeable)]
        return seq.ActionChunk(np.array([row], dtype=np.float64))
