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

Action heads: the regression chunk, and a generative flow-matching head (``model.FlowHead``)
around it. The policy is delay-aware (``delay_modes=("chunk", "guided")``): given the committed
prefix and ``delay_steps``, the chunk is sampled from the flow head, guided to inpaint the prefix
(real-time chunking: the first ``delay_steps`` rows are the committed ones, the rest continue from
them). Without a prefix (a cold first request, or a run in ``"chunk"`` mode) it returns the
regression chunk: the shipped flow head, trained on 18 demonstrations, samples worse than the
regression head unguided (see the flywheel README). Sampling starts from the noise mean, so a given
observation and prefix always give the same chunk.

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
#: The largest delay guidance inpaints (control steps at 15 Hz: 0.53 s): the 16-row chunk then
#: still has the 8 rows of its open-loop horizon after the committed ones.
MAX_DELAY_STEPS = 8
#: The guidance weight's clip (``model.VisuomotorPolicy.sample``'s ``beta``). The paper's 5 pulls
#: the shipped head's chunks onto the prefix but makes them jerky (within-chunk step p99 0.14 rad
#: at 400 ms on 12 episodes); 2 keeps them near the teacher's smoothness (0.06 rad), same success.
GUIDANCE_BETA = 2.0


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split()).rstrip(".")


@seq.policy(
    weights=f"vol://{VOLUME}",
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=15.0, bounds=BOUNDS,
                              delay_modes=("chunk", "guided"), max_delay_steps=MAX_DELAY_STEPS),
    observation=seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224),
                                                 "wrist_left": seq.Camera(224, 224)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
)
class LearnedPickPlacePolicy(seq.Policy):
    """Keypoint-CNN visuomotor policy with a flow-matching action head, trained on recorded
    closed-form demonstrations."""

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
    def infer(self, obs: seq.Observation, *, open_loop_horizon: int = 8, prefix=None,
              delay_steps: int = 0) -> seq.ActionChunk:
        """A (16, 8) chunk of absolute joint targets (rad) + gripper (0 open .. 1 closed).

        ``prefix``: (k, 8) committed rows (absolute, as sent by the client) or None;
        ``delay_steps``: how many of them play before this chunk can (0 .. k). With a prefix the
        first ``delay_steps`` rows returned are exactly the committed ones. Raises
        PolicyInputError for an instruction it was not trained on or a prefix of the wrong width.
        """
        import torch

        from model import preprocess

        task = self._tasks.get(_norm(obs.instruction or ""))
        if task is None:
            raise seq.PolicyInputError(
                f"instruction {obs.instruction!r} is not one this policy was trained on; "
                f"known: {'; '.join(self.cfg.tasks)}")
        d, rows = self._prefix(prefix, delay_steps)
        t0 = time.perf_counter()
        with torch.inference_mode():
            images = {v: preprocess(torch.from_numpy(np.ascontiguousarray(obs.images[v], dtype=np.uint8))[None],
                                    self.cfg.image_size) for v in self.cfg.views}
            state = np.concatenate([np.asarray(obs.joint_positions, dtype=np.float32).ravel()[:7],
                                    np.asarray(obs.gripper if obs.gripper is not None else [0.0],
                                               dtype=np.float32).ravel()[:1]])
            state_n = (torch.from_numpy(state) - self._s_mean) / self._s_std
            z = self.model.features(images, state_n[None].float(), torch.tensor([task]))
        if rows is None:
            with torch.inference_mode():
                out = self.model.head(z).reshape(self.cfg.horizon, self.cfg.action_dim)
        else:
            guide = torch.from_numpy(((rows - self._a_mean) / self._a_std).astype(np.float32))[None]
            with torch.inference_mode(False):
                out = self.model.sample(z.clone(), prefix=guide, delay=d, known=_known_rows(rows, d),
                                        beta=GUIDANCE_BETA)[0]
        actions = out.detach().numpy().astype(np.float64) * self._a_std + self._a_mean
        if rows is not None and d > 0:
            actions[:d] = rows[:d]          # committed: they play whatever this chunk says
        self.infer_ms.append((time.perf_counter() - t0) * 1e3)
        horizon = int(max(1, min(open_loop_horizon, len(actions) - d)))
        return seq.ActionChunk(actions=actions, open_loop_horizon=horizon)

    def _prefix(self, prefix, delay_steps) -> tuple:
        """``(delay, rows (k, 8) float64 or None)``, checked. Raises PolicyInputError."""
        d = int(delay_steps or 0)
        if prefix is None:
            return 0, None
        rows = np.asarray(prefix, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != self.cfg.action_dim or not np.isfinite(rows).all():
            raise seq.PolicyInputError(f"prefix must be finite rows of {self.cfg.action_dim} values, "
                                       f"got shape {rows.shape}")
        if not 0 <= d <= min(len(rows), MAX_DELAY_STEPS):
            raise seq.PolicyInputError(f"delay_steps={d} is outside 0..{min(len(rows), MAX_DELAY_STEPS)} "
                                       f"(prefix of {len(rows)} rows, max_delay_steps={MAX_DELAY_STEPS})")
        return d, (rows if len(rows) else None)


def _known_rows(rows, d: int):
    """How many prefix rows are real: the trailing rows equal to the last one are padding (the
    client pads by holding the last row), but never fewer than ``d``."""
    if rows is None:
        return None
    k = len(rows)
    while k > max(d, 1) and np.array_equal(rows[k - 1], rows[k - 2]):
        k -= 1
    return max(k, d)
