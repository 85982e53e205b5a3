"""``episode_recorder``'s ``~/label_episode`` relabels only bags the recorder itself wrote in its
own ``output_dir``: a path outside it, a symlink or ``..`` leading out of it, or a bag in it from
another recorder is refused with a reason, and nothing is rewritten.

Real rclpy: the recorder node and a service client in one context; bags written by the node's own
BagWriter (start marker, instruction, end marker), no robot needed.
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.parameter import Parameter

from sequence_ai_msgs.srv import LabelEpisode
from sequence_ai_ros._spin import spin
from sequence_ai_ros.bag.reader import read_episode
from sequence_ai_ros.recorder_node import EpisodeRecorder


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class Rig:
    """Two recorders (each its own output_dir) and a client, spinning in one context."""

    def __init__(self, tmp: Path):
        self.ctx = rclpy.context.Context()
        rclpy.init(context=self.ctx)
        self.rec = EpisodeRecorder(node_name="rec_a", context=self.ctx,
                                   parameter_overrides=[Parameter("output_dir", value=str(tmp / "bags"))])
        self.other = EpisodeRecorder(node_name="rec_b", context=self.ctx,
                                     parameter_overrides=[Parameter("output_dir", value=str(tmp / "other-bags"))])
        self.client = rclpy.create_node("label_test_client", context=self.ctx)
        self.executor = MultiThreadedExecutor(num_threads=3, context=self.ctx)
        for n in (self.rec, self.other, self.client):
            self.executor.add_node(n)
        self.thread = threading.Thread(target=spin, args=(self.executor,), daemon=True)   # survives the destroy race
        self.thread.start()
        self.label_cli = self.client.create_client(LabelEpisode, "rec_a/label_episode")
        assert self.label_cli.wait_for_service(timeout_sec=20.0)

    def record(self, recorder: EpisodeRecorder, task: str) -> Path:
        recorder.start_episode({"event": "start", "source": "record_episode", "task": task, "t_ns": time.time_ns()})
        return Path(recorder.stop_episode({"outcome": {"reason": "canceled", "seconds": 0.1}}).path)

    def label(self, bag_path: str, success: bool = True) -> LabelEpisode.Response:
        fut = self.label_cli.call_async(LabelEpisode.Request(success=success, notes="checked", bag_path=bag_path))
        deadline = time.monotonic() + 30
        while not fut.done():
            assert time.monotonic() < deadline, "no answer from ~/label_episode"
            time.sleep(0.01)
        return fut.result()

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=5.0)
        self.thread.join(timeout=10)
        for n in (self.client, self.other, self.rec):
            n.destroy_node()
        rclpy.shutdown(context=self.ctx)


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def test_label_episode_relabels_only_bags_this_recorder_wrote_in_its_output_dir(rig, tmp_path):
    own = rig.record(rig.rec, "put the red cube on the green pad")
    assert own.parent == (tmp_path / "bags").resolve()
    rid = (tmp_path / "bags" / ".recorder-id").read_text().strip()
    assert read_episode(own).start["recorder"] == rid
    foreign = rig.record(rig.other, "stack the blocks")          # another recorder's bag ...
    planted = tmp_path / "bags" / "episode-planted"
    shutil.copytree(foreign, planted)                            # ... put into this recorder's folder
    outside = tmp_path / "elsewhere" / "copy"                    # this recorder's bag, copied out
    shutil.copytree(own, outside)
    link = tmp_path / "bags" / "episode-link"
    link.symlink_to(outside)
    dotdot = str(tmp_path / "bags" / ".." / "elsewhere" / "copy")
    before = {p: _tree(p) for p in (planted, outside)}

    refusals = [
        (str(outside), "not in this recorder's output_dir"),
        (str(link), "not in this recorder's output_dir"),
        ("episode-link", "not in this recorder's output_dir"),
        (dotdot, "not in this recorder's output_dir"),
        (str(tmp_path), "not in this recorder's output_dir"),
        (str(planted), "was not written by this recorder"),
    ]
    for path, reason in refusals:
        res = rig.label(path)
        assert not res.ok and res.bag_path == "", (path, res.message)
        assert "BagReadError" in res.message and "refused" in res.message and reason in res.message, res.message
        assert path in res.message
    assert {p: _tree(p) for p in (planted, outside)} == before
    assert read_episode(outside).success is None and not read_episode(outside).labels

    # its own bag: by absolute path and by name in output_dir
    res = rig.label(str(own), success=False)
    assert res.ok and Path(res.bag_path) == own, res.message
    assert read_episode(own).label == {"success": False, "notes": "checked"}
    res = rig.label(own.name, success=True)
    assert res.ok and Path(res.bag_path) == own, res.message
    assert read_episode(own).success is True


def test_the_recorder_id_survives_a_restart_and_is_private(tmp_path):
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx)
    try:
        ids = []
        for _ in range(2):
            node = EpisodeRecorder(context=ctx, parameter_overrides=[Parameter("output_dir", value=str(tmp_path / "bags"))])
            ids.append(node.recorder_id)
            node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
    assert ids[0] == ids[1] and ids[0].startswith("rec-")
    assert os.stat(tmp_path / "bags" / ".recorder-id").st_mode & 0o777 == 0o600
