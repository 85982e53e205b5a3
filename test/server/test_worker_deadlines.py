"""Deadlines and the cost curve on a real worker process (``python -m sequence_ai_server.worker``
on loopback): /ping reports the measured ms per call by batch size; an /act's ``deadline_ms`` is
validated (400 naming the field), waiting requests are served earliest deadline first, and a
request answered past its deadline is still answered and counted late; /ping reports each
robot's (lease session's) p99."""
from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from _servers import ECHO_POLICY, WorkerProcess, echo_observation

from sequence_ai_core.protocol import encode_act_body
from sequence_ai_server.common.leases import sign_lease


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path_factory.mktemp("deadline-worker"), name="echo")
    yield w
    w.stop()


def test_ping_reports_the_measured_cost_per_batch_size(echo):
    for _ in range(3):
        assert echo.act({"observation": echo_observation(), "params": {"latency_ms": 20.0}}).status_code == 200
    cost = echo.client.get("/ping").json()["cost"]
    assert set(cost) == {"batch_ms", "calls"}
    assert cost["calls"] >= 3 and list(cost["batch_ms"]) == ["1"]      # echo is not batched: size 1 only
    assert cost["batch_ms"]["1"] >= 20.0


@pytest.mark.parametrize("value, words", [(-5, "already passed"), (0, "already passed"), (1e9, "beyond 60000"),
                                          ("soon", "must be a number"), (True, "must be a number")])
def test_a_bad_deadline_is_400_naming_the_field(echo, value, words):
    r = echo.act({"observation": echo_observation(), "deadline_ms": value})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_request" and body["details"]["field"] == "deadline_ms"
    assert words in body["detail"] and "deadline_ms" in body["detail"]


def test_nan_deadline_and_a_bad_period_are_400_naming_the_field(echo):
    head = {"Authorization": f"Bearer {echo.secret}", "Content-Type": "application/json"}
    obs = json.dumps({"observation": echo_observation()})[1:]
    r = echo.client.post("/act", content=('{"deadline_ms":NaN,' + obs).encode(), headers=head)
    assert r.status_code == 400 and r.json()["details"]["field"] == "deadline_ms", r.text
    r = echo.act({"observation": echo_observation(), "deadline_ms": 100, "period_ms": -1})
    assert r.status_code == 400 and r.json()["details"]["field"] == "period_ms", r.text
    # the fast path reads the client's compact head only; any other spelling is parsed whole, so a
    # bad period or a repeated key cannot slip past it
    for raw, field in (('{"deadline_ms":5,"period_ms":"abc",', "period_ms"), ('{"deadline_ms":5,"period_ms":NaN,', "period_ms"),
                       ('{"deadline_ms":5, "period_ms":-1,', "period_ms"), ('{"deadline_ms":5000,"deadline_ms":-1,', "deadline_ms")):
        r = echo.client.post("/act", content=(raw + obs).encode(), headers=head)
        assert r.status_code == 400 and r.json()["details"]["field"] == field, (raw, r.text)


def test_waiting_requests_are_served_earliest_deadline_first(echo):
    """One slot: a slow request holds it while three wait; the one due first runs first, the
    one with no deadline (due as if 1 s after it came) after those due before that."""
    head = {"Authorization": f"Bearer {echo.secret}"}

    async def scenario():
        async with httpx.AsyncClient(base_url=echo.url, timeout=60.0, headers=head) as client:
            def act(**extra):
                return client.post("/act", json={"observation": echo_observation(),
                                                 "params": {"chunk_len": 1, **extra.pop("params", {})}, **extra})
            blocker = asyncio.ensure_future(act(params={"latency_ms": 1500.0}))
            await _until_busy(client)
            waiting = {}
            for name, extra in (("last", {"deadline_ms": 30000}), ("none", {}), ("mid", {"deadline_ms": 20000}),
                                ("first", {"deadline_ms": 800})):
                waiting[name] = asyncio.ensure_future(act(**extra))
                await asyncio.sleep(0.05)        # they arrive in this order (no timing is asserted)
            await blocker
            return {name: (await task).json() for name, task in waiting.items()}

    answers = asyncio.run(scenario())
    counter = {name: a["action_chunk"]["actions"][0][0] for name, a in answers.items()}
    assert sorted(counter, key=counter.get) == ["first", "none", "mid", "last"], counter
    assert answers["last"]["late"] is False and "late" not in answers["none"]


async def _until_busy(client) -> None:
    for _ in range(500):
        if (await client.get("/ping")).json()["oldest_request_s"] > 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the slow request never started")


def test_a_request_past_its_deadline_is_answered_and_counted_late(echo):
    before = echo.client.get("/ping").json()["deadlines"]
    r = echo.act({"observation": echo_observation(), "deadline_ms": 5, "params": {"latency_ms": 60.0}})
    assert r.status_code == 200 and r.json()["late"] is True and r.json()["action_chunk"]["actions"]
    assert r.json()["server_ms"] >= 60.0
    r = echo.act({"observation": echo_observation(), "deadline_ms": 30000})
    assert r.status_code == 200 and r.json()["late"] is False
    after = echo.client.get("/ping").json()["deadlines"]
    assert after == {"requests": before["requests"] + 2, "late": before["late"] + 1}
    r = echo.act({"observation": echo_observation(), "deadline_ms": 1})   # nothing left to play: the soonest
    assert r.status_code == 200 and "late" not in r.json()                 # no answer can meet it: not counted
    assert echo.client.get("/ping").json()["deadlines"] == after


def test_ping_reports_each_robots_p99_by_its_session(echo):
    lease = sign_lease(echo.secret, "sess_robot1", 1, time.time() + 300)
    for ms in (5.0, 60.0):
        r = echo.client.post("/act", json={"observation": echo_observation(), "params": {"latency_ms": ms}},
                             headers={"Authorization": f"Bearer {lease}"})
        assert r.status_code == 200, r.text
    robots = echo.client.get("/ping").json()["robots"]
    assert set(robots) == {"sess_robot1"}                  # the worker secret's requests are no robot's
    assert robots["sess_robot1"]["requests"] == 2 and robots["sess_robot1"]["p99_ms"] >= 60.0


def test_binary_body_with_the_deadline_first_is_ordered_and_answered(echo):
    body = {"deadline_ms": 30000.0, "period_ms": 533.0, "observation": echo_observation(), "params": {"chunk_len": 2}}
    content, ctype = encode_act_body(body, binary=True)
    r = echo.client.post("/act", content=content, headers={"Authorization": f"Bearer {echo.secret}",
                                                           "Content-Type": ctype})
    assert r.status_code == 200, r.text
    assert r.json()["late"] is False and len(r.json()["action_chunk"]["actions"]) == 2
