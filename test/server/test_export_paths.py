"""Capture export targets: only an account key exports, and the server never deletes a folder it
did not create. Real gateway process and echo-policy worker; the kept episodes are real /acts.

An ``--overwrite`` (or lerobot ``--append``) replaces only an earlier export made by this server
(its signed ``.sequence-ai-export.json``); never the data dir, a folder inside it, one of its
ancestors, a link to any of those, or a folder someone else filled. A failed export leaves the
earlier one as it was.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest

from _export_support import MARKER
from _export_support import tree as _tree
from _servers import ECHO_POLICY, GatewayProcess, echo_observation


def _names(root: Path) -> set:
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    """A gateway whose deployment ``capt`` kept two real episodes (3 and 2 /acts)."""
    g = GatewayProcess.start(tmp_path_factory.mktemp("export"), env={"SEQ_CAPTURE_POLL_S": "0.5"})
    try:
        assert g.deploy(ECHO_POLICY, "capt")["status"] == "ready"
        g.client.put("/v1/deployments/capt/capture", json={"rate": 1.0}).raise_for_status()
        c = g.connect_ready("capt")
        robot = httpx.Client(base_url=c["worker_url"], headers={"Authorization": f"Bearer {c['direct_secret']}"},
                             timeout=30)
        episodes = g.data_dir / "capture" / "capt" / "episodes"
        deadline = time.monotonic() + 60
        while True:   # until the worker has re-read the settings and keeps what it gets
            r = robot.post("/act", json={"observation": echo_observation(), "episode_id": "probe"})
            assert r.status_code == 200, r.text
            if (episodes / "probe.jsonl").exists():
                break
            assert time.monotonic() < deadline, "the worker never started keeping episodes"
            time.sleep(0.2)
        for ep, n in (("ep-a", 3), ("ep-b", 2)):
            for _ in range(n):
                assert robot.post("/act", json={"observation": echo_observation(), "episode_id": ep}).status_code == 200
        deadline = time.monotonic() + 30
        while not all((episodes / f"{ep}.jsonl").exists() and len((episodes / f"{ep}.jsonl").read_text().splitlines()) == n
                      for ep, n in (("ep-a", 3), ("ep-b", 2))):
            assert time.monotonic() < deadline, "the kept episodes did not reach the disk"
            time.sleep(0.1)
        robot.close()
        r = g.client.post("/v1/keys", json={"name": "arm-1", "deployment": "capt"})
        r.raise_for_status()
        g.robot_key = r.json()["key"]
        yield g
    finally:
        g.close()


def _export(gw, out, mode="overwrite", fmt="jsonl", key=None, **extra):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    client = httpx.Client(base_url=gw.url, headers=headers, timeout=120) if key else gw.client
    return client.post("/v1/deployments/capt/capture/export", json={"format": fmt, "out": str(out), "mode": mode, **extra},
                       timeout=120)


def test_a_robot_key_cannot_export_and_the_folder_is_untouched(gw, tmp_path):
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "keep.txt").write_text("mine")
    (victim / "sub" / "deep.bin").write_bytes(b"\x00\x01")
    before, state = _tree(victim), _names(gw.data_dir)
    for out in (victim, gw.data_dir):
        r = _export(gw, out, key=gw.robot_key)
        assert r.status_code == 401, r.text
        assert r.json()["code"] == "unauthorized" and r.json()["details"]["reason"] == "key_bound"
    assert _tree(victim) == before
    assert state <= _names(gw.data_dir) and (gw.data_dir / "state.db").exists()


def test_overwrite_refuses_the_data_dir_its_ancestors_descendants_links_and_foreign_folders(gw, tmp_path):
    data = gw.data_dir.resolve()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("not an export")
    forged = tmp_path / "forged"            # an export marker copied from a real export does not count
    real = tmp_path / "real"
    assert _export(gw, real, mode="new").status_code == 200
    forged.mkdir()
    shutil.copy(real / MARKER, forged / MARKER)
    (forged / "precious.txt").write_text("x")
    link = tmp_path / "link-to-home"
    link.symlink_to(data)
    a_file = tmp_path / "a-file"
    a_file.write_text("a file")
    cases = [
        (data, "is the server's data dir"),
        (data.parent, "is an ancestor of the server's data dir"),
        (Path("/"), "is an ancestor of the server's data dir"),
        (data / "versions", "is inside the server's data dir"),
        (data / "capture" / "capt", "is inside the server's data dir"),
        (data / "new-folder", "is inside the server's data dir"),
        (link, "is the server's data dir"),
        (data.parent / "x" / ".." / data.name, "is the server's data dir"),
        (foreign, "is not an earlier export of this server"),
        (forged, "is not an earlier export of this server"),
        (a_file, "is a file"),
    ]
    snapshot = {p: _tree(p) for p in (foreign, forged)}
    home = _names(data)
    for out, rule in cases:
        for fmt, mode in (("jsonl", "overwrite"), ("lerobot", "overwrite"), ("lerobot", "append"), ("jsonl", "new")):
            r = _export(gw, out, mode=mode, fmt=fmt)
            if mode == "new" and rule == "is not an earlier export of this server":
                assert r.status_code == 400 and "not empty" in r.json()["detail"], r.text
                continue
            assert r.status_code == 400, (out, fmt, mode, r.text)
            body = r.json()
            assert body["code"] == "invalid_request" and str(out) in body["detail"] and rule in body["detail"], body
            assert "refused" in body["detail"] and ("Pick" in body["detail"] or "pick" in body["detail"])
    assert {p: _tree(p) for p in (foreign, forged)} == snapshot
    assert home <= _names(data)
    for f in ("state.db", "api_key", "versions", "capture/capt/episodes/ep-a.jsonl"):
        assert (data / f).exists(), f
    assert a_file.read_text() == "a file" and not (data / "new-folder").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a staging folder was left behind"


def test_an_earlier_export_is_replaced_and_a_failed_export_leaves_it_as_it_was(gw, tmp_path):
    out = tmp_path / "ds"
    r = _export(gw, out, mode="new", fmt="lerobot")
    assert r.status_code == 200, r.text
    marker = json.loads((out / MARKER).read_text())
    assert marker["path"] == str(out.resolve()) and marker["format"] == "lerobot" and marker["deployment"] == "capt"
    info = json.loads((out / "meta" / "info.json").read_text())
    assert info["total_episodes"] == 3 and info["total_frames"] >= 6
    # overwrite with jsonl: the folder now holds exactly the new export
    r = _export(gw, out, mode="overwrite", fmt="jsonl")
    assert r.status_code == 200 and r.json()["episodes"] == 3, r.text
    assert not (out / "meta").exists() and (out / "episodes" / "ep-a.jsonl").exists()
    assert json.loads((out / MARKER).read_text())["export_id"] != marker["export_id"]
    before = _tree(out)
    # a lerobot overwrite that fails while writing (fps 2.5: LeRobot needs an integer) changes nothing
    r = _export(gw, out, mode="overwrite", fmt="lerobot", fps=2.5)
    assert r.status_code == 400 and "fps 2.5" in r.json()["detail"], r.text
    assert _tree(out) == before
    # append needs an earlier lerobot export: this one is jsonl, so it fails and changes nothing either
    r = _export(gw, out, mode="append", fmt="lerobot")
    assert r.status_code == 400, r.text
    assert _tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"], "a staging folder was left behind"


def test_lerobot_append_adds_to_an_earlier_export_and_an_empty_folder_keeps_its_inode(gw, tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    inode = out.stat().st_ino
    r = _export(gw, out, mode="new", fmt="lerobot")
    assert r.status_code == 200, r.text
    assert out.stat().st_ino == inode and (out / MARKER).exists()
    first = json.loads((out / "meta" / "info.json").read_text())["total_episodes"]
    r = _export(gw, out, mode="append", fmt="lerobot")
    assert r.status_code == 200, r.text
    assert json.loads((out / "meta" / "info.json").read_text())["total_episodes"] == 2 * first
    assert r.json()["added_episodes"] == first
    # an export moved elsewhere is no longer this server's export there: its marker names the old path
    moved = tmp_path / "moved"
    out.rename(moved)
    r = _export(gw, moved, mode="overwrite")
    assert r.status_code == 400 and "is not an earlier export of this server" in r.json()["detail"]
    assert (moved / "meta" / "info.json").exists()
