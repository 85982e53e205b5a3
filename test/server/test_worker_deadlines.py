"""Deadlines and the cost curve on a real worker process (``python -m sequence_ai_server.worker``
on loopback): /ping reports the measured ms per call by batch size; an /act's ``deadline_ms`` is
validated (400 naming the field), waiting requests are served earliest deadline first, and a
request answered past its deadline is still answered and counted late."""
from __future__ import annotations

import pytest

from _servers import ECHO_POLICY, WorkerProcess, echo_observation
from _wait import eventually


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
