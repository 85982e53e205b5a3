"""The learned pick-and-place policy (flywheel step 4): the demo policy's contract, a trained net.

Deploy with ``seq volume put pick-place-learned examples/flywheel/checkpoint`` (the weights, see
below) then ``seq deploy examples/flywheel/learned_policy.py --name learned``. Same contract as
``examples/pick_place/policy.py`` (exterior + wrist cameras 224x224, 7 joints + gripper; 16 x 8
absolute joint targets at 15 Hz, replanned every ``open_loop_horizon`` = 8 rows), so the driver,
the demo and ``seq eval run ... --benchmark pick-place`` run it unchanged.

Weights: ``policy.pt`` written by ``train.py``, uploaded as the volume ``pick-place-learned``
(``seq volume put pick-place-learned DIR``; ``run_flywheel.py`` uploads each fresh checkpoint, and
``sequence-ai-demo --policy learned`` uploads the one shipped in ``checkpoint/`` beside this
file). ``weights="vol://pick-place-learned"`` names the newest version; the worker hands that
version's directory, read-only, to ``load``. Pin one with ``vol://pick-place-learned@v2``.

The instruction must be one of the dataset's task strings (case, spacing and a final full stop
are forgiven); anything else is refused with a 400 listing them -- the policy was trained to
pick the cube a known task names, nothing more.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import numpy as np  # noqa: E402
import seq  # noqa: E402

# The Panda's joint limits (rad) and the gripper range, as the closed-form policy declares them.
BOUNDS = [(-2.8973, 2.8973), (-1.7628, 1.7628), (-2.8973, 2.8973), (-3.0718, -0.0698),
          (-2.8973, 2.8973), (-0.0175, 3.7525), (-2.8973, 2.8973), (0.0, 1.0)]
VOLUME = "pick-place-learned"
SHIPPED = Path(_HERE) / "checkpoint"        # the checkpoint shipped with the example (policy.pt)


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split()).rstrip(".")


@seq.policy(
    weights=f"vol://{VOLUME}",
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=15.0, bounds=BOUNDS),
    observation=seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224),
                                                 "wrist_left": seq.Camera(224, 224)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
)
class LearnedPickPlacePolicy(seq.Policy):
    """Keypoint-CNN + MLP visuomotor policy trained on recorded closed-form demonstrations."""

    @seq.load
    def load(self, weights_dir):
        """Load ``policy.pt`` from the volume's directory ``weights_dir``.

        Raises:
            FileNotFoundError: the volume version holds no ``policy.pt``.
        """
        import torch

        from model import load_checkpoint

        torch.set_num_threads(1)   # one chunk is ~ms of work; leave the cores to the sim and the loop
        path = Path(weights_dir) / "policy.pt"
        if not path.exists():
            raise FileNotFoundError(
                f"no policy.pt in {weights_dir} (volume {VOLUME}); upload a checkpoint folder with "
                f"`seq volume put {VOLUME} {SHIPPED}` (the shipped one) or one train.py wrote")
        self.model, stats, self.extra = load_checkpoint(path)
        self.checkpoint = str(path)
        self.cfg = self.model.cfg
        self._s_mean = torch.tensor(stats["state_mean"])
        self._s_std = torch.tensor(stats["state_std"])
        self._a_mean = np.asarray(stats["action_mean"], dtype=np.float64)
        self._a_std = np.asarray(stats["action_std"], dtype=np.float64)
        self._tasks = {_norm(t): i for i, t in enumerate(self.cfg.tasks)}
        self.infer_ms: list = []

    @seq.infer
    def infer(self, obs: seq.Observation, *, open_loop_horizon: int = 8) -> seq.ActionChunk:
        import torch

        from model import preprocess

        task = self._tasks.get(_norm(obs.instruction or ""))
        if task is None:
            raise seq.PolicyInputError(
                f"instruction {obs.instruction!r} is not one this policy was trained on; "
                f"known: {'; '.join(self.cfg.tasks)}")
        t0 = time.perf_counter()
        with torch.inference_mode():
            images = {v: preprocess(torch.from_numpy(np.ascontiguousarray(obs.images[v], dtype=np.uint8))[None],
                                    self.cfg.image_size) for v in self.cfg.views}
            state = np.concatenate([np.asarray(obs.joint_positions, dtype=np.float32).ravel()[:7],
                                    np.asarray(obs.gripper if obs.gripper is not None else [0.0],
                                               dtype=np.float32).ravel()[:1]])
            state_n = (torch.from_numpy(state) - self._s_mean) / self._s_std
            out = self.model(images, state_n[None].float(), torch.tensor([task]))[0].numpy()
        actions = out.astype(np.float64) * self._a_std + self._a_mean
        self.infer_ms.append((time.perf_counter() - t0) * 1e3)
        horizon = int(max(1, min(open_loop_horizon, len(actions))))
        return seq.ActionChunk(actions=actions, open_loop_horizon=horizon)
