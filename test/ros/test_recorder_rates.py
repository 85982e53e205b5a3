"""Rates, source times and the contract in bags and datasets, on bags built here with the
recorder's own writer (no processes): the DDS source timestamp a message is recorded with is its
MCAP publish_time and times headerless commands in the export; every stream's rate and who
declared it; the contract, policy and seam statistics in info.json; GR00T's modality.json."""
from __future__ import annotations

import json

import numpy as np
import pytest
from rclpy.serialization import serialize_message
from std_msgs.msg import Float64MultiArray, String

from _bags import START_NS, episode_bag
from sequence_ai_data.episode import ExportError, StreamRateError
from sequence_ai_data.lerobot import write_dataset
from sequence_ai_ros.bag import EPISODE_TOPIC
from sequence_ai_ros.bag.events import end_event, provenance
from sequence_ai_ros.bag.frames import episode_timing, frames_from_bag
from sequence_ai_ros.bag.rates import RateMeter, configured_rates, declare_rates
from sequence_ai_ros.bag.reader import custom_data, publish_times, read_episode
from sequence_ai_ros.bag.stamps import TIME_SOURCES_KEY, source_ns
from sequence_ai_ros.bag.writer import BagWriter

CMD = "/joint_commands"
CONTRACT = {"observation": {"cameras": {"front": {"size": [48, 32]}}, "state": {"dim": 3}},
            "action": {"control_frequency_hz": 15.0, "action_space": "joint_position"}}


def _command_bag(path, *, period_ns=66_666_667, declared=15.0, n=30, bunch=10, sources=True, origin=None):
    """A bag whose commands were *received* in bunches of ``bunch`` (a lagging recorder) but
    published every ``period_ns`` (their DDS source timestamps), with sensors on that grid."""
    start = {"event": "start", "source": "act", "task": "t", "views": [], "image_topics": {}, "joint_names": ["j1"],
             "gripper_joint": None, "joint_state_topic": "/joint_states", "command_topic": CMD,
             "max_sensor_age_s": 1.0, "control_frequency_hz": declared}
    if origin:
        start.update(stream_rates_hz={CMD: declared}, stream_rate_sources={CMD: origin})
        start.pop("control_frequency_hz")
    from sensor_msgs.msg import JointState

    w = BagWriter()
    w.open(path)
    w.put(EPISODE_TOPIC, "std_msgs/msg/String", START_NS, serialize_message(String(data=json.dumps(start))))
    published = [START_NS + 1_000_000 + k * period_ns for k in range(n)]
    for k, pub in enumerate(published):
        recv = published[min(n - 1, (k // bunch + 1) * bunch - 1)] + 2_000_000 + k   # a bunch arrives at once
        w.put(CMD, "std_msgs/msg/Float64MultiArray", recv, serialize_message(Float64MultiArray(data=[float(k)])),
              source_ns=pub if sources else None)
        js = JointState(name=["j1"], position=[float(k)])
        js.header.stamp.sec, js.header.stamp.nanosec = divmod(pub - 500_000, 1_000_000_000)
        w.put("/joint_states", "sensor_msgs/msg/JointState", pub + 300_000, serialize_message(js))
    end = {"event": "end", "source": "act", "outcome": {"reason": "until", "actions": n}, "label": {"success": True}}
    w.put(EPISODE_TOPIC, "std_msgs/msg/String", published[-1] + 100_000_000, serialize_message(String(data=json.dumps(end))))
    w.close()
    w.shutdown()
    return published


def test_a_source_timestamp_is_the_records_publish_time_and_times_bunched_commands(tmp_path):
    bag = tmp_path / "bag"
    published = _command_bag(bag)
    pubs = publish_times(bag, {CMD})
    assert sorted(pubs.values()) == published                       # publish_time = the source timestamp
    assert json.loads(custom_data(bag)[TIME_SOURCES_KEY])[CMD] == "source"
    rec = read_episode(bag)
    assert rec.command_sources == published and rec.time_sources[CMD] == "source"
    timing = episode_timing(rec)
    assert timing.streams[CMD].time_source == "source" and timing.streams[CMD].verdict == "ok"
    assert timing.step_times == published                           # not the bunched receipts
    assert timing.fps == 15 and abs(timing.exported_s - timing.recorded_s) < 1 / 15


def test_a_cut_bag_still_has_its_source_times_and_one_without_them_falls_back_to_receipts(tmp_path):
    bag = tmp_path / "cut"
    published = _command_bag(bag)
    (bag / "metadata.yaml").unlink()                                # as a SIGKILL leaves it (no metadata)
    rec = read_episode(bag)
    assert rec.time_sources[CMD] == "source" and rec.command_sources == published
    plain = tmp_path / "plain"
    _command_bag(plain, sources=False)
    rec = read_episode(plain)
    assert rec.time_sources[CMD] == "receive" and rec.command_sources == [None] * 30
    assert episode_timing(rec).streams[CMD].time_source == "receive"


def test_source_timed_commands_off_their_declared_rate_are_refused_by_name(tmp_path):
    bag = tmp_path / "slow"
    _command_bag(bag, period_ns=100_000_000, declared=15.0, n=20, bunch=1)   # 10 Hz published, 15 declared
    with pytest.raises(StreamRateError) as err:
        frames_from_bag(bag)
    assert err.value.stream == CMD and err.value.declared_hz == 15.0 and err.value.time_source == "source"
    assert err.value.measured_hz == pytest.approx(10.0, rel=0.02)
    assert CMD in str(err.value) and "--fps" in str(err.value)
    fast = tmp_path / "fast"
    _command_bag(fast, period_ns=33_333_333, declared=15.0, n=40, bunch=1)   # 30 Hz published, 15 declared
    with pytest.raises(StreamRateError) as err:
        frames_from_bag(fast)
    assert err.value.stream == CMD and err.value.measured_hz == pytest.approx(30.0, rel=0.05)


def test_a_rate_the_recorder_only_measured_sets_fps_and_a_disagreement_is_a_warning(tmp_path):
    bag = tmp_path / "measured"
    _command_bag(bag, declared=15.0, origin="measured")
    timing = episode_timing(read_episode(bag))
    assert timing.fps == 15 and "measured" in timing.fps_from and timing.declared_hz is None
    off = tmp_path / "measured_off"
    _command_bag(off, declared=20.0, origin="measured", period_ns=66_666_667)   # measured 20 before, 15 during
    timing = episode_timing(read_episode(off))
    assert any(CMD in w and "measured" in w for w in timing.warnings), timing.warnings
    goal = tmp_path / "goal"
    _command_bag(goal, declared=15.0, origin="goal")
    timing = episode_timing(read_episode(goal))
    assert timing.fps == 15 and timing.fps_from == "declared by the goal" and timing.streams[CMD].rate_origin == "goal"


def test_declare_rates_fills_every_stream_in_order_marker_parameter_measured():
    import time

    meter = RateMeter()
    t0 = time.time_ns() - 20 * 33_333_333
    for k in range(20):
        meter.add("/cam", t0 + k * 33_333_333)                       # 30 Hz
        meter.add("/joint_states", t0 + 500_000_000 + k * 10_000_000)   # 100 Hz
        meter.add("/stopped", t0 - 2_000_000_000 + k * 33_333_333)   # flowed, but not now
    meter.add("/few", time.time_ns())                                 # too few to measure
    start = {"source": "act", "control_frequency_hz": 15.0, "stream_rates_hz": {"/cam": 29.97},
             "stream_rate_sources": {"/cam": "contract"}}
    out = declare_rates(start, ["/cam", "/joint_states", CMD, "/few", "/stopped"], {"/joint_states": (50.0, "parameter")},
                        meter, CMD)
    assert out["stream_rates_hz"] == {"/cam": 29.97, CMD: 15.0, "/joint_states": 50.0}
    assert out["stream_rate_sources"] == {"/cam": "contract", CMD: "contract", "/joint_states": "parameter"}
    measured = declare_rates({"source": "record_episode"}, ["/cam", "/joint_states"], {}, meter, CMD)
    assert measured["stream_rates_hz"] == {"/cam": pytest.approx(30.0, rel=1e-3), "/joint_states": pytest.approx(100.0)}
    assert set(measured["stream_rate_sources"].values()) == {"measured"} and "control_frequency_hz" not in measured
    goal = declare_rates({"source": "record_episode", "stream_rates_hz": {CMD: 20.0}, "stream_rate_sources": {CMD: "goal"}},
                         [CMD], {}, meter, CMD)
    assert goal["control_frequency_hz"] == 20.0                      # the export's fps
    meter.begin()
    for k in range(10):
        meter.add(CMD, k * 50_000_000)
    assert meter.episode_hz() == {CMD: pytest.approx(20.0)}
    # a stream whose rate changed just before, with no pause between: the new rate once 10 periods are in
    now = time.time_ns()
    times = [now - 12 * 33_333_333 - (40 - k) * 66_666_667 for k in range(40)] + [now - (11 - k) * 33_333_333 for k in range(12)]
    for t in times:
        meter.add("/changed", t)
    assert meter.recent_hz("/changed", now) == pytest.approx(30.0, rel=1e-3)


def test_configured_rates_refuse_bad_values_naming_them():
    p = {"camera_rates_hz": [0.0], "joint_state_rate_hz": 0.0, "control_frequency_hz": 0.0}
    assert configured_rates(p, ["a", "b"], {"a": "/a", "b": "/b"}, "/js", CMD) == {}
    p.update(camera_rates_hz=[30.0, 15.0], control_frequency_hz=15.0)
    assert configured_rates(p, ["a", "b"], {"a": "/a", "b": "/b"}, "/js", CMD) == {
        "/a": (30.0, "parameter"), "/b": (15.0, "parameter"), CMD: (15.0, "parameter")}
    with pytest.raises(ValueError, match="camera_rates_hz has 3 entries for 2"):
        configured_rates(dict(p, camera_rates_hz=[1.0, 2.0, 3.0]), ["a", "b"], {"a": "/a", "b": "/b"}, "/js", CMD)
    with pytest.raises(ValueError, match=">= 0 Hz"):
        configured_rates(dict(p, joint_state_rate_hz=-1.0), ["a", "b"], {"a": "/a", "b": "/b"}, "/js", CMD)
    assert source_ns({"source_timestamp": 0}) is None and source_ns({"source_timestamp": 5}) == 5
    assert source_ns(None) is None


def test_the_contract_policy_rates_and_seams_go_into_info_json_and_gr00t_modality(tmp_path):
    episode_bag(tmp_path / "bag")
    ep = frames_from_bag(tmp_path / "bag", fps=15)
    ep.provenance = provenance(
        {"contract": CONTRACT, "policy": {"model": "pick-place", "version": 3},
         "stream_rates_hz": {CMD: 15.0, "/joint_states": 30.0}, "stream_rate_sources": {CMD: "contract", "/joint_states": "measured"}},
        json.loads(end_event(_Result(), True)) | {"measured_rates_hz": {"/joint_states": 29.5}})
    ds = tmp_path / "ds21"
    write_dataset([ep, ep], ds, version="2.1", gr00t_modality=True)
    info = json.loads((ds / "meta" / "info.json").read_text())
    meta = info["sequence_ai"]
    assert meta["observation_contract"] == CONTRACT["observation"] and meta["action_contract"] == CONTRACT["action"]
    assert meta["policy"] == {"model": "pick-place", "version": 3}
    assert meta["stream_rates"]["/joint_states"] == {"hz": 30.0, "origin": "measured", "measured_hz": 29.5}
    assert meta["seams"] == {"episodes": 2, "seams": 8, "chunks": 10, "max_seam_jump": 0.02,
                             "seam_jump_p99_max": 0.015, "seam_rows_trimmed": 2}
    assert [e["episode_index"] for e in meta["episodes"]] == [0, 1] and meta["episodes"][0]["seams"]["seams"] == 4
    modality = json.loads((ds / "meta" / "modality.json").read_text())
    width = info["features"]["observation.state"]["shape"][0]
    assert modality["state"] == {"single_arm": {"start": 0, "end": width, "original_key": "observation.state"}}
    assert modality["action"] == {"single_arm": {"start": 0, "end": width, "original_key": "action"}}
    assert modality["video"] == {"front": {"original_key": "observation.images.front"}}
    assert modality["annotation"] == {"human.task_description": {"original_key": "task_index"}}
    # appended episodes keep the entry and add to it
    write_dataset([ep], ds, version="2.1", mode="append", gr00t_modality=True)
    meta = json.loads((ds / "meta" / "info.json").read_text())["sequence_ai"]
    assert meta["seams"]["episodes"] == 3 and len(meta["episodes"]) == 3
    with pytest.raises(ExportError, match="--version 2.1"):
        write_dataset([ep], tmp_path / "ds30", version="3.0", gr00t_modality=True)
    assert not (tmp_path / "ds30").exists()
    assert np.isfinite(ep.state).all()


class _Result:
    """An Act result's fields the end marker copies (seam telemetry included)."""
    reason, actions, chunks, seconds, underruns, max_seam_jump = "until", 10, 5, 1.0, 0, 0.02
    seams, seam_jump_p50, seam_jump_p99, seam_jump_before_blend_p99 = 4, 0.005, 0.015, 0.03
    seam_max_delay_steps, seam_rows_trimmed, seam_min_playback_left_s, merge, delay_mode = 2, 1, 0.1, "aligned", "chunk"
