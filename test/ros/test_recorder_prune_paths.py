"""``episode_recorder``'s disk bound (``max_disk_mb``) deletes only bags the recorder itself wrote:
real folders directly in its ``output_dir`` whose start marker carries its recorder id. A bag
another recorder or tool put there, and a symlinked folder (even one linking to a copy of the
recorder's own bag elsewhere), survive; the recorder's own oldest bags are pruned to the bound,
and only its own bags count against it.

Real rclpy nodes (not spun: their methods are called here) writing real bags through their
BagWriter.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import rclpy
from rclpy.parameter import Parameter
from rclpy.serialization import serialize_message
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from sequence_ai_ros.bag import EPISODE_TOPIC
from sequence_ai_ros.bag.reader import read_episode
from sequence_ai_ros.bag.writer import BagWriter, bag_recorder_id, bag_size
from sequence_ai_ros.recorder_node import EpisodeRecorder

_BIG = serialize_message(JointState(name=["panda_joint1"], position=[0.25] * 12_000))   # ~96 kB


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _record(rec: EpisodeRecorder, task: str) -> Path:
    rec.start_episode({"event": "start", "source": "record_episode", "task": task, "t_ns": time.time_ns()})
    for _ in range(2):
        rec._on_joints(_BIG, {})          # the subscription callback: two large joint states per bag
    return Path(rec.stop_episode({"outcome": {"reason": "canceled", "seconds": 0.1}}).path)


def _recorder(ctx, name: str, out: Path, max_disk_mb: float = 1024.0) -> EpisodeRecorder:
    return EpisodeRecorder(node_name=name, context=ctx, parameter_overrides=[
        Parameter("output_dir", value=str(out)), Parameter("max_disk_mb", value=float(max_disk_mb))])


def test_disk_bound_prunes_only_this_recorders_oldest_bags(tmp_path):
    ctx = rclpy.context.Context()
    rclpy.init(context=ctx)
    nodes = []
    try:
        bags, elsewhere = tmp_path / "bags", tmp_path / "elsewhere"
        rec = _recorder(ctx, "prune_a", bags)
        other = _recorder(ctx, "prune_b", tmp_path / "other-bags")
        nodes += [rec, other]
        own = []
        for i in range(3):
            own.append(_record(rec, f"own episode {i}"))
            time.sleep(0.02)
        # another recorder's bag copied in; another tool's bag (no recorder id) written in place
        foreign = bags / "episode-from-another-recorder"
        shutil.copytree(_record(other, "another recorder's episode"), foreign)
        tool = bags / "tool-bag"
        w = BagWriter()
        w.open(tool)
        w.put(EPISODE_TOPIC, "std_msgs/msg/String", time.time_ns(),
              serialize_message(String(data=json.dumps({"event": "start", "task": "someone else's"}))))
        w.put("/joint_states", "sensor_msgs/msg/JointState", time.time_ns(), _BIG)
        w.close()
        w.shutdown()
        # a symlinked folder: a copy of this recorder's own bag kept outside output_dir, linked in
        shutil.copytree(own[0], elsewhere / "kept-copy")
        (bags / "linked").symlink_to(elsewhere / "kept-copy", target_is_directory=True)
        # the foreign ones are the oldest of all
        old = time.time() - 3600
        for p in (foreign, tool, elsewhere / "kept-copy"):
            os.utime(p, (old, old))
        assert [bag_recorder_id(p) for p in own] == [rec.recorder_id] * 3
        assert bag_recorder_id(foreign) == other.recorder_id != rec.recorder_id
        assert bag_recorder_id(tool) is None and bag_recorder_id(bags / "linked") is None
        # the newest own bag relabeled (rewritten: its start marker now follows the pre-roll): still its own
        rec.label_episode(True, "checked", own[2].name)
        assert read_episode(own[2]).success is True and bag_recorder_id(own[2]) == rec.recorder_id

        survivors = {p: _tree(p) for p in (foreign, tool, elsewhere / "kept-copy")}
        sizes = [bag_size(p) for p in own]
        assert min(sizes) > 150_000
        # restarted on the same output_dir (same recorder id) with a bound that keeps only the newest
        # own bag: older bags keep at most 3/4 of the bound (the rest is the new bag's margin)
        bound = int((sizes[2] + sizes[1] // 2) / 0.75)
        rec.destroy_node()
        nodes.remove(rec)
        rec2 = _recorder(ctx, "prune_a2", bags, max_disk_mb=bound / (1024 * 1024))
        nodes.append(rec2)
        assert rec2.recorder_id == rec.recorder_id
        new = rec2.start_episode({"event": "start", "source": "record_episode", "task": "next", "t_ns": time.time_ns()})
        assert not own[0].exists() and not own[1].exists() and own[2].exists()
        for p, tree in survivors.items():
            assert _tree(p) == tree, p
        assert (bags / "linked").is_symlink() and _tree(bags / "linked") == survivors[elsewhere / "kept-copy"]
        # only its own bags count against the bound: the new bag may use what they leave
        assert rec2.writer.max_bag_bytes == rec2._max_bytes - bag_size(own[2])
        rec2.stop_episode()
        assert sorted(p.name for p in bags.iterdir()) == sorted(
            [".recorder-id", own[2].name, new.name, foreign.name, tool.name, "linked"])
    finally:
        for n in nodes:
            n.destroy_node()
        rclpy.shutdown(context=ctx)
