"""A delay-aware test policy: it declares ``delay_modes=("chunk", "guided")`` with
``max_delay_steps=4`` and returns chunks that continue the committed prefix.

Contract: proprioception ``joint_positions`` (3), no camera; actions joint_absolute, 3 wide, at
10 Hz, 10 rows per chunk.

For a request with ``prefix`` P and ``delay_steps`` d, rows 0..d-1 are P's first d rows (the
committed actions, as a guided policy inpaints them) and row t >= d is
``[request counter (1, 2, ...), t, d]``; without a prefix every row is the continuation. So a
test can tell chunks apart (column 0), rows apart (column 1), and read the delay it was sent
(column 2).

Inference parameters:
    latency_s: float = 0.0    sleep this long in every infer (s)
    cold_s: float = 0.0       sleep this much more in the first infer only (s)
    slow_after: int = 0       from the episode's request after this many on, sleep slow_s more (0: never)
    slow_s: float = 0.0
"""
import time

import seq

ROWS = 10


@seq.policy(
    action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=3, control_frequency_hz=10.0,
                              delay_modes=("chunk", "guided"), max_delay_steps=4),
    observation=seq.ObservationContract(proprio={"joint_positions": 3}),
)
class DelayPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.counter = 0
        self.per_episode = {}

    @seq.infer
    def infer(self, obs: seq.Observation, *, latency_s: float = 0.0, cold_s: float = 0.0, slow_after: int = 0,
              slow_s: float = 0.0, prefix=None, delay_steps: int = 0) -> seq.ActionChunk:
        self.counter += 1
        n = self.per_episode[obs.episode_id] = self.per_episode.get(obs.episode_id, 0) + 1
        pause = latency_s + (cold_s if self.counter == 1 else 0.0)
        if slow_after and n > slow_after:
            pause += slow_s
        if pause:
            time.sleep(pause)
        rows = [[float(self.counter), float(t), float(delay_steps)] for t in range(ROWS)]
        if prefix is not None:
            assert prefix.dtype.name == "float32" and prefix.shape[0] >= delay_steps, (prefix.dtype, prefix.shape)
            for t in range(min(delay_steps, ROWS)):
                rows[t] = [float(v) for v in prefix[t]]
        return seq.ActionChunk(rows)
