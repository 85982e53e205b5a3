"""Paths that reach the file system stay where they belong: volume names and upload paths never
leave ``<data_dir>/volumes`` (a link planted under the root does not redirect a write or an rm),
eval videos stay in the eval's folder whatever a benchmark names its tasks, and eval ids cannot
name another folder. Real gateway process for the volume routes."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from sequence_ai_eval.runner import EvalError, _write_gif, video_path
from sequence_ai_data.evals import EvalNotFound, EvalStore


def _manifest(files: dict) -> list:
    return [{"path": p, "size": len(b), "md5": hashlib.md5(b).hexdigest()} for p, b in files.items()]


def test_volume_names_and_upload_paths_cannot_escape_the_volumes_root(module_gateway, tmp_path):
    gw = module_gateway
    c = gw.client
    for name in ("..", ".hidden", "a/b", "-x"):
        r = c.post(f"/v1/volumes/{name}/uploads", json={"files": _manifest({"a.bin": b"1"})})
        assert r.status_code in (400, 404), (name, r.status_code, r.text)
    for bad in ("../escape.bin", "/etc/passwd", "a/../../b", "./a", "a//b", "a\\b"):
        r = c.post("/v1/volumes/ok/uploads", json={"files": _manifest({bad: b"1"})})
        assert r.status_code == 400 and r.json()["code"] == "invalid_request", (bad, r.text)
    assert not (gw.data_dir / "escape.bin").exists() and not (gw.data_dir / "volumes" / "ok").exists()
    r = c.post("/v1/volumes/ok/uploads", json={"files": _manifest({"w/a.bin": b"abc"})})
    assert r.status_code == 200, r.text
    v = r.json()["version"]
    r = c.put(f"/v1/volumes/ok/uploads/{v}", params={"path": "../../../escape.bin", "offset": 0}, content=b"abc")
    assert r.status_code == 400 and not (gw.data_dir / "escape.bin").exists()
    assert c.delete("/v1/volumes/..").status_code in (400, 404)
    assert c.delete("/v1/volumes/%2E%2E").status_code in (400, 404)
    assert (gw.data_dir / "volumes").is_dir() and (gw.data_dir / "state.db").exists()


def test_a_link_planted_in_an_upload_does_not_redirect_the_write(module_gateway, tmp_path):
    gw = module_gateway
    c = gw.client
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.bin").write_bytes(b"keep")
    r = c.post("/v1/volumes/linked/uploads", json={"files": _manifest({"w/a.bin": b"new"})})
    assert r.status_code == 200, r.text
    v = r.json()["version"]
    staging = gw.data_dir / "volumes" / "linked" / f".upload-v{v}"
    (staging / "w").symlink_to(outside)          # someone with shell access plants a link
    r = c.put(f"/v1/volumes/linked/uploads/{v}", params={"path": "w/a.bin", "offset": 0}, content=b"new")
    assert r.status_code == 400 and "outside the volumes root" in r.json()["detail"], r.text
    assert (outside / "a.bin").read_bytes() == b"keep"


def test_removing_a_volume_whose_folder_is_a_link_deletes_nothing_behind_it(module_gateway, tmp_path):
    gw = module_gateway
    c = gw.client
    data = b"weights"
    r = c.post("/v1/volumes/swapped/uploads", json={"files": _manifest({"a.bin": data})})
    v = r.json()["version"]
    assert c.put(f"/v1/volumes/swapped/uploads/{v}", params={"path": "a.bin", "offset": 0}, content=data).status_code == 200
    assert c.post(f"/v1/volumes/swapped/uploads/{v}/complete").status_code == 200
    root = gw.data_dir / "volumes" / "swapped"
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "precious.txt").write_text("mine")
    os.chmod(victim / "sub", 0o700)
    moved = tmp_path / "moved-volume"
    os.chmod(root / f"v{v}", 0o755)
    root.rename(moved)
    root.symlink_to(victim)                      # the volume's folder now points somewhere else
    r = c.delete("/v1/volumes/swapped")
    assert r.status_code == 400, r.text
    assert "outside the volumes root" in r.json()["detail"] and str(root) in r.json()["detail"]
    assert (victim / "sub" / "precious.txt").read_text() == "mine"
    assert os.stat(victim / "sub").st_mode & 0o777 == 0o700      # not even chmod-ed
    root.unlink()
    moved.rename(root)
    assert c.delete("/v1/volumes/swapped").json() == {"name": "swapped", "removed": True}
    assert not root.exists()


@pytest.mark.parametrize("arm,task", [("pol", "../../../escape"), ("..", ".."), ("pol[x=../..]", "/abs/path"),
                                      ("pol", ".hidden"), ("", "")])
def test_eval_videos_stay_in_the_videos_folder_whatever_the_names(tmp_path, arm, task):
    videos = tmp_path / "evals" / "ev-1" / "videos"
    path = video_path(videos, arm, task, 3)
    assert videos.resolve() in path.resolve().parents
    assert path.parent.parent == videos and not path.name.startswith(".") and path.name.endswith("_seed3.gif")
    _write_gif([np.zeros((8, 8, 3), np.uint8), np.full((8, 8, 3), 255, np.uint8)], path, 10.0)
    assert path.read_bytes()[:6] == b"GIF89a"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]    # no temp file left
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [path]


def test_an_eval_video_refuses_a_link_out_of_the_videos_folder(tmp_path):
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "pol").symlink_to(tmp_path)
    with pytest.raises(EvalError, match="outside the eval's videos folder"):
        video_path(videos, "pol", "reach", 0)


@pytest.mark.parametrize("eval_id", ["", "..", ".", "../x", "a/b", "a\\b", "a\x00b", ".hidden"])
def test_an_eval_id_cannot_name_another_folder(tmp_path, eval_id):
    with pytest.raises(EvalNotFound):
        EvalStore(tmp_path).folder(eval_id)
