"""A tiny, dependency-free test policy with a contract, shared by the server and client tests.

Contract: one camera ``exterior_1`` at 64x64, proprioception ``joint_positions`` (7) and
``gripper`` (1); actions are joint_absolute, 8 wide, at 15 Hz, bounded.

Each row ``t`` of a chunk is
    [request counter (1, 2, 3, ...), t, joint_positions[2:7] (5 values), gripper]
so a test can tell chunks apart (column 0) and rows apart (column 1). Column 7 is bounded to
[0, 1]: send a gripper of 1.5 to see it clipped (with a warning). The other columns are
bounded to +-1e6.

Inference parameters:
    chunk_len: int = 10      rows per chunk
    latency_ms: float = 0.0  sleep this long inside infer (simulates a slow model)
    fail: str = ""           raise this exception type by name ("RuntimeError", "KeyError",
                             "PolicyInputError" -> 400, anything else -> RuntimeError)
    horizon: int = 0         open_loop_horizon of the chunk (0 = none)

Environment: ``ECHO_LOAD_S`` (seconds load() sleeps, default 0) makes a slow cold start.
"""
import builtins
import os
import time

import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(
        robot="panda",
        action_space=seq.ActionSpace.JOINT_ABSOLUTE,
        action_dim=8,
        control_frequency_hz=15.0,
        bounds=[(-1e6, 1e6)] * 7 + [(0.0, 1.0)],
    ),
    observation=seq.ObservationContract(
        cameras={"exterior_1": seq.Camera(64, 64)},
        proprio={"joint_positions": 7, "gripper": 1},
    ),
)
class EchoPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.weights_dir = weights_dir
        self.counter = 0
        self.episodes = []
        delay = float(os.environ.get("ECHO_LOAD_S", "0") or 0)
        if delay:
            time.sleep(delay)

    @seq.on_episode
    def on_episode(self, episode_id):
        self.episodes.append(episode_id)

    @seq.infer
    def infer(self, obs: seq.Observation, *, chunk_len: int = 10, latency_ms: float = 0.0,
              fail: str = "", horizon: int = 0) -> seq.ActionChunk:
        self.counter += 1
        if fail:
            if fail == "PolicyInputError":
                raise seq.PolicyInputError(f"asked to fail with {fail}")
            exc_type = getattr(builtins, fail, None)
            if not (isinstance(exc_type, type) and issubclass(exc_type, Exception)):
                exc_type = RuntimeError
            raise exc_type(f"asked to fail with {fail}")
        if latency_ms > 0:
            time.sleep(latency_ms / 1000.0)
        assert obs.images["exterior_1"].shape == (64, 64, 3)
        rows = np.zeros((chunk_len, 8))
        rows[:, 0] = self.counter
        rows[:, 1] = np.arange(chunk_len)
        rows[:, 2:7] = obs.joint_positions[2:7]
        rows[:, 7] = obs.gripper[0]
        return seq.ActionChunk(rows, open_loop_horizon=horizon or None)
