"""Flywheel step 1: record demonstrations of the closed-form policy as episode bags.

    python examples/flywheel/record.py --out DIR --episodes N [--first-seed S] [--max-seconds 30]
                                       [--policy pick-place] [--jobs 2]

Needs a gateway with the closed-form demo policy deployed (``SEQUENCES_GATEWAY_URL`` /
``SEQUENCES_API_KEY``, as ``seq serve`` + ``seq deploy examples/pick_place/policy.py --name
pick-place`` give; ``run_flywheel.py`` does both) and the ROS environment (``scripts/env.sh``:
messages are serialized with rclpy).

Episode ``i`` uses scene seed ``first_seed + i`` and the ``i``-th of the benchmark's six colour
pairs (cycling), so instructions and placements both vary. Each episode is one bag in ``DIR``,
labelled with the sim's own success check.

Why not the ROS stack (``sim_robot`` + ``policy_driver`` + ``episode_recorder``)? It records the
same thing but paces every step on the wall clock (15 Hz) and pays a ROS graph start per episode
(the sim node builds its scene, discovery, a 1 s settle): about 30 s per episode whatever the
machine. Here the sim is stepped as fast as it renders (the benchmark ``pick-place``'s own env:
reset -> observe -> step -> check), the policy is queried through the normal client
(``Policy.predict``, one query per ``open_loop_horizon`` rows, as ``seq eval`` does), and ``--jobs``
episodes run side by side. What lands on disk is the recorder's format, written by the
recorder's own :class:`~sequence_ai_ros.bag.writer.BagWriter`: the same topics and message types
(JPEG ``CompressedImage`` per camera, ``JointState``, ``Float64MultiArray`` commands), the same
JSON start/end markers (assembly settings, RunOutcome fields, ``label.success``), so
``sequence-ai bag export`` reads these bags exactly as it reads a robot's. Log times are
simulated time (from the wall clock at the episode's start), so the exporter measures 15 Hz.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

from sequence_ai_sim.benchmarks.pick_place import TASKS, PickPlaceBenchmark
from sequence_ai_sim.panda_sim import ARM_JOINT_NAMES, EXTERIOR_CAMERA, GRIPPER_NAME, WRIST_CAMERA

VIEWS = [EXTERIOR_CAMERA, WRIST_CAMERA]
TASK_KEYS = list(TASKS)            # the six colour pairs, in the benchmark's order
JPEG_QUALITY = 90                  # the recorder's default jpeg_quality


def start_marker(instruction: str, max_seconds: float, seed: int) -> dict:
    """The episode start marker, as ``episode_recorder`` writes it for the demo's topic names."""
    return {
        "event": "start", "source": "flywheel-sim", "task": instruction, "max_seconds": float(max_seconds),
        "seed": int(seed), "t_ns": time.time_ns(), "views": list(VIEWS),
        "camera_topics": [f"/camera/{v}/image_raw" for v in VIEWS],
        "camera_transports": ["raw"] * len(VIEWS), "camera_time_bases": ["receive"] * len(VIEWS),
        "camera_alignments": ["latest"] * len(VIEWS),
        "joint_state_topic": "/joint_states", "joint_state_type": "sensor_msgs/msg/JointState",
        "joint_state_time_base": "receive", "joint_state_alignment": "latest",
        "joint_names": list(ARM_JOINT_NAMES), "gripper_joint": GRIPPER_NAME, "max_sensor_age_s": 0.5,
        "command_topic": "/joint_commands", "command_type": "float64_multi_array",
        "image_topics": {v: f"/camera/{v}/image_raw/compressed" for v in VIEWS},
    }


class _SimBag:
    """Serializes the sim's sensors and the commands into a BagWriter at simulated log times."""

    def __init__(self, writer, t0_ns: int):
        from builtin_interfaces.msg import Time
        from rclpy.serialization import serialize_message
        from sensor_msgs.msg import CompressedImage, JointState
        from std_msgs.msg import Float64MultiArray, String

        self.w, self.t0 = writer, t0_ns
        self._ser, self._Time = serialize_message, Time
        self._CI, self._JS, self._F, self._S = CompressedImage, JointState, Float64MultiArray, String

    def t_ns(self, sim_s: float) -> int:
        return self.t0 + int(round(sim_s * 1e9))

    def _put(self, topic, msgtype, t, msg, essential=False) -> None:
        raw = self._ser(msg)
        while not self.w.put(topic, msgtype, t, raw, essential=essential):
            if not self.w.is_open:
                raise RuntimeError("the bag writer closed while recording")
            time.sleep(0.002)   # the queue is full: we are not a live robot, so wait instead of dropping

    def string(self, topic: str, text: str, t: int) -> None:
        self._put(topic, "std_msgs/msg/String", t, self._S(data=text), essential=True)

    def sensors(self, t: int, jpegs: dict, q, gripper: float) -> None:
        stamp = self._Time(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000)
        for view, data in jpegs.items():
            msg = self._CI(format="rgb8; jpeg compressed rgb8")
            msg.header.stamp, msg.header.frame_id = stamp, f"{view}_optical_frame"
            msg.data = data
            self._put(f"/camera/{view}/image_raw/compressed", "sensor_msgs/msg/CompressedImage", t, msg)
        js = self._JS(name=list(ARM_JOINT_NAMES) + [GRIPPER_NAME],
                      position=[float(x) for x in q] + [float(gripper)])
        js.header.stamp = stamp
        self._put("/joint_states", "sensor_msgs/msg/JointState", t, js)

    def command(self, t: int, row) -> None:
        self._put("/joint_commands", "std_msgs/msg/Float64MultiArray", t, self._F(data=[float(x) for x in row]))


def record_episode(bench: PickPlaceBenchmark, policy, out_dir: Path, index: int, seed: int, task_key: str,
                   max_seconds: float) -> dict:
    """Run one episode of ``task_key`` on scene ``seed`` against ``policy`` and write its bag.

    Returns ``{"bag", "task", "instruction", "seed", "success", "distance_m", "actions",
    "chunks", "sim_s", "wall_s"}``. Raises whatever the client raises (a refused observation,
    the gateway gone) after closing the bag with an end marker saying so.
    """
    import simplejpeg
    from sequence_ai import ImageFrame, Observation, Proprioception

    from sequence_ai_ros.bag import EPISODE_TOPIC, INSTRUCTION_TOPIC
    from sequence_ai_ros.bag.writer import BagWriter

    instruction = TASKS[task_key]
    bench.max_seconds = float(max_seconds)
    bench.reset(task_key, seed)
    sim = bench.sim
    writer = BagWriter(queue_size=1024)
    path = out_dir / f"episode-{index:05d}-seed{seed}-{task_key}"
    writer.open(path)
    t_wall = time.monotonic()
    bag = _SimBag(writer, time.time_ns())
    bag.string(EPISODE_TOPIC, json.dumps(start_marker(instruction, max_seconds, seed)), bag.t_ns(0.0))
    bag.string(INSTRUCTION_TOPIC, instruction, bag.t_ns(0.0))
    actions = chunks = 0
    outcome = {"reason": "error", "message": ""}
    ok, info = False, {"xy_dist_m": float("nan")}
    try:
        done = False
        pending: list = []
        while not done:
            t = bag.t_ns(sim.time)
            frames = {v: sim.render(v) for v in VIEWS}
            jpegs = {v: simplejpeg.encode_jpeg(np.ascontiguousarray(f), quality=JPEG_QUALITY, colorspace="RGB")
                     for v, f in frames.items()}
            q, g = sim.joint_positions(), sim.gripper()
            bag.sensors(t, jpegs, q, g)
            if not pending:
                obs = Observation(images=[ImageFrame(view=v, data=b) for v, b in jpegs.items()],
                                  proprioception=Proprioception(joint_positions=[float(x) for x in q], gripper=[float(g)]),
                                  instruction=instruction)
                pred = policy.predict(obs)
                rows = [list(r) for r in pred.action_chunk.actions]
                if not rows:
                    raise RuntimeError("the policy returned an empty chunk")
                horizon = pred.action_chunk.open_loop_horizon or len(rows)
                pending = rows[:max(1, min(int(horizon), len(rows)))]
                chunks += 1
            row = pending.pop(0)
            bag.command(t + 1_000_000, row)   # 1 ms after the sensors it was computed from
            bench.step(row)
            actions += 1
            done, _metrics = bench.check()
        ok, info = sim.success(*bench.pair)
        outcome = {"reason": "until" if ok else "max_seconds", "actions": actions, "chunks": chunks,
                   "seconds": float(sim.time), "message": ""}
    except BaseException as exc:
        outcome = {"reason": "error", "actions": actions, "chunks": chunks, "seconds": float(sim.time),
                   "message": f"{type(exc).__name__}: {exc}"}
        raise
    finally:
        end = {"event": "end", "source": "flywheel-sim", "t_ns": bag.t_ns(sim.time + 0.1), "outcome": outcome,
               "label": {"success": bool(ok) if outcome["reason"] != "error" else None},
               "distance_m": float(info["xy_dist_m"]), "dropped": writer.stats.dropped}
        bag.string(EPISODE_TOPIC, json.dumps(end), end["t_ns"])
        stats = writer.close()
        writer.shutdown()
    return {"bag": str(stats.path), "task": task_key, "instruction": instruction, "seed": seed, "success": bool(ok),
            "distance_m": float(info["xy_dist_m"]), "actions": actions, "chunks": chunks, "sim_s": float(sim.time),
            "wall_s": time.monotonic() - t_wall}


def _worker(jobs: list, out_dir: str, policy_name: str, max_seconds: float, results) -> None:
    import sequence_ai

    bench = PickPlaceBenchmark()
    bench.setup(max_seconds=max_seconds)
    try:
        with sequence_ai.connect(policy_name) as policy:
            policy.wait_until_ready(timeout_s=300.0)
            for index, seed, task_key in jobs:
                try:
                    r = record_episode(bench, policy, Path(out_dir), index, seed, task_key, max_seconds)
                except Exception as exc:  # noqa: BLE001 - one failed episode is reported, the rest go on
                    r = {"task": task_key, "seed": seed, "error": f"{type(exc).__name__}: {exc}"}
                results.put(r)
    finally:
        bench.close()


def _say(r: dict) -> None:
    if "error" in r:
        print(f"  {r['task']:>14} seed {r['seed']:4d}  ERROR {r['error']}", flush=True)
    else:
        print(f"  {r['task']:>14} seed {r['seed']:4d}  {'ok  ' if r['success'] else 'FAIL'} "
              f"{r['distance_m'] * 100:5.1f} cm  {r['actions']:4d} steps  {r['wall_s']:5.1f} s", flush=True)


def record(out_dir: Path, episodes: int, *, first_seed: int = 0, max_seconds: float = 30.0,
           policy: str = "pick-place", jobs: int = 1, quiet: bool = False) -> list:
    """Record ``episodes`` episodes (seed ``first_seed + i``, colour pair ``i mod 6``) into
    ``out_dir`` with ``jobs`` processes; returns one dict per episode (see :func:`record_episode`;
    a failed one has ``error``), in episode order. ``max_seconds``: simulated time bound (s)."""
    if episodes < 1 or jobs < 1:
        raise ValueError(f"episodes and jobs must be >= 1, got {episodes} and {jobs}")
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = [(i, first_seed + i, TASK_KEYS[i % len(TASK_KEYS)]) for i in range(episodes)]
    jobs = min(jobs, episodes)
    if jobs == 1:   # in this process: no interpreter start, no second import of the sim
        import queue

        results = queue.Queue()
        _worker(plan, str(out_dir), policy, max_seconds, results)
        out = [results.get_nowait() for _ in range(results.qsize())]
        if not quiet:
            for r in out:
                _say(r)
        return sorted(out, key=lambda r: r["seed"])
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(plan[k::jobs], str(out_dir), policy, max_seconds, results))
             for k in range(jobs)]
    for p in procs:
        p.start()
    out = []
    finished = False
    try:
        while len(out) < episodes:
            try:
                r = results.get(timeout=5.0)
            except Exception:   # queue.Empty: check that the workers still live
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError(f"recording workers exited after {len(out)} of {episodes} episodes")
                continue
            out.append(r)
            if not quiet:
                _say(r)
        finished = True
    finally:
        for p in procs:
            if not finished:        # interrupted or failed: stop recording now, do not wait it out
                p.terminate()
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sorted(out, key=lambda r: (r["seed"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the bags (one per episode)")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=30.0, help="simulated time bound per episode (s)")
    ap.add_argument("--policy", default="pick-place", help="the deployed closed-form policy's name")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    a = ap.parse_args(argv)
    rs = record(a.out, a.episodes, first_seed=a.first_seed, max_seconds=a.max_seconds, policy=a.policy, jobs=a.jobs)
    good = [r for r in rs if "error" not in r]
    print(f"recorded {len(good)} of {len(rs)} episodes into {a.out}: {sum(r['success'] for r in good)} successes")
    (a.out / "record.json").write_text(json.dumps(rs, indent=2))
    return 0 if len(good) == len(rs) else 1


if __name__ == "__main__":
    sys.exit(main())
