"""A one-robot-at-a-time test policy for the client's queue, reconnect and episode tests.

Same contract and rows as echo_policy.py (one 64x64 ``exterior_1`` camera, 7 joints + 1
gripper in; 8-wide joint_absolute rows at 15 Hz out, row ``t`` =
``[request counter, t, joints[2:7]..., gripper]``), but:

- one slot (``@seq.concurrent(replicas_per_gpu=1)``): a second robot waits in line, and is
  refused with ``queue_timeout`` after QUEUE_TIMEOUT_S;
- streaming episodes: ``@seq.on_episode`` appends ``<episode_id> <acts in it>`` to the file named
  by ``$EPISODE_LOG`` (when set), so a test can see which episodes were ended and when.

Inference parameters: ``chunk_len`` (rows, default 10), ``latency_ms`` (sleep inside infer).
"""
import os
import time

import numpy as np

import seq

QUEUE_TIMEOUT_S = 4.0


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
    queue_timeout_s=QUEUE_TIMEOUT_S,
    streaming=True,
)
@seq.concurrent(replicas_per_gpu=1)
class OneSlotPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.counter = 0
        self.acts = {}

    @seq.on_episode
    def on_episode(self, episode_id):
        acts = self.acts.pop(episode_id, 0)
        log = os.environ.get("EPISODE_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{episode_id} {acts}\n")

    @seq.infer
    def infer(self, obs: seq.Observation, *, chunk_len: int = 10, latency_ms: float = 0.0) -> seq.ActionChunk:
        self.counter += 1
        if obs.episode_id:
            self.acts[obs.episode_id] = self.acts.get(obs.episode_id, 0) + 1
        if latency_ms > 0:
            time.sleep(latency_ms / 1000.0)
        rows = np.zeros((chunk_len, 8))
        rows[:, 0] = self.counter
        rows[:, 1] = np.arange(chunk_len)
        rows[:, 2:7] = obs.joint_positions[2:7]
        rows[:, 7] = obs.gripper[0]
        return seq.ActionChunk(rows, open_loop_horizon=None)
