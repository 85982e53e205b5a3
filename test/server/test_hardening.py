"""Hardening found by an adversarial tester, each against real gateway / worker processes:

* one gateway per data dir (an flock on ``<data_dir>/gateway.lock``): a second one refuses at
  once naming the holder; after a SIGKILL of the holder a new one starts;
* a stopped deployment runs no worker after a deploy or a rollback, until ``start``;
* a label's notes are capped and labels of episodes not kept are bounded per deployment;
* a JSON string holding a NUL or a lone surrogate is 400 ``invalid_request`` naming its JSON
  path, on every route listed (never a 500), and volume manifest sizes are bounded;
* an export ``out`` with ``~`` is refused; a CLI path argument too long for a URL ends in an
  ``error[...]`` line, not a traceback.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from _servers import ECHO_POLICY, GatewayProcess, WorkerProcess, _env, echo_observation

# ---------------------------------------------------------------- one gateway per data dir


def test_second_gateway_on_one_data_dir_refuses_and_a_sigkilled_holder_frees_it(tmp_path):
    (tmp_path / "a").mkdir()
    first = GatewayProcess.start(tmp_path / "a")       # a fresh data dir: no worker recorded
    try:
        second_tmp = tmp_path / "b"
        second_tmp.mkdir()
        log = second_tmp / "gateway.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "sequence_ai_server.gateway", "--port", "0",
                                     "--data-dir", str(first.data_dir), "--ready-file", str(second_tmp / "ready.json")],
                                    stdout=out, stderr=subprocess.STDOUT, env=_env())
        rc = proc.wait(30)
        text = log.read_text()
        assert rc != 0 and not (second_tmp / "ready.json").exists(), text
        assert "DataDirInUse" in text and f"pid {first.proc.pid}" in text and f"port {first.info['port']}" in text, text
        assert first.client.get("/healthz").status_code == 200          # the holder is untouched
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        ready = tmp_path / "third.ready.json"
        with open(tmp_path / "third.log", "wb") as out:
            p3 = subprocess.Popen([sys.executable, "-m", "sequence_ai_server.gateway", "--port", "0",
                                   "--data-dir", str(first.data_dir), "--ready-file", str(ready)],
                                  stdout=out, stderr=subprocess.STDOUT, env=_env())
        try:
            deadline = time.monotonic() + 30
            while not ready.exists():
                assert p3.poll() is None, (tmp_path / "third.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "third.log").read_text()
                time.sleep(0.05)
            info = json.loads(ready.read_text())
            assert httpx.get(info["url"] + "/healthz").status_code == 200
            holder = json.loads((first.data_dir / "gateway.lock").read_text())
            assert holder == {"pid": p3.pid, "port": info["port"]}
        finally:
            p3.send_signal(signal.SIGTERM)
            p3.wait(30)
    finally:
        first.client.close()
        if first.proc.poll() is None:
            first.close()


def test_seq_serve_says_which_is_busy_and_a_busy_port_creates_no_key(tmp_path):
    (tmp_path / "a").mkdir()
    first = GatewayProcess.start(tmp_path / "a")

    def serve(*args):
        return subprocess.run([sys.executable, "-c", "from seq.cli import main; main()", "serve", "--host",
                               "127.0.0.1", *args], capture_output=True, text=True, env=_env(), timeout=60,
                              cwd=str(tmp_path))
    try:
        # the data dir is held: the hint is about the data dir, not the port
        r = serve("--port", "0", "--data-dir", str(first.data_dir))
        assert r.returncode != 0 and "DataDirInUse" in r.stderr and f"pid {first.proc.pid}" in r.stderr, r.stderr
        hint = r.stderr.split("hint: ", 1)[1]
        assert "another --data-dir" in hint and "--port" not in hint, r.stderr
        # the port is held: the hint is about the port, and neither a new nor an empty data dir
        # gets a key, a store or a log (the new one is not left behind at all)
        new, empty = tmp_path / "new", tmp_path / "empty"
        empty.mkdir()
        for data_dir in (new, empty):
            r = serve("--port", str(first.info["port"]), "--data-dir", str(data_dir))
            assert r.returncode != 0 and f"cannot serve on 127.0.0.1:{first.info['port']}" in r.stderr, r.stderr
            hint = r.stderr.split("hint: ", 1)[1]
            assert "pick another --port" in hint and "--data-dir" not in hint, r.stderr
        assert not new.exists()
        assert sorted(p.name for p in empty.iterdir()) == ["gateway.lock"]      # the lock it took, nothing else
        assert first.client.get("/healthz").status_code == 200                # the holder is untouched
    finally:
        first.close()


def test_workers_started_by_a_gateway_do_not_hold_its_lock(tmp_path):
    gw = GatewayProcess.start(tmp_path)
    try:
        d = gw.deploy(ECHO_POLICY, "echo")
        assert d["status"] == "ready"
        lock = str((gw.data_dir / "gateway.lock").resolve())
        holders = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                fds = [os.readlink(f) for f in (proc / "fd").iterdir()]
            except OSError:
                continue
            if lock in fds:
                holders.append(int(proc.name))
        assert _worker_pids(gw.data_dir), "no worker runs"
        assert holders == [gw.proc.pid], holders
    finally:
        gw.close()


# ---------------------------------------------------------------- stopped stays stopped

POLICY_V2 = "\n# v2: a changed file is a new version\n"


def _worker_pids(data_dir: Path) -> list[int]:
    """Live worker processes of ``data_dir`` (their command line names its run/ ready file)."""
    run = str(data_dir / "run")
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sequence_ai_server.worker" in argv and any(a.decode(errors="replace").startswith(run) for a in argv):
            out.append(int(proc.name))
    return out


def _no_worker_for(data_dir: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert _worker_pids(data_dir) == [], "a worker runs while the deployment is stopped"
        time.sleep(0.1)


@pytest.mark.parametrize("how", ["deploy", "rollback"])
def test_deploy_or_rollback_while_stopped_starts_no_worker_until_start(shared_gateway, tmp_path, how):
    gw, name = shared_gateway, f"echo-{how}"        # the session's gateway: nothing else deployed
    src = tmp_path / "policy_src"
    src.mkdir()
    pol = src / "echo_policy.py"
    shutil.copy(ECHO_POLICY, pol)
    assert gw.deploy(str(pol), name)["status"] == "ready"
    pol.write_text(Path(ECHO_POLICY).read_text() + POLICY_V2)
    d2 = gw.deploy(str(pol), name)
    assert d2["version"] == 2 and (d2.get("build") or {}).get("status") in (None, "ready"), d2
    gw.client.delete(f"/v1/deployments/{name}").raise_for_status()        # `seq policy stop`
    assert _worker_pids(gw.data_dir) == []
    if how == "deploy":
        pol.write_text(Path(ECHO_POLICY).read_text() + POLICY_V2 + "# v3\n")
        r = gw.client.post("/v1/deployments", json={"name": name, "file": str(pol)})
        want = 3
    else:
        r = gw.client.post(f"/v1/deployments/{name}/rollback", json={"to": 1})
        want = 1
    assert r.status_code == 200, r.text
    assert r.json()["version"] == want and r.json()["status"] == "stopped", r.json()
    _no_worker_for(gw.data_dir, 1.5)                    # fifteen control ticks: no worker starts
    d = gw.status(name)
    assert d["status"] == "stopped" and d["version"] == want, d
    refused = gw.connect(name)
    assert refused.status_code == 503 and refused.json()["code"] == "deployment_stopped", refused.text
    gw.client.post(f"/v1/deployments/{name}/start").raise_for_status()
    body = gw.connect_ready(name)
    assert gw.status(name)["version"] == want
    assert body["version"] == want if "version" in body else True
    assert len(_worker_pids(gw.data_dir)) == 1


# ---------------------------------------------------------------- labels

@pytest.fixture(scope="module")
def robot_gw(tmp_path_factory):
    g = GatewayProcess.start(tmp_path_factory.mktemp("hardening"), env={"SEQ_MAX_UNKEPT_LABELS": "5"})
    try:
        assert g.deploy(ECHO_POLICY, "echo")["status"] == "ready"
        r = g.client.post("/v1/keys", json={"name": "arm-1", "deployment": "echo"})
        r.raise_for_status()
        g.robot = httpx.Client(base_url=g.url, headers={"Authorization": f"Bearer {r.json()['key']}"}, timeout=30)
        yield g
        g.robot.close()
    finally:
        g.close()


def test_label_notes_are_capped(robot_gw):
    ok = robot_gw.robot.post("/v1/episodes/notes-ok/label", json={"model": "echo", "success": True, "notes": "n" * 4096})
    assert ok.status_code == 200, ok.text
    r = robot_gw.robot.post("/v1/episodes/notes-big/label", json={"model": "echo", "success": True, "notes": "n" * 4097})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert "4096" in r.json()["detail"]
    labels = robot_gw.data_dir / "capture" / "echo" / "labels"
    assert not (labels / "notes-big.json").exists()


def test_labels_of_unkept_episodes_are_bounded_but_kept_ones_are_not(robot_gw):
    labels = robot_gw.data_dir / "capture" / "echo" / "labels"
    episodes = robot_gw.data_dir / "capture" / "echo" / "episodes"
    episodes.mkdir(parents=True, exist_ok=True)
    n = 0
    while True:
        r = robot_gw.robot.post(f"/v1/episodes/flood-{n}/label", json={"model": "echo", "success": False})
        if r.status_code != 200:
            break
        n += 1
        assert n <= 5, "the bound of 5 labels was passed"
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert "5" in r.json()["detail"] and "not kept" in r.json()["detail"]
    unkept = [p for p in labels.glob("*.json") if not (episodes / f"{p.stem}.jsonl").exists()]
    assert len(unkept) == 5
    again = robot_gw.robot.post("/v1/episodes/flood-0/label", json={"model": "echo", "success": True})
    assert again.status_code == 200, again.text            # relabeling a stored one is not a new file
    (episodes / "kept-1.jsonl").write_text("{}\n")         # an episode the server kept
    kept = robot_gw.robot.post("/v1/episodes/kept-1/label", json={"model": "echo", "success": True})
    assert kept.status_code == 200 and kept.json()["kept"] is True, kept.text


# ---------------------------------------------------------------- NUL / lone surrogate strings

SURROGATE = '"\\ud800"'   # a JSON escape of a lone surrogate


def _post_raw(client: httpx.Client, path: str, text: str) -> httpx.Response:
    return client.post(path, content=text.encode(), headers={"Content-Type": "application/json"})


def _assert_bad_string(r: httpx.Response, path: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == "invalid_request" and body["details"]["path"] == path, body


@pytest.mark.parametrize("route,text,where", [
    ("/v1/connect", '{"model": %s}' % SURROGATE, "$.model"),
    ("/v1/connect", '{"model": "echo", "params": {"fail": %s}}' % SURROGATE, "$.params.fail"),
    ("/v1/episodes/e1/label", '{"model": %s, "success": true}' % SURROGATE, "$.model"),
    ("/v1/act", '{"model": %s, "observation": {}}' % SURROGATE, "$.model"),
    ("/v1/act", '{"model": "echo", "observation": {"instruction": %s}}' % SURROGATE, "$.observation.instruction"),
    ("/v1/keys", '{"name": "k", "deployment": %s}' % SURROGATE, "$.deployment"),
    ("/v1/deployments", '{"name": "x", "file": %s}' % SURROGATE, "$.file"),
    ("/v1/deployments", '{"name": "x", "file": "/tmp/a\\u0000b.py"}', "$.file"),
    ("/v1/deployments", '{"name": "x", "file": "/tmp/a.py", "class_name": "A\\u0000"}', "$.class_name"),
    ("/v1/deployments", '{"name": "x", "file": "/tmp/a.py", "class_name": %s}' % SURROGATE, "$.class_name"),
    ("/v1/deployments/echo/params", '{"params": {"fail": %s}}' % SURROGATE, "$.params.fail"),
    ("/v1/volumes/vol/uploads", '{"files": [{"path": %s, "size": 1, "md5": "%s"}]}' % (SURROGATE, "0" * 32),
     "$.files[0].path"),
])
def test_gateway_refuses_nul_and_lone_surrogate_strings(robot_gw, route, text, where):
    _assert_bad_string(_post_raw(robot_gw.client, route, text), where)


def test_gateway_refuses_raw_surrogate_bytes_too(robot_gw):
    raw = b'{"model": "\xed\xa0\x80"}'    # a surrogate encoded as UTF-8 bytes (json.loads accepts it)
    r = robot_gw.client.post("/v1/connect", content=raw, headers={"Content-Type": "application/json"})
    _assert_bad_string(r, "$.model")


def test_volume_manifest_sizes_are_bounded(robot_gw):
    r = robot_gw.client.post("/v1/volumes/vol/uploads",
                             json={"files": [{"path": "a.bin", "size": 2 ** 63, "md5": "0" * 32}]})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert str(2 ** 53) in r.json()["detail"]
    r = robot_gw.client.post("/v1/volumes/vol/uploads",
                             json={"files": [{"path": f"f{i}", "size": 2 ** 52, "md5": "0" * 32} for i in range(3)]})
    assert r.status_code == 400 and "at most" in r.json()["detail"], r.text


def test_worker_act_refuses_lone_surrogate_and_its_errors_render(tmp_path):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path)
    try:
        obs = json.dumps(echo_observation())
        text = '{"observation": %s, "params": {"fail": "\\ud800"}}' % obs
        r = w.client.post("/act", content=text.encode(), headers={"Authorization": f"Bearer {w.secret}",
                                                                   "Content-Type": "application/json"})
        _assert_bad_string(r, "$.params.fail")
        # the binary framing's JSON part is checked the same way
        import struct
        head = ('{"observation": %s, "episode_id": "a\\u0000"}' % obs).encode()
        r = w.client.post("/act", content=struct.pack(">I", len(head)) + head,
                          headers={"Authorization": f"Bearer {w.secret}",
                                   "Content-Type": "application/vnd.sequence-ai.act+bin"})
        _assert_bad_string(r, "$.episode_id")
        ok = w.act({"observation": echo_observation()})
        assert ok.status_code == 200, ok.text
    finally:
        w.stop()


def test_an_error_message_echoing_a_lone_surrogate_renders():
    from sequence_ai_server.common.errors import ApiError
    resp = ApiError("invalid_request", "unknown value '\ud800'", details={"v": "\udfff"}).response()
    body = json.loads(resp.body)
    assert resp.status_code == 400 and body["detail"] == "unknown value '\\ud800'" and body["details"] == {"v": "\\udfff"}


# ---------------------------------------------------------------- export out, CLI long argument

def test_export_out_with_tilde_is_refused(robot_gw):
    name = f"seq-export-{os.getpid()}-{time.monotonic_ns()}"      # no earlier run's folder there
    r = robot_gw.client.post("/v1/deployments/echo/capture/export", json={"format": "jsonl", "out": f"~/{name}"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert "absolute" in r.json()["detail"]
    assert not (Path.home() / name).exists()


def test_cli_path_argument_too_long_for_a_url_is_an_error_line(robot_gw):
    p = subprocess.run([sys.executable, "-m", "seq", "keys", "revoke", "k" * 100_000], capture_output=True, text=True,
                       env=_env(robot_gw.env()), timeout=60)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr and "error[invalid_request]" in p.stderr, p.stderr[-2000:]
