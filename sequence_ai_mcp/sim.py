"""The simulated cell as a Python-mode robot: the MuJoCo Panda pick-and-place scene, no ROS.

:class:`SimRobot` wraps ``sequence_ai_sim.panda_sim.PandaPickPlaceSim``. Every call into MuJoCo
runs on one thread of its own (the offscreen GL context belongs to the thread that made it), so
the run's ``observe`` / ``apply`` / ``hold`` and a ``snapshot`` taken meanwhile never overlap.

Time: one applied action row advances physics by one control period (1/15 s at the demo
policy's 15 Hz); the policy loop paces rows in wall time, so the sim runs in real time while a
run drives it and stands still between runs (a held arm stays where it is).

``journal`` records what reached the arm: ``(time.monotonic() s, "act" | "hold", row)`` per
call, so a caller can check that a stop was followed by a hold and nothing else.
"""
from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Any, List, Optional, Tuple

__all__ = ["SimRobot"]


class SimRobot:
    """The simulated Panda cell (cameras ``exterior_1``, ``wrist_left``, 224x224 px).

    Args:
        seed: the layout seed of the first reset (cubes and pads placed by it).
        control_frequency_hz: rows per second the policy sends (Hz, default 15.0, the demo
            policy's); each applied row steps physics by its period.
        image_size: rendered square frame side (px, default 224: the demo policy's cameras).

    Raises ImportError when the ``sim`` extra (mujoco) is not installed.
    """

    views = ("exterior_1", "wrist_left")

    def __init__(self, seed: int = 0, control_frequency_hz: float = 15.0, image_size: int = 224) -> None:
        os.environ.setdefault("MUJOCO_GL", "egl")
        self.period_s = 1.0 / float(control_frequency_hz)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sequence-ai-sim")
        self._lock = threading.Lock()
        self.journal: List[Tuple[float, str, Optional[List[float]]]] = []

        def build():
            from sequence_ai_sim.panda_sim import PandaPickPlaceSim
            return PandaPickPlaceSim(seed=seed, image_size=image_size)

        self.sim = self._pool.submit(build).result()

    def _on_sim(self, fn, *args: Any) -> Any:
        return self._pool.submit(fn, *args).result()

    # -------------------------------------------------------------- the robot interface

    def observe(self, instruction: str = ""):
        """The cameras and joints now, as a ``sequence_ai.Observation`` (frames JPEG q95).

        ``instruction``: the task text the policy reads, for ``policy.predict(robot.observe(
        instruction="put the red cube on the green pad"))`` and ``run()``; ``act()`` fills it in
        from its own instruction, so ``observe=robot.observe`` needs none there."""
        import sequence_ai

        def read():
            return ({v: self.sim.render(v) for v in self.views}, self.sim.joint_positions().tolist(),
                    [self.sim.gripper()])
        images, joints, gripper = self._on_sim(read)
        return sequence_ai.observation(images=images, joints=joints, gripper=gripper, instruction=instruction)

    def apply(self, row: List[float]) -> None:
        """Command one row (7 joint targets in rad + gripper 0 open .. 1 closed) and advance
        physics by one control period."""
        values = [float(x) for x in row]

        def step():
            self.sim.set_command(values[:7], values[7])
            self.sim.step(self.period_s)
        self._on_sim(step)
        with self._lock:
            self.journal.append((time.monotonic(), "act", values))

    def is_safe(self, row: List[float]) -> bool:
        """A bounds check for ``validate=``: 8 finite values, the 7 joint targets within the
        Panda's joint limits (rad) and the gripper within 0..1 (1e-6 slack). Runs off the sim thread (it
        reads no state)."""
        import math

        from sequence_ai_sim.panda_sim import PandaPickPlaceSim

        values = [float(x) for x in row]
        return len(values) == 8 and all(math.isfinite(x) and lo - 1e-6 <= x <= hi + 1e-6 for x, (lo, hi)
                                        in zip(values, PandaPickPlaceSim.JOINT_LIMITS.tolist()))

    def hold(self) -> None:
        """Keep the arm where it is: targets = the measured joints, the gripper target unchanged."""
        def hold():
            cmd = self.sim.command()
            self.sim.set_command(self.sim.joint_positions(), float(cmd[7]))
        self._on_sim(hold)
        with self._lock:
            self.journal.append((time.monotonic(), "hold", None))

    def frame(self, view: str) -> bytes:
        """The current frame of ``view`` as JPEG bytes (quality 95). Raises ValueError for an
        unknown view."""
        import sequence_ai

        if view not in self.views:
            raise ValueError(f"no camera view {view!r}: the cell has {list(self.views)}")
        return sequence_ai.encode_jpeg_bytes(self._on_sim(self.sim.render, view))

    def done(self, instruction: str) -> bool:
        """The sim's own check for ``instruction`` ("put the <colour> cube on the <colour> pad"):
        the cube within 3 cm of the pad centre, at rest, and the hand opened. False for an
        instruction the task grammar cannot read."""
        from sequence_ai_sim.task import TaskError, parse_pick_place

        try:
            cube, pad = parse_pick_place(instruction)
        except TaskError:
            return False

        def check():
            ok, _ = self.sim.success(cube, pad)
            return bool(ok) and self.sim.gripper() < 0.1
        return self._on_sim(check)

    # -------------------------------------------------------------- the scene

    def reset(self, seed: int) -> None:
        """Lay the scene out again from ``seed`` (the arm at its home pose)."""
        self._on_sim(self.sim.reset, seed)

    def object_positions(self) -> dict:
        """``{"cube_red": (3,) m, "pad_green": ..., ...}`` now."""
        return self._on_sim(self.sim.object_positions)

    def close(self) -> None:
        """Free the renderer and stop the sim thread. Idempotent."""
        if self._pool is not None:
            try:
                self._on_sim(self.sim.close)
            finally:
                self._pool.shutdown(wait=True)
                self._pool = None  # type: ignore[assignment]
