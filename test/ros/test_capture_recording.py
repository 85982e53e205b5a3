"""Capture, for real: the demo's stack drives the sim while episode_recorder writes bags, which
are then exported to LeRobot v3.0 and v2.1 datasets and checked against what was sent.

Real processes: ``seq serve`` + the demo policy's worker, ``sim_robot`` (MuJoCo), and for the
SIGKILL test a recorder process of its own; in this process: ``policy_driver``,
``episode_recorder`` and an action client, sharing one rclpy context.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import Image, JointState

from _wait import eventually
from sequence_ai.cli import main as sequence_ai_main
from sequence_ai_msgs.action import Act, RecordEpisode
from sequence_ai_msgs.srv import CheckSuccess, LabelEpisode, ResetScene
from sequence_ai_ros import demo
from sequence_ai_ros._spin import destroy_node, spin
from sequence_ai_ros.bag.frames import episode_timing, observations_from_bag
from sequence_ai_ros.bag.events import assembly_settings
from sequence_ai_ros.bag.reader import BagReadError, custom_data, iter_raw, read_episode
from sequence_ai_ros.bag.writer import bag_size
from sequence_ai_ros.driver_node import PolicyDriver
from sequence_ai_ros.recorder_node import EpisodeRecorder

INSTRUCTION = "put the red cube on the green pad"
FPS = 15


def _stamp_ns(msg) -> int:
    return msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec


def _wait(future, timeout_s, what="the call"):
    eventually(future.done, timeout_s, 0.01, what=f"an answer to {what}")
    return future.result()


class Cell:
    """sim_robot + driver + recorder + client in one rclpy context; run Act goals, keep what was sent."""

    def __init__(self, out: Path):
        self.out = out
        self.ctx = rclpy.context.Context()
        rclpy.init(args=["--ros-args", "--params-file", str(demo.CONFIG_FILE)], context=self.ctx)
        self.driver = PolicyDriver(context=self.ctx)
        self.recorder = EpisodeRecorder(context=self.ctx, parameter_overrides=[
            Parameter("auto_record", value=True), Parameter("output_dir", value=str(out / "bags"))])
        self.client = rclpy.create_node("capture_test_client", context=self.ctx)
        self.executor = MultiThreadedExecutor(num_threads=6, context=self.ctx)
        for n in (self.driver, self.recorder, self.client):
            self.executor.add_node(n)
        # _spin.spin rides out an entity destroyed while the wait set is built (a test's own
        # recorder removed and destroyed mid-spin): executor.spin() died of it, and every later
        # service reply and result of the module's cell was never taken (a reset timed out at 30 s)
        self.spin = threading.Thread(target=spin, args=(self.executor,), daemon=True)
        self.spin.start()
        self.act = ActionClient(self.client, Act, "policy_driver/act")
        self.record = ActionClient(self.client, RecordEpisode, "episode_recorder/record_episode")
        self.check = self.client.create_client(CheckSuccess, "sim_robot/check_success")
        self.label = self.client.create_client(LabelEpisode, "episode_recorder/label_episode")
        assert self.act.wait_for_server(timeout_sec=30.0)
        assert self.check.wait_for_service(timeout_sec=120.0), "sim_robot did not come up"
        assert self.driver.goals.wait_for_sensors(), "no sensor data from sim_robot"
        # what the recorder's own callbacks received, by stream, with each message's header stamp:
        # the oracle of what the export must put in each frame (the sample in force by sensor time)
        self.received = {}    # view or "joints" -> [(header stamp ns, message)]
        self.seen = {}        # stream (view, "joints", "command") -> receipt times (ns) the recorder saw
        self.recorder.taps.append(self._tap)

    def _tap(self, kind, key, raw, t_ns):
        self.seen.setdefault(key or kind, []).append(t_ns)
        if kind in ("image", "joints"):
            msg = deserialize_message(raw, Image if kind == "image" else JointState)
            self.received.setdefault(key or kind, []).append((_stamp_ns(msg), msg))

    def wait_streams(self, timeout_s=30.0):
        """Until the recorder's callbacks have seen every camera view and the joint states (its
        subscriptions match late on a loaded machine; a command before then has no live observation)."""
        want = set(self.driver._params["camera_views"]) | {"joints"}
        deadline = time.monotonic() + timeout_s
        while not want <= set(self.seen):
            assert time.monotonic() < deadline, f"the recorder saw only {sorted(self.seen)} of {sorted(want)}"
            time.sleep(0.05)

    def run(self, instruction, max_seconds=45.0, cancel_after_s=None, during=None):
        self.recorder.last_bag = None
        handle = _wait(self.act.send_goal_async(Act.Goal(instruction=instruction, max_seconds=max_seconds)), 30, "the Act goal")
        assert handle.accepted
        res = handle.get_result_async()
        if cancel_after_s is not None:
            time.sleep(cancel_after_s)
            if during is not None:
                during()
            _wait(handle.cancel_goal_async(), 10, "the Act cancel")
        result = _wait(res, max_seconds + 60, "the Act result").result
        verdict = _wait(self.check.call_async(CheckSuccess.Request(instruction=instruction)), 30, "check_success")
        return result, verdict

    def wait_bag(self, timeout_s=20.0) -> Path:
        deadline = time.monotonic() + timeout_s
        while self.recorder.last_bag is None:
            assert time.monotonic() < deadline, "the recorder did not close a bag"
            time.sleep(0.05)
        return self.recorder.last_bag

    def close(self):
        self.driver.policy.interrupt()
        self.executor.shutdown(timeout_sec=5.0)
        self.spin.join(timeout=10)
        for n in (self.client, self.recorder, self.driver):
            destroy_node(n)
        rclpy.shutdown(context=self.ctx)


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    out = tmp_path_factory.mktemp("capture")
    old = dict(os.environ)
    with demo.local_server(out / "server") as server:
        demo.deploy(server)
        os.environ.update(server.env())
        try:
            with demo.sim_robot(0, out / "sim_robot.log"):
                c = Cell(out)
                try:
                    yield c
                finally:
                    c.close()
        finally:
            os.environ.clear()
            os.environ.update(old)


@pytest.fixture(scope="module")
def recorded(cell):
    """One real demo run recorded around its Act goal: (bag, Act result, success verdict, commands sent)."""
    cell.wait_streams()
    result, verdict = cell.run(INSTRUCTION)
    bag = cell.wait_bag()
    sent = [values for _, values in cell.driver.trace.commands]
    return bag, result, verdict, sent


def _export(args) -> int:
    return sequence_ai_main(["bag", "export", *map(str, args)])


def test_an_act_goal_is_recorded_as_one_bag_with_its_markers_streams_and_label(recorded, cell):
    bag, result, verdict, sent = recorded
    assert result.reason == "until" and verdict.success, (result.reason, verdict.distance_m)
    assert (bag / "metadata.yaml").exists() and len(list(bag.glob("*.mcap"))) == 1
    rec = read_episode(bag)
    assert rec.start["task"] == INSTRUCTION and rec.start["source"] == "act"
    assert rec.end["outcome"]["actions"] == result.actions == len(sent)
    assert rec.end["outcome"]["reason"] == "until"
    assert rec.success is True and rec.end["dropped"] == 0
    assert rec.instructions[0][1] == INSTRUCTION
    # every command the driver published is in the bag, in order; the hold (a repeat of the last) follows
    assert [c for _, c in rec.commands[:len(sent)]] == sent          # float64 through CDR: exact
    assert len(rec.commands) in (len(sent), len(sent) + 1)
    # pre-roll: every sensor stream has a sample logged at or before the first command
    first_command = rec.commands[0][0]
    assert rec.joints[0][0] <= first_command
    assert all(rec.images[v][0][0] <= first_command for v in ("exterior_1", "wrist_left"))
    # every camera frame and joint state the recorder received over the episode is in the bag, at its
    # receipt time, JPEG-compressed (how many the sim managed to publish depends on the machine's load)
    for stream, msgs in [("exterior_1", rec.images["exterior_1"]), ("wrist_left", rec.images["wrist_left"]),
                         ("joints", rec.joints)]:
        times = [t for t, _ in msgs]   # the first is the pre-roll, which may predate the test's tap
        assert times[1:] == [t for t in cell.seen[stream] if times[0] < t <= times[-1]], stream
        assert len(times) >= 0.5 * result.seconds * FPS, (stream, len(times), result.seconds)
    frame = rec.images["exterior_1"][0][1]
    assert frame.format.endswith("jpeg compressed rgb8") and bytes(frame.data[:2]) == b"\xff\xd8"
    assert cell.recorder.writer.stats.dropped == 0
    # what it was recorded under travels with it: the contract, the policy, every stream's rate, the seams
    contract = cell.driver.policy.contract
    assert rec.start["contract"] == json.loads(json.dumps(contract)) and rec.start["contract"]["action"]
    assert rec.start["policy"]["model"] == cell.driver._params["model"] and isinstance(rec.start["policy"]["version"], int)
    rates, origins = rec.start["stream_rates_hz"], rec.start["stream_rate_sources"]
    assert rates["/joint_commands"] == FPS and origins["/joint_commands"] == "contract"
    streams = {"/joint_commands", "/joint_states", *(f"/camera/{v}/image_raw/compressed" for v in ("exterior_1", "wrist_left"))}
    assert set(rates) <= streams and origins["/joint_commands"] == "contract"
    # the sensors' rates, measured before the episode (unless the sim stalled then) and over it
    assert set(origins.values()) <= {"contract", "measured"}, origins
    assert set(rates) | set(rec.end["measured_rates_hz"]) == streams, (rates, rec.end["measured_rates_hz"])
    assert rec.end["seams"]["chunks"] == result.chunks and rec.end["seams"]["seams"] == result.seams
    custom = custom_data(bag)
    assert json.loads(custom["sequence_ai.contract"]) == rec.start["contract"]
    assert json.loads(custom["sequence_ai.seams"]) == rec.end["seams"]
    assert json.loads(custom["sequence_ai.stream_rates"])["/joint_commands"]["origin"] == "contract"
    # every command was recorded with its DDS source timestamp, sent before it was received
    assert rec.time_sources["/joint_commands"] == "source"
    assert all(s <= t for s, (t, _) in zip(rec.command_sources, rec.commands))


def _check_dataset(root: Path, version: str, result, sent):
    info = json.loads((root / "meta" / "info.json").read_text())
    # one frame per command sent: the recorder's pre-roll gives the first command its observation
    n = info["total_frames"]
    assert n == result.actions == len(sent)
    assert info["codebase_version"] == f"v{version}"
    assert info["fps"] == FPS and info["total_episodes"] == 1 and info["total_tasks"] == 1
    feats = info["features"]
    for view in ("exterior_1", "wrist_left"):
        assert feats[f"observation.images.{view}"]["dtype"] == "video"
        assert feats[f"observation.images.{view}"]["shape"] == [224, 224, 3]
    assert feats["observation.state"]["shape"] == [8] and feats["action"]["shape"] == [8]
    assert feats["observation.state"]["names"][-1] == "panda_gripper"
    meta = info["sequence_ai"]   # the contract it was recorded under
    assert meta["action_contract"]["control_frequency_hz"] == FPS and meta["observation_contract"]
    assert isinstance(meta["policy"]["version"], int) and meta["seams"]["chunks"] == result.chunks
    assert meta["stream_rates"]["/joint_commands"] == {"hz": FPS, "origin": "contract",
                                                       "measured_hz": pytest.approx(FPS, rel=0.1)}
    if version == "2.1":   # exported with --gr00t-modality
        modality = json.loads((root / "meta" / "modality.json").read_text())
        assert modality["state"] == {"single_arm": {"start": 0, "end": 7, "original_key": "observation.state"},
                                     "gripper": {"start": 7, "end": 8, "original_key": "observation.state"}}
        assert modality["action"]["gripper"] == {"start": 7, "end": 8, "original_key": "action"}
        assert set(modality["video"]) == {"exterior_1", "wrist_left"}
    data_file = root / (info["data_path"].format(chunk_index=0, file_index=0) if version == "3.0"
                        else info["data_path"].format(episode_chunk=0, episode_index=0))
    table = pq.read_table(data_file)
    assert table.num_rows == n
    ts = np.asarray(table.column("timestamp").to_pylist())
    assert ts == pytest.approx(np.arange(n) / FPS, abs=1e-5)
    assert table.column("frame_index").to_pylist() == list(range(n))
    assert table.column("index").to_pylist() == list(range(n))
    assert set(table.column("episode_index").to_pylist()) == {0}
    assert set(table.column("task_index").to_pylist()) == {0}
    action = np.asarray(table.column("action").to_pylist())
    assert action.shape == (n, 8)
    sent32 = np.asarray(sent, dtype=np.float32)
    assert np.array_equal(action.astype(np.float32), sent32)                 # commands -> action, in order
    state = np.asarray(table.column("observation.state").to_pylist())
    assert state.shape == (n, 8) and np.isfinite(state).all()
    success = table.column("next.success").to_pylist()
    assert success[-1] is True and not any(success[:-1])                   # the label, on the last frame
    # tasks
    if version == "3.0":
        tasks = pq.read_table(root / "meta" / "tasks.parquet")
        assert tasks.column("task").to_pylist() == [INSTRUCTION]
        eps = pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
        assert eps[0]["length"] == n and eps[0]["tasks"] == [INSTRUCTION]
        assert eps[0]["dataset_from_index"] == 0 and eps[0]["dataset_to_index"] == n
        stats = json.loads((root / "meta" / "stats.json").read_text())
        assert stats["action"]["count"] == [n] and len(stats["action"]["mean"]) == 8
    else:
        tasks = [json.loads(x) for x in (root / "meta" / "tasks.jsonl").read_text().splitlines()]
        assert tasks == [{"task_index": 0, "task": INSTRUCTION}]
        eps = [json.loads(x) for x in (root / "meta" / "episodes.jsonl").read_text().splitlines()]
        assert eps == [{"episode_index": 0, "tasks": [INSTRUCTION], "length": n}]
        assert (root / "meta" / "episodes_stats.jsonl").exists()
    # videos: one frame per control step, 224x224, decodable with PyAV
    for view in ("exterior_1", "wrist_left"):
        key = f"observation.images.{view}"
        path = root / (info["video_path"].format(video_key=key, chunk_index=0, file_index=0) if version == "3.0"
                       else info["video_path"].format(episode_chunk=0, video_key=key, episode_index=0))
        with av.open(str(path)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == n and frames[0].shape == (224, 224, 3)
        assert float(np.mean(frames[n // 2])) > 10.0   # a picture, not black


@pytest.mark.parametrize("version", ["3.0", "2.1"])
def test_export_gives_one_frame_per_control_step_with_what_was_sent(recorded, tmp_path, version):
    bag, result, verdict, sent = recorded
    out = tmp_path / f"ds-{version}"
    args = [bag, "--out", out, "--robot-type", "panda"] + (["--version", version, "--gr00t-modality"]
                                                           if version != "3.0" else [])
    assert _export(args) == 0
    _check_dataset(out, version, result, sent)


def test_exported_observations_hold_the_samples_in_force_by_sensor_time(recorded, cell):
    """Each frame's observation holds, per stream, the latest sample the recorder received whose
    header stamp is at or before the frame's time: sensor time, however the recorder's receipts
    bunched. Frame times are the commands' DDS source timestamps (when the driver sent them)
    de-bunched at the declared 15 Hz."""
    from sequence_ai_ros.observation import stamp_to_s

    bag, result, _, _ = recorded
    rec = read_episode(bag)
    fps, steps = observations_from_bag(rec)
    assert fps == FPS and len(steps) == result.actions    # every command, the first included
    assert rec.start["control_frequency_hz"] == FPS       # declared by the driver (the contract's rate)
    receipts = [t for t, _ in rec.commands]
    names = cell.driver._params["joint_names"]
    for k, (t_ns, exported, _) in enumerate(steps):
        assert t_ns <= receipts[k]                        # published before it was received
        assert exported.instruction == INSTRUCTION
        for frame in exported.images:
            stamp, msg = max((m for m in cell.received[frame.view] if m[0] <= t_ns), key=lambda m: m[0])
            assert frame.timestamp_ms == int(stamp_to_s(msg.header.stamp) * 1000), (k, frame.view)
        stamp, js = max((m for m in cell.received["joints"] if m[0] <= t_ns), key=lambda m: m[0])
        assert exported.proprioception.joint_positions == [js.position[list(js.name).index(j)] for j in names], k
    import simplejpeg
    last = steps[-1][1].images[0]
    _, raw = max((m for m in cell.received[last.view] if m[0] <= steps[-1][0]), key=lambda m: m[0])
    exported_jpeg = last.data
    assert isinstance(exported_jpeg, bytes)                # raw JPEG, no base64 hop
    a = np.frombuffer(bytes(raw.data), np.uint8).reshape(raw.height, raw.width, 3)
    b = simplejpeg.decode_jpeg(exported_jpeg)
    assert np.abs(a.astype(int) - b.astype(int)).mean() < 3.0


def test_export_refuses_a_non_empty_dir_appends_on_request_and_never_leaves_half_a_dataset(recorded, tmp_path, capsys):
    bag = recorded[0]
    out = tmp_path / "ds"
    assert _export([bag, "--out", out]) == 0
    frames = json.loads((out / "meta" / "info.json").read_text())["total_frames"]
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert _export([bag, "--out", out]) == 1
    assert "not empty" in capsys.readouterr().err
    assert _export([bag, "--out", out, "--append"]) == 0
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 2 and info["total_frames"] == 2 * frames
    eps = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [e["dataset_from_index"] for e in eps] == [0, frames]
    # a failing export (the second bag is not a bag) leaves the dataset as it was and no temp dirs
    snapshot = sorted(p.relative_to(out) for p in out.rglob("*"))
    not_a_bag = tmp_path / "empty"
    not_a_bag.mkdir()
    assert _export([bag, not_a_bag, "--out", out, "--overwrite"]) == 1
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == snapshot
    assert json.loads((out / "meta" / "info.json").read_text())["total_episodes"] == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert _export([bag, not_a_bag, "--out", tmp_path / "fresh"]) == 1
    assert not (tmp_path / "fresh").exists()
    assert len(before) > 5


def test_record_episode_action_records_until_cancelled_and_returns_the_bag_path(cell):
    goal = RecordEpisode.Goal(task="watch the cell", max_seconds=0.0)
    handle = _wait(cell.record.send_goal_async(goal), 30)
    assert handle.accepted
    time.sleep(1.5)
    _wait(handle.cancel_goal_async(), 10)
    wrapped = _wait(handle.get_result_async(), 30)
    res = wrapped.result
    bag = Path(res.bag_path)
    assert bag.is_dir() and (bag / "metadata.yaml").exists()
    assert res.messages > 0 and res.dropped == 0 and res.bytes > 10_000 and res.seconds >= 1.5
    rec = read_episode(bag)
    assert rec.task == "watch the cell" and rec.start["source"] == "record_episode"
    assert len(rec.images["exterior_1"]) >= 10 and rec.commands == []
    assert rec.end["outcome"]["reason"] == "canceled"
    # no rate was configured: the recorder declares the sensors' rates it measured, and says so (in the
    # start marker from the messages before the episode, when there were enough; over it in the end marker)
    origins = rec.start["stream_rate_sources"]
    assert set(origins.values()) <= {"measured"} and "/joint_commands" not in origins, origins
    sensors = {"/camera/exterior_1/image_raw/compressed", "/camera/wrist_left/image_raw/compressed", "/joint_states"}
    assert sensors <= set(origins) | set(rec.end["measured_rates_hz"]), (origins, rec.end["measured_rates_hz"])
    assert all(hz == pytest.approx(FPS, rel=0.2) for hz in rec.end["measured_rates_hz"].values()), rec.end
    # a goal whose rate is not a rate is refused
    bad = _wait(cell.record.send_goal_async(RecordEpisode.Goal(task="x", control_frequency_hz=float("nan"))), 30)
    assert not bad.accepted
    # empty task is refused
    refused = _wait(cell.record.send_goal_async(RecordEpisode.Goal(task="  ")), 30)
    assert not refused.accepted


def _commands_on_disk(out: Path) -> int:
    """Commands in the closed chunks of the bag being written in ``out`` (0 before it has any)."""
    bags = [p for p in out.iterdir() if p.is_dir()] if out.exists() else []
    if not bags or not list(bags[0].glob("*.mcap")):
        return 0
    try:
        return sum(1 for m in iter_raw(bags[0]) if m.topic == "/joint_commands")
    except BagReadError:   # not even its header on disk yet
        return 0


def test_sigkill_during_recording_leaves_a_bag_that_exports_all_but_its_last_chunk(cell, tmp_path):
    """A recorder process is SIGKILLed mid-run; the cut bag still exports what it held."""
    out = tmp_path / "killed"
    log = tmp_path / "killable_recorder.log"
    # the driver's publishers whose messages the recorder process must get from the goal's first
    # instant: the episode markers (no start marker, no bag) and the commands (the recovered
    # commands are compared as a prefix of what was sent). The graph shows a new subscription
    # before data can reach it; a publisher's subscription count is Fast DDS's own matches.
    pubs = {"policy_driver/episode": cell.driver._episode_pub, "joint_commands": cell.driver._outputs._arm}
    in_graph_before = {topic: cell.driver.count_subscribers(topic) for topic in pubs}

    def matched() -> dict:
        return {t: (cell.driver.count_subscribers(t), pub.get_subscription_count()) for t, pub in pubs.items()}

    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sequence_ai_ros.recorder_node", "--ros-args", "-r", "__node:=killable_recorder",
             "-p", "auto_record:=true", "-p", f"output_dir:={out}", "-p", "chunk_s:=0.5"],
            stdout=log_file, stderr=subprocess.STDOUT)
    try:
        # before the goal: the recorder process has had a message from every camera and the joint
        # states (it logs that once), so the episode starts with a pre-roll of each and every
        # recovered command has an observation; and both driver publishers have matched its
        # subscriptions. Under CI's load its first frames once came ~2 s after the goal had
        # started, following a fixed 1 s wait past graph discovery.
        deadline = time.monotonic() + 60

        def ready() -> bool:
            return ("every sensor stream has delivered" in log.read_text(errors="replace")
                    and all(graph > in_graph_before[t] and dds >= graph for t, (graph, dds) in matched().items()))

        while not ready():
            assert proc.poll() is None, f"recorder process exited: {log.read_text(errors='replace')[-2000:]}"
            assert time.monotonic() < deadline, (
                f"recorder process not receiving within 60 s: (graph, matched) subscriptions {matched()} "
                f"(graph before {in_graph_before}); log: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.05)
        kill_at = {}

        def kill():
            # mid-run, once the bag on disk holds 1 s of commands in closed chunks (not at a fixed
            # time: with three busy cores beside this test the recorder process once had not
            # written even its MCAP header 4 s after the goal started, which left nothing to recover)
            deadline = time.monotonic() + 30
            while _commands_on_disk(out) < FPS:
                assert time.monotonic() < deadline, "the recorder process wrote no chunk with commands within 30 s"
                time.sleep(0.2)
            kill_at["n"] = len(cell.driver.trace.commands)
            proc.send_signal(signal.SIGKILL)

        cell.run("put the blue cube on the red pad", cancel_after_s=0.0, during=kill)
        sent = [v for _, v in cell.driver.trace.commands]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    bags = [p for p in out.iterdir() if p.is_dir()]
    assert len(bags) == 1
    cut = bags[0]
    assert not (cut / "metadata.yaml").exists()   # killed: no metadata, no footer
    rec = read_episode(cut)
    assert rec.end is None and rec.task == "put the blue cube on the red pad"
    recovered = [c for _, c in rec.commands]
    # all but the last chunk: what is lost is the open chunk (chunk_s = 0.5 s) plus whatever the
    # recorder process had not yet taken off its queue. On an idle machine that is under 1.5 s of
    # commands; with CI's two test files in parallel (MuJoCo rendering beside this recorder) the
    # killed process was once 2.8 s behind (15 of 57 recovered). The bound that matters here is
    # that a prefix survives and exports; the recorder's own lag is bench/bench_recorder.py's.
    # What a fresh recorder process misses at the start: its reader can match the driver's
    # command writer a moment after the writer matched it (DDS discovery runs both ways; the test
    # can only see the writer's side), and a volatile reader gets nothing sent before its own
    # match (CI once: the first 5 commands, 0.33 s, of a run started just after the match).
    assert len(recovered) >= 1
    skipped = next((k for k in range(FPS + 1) if sent[k:k + len(recovered)] == recovered), None)
    assert skipped is not None, ("the recovered commands are not a run of those sent, from within 1 s of the start",
                                 recovered[:3], sent[:FPS + 3])
    assert kill_at["n"] - (skipped + len(recovered)) <= int(4.0 * FPS), (kill_at["n"], skipped, len(recovered))
    # export reads the cut bag directly, and after repair the bag is complete
    ds = tmp_path / "ds"
    assert _export([cut, "--out", ds]) == 0
    info = json.loads((ds / "meta" / "info.json").read_text())
    # every recovered command is a frame from the moment each stream has delivered once: this
    # recorder starts just before the goal, and under CI's load its first wrist frame or joint
    # state can arrive after the first commands (the exporter skips steps no policy could have
    # taken; once, 11 of 59). That start-up gap is bounded; after it nothing is skipped.
    # (by sensor time: the export places each sample at its header stamp and each command at its
    # receipt time de-bunched at the declared rate)
    ready_ns = max([min(_stamp_ns(m) for _, m in msgs) for msgs in rec.images.values()]
                   + [min(_stamp_ns(m) for _, m in rec.joints)])
    times = episode_timing(rec).command_times
    expected = sum(1 for t in times if t >= ready_ns)
    assert expected >= len(recovered) - int(2.0 * FPS), (expected, len(recovered))
    assert info["total_frames"] == expected
    # --fps other than the control rate: a uniform grid from the first command to the last
    assert _export([cut, "--out", tmp_path / "ds10", "--fps", "10"]) == 0
    info10 = json.loads((tmp_path / "ds10" / "meta" / "info.json").read_text())
    grid = [times[0] + k * 100_000_000 for k in range((times[-1] - times[0]) // 100_000_000 + 1)]
    assert info10["fps"] == 10 and info10["total_frames"] == sum(1 for t in grid if t >= ready_ns)
    assert sequence_ai_main(["bag", "repair", str(cut)]) == 0
    assert (cut / "metadata.yaml").exists()
    assert sum(1 for m in iter_raw(cut) if m.topic == "/joint_commands") == len(recovered)


def test_a_recorder_that_missed_the_start_marker_records_the_episode_from_its_repeat(cell, tmp_path):
    """A recorder whose reader matched the driver's marker publisher only after the run's start
    marker went out (here: made once the module's recorder has started its bag) still records the
    episode: the driver publishes the start marker again at 1 s and 3 s (START_MARKER_REPEAT_S),
    and a recorder that has the episode already ignores the repeats (one bag each, not three)."""
    late_dir, made = tmp_path / "late", {}
    bags_before = {p for p in (cell.out / "bags").iterdir() if p.is_dir()}

    def late():
        eventually(lambda: cell.recorder.recording, 20, what="the module's recorder started on the first marker")
        rec = made["rec"] = EpisodeRecorder(node_name="late_recorder", context=cell.ctx, parameter_overrides=[
            Parameter("auto_record", value=True), Parameter("output_dir", value=str(late_dir))])
        cell.executor.add_node(rec)
        eventually(lambda: rec.recording, 20, what="the late recorder started a bag from a repeated marker")
        time.sleep(3.0)                                       # past the second repeat

    try:
        cell.run("put the blue cube on the red pad", cancel_after_s=0.0, during=late)
        rec = made["rec"]
        eventually(lambda: rec.last_bag is not None, 30, what="the late recorder closed its bag")
        late_bags = [p for p in late_dir.iterdir() if p.is_dir()]
        assert len(late_bags) == 1, late_bags
        episode = read_episode(late_bags[0])
        assert episode.end is not None and len(episode.commands) >= FPS, len(episode.commands)
        new = {p for p in (cell.out / "bags").iterdir() if p.is_dir()} - bags_before
        assert len(new) == 1, new                             # the module's recorder: the repeats changed nothing
        assert read_episode(next(iter(new))).start["goal_id"] == episode.start["goal_id"]
    finally:
        if "rec" in made:
            cell.executor.remove_node(made["rec"])
            made["rec"].destroy_node()


def test_disk_bound_prunes_the_oldest_bags_and_drops_instead_of_growing(cell, tmp_path):
    from rclpy.serialization import serialize_message

    bags = tmp_path / "bounded"
    bound_mb = 0.25
    rec = EpisodeRecorder(node_name="bounded_recorder", context=cell.ctx, parameter_overrides=[
        Parameter("output_dir", value=str(bags)), Parameter("max_disk_mb", value=bound_mb),
        Parameter("chunk_kib", value=16)])
    cell.executor.add_node(rec)
    try:
        # an old bag of this recorder: three ~96 kB joint states, over the 192 kB the old bags may keep
        rec.start_episode({"event": "start", "source": "record_episode", "task": "an old episode",
                           **assembly_settings(rec, rec._p)})
        big = serialize_message(JointState(name=["panda_joint1"], position=[0.5] * 12_000))
        for _ in range(3):
            rec._on_joints(big, {})
        old = rec.stop_episode().path
        assert bag_size(old) > 192 * 1024
        rec.start_episode({"event": "start", "source": "record_episode", "task": "fill the disk",
                           **assembly_settings(rec, rec._p)})
        assert not old.exists()                       # pruned before the new bag started
        # frames of 2 views of ~10 kB fill 250 kB within about a second; then it drops, not grows
        eventually(lambda: rec.writer.stats.dropped_disk >= 10, 30.0, 0.05, what="10 frames dropped at the disk bound")
        stats = rec.stop_episode()
    finally:
        cell.executor.remove_node(rec)
        rec.destroy_node()
    total = sum(f.stat().st_size for f in bags.rglob("*") if f.is_file())
    assert stats.dropped_disk > 0
    # the bound holds within one chunk (16 KiB), the footer and metadata.yaml
    assert total <= bound_mb * 1024 * 1024 + 16 * 1024 + 32 * 1024, total
    assert read_episode(stats.path).task == "fill the disk"


def test_episode_start_writes_the_sensor_pre_roll_and_the_commands_that_beat_its_marker_only(cell, tmp_path):
    """The driver's first observation uses samples from before its start marker, and its first
    command may reach the recorder before the marker does: both belong to the episode."""
    from std_msgs.msg import Float64MultiArray
    from rclpy.serialization import serialize_message

    rec_node = EpisodeRecorder(node_name="race_recorder", context=cell.ctx, parameter_overrides=[
        Parameter("output_dir", value=str(tmp_path / "bags"))])      # not spun: callbacks called here
    try:
        rec_node._on_joints(serialize_message(JointState(name=["panda_joint1"], position=[0.5])), {})  # older sample
        rec_node._on_joints(serialize_message(JointState(name=["panda_joint1"], position=[0.7])), {})  # the latest
        image = Image(height=8, width=8, encoding="rgb8", step=24, data=bytes(range(192)))
        rec_node._on_image("exterior_1", rec_node._image_topics["exterior_1"], True, serialize_message(image), {})
        rec_node._on_command(serialize_message(Float64MultiArray(data=[9.0] * 8)), {})   # the last episode's hold
        marker_t = time.time_ns()                                                    # the driver builds its marker
        rec_node._on_command(serialize_message(Float64MultiArray(data=[1.0] * 8)), {})   # this episode's first command
        rec_node.start_episode({"event": "start", "source": "act", "task": "race", "t_ns": marker_t,
                                **assembly_settings(rec_node, rec_node._p)})
        rec_node._on_command(serialize_message(Float64MultiArray(data=[2.0] * 8)), {})
        stats = rec_node.stop_episode()
    finally:
        rec_node.destroy_node()
    rec = read_episode(stats.path)
    assert [c[0] for _, c in rec.commands] == [1.0, 2.0]
    assert [list(m.position) for _, m in rec.joints] == [[0.7]]          # the latest sample only, once
    assert len(rec.images["exterior_1"]) == 1 and rec.images["wrist_left"] == []
    assert rec.joints[0][0] < marker_t and rec.images["exterior_1"][0][0] < marker_t   # original receipt times


def _next_success(root: Path) -> list:
    return pq.read_table(root / "data" / "chunk-000" / "file-000.parquet").column("next.success").to_pylist()


def test_label_episode_gives_a_record_episode_its_success_label_which_export_writes_to_next_success(cell, tmp_path):
    """RecordEpisode around a real (cancelled) Act run; labeled while recording, exported, then
    relabeled after the bag closed and exported again."""
    assert cell.label.wait_for_service(timeout_sec=10.0)
    reset = cell.client.create_client(ResetScene, "sim_robot/reset")
    assert reset.wait_for_service(timeout_sec=10.0)
    assert _wait(reset.call_async(ResetScene.Request(seed=0)), 30, "reset").success   # a fresh scene, whatever ran before
    task = "put the green cube on the blue pad"
    goal = RecordEpisode.Goal(task=task, max_seconds=60.0, control_frequency_hz=float(FPS))   # the rate it declares
    handle = _wait(cell.record.send_goal_async(goal), 30, "the RecordEpisode goal")
    assert handle.accepted
    deadline = time.monotonic() + 10
    while not cell.recorder.recording:
        assert time.monotonic() < deadline, "the RecordEpisode goal did not start recording"
        time.sleep(0.02)
    cell.run(task, cancel_after_s=3.0)      # the driver's Act markers are ignored: RecordEpisode owns the bag
    sent = [v for _, v in cell.driver.trace.commands]
    # labeled while recording: the open bag
    res = _wait(cell.label.call_async(LabelEpisode.Request(success=True, notes="operator: placed")), 60, "label_episode (open bag)")
    assert res.ok, res.message
    time.sleep(0.3)                         # the hold after the cancel reaches the bag
    _wait(handle.cancel_goal_async(), 10, "the RecordEpisode cancel")
    bag = Path(_wait(handle.get_result_async(), 60, "the RecordEpisode result").result.bag_path)
    assert Path(res.bag_path) == bag
    rec = read_episode(bag)
    assert rec.start["source"] == "record_episode" and rec.task == task
    assert rec.success is True and rec.end["label"] == {"success": True, "notes": "operator: placed"}
    assert rec.start["stream_rates_hz"]["/joint_commands"] == FPS and rec.start["control_frequency_hz"] == FPS
    assert rec.start["stream_rate_sources"]["/joint_commands"] == "goal"
    commands = [c for _, c in rec.commands]
    assert len(sent) >= 15 and commands[:len(sent)] == sent   # the whole Act run, then its hold
    ds = tmp_path / "labeled"
    assert _export([bag, "--out", ds]) == 0
    success = _next_success(ds)
    assert len(success) == len(commands)    # one frame per command, the first included
    assert success[-1] is True and not any(success[:-1])
    # relabeled after the bag closed (bag_path empty = the last bag): the bag is rewritten, still whole
    before = sum(1 for _ in iter_raw(bag))
    res = _wait(cell.label.call_async(LabelEpisode.Request(success=False, notes="re-checked: missed")), 60, "label_episode (closed bag)")
    assert res.ok and Path(res.bag_path) == bag, res.message
    assert (bag / "metadata.yaml").exists() and sum(1 for _ in iter_raw(bag)) == before + 1
    rec = read_episode(bag)
    assert rec.success is False and rec.label == {"success": False, "notes": "re-checked: missed"}
    ds2 = tmp_path / "relabeled"
    assert _export([bag, "--out", ds2]) == 0
    assert _next_success(ds2) == [False] * len(commands)
    # what is not a bag is refused with a reason, and nothing is touched
    refused = _wait(cell.label.call_async(LabelEpisode.Request(success=True, bag_path=str(tmp_path))), 60, "label_episode (not a bag)")
    assert not refused.ok and refused.bag_path == "" and "BagReadError" in refused.message
