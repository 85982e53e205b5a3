"""The trivial policy the client benchmarks drive (bench/bench_client.py).

Two 224x224 cameras and 8 floats in (``joint_positions`` 7 + ``gripper`` 1), an 8-wide
joint_absolute chunk out. ``infer`` does nothing but build the chunk, unless asked to sleep
(``latency_ms``, the injected round trip of the prefetch benchmark). Parameters:
``chunk_len: int = 16``, ``horizon: int = 8``, ``latency_ms: float = 0.0``, ``hz: float`` is fixed
by the contract (50 Hz) so a chunk's 8 played rows last 0.16 s.
Environment ``BENCH_LOAD_S``: seconds load() sleeps (a cold start for the interrupt benchmark).
"""
import os
import time

import numpy as np

import seq


@seq.policy(
    action=seq.ActionContract(robot="bench", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=50.0),
    observation=seq.ObservationContract(
        cameras={"exterior_1": seq.Camera(224, 224), "wrist_left": seq.Camera(224, 224)},
        proprio={"joint_positions": 7, "gripper": 1}),
)
class BenchPolicy(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        delay = float(os.environ.get("BENCH_LOAD_S", "0") or 0)
        if delay:
            time.sleep(delay)

    @seq.infer
    def infer(self, obs: seq.Observation, *, chunk_len: int = 16, horizon: int = 8,
              latency_ms: float = 0.0) -> seq.ActionChunk:
        if latency_ms > 0:
            time.sleep(latency_ms / 1000.0)
        rows = np.zeros((chunk_len, 8))
        rows[:, :7] = obs.joint_positions
        return seq.ActionChunk(rows, open_loop_horizon=horizon)
