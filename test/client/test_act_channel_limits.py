"""The worker's budget of open websockets (``/act/ws`` channels and openpi connections at ``/``
share one, ``--max-connections`` / ``$SEQ_WORKER_MAX_CONNECTIONS``) and the metering of answers
that never reached their client, against a real worker process on loopback with real websocket
clients (``websockets``), one of them in a process that is killed.

The worker hosts a copy of the echo policy whose inference takes 1 s unless a request says
otherwise (``latency_ms``): openpi's observations carry no params, so they are the slow ones."""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from _core_support import ECHO
from _servers import WorkerProcess, _env, echo_observation
from sequence_ai_core.protocol import ERROR_CODES, encode_act_body
from sequence_ai_server.worker.openpi import packb, unpackb

LIMIT = 3
SLOW_MS = 1000.0


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    src = Path(ECHO).read_text()
    slow = src.replace("latency_ms: float = 0.0,", f"latency_ms: float = {SLOW_MS},")
    assert slow != src
    (tmp / "slow_echo.py").write_text(slow)
    w = WorkerProcess.start(str(tmp / "slow_echo.py"), tmp, name="limits",
                            env={"SEQ_WORKER_MAX_CONNECTIONS": str(LIMIT)})
    try:
        yield w
    finally:
        w.stop()


def _channel(worker, token=None):
    """An open /act channel (the upgrade is made here; InvalidStatus when it is refused)."""
    return ws_connect(f"ws://127.0.0.1:{worker.port}/act/ws", max_size=None, proxy=None, open_timeout=30,
                      additional_headers={"Authorization": f"Bearer {worker.secret if token is None else token}"}
                      ).__enter__()


def _openpi(worker):
    """An open openpi connection, as openpi's client makes it (``Api-Key``)."""
    return ws_connect(f"ws://127.0.0.1:{worker.port}/", max_size=None, proxy=None, open_timeout=30,
                      additional_headers={"Authorization": f"Api-Key {worker.secret}"}).__enter__()


def _act(ws, seq, latency_ms=0.0):
    content, _ = encode_act_body({"observation": echo_observation(), "params": {"latency_ms": latency_ms}}, True)
    ws.send(struct.pack(">IB", seq, 1) + content)
    return len(content)


def _answer(ws):
    data = ws.recv(timeout=30)
    seq, status = struct.unpack_from(">IH", data)
    return seq, status, json.loads(data[6:])


def _observation() -> bytes:
    return packb({"observation/exterior_1": np.zeros((64, 64, 3), np.uint8),
                  "observation/state": np.arange(8.0), "prompt": "pick"})


def _refusal(open_one):
    """Open with ``open_one()``, expecting the upgrade to be refused -> (status, headers, body)."""
    with pytest.raises(InvalidStatus) as refused:
        open_one().close()
    response = refused.value.response
    return response.status_code, response.headers, json.loads(response.body)


def _open_when_free(open_one, timeout=15.0):
    """Open with ``open_one()`` once a place is free (a refused upgrade must be the budget's 503);
    -> the open connection and how many upgrades were refused first."""
    deadline, refused = time.monotonic() + timeout, 0
    while True:
        try:
            return open_one(), refused
        except InvalidStatus as exc:
            assert exc.response.status_code == 503, exc.response.body
            assert json.loads(exc.response.body)["code"] == "too_many_connections"
            refused += 1
            assert time.monotonic() < deadline, f"no place was freed within {timeout} s"
            time.sleep(0.05)


def _usage(worker) -> dict:
    return httpx.get(f"http://127.0.0.1:{worker.port}/ping", trust_env=False, timeout=30).json()["usage"]


def _usage_after(worker, before, requests, timeout=15.0) -> dict:
    """The usage counters' growth since ``before`` once ``requests`` more were counted."""
    deadline = time.monotonic() + timeout
    while True:
        now = _usage(worker)
        if now["requests"] - before["requests"] >= requests or time.monotonic() > deadline:
            return {k: now[k] - before[k] for k in ("requests", "errors", "bytes_in", "bytes_out")}
        time.sleep(0.05)


def test_the_code_is_a_retryable_503_in_the_shared_table():
    row = ERROR_CODES["too_many_connections"]
    assert (row.status, row.retryable, row.client_class) == (503, True, "Unavailable")


def test_past_the_limit_an_upgrade_is_refused_before_it_opens_and_the_open_ones_serve_on(worker):
    first, second, pi = _channel(worker), _channel(worker), _openpi(worker)
    try:
        assert unpackb(pi.recv(timeout=30))["server"] == "sequence-ai"
        status, headers, body = _refusal(lambda: _channel(worker))
        assert status == 503 and headers["retry-after"] == "1"
        assert body["code"] == "too_many_connections" and body["retryable"] is True
        assert body["details"] == {"open": LIMIT, "limit": LIMIT} and body["retry_after_s"] == 1.0
        assert body["request_id"].startswith("req_") and headers["x-request-id"] == body["request_id"]
        assert "--max-connections" in body["hint"] and f"({LIMIT}," in body["detail"]
        # the openpi endpoint takes from the same budget
        pi_status, _, pi_body = _refusal(lambda: _openpi(worker))
        assert (pi_status, pi_body["code"], pi_body["details"]) == (503, "too_many_connections",
                                                                    {"open": LIMIT, "limit": LIMIT})
        # credentials come first: a wrong secret is 401 whatever the budget
        bad_status, _, bad_body = _refusal(lambda: _channel(worker, token="wrong"))
        assert (bad_status, bad_body["code"]) == (401, "unauthorized")
        # nothing open was dropped: each channel answers /act, the openpi connection its observation
        for n, ws in enumerate((first, second, first, second)):
            _act(ws, 10 + n)
            seq, code, answer = _answer(ws)
            assert (seq, code) == (10 + n, 200) and len(answer["action_chunk"]["actions"]) == 10
        pi.send(_observation())
        assert unpackb(pi.recv(timeout=30))["actions"].shape == (10, 8)
        # a closed connection frees its place: a new one opens (of either kind)
        second.close()
        third, _ = _open_when_free(lambda: _openpi(worker))
        third.close()
        third, _ = _open_when_free(lambda: _channel(worker))
        _act(third, 1)
        assert _answer(third)[:2] == (1, 200)
        assert _refusal(lambda: _channel(worker))[0] == 503          # full again
        third.close()
    finally:
        for ws in (first, second, pi):
            ws.close()


_KILLED_CLIENT = r"""
import sys, time
from websockets.sync.client import connect
port, secret, channels = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
held = [connect(f"ws://127.0.0.1:{port}/act/ws", proxy=None, open_timeout=30,
                additional_headers={"Authorization": "Bearer " + secret}).__enter__() for _ in range(channels)]
held.append(connect(f"ws://127.0.0.1:{port}/", proxy=None, open_timeout=30, max_size=None,
                    additional_headers={"Authorization": "Api-Key " + secret}).__enter__())
held[-1].recv(timeout=30)
print("open", flush=True)
time.sleep(600)
"""


def test_a_killed_client_frees_every_place_it_held(worker):
    probe, _ = _open_when_free(lambda: _channel(worker))      # the places of earlier tests are free
    probe.close()
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, str(worker.port), worker.secret, str(LIMIT - 1)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout.readline().strip() == "open", proc.stderr.read()[-2000:]
        assert _refusal(lambda: _channel(worker))[0] == 503
        assert _refusal(lambda: _openpi(worker))[0] == 503
    finally:
        os.kill(proc.pid, signal.SIGKILL)        # no closing handshake: the kernel drops its sockets
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    held = []
    try:
        for _ in range(LIMIT):                  # every place it held comes back
            ws, _ = _open_when_free(lambda: _channel(worker))
            held.append(ws)
        _act(held[0], 1)
        assert _answer(held[0])[:2] == (1, 200)
        assert _refusal(lambda: _openpi(worker))[0] == 503
    finally:
        for ws in held:
            ws.close()


def test_an_openpi_answer_to_a_client_gone_is_metered_undelivered(worker):
    """The client sends an observation and closes before the 1 s inference ends: the worker
    counts the request, as an error (status 0), with its bytes in and none out."""
    pi, _ = _open_when_free(lambda: _openpi(worker))
    before = _usage(worker)
    message = _observation()
    with pi:
        pi.recv(timeout=30)                     # the metadata: not an /act
        pi.send(message)
    got = _usage_after(worker, before, 1)
    assert got == {"requests": 1, "errors": 1, "bytes_in": len(message), "bytes_out": 0}
    # and one delivered is counted with what was sent
    pi, _ = _open_when_free(lambda: _openpi(worker))
    before = _usage(worker)
    with pi:
        pi.recv(timeout=30)
        pi.send(message)
        answer = pi.recv(timeout=30)
    got = _usage_after(worker, before, 1)
    assert got == {"requests": 1, "errors": 0, "bytes_in": len(message), "bytes_out": len(answer)}


def test_a_channel_request_running_when_the_client_goes_is_metered_undelivered(worker):
    """Two slow requests on one channel (one replica: the second waits in its queue), then the
    channel closes: the running one is counted as an undelivered error, the queued one, which
    never runs, is not counted."""
    ws, _ = _open_when_free(lambda: _channel(worker))
    before = _usage(worker)
    with ws:
        size = _act(ws, 1, latency_ms=SLOW_MS)
        _act(ws, 2, latency_ms=SLOW_MS)
        time.sleep(0.3)                         # the first is running, the second queued behind it
    got = _usage_after(worker, before, 1)
    time.sleep(2 * SLOW_MS / 1000.0)            # room for the second, were it run and counted
    assert _usage_after(worker, before, 2, timeout=0.0) == got
    assert got == {"requests": 1, "errors": 1, "bytes_in": size, "bytes_out": 0}


def test_the_limit_defaults_to_64_and_a_bad_setting_stops_the_worker_naming_it(tmp_path, monkeypatch):
    from sequence_ai_server.worker.channel import MAX_CONNECTIONS
    from sequence_ai_server.worker.asgi import WorkerState, create_app
    for name in ("SEQ_CAPTURE_DIR", "SEQ_WORKER_SECRET_FILE", "SEQ_WORKER_ACTIVITY_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert MAX_CONNECTIONS == 64
    assert create_app(WorkerState("w"), "s3cret").state.connections.limit == 64
    assert create_app(WorkerState("w"), "s3cret", max_connections=5).state.connections.limit == 5
    for bad in ("0", "many"):
        done = subprocess.run([sys.executable, "-m", "sequence_ai_server.worker", "--file", ECHO,
                               "--ready-file", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=60,
                              env=_env({"SEQ_WORKER_SECRET": "s3cret", "SEQ_WORKER_MAX_CONNECTIONS": bad}))
        assert done.returncode == 2 and not (tmp_path / "r.json").exists()
        assert f"{bad!r} is not a whole number >= 1" in done.stderr and "SEQ_WORKER_MAX_CONNECTIONS" in done.stderr


_FULL_WORKER_CLIENT = """
import asyncio, sys, time
from sequence_ai_core._wire import Session, WorkerLink
from _core_support import observation
async def go():
    wire = WorkerLink("http://127.0.0.1:9", "unused", "w", body_format="binary")
    wire.session = Session(session_id=None, worker_url=sys.argv[1], direct_secret=sys.argv[2])
    pred = await wire.act(observation().to_wire(), params={"latency_ms": 0.0})
    paused = wire.transports.paused_until - time.monotonic()
    await wire.aclose()
    print("OK", wire.transports.opens, len(pred.action_chunk), round(paused))
asyncio.run(go())
"""


def test_a_client_refused_for_want_of_places_uses_http_act_for_a_while(worker):
    """The client's "auto" transport meets a worker whose websocket places are all taken: the
    request goes out over HTTP /act (no error), and the channel is not tried again for 30 s."""
    held = [_channel(worker) for _ in range(LIMIT)]
    try:
        done = subprocess.run([sys.executable, "-c", _FULL_WORKER_CLIENT, worker.url, worker.secret],
                              capture_output=True, text=True, timeout=120, cwd=str(Path(__file__).parents[2]),
                              env=_env({"PYTHONPATH": f"{Path(__file__).parents[1]}:{Path(__file__).parents[2]}"}))
    finally:
        for ws in held:
            ws.close()
    assert done.stdout.strip() == "OK 0 10 30", done.stdout + done.stderr[-2000:]


def test_the_worker_side_of_a_connection_keeps_tcp_keepalive_on(worker):
    """A link that dies silently (no FIN, no RST) would hold a place until TCP gives up; the worker's
    accepted sockets probe it: ``ss`` shows a keepalive timer on the worker's end, idle time 30 s."""
    ws = _channel(worker)
    try:
        out = subprocess.run(["ss", "-tnoH", "state", "established", f"( sport = :{worker.port} )"],
                             capture_output=True, text=True, timeout=30).stdout
    finally:
        ws.close()
    assert "timer:(keepalive," in out, out
    seconds = float(out.split("timer:(keepalive,", 1)[1].split(",", 1)[0].rstrip("sec"))
    assert 20 < seconds <= 30, out


def test_an_http_act_whose_client_left_before_the_answer_is_metered_undelivered(worker):
    """POST /act, then the client gives up (its read timeout closes the connection) while the
    policy still runs: the answer the server drops is counted as an error with no bytes out; a
    delivered answer keeps its status and size."""
    content, ctype = encode_act_body({"observation": echo_observation(), "params": {"latency_ms": SLOW_MS}}, True)
    headers = {"Authorization": f"Bearer {worker.secret}", "Content-Type": ctype}
    before = _usage(worker)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{worker.url}/act", content=content, headers=headers, timeout=0.3, trust_env=False)
    got = _usage_after(worker, before, 1)
    assert got == {"requests": 1, "errors": 1, "bytes_in": len(content), "bytes_out": 0}
    fast, _ = encode_act_body({"observation": echo_observation(), "params": {"latency_ms": 0.0}}, True)
    before = _usage(worker)
    answer = httpx.post(f"{worker.url}/act", content=fast, headers=headers, timeout=30, trust_env=False)
    assert answer.status_code == 200
    assert _usage_after(worker, before, 1) == {"requests": 1, "errors": 0, "bytes_in": len(fast),
                                               "bytes_out": len(answer.content)}


def test_a_sync_predict_refused_for_want_of_places_asks_the_worker_once_per_pause(worker, monkeypatch):
    """The sync client's blocking channel meets the full worker first: the link pauses the channel,
    so the request goes straight to HTTP /act instead of asking for a place a second time."""
    import sequence_ai
    from sequence_ai_core import _channel as channel_module
    from sequence_ai_core._wire import Session
    asked = []
    real_connect = channel_module.ActChannel.connect

    async def counted_connect(self):
        asked.append(self.worker_url)
        return await real_connect(self)
    monkeypatch.setattr(channel_module.ActChannel, "connect", counted_connect)
    held = [_channel(worker) for _ in range(LIMIT)]
    try:
        policy = sequence_ai.Policy(sequence_ai.aconnect("w", api_key="unused", gateway_url="http://127.0.0.1:9"))
        wire = policy._engine._wire
        wire.session = Session(session_id=None, worker_url=worker.url, direct_secret=worker.secret)
        before = time.monotonic()
        pred = policy.predict(echo_observation(), params={"latency_ms": 0.0})
        assert len(pred.action_chunk) == 10
        assert wire.transports.paused_until > before + 29 and wire.transports.opens == 0
        assert asked == []                # the asyncio wire never asked for a place
        policy.close()
    finally:
        for ws in held:
            ws.close()
