"""Admission for real: a gateway process and CPU workers of the echo policy (15 Hz, so a robot
asks for a chunk every 8 rows, 533 ms, unless it says otherwise). With
``@seq.concurrent(max_inputs=3)`` one worker admits three robots by count before it has measured
anything (one of them the real client, declaring its request_hz), and the fourth connect is
refused with deployment_full naming the count. A policy
whose calls take 100 ms admits robots only while the worst round trip its worker predicts from
its own measured calls stays within their deadlines: the next connect is refused with the
numbers (robots, requests/s, predicted worst round trip, deadline) although max_inputs allows more."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import sequence_ai
from _core_support import ECHO
from _servers import GatewayProcess, echo_observation
from _wait import eventually
from sequence_ai_server.common.leases import period_floor_ms


def _policy(tmp_path: Path, max_inputs: int, latency_ms: float = 0.0) -> str:
    src = Path(ECHO).read_text()
    assert src.count("@seq.policy(\n") == 1 and src.count("*, chunk_len: int = 10, latency_ms: float = 0.0,") == 1
    path = tmp_path / "admitted_echo.py"
    path.write_text(src.replace("@seq.policy(\n", f'@seq.concurrent(max_inputs={max_inputs})\n'
                                                  '@seq.policy(gpu="cpu", on_full="reject", idle_timeout=600,\n')
                    .replace("*, chunk_len: int = 10, latency_ms: float = 0.0,",
                             f"*, chunk_len: int = 10, latency_ms: float = {latency_ms},"))
    return str(path)


def test_max_inputs_admits_that_many_robots_on_one_worker_then_refuses_with_the_count(tmp_path):
    gw = GatewayProcess.start(tmp_path)
    try:
        gw.deploy(_policy(tmp_path, max_inputs=3), "crowd")
        for bad in (0, -2.5, 1e9, 1e-300, "fast", "5", True, 10 ** 400, "NaN", "Infinity", "1e999"):  # checked, strictly
            raw = bad if bad in ("NaN", "Infinity", "1e999") else json.dumps(bad)   # JSON's non-finite literals too
            r = gw.client.post("/v1/connect", content='{"model": "crowd", "request_hz": %s}' % raw,
                               headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["code"] == "invalid_request" and "request_hz" in r.text, r.text
        robot = sequence_ai.connect("crowd", api_key=gw.api_key, gateway_url=gw.url, request_hz=0.25)
        conns = [gw.connect_ready("crowd") for _ in range(2)]
        assert {c["worker_url"] for c in conns} == {robot._engine._wire.session.worker_url}   # one worker, three robots
        # the lease carries the period each robot was admitted at, signed: the worker's floor for
        # the period_ms its requests declare (a robot cannot buy the queue's front with a short one)
        assert period_floor_ms(robot._engine._wire.session.direct_secret) == 4000.0
        assert period_floor_ms(conns[0]["direct_secret"]) == pytest.approx(1000 * 8 / 15.0, abs=0.001)
        token = conns[0]["direct_secret"]
        head, period_us, sig = token.rsplit(".", 2)
        for secret, status in ((token, 200), (f"{head}.{int(period_us) // 100}.{sig}", 401)):   # a shorter floor, unsigned
            act = httpx.post(conns[0]["worker_url"] + "/act", json={"observation": echo_observation()},
                             headers={"Authorization": f"Bearer {secret}"}, timeout=30)
            assert act.status_code == status, act.text
        r = gw.connect("crowd")
        assert r.status_code == 503 and r.json()["code"] == "deployment_full", r.text
        assert "(3 of 3)" in r.json()["detail"] and r.json()["details"]["held"] == 3
        [w] = gw.status("crowd")["workers"]
        assert len(w["robots"]) == 3 and w["admission"]["cap"] == 3
        assert w["admission"]["rate_hz"] == round(0.25 + 2 * 15.0 / 8, 3)      # the client's declared rate counts
        robot.close()
        assert w["slots"] == {"used": 3, "total": 3}               # max_inputs, not the one replica
        # warm workers: no more than the deployment may run (a CPU policy without max_gpus: 1),
        # and a count is a number, not a string
        for bad, words in ((5, "more workers than"), ("2", "integer")):
            r = gw.client.post("/v1/deployments/crowd/scale", json={"min": bad})
            assert r.status_code == 400 and words in r.text, r.text
    finally:
        gw.close()


def test_a_robot_that_would_make_the_others_late_is_refused_with_the_numbers(tmp_path):
    gw = GatewayProcess.start(tmp_path, env={"SEQ_HEALTH_INTERVAL_S": "0.5"})
    try:
        gw.deploy(_policy(tmp_path, max_inputs=8, latency_ms=100.0), "slow")
        first = gw.connect_ready("slow")
        for _ in range(3):                                           # the worker measures its calls
            act = httpx.post(first["worker_url"] + "/act", json={"observation": echo_observation()},
                             headers={"Authorization": f"Bearer {first['direct_secret']}"}, timeout=30)
            assert act.status_code == 200, act.text
        w = eventually(lambda: (gw.status("slow")["workers"] or [{}])[0].get("admission", {}).get("measured")
                       and gw.status("slow")["workers"][0], timeout=30, what="the worker's cost curve")
        assert w["cost"]["calls"] >= 3 and float(w["cost"]["batch_ms"]["1"]) >= 100.0
        admitted = 1
        while True:
            r = gw.connect("slow")
            if r.status_code != 200:
                break
            admitted += 1
            assert admitted < 8, "max_inputs, not the deadlines, stopped admission"
        body = r.json()
        assert r.status_code == 503 and body["code"] == "deployment_full", r.text
        adm = body["details"]["admission"]
        assert 2 <= admitted and adm["robots"] == admitted + 1 and adm["worst_ms"] > adm["budget_ms"]
        assert round(adm["deadline_ms"]) == 533 and "would make the robots of worker slow late" in body["detail"]
        view = gw.status("slow")["workers"][0]["admission"]
        assert view["robots"] == admitted and view["fits"] and view["worst_ms"] <= view["budget_ms"]
    finally:
        gw.close()
