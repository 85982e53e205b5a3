"""Recorder cost at 2 cameras x 15 Hz: CPU of the recorder process and dropped messages.

    . scripts/env.sh && scripts/in_loopback_ns.sh python bench/bench_recorder.py [--seconds 20] [--rate 15]

A publisher in this process plays a robot: two 224x224 rgb8 camera streams (a moving scene, so
JPEG sizes are realistic), joint states and joint commands, all at ``--rate`` Hz. The recorder
(``episode_recorder``) runs as its own process, as on a robot. Two phases of ``--seconds``
each, in one run: idle (subscribed, not recording) and recording (a RecordEpisode goal).
Printed: recorder CPU (% of one core, from /proc utime+stime) idle vs recording and their ratio,
messages written, messages dropped, bag MB/s, the publisher's period jitter (median and
p99 |period - 1/rate|, ms) in each phase (recording must not disturb the loop that publishes),
and the pre-roll the bag starts with (the latest sample of each sensor stream from before the
episode started, and how old it was then, ms).
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase (s)")
    ap.add_argument("--rate", type=float, default=15.0, help="camera/joint/command rate (Hz)")
    args = ap.parse_args()
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
