"""Capture pieces without a robot: the bag writer's queue and chunks, cut-bag recovery, and the
dataset writer fed synthetic episodes (the input a worker-side export will build too).

Real rosbags / pyarrow / PyAV; messages serialized with rclpy (run under ``. scripts/env.sh``).
"""
from __future__ import annotations

import json
import threading

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from rclpy.serialization import serialize_message
from std_msgs.msg import Float64MultiArray, String

from sequence_ai_ros.bag import EPISODE_TOPIC
from sequence_ai_data.episode import EpisodeFrames, ExportError
from sequence_ai_data.lerobot import DatasetExistsError, write_dataset
from sequence_ai_ros.bag.reader import iter_raw, repair_bag
from sequence_ai_ros.bag.writer import BagWriter

from _bags import START_NS, episode_bag


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
    with pytest.raises(ExportError, match="v2.1 dataset") as refused:
        write_dataset([_episode(3, "pick", True)], out, version="3.0", mode="append")
    assert str(refused.value).startswith(f"{out} is a v2.1"), refused.value   # the folder named, not its copy
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


# -- episode bags built by hand: the recorder's pre-roll and labels (test/_bags.py) ---------------


def test_pre_roll_samples_logged_before_the_start_marker_give_the_first_command_its_observation(tmp_path):
    from sequence_ai_ros.bag.frames import observations_from_bag
    from sequence_ai_ros.bag.reader import read_episode

    pre_q = episode_bag(tmp_path / "bag", n_commands=10)
    rec = read_episode(tmp_path / "bag")
    assert rec.joints[0][0] == START_NS - 40_000_000 and len(rec.joints) == 11
    assert rec.images["front"][0][0] == START_NS - 30_000_000 and len(rec.images["front"]) == 11
    fps, steps = observations_from_bag(rec)
    assert fps == 15 and len(steps) == 10                 # one step per command, the first included
    assert steps[0][1].proprioception.joint_positions == pytest.approx(pre_q)
    assert steps[0][2] == [0.0] * 3 and steps[1][1].proprioception.joint_positions == pytest.approx([0.0] * 3)


def test_label_bag_relabels_a_closed_or_cut_bag_and_the_newest_label_wins(tmp_path):
    from sequence_ai_ros.bag.reader import BagReadError, label_bag, read_episode

    bag = tmp_path / "bag"
    episode_bag(bag, label=True)
    assert read_episode(bag).success is True              # the end marker's label
    n = sum(1 for _ in iter_raw(bag))
    assert label_bag(bag, False, "slipped")["messages"] == n + 1
    rec = read_episode(bag)
    assert rec.success is False and rec.label == {"success": False, "notes": "slipped"} and rec.end is not None
    assert [p.name for p in tmp_path.iterdir()] == ["bag"]  # the rewrite left nothing beside it
    # a cut bag (no metadata.yaml, no footer) comes out repaired and labeled
    cut = tmp_path / "cut"
    episode_bag(cut, label=None)
    (cut / "metadata.yaml").unlink()
    mcap = next(cut.glob("*.mcap"))
    mcap.write_bytes(mcap.read_bytes()[:-200])
    label_bag(cut, True)
    assert (cut / "metadata.yaml").exists() and read_episode(cut).success is True
    # the same from the command line: back to unlabeled, then failed with a note
    from sequence_ai.cli import main as sequence_ai_main

    assert sequence_ai_main(["bag", "label", str(cut), "--clear"]) == 0 and read_episode(cut).success is None
    assert sequence_ai_main(["bag", "label", str(cut), "--failure", "--notes", "dropped it"]) == 0
    assert read_episode(cut).label == {"success": False, "notes": "dropped it"}
    with pytest.raises(BagReadError, match="no .mcap"):
        label_bag(tmp_path, True)


def test_label_bag_on_damaged_bytes_raises_bag_read_error_and_leaves_the_bag_as_it_was(tmp_path):
    """Flipped or cut bytes inside an episode bag (seeded, 40 variants) used to escape as
    UnicodeDecodeError or rosbags' ReaderError, which ~/label_episode did not catch. Each
    variant is either labeled or refused with BagReadError, and a refused bag is untouched."""
    import random
    import shutil

    from sequence_ai_ros.bag.reader import BagReadError, label_bag

    good = tmp_path / "good"
    episode_bag(good, n_commands=10, label=None)
    data = next(good.glob("*.mcap")).read_bytes()
    rng = random.Random(1)
    refused = 0
    for i in range(40):
        bag = tmp_path / f"bad{i}"
        shutil.copytree(good, bag)
        mcap = next(bag.glob("*.mcap"))
        damaged = bytearray(data)
        if i % 2:
            damaged = damaged[: rng.randint(8, len(damaged) - 1)]
        else:
            for _ in range(20):
                damaged[rng.randint(8, len(damaged) - 1)] = rng.randint(0, 255)
        mcap.write_bytes(bytes(damaged))
        try:
            label_bag(bag, True)
        except BagReadError:
            refused += 1
            assert mcap.read_bytes() == bytes(damaged)
    assert refused >= 10     # most damage is refused (seeded: the same variants every run)


def test_bag_export_of_a_cut_bag_warns_naming_it_and_still_exports(tmp_path, capsys):
    """A bag cut by a crash (no end marker, no metadata.yaml, no footer) is exported -- recovering
    it is the point -- with a warning naming it; a complete bag exports without one."""
    from sequence_ai.cli import main as sequence_ai_main

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    episode_bag(whole, label=True)
    episode_bag(cut, end_marker=False)
    (cut / "metadata.yaml").unlink()
    mcap = next(cut.glob("*.mcap"))
    mcap.write_bytes(mcap.read_bytes()[:-200])
    assert sequence_ai_main(["bag", "export", str(whole), "--out", str(tmp_path / "ds_whole")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert sequence_ai_main(["bag", "export", str(whole), str(cut), "--out", str(tmp_path / "ds")]) == 0
    got = capsys.readouterr()
    warnings = [line for line in got.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and str(cut) in warnings[0] and str(whole) + " " not in warnings[0]
    assert "no end marker" in warnings[0] and "last chunk may be missing" in warnings[0] and "no outcome" in warnings[0]
    assert "+2 episodes" in got.out
