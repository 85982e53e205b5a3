"""A test policy whose weights come from an uploaded volume (issue 5): ``weights="vol://ckpt"``
(the newest version) unless ``$VOLUME_URI`` names another (e.g. ``vol://ckpt@v1``).

load() reads ``scale.txt`` (a number) and ``nested/bias.txt`` from the weights directory;
infer() returns a 3-row chunk whose rows are ``[scale, bias]``, so a test can tell which
volume version the worker was given.
"""
import os
from pathlib import Path

import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(robot="toy", action_space=seq.ActionSpace.JOINT_ABSOLUTE, action_dim=2,
                              control_frequency_hz=10.0),
    observation=seq.ObservationContract(proprio={"joint_positions": 2}),
    weights=os.environ.get("VOLUME_URI", "vol://ckpt"),
)
class VolumePolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        root = Path(weights_dir)
        self.scale = float((root / "scale.txt").read_text())
        self.bias = float((root / "nested" / "bias.txt").read_text())

    @seq.infer
    def infer(self, obs: seq.Observation) -> seq.ActionChunk:
        return seq.ActionChunk(np.tile([self.scale, self.bias], (3, 1)))
