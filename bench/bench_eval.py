"""Benchmark: the demo policy on ``pick-place`` through ``seq eval run`` (not run in CI).

    python bench/bench_eval.py [--episodes 50] [--envs 2] [--tasks 6]

Starts a local gateway, deploys examples/pick_place/policy.py, runs the eval (sim loop), and
prints success and final distance per task with episode counts, the median wall-clock per
episode, the median simulated seconds per episode and their ratio (simulated / wall; above 1 is
faster than real time), and the eval's total wall-clock.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sequence_ai_ros.demo import deploy, local_server  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=50, help="episodes per task")
    ap.add_argument("--envs", type=int, default=2)
    ap.add_argument("--tasks", default="6", help="first N tasks or ids a,b")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, local_server(Path(tmp) / "server") as server:
        deploy(server)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "seq.cli", "eval", "run", "pick-place", "--benchmark", "pick-place",
                              "--episodes", str(args.episodes), "--envs", str(args.envs), "--tasks", args.tasks],
                             env=server.env(), capture_output=True, text=True)
        total = time.monotonic() - t0
        if out.returncode != 0:
            print(out.stdout[-3000:], out.stderr[-3000:])
            return 1
        evals = server.data_dir / "evals"
        folder = next(evals.iterdir())
        episodes = [json.loads(x) for x in (folder / "episodes.jsonl").read_text().splitlines()]
    ok = [e for e in episodes if not e.get("error")]
    print(f"pick-place, demo policy, sim loop, {args.envs} envs: {len(episodes)} episodes "
          f"({len(episodes) - len(ok)} errors), eval wall {total:.1f} s")
    print(f"{'task':<16}{'episodes':>9}{'success':>9}{'median dist cm':>16}{'median sim s':>14}")
    for task in sorted({e["task"] for e in ok}, key=lambda t: [x["task"] for x in ok].index(t)):
        eps = [e for e in ok if e["task"] == task]
        print(f"{task:<16}{len(eps):>9}{statistics.fmean(e['metrics']['success'] for e in eps):>9.3f}"
              f"{100 * statistics.median(e['metrics']['final_distance_m'] for e in eps):>16.2f}"
              f"{statistics.median(e['metrics']['episode_s'] for e in eps):>14.2f}")
    wall = statistics.median(e["wall_s"] for e in ok)
    sim = statistics.median(e["metrics"]["episode_s"] for e in ok)
    print(f"overall success {statistics.fmean(e['metrics']['success'] for e in ok):.3f}; "
          f"median wall per episode (per env) {wall:.2f} s; median sim per episode {sim:.2f} s; "
          f"sim/wall {sim / wall:.2f}; eval throughput {len(ok) / total * 60:.1f} episodes/min; "
          f"median infer {statistics.median(e['infer_ms'] for e in ok if e.get('infer_ms')):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
