"""Delay-aware action chunks on the pick-place benchmark: success and seam jumps under injected latency.

    python bench/bench_delay.py [--policy closed-form|learned|both] [--latency-ms 0,200,400,600]
                                [--modes replace,aligned,guided] [--seeds 2] [--first-seed 100000]
                                [--max-seconds 20] [--jobs 2] [--json out.json]

What runs: the ``pick-place`` benchmark's own env (``sequence_ai_sim.benchmarks.pick_place``:
reset -> observe -> step -> check, the MuJoCo Panda cell) and the policy class itself, loaded in
this process (the closed-form ``examples/pick_place/policy.py`` or the flywheel's learned
``examples/flywheel/learned_policy.py`` with its shipped checkpoint), on simulated time. The
inference latency is injected as a number of control steps, ``d = ceil(latency * 15 Hz)``: a
request observes at step ``t`` and its chunk arrives at step ``t + d``, while the robot keeps
playing the rows it holds (one request in flight; the next goes out so that its answer lands when
the open-loop horizon, 8 rows, of the current chunk has played; an empty buffer holds the last
command: an underrun). Simulated time makes the figures independent of the machine's load; the
client's own loop (``sequence_ai_core``) is not in it -- this measures what the merge and the
policy's use of the prefix do to the motion, not the transport.

Per arm (policy x latency x mode), over ``seeds`` scenes x the six colour pairs:

* ``replace`` -- today's merge: the new chunk replaces the buffer from its row 0 (the row that
  was due at the observation, ``d`` steps ago); the policy gets no prefix (``delay_mode="chunk"``).
* ``aligned`` -- the merge drops the ``d`` rows whose time has passed and starts at the row due now;
  still no prefix.
* ``guided`` -- aligned, and the request carries the committed prefix (every row the buffer will
  play from the observation on, at least ``d``, padded by holding the last) and ``delay_steps=d``:
  the closed-form policy plans on from the last committed row; the learned one inpaints the prefix
  by real-time-chunking guidance of its flow head.

Printed per arm: success rate, the arm-joint seam jump p99 (largest joint change from the last
row played to the first row of a new chunk, rad; the first chunk of an episode excluded), the
within-chunk step p99 (the same between consecutive rows of one chunk, rad), their ratio,
underrun steps per episode. Target: at 400 ms guided within 5 points of its own 0 ms success,
seam p99 <= 2x within-chunk p99.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
HZ = 15.0
HORIZON = 8            # open-loop horizon: rows of a chunk played before the next one is due
MODES = ("replace", "aligned", "guided")
POLICIES = {
    "closed-form": (REPO / "examples" / "pick_place", "policy", "PickPlacePolicy", None),
    "learned": (REPO / "examples" / "flywheel", "learned_policy", "LearnedPickPlacePolicy",
                REPO / "examples" / "flywheel" / "checkpoint"),
}


def _load_policy(name: str, checkpoint=None):
    folder, module, cls_name, weights = POLICIES[name]
    weights = checkpoint if (checkpoint and name == "learned") else weights
    sys.path.insert(0, str(folder))
    import importlib

    policy = getattr(importlib.import_module(module), cls_name)()
    policy.load(str(weights) if weights else None)
    return policy


def committed_prefix(buffer: list, d: int, last: np.ndarray) -> np.ndarray:
    """Every row the buffer will play from now on, at least ``max(1, d)``, padded by holding the
    last (the last command when the buffer is empty): (k, 8)."""
    rows = [np.asarray(r, float) for r in buffer] or [np.asarray(last, float)]
    while len(rows) < max(1, d):
        rows.append(rows[-1].copy())
    return np.stack(rows)


def run_episode(env, policy, task: str, instruction: str, seed: int, d: int, mode: str,
                max_steps: int) -> dict:
    """One episode on simulated time (see the module docstring); returns its figures."""
    import seq

    env.reset(task, seed)
    last = env.sim.command()  # (8,): the ready pose, gripper open
    buffer: list = []          # rows still to play (the current chunk's tail)
    pending = None             # (arrival step, chunk rows)
    played_since_arrival, cold = 0, True
    seams, within, underruns = [], [], 0
    seam_next = False
    steps, done, metrics = 0, False, {}
    while not done and steps < max_steps:
        if pending is None and (cold or played_since_arrival >= max(0, HORIZON - d) or not buffer):
            raw = env.observe()
            obs = seq.Observation(images=raw["images"], proprio=raw["proprio"], instruction=instruction)
            kw = {}
            if mode == "guided" and not cold:
                kw = {"prefix": committed_prefix(buffer, d, last).astype(np.float32), "delay_steps": d}
            chunk = np.asarray(policy.infer(obs, open_loop_horizon=HORIZON, **kw).actions, float)
            pending = (steps + d, chunk, cold)
            cold = False
        if pending is not None and pending[0] <= steps:
            _, chunk, first = pending
            pending = None
            buffer = list(chunk if mode == "replace" else chunk[d:])
            played_since_arrival = 0
            seam_next = not first
        if buffer:
            row = np.asarray(buffer.pop(0), float)
            jump = float(np.max(np.abs(row[:7] - last[:7])))
            if seam_next:
                seams.append(jump)
            elif played_since_arrival > 0:
                within.append(jump)
            seam_next = False
        else:
            row = last
            underruns += 1
        env.step(row.tolist())
        last = row
        played_since_arrival += 1
        steps += 1
        done, metrics = env.check()
    return {"success": float(metrics.get("success", 0.0)), "steps": steps, "seams": seams,
            "within": within, "underruns": underruns}


def _worker(job_q, out_q, max_seconds: float, checkpoint=None) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from sequence_ai_sim.benchmarks.pick_place import TASKS, PickPlaceBenchmark

    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass
    env = PickPlaceBenchmark()
    env.setup(max_seconds=max_seconds)
    policies: dict = {}
    while True:
        job = job_q.get()
        if job is None:
            break
        name = job["policy"]
        if name not in policies:
            policies[name] = _load_policy(name, checkpoint)
        d = math.ceil(job["latency_ms"] / 1000.0 * HZ - 1e-9)
        limit = getattr(sys.modules[type(policies[name]).__module__], "MAX_DELAY_STEPS", None)
        if job["mode"] == "guided" and limit is not None and d > limit:
            # the client refuses this before motion (DelayUnsupported): nothing to run
            out_q.put({**job, "d": d, "refused": f"delay {d} steps > max_delay_steps {limit}", "success": None,
                       "steps": 0, "seams": [], "within": [], "underruns": 0, "wall_s": 0.0})
            continue
        t0 = time.monotonic()
        r = run_episode(env, policies[name], job["task"], TASKS[job["task"]], job["seed"], d, job["mode"],
                        int(round(max_seconds * HZ)))
        out_q.put({**job, **r, "d": d, "wall_s": time.monotonic() - t0})
    env.close()


def _p99(values: list) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def summarize(results: list) -> list:
    """One row per (policy, latency, mode): success, seam / within-chunk p99 (rad), underruns."""
    rows = []
    keys = sorted({(r["policy"], r["latency_ms"], r["mode"]) for r in results},
                  key=lambda k: (k[0], k[1], MODES.index(k[2])))
    for policy, lat, mode in keys:
        rs = [r for r in results if (r["policy"], r["latency_ms"], r["mode"]) == (policy, lat, mode)]
        if any(r.get("refused") for r in rs):
            rows.append({"policy": policy, "latency_ms": lat, "delay_steps": rs[0]["d"], "mode": mode,
                         "episodes": 0, "refused": rs[0]["refused"]})
            continue
        seams = [j for r in rs for j in r["seams"]]
        within = [j for r in rs for j in r["within"]]
        rows.append({"policy": policy, "latency_ms": lat, "delay_steps": rs[0]["d"], "mode": mode,
                     "episodes": len(rs), "success": float(np.mean([r["success"] for r in rs])),
                     "seam_p99": _p99(seams), "within_p99": _p99(within),
                     "ratio": _p99(seams) / _p99(within) if within and seams else float("nan"),
                     "underruns_per_ep": float(np.mean([r["underruns"] for r in rs])),
                     "wall_s_per_ep": float(np.median([r["wall_s"] for r in rs]))})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="both", choices=["closed-form", "learned", "both"])
    ap.add_argument("--latency-ms", default="0,200,400,600")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--seeds", type=int, default=2, help="scenes per colour pair")
    ap.add_argument("--first-seed", type=int, default=100_000)
    ap.add_argument("--tasks", type=int, default=6, help="the first N colour pairs")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="simulated-time bound per episode (s)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--learned-checkpoint", type=Path, default=None,
                    help="folder with the learned policy's policy.pt (default: the shipped one)")
    ap.add_argument("--json", type=Path, default=None, help="also write every episode and the table here")
    a = ap.parse_args(argv)
    from sequence_ai_sim.benchmarks.pick_place import TASKS

    names = ["closed-form", "learned"] if a.policy == "both" else [a.policy]
    lats = [int(x) for x in a.latency_ms.split(",")]
    modes = [m for m in a.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; modes: {', '.join(MODES)}")
    jobs = [{"policy": p, "latency_ms": lat, "mode": m, "task": t, "seed": a.first_seed + s}
            for s in range(a.seeds) for t in list(TASKS)[:a.tasks] for p in names for lat in lats for m in modes]
    ctx = mp.get_context("spawn")
    job_q, out_q = ctx.Queue(), ctx.Queue()
    for j in jobs:
        job_q.put(j)
    n = max(1, min(a.jobs, len(jobs)))
    for _ in range(n):
        job_q.put(None)
    procs = [ctx.Process(target=_worker, args=(job_q, out_q, a.max_seconds, a.learned_checkpoint),
                          daemon=True) for _ in range(n)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = []
    while len(results) < len(jobs):
        results.append(out_q.get())
        r = results[-1]
        if r.get("refused"):
            print(f"  [{len(results)}/{len(jobs)}] {r['policy']} {r['latency_ms']} ms {r['mode']}: refused, {r['refused']}")
            continue
        print(f"  [{len(results)}/{len(jobs)}] {r['policy']} {r['latency_ms']} ms {r['mode']:8s} {r['task']} "
              f"seed {r['seed']}: success {r['success']:.0f}, {r['steps']} steps, {r['wall_s']:.1f} s", flush=True)
    for p in procs:
        p.join(timeout=30)
    table = summarize(results)
    print(f"\n{len(jobs)} episodes in {time.monotonic() - t0:.0f} s "
          f"({a.seeds} scene(s) x {a.tasks} colour pairs per arm; seeds from {a.first_seed})")
    print(f"{'policy':12s} {'latency':>8s} {'d':>3s} {'mode':8s} {'success':>8s} {'seam p99':>9s} "
          f"{'step p99':>9s} {'ratio':>6s} {'underruns/ep':>13s}")
    for r in table:
        if r.get("refused"):
            print(f"{r['policy']:12s} {r['latency_ms']:6d}ms {r['delay_steps']:3d} {r['mode']:8s} refused: {r['refused']}")
            continue
        print(f"{r['policy']:12s} {r['latency_ms']:6d}ms {r['delay_steps']:3d} {r['mode']:8s} "
              f"{100 * r['success']:7.1f}% {r['seam_p99']:9.4f} {r['within_p99']:9.4f} {r['ratio']:6.2f} "
              f"{r['underruns_per_ep']:13.1f}")
    if a.json is not None:
        a.json.write_text(json.dumps({"table": table, "episodes": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
