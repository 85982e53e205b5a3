"""Benchmark ``pick-place``: the demo's MuJoCo Panda cell, one task per colour pair.

Each task asks for one cube on one pad of another colour ("put the red cube on the green pad");
the three cubes and three pads are all on the table, placed by the episode's seed. One step is
one action row (7 joint targets in rad + gripper 0 open .. 1 closed) held for 1/15 s of
simulated time. The episode ends when the sim's own check holds with the hand opened (cube
within 3 cm of the pad centre, at rest, released) or after ``max_seconds`` of simulated time.

Metrics per episode: ``success`` (1.0 / 0.0), ``final_distance_m`` (cube-to-pad xy distance at
the end, m) and ``episode_s`` (simulated seconds used).

Lighting is randomised per episode by default (``--param light_jitter=0`` gives the demo's fixed
light): brightness, tint and the sun's direction are drawn from the seed, so a learned policy is
scored on the spread of light it should have been trained on, not on one look of the scene.
"""
from __future__ import annotations

import numpy as np

import seq

from ..panda_sim import EXTERIOR_CAMERA, WRIST_CAMERA, PandaPickPlaceSim
from ..task import COLOURS

TASKS = {f"{c}-on-{p}": f"put the {c} cube on the {p} pad" for c in COLOURS for p in COLOURS if c != p}
HZ = 15.0


@seq.benchmark(
    name="pick-place",
    tasks=TASKS,
    observation=seq.ObservationContract(cameras={EXTERIOR_CAMERA: seq.Camera(224, 224),
                                                 WRIST_CAMERA: seq.Camera(224, 224)},
                                        proprio={"joint_positions": 7, "gripper": 1}),
    action=seq.ActionContract(robot="panda", action_space=seq.ActionSpace.JOINT_ABSOLUTE,
                              action_dim=8, control_frequency_hz=HZ),
    metrics=["success", "final_distance_m", "episode_s"],
    episode_s_estimate=12.0,
)
class PickPlaceBenchmark(seq.Benchmark):
    """Pick-and-place with the simulated Franka Panda (see the module docstring)."""

    @seq.setup
    def setup(self, *, max_seconds: float = 30.0, light_jitter: float = 1.0) -> None:
        """``max_seconds``: simulated-time bound per episode (s). ``light_jitter``: 0 keeps the
        demo's fixed light, 1 (default) draws the light from each episode's seed (see
        ``PandaPickPlaceSim``); the same seed gives the same layout either way."""
        self.sim = PandaPickPlaceSim(seed=0, light_jitter=light_jitter)
        self.max_seconds = float(max_seconds)
        self.pair = ("red", "green")

    @seq.reset
    def reset(self, task: str, seed: int) -> None:
        cube, _, pad = task.split("-")
        self.pair = (cube, pad)
        self.sim.reset(seed)

    @seq.observe
    def observe(self) -> dict:
        return {"images": {cam: self.sim.render(cam) for cam in self.sim.cameras},
                "proprio": {"joint_positions": self.sim.joint_positions().tolist(),
                            "gripper": [self.sim.gripper()]}}

    @seq.step
    def step(self, action) -> None:
        row = np.asarray(action, dtype=float)
        self.sim.set_command(row[:7], float(row[7]))
        self.sim.step(1.0 / HZ)

    @seq.check
    def check(self) -> tuple[bool, dict]:
        ok, info = self.sim.success(*self.pair)
        done = (ok and self.sim.gripper() < 0.1) or self.sim.time >= self.max_seconds - 1e-9
        return done, {"success": 1.0 if ok else 0.0, "final_distance_m": info["xy_dist_m"],
                      "episode_s": self.sim.time}

    @seq.render
    def render(self) -> np.ndarray:
        return self.sim.render(EXTERIOR_CAMERA)

    def close(self) -> None:
        self.sim.close()
