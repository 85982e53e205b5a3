"""Recorder cost at 2 cameras x 15 Hz: CPU of the recorder process and dropped messages.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_recorder.py [--seconds 20] [--rate 15]
    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_recorder.py --timing [--seconds 3]

A publisher in this process plays a robot: two 224x224 rgb8 camera streams (a moving scene, so
JPEG sizes are realistic), joint states and joint commands, all at ``--rate`` Hz. The recorder
(``episode_recorder``) runs as its own process, as on a robot. Two phases of ``--seconds``
each, in one run: idle (subscribed, not recording) and recording (a RecordEpisode goal).
Printed: recorder CPU (% of one core, from /proc utime+stime) idle vs recording and their ratio,
messages written, messages dropped, bag MB/s, the publisher's period jitter (median and
p99 |period - 1/rate|, ms) in each phase (recording must not disturb the loop that publishes),
and the pre-roll the bag starts with (the latest sample of each sensor stream from before the
episode started, and how old it was then, ms).

``--timing``: real times in bags and datasets. For observations at 15 and 30 Hz, with
commands at the observation rate and at twice it (lerobot PR #4423's case), one episode of
``--seconds`` each, recorded two ways -- around driver-style markers (auto_record) that declare the
command rate as the contract's, and as a RecordEpisode goal that declares it (``control_frequency_hz``)
-- the recorder's stamp error (receipt minus header stamp, ms, p50/p99/max, from the bag's
``sequence_ai.stamp_lag``), how the export timed the commands (``source``: their DDS source
timestamps) and where each rate came from, and the exported episode's duration (frames / fps, s)
against the recorded one (commands x period), now and as the export before it timed frames from
stamps and declared rates would have had it (fps = the median receipt rate). Goal: within one period.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import qos_profile_sensor_data
from builtin_interfaces.msg import Time
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray

from sequence_ai_msgs.action import RecordEpisode

VIEWS = ("exterior_1", "wrist_left")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scene(k: int, size: int = 224) -> np.ndarray:
    y, x = np.mgrid[0:size, 0:size]
    img = np.zeros((size, size, 3), np.uint8)
    img[..., 0] = (x + 3 * k) % 256
    img[..., 1] = (y * 0.8 + 40).astype(np.uint8)
    img[..., 2] = 90
    cx, cy = int(112 + 60 * np.sin(k / 10)), int(112 + 40 * np.cos(k / 13))
    img[max(0, cy - 12):cy + 12, max(0, cx - 12):cx + 12] = (220, 30, 30)
    return img


class Robot:
    """Publishes cameras, joint states and commands at ``rate`` Hz on a thread; records periods."""

    def __init__(self, node, rate: float):
        self.node, self.period = node, 1.0 / rate
        self.cams = {v: node.create_publisher(Image, f"camera/{v}/image_raw", qos_profile_sensor_data) for v in VIEWS}
        self.joints = node.create_publisher(JointState, "joint_states", 10)
        self.cmds = node.create_publisher(Float64MultiArray, "joint_commands", 10)
        self.frames = [scene(k) for k in range(64)]
        self.periods: list = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        k, last = 0, None
        names = [f"panda_joint{i}" for i in range(1, 8)] + ["panda_gripper"]
        next_t = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if last is not None:
                self.periods.append(now - last)
            last = now
            stamp = self.node.get_clock().now().to_msg()
            for i, v in enumerate(VIEWS):
                rgb = self.frames[(k + 7 * i) % len(self.frames)]
                msg = Image(height=224, width=224, encoding="rgb8", step=224 * 3, data=rgb.tobytes())
                msg.header.stamp = stamp
                self.cams[v].publish(msg)
            js = JointState(name=names, position=[0.1 * np.sin(k / 20 + j) for j in range(8)])
            js.header.stamp = stamp
            self.joints.publish(js)
            self.cmds.publish(Float64MultiArray(data=[0.1 * np.cos(k / 20 + j) for j in range(8)]))
            k += 1
            next_t += self.period
            time.sleep(max(0.0, next_t - time.monotonic()))

    def take_periods(self):
        p, self.periods = self.periods, []
        return p


def jitter_ms(periods, period):
    dev = sorted(abs(p - period) * 1000 for p in periods)
    if not dev:
        return float("nan"), float("nan")
    return statistics.median(dev), dev[min(len(dev) - 1, int(0.99 * len(dev)))]


def preroll_ages_ms(bag: Path) -> dict:
    """Messages logged before a bag's start marker (the recorder's pre-roll): topic -> age at the
    marker (ms)."""
    from sequence_ai_ros.bag import EPISODE_TOPIC
    from sequence_ai_ros.bag.reader import iter_raw

    msgs = list(iter_raw(bag))
    start = next(m.t_ns for m in msgs if m.topic == EPISODE_TOPIC)
    return {m.topic: (start - m.t_ns) / 1e6 for m in msgs if m.t_ns < start}


def _commands_on_disk(bag: Path) -> int:
    from sequence_ai_ros.bag.reader import BagReadError, iter_raw

    if not list(bag.glob("*.mcap")):
        return 0
    try:
        return sum(1 for m in iter_raw(bag) if m.topic == "/joint_commands")
    except BagReadError:
        return 0


def _until(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {timeout_s} s")
        time.sleep(0.02)


def timing_episode(node, pubs, out: Path, obs_hz: float, cmd_hz: float, seconds: float, record=None) -> dict:
    """One episode: cameras + joint states at ``obs_hz`` stamped on their grid, ``cmd_hz`` commands
    for ``seconds``; around driver-style markers (auto_record), or with ``record`` (a RecordEpisode
    action client) as a RecordEpisode goal declaring ``cmd_hz``. Returns the bag and what was published."""
    import json

    from std_msgs.msg import String

    marker, cams, joints, cmds = pubs
    names = [f"panda_joint{i}" for i in range(1, 8)] + ["panda_gripper"]
    before = set(out.iterdir())
    stop = threading.Event()
    frames = [scene(k) for k in range(16)]

    def sensors():
        k, t0 = 0, time.time_ns()
        while not stop.is_set():
            due = t0 + int(k * 1e9 / obs_hz)
            if stop.wait(max(0.0, (due - time.time_ns()) * 1e-9)):
                return
            stamp = Time(sec=due // 1_000_000_000, nanosec=due % 1_000_000_000)
            for i, v in enumerate(VIEWS):
                rgb = frames[(k + 5 * i) % len(frames)]
                msg = Image(height=224, width=224, encoding="rgb8", step=224 * 3, data=rgb.tobytes())
                msg.header.stamp = stamp
                cams[v].publish(msg)
            js = JointState(name=names, position=[0.1 * np.sin(k / 20 + j) for j in range(8)])
            js.header.stamp = stamp
            joints.publish(js)
            k += 1

    th = threading.Thread(target=sensors, daemon=True)
    th.start()
    try:
        time.sleep(1.0)   # a pre-roll of every stream
        start = {"event": "start", "source": "act", "task": "bench timing", "t_ns": time.time_ns(),
                 "control_frequency_hz": cmd_hz, "views": list(VIEWS),
                 "camera_topics": [f"/camera/{v}/image_raw" for v in VIEWS], "camera_transports": ["raw"] * len(VIEWS),
                 "camera_time_bases": ["receive"] * len(VIEWS), "camera_alignments": ["latest"] * len(VIEWS),
                 "joint_state_topic": "/joint_states", "joint_state_time_base": "receive",
                 "joint_state_alignment": "latest", "joint_names": names[:7], "gripper_joint": "panda_gripper",
                 "max_sensor_age_s": 1.0, "command_mode": "joint_commands", "command_topic": "/joint_commands",
                 "command_type": "float64_multi_array"}
        goal = None
        if record is None:
            marker.publish(String(data=json.dumps(start)))
        else:
            goal = _done(record.send_goal_async(RecordEpisode.Goal(task="bench timing", control_frequency_hz=cmd_hz)))
        bag = _until(lambda: next((p for p in out.iterdir() if p.is_dir() and p not in before), None), 30, "bag")
        n = int(round(seconds * cmd_hz))
        c0 = time.monotonic()
        for k in range(n):
            time.sleep(max(0.0, c0 + k / cmd_hz - time.monotonic()))
            cmds.publish(Float64MultiArray(data=[0.1 * np.cos(k / 20 + j) for j in range(8)]))
        _until(lambda: _commands_on_disk(bag) >= n, 60, f"{n} commands in the bag")
    finally:
        stop.set()
        th.join(timeout=10)
    if goal is None:
        marker.publish(String(data=json.dumps({"event": "end", "source": "act", "t_ns": time.time_ns(),
                                               "outcome": {"reason": "until", "actions": n}, "label": {"success": True}})))
    else:
        _done(goal.cancel_goal_async())
        _done(goal.get_result_async())
    _until(lambda: (bag / "metadata.yaml").exists(), 60, "closed bag")
    return {"bag": bag, "n": n}


def _done(future, timeout_s: float = 60.0):
    return _until(lambda: future.done() and (future.result() or True), timeout_s, "an action answer") and future.result()


def timing_main(seconds: float) -> int:
    """``--timing``: see the module docstring."""
    import json

    from std_msgs.msg import String

    from sequence_ai_data.episode import control_rate_hz
    from sequence_ai_ros.bag.frames import episode_timing, observations_from_bag
    from sequence_ai_ros.bag.reader import custom_data, read_episode
    from sequence_ai_ros.bag.stamps import STAMP_LAG_KEY

    out = Path(tempfile.mkdtemp(prefix="bench-recorder-timing-"))
    rec = subprocess.Popen([sys.executable, "-m", "sequence_ai_ros.recorder_node", "--ros-args",
                            "-p", f"output_dir:={out}", "-p", "auto_record:=true", "-p", "queue_size:=4096"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rclpy.init()
    node = rclpy.create_node("bench_timing_robot")
    pubs = (node.create_publisher(String, "policy_driver/episode", 10),
            {v: node.create_publisher(Image, f"camera/{v}/image_raw", qos_profile_sensor_data) for v in VIEWS},
            node.create_publisher(JointState, "joint_states", 10),
            node.create_publisher(Float64MultiArray, "joint_commands", 100))
    from rclpy.executors import SingleThreadedExecutor

    ex = SingleThreadedExecutor()
    ex.add_node(node)
    spinner = threading.Thread(target=ex.spin, daemon=True)
    spinner.start()
    record = ActionClient(node, RecordEpisode, "episode_recorder/record_episode")
    try:
        _until(lambda: all(p.get_subscription_count() for p in (pubs[0], pubs[2], pubs[3])), 60, "recorder")
        assert record.wait_for_server(timeout_sec=60), "no RecordEpisode server"
        print(f"recorder timing: {len(VIEWS)} cameras 224x224 rgb8 + joint states at the observation rate, "
              f"commands at 1x / 2x it, {seconds:g} s episodes, {os.cpu_count()} cores")
        print(f"  {'via':>6} {'obs Hz':>6} {'cmd Hz':>6} {'frames':>6} {'recorded s':>10} {'exported s':>10} {'err/period':>10}"
              f" | {'before: fps':>11} {'exported s':>10} | cmd times, rate origins (cmd/joints) | "
              f"stamp error ms (p50/p99/max): joints; camera")
        for via, obs_hz, factor in [(v, o, f) for v in ("act", "goal") for o, f in ((15.0, 1), (15.0, 2), (30.0, 1), (30.0, 2))]:
            cmd_hz = obs_hz * factor
            ep = timing_episode(node, pubs, out, obs_hz, cmd_hz, seconds, record if via == "goal" else None)
            episode = read_episode(ep["bag"])
            timing = episode_timing(episode)
            _, steps = observations_from_bag(episode, timing=timing)
            recorded = ep["n"] / cmd_hz
            exported = len(steps) / timing.fps
            receipts = [t for t, _ in episode.commands][:ep["n"]]
            old_fps = round(control_rate_hz(receipts))
            lag = json.loads(custom_data(ep["bag"]).get(STAMP_LAG_KEY, "{}"))

            def fmt(topic):
                e = lag.get(topic) or {}
                return f"{e.get('lag_ms_p50', float('nan')):.1f}/{e.get('lag_ms_p99', float('nan')):.1f}/" \
                       f"{e.get('lag_ms_max', float('nan')):.1f}"

            origins = episode.start.get("stream_rate_sources") or {}
            print(f"  {via:>6} {obs_hz:6.0f} {cmd_hz:6.0f} {len(steps):6d} {recorded:10.3f} {exported:10.3f} "
                  f"{(exported - recorded) * cmd_hz:+10.2f} | {old_fps:11d} {ep['n'] / max(old_fps, 1):10.3f} | "
                  f"{timing.streams['/joint_commands'].time_source}, {origins.get('/joint_commands')}/"
                  f"{origins.get('/joint_states')} | {fmt('/joint_states')}; {fmt(f'/camera/{VIEWS[0]}/image_raw/compressed')}"
                  + (f"  warnings: {timing.warnings}" if timing.warnings else ""))
    finally:
        ex.shutdown()
        spinner.join(timeout=10)
        node.destroy_node()
        rclpy.shutdown()
        rec.send_signal(2)
        try:
            rec.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rec.kill()
        import shutil
        shutil.rmtree(out, ignore_errors=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=None, help="length of each phase (s; default 20, --timing 3)")
    ap.add_argument("--rate", type=float, default=15.0, help="camera/joint/command rate (Hz)")
    ap.add_argument("--timing", action="store_true", help="stamp error and exported vs recorded duration")
    args = ap.parse_args()
    if args.timing:
        return timing_main(args.seconds or 3.0)
    args.seconds = args.seconds or 20.0
    out = Path(tempfile.mkdtemp(prefix="bench-recorder-"))
    rec = subprocess.Popen([sys.executable, "-m", "sequence_ai_ros.recorder_node", "--ros-args",
                            "-p", f"output_dir:={out}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rclpy.init()
    node = rclpy.create_node("bench_robot")
    ex = MultiThreadedExecutor(num_threads=2)
    ex.add_node(node)
    spin = threading.Thread(target=ex.spin, daemon=True)
    spin.start()
    try:
        client = ActionClient(node, RecordEpisode, "episode_recorder/record_episode")
        assert client.wait_for_server(timeout_sec=60), "recorder did not come up"
        robot = Robot(node, args.rate)
        time.sleep(3.0)  # discovery and warm-up
        robot.take_periods()
        c0 = cpu_s(rec.pid)
        time.sleep(args.seconds)
        idle_cpu = (cpu_s(rec.pid) - c0) / args.seconds * 100
        idle_jit = jitter_ms(robot.take_periods(), robot.period)

        fut = client.send_goal_async(RecordEpisode.Goal(task="bench", max_seconds=0.0))
        while not fut.done():
            time.sleep(0.01)
        handle = fut.result()
        c0 = cpu_s(rec.pid)
        time.sleep(args.seconds)
        rec_cpu = (cpu_s(rec.pid) - c0) / args.seconds * 100
        rec_jit = jitter_ms(robot.take_periods(), robot.period)
        cf = handle.cancel_goal_async()
        while not cf.done():
            time.sleep(0.01)
        rf = handle.get_result_async()
        while not rf.done():
            time.sleep(0.01)
        res = rf.result().result
        robot.stop.set()
        robot.thread.join()
        expected = int(args.seconds * args.rate) * (len(VIEWS) + 2)
        print(f"recorder at {len(VIEWS)} cameras x {args.rate:.0f} Hz (224x224 rgb8 -> JPEG) + joints + commands, "
              f"{args.seconds:.0f} s per phase, {os.cpu_count()} cores")
        print(f"  cpu idle (subscribed)    {idle_cpu:6.1f} % of one core")
        print(f"  cpu recording            {rec_cpu:6.1f} % of one core   (ratio recording/idle {rec_cpu / max(idle_cpu, 0.1):.1f}x)")
        print(f"  messages written         {res.messages} (~{expected} published while recording)")
        print(f"  messages dropped         {res.dropped}")
        print(f"  bag                      {res.bytes / 1e6:.1f} MB, {res.bytes / 1e6 / res.seconds:.2f} MB/s")
        print(f"  publisher jitter idle    median {idle_jit[0]:.2f} ms, p99 {idle_jit[1]:.2f} ms")
        print(f"  publisher jitter rec.    median {rec_jit[0]:.2f} ms, p99 {rec_jit[1]:.2f} ms")
        pre = preroll_ages_ms(Path(res.bag_path))
        print(f"  pre-roll at start        {len(pre)} messages ({', '.join(f'{t} {a:.0f} ms' for t, a in pre.items())})")
    finally:
        ex.shutdown()
        spin.join(timeout=10)
        node.destroy_node()
        rclpy.shutdown()
        rec.send_signal(2)
        try:
            rec.wait(timeout=15)
        except subprocess.TimeoutExpired:
            rec.kill()
        import shutil
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
