"""Demo policy: scripted pick-and-place for the simulated Franka Panda.

Deploy with ``seq deploy examples/pick_place/policy.py``. Sees the exterior camera, finds
the cube and pad named in the instruction by colour, and plans joint-space chunks with its
own Panda kinematics (see controller.py). No weights.

Actions: 16 x 8 rows of absolute joint targets (rad) for panda_joint1..7 plus the gripper
(0.0 open .. 1.0 closed) at 15 Hz; replan every ``open_loop_horizon`` (default 8) steps.

Seams: with prefetch, a chunk is computed from an observation taken before the previous chunk
finished playing, and the measured joints lag the commands, so a chunk planned from the
measured joints starts behind where the arm is being sent: a backwards step at every seam. The
policy is therefore delay-aware (``delay_modes=("chunk", "guided")``): when the client sends the
committed prefix -- the rows it will have played between the observation and the earliest start
of this chunk, ``delay_steps`` of them -- rows ``0 .. delay_steps-1`` of the answer are those
rows and the rest is planned on from the last of them (``controller.plan(start_command=)``;
from the measured joints when the arm is evidently not following it). Without a prefix (a cold
first request, or a run in ``"chunk"`` mode) the chunk is planned from the measured joints. It
keeps nothing between requests.
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
CHUNK_LEN = 16        # rows per chunk (15 Hz: 1.07 s)
#: The largest delay it plans across (control steps at 15 Hz): 10 steps = 0.67 s, after which
#: 6 freshly planned rows of the 16 follow the committed ones.
MAX_DELAY_STEPS = 10


def continue_from_prefix(planned: np.ndarray, prefix, delay_steps: int) -> np.ndarray:
    """The returned chunk: ``prefix[:delay_steps]`` then ``planned`` (planned from the last
    committed row), ``len(planned)`` rows in all.

    ``planned``: (T, 8); ``prefix``: (k, 8) with k >= ``delay_steps``. Raises ValueError when
    ``delay_steps`` exceeds k or ``T - 1``.
    """
    d = int(delay_steps)
    prefix = np.asarray(prefix, dtype=np.float64).reshape(-1, planned.shape[1])
    if d > len(prefix) or d > len(planned) - 1:
        raise ValueError(f"delay_steps={d} needs a prefix of at least {d} rows and a chunk longer than "
                         f"{d} rows (got {len(prefix)} and {len(planned)})")
    return np.concatenate([prefix[:d], planned[:len(planned) - d]], axis=0)


@seq.policy(
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=15.0, bounds=BOUNDS,
                              delay_modes=("chunk", "guided"), max_delay_steps=MAX_DELAY_STEPS),
    observation=seq.ObservationContract(cameras={"exterior_1": seq.Camera(224, 224),
                                                 "wrist_left": seq.Camera(224, 224)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
)
class PickPlacePolicy(seq.Policy):
    """Colour-segmentation + IK pick-and-place ("put the red cube on the green pad")."""

    @seq.load
    def load(self, weights_dir):
        self.controller = PickPlaceController(chunk_len=CHUNK_LEN)

    @seq.infer
    def infer(self, obs: seq.Observation, *, open_loop_horizon: int = 8, prefix=None,
              delay_steps: int = 0) -> seq.ActionChunk:
        """A (16, 8) chunk of absolute joint targets (rad) + gripper (0 open .. 1 closed).

        ``prefix`` (k, 8) / ``delay_steps`` (see the module docstring): the committed rows and
        how many of them play before this chunk can; None / 0 on a cold first request. With a
        prefix, rows ``0 .. max(delay_steps, 1) - 1`` are the prefix's (with no delay, row 0 is
        still the committed row due at the observation). Raises PolicyInputError for an
        instruction without known colours or a prefix that does not fit.
        """
        d = int(delay_steps or 0)
        try:
            rows = None if prefix is None else np.asarray(prefix, dtype=np.float64).reshape(-1, 8)
            if rows is not None and not len(rows):
                rows = None
            # with no delay, row 0 is still the committed row due at the observation
            keep = 0 if rows is None else max(d, 1)
            actions = self.controller.plan(obs.images, obs.joint_positions, obs.gripper, obs.instruction,
                                           start_command=None if rows is None else rows[min(keep, len(rows)) - 1, :7])
            actions = np.asarray(actions, dtype=np.float64)
            if rows is not None:
                actions = continue_from_prefix(actions, rows, keep)
        except ValueError as exc:
            raise seq.PolicyInputError(str(exc)) from exc
        horizon = int(max(1, min(open_loop_horizon, len(actions) - d)))
        return seq.ActionChunk(actions=actions, open_loop_horizon=horizon)
