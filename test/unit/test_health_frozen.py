"""A worker that is alive but answers no /ping (frozen: SIGSTOP, a policy holding the GIL in C
code) is jammed like a degraded one and replaced; pings run concurrently so frozen workers delay
no one else's jam detection; doctor does not wait long on a frozen worker; the usage cursor
survives a gateway restart. In process: a Gateway over fake workers (no processes) and an
injected clock, the worker's /ping played by replacing ``HealthCheck.get_ping``."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

import httpx
import pytest

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.events import WorkerTookOver
from sequence_ai_server.gateway.health import UNANSWERED_JAM_S
from sequence_ai_server.gateway.schemas import ConnectRequest, DeployRequest
from _fake_workers import FakeWorker, fake_gateway
from sequence_ai_server.ops.usage_cursor import UsageCursors

T0 = 1_800_000_000.0


def _spec(request_s: float = 300.0) -> dict:
    return {"contract": {"action": None, "observation": None}, "params": [],
            "timeouts": {"startup": 1800.0, "request": request_s}, "idle_timeout": 3600}


@pytest.fixture
def env(tmp_path):
    gw, clock, launcher, policy = fake_gateway(tmp_path, lease_ttl_s=30.0)
    yield gw, clock, launcher, policy
    gw.close()


def _serve(gw, clock, launcher, policy, name: str, port: int, request_s: float = 300.0) -> FakeWorker:
    gw.deployments.deploy(DeployRequest(name=name, file=str(policy)))
    w = launcher.started[-1]
    w.ready(_spec(request_s), port)
    gw.tick(clock.advance(0.1))
    assert gw.store.get(name).status == "ready"
    return w


class Worker:
    """What one fake worker's /ping does: ``answer`` (a body), ``frozen`` (the read times out
    after ``timeout_s`` of the clock), ``refused`` (connect fails at once), ``hold`` (blocks on
    an event, then times out: a ping still under way)."""

    def __init__(self, pid: int, mode: str = "answer", body: Optional[dict] = None):
        self.pid, self.mode, self.body, self.pings = pid, mode, body, 0
        self.release = threading.Event()


def _play(gw, clock, workers: dict[int, Worker], timeout_s: float = 5.0, real_s: float = 0.0) -> None:
    """Make gw.health's pings reach ``workers`` (by port) instead of the network."""
    def get_ping(url: str, usage_since: int) -> httpx.Response:
        w = workers[int(url.rsplit(":", 1)[1])]
        w.pings += 1
        if w.mode == "refused":
            raise httpx.ConnectError("connection refused")
        if w.mode == "frozen":
            time.sleep(real_s)
            clock.advance(timeout_s)
            raise httpx.ReadTimeout("timed out")
        if w.mode == "hold":
            w.release.wait(30)
            raise httpx.ReadTimeout("timed out")
        return httpx.Response(200, json=w.body or {"status": "ready", "pid": w.pid, "oldest_request_s": 0.0})
    gw.health.get_ping = get_ping


def _warming(gw, name: str) -> ApiError:
    with pytest.raises(ApiError) as exc:
        gw.sessions.connect(ConnectRequest(model=name))
    return exc.value


def test_an_alive_worker_that_answers_no_ping_is_jammed_and_replaced_then_killed(env):
    gw, clock, launcher, policy = env
    events: list = []
    gw.supervisor.on(WorkerTookOver, events.append)
    frozen = _serve(gw, clock, launcher, policy, "echo", 9001)
    frozen.exits_on_term = False                       # a SIGSTOPped process: SIGTERM stays pending
    play = {9001: Worker(frozen.pid, "frozen")}
    _play(gw, clock, play)
    assert gw.health.unanswered_bound_s("echo") == UNANSWERED_JAM_S == 10.0

    gw.health.ping_round()                             # silent 5 s: not yet
    assert gw.health.get("echo") is None and len(launcher.started) == 1
    assert gw.sessions.connect(ConnectRequest(model="echo")).worker_url == "http://127.0.0.1:9001"
    gw.health.ping_round()                             # silent 10 s over two pings: jammed
    jam = gw.health.get("echo")
    assert jam["state"] == "jammed" and jam["reason"] == "not_answering" and jam["pid"] == frozen.pid
    assert jam["unanswered_s"] == 10.0 and jam["error"] == "ReadTimeout"
    assert len(launcher.started) == 2 and launcher.started[1].spec.role == "build"
    err = _warming(gw, "echo")
    assert err.code == "warming" and err.status == 503 and err.details["phase"] == "replacing"
    assert "answered no /ping for 10 s" in err.detail

    gw.health.ping_round()                             # a replacement runs: no second one, no ping
    assert len(launcher.started) == 2 and play[9001].pings == 2
    fresh = launcher.started[1]
    fresh.ready(_spec(), 9002)
    gw.tick(clock.advance(0.1))
    assert events == [WorkerTookOver("echo", 1, fresh.pid, frozen.pid)]
    assert gw.health.get("echo")["state"] == "replaced" and gw.health.get("echo")["new_pid"] == fresh.pid
    assert gw.sessions.connect(ConnectRequest(model="echo")).worker_url == "http://127.0.0.1:9002"
    [old] = gw.supervisor.retiring
    assert old.proc is frozen and frozen.returncode is None and frozen.signals == [signal.SIGTERM]
    gw.tick(clock.advance(2.1))                        # past the jam grace: SIGKILL, which ends it
    assert gw.supervisor.retiring == [] and frozen.signals == [signal.SIGTERM, signal.SIGKILL]
    assert frozen.returncode == -signal.SIGKILL


def test_an_answer_between_misses_starts_the_silence_again(env):
    gw, clock, launcher, policy = env
    w = _serve(gw, clock, launcher, policy, "echo", 9001)
    play = {9001: Worker(w.pid, "frozen")}
    _play(gw, clock, play)
    gw.health.ping_round()
    play[9001].mode = "answer"
    gw.health.ping_round()
    play[9001].mode = "frozen"
    gw.health.ping_round()
    assert gw.health.get("echo") is None and len(launcher.started) == 1
    gw.health.ping_round()
    assert gw.health.get("echo")["reason"] == "not_answering"


def test_an_exited_worker_is_left_to_the_supervisor(env):
    gw, clock, launcher, policy = env
    w = _serve(gw, clock, launcher, policy, "echo", 9001)
    _play(gw, clock, {9001: Worker(w.pid, "refused")})
    w.returncode = -9                                  # gone, not yet reconciled
    for _ in range(4):
        gw.health.ping_round()
        clock.advance(5.0)
    assert gw.health.get("echo") is None and len(launcher.started) == 1


def test_the_silence_bound_is_timeouts_request_when_that_is_shorter(env):
    gw, clock, launcher, policy = env
    w = _serve(gw, clock, launcher, policy, "quick", 9001, request_s=1.0)
    _play(gw, clock, {9001: Worker(w.pid, "refused")})
    assert gw.health.unanswered_bound_s("quick") == 1.0
    gw.health.ping_round()
    assert gw.health.get("quick") is None              # one refused ping is not enough
    clock.advance(2.0)
    gw.health.ping_round()
    jam = gw.health.get("quick")
    assert jam["state"] == "jammed" and jam["error"] == "ConnectError" and jam["request_timeout_s"] == 1.0


def test_frozen_workers_do_not_delay_another_deployments_jam_detection(env):
    gw, clock, launcher, policy = env
    play = {}
    for i in range(3):
        w = _serve(gw, clock, launcher, policy, f"frozen{i}", 9001 + i)
        play[9001 + i] = Worker(w.pid, "hold")
    w = _serve(gw, clock, launcher, policy, "stuck", 9010)
    play[9010] = Worker(w.pid, body={"status": "degraded", "pid": w.pid, "oldest_request_s": 400.0,
                                     "request_timeout_s": 300.0})
    _play(gw, clock, play)
    try:
        t0 = time.monotonic()
        gw.health.check(clock.advance(1e9))            # returns at once: every ping runs on its own thread
        assert time.monotonic() - t0 < 1.0
        deadline = time.monotonic() + 5
        while gw.health.get("stuck") is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert gw.health.get("stuck")["reason"] == "degraded"
        assert time.monotonic() - t0 < 1.0
        gw.health.check(clock.advance(1e9))            # the frozen pings are still under way: not doubled
        assert [play[9001 + i].pings for i in range(3)] == [1, 1, 1]
    finally:
        for w in play.values():
            w.release.set()


def test_a_round_over_several_frozen_workers_takes_one_timeout(env):
    gw, clock, launcher, policy = env
    play = {}
    for i in range(3):
        w = _serve(gw, clock, launcher, policy, f"frozen{i}", 9001 + i)
        play[9001 + i] = Worker(w.pid, "frozen")
    _play(gw, clock, play, timeout_s=0.0, real_s=0.5)
    t0 = time.monotonic()
    gw.health.ping_round()
    assert time.monotonic() - t0 < 1.2                  # concurrent: not 3 x 0.5 s
    assert [play[9001 + i].pings for i in range(3)] == [1, 1, 1]


def test_doctor_reports_a_frozen_worker_within_a_few_seconds(env):
    gw, clock, launcher, policy = env
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)                                 # the kernel accepts connections; nobody answers
    try:
        port = listener.getsockname()[1]
        _serve(gw, clock, launcher, policy, "echo", port)
        t0 = time.monotonic()
        out = gw.deployments.doctor("echo")
        took = time.monotonic() - t0
        assert took < 6.0, took
        ping = out["worker"]["ping"]
        assert ping["status"] is None and ping["state"] == "not_answering" and "not answering" in ping["error"]
        assert "act" not in out["worker"]
    finally:
        listener.close()


def test_the_usage_cursor_survives_a_restart_of_ops(env, tmp_path):
    gw, clock, launcher, policy = env
    ops = gw.ops
    pid = os.getpid()                                  # a live process: its cursor is kept
    assert ops.usage_since("echo", pid) == -1
    assert ops.take_worker_usage("echo", pid, {"requests": 20, "errors": 1, "bytes_in": 2000, "bytes_out": 400,
                                               "seq": 19, "samples": []}) == 19
    assert ops.usage_since("echo", pid) == 19
    path = gw.data_dir / "run" / "usage_cursors.json"
    assert path.exists()

    again = UsageCursors(path)                         # what a restarted gateway reads
    assert again.seq("echo", pid) == 19 and again.counts("echo", pid)["requests"] == 20
    ops._cursors = again
    ops.take_worker_usage("echo", pid, {"requests": 25, "errors": 1, "bytes_in": 2500, "bytes_out": 500,
                                        "seq": 24, "samples": []})
    totals = ops.usage.totals({"echo"}).get("echo")
    assert totals["requests"] == 25 and totals["bytes_in"] == 2500 and totals["errors"] == 1


def test_a_cursor_of_a_gone_worker_is_dropped(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = tmp_path / "run" / "usage_cursors.json"
        cursors = UsageCursors(path)
        cursors.put("echo", proc.pid, 7, {"requests": 8})
        cursors.put("echo", os.getpid(), 3, {"requests": 4})
        assert UsageCursors(path).seq("echo", proc.pid) == 7
    finally:
        proc.kill()
        proc.wait()
    later = UsageCursors(path)
    assert later.seq("echo", proc.pid) == -1 and later.seq("echo", os.getpid()) == 3
