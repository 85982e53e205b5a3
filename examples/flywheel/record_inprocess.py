"""Closed-form demonstrations recorded in this process, for training the flow head on a CPU.

    python examples/flywheel/record_inprocess.py --out demos.npz [--episodes 12] [--first-seed 0]
                                                 [--max-seconds 15] [--stride 2]

The flywheel's ``record.py`` goes through the gateway into episode bags (what a robot records);
this is the short path for a few minutes of training: the ``pick-place`` benchmark's env and the
closed-form policy class (``examples/pick_place/policy.py``) in one process, on simulated time.
Each request is synchronous (no delay) and carries the committed prefix (the rows still to play),
so the teacher continues its own motion across seams as it does on a robot. Episode ``i`` uses
scene seed ``first_seed + i`` and the ``i``-th colour pair (cycling).

Writes one ``.npz`` (replaced atomically) that ``train.py`` reads like a LeRobot dataset: per
frame the state (7 joints rad + gripper) and the action played (8), the task index, episode and
frame numbers; camera images (area-resized to 96 px, as at inference) every ``stride``-th frame
only (rendering dominates the cost), ``sampled`` marking those frames.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

_HERE = Path(__file__).resolve().parent
REPO = _HERE.parent.parent
HZ = 15.0
HORIZON = 8


def record(out: Path, episodes: int, first_seed: int = 0, max_seconds: float = 15.0, stride: int = 2,
           image_size: int = 96) -> dict:
    """Record ``episodes`` demonstrations into ``out`` (see the module docstring); returns a summary."""
    import torch

    sys.path.insert(0, str(REPO / "examples" / "pick_place"))
    sys.path.insert(0, str(_HERE))
    import seq
    from model import preprocess
    from policy import PickPlacePolicy
    from sequence_ai_sim.benchmarks.pick_place import TASKS, PickPlaceBenchmark

    torch.set_num_threads(1)
    views = ["exterior_1", "wrist_left"]
    tasks = list(TASKS.values())
    policy = PickPlacePolicy()
    policy.load(None)
    env = PickPlaceBenchmark()
    env.setup(max_seconds=max_seconds)
    cols = {k: [] for k in ("state", "action", "task", "episode", "frame", "sampled")}
    images = {v: [] for v in views}
    successes = 0
    t0 = time.monotonic()
    try:
        for i in range(episodes):
            key = list(TASKS)[i % len(TASKS)]
            env.reset(key, first_seed + i)
            buffer: list = []
            step, done, metrics = 0, False, {}
            while not done:
                raw = env.observe() if (step % stride == 0 or not buffer) else None
                if not buffer:
                    obs = seq.Observation(images=raw["images"], proprio=raw["proprio"], instruction=TASKS[key])
                    prefix = None if step == 0 else np.asarray(pending_tail, np.float32)
                    rows = np.asarray(policy.infer(obs, prefix=prefix, delay_steps=0).actions)
                    buffer, pending_tail = list(rows[:HORIZON]), rows[HORIZON:]
                state = np.concatenate([env.sim.joint_positions(), [env.sim.gripper()]])
                row = np.asarray(buffer.pop(0))
                cols["state"].append(state.astype(np.float32))
                cols["action"].append(row.astype(np.float32))
                cols["task"].append(tasks.index(TASKS[key]))
                cols["episode"].append(i)
                cols["frame"].append(step)
                cols["sampled"].append(raw is not None)
                for v in views:
                    if raw is None:
                        images[v].append(np.zeros((image_size, image_size, 3), np.uint8))
                        continue
                    x = preprocess(torch.from_numpy(np.ascontiguousarray(raw["images"][v]))[None], image_size)
                    images[v].append(((x[0] + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
                                     .permute(1, 2, 0).numpy())
                env.step(row.tolist())
                step += 1
                done, metrics = env.check()
            successes += int(metrics.get("success", 0.0))
            print(f"  episode {i}: {key} seed {first_seed + i}: success {metrics.get('success', 0.0):.0f}, "
                  f"{step} frames, {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        env.close()
    arrays = {k: np.asarray(v) for k, v in cols.items()}
    arrays.update({f"images_{v}": np.stack(f) for v, f in images.items()})
    arrays["tasks"] = np.asarray(tasks)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, **arrays)
    os.replace(tmp, out)
    return {"episodes": episodes, "successes": successes, "frames": len(arrays["state"]),
            "sampled": int(arrays["sampled"].sum()), "seconds": round(time.monotonic() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Record closed-form demonstrations in process into one .npz.")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=15.0)
    ap.add_argument("--stride", type=int, default=2, help="keep the images of every N-th frame")
    a = ap.parse_args(argv)
    if a.episodes < 1 or a.stride < 1:
        ap.error("--episodes and --stride must be >= 1")
    print(record(a.out, a.episodes, a.first_seed, a.max_seconds, a.stride))
    return 0


if __name__ == "__main__":
    sys.exit(main())
