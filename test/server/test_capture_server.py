"""Worker-kept episodes (issue 7, server side): `seq policy capture`, labels, retention, export.

Real gateway, real echo-policy workers, the real `seq` CLI and the real client; datasets read
back with pyarrow and PyAV."""
from __future__ import annotations

import base64
import io
import json
import os
import time

import httpx
import pyarrow.parquet as pq
import pytest

import sequence_ai
from _core_support import observation
from _servers import ECHO_POLICY, GatewayProcess, echo_observation, png_b64, seq_cli
from sequence_ai_core.protocol import encode_act_body
from sequence_ai_server.worker.capture import keeps


def _wait_log(gw, name: str, needle: str, since: int, timeout: float = 60.0) -> float:
    """Seconds until the worker's log (after offset ``since``) says ``needle``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if needle in gw.log(name)[since:]:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"worker of {name} never logged {needle!r}:\n{gw.log(name)[-2000:]}")


def _capture(gw, name: str, *args, body=None) -> float:
    """Run `seq policy capture NAME ARGS` (or PUT ``body`` straight to the gateway, which is what
    the CLI does, to save a process start); return the seconds until the running worker applied it."""
    since = len(gw.log(name))
    if body is None:
        r = seq_cli(gw, "policy", "capture", name, *args)
        assert r.returncode == 0, r.stderr
    else:
        gw.client.put(f"/v1/deployments/{name}/capture", json=body).raise_for_status()
    cfg = gw.client.get(f"/v1/deployments/{name}/capture").json()
    needle = "'enabled': False" if not cfg["enabled"] else f"'rate': {cfg['rate']}, 'images': {cfg['images']}"
    return _wait_log(gw, name, needle, since)


class Robot:
    """/act straight to the worker, as the client does, with the coordinates from /v1/connect."""

    def __init__(self, gw, name):
        c = gw.connect_ready(name)
        self.http = httpx.Client(base_url=c["worker_url"], headers={"Authorization": f"Bearer {c['direct_secret']}"},
                                 timeout=30)

    def act(self, episode_id, obs=None, params=None, **kw) -> dict:
        r = self.http.post("/act", json={"observation": obs or echo_observation(), "params": params or {},
                                         "episode_id": episode_id, **kw})
        assert r.status_code == 200, r.text
        return r.json()


def _kept(gw, name, episode_id, steps, timeout=20.0) -> list[dict]:
    path = gw.data_dir / "capture" / name / "episodes" / f"{episode_id}.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = [json.loads(x) for x in path.read_text().splitlines()]
            if len(lines) >= steps:
                return lines
        time.sleep(0.05)
    raise AssertionError(f"{path} does not hold {steps} steps")


@pytest.fixture(scope="module")
def capture_gateway(tmp_path_factory):
    """This module's gateway; its workers re-read the capture settings every 0.5 s (default 2 s)."""
    gw = GatewayProcess.start(tmp_path_factory.mktemp("gateway"), env={"SEQ_CAPTURE_POLL_S": "0.5"})
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture(scope="module")
def capt(capture_gateway):
    gw = capture_gateway
    assert gw.deploy(ECHO_POLICY, "capt")["status"] == "ready"
    return gw


def test_capture_at_rate_one_keeps_every_act_of_an_episode_whole(capt):
    gw = capt
    pid = gw.status("capt")["pid"]
    assert _capture(gw, "capt", "--rate", "1.0") < 60
    robot = Robot(gw, "capt")
    sent = [robot.act("ep-a", params={"chunk_len": 4}, obs=echo_observation(joint_positions=[float(i)] * 7))
            for i in range(5)]
    lines = _kept(gw, "capt", "ep-a", 5)
    assert len(lines) == 5 and [x["step"] for x in lines] == [0, 1, 2, 3, 4]
    for i, (line, resp) in enumerate(zip(lines, sent)):
        assert line["episode_id"] == "ep-a" and line["request_id"] == resp["request_id"]
        assert line["params"]["chunk_len"] == 4
        assert line["chunk"]["actions"] == resp["action_chunk"]["actions"] and len(line["chunk"]["actions"]) == 4
        assert line["observation"]["proprioception"]["joint_positions"] == [float(i)] * 7
        assert line["observation"]["instruction"] == "put the red cube on the green pad"
        assert line["observation"]["images"] == [{"view": "exterior_1", "timestamp_ms": 0}]   # no --images: no frame
    assert not (gw.data_dir / "capture" / "capt" / "frames").exists()
    r = seq_cli(gw, "policy", "capture", "capt")
    assert r.returncode == 0, r.stderr
    assert "capture capt: on: rate 1, without images, retention 30 days" in r.stdout
    assert "kept: 1 episodes, 5 steps, 0 labeled" in r.stdout
    assert gw.status("capt")["pid"] == pid   # no redeploy, no restart


def test_a_rate_change_reaches_the_running_worker_without_redeploy(capt):
    gw = capt
    pid = gw.status("capt")["pid"]
    took = _capture(gw, "capt", body={"rate": 0.5})
    assert took < 60
    robot = Robot(gw, "capt")
    ids = [f"rate-{i}" for i in range(40)]
    for ep in ids:
        robot.act(ep, params={"chunk_len": 2})
    expected = {ep for ep in ids if keeps(ep, 0.5)}
    assert 8 <= len(expected) <= 32
    for ep in expected:
        assert len(_kept(gw, "capt", ep, 1)) == 1
    time.sleep(0.5)
    on_disk = {p.stem for p in (gw.data_dir / "capture" / "capt" / "episodes").glob("rate-*.jsonl")}
    assert on_disk == expected
    assert _capture(gw, "capt", "--off") < 60
    robot.act("after-off-1")
    robot.act("after-off-2")
    time.sleep(0.5)
    assert not list((gw.data_dir / "capture" / "capt" / "episodes").glob("after-off-*"))
    r = seq_cli(gw, "policy", "capture", "capt")
    assert "capture capt: off" in r.stdout and f"kept: {1 + len(expected)} episodes" in r.stdout
    assert gw.status("capt")["pid"] == pid
    bad = gw.client.put("/v1/deployments/capt/capture", json={"rate": 1.5})
    assert bad.status_code == 400 and "--rate must be in (0, 1]" in bad.json()["detail"]


def test_label_from_the_robot_lands_with_the_kept_episode(capt):
    gw = capt
    _capture(gw, "capt", body={"rate": 1.0})
    rows = []
    with sequence_ai.connect("capt", api_key=gw.api_key, gateway_url=gw.url) as policy:
        out = policy.act("stack the blocks", observe=lambda: observation("stack the blocks"), act=rows.append,
                         max_seconds=0.8, validate=lambda a: True)
        assert out.chunks >= 1
        episode = policy.last_episode_id
        steps = _kept(gw, "capt", episode, out.chunks)
        res = policy.label(success=True, notes="stacked")
        assert res["kept"] is True and res["success"] is True
        policy.label(success=False, notes="dropped it", episode_id="ep-a")
    labels = gw.data_dir / "capture" / "capt" / "labels"
    assert json.loads((labels / f"{episode}.json").read_text())["notes"] == "stacked"
    assert json.loads((labels / "ep-a.json").read_text())["success"] is False
    assert all(s["observation"]["instruction"] == "stack the blocks" for s in steps)
    assert gw.client.get("/v1/deployments/capt/capture").json()["labeled"] == 2


def test_export_lerobot_one_frame_per_act_with_task_and_success(capt, tmp_path):
    gw = capt
    _capture(gw, "capt", body={"off": True})
    episodes = sorted((gw.data_dir / "capture" / "capt" / "episodes").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    counts = [len(p.read_text().splitlines()) for p in episodes]
    for version in ("3.0", "2.1"):
        out = tmp_path / f"ds-{version}"
        if version == "3.0":
            r = seq_cli(gw, "policy", "data", "export", "capt", "--format", "lerobot", "--version", "3.0", "--out", str(out))
            assert r.returncode == 0, r.stderr
            assert f"exported {len(episodes)} episodes ({sum(counts)} frames" in r.stdout and "LeRobot v3.0" in r.stdout
        else:   # what the documented default (no --version) sends
            gw.client.post("/v1/deployments/capt/capture/export", timeout=120,
                           json={"format": "lerobot", "out": str(out)}).raise_for_status()
        info = json.loads((out / "meta" / "info.json").read_text())
        assert info["codebase_version"] == f"v{version}"
        assert info["total_episodes"] == len(episodes) and info["total_frames"] == sum(counts)
        assert info["features"]["observation.state"]["shape"] == [8]
        assert info["features"]["action"]["shape"] == [8]
        data = sorted(out.glob("data/**/*.parquet"))
        assert len(data) == len(episodes)
        tables = [pq.read_table(p).to_pydict() for p in data]
        assert [len(t["frame_index"]) for t in tables] == counts
        by_index = {t["episode_index"][0]: t for t in tables}
        a = by_index[0]                                  # ep-a: labeled success=False, oldest
        assert a["action"][0][0] >= 1 and a["observation.state"][2][:7] == [2.0] * 7
        assert not any(a["next.success"])
        lab = by_index[len(episodes) - 1]                # the robot's run: labeled success=True, newest
        assert lab["next.success"][-1] is True and not any(lab["next.success"][:-1])
        if version == "3.0":
            tasks = pq.read_table(out / "meta" / "tasks.parquet").column("task").to_pylist()
            assert "stack the blocks" in tasks and "put the red cube on the green pad" in tasks
        else:
            tasks = [json.loads(x)["task"] for x in (out / "meta" / "tasks.jsonl").read_text().splitlines()]
            assert "stack the blocks" in tasks and "put the red cube on the green pad" in tasks
    again = gw.client.post("/v1/deployments/capt/capture/export", json={"out": str(tmp_path / "ds-3.0")})
    assert again.status_code == 400 and "not empty" in again.json()["detail"]
    j = tmp_path / "jsonl"
    r = seq_cli(gw, "policy", "data", "export", "capt", "--format", "jsonl", "--out", str(j))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (j / "episodes").glob("*.jsonl")) == sorted(p.name for p in episodes)
    assert (j / "episodes" / "ep-a.jsonl").read_text() == episodes[0].read_text()
    assert json.loads((j / "labels" / "ep-a.json").read_text())["success"] is False


def test_data_export_writes_the_documented_lerobot_v2_1_unless_version_3_0_is_asked(capt, tmp_path):
    """`seq policy data export NAME --format lerobot --out DIR` writes a LeRobot v2.1 dataset (what
    the platform documents, and what lerobot before 0.4 reads); `--version 3.0` the newer format."""
    gw = capt
    if not any((gw.data_dir / "capture" / "capt" / "episodes").glob("*.jsonl")):   # run on its own
        _capture(gw, "capt", "--rate", "1.0")
        Robot(gw, "capt").act("ep-v", params={"chunk_len": 2}, obs=echo_observation())
        _kept(gw, "capt", "ep-v", 1)
    default = tmp_path / "default"
    r = seq_cli(gw, "policy", "data", "export", "capt", "--format", "lerobot", "--out", str(default))
    assert r.returncode == 0, r.stderr
    assert "as LeRobot v2.1 to" in r.stdout
    assert json.loads((default / "meta" / "info.json").read_text())["codebase_version"] == "v2.1"
    assert (default / "meta" / "episodes.jsonl").is_file() and (default / "meta" / "tasks.jsonl").is_file()
    newer = tmp_path / "v3"
    r = seq_cli(gw, "policy", "data", "export", "capt", "--format", "lerobot", "--version", "3.0", "--out", str(newer))
    assert r.returncode == 0, r.stderr
    assert json.loads((newer / "meta" / "info.json").read_text())["codebase_version"] == "v3.0"
    assert (newer / "meta" / "tasks.parquet").is_file()


def test_retention_deletes_episodes_older_than_the_retention(capt):
    gw = capt
    d = gw.data_dir / "capture" / "capt"
    before = gw.client.get("/v1/deployments/capt/capture").json()["episodes"]
    old = time.time() - 31 * 86400
    os.utime(d / "episodes" / "ep-a.jsonl", (old, old))
    after = gw.client.get("/v1/deployments/capt/capture").json()
    assert after["episodes"] == before - 1
    assert not (d / "episodes" / "ep-a.jsonl").exists() and not (d / "labels" / "ep-a.json").exists()


def test_images_are_kept_with_images_and_rm_deletes_the_capture(capt, tmp_path):
    gw = capt
    d = gw.data_dir / "capture" / "capt"
    for p in (gw.data_dir / "capture" / "capt" / "episodes").glob("*.jsonl"):   # start empty: age out the rest
        os.utime(p, (time.time() - 40 * 86400,) * 2)
    assert gw.client.get("/v1/deployments/capt/capture").json()["episodes"] == 0
    assert _capture(gw, "capt", "--rate", "1", "--images", "--retention-days", "7") < 60
    robot = Robot(gw, "capt")
    pngs = [png_b64(color=(10 * i, 0, 0)) for i in range(3)]
    for i, data in enumerate(pngs):
        robot.act("img-ep", obs=echo_observation(views={"exterior_1": data}))
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (0, 200, 0)).save(buf, format="JPEG", quality=95)
    jpeg = buf.getvalue()
    obs = echo_observation()
    obs["images"] = [{"view": "exterior_1", "data": jpeg, "timestamp_ms": 5}]
    content, content_type = encode_act_body({"observation": obs, "episode_id": "img-ep"}, binary=True)
    r = robot.http.post("/act", content=content, headers={"Content-Type": content_type})
    assert r.status_code == 200, r.text
    lines = _kept(gw, "capt", "img-ep", 4)
    files = [line["observation"]["images"][0]["file"] for line in lines]
    assert [(d / f).read_bytes() for f in files[:3]] == [base64.b64decode(p) for p in pngs]
    assert (d / files[3]).read_bytes() == jpeg and files[3].endswith(".jpg")
    out = tmp_path / "img-ds"
    r = seq_cli(gw, "policy", "data", "export", "capt", "--out", str(out))
    assert r.returncode == 0, r.stderr
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["total_frames"] == 4 and info["features"]["observation.images.exterior_1"]["shape"][:2] == [64, 64]
    import av
    video = next(out.glob("videos/**/*.mp4"))
    with av.open(str(video)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 4 and frames[0][32, 32, 0] < 40 and frames[3][32, 32, 1] > 150
    r = seq_cli(gw, "policy", "rm", "capt", "--force")
    assert r.returncode == 0, r.stderr
    assert not d.exists()


def test_a_full_capture_queue_drops_steps_instead_of_blocking_act(tmp_path, monkeypatch):
    import threading

    from sequence_ai_server.worker import capture as cap
    gate = threading.Event()
    monkeypatch.setattr(cap.CaptureWriter, "_write", lambda self, *a: gate.wait(30))
    (tmp_path / "config.json").write_text(json.dumps({"enabled": True, "rate": 1.0}))
    w = cap.CaptureWriter(tmp_path, poll_s=0.05)
    raw = json.dumps({"observation": echo_observation()}).encode()
    first = w.offer(raw, "application/json", "e", {}, {"actions": [[0.0]]}, "r0", 1.0)
    deadline = time.monotonic() + 10
    while w._queue.qsize() and time.monotonic() < deadline:   # the writer holds the first step
        time.sleep(0.01)
    taken = [w.offer(raw, "application/json", "e", {}, {"actions": [[0.0]]}, f"r{i}", 1.0)
             for i in range(cap.QUEUE_MAX + 50)]
    assert first and sum(taken) == cap.QUEUE_MAX and w.dropped == 50
    gate.set()
    w.close()


def test_the_worker_writer_enforces_retention_on_its_own(tmp_path):
    from sequence_ai_server.worker import capture as cap
    (tmp_path / "episodes").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"enabled": True, "rate": 1.0, "retention_days": 2}))
    for ep, age_days in (("old", 3), ("young", 1)):
        p = tmp_path / "episodes" / f"{ep}.jsonl"
        p.write_text(json.dumps({"episode_id": ep, "step": 0}) + "\n")
        os.utime(p, (time.time() - age_days * 86400,) * 2)
    w = cap.CaptureWriter(tmp_path, poll_s=0.05)
    deadline = time.monotonic() + 10
    while (tmp_path / "episodes" / "old.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    w.close()
    assert sorted(p.stem for p in (tmp_path / "episodes").glob("*.jsonl")) == ["young"]
