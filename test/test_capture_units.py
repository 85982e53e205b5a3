"""Capture pieces without a robot: the bag writer's queue and chunks, cut-bag recovery, and the
dataset writer fed synthetic episodes (the input a worker-side export will build too).

Real rosbags / pyarrow / PyAV; messages serialized with rclpy (run under ``. scripts/env.sh``).
"""
from __future__ import annotations

import json
import threading
import time

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from rclpy.serialization import serialize_message
from std_msgs.msg import Float64MultiArray, String

from sequence_ai_ros.bag import EPISODE_TOPIC
from sequence_ai_ros.bag.episode import EpisodeFrames, ExportError
from sequence_ai_ros.bag.lerobot import DatasetExistsError, write_dataset
from sequence_ai_ros.bag.reader import iter_raw, repair_bag
from sequence_ai_ros.bag.writer import BagWriter


def _cmd(i: int) -> bytes:
    return serialize_message(Float64MultiArray(data=[float(i)] * 8))


def test_a_full_writer_queue_drops_and_counts_instead_of_blocking(tmp_path):
    gate = threading.Event()

    def slow(raw):          # the writer thread is stuck until the gate opens
        gate.wait(10)
        return "std_msgs/msg/Float64MultiArray", raw

    w = BagWriter(queue_size=4)
    w.open(tmp_path / "bag")
    accepted = [w.put("/joint_commands", "std_msgs/msg/Float64MultiArray", 1_000 + i, _cmd(i), slow) for i in range(50)]
    assert accepted.count(False) == w.stats.dropped_queue and w.stats.dropped_queue >= 45
    gate.set()
    stats = w.close()
    w.shutdown()
    assert stats.written == accepted.count(True) and stats.written + stats.dropped == 50
    assert sum(1 for _ in iter_raw(tmp_path / "bag")) == stats.written


def test_a_cut_bag_keeps_every_closed_chunk_and_repair_makes_it_whole(tmp_path):
    w = BagWriter(chunk_bytes=2048, chunk_s=60.0)
    w.open(tmp_path / "bag")
    w.put(EPISODE_TOPIC, "std_msgs/msg/String", 1, serialize_message(String(data='{"event": "start"}')))
    for i in range(400):
        w.put("/joint_commands", "std_msgs/msg/Float64MultiArray", 10 + i, _cmd(i))
    stats = w.close()
    w.shutdown()
    assert stats.chunks >= 10
    mcap = next((tmp_path / "bag").glob("*.mcap"))
    # simulate SIGKILL: no metadata.yaml, the file cut in the middle of the summary and a chunk
    (tmp_path / "bag" / "metadata.yaml").unlink()
    data = mcap.read_bytes()
    from rosbags.rosbag2.storage_mcap import McapReader

    full = McapReader(mcap)
    full.open()
    chunks = sorted((c.chunk_start_offset, c.chunk_length, sum(c.channel_count.values())) for c in full.chunks)
    full.close()
    start, length, _ = chunks[len(chunks) // 2]
    cut = start + length // 2                              # the middle of the middle chunk
    whole_before = sum(n for s, ln, n in chunks if s + ln <= cut)
    mcap.write_bytes(data[:cut])
    got = [m for m in iter_raw(tmp_path / "bag") if m.topic == "/joint_commands"]
    values = [m.t_ns - 10 for m in got]
    assert values == list(range(len(values)))              # a prefix, in order, nothing invented
    assert len(got) + 1 == whole_before                    # every closed chunk (the marker is the +1), only the cut one lost
    report = repair_bag(tmp_path / "bag")
    assert report["repaired"] and report["messages"] == len(values) + 1
    assert (tmp_path / "bag" / "metadata.yaml").exists()
    assert [m.t_ns - 10 for m in iter_raw(tmp_path / "bag") if m.topic == "/joint_commands"] == values
    assert repair_bag(tmp_path / "bag")["repaired"] is False


def _episode(n: int, task: str, success, seed: int = 0) -> EpisodeFrames:
    rng = np.random.default_rng(seed)
    img = np.zeros((n, 64, 96, 3), np.uint8)
    img[:, :, :, 0] = np.arange(n)[:, None, None] * 4 % 256
    return EpisodeFrames(task=task, fps=10.0, images={"front": img}, state=rng.normal(size=(n, 3)).astype(np.float32),
                         action=rng.normal(size=(n, 2)).astype(np.float32), success=success,
                         state_names=["a", "b", "c"], action_names=["x", "y"], source=f"synthetic-{seed}")


def test_dataset_writer_v30_tasks_indices_and_videos_across_appended_episodes(tmp_path):
    out = tmp_path / "ds"
    write_dataset([_episode(12, "pick", True)], out)
    with pytest.raises(DatasetExistsError):
        write_dataset([_episode(5, "pick", None)], out)
    s = write_dataset([_episode(7, "place", False, 1)], out, mode="append")
    assert (s["episodes"], s["frames"], s["tasks"]) == (2, 19, 2)
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["features"]["observation.images.front"]["shape"] == [64, 96, 3]
    eps = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    assert [(e["episode_index"], e["length"], e["tasks"], e["dataset_from_index"]) for e in eps] == [
        (0, 12, ["pick"], 0), (1, 7, ["place"], 12)]
    t1 = pq.read_table(out / "data" / "chunk-000" / "file-001.parquet")
    assert t1.column("index").to_pylist() == list(range(12, 19))
    assert set(t1.column("task_index").to_pylist()) == {1}
    assert t1.column("next.success").to_pylist() == [False] * 7
    tasks = pq.read_table(out / "meta" / "tasks.parquet")
    assert tasks.column("task").to_pylist() == ["pick", "place"]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]
    stats = json.loads((out / "meta" / "stats.json").read_text())
    assert stats["observation.state"]["count"] == [19]
    with av.open(str(out / "videos" / "observation.images.front" / "chunk-000" / "file-001.mp4")) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 7 and frames[0].shape == (64, 96, 3)


def test_append_refuses_episodes_that_do_not_match_and_leaves_the_dataset_untouched(tmp_path):
    out = tmp_path / "ds"
    write_dataset([_episode(6, "pick", True)], out, version="2.1")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    odd = _episode(6, "pick", True)
    odd.state = np.zeros((6, 4), np.float32)
    with pytest.raises(ExportError, match="features"):
        write_dataset([_episode(3, "pick", True), odd], out, version="2.1", mode="append")
    with pytest.raises(ExportError, match="v2.1 dataset"):
        write_dataset([_episode(3, "pick", True)], out, version="3.0", mode="append")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]
