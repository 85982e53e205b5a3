"""A batched test policy whose cost is sublinear in the batch: one call sleeps
``base_ms + per_item_ms * n`` (env ``BATCH_BASE_MS`` default 40, ``BATCH_ITEM_MS`` default 2).

Each request's chunk is one row ``[tag, batch size, position in the batch]`` where ``tag`` is
that request's own inference parameter, so a test can see every request got its own answer.
"""
import os
import time

import seq


@seq.policy(action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=3, control_frequency_hz=10.0))
class BatchPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.base = float(os.environ.get("BATCH_BASE_MS", "40")) / 1000.0
        self.per = float(os.environ.get("BATCH_ITEM_MS", "2")) / 1000.0

    @seq.batched(max_batch_size=8, eval_wait_ms=50)
    @seq.infer
    def infer(self, obs: seq.Observation, *, tag: float = 0.0, hold_ms: float = 0.0) -> list:
        n = len(obs)
        time.sleep(self.base + self.per * n + max(hold_ms) / 1000.0)
        return [seq.ActionChunk([[t, float(n), float(i)]]) for i, t in enumerate(tag)]
