"""pi05-droid: pi0.5 fine-tuned on DROID (Franka, two cameras), served with openpi.

Repoint ``weights=`` at your own checkpoint (``seq.Volume.from_name("my-pi05")`` or
``"hf://org/model@rev"``). openpi and JAX are imported inside load(), so ``seq validate``
reads this declaration on any machine; serving it needs a GPU and the image below.

Actions: 15 Hz chunks of 7 joint velocities (rad/s) + gripper position (0 open .. 1 closed).
"""
from typing import Annotated

import numpy as np

import seq

IMAGE = (
    seq.Image.from_registry("nvidia/cuda:12.2.2-cudnn8-runtime-ubuntu22.04", python="3.11")
    .apt_install("git", "git-lfs", "build-essential", "clang", "libgl1", "libglib2.0-0")
    .pip_install("uv")
    .run_commands("git clone --recurse-submodules https://github.com/Physical-Intelligence/openpi /opt/openpi",
                  "cd /opt/openpi && GIT_LFS_SKIP_SMUDGE=1 uv pip install --system -e .")
    .env(OPENPI_DATA_HOME="/data/.cache/openpi", XLA_PYTHON_CLIENT_PREALLOCATE="false")
)


@seq.policy(
    gpu="L4",
    max_gpus=2,
    image=IMAGE,
    weights=seq.Weights.template("pi05-droid", version=1),
    timeouts=seq.Timeouts(startup=900, request=5),
    action=seq.ActionContract(
        robot="droid_franka",
        action_space=seq.ActionSpace.JOINT_VELOCITY,
        action_dim=8,
        control_frequency_hz=15.0,
        bounds=[(-1.0, 1.0)] * 7 + [(0.0, 1.0)],
    ),
    observation=seq.ObservationContract(
        cameras={"exterior_1": seq.Camera(224, 224), "wrist_left": seq.Camera(224, 224)},
        proprio={"joint_positions": 7, "gripper": 1},
    ),
)
class Pi05Droid(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        from openpi.policies import policy_config      # imported here: only the worker needs openpi
        from openpi.training import config as openpi_config

        cfg = openpi_config.get_config("pi05_droid")
        self.policy = policy_config.create_trained_policy(cfg, weights_dir)

    @seq.warmup
    def warmup(self):
        zeros = np.zeros((224, 224, 3), dtype=np.uint8)
        self.policy.infer(self._inputs(zeros, zeros, np.zeros(7), np.zeros(1), "warm up"))

    @staticmethod
    def _inputs(exterior, wrist, joints, gripper, prompt):
        return {"observation/exterior_image_1_left": exterior, "observation/wrist_image_left": wrist,
                "observation/joint_position": joints, "observation/gripper_position": gripper, "prompt": prompt}

    @seq.infer
    def infer(self, obs: seq.Observation, *, seed: int = 0,
              replan_steps: Annotated[int, seq.Range(1, 15)] = 8) -> seq.ActionChunk:
        out = self.policy.infer(self._inputs(obs.images["exterior_1"], obs.images["wrist_left"],
                                             obs.joint_positions, obs.gripper, obs.instruction))
        actions = np.asarray(out["actions"], dtype=np.float64)
        return seq.ActionChunk(actions, open_loop_horizon=min(replan_steps, len(actions)))
