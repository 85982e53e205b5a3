"""Real times in bags and datasets: a real ``episode_recorder`` process records
streams published here with known header stamps -- on time, or by a loaded publisher that wakes
every 0.3 s and sends its backlog at once -- and ``sequence-ai bag export`` turns the bags into
LeRobot datasets whose fps is the declared control rate and whose duration is the recording's.

Real pieces: rclpy publishers in this process, the recorder as its own process (``python -m
sequence_ai_ros.recorder_node``, auto_record on the driver-marker topic, which this test publishes),
real bag files and the real export CLI. Plus: header stamps read from raw CDR equal rclpy's.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import rclpy
from builtin_interfaces.msg import Time
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from _wait import eventually
from sequence_ai.cli import main as sequence_ai_main
from sequence_ai_data.episode import StreamRateError
from sequence_ai_ros.bag.frames import episode_timing, frames_from_bag, observations_from_bag
from sequence_ai_ros.bag.reader import custom_data, read_episode
from sequence_ai_ros.bag.stamps import STAMP_LAG_KEY, TIME_SOURCES_KEY, debunch, header_stamp_ns

JOINTS = ["j1", "j2"]
VIEW = "cam"


def _jpeg() -> bytes:
    import simplejpeg

    return simplejpeg.encode_jpeg(np.full((16, 16, 3), 128, np.uint8), quality=90, colorspace="RGB")


def _stamp(ns: int) -> Time:
    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


# -- CDR stamps --------------------------------------------------------------------------------
@pytest.mark.parametrize("ns", [1, 999_999_999, 1_700_000_000_123_456_789, 2**31 * 1_000_000_000 - 1])
def test_header_stamp_from_raw_cdr_equals_rclpy(ns):
    msgs = [JointState(name=["a"], position=[1.0]), CompressedImage(format="jpeg", data=b"\xff\xd8"),
            Image(height=1, width=1, encoding="rgb8", step=3, data=b"abc"), JointTrajectory(joint_names=["a"])]
    for msg in msgs:
        msg.header.stamp = _stamp(ns)
        msg.header.frame_id = "some_frame"
        raw = serialize_message(msg)
        back = deserialize_message(raw, type(msg)).header.stamp
        assert header_stamp_ns(raw) == back.sec * 1_000_000_000 + back.nanosec == ns, type(msg)
    unstamped = serialize_message(JointState(name=["a"]))
    assert header_stamp_ns(unstamped) is None                      # zero: unstamped, not the epoch
    big_endian = b"\x00\x00\x00\x00" + struct.pack(">iI", 12, 34) + b"\x00" * 8
    assert header_stamp_ns(big_endian) == 12_000_000_034
    assert header_stamp_ns(b"\x00\x01\x00\x00\x01") is None        # too short


def test_debunch_spreads_a_bunch_back_over_its_periods_and_keeps_a_real_pause():
    p = 33_333_333
    recv = [0, p, 2 * p, 10 * p + 1, 10 * p + 2, 10 * p + 3, 20 * p]  # a bunch at 10p; a pause before 20p
    assert debunch(recv, p) == [0, p, 2 * p, 8 * p + 3, 9 * p + 3, 10 * p + 3, 20 * p]


# -- a real recorder process ---------------------------------------------------------------------
class Rig:
    """The recorder process, and this process's publishers of its topics."""

    def __init__(self, tmp: Path):
        self.out = tmp / "bags"
        self.log = tmp / "recorder.log"
        self.ctx = rclpy.context.Context()
        rclpy.init(context=self.ctx)
        self.node = rclpy.create_node("stamp_test_publisher", context=self.ctx)
        self.marker_pub = self.node.create_publisher(String, "policy_driver/episode", 10)
        self.image_pub = self.node.create_publisher(CompressedImage, f"camera/{VIEW}/image", 100)
        self.joint_pub = self.node.create_publisher(JointState, "joint_states", 100)
        self.command_pub = self.node.create_publisher(Float64MultiArray, "joint_commands", 200)
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sequence_ai_ros.recorder_node", "--ros-args",
                 "-r", "__node:=stamp_recorder", "-p", "auto_record:=true", "-p", f"output_dir:={self.out}",
                 "-p", f"camera_views:=[{VIEW}]", "-p", f"camera_topics:=[camera/{VIEW}/image]",
                 "-p", "camera_transports:=[compressed]", "-p", "queue_size:=4096", "-p", "chunk_s:=0.2"],
                stdout=f, stderr=subprocess.STDOUT)
        self.jpeg = _jpeg()
        deadline = time.monotonic() + 60
        pubs = (self.marker_pub, self.image_pub, self.joint_pub, self.command_pub)
        while not all(p.get_subscription_count() >= 1 for p in pubs):
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, f"the recorder did not subscribe within 60 s: {self.log.read_text()[-2000:]}"
            time.sleep(0.05)

    def start_marker(self, control_hz, rates=None, max_age_s=1.0) -> dict:
        return {"event": "start", "source": "act", "task": "stamps", "t_ns": time.time_ns(),
                "control_frequency_hz": control_hz, "stream_rates_hz": rates or {},
                "views": [VIEW], "camera_topics": [f"/camera/{VIEW}/image"], "camera_transports": ["compressed"],
                "camera_time_bases": ["header"], "camera_alignments": ["latest"],
                "joint_state_topic": "/joint_states", "joint_state_type": "sensor_msgs/msg/JointState",
                "joint_state_time_base": "header", "joint_state_alignment": "latest", "joint_names": JOINTS,
                "gripper_joint": None, "max_sensor_age_s": max_age_s, "command_mode": "joint_commands",
                "command_topic": "/joint_commands", "command_type": "float64_multi_array"}

    def _sensors(self, hz: float, t0_ns: int, stop: threading.Event, sent: list, burst_s: float):
        """Camera + joint state on a drift-free ``hz`` grid from ``t0_ns``, stamped at their grid
        times; with ``burst_s`` the publisher wakes only every ``burst_s`` s and sends what is due."""
        k = 0
        period = 1e9 / hz
        while not stop.is_set():
            due = int(t0_ns + k * period)
            wake = due if not burst_s else t0_ns + (int((due - t0_ns) // (burst_s * 1e9)) + 1) * burst_s * 1e9
            wait = (wake - time.time_ns()) * 1e-9
            if wait > 0 and stop.wait(wait):
                return
            js = JointState(name=JOINTS, position=[float(k), 0.0])
            js.header.stamp = _stamp(due)
            img = CompressedImage(format="rgb8; jpeg compressed rgb8", data=self.jpeg)
            img.header.stamp = _stamp(due)
            self.image_pub.publish(img)
            self.joint_pub.publish(js)
            sent.append(due)
            k += 1

    def record(self, *, control_hz=30.0, command_hz=None, obs_hz=30.0, n=90, burst_s=0.0, rates=None) -> tuple:
        """One episode: sensors from 0.5 s before its start marker, ``n`` commands at ``command_hz``
        (default the declared ``control_hz``) on a grid, then the end marker; returns
        (bag, command due times ns, sensor stamps ns)."""
        command_hz = command_hz or control_hz
        before = set(self.out.iterdir()) if self.out.exists() else set()
        stop, sensor_sent = threading.Event(), []
        t0 = time.time_ns()
        th = threading.Thread(target=self._sensors, args=(obs_hz, t0, stop, sensor_sent, burst_s), daemon=True)
        th.start()
        try:
            self._wait(lambda: "every sensor stream has delivered" in self.log.read_text(errors="replace")
                       and len(sensor_sent) >= 0.5 * obs_hz, 60, "the recorder's first sensor messages")
            self.marker_pub.publish(String(data=json.dumps(self.start_marker(control_hz, rates))))
            self._wait(lambda: self._new_bags(before), 30, "the recorder to open a bag")
            c0, period, due_times = time.time_ns(), 1e9 / command_hz, []
            for k in range(n):
                due = int(c0 + k * period)
                wake = due if not burst_s else c0 + (int((due - c0) // (burst_s * 1e9)) + 1) * burst_s * 1e9
                wait = (wake - time.time_ns()) * 1e-9
                if wait > 0:
                    time.sleep(wait)   # the publisher's own schedule, not a wait for the test
                self.command_pub.publish(Float64MultiArray(data=[float(k), 0.5]))
                due_times.append(due)
            # the end marker may overtake commands still queued in the recorder: end once the bag on
            # disk holds every command (the sensors keep flowing, so its chunks keep closing)
            bag = self._new_bags(before)[0]
            self._wait(lambda: _commands_on_disk(bag) >= n, 60, f"{n} commands in the bag")
        finally:
            stop.set()
            th.join(timeout=10)
        self.marker_pub.publish(String(data=json.dumps({"event": "end", "source": "act", "t_ns": time.time_ns(),
                                                        "outcome": {"reason": "until", "actions": n},
                                                        "label": {"success": True}})))
        bag = self._wait(lambda: next((b for b in self._new_bags(before) if (b / "metadata.yaml").exists()), None),
                         60, "the recorder to close the bag")
        return bag, due_times, list(sensor_sent)

    def _new_bags(self, before):
        return [p for p in self.out.iterdir() if p.is_dir() and p not in before] if self.out.exists() else []

    def _wait(self, cond, timeout_s, what):
        """``cond()`` once truthy, giving up at once if the recorder has exited."""
        def met():
            got = cond()
            assert got or self.proc.poll() is None, f"recorder exited: {self.log.read_text(errors='replace')[-2000:]}"
            return got

        return eventually(met, timeout_s, what=what, detail=lambda: f"log: {self.log.read_text(errors='replace')[-2000:]}")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.node.destroy_node()
        rclpy.shutdown(context=self.ctx)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = Rig(tmp_path_factory.mktemp("stamps"))
    try:
        yield r
    finally:
        r.close()


def _commands_on_disk(bag: Path) -> int:
    """Commands in the closed chunks of the open bag ``bag`` (0 before it has any)."""
    from sequence_ai_ros.bag.reader import BagReadError, iter_raw

    if not list(bag.glob("*.mcap")):
        return 0
    try:
        return sum(1 for m in iter_raw(bag) if m.topic == "/joint_commands")
    except BagReadError:   # not even its header on disk yet
        return 0


def _export(bag: Path, out: Path, *extra) -> int:
    return sequence_ai_main(["bag", "export", str(bag), "--out", str(out), *map(str, extra)])


def _dataset(out: Path) -> tuple:
    info = json.loads((out / "meta" / "info.json").read_text())
    table = pq.read_table(out / "data" / "chunk-000" / "file-000.parquet")
    return info, table


def _check_alignment(bag: Path, steps) -> set:
    """Every frame's joint state is the latest one stamped at or before its step time; returns the
    stamps used."""
    rec = read_episode(bag)
    stamps = sorted(m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec for _, m in rec.joints)
    used = set()
    for t_ns, obs, _ in steps:
        latest = max(s for s in stamps if s <= t_ns)
        k = [m for _, m in rec.joints if m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec == latest][0]
        assert obs.proprioception.joint_positions == list(k.position), (t_ns, latest)
        used.add(latest)
    return used


@pytest.mark.parametrize("hz", [30, 15])
def test_a_bursty_stream_exports_with_its_declared_fps_and_its_real_duration(rig, tmp_path, hz):
    """The publisher wakes every 0.3 s and sends its backlog: the recorder receives bunches (the
    receipt times a loaded recorder gets), yet the dataset is at the declared rate and lasts what was recorded."""
    n = 3 * hz
    bag, due, _ = rig.record(control_hz=float(hz), obs_hz=float(hz), n=n, burst_s=0.3)
    rec = read_episode(bag)
    recv = [t for t, _ in rec.commands]
    assert [c[0] for _, c in rec.commands] == list(map(float, range(n)))
    # receipts came in bunches: measured from them (what the export did before), fps would be far off
    assert np.median(np.diff(recv)) < 0.5e9 / hz, np.diff(recv)[:20]
    # the bag says which topic is timed how, and the recorder's stamp error
    sources = json.loads(custom_data(bag)[TIME_SOURCES_KEY])
    assert sources["/joint_commands"] == "source" and sources["/joint_states"] == "header"
    # each command's DDS source timestamp: sent at or after its due time, before it was received
    assert all(d <= s <= r for d, s, r in zip(due, rec.command_sources, recv)), "source timestamps"
    # every stream's rate is declared: the commands' from the marker, the sensors' measured before the episode
    rates, origins = rec.start["stream_rates_hz"], rec.start["stream_rate_sources"]
    assert rates["/joint_commands"] == hz and origins["/joint_commands"] == "contract"
    for topic in ("/joint_states", f"/camera/{VIEW}/image"):
        assert origins[topic] == "measured" and rates[topic] == pytest.approx(hz, rel=0.05), (topic, rates)
        assert rec.end["measured_rates_hz"][topic] == pytest.approx(hz, rel=0.05)
    assert sources[f"/camera/{VIEW}/image"] == "header" and sources["/sequence_ai/episode"] == "receive"
    lag = json.loads(custom_data(bag)[STAMP_LAG_KEY])["/joint_states"]
    assert lag["unstamped"] == 0 and lag["lag_ms_p50"] >= 0
    out = tmp_path / "ds"
    assert _export(bag, out) == 0
    info, table = _dataset(out)
    assert info["fps"] == hz and info["total_frames"] == n
    ts = np.asarray(table.column("timestamp").to_pylist())
    assert ts == pytest.approx(np.arange(n) / hz, abs=1e-5)
    recorded_s = (due[-1] - due[0]) * 1e-9 + 1.0 / hz
    assert abs(n / info["fps"] - recorded_s) < 1.0 / hz                 # within one period
    assert np.array_equal(np.asarray(table.column("action").to_pylist())[:, 0], np.arange(n))
    timing = episode_timing(rec)
    assert timing.streams["/joint_states"].time_source == "header"
    assert timing.streams["/joint_states"].median_hz == pytest.approx(hz, rel=0.02)
    assert timing.streams["/joint_commands"].verdict == "ok"
    _check_alignment(bag, observations_from_bag(rec, timing=timing)[1])


def test_commands_at_twice_the_observation_rate_export_one_frame_per_command(rig, tmp_path):
    """lerobot PR #4423's case: 30 Hz commands over 15 Hz observations (the bursty publisher too)."""
    n = 90
    bag, due, _ = rig.record(control_hz=30.0, obs_hz=15.0, n=n, burst_s=0.3)
    out = tmp_path / "ds2x"
    assert _export(bag, out) == 0
    info, table = _dataset(out)
    assert info["fps"] == 30 and info["total_frames"] == n
    assert abs(n / 30 - ((due[-1] - due[0]) * 1e-9 + 1 / 30)) < 1 / 30
    assert np.array_equal(np.asarray(table.column("action").to_pylist())[:, 0], np.arange(n))
    rec = read_episode(bag)
    used = _check_alignment(bag, observations_from_bag(rec)[1])
    # each observation serves about two commands: 3 s of 15 Hz joint states
    # (a best-effort subscription of depth 5 may drop some of a burst: fewer, never more)
    assert 0.25 * n <= len(used) <= 0.5 * n + 2, len(used)
    state = np.asarray(table.column("observation.state").to_pylist())[:, 0]
    assert np.all(np.diff(state) >= 0)                                 # sensor time never runs back


def test_a_stream_whose_stamps_disagree_with_its_declared_rate_is_named_and_nothing_is_written(rig, tmp_path, capsys):
    bag, _, _ = rig.record(control_hz=30.0, obs_hz=20.0, n=60, rates={"/joint_states": 30.0})
    with pytest.raises(StreamRateError) as err:
        frames_from_bag(bag)
    assert err.value.stream == "/joint_states" and err.value.declared_hz == 30.0
    assert err.value.measured_hz == pytest.approx(20.0, rel=0.05) and err.value.time_source == "header"
    out = tmp_path / "refused"
    assert _export(bag, out) == 1
    msg = capsys.readouterr().err
    assert "/joint_states" in msg and "30 Hz" in msg and "--fps" in msg
    assert not out.exists()
    # --fps resamples on sensor time instead: 2 s of commands -> 2 s at 10 fps
    assert _export(bag, tmp_path / "resampled", "--fps", "10") == 0
    info, _ = _dataset(tmp_path / "resampled")
    assert info["fps"] == 10 and abs(info["total_frames"] / 10 - 2.0) <= 0.1


def test_headerless_commands_off_their_declared_rate_are_refused_by_name_from_their_source_times(rig, tmp_path, capsys):
    """Float64MultiArray commands have no header, but their DDS source timestamps say when they
    were sent: 20 Hz commands under a declared 30 Hz are refused, naming the stream."""
    bag, _, _ = rig.record(control_hz=30.0, command_hz=20.0, obs_hz=30.0, n=40)
    with pytest.raises(StreamRateError) as err:
        frames_from_bag(bag)
    assert err.value.stream == "/joint_commands" and err.value.time_source == "source"
    assert err.value.measured_hz == pytest.approx(20.0, rel=0.1)
    out = tmp_path / "refused"
    assert _export(bag, out) == 1 and not out.exists()
    msg = capsys.readouterr().err
    assert "/joint_commands" in msg and "30 Hz" in msg and "source timestamps" in msg
    # --fps says to export anyway: one frame per command, the mismatch a warning naming the stream
    assert _export(bag, tmp_path / "forced", "--fps", "30") == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "/joint_commands" in err
    info, _ = _dataset(tmp_path / "forced")
    assert info["fps"] == 30 and info["total_frames"] == 40
