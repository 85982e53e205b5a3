"""Structured logs (issue 5): the gateway and every worker write one JSON object per line (time,
level, request_id, deployment, version, message); `seq policy logs NAME [--request-id R]
[--lines N] [--follow]` merges them by time, and the request id of an error a client saw finds
that request's lines. Real gateway, workers and `seq` CLI."""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time

import httpx
import pytest

from _servers import ECHO_POLICY, ROOT, _env, echo_observation, seq_cli
from _wait import eventually

SEQ_MAIN = "from seq.cli import main; main()"
KEYS = {"time", "level", "request_id", "deployment", "version", "message"}


@pytest.fixture(scope="module")
def logged(shared_module_gateway):
    gw = shared_module_gateway
    assert gw.deploy(ECHO_POLICY, "logged")["status"] == "ready"
    return gw


def _failing_act_via_gateway(gw) -> dict:
    r = gw.client.post("/v1/act", json={"model": "logged", "observation": echo_observation(),
                                        "params": {"fail": "RuntimeError"}})
    assert r.status_code == 500 and r.json()["code"] == "policy_error"
    return r.json()


def _access_line(lines: list[dict], component: str) -> bool:
    return any(x["component"] == component and " -> " in x["message"] for x in lines)


def _wait_for(gw, rid: str, timeout: float = 10.0) -> list[dict]:
    """The JSON lines of request ``rid`` once its last ones are in the files: the access lines of
    the worker and of the gateway, each written after its answer went out (the worker's can come
    after the gateway's, so the error line alone says nothing about it)."""
    def from_both():
        lines = gw.client.get("/v1/deployments/logged/logs", params={"request_id": rid}).json()["lines"]
        return lines if _access_line(lines, "gateway") and _access_line(lines, "worker") else None

    return eventually(from_both, timeout, 0.1, what=f"log lines of {rid} from both the gateway and the worker")


def test_every_log_line_is_one_json_object_with_the_common_fields(logged):
    gw = logged
    _failing_act_via_gateway(gw)
    conn = gw.connect_ready("logged")
    for name in ("gateway.jsonl", "logged.jsonl"):
        text = (gw.data_dir / "logs" / name).read_text()
        records = [json.loads(line) for line in text.splitlines()]
        assert records, name
        assert all(KEYS <= set(r) for r in records)
        assert oct(os.stat(gw.data_dir / "logs" / name).st_mode & 0o777) == "0o600"
    worker = [json.loads(x) for x in (gw.data_dir / "logs" / "logged.jsonl").read_text().splitlines()]
    assert {(r["component"], r["deployment"], r["version"]) for r in worker} == {("worker", "logged", 1)}
    gateway = [json.loads(x) for x in (gw.data_dir / "logs" / "gateway.jsonl").read_text().splitlines()]
    admitted = [r for r in gateway if r["message"] == f"admitted {conn['session_id']} on v1 (worker logged)"]
    assert len(admitted) == 1 and admitted[0]["deployment"] == "logged" and admitted[0]["request_id"].startswith("req_")


def test_the_request_id_of_a_client_error_finds_its_lines_with_seq_policy_logs(logged):
    gw = logged
    err = _failing_act_via_gateway(gw)
    rid = err["request_id"]
    lines = _wait_for(gw, rid)
    assert {x["component"] for x in lines} == {"gateway", "worker"} and all(x["request_id"] == rid for x in lines)
    r = seq_cli(gw, "policy", "logs", "logged", "--request-id", rid)
    assert r.returncode == 0, r.stderr
    printed = r.stdout.splitlines()
    assert len(printed) == len(lines) and all(f"[{rid}]" in x for x in printed)
    assert any("worker v1" in x and "asked to fail with RuntimeError" in x for x in printed)
    assert any("gateway" in x and "POST /v1/act -> 500" in x for x in printed)
    # an error from the worker itself (the robot's direct /act) is found the same way
    conn = gw.connect_ready("logged")
    direct = httpx.post(conn["worker_url"] + "/act", json={"observation": echo_observation(), "params": {"fail": "KeyError"}},
                        headers={"Authorization": f"Bearer {conn['direct_secret']}"}, timeout=30)
    assert direct.status_code == 500
    r = seq_cli(gw, "policy", "logs", "logged", "--rid", direct.json()["request_id"], "--json")
    assert r.returncode == 0 and r.stdout.strip()
    assert all(json.loads(x)["request_id"] == direct.json()["request_id"] for x in r.stdout.splitlines())
    assert "asked to fail with KeyError" in r.stdout
    # an id nothing carries says so and exits 1 (like grep), rather than printing nothing
    r = seq_cli(gw, "policy", "logs", "logged", "--request-id", "req_nothing_has_this")
    assert r.returncode == 1 and r.stdout == "" and "no log lines of logged carry request id req_nothing_has_this" in r.stderr


def test_logs_lines_limits_and_an_unknown_deployment_is_not_found(logged):
    gw = logged
    for _ in range(3):
        _failing_act_via_gateway(gw)
    r = seq_cli(gw, "policy", "logs", "logged", "--lines", "4")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 4
    times = [json.loads(x)["time"] for x in seq_cli(gw, "policy", "logs", "logged", "--json").stdout.splitlines()]
    assert times == sorted(times) and len(times) > 4
    r = seq_cli(gw, "policy", "logs", "nothing-here")
    assert r.returncode == 4 and "error[not_found]" in r.stderr


def test_logs_follow_prints_new_lines_as_they_come(logged):
    gw = logged
    proc = subprocess.Popen([sys.executable, "-c", SEQ_MAIN, "policy", "logs", "logged", "--follow", "--lines", "1",
                             "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(gw.env()), cwd=str(ROOT))
    try:
        first = proc.stdout.readline()        # the newest line: the CLI is up and following
        assert first, proc.stderr.read()
        rid = _failing_act_via_gateway(gw)["request_id"]
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        seen, deadline = "", time.monotonic() + 20
        while rid not in seen and time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                seen += proc.stdout.readline()
        assert rid in seen and "asked to fail with RuntimeError" in seen
    finally:
        proc.terminate()
        proc.wait(10)
