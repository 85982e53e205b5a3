"""Test policies with declared bounds and max_delta, for the client's seam guard (test_core_limits.py).

``RampPolicy`` (joint_absolute, 2 dims at 50 Hz, bounds [-1, 1], max_delta 0.1): chunk k (k = 1, 2,
...) is ``chunk_len`` rows ``[base_k + 0.05 t, -(base_k + 0.05 t)]`` with ``base_k = jump * (k - 1)``
(wrapped into [-0.9, 0.9]). Inside a chunk every step is 0.05, within max_delta, so the worker
leaves it alone; across a seam the first row jumps by about ``jump``, which only the client can see.

``FlipPolicy`` (joint_delta, 2 dims at 50 Hz, bounds [-0.05, 0.05], max_delta 0.05): chunk k is
``chunk_len`` identical rows of ``+0.05`` (k odd) or ``-0.05`` (k even). Each chunk is within its
limits; the seam between two chunks "moves" 0.1, which for increments means nothing: the
client must pass these rows through untouched.

Parameters: ``chunk_len: int = 6``, ``jump: float = 0.5``; RampPolicy also ``jam: bool = False``
(raise ``GripperJam``, an exception class that is not a Python built-in).
"""
import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(robot="test-arm", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=2, control_frequency_hz=50.0,
                              bounds=[(-1.0, 1.0)] * 2, max_delta=0.1),
    observation=seq.ObservationContract(cameras={}, proprio={"joint_positions": 2}),
)
class RampPolicy(seq.Policy):
    class GripperJam(Exception):
        """A policy's own exception type (not a built-in)."""

    @seq.load
    def load(self, weights_dir):
        self.counter = 0

    @seq.infer
    def infer(self, obs: seq.Observation, *, chunk_len: int = 6, jump: float = 0.5,
              jam: bool = False) -> seq.ActionChunk:
        if jam:
            raise self.GripperJam("the gripper is jammed")
        self.counter += 1
        base = ((jump * (self.counter - 1) + 0.9) % 1.8) - 0.9
        col = base + 0.05 * np.arange(chunk_len)
        return seq.ActionChunk(np.stack([col, -col], axis=1))


@seq.policy(
    action=seq.ActionContract(robot="test-arm", action_space=seq.ActionSpace.JOINT_DELTA,
                              action_dim=2, control_frequency_hz=50.0,
                              bounds=[(-0.05, 0.05)] * 2, max_delta=0.05),
    observation=seq.ObservationContract(cameras={}, proprio={"joint_positions": 2}),
)
class FlipPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.counter = 0

    @seq.infer
    def infer(self, obs: seq.Observation, *, chunk_len: int = 6, jump: float = 0.5) -> seq.ActionChunk:
        self.counter += 1
        sign = 1.0 if self.counter % 2 else -1.0
        return seq.ActionChunk(np.full((chunk_len, 2), 0.05 * sign))


@seq.policy(
    action=seq.ActionContract(robot="test-arm", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=2, control_frequency_hz=50.0,
                              bounds=[(-1.0, 1.0)] * 2, max_delta=0.1, on_violation="refuse"),
    observation=seq.ObservationContract(cameras={}, proprio={"joint_positions": 2}),
)
class RefusingRampPolicy(RampPolicy):
    """RampPolicy's chunks under ``on_violation="refuse"``: each chunk is within its limits, and
    the second chunk's first row jumps about ``jump`` from the last executed row."""


@seq.policy(
    action=seq.ActionContract(
        robot="franka", action_space=seq.ActionSpace.JOINT_DELTA, action_dim=8, control_frequency_hz=15.0,
        bounds=[(-0.05, 0.05)] * 7 + [(0.0, 1.0)], max_delta=0.05),
    observation=seq.ObservationContract(cameras={}, proprio={"joint_positions": 7, "gripper": 1}),
)
class SpecDeltaPolicy(seq.Policy):
    """The authoring guide's JOINT_DELTA contract (bounds +-0.05 on 7 joints, gripper [0, 1],
    max_delta 0.05). Chunk k (k = 1, 2, ...) is ``chunk_len`` rows whose joints alternate
    +0.04 / -0.04 row by row, starting with the sign (-1)^(k+1), and whose gripper is ``gripper``
    (default 1.0: closed, a value of 1.0 in a delta row)."""

    @seq.load
    def load(self, weights_dir):
        self.counter = 0

    @seq.infer
    def infer(self, obs: seq.Observation, *, chunk_len: int = 4, gripper: float = 1.0) -> seq.ActionChunk:
        self.counter += 1
        first = 1.0 if self.counter % 2 else -1.0
        signs = first * np.array([(-1.0) ** t for t in range(chunk_len)])
        rows = np.concatenate([np.outer(signs, np.full(7, 0.04)), np.full((chunk_len, 1), gripper)], axis=1)
        return seq.ActionChunk(rows)
