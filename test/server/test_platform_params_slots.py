"""Deployment default params and slots/queueing (issue 5): `seq policy params` reaches new
sessions at once and connected robots at their next lease renewal; a worker has slots, a
robot session holds one, a full deployment queues (position, estimate, Retry-After) up to
queue_timeout_s or refuses (deployment_full), closing a session frees its slot at once, and a
machine out of workers answers gpu_limit_reached. Real gateway, workers and `seq` CLI."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from _servers import ECHO_POLICY, GatewayProcess, echo_observation, seq_cli


def _variant(tmp_path: Path, name: str, head: str = "", policy_args: str = "") -> str:
    """The echo policy with extra decorators above @seq.policy and extra @seq.policy arguments."""
    src = Path(ECHO_POLICY).read_text()
    assert src.count("@seq.policy(\n") == 1
    path = tmp_path / f"{name}.py"
    path.write_text(src.replace("@seq.policy(\n", f"{head}@seq.policy({policy_args}\n"))
    return str(path)


def _act_rows(gw, conn: dict) -> int:
    """Rows of one chunk from the worker, sent the way a client does (the session's params)."""
    import httpx
    r = httpx.post(conn["worker_url"] + "/act", json={"observation": echo_observation(), "params": conn["params"]},
                   headers={"Authorization": f"Bearer {conn['direct_secret']}"}, timeout=30)
    assert r.status_code == 200, r.text
    return len(r.json()["action_chunk"]["actions"])


def test_default_params_reach_new_sessions_at_once_and_connected_robots_at_renewal(shared_module_gateway):
    gw = shared_module_gateway
    gw.deploy(ECHO_POLICY, "defaults")
    before = gw.connect_ready("defaults")
    assert before["params"] == {} and _act_rows(gw, before) == 10
    r = seq_cli(gw, "policy", "params", "defaults", "chunk_len=4", "latency_ms=1.5")
    assert r.returncode == 0, r.stderr
    assert "chunk_len" in r.stdout and "4" in r.stdout
    new = gw.connect_ready("defaults")
    assert new["params"] == {"chunk_len": 4, "latency_ms": 1.5} and _act_rows(gw, new) == 4
    own = gw.connect_ready("defaults", params={"chunk_len": 7})       # a robot's own value wins
    assert own["params"] == {"chunk_len": 7, "latency_ms": 1.5}
    assert before["params"] == {}
    renewed = gw.client.post(f"/v1/sessions/{before['session_id']}/renew").json()
    assert renewed["session_id"] == before["session_id"] and renewed["params"] == {"chunk_len": 4, "latency_ms": 1.5}
    assert _act_rows(gw, renewed) == 4
    r = seq_cli(gw, "policy", "params", "defaults", "--clear", "latency_ms")
    assert r.returncode == 0, r.stderr
    assert gw.client.get("/v1/deployments/defaults/params").json()["defaults"] == {"chunk_len": 4}
    assert gw.connect_ready("defaults")["params"] == {"chunk_len": 4}
    r = seq_cli(gw, "policy", "params", "defaults", "speed=3")
    assert r.returncode != 0 and "error[invalid_request]" in r.stderr and "speed" in r.stderr
    r = gw.client.post("/v1/deployments/defaults/params", json={"set": {"chunk_len": "many"}})
    assert r.status_code == 400 and r.json()["code"] == "invalid_request"
    assert gw.client.get("/v1/deployments/defaults/params").json()["defaults"] == {"chunk_len": 4}


def test_a_full_deployment_queues_robots_with_position_and_closing_a_session_frees_its_slot(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    gw.deploy(_variant(tmp_path, "slots2", "@seq.concurrent(replicas_per_gpu=2)\n", "queue_timeout_s=3.0,"), "slots")
    a, b = gw.connect_ready("slots"), gw.connect_ready("slots")       # two slots, two robots
    r = gw.connect("slots")
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    c = r.json()
    assert c["code"] == "queued" and c["retryable"] is True
    assert c["details"]["position"] == 1 and c["details"]["slots"] == 2 and c["details"]["held"] == 2
    assert c["details"]["estimate_s"] > 0 and c["details"]["ticket"].startswith("q_")
    other_key = gw.client.post("/v1/keys", json={"name": "robot-d"}).json()["key"]
    d_connect = lambda: gw.client.post("/v1/connect", json={"model": "slots"},   # noqa: E731
                                       headers={"Authorization": f"Bearer {other_key}"})
    d = d_connect().json()
    assert d["code"] == "queued" and d["details"]["position"] == 2
    m = gw.client.get("/metrics")                # Prometheus text: the slots, the line, the 503s
    assert m.status_code == 200 and m.headers["content-type"].startswith("text/plain")
    assert 'seq_gateway_sessions{deployment="slots"} 2.0' in m.text
    assert 'seq_gateway_slots{deployment="slots"} 2.0' in m.text
    assert 'seq_gateway_queue_depth{deployment="slots"} 2.0' in m.text
    n503 = [ln for ln in m.text.splitlines() if ln.startswith('seq_gateway_requests_total{route="/v1/connect",status="503"}')]
    assert n503 and float(n503[0].split()[-1]) >= 2
    assert 'seq_gateway_request_seconds_count{route="/v1/connect"}' in m.text
    cold = [ln for ln in m.text.splitlines() if ln.startswith("seq_gateway_cold_starts_total ")]
    assert cold and float(cold[0].split()[1]) >= 1
    assert gw.client.delete(f"/v1/sessions/{a['session_id']}").json()["closed"] is True
    r = gw.client.post("/v1/connect", json={"model": "slots", "ticket": c["details"]["ticket"]})
    assert r.status_code == 200 and _act_rows(gw, r.json()) == 10    # the head of the line got the freed slot
    d = d_connect().json()
    assert d["code"] == "queued" and d["details"]["position"] == 1
    deadline = time.monotonic() + 15
    while d["code"] == "queued":            # nobody leaves: after queue_timeout_s (3 s) it is refused
        assert time.monotonic() < deadline
        time.sleep(0.5)
        d = d_connect().json()
    assert d["code"] == "queue_timeout" and d["retryable"] is False and d["details"]["waited_s"] >= 3.0
    assert gw.client.delete(f"/v1/sessions/{b['session_id']}").json()["closed"] is True
    assert d_connect().status_code == 200


def test_on_full_reject_refuses_with_deployment_full_until_a_slot_frees(shared_module_gateway, tmp_path):
    gw = shared_module_gateway
    gw.deploy(_variant(tmp_path, "reject1", "@seq.concurrent(replicas_per_gpu=1)\n", 'on_full="reject",'), "rejects")
    a = gw.connect_ready("rejects")
    r = gw.connect("rejects")
    assert r.status_code == 503 and r.json()["code"] == "deployment_full" and r.json()["retryable"] is False
    assert "every slot" in r.json()["detail"] and r.json()["hint"]
    gw.client.delete(f"/v1/sessions/{a['session_id']}")
    assert gw.connect("rejects").status_code == 200


def test_a_machine_at_its_gpu_limit_answers_gpu_limit_reached(tmp_path):
    gw = GatewayProcess.start(tmp_path, env={"SEQ_MAX_GPUS": "1"})
    try:
        gw.deploy(ECHO_POLICY, "first")
        second = gw.deploy(ECHO_POLICY, "second")
        os.kill(second["pid"], signal.SIGKILL)          # its worker died: the next connect would start one
        gw.wait_until("second", ("failed",), timeout=30)
        r = gw.connect("second")
        assert r.status_code == 503 and r.json()["code"] == "gpu_limit_reached"
        assert r.json()["details"] == {"max_gpus": 1} and gw.status("second")["pid"] is None
        assert gw.client.get("/v1/account").json()["limits"]["max_gpus"] == 1
        gw.stop("first")
        assert gw.connect_ready("second")["version"] == 1
    finally:
        gw.close()


def _failing_echo(tmp_path: Path, fail: str) -> str:
    """The echo policy failing with ``fail`` on every /act after the worker's own load check
    (its first call), as if ``fail`` were sent as the param."""
    src = Path(ECHO_POLICY).read_text()
    old = "        self.counter += 1\n        if fail:"
    assert old in src
    path = tmp_path / f"echo_fails_{fail.lower()}.py"
    path.write_text(src.replace(old, f"        self.counter += 1\n        fail = fail or ('{fail}' if self.counter > 1 else '')"
                                     "\n        if fail:"))
    return str(path)


def test_policy_doctor_prints_a_refusal_readably_and_fails_only_on_a_policy_error(shared_module_gateway, tmp_path):
    """A 400 refusal of the synthetic input: code, whole detail and hint printed, exit 0 (the
    deployment serves); a 500 policy_error: the typed error printed, exit 1."""
    gw = shared_module_gateway
    gw.deploy(_failing_echo(tmp_path, "PolicyInputError"), "doc-refuses")
    act = gw.client.get("/v1/deployments/doc-refuses/doctor").json()["worker"]["act"]
    assert (act["status"], act["code"], act["detail"]) == (400, "invalid_request", "asked to fail with PolicyInputError")
    r = seq_cli(gw, "policy", "doctor", "doc-refuses")
    assert r.returncode == 0, r.stderr
    assert "refused by the policy: error[invalid_request] (400): asked to fail with PolicyInputError" in r.stdout
    assert "hint: " in r.stdout and "not a broken deployment" in r.stdout and '{"' not in r.stdout
    gw.deploy(_failing_echo(tmp_path, "KeyError"), "doc-raises")
    r = seq_cli(gw, "policy", "doctor", "doc-raises")
    assert r.returncode == 1, r.stdout
    assert "act         failed: error[policy_error] (500): the policy raised KeyError" in r.stdout
    assert "hint: " in r.stdout and '{"' not in r.stdout
    broken = tmp_path / "echo_broken.py"      # fails its own load check: a failed deployment
    broken.write_text(Path(ECHO_POLICY).read_text().replace('fail: str = "", horizon', 'fail: str = "KeyError", horizon'))
    assert gw.deploy(str(broken), "doc-failed")["status"] == "failed"
    r = seq_cli(gw, "policy", "doctor", "doc-failed")
    assert r.returncode == 1 and "doc-failed v1: failed" in r.stdout and "KeyError" in r.stdout


def test_policy_doctor_reports_state_ping_and_a_split_act_without_starting_a_worker(shared_module_gateway):
    gw = shared_module_gateway
    gw.deploy(ECHO_POLICY, "doc")
    d = gw.client.get("/v1/deployments/doc/doctor").json()
    assert (d["status"], d["version"]) == ("ready", 1)
    assert d["worker"]["ping"]["status"] == 200 and d["worker"]["ping"]["ms"] > 0
    act = d["worker"]["act"]
    assert act["status"] == 200 and act["total_ms"] >= act["handler_ms"] >= 0
    assert abs(act["total_ms"] - act["network_ms"] - act["handler_ms"]) < 0.01
    r = seq_cli(gw, "policy", "doctor", "doc")
    assert r.returncode == 0, r.stderr
    assert "doc v1: ready" in r.stdout and "ping        200" in r.stdout and "= network" in r.stdout
    gw.stop("doc")
    r = seq_cli(gw, "policy", "doctor", "doc")
    assert r.returncode == 0 and "none running" in r.stdout
    assert gw.status("doc")["status"] == "stopped"       # doctor never starts a worker
