"""The data flywheel end to end: record -> export -> train -> deploy -> eval against the teacher.

    python examples/flywheel/run_flywheel.py [--out DIR] [--episodes 300] [--max-seconds 15]
        [--train-minutes 60 | --train-steps N] [--train-batch 64] [--train-successes-only]
        [--train-init CHECKPOINT [--train-flow-only]]
        [--eval-episodes 10] [--eval-envs 2] [--eval-seed 100000] [--jobs 2] [--gate success>=0.5] [--ship]

What runs, each as the real thing (``. scripts/env.sh`` first):

1. ``seq serve`` (a local gateway in ``DIR/server``) and ``seq deploy examples/pick_place/policy.py
   --name pick-place`` -- the closed-form teacher;
2. ``record.py``: ``--episodes`` demonstrations (seeds 0.., the six colour pairs in turn) through
   the client into episode bags (``DIR/bags``), labelled by the sim's success check;
3. ``sequence-ai bag export DIR/bags/* --out DIR/dataset --format lerobot`` -- the project's
   exporter, LeRobot v3.0;
4. ``train.py DIR/dataset --out DIR/checkpoint`` (torch, CPU; ``--train-init`` / ``--train-flow-only``
   pass ``--init`` / ``--flow-only``: start from a checkpoint, train only its flow head);
5. ``seq volume put pick-place-learned DIR/checkpoint`` (the next version of the volume the
   learned policy declares, ``weights="vol://pick-place-learned"``) and ``seq deploy
   learned_policy.py --name learned``;
6. ``seq eval run learned --benchmark pick-place --seed 100000 --compare pick-place`` -- both
   policies on the same unseen scenes (seeds from 100000: no layout or light a demonstration
   had), per colour pair.

``--ship`` copies the checkpoint to ``examples/flywheel/checkpoint/`` (what ``sequence-ai-demo
--policy learned`` and the eval test upload on a fresh machine). Writes ``DIR/flywheel.json`` with every step's figures; exits 0 when
every step ran (and ``--gate``, if given, passed), else the failing step's code.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
REPO = _HERE.parent.parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
EVAL_SEED = 100_000      # eval scenes (layout and light) start here; demonstrations use seeds 0..episodes-1


def _run(cmd: list, env: dict, timeout: float, what: str, log=None) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout)
    if log is not None:
        log.write(f"$ {' '.join(map(str, cmd))}\n{out.stdout}{out.stderr}\n")
        log.flush()
    if out.returncode != 0 and what:
        raise RuntimeError(f"{what} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def flywheel(out: Path, *, episodes: int, max_seconds: float, train_minutes=None, train_steps=None,
             eval_episodes: int = 10, eval_envs: int = 2, eval_tasks: int = 6, eval_max_seconds: float = None,
             train_batch: int = 64, train_successes_only: bool = False, jobs: int = 2, gate: str = None,
             train_init: Path = None, train_flow_only: bool = False,
             ship: bool = False, quiet: bool = False, eval_seed: int = EVAL_SEED) -> dict:
    """Run the six steps (see the module docstring) under ``out``; returns the summary dict
    (also written to ``out/flywheel.json``). Raises RuntimeError naming the step that failed."""
    from sequence_ai_ros.demo import deploy, deploy_learned, local_server

    import record

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"out": str(out)}
    log = open(out / "flywheel.log", "a")
    t_all = time.monotonic()
    try:
        with local_server(out / "server") as server:
            env = {**server.env(), "PYTHONUNBUFFERED": "1"}
            os.environ.update(server.env())
            say(f"gateway   {server.url} (data {server.data_dir})")
            t = time.monotonic()
            deploy(server, REPO / "examples" / "pick_place" / "policy.py", "pick-place")
            say(f"deployed  pick-place (closed form) in {time.monotonic() - t:.1f} s")

            # 1. record
            t = time.monotonic()
            bags_dir = out / "bags"
            say(f"record    {episodes} episodes, {jobs} jobs, max {max_seconds:g} s sim time each")
            recs = record.record(bags_dir, episodes, max_seconds=max_seconds, jobs=jobs, quiet=quiet)
            good = [r for r in recs if "error" not in r]
            if not good:
                raise RuntimeError(f"record: every episode failed, e.g. {recs[0].get('error')}")
            (out / "record.json").write_text(json.dumps(recs, indent=2))
            summary["record"] = {"episodes": len(good), "failed": len(recs) - len(good),
                                 "successes": sum(r["success"] for r in good), "wall_s": round(time.monotonic() - t, 1),
                                 "sim_s": round(sum(r["sim_s"] for r in good), 1)}
            say(f"recorded  {summary['record']}")

            # 2. export, with the project's exporter
            t = time.monotonic()
            dataset = out / "dataset"
            bags = sorted(Path(r["bag"]) for r in good)
            res = _run([sys.executable, "-m", "sequence_ai.cli", "bag", "export", *bags, "--out", dataset,
                        "--format", "lerobot", "--robot-type", "panda", "--overwrite"], env, 3600, "export", log)
            summary["export"] = {"dataset": str(dataset), "wall_s": round(time.monotonic() - t, 1),
                                 "line": res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""}
            say(f"exported  {summary['export']['line']} ({summary['export']['wall_s']} s)")

            # 3. train
            t = time.monotonic()
            ckpt = out / "checkpoint"
            cmd = [sys.executable, _HERE / "train.py", dataset, "--out", ckpt, "--batch", train_batch]
            cmd += ["--successes-only"] if train_successes_only else []
            cmd += ["--steps", train_steps] if train_steps is not None else []
            cmd += ["--minutes", train_minutes] if train_minutes is not None else []
            cmd += ["--init", train_init] if train_init is not None else []
            cmd += ["--flow-only"] if train_flow_only else []
            res = _run(cmd, env, 4 * 3600, "train", log)
            summary["train"] = {k: v for k, v in json.loads((ckpt / "train.json").read_text()).items() if k != "losses"}
            summary["train"]["checkpoint_mb"] = round((ckpt / "policy.pt").stat().st_size / 1e6, 2)
            summary["train"]["wall_s"] = round(time.monotonic() - t, 1)
            say(f"trained   {summary['train']['steps']} steps in {summary['train']['train_s']} s, "
                f"L1 {summary['train']['final_l1']:.4f}, {summary['train']['checkpoint_mb']} MB")
            if ship:
                (_HERE / "checkpoint").mkdir(exist_ok=True)
                shutil.copy2(ckpt / "policy.pt", _HERE / "checkpoint" / "policy.pt")
                shutil.copy2(ckpt / "train.json", _HERE / "checkpoint" / "train.json")

            # 4. upload the fresh checkpoint as the next version of the volume the learned policy
            #    loads (weights="vol://pick-place-learned", newest version) and deploy it
            t = time.monotonic()
            line = deploy_learned(server, ckpt, "learned")
            summary["deploy"] = {"name": "learned", "volume": line.strip(), "wall_s": round(time.monotonic() - t, 1)}
            say(f"deployed  learned ({line.strip()}) in {summary['deploy']['wall_s']} s")

            # 5. eval against the closed-form teacher, same seeds
            t = time.monotonic()
            cmd = [sys.executable, "-m", "seq.cli", "eval", "run", "learned", "--benchmark", "pick-place",
                   "--envs", eval_envs, "--episodes", eval_episodes, "--tasks", eval_tasks, "--seed", eval_seed,
                   "--compare", "pick-place"]
            if eval_max_seconds is not None:
                cmd += ["--param", f"max_seconds={eval_max_seconds:g}"]
            if gate:
                cmd += ["--gate", gate]
            res = _run(cmd, env, 4 * 3600, "", log)
            m = re.search(r"^eval\s+(ev-\S+)", res.stdout, re.M)
            summary["eval"] = {"rc": res.returncode, "id": m.group(1) if m else None, "report": res.stdout,
                               "wall_s": round(time.monotonic() - t, 1)}
            if m:
                csv = _run([sys.executable, "-m", "seq.cli", "eval", "report", m.group(1), "--csv", "-"], env, 120, "", log)
                summary["eval"]["csv"] = csv.stdout
            say(res.stdout.rstrip())
            if res.returncode not in (0, 8) or not m:
                raise RuntimeError(f"eval failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    finally:
        log.close()
        summary["total_s"] = round(time.monotonic() - t_all, 1)
        (out / "flywheel.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv=None) -> int:
    from sequence_ai_ros.demo import exit_on_sigterm

    exit_on_sigterm()      # a killed run stops its gateway and workers too
    ap = argparse.ArgumentParser(description="record -> export -> train -> deploy -> eval (the data flywheel)")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / time.strftime("flywheel-%Y%m%d-%H%M%S"))
    ap.add_argument("--episodes", type=int, default=300, help="demonstrations to record")
    ap.add_argument("--max-seconds", type=float, default=15.0,
                    help="sim-time bound per recorded episode (s; the teacher needs 8-10)")
    ap.add_argument("--jobs", type=int, default=2, help="recording processes")
    ap.add_argument("--train-minutes", type=float, default=None)
    ap.add_argument("--train-steps", type=int, default=None)
    ap.add_argument("--train-batch", type=int, default=64)
    ap.add_argument("--train-successes-only", action="store_true",
                    help="train on the demonstrations the sim labelled successful only")
    ap.add_argument("--train-init", type=Path, default=None, help="start training from this policy.pt")
    ap.add_argument("--train-flow-only", action="store_true", help="with --train-init: train only the flow head")
    ap.add_argument("--eval-episodes", type=int, default=10, help="episodes per colour pair and policy")
    ap.add_argument("--eval-envs", type=int, default=2)
    ap.add_argument("--eval-tasks", type=int, default=6, help="colour pairs to evaluate (first N)")
    ap.add_argument("--eval-seed", type=int, default=EVAL_SEED,
                    help="first eval seed (default: far from the recorded seeds 0.., so no eval scene was a demonstration)")
    ap.add_argument("--eval-max-seconds", type=float, default=None, help="sim-time bound per eval episode (s)")
    ap.add_argument("--gate", default=None, help="e.g. success>=0.5 (eval exits 8 when missed)")
    ap.add_argument("--ship", action="store_true", help="copy the checkpoint into examples/flywheel/checkpoint/")
    a = ap.parse_args(argv)
    if a.train_minutes is None and a.train_steps is None:
        a.train_minutes = 60.0
    try:
        s = flywheel(a.out, episodes=a.episodes, max_seconds=a.max_seconds, train_minutes=a.train_minutes,
                     train_steps=a.train_steps, eval_episodes=a.eval_episodes, eval_envs=a.eval_envs,
                     eval_tasks=a.eval_tasks, eval_max_seconds=a.eval_max_seconds, eval_seed=a.eval_seed,
                     train_batch=a.train_batch, train_successes_only=a.train_successes_only, jobs=a.jobs,
                     train_init=a.train_init, train_flow_only=a.train_flow_only,
                     gate=a.gate, ship=a.ship)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"total     {s['total_s']} s; figures in {a.out / 'flywheel.json'}")
    return s["eval"]["rc"]


if __name__ == "__main__":
    sys.exit(main())
