"""Versions (issue 5, part 4): a deploy builds the new version beside the serving one, robots
keep acting on the old one until the new one is ready (no failed request), a failed build
changes nothing, rollback [--to N], five versions kept. Real gateway, workers and `seq` CLI."""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import sequence_ai
from _core_support import observation
from _servers import ECHO_POLICY, POLICIES, ROOT, _env, seq_cli


SEQ_MAIN = "from seq.cli import main; main()"   # what the `seq` console script runs


def _variant(tmp_path: Path, tag: str, load_s: float = 0.0) -> str:
    """A copy of the echo policy that differs by a comment (a new version), optionally slow to load."""
    path = tmp_path / "echo_versions.py"
    head = f"import os\nos.environ['ECHO_LOAD_S'] = '{load_s}'\n" if load_s else ""
    path.write_text(head + Path(ECHO_POLICY).read_text() + f"\n# variant {tag}\n")
    return str(path)


def test_a_new_version_builds_beside_the_old_one_while_a_robot_keeps_acting(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    assert gw.deploy(_variant(tmp_path, "a"), "switch")["version"] == 1
    errors, done, stop = [], [], threading.Event()
    workers_seen = set()

    def robot():
        try:
            with sequence_ai.connect("switch", api_key=gw.api_key, gateway_url=gw.url) as policy:
                while not stop.is_set():
                    assert len(policy.predict(observation()).action_chunk) == 10
                    done.append(time.monotonic())
                    workers_seen.add(policy._engine._wire.session.worker_url)
                    time.sleep(0.02)
                done.append(("reconnects", policy.reconnects))
        except BaseException as exc:   # noqa: BLE001 - any failure is the test's failure
            errors.append(exc)

    t = threading.Thread(target=robot, daemon=True)
    t.start()
    while not done and t.is_alive():
        time.sleep(0.05)
    r = subprocess.Popen([sys.executable, "-c", SEQ_MAIN, "deploy", _variant(tmp_path, "b", load_s=3.0), "--name", "switch"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(gw.env()), cwd=str(ROOT))
    deadline = time.monotonic() + 20
    while not gw.status("switch").get("build") and time.monotonic() < deadline:
        time.sleep(0.05)
    during = gw.status("switch")
    assert during["version"] == 1 and during["status"] == "ready" and during["build"]["status"] == "building"
    n_before = len(done)
    deadline = time.monotonic() + 20
    while len(done) <= n_before + 5 and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    # the robot kept acting on v1 during the build (v2 loads for 3 s, so it is still building)
    assert len(done) > n_before + 5, errors
    assert gw.status("switch")["build"]["status"] == "building"
    stdout, stderr = r.communicate(timeout=60)
    assert r.returncode == 0, stderr
    assert "beside the serving v1" in stdout and "ready: switch v2" in stdout
    n_ready = len(done)
    deadline = time.monotonic() + 20        # and goes on acting, now on v2's worker
    while (len(workers_seen) < 2 or len(done) <= n_ready + 5) and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    t.join(30)
    assert errors == [], errors
    assert gw.status("switch")["version"] == 2 and len(workers_seen) == 2
    assert done[-1][0] == "reconnects" and done[-1][1] >= 1
    v = gw.client.get("/v1/deployments/switch/versions").json()
    assert [(x["version"], x["status"], x["serving"]) for x in v["versions"]] == [(2, "ready", True), (1, "retired", False)]


def test_seq_deploy_prints_the_version_it_builds_and_the_one_serving(shared_module_gateway, tmp_path):
    """A changed file prints the new number (v2) beside the serving v1 and never "serving v2";
    the same file again says it is unchanged, which version serves, and makes no new version."""
    gw = shared_module_gateway
    assert gw.deploy(_variant(tmp_path, "p1"), "words")["version"] == 1
    r = seq_cli(gw, "deploy", _variant(tmp_path, "p2"), "--name", "words")
    assert r.returncode == 0, r.stderr
    assert "deploying words v2 from" in r.stdout and "v1 serves until it is ready" in r.stdout
    assert "(v2 beside the serving v1)" in r.stdout and "ready: words v2" in r.stdout
    assert "serving v2" not in r.stdout and "deploying words v1" not in r.stdout
    r = seq_cli(gw, "deploy", _variant(tmp_path, "p2"), "--name", "words")     # the same file again
    assert r.returncode == 0, r.stderr
    assert "is unchanged since v2, so no new version; v2 keeps serving" in r.stdout
    assert "beside the serving v2" not in r.stdout and "deploying words" not in r.stdout
    assert "ready: words v2" in r.stdout
    v = gw.client.get("/v1/deployments/words/versions").json()
    assert [x["version"] for x in v["versions"]] == [2, 1] and v["serving"] == 2


def test_a_failed_build_changes_nothing_and_says_why(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    d = gw.deploy(ECHO_POLICY, "keeps")
    broken = tmp_path / "echo_versions.py"
    broken.write_text((POLICIES / "broken_load_policy.py").read_text())
    r = seq_cli(gw, "deploy", str(broken), "--name", "keeps")
    assert r.returncode == 6
    assert "error[worker_failed]: v2 failed to build; v1 keeps serving" in r.stderr and "checkpoint missing" in r.stderr
    after = gw.status("keeps")
    assert (after["version"], after["status"], after["pid"], after["worker_url"]) == (1, "ready", d["pid"], d["worker_url"])
    assert gw.connect_ready("keeps")["version"] == 1
    r = seq_cli(gw, "policy", "versions", "keeps")
    assert r.returncode == 0 and "failed" in r.stdout and "checkpoint missing" in r.stdout


def test_rollback_serves_an_older_version_and_refuses_one_not_kept(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    gw.deploy(_variant(tmp_path, "r1"), "roll")
    assert gw.deploy(_variant(tmp_path, "r2"), "roll")["version"] == 2
    r = seq_cli(gw, "policy", "rollback", "roll")
    assert r.returncode == 0, r.stderr
    assert "rolling roll back to v1" in r.stdout and gw.status("roll")["version"] == 1
    assert gw.connect_ready("roll")["version"] == 1
    r = seq_cli(gw, "policy", "rollback", "roll", "--to", "2")
    assert r.returncode == 0 and gw.status("roll")["version"] == 2
    r = seq_cli(gw, "policy", "rollback", "roll", "--to", "9")
    assert r.returncode == 4 and "error[not_found]: roll has no kept version v9" in r.stderr and "hint:" in r.stderr


def test_five_versions_are_kept(shared_module_gateway, tmp_path):
    """Versions are recorded (and the oldest dropped) at deploy; while the deployment is stopped a
    deploy records its version and starts no worker, so v2..v7 cost no worker start."""
    gw = shared_module_gateway
    assert gw.deploy(_variant(tmp_path, "k1"), "kept")["status"] == "ready"
    gw.stop("kept")
    for i in range(2, 8):
        d = gw.deploy(_variant(tmp_path, f"k{i}"), "kept", wait=False)
        assert (d["version"], d["status"]) == (i, "stopped"), d
    v = gw.client.get("/v1/deployments/kept/versions").json()
    assert [x["version"] for x in v["versions"]] == [7, 6, 5, 4, 3] and v["serving"] == 7
    kept_dirs = sorted(p.name for p in (gw.data_dir / "versions" / "kept").iterdir())
    assert kept_dirs == ["v3", "v4", "v5", "v6", "v7"]
    r = seq_cli(gw, "policy", "rollback", "kept", "--to", "2")
    assert r.returncode == 4


def test_policy_start_and_rm_refuses_a_running_one_without_force(shared_module_gateway):
    gw = shared_module_gateway
    d = gw.deploy(ECHO_POLICY, "gone")
    r = seq_cli(gw, "policy", "rm", "gone")
    assert r.returncode == 5 and "error[invalid_request]: gone is ready; not removed" in r.stderr and "--force" in r.stderr
    assert seq_cli(gw, "policy", "stop", "gone").returncode == 0
    r = seq_cli(gw, "policy", "start", "gone")
    assert r.returncode == 0 and "starting gone v1" in r.stdout
    gw.wait_until("gone", ("ready",))
    r = seq_cli(gw, "policy", "rm", "gone", "--force")
    assert r.returncode == 0 and "removed gone" in r.stdout
    assert gw.client.get("/v1/deployments/gone").status_code == 404
    assert not (gw.data_dir / "versions" / "gone").exists()
    deadline = time.monotonic() + 10
    while True:   # the forced rm stopped the worker
        try:
            alive = Path(f"/proc/{d['pid']}/stat").read_text().split()[2] != "Z"
        except OSError:
            alive = False
        if not alive:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
