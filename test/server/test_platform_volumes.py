"""Volumes (issue 5): `seq volume put NAME DIR` uploads a directory as the next version (md5
checked before it becomes active; an interrupted put resumes), `ls` lists them, a policy with
weights="vol://NAME[@vN]" gets that version's read-only directory in @seq.load, and `rm` is
refused while a deployment uses the volume. Real gateway, workers and `seq` CLI."""
from __future__ import annotations

import hashlib
import stat
from pathlib import Path

import httpx

from _servers import POLICIES, seq_cli

VOLUME_POLICY = str(POLICIES / "volume_policy.py")


def _checkpoint(tmp: Path, scale: float, bias: float, big: int = 0) -> Path:
    d = tmp / f"ckpt-{scale}"
    (d / "nested").mkdir(parents=True)
    (d / "scale.txt").write_text(str(scale))
    (d / "nested" / "bias.txt").write_text(str(bias))
    if big:
        (d / "blob.bin").write_bytes(bytes(range(256)) * (big // 256))
    return d


def _rows(conn: dict) -> list:
    r = httpx.post(conn["worker_url"] + "/act", json={"observation": {"proprioception": {"joint_positions": [0, 0]},
                                                                      "instruction": "x"}},
                   headers={"Authorization": f"Bearer {conn['direct_secret']}"}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["action_chunk"]["actions"]


def test_a_policy_loads_its_weights_from_an_uploaded_volume_version(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    r = seq_cli(gw, "volume", "put", "ckpt", str(_checkpoint(tmp_path, 2.5, 0.5, big=3 * 1024 * 1024)), "--chunk-mb", "1")
    assert r.returncode == 0, r.stderr
    assert "uploaded ckpt v1: 3 files" in r.stdout and 'weights="vol://ckpt@v1"' in r.stdout
    r = seq_cli(gw, "volume", "put", "ckpt", str(_checkpoint(tmp_path, 7.0, -1.0)))
    assert r.returncode == 0 and "uploaded ckpt v2: 2 files" in r.stdout
    v1 = gw.data_dir / "volumes" / "ckpt" / "v1"
    assert stat.S_IMODE((v1 / "scale.txt").stat().st_mode) == 0o444 and stat.S_IMODE(v1.stat().st_mode) == 0o555

    assert gw.deploy(VOLUME_POLICY, "vol-newest")["status"] == "ready"
    assert _rows(gw.connect_ready("vol-newest")) == [[7.0, -1.0]] * 3        # vol://ckpt: the newest version
    pinned = tmp_path / "pinned" / "volume_policy.py"
    pinned.parent.mkdir()
    pinned.write_text("import os\nos.environ['VOLUME_URI'] = 'vol://ckpt@v1'\n" + Path(VOLUME_POLICY).read_text())
    assert gw.deploy(str(pinned), "vol-pinned")["status"] == "ready"
    assert _rows(gw.connect_ready("vol-pinned")) == [[2.5, 0.5]] * 3         # vol://ckpt@v1

    r = seq_cli(gw, "volume", "ls")
    assert r.returncode == 0 and "ckpt" in r.stdout and "v2, v1" in r.stdout and "vol-newest" in r.stdout
    r = seq_cli(gw, "volume", "rm", "ckpt")
    assert r.returncode == 5 and "error[invalid_request]: volume 'ckpt' is used by deployment(s)" in r.stderr
    assert seq_cli(gw, "policy", "rm", "vol-newest", "--force").returncode == 0
    assert seq_cli(gw, "policy", "rm", "vol-pinned", "--force").returncode == 0
    r = seq_cli(gw, "volume", "rm", "ckpt")
    assert r.returncode == 0 and not (gw.data_dir / "volumes" / "ckpt").exists()


def test_a_missing_volume_fails_the_load_and_says_how_to_upload_it(shared_module_gateway):
    gw = shared_module_gateway
    d = gw.deploy(VOLUME_POLICY, "vol-missing")
    assert d["status"] == "failed" and "no volume named 'ckpt'" in d["error"] and "seq volume put ckpt" in d["error"]
    # the CLI's hint points at the upload, not at the policy (which is fine)
    out = seq_cli(gw, "deploy", VOLUME_POLICY, "--name", "vol-missing-cli", "--wait")
    assert out.returncode == 6, out.stdout + out.stderr
    assert "hint: upload the weights first: `seq volume put ckpt DIR`" in out.stderr, out.stderr
    assert "fix the policy" not in out.stderr


def test_an_interrupted_put_resumes_and_a_bad_md5_never_becomes_active(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    src = _checkpoint(tmp_path, 1.0, 2.0, big=1024 * 1024)
    files = [{"path": p.relative_to(src).as_posix(), "size": p.stat().st_size,
              "md5": hashlib.md5(p.read_bytes()).hexdigest()} for p in sorted(src.rglob("*")) if p.is_file()]
    up = gw.client.post("/v1/volumes/resume/uploads", json={"files": files}).json()
    assert up["version"] == 1 and up["have"]["blob.bin"] == 0
    half = (src / "blob.bin").read_bytes()[: 512 * 1024]
    r = gw.client.put("/v1/volumes/resume/uploads/1", params={"path": "blob.bin", "offset": 0}, content=half)
    assert r.status_code == 200 and r.json()["size"] == len(half)
    r = gw.client.post("/v1/volumes/resume/uploads/1/complete")          # not all there yet
    assert r.status_code == 400 and "blob.bin: 524288 of 1048576 bytes arrived" in r.json()["detail"]
    r = seq_cli(gw, "volume", "put", "resume", str(src))                    # the same files: it resumes v1
    assert r.returncode == 0, r.stderr
    assert "resuming the upload of resume v1" in r.stderr and "uploaded resume v1" in r.stdout
    assert f"({1024 * 1024 - len(half) + 3 + 3} sent)" in r.stdout        # only the missing half, plus the small files
    # a corrupted file is refused at completion and the version stays inactive
    bad = [dict(f, md5="0" * 32) if f["path"] == "scale.txt" else f for f in files]
    up = gw.client.post("/v1/volumes/resume/uploads", json={"files": bad}).json()
    assert up["version"] == 2
    for f in files:
        data = (src / f["path"]).read_bytes()
        assert gw.client.put("/v1/volumes/resume/uploads/2", params={"path": f["path"], "offset": 0},
                             content=data).status_code == 200
    r = gw.client.post("/v1/volumes/resume/uploads/2/complete")
    assert r.status_code == 400 and "scale.txt: md5" in r.json()["detail"] and "does not match" in r.json()["detail"]
    listed = gw.client.get("/v1/volumes").json()["volumes"]
    assert [(v["name"], v["version"], v["versions"], v["uploading"]) for v in listed] == [("resume", 1, [1], [2])]
    r = gw.client.post("/v1/volumes/resume/uploads", json={"files": [{"path": "../x", "size": 1, "md5": "0" * 32}]})
    assert r.status_code == 400 and "'..'" in r.json()["detail"]


def test_a_manifest_path_longer_than_the_file_system_takes_is_refused_with_a_typed_error(shared_module_gateway):
    """A name over 255 bytes (or a path over 2048) is invalid_request naming the limit, not a
    500 from the file system; the gateway serves on."""
    gw = shared_module_gateway
    for path in ("x" * 256, "a/" + "é" * 128, "/".join(["d" * 200] * 11)):
        r = gw.client.post("/v1/volumes/longnames/uploads", json={"files": [{"path": path, "size": 1, "md5": "0" * 32}]})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "invalid_request" and "too long" in r.json()["detail"] and r.json()["hint"]
    r = gw.client.post("/v1/volumes/longnames/uploads", json={"files": [{"path": "x" * 255, "size": 1, "md5": "0" * 32}]})
    assert r.status_code == 200 and r.json()["version"] == 1


def test_a_manifest_naming_a_path_as_both_file_and_folder_is_refused_up_front(shared_module_gateway):
    """``a`` and ``a/b`` cannot both be files; begin says so (before, the second write was a 500)."""
    gw = shared_module_gateway
    files = [{"path": "w/a", "size": 1, "md5": "0" * 32}, {"path": "w/a/b", "size": 1, "md5": "0" * 32}]
    r = gw.client.post("/v1/volumes/clash/uploads", json={"files": files})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert "w/a is both a file and a folder" in r.json()["detail"]
