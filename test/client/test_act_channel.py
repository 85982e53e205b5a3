"""The persistent /act channel (``WS /act/ws``) against a real worker process on loopback: the same
answers, errors, credentials and limits as HTTP ``/act``, cancellation of a queued request, and
the client wire using it by default, reconnecting through it, and falling back to HTTP."""
from __future__ import annotations

import asyncio
import base64
import json
import socket
import struct
import subprocess
import sys
import time

import httpx
import pytest
import sequence_ai
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from _core_support import ECHO, connect, observation, unique
from _servers import ROOT, _env, echo_observation
from sequence_ai_core._blocking import BlockingChannel
from sequence_ai_core._transport import HttpTransport
from sequence_ai_core._wire import Session, WorkerLink
from sequence_ai_core.protocol import encode_act_body
from sequence_ai_server.common.leases import sign_lease

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


@pytest.fixture(scope="module")
def worker(small_body_worker):
    return small_body_worker


def _ws(worker, token=None):
    return ws_connect(f"ws://127.0.0.1:{worker.port}/act/ws", max_size=None, proxy=None,
                      additional_headers={"Authorization": f"Bearer {worker.secret if token is None else token}"})


def _body(params=None, **obs):
    return {"observation": echo_observation(**obs), "params": params or {}}


def _send(ws, seq, body, binary=True):
    content, ctype = encode_act_body(body, binary)
    ws.send(struct.pack(">IB", seq, 1 if ctype.endswith("+bin") else 0) + content)


def _answer(ws, timeout=30):
    data = ws.recv(timeout=timeout)
    seq, status = struct.unpack_from(">IH", data)
    return seq, status, json.loads(data[6:])


def test_the_channel_answers_as_http_act_does(worker):
    body = _body({"chunk_len": 4}, joint_positions=[0, 0, 1, 2, 3, 4, 5])
    body["request_id"] = "r-17"          # the client's request id rides the channel untouched and is echoed
    http = worker.act(body)
    assert http.status_code == 200, http.text
    with _ws(worker) as ws:
        _send(ws, 7, body, binary=True)
        seq, status, got = _answer(ws)
        _send(ws, 8, body, binary=False)
        seq2, status2, got_json = _answer(ws)
    assert (seq, status, seq2, status2) == (7, 200, 8, 200)
    rows = got["action_chunk"]["actions"]
    assert len(rows) == 4 and rows[0][2:7] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert rows[0][0] == http.json()["action_chunk"]["actions"][0][0] + 1      # the next request
    assert got_json["action_chunk"]["actions"][0][0] == rows[0][0] + 1
    assert set(got) == set(http.json()) and got["request_id"] == http.json()["request_id"] == "r-17"


def test_errors_have_the_http_shape_and_status(worker):
    bad = _body(views={"exterior_1": base64.b64encode(b"not an image").decode()})
    http = worker.act(bad)
    with _ws(worker) as ws:
        _send(ws, 1, bad, binary=False)
        _, status, err = _answer(ws)
        _send(ws, 2, _body({"fail": "RuntimeError"}))
        _, status_policy, err_policy = _answer(ws)
        _send(ws, 3, _body({"no_such_param": 1}))
        _, status_param, err_param = _answer(ws)
    assert (status, err["code"], err["detail"]) == (http.status_code, http.json()["code"], http.json()["detail"])
    assert status == 400 and err["request_id"].startswith("req_")
    assert status_policy == 500 and err_policy["code"] == "policy_error"
    assert err_policy["details"]["exception_type"] == "RuntimeError"
    assert status_param == 400 and err_param["details"]["reason"] == "params"


def test_credentials_are_checked_at_open_and_per_request(worker):
    with pytest.raises(InvalidStatus) as refused:
        _ws(worker, token="wrong").__enter__()
    assert refused.value.response.status_code == 401
    assert json.loads(refused.value.response.body)["code"] == "unauthorized"
    token = sign_lease(worker.secret, "sess_chan", 1, time.time() + 1.5)
    with _ws(worker, token=token) as ws:
        _send(ws, 1, _body())
        assert _answer(ws)[1] == 200
        time.sleep(1.7)                   # the lease lapses while the channel stays open
        _send(ws, 2, _body())
        seq, status, err = _answer(ws)
    assert (seq, status, err["code"]) == (2, 401, "lease_expired")


def test_the_body_limit_is_the_http_one(worker):
    big = _body(views={"exterior_1": base64.b64encode(b"\xff\xd8" + b"\0" * 250_000).decode()})
    http = worker.act(big)
    with _ws(worker) as ws:
        _send(ws, 1, big)
        _, status, err = _answer(ws)
    assert http.status_code == 413 and (status, err["code"]) == (413, "payload_too_large")
    assert err["details"]["limit_bytes"] == 200000


def test_a_body_far_over_the_limit_is_payload_too_large_on_the_wire(worker):
    """Over twice the limit the worker closes the channel (1009): the wire raises the same
    InvalidRequest payload_too_large as HTTP's 413, without a replay."""
    from sequence_ai_core import InvalidRequest

    async def go():
        wire = _wire(worker)
        obs = observation().to_wire()
        obs["images"][0]["data"] = b"\xff\xd8" + b"\0" * 600_000
        try:
            with pytest.raises(InvalidRequest) as refused:
                await wire.act(obs)
            return refused.value, wire.reconnects
        finally:
            await wire.aclose()
    err, reconnects = asyncio.run(go())
    assert (err.code, err.status_code, reconnects) == ("payload_too_large", 413, 0)


def test_a_cancelled_queued_request_never_runs(worker):
    with _ws(worker) as ws:
        _send(ws, 1, _body({"latency_ms": 600}))
        _send(ws, 2, _body())
        ws.send(json.dumps({"cancel": 2}))
        seq, status, first = _answer(ws)
        _send(ws, 3, _body())
        seq3, status3, third = _answer(ws)
    assert (seq, status, seq3, status3) == (1, 200, 3, 200)       # no answer for 2
    # column 0 is the policy's call counter: request 2 was never run
    assert third["action_chunk"]["actions"][0][0] == first["action_chunk"]["actions"][0][0] + 1


def _wire(worker, **kw) -> WorkerLink:
    wire = WorkerLink("http://127.0.0.1:9", "unused", "chan", timeout_s=30.0, body_format="binary", **kw)
    wire.session = Session(session_id=None, worker_url=worker.url, direct_secret=worker.secret)
    return wire


def test_the_wire_uses_the_channel_and_skips_an_interrupted_answer(worker):
    async def go():
        wire = _wire(worker)
        try:
            first = await wire.act(observation().to_wire())
            slow = asyncio.ensure_future(wire.act(observation().to_wire(), params={"latency_ms": 500}))
            await asyncio.sleep(0.2)
            slow.cancel()                                       # interrupt while it runs
            with pytest.raises(asyncio.CancelledError):
                await slow
            after = await wire.act(observation().to_wire())     # its late answer is skipped
            return wire.transports.opens, wire.transports.current.requests, first, after
        finally:
            await wire.aclose()
    opens, requests, first, after = asyncio.run(go())
    assert (opens, requests) == (1, 2)
    assert after.action_chunk.actions[0][0] == first.action_chunk.actions[0][0] + 2


def _aconnect(gateway, model, **kwargs):
    return sequence_ai.aconnect(model, api_key=gateway.api_key, gateway_url=gateway.url, **kwargs)


def test_a_dropped_channel_is_reopened_and_the_request_replayed(shared_module_gateway):
    """The channel closes under the asyncio wire: it resumes the session through the gateway,
    reopens the channel and replays the request, as for a dropped HTTP connection."""
    name = unique("echo-drop")
    shared_module_gateway.deploy(ECHO, name, wait=True)

    async def go():
        async with _aconnect(shared_module_gateway, name) as policy:
            first = await policy.predict(observation())
            wire = policy._wire
            wire.transports.current._ws.transport.abort()   # the TCP connection goes away under the link
            pred = await policy.predict(observation())
            assert pred.action_chunk.actions[0][0] == first.action_chunk.actions[0][0] + 1
            assert (policy.reconnects, wire.resumed, wire.transports.opens) == (1, 1, 2)
    asyncio.run(go())


def test_sync_predict_rides_a_blocking_channel_once_the_session_is_up(shared_module_gateway):
    """Sync predict(): connect() joined on the event loop; every predict then goes out over the
    blocking channel on this thread (no event loop entered), answered in order."""
    name = unique("echo-fast")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name) as policy:
        link = policy._engine._wire
        firsts = [policy.predict(observation()).action_chunk.actions[0][0] for _ in range(5)]
        assert firsts == [firsts[0] + i for i in range(5)]        # one worker counter, no replays
        channel = link.transports.current
        assert isinstance(channel, BlockingChannel) and (channel.requests, link.transports.opens) == (5, 1)
        entered = []
        real = policy._loop.run_until_complete
        policy._loop.run_until_complete = lambda *a: entered.append(a) or real(*a)
        try:
            policy.predict(observation())
        finally:
            policy._loop.run_until_complete = real
        assert entered == [] and channel.requests == 6


def test_sync_predict_after_a_dropped_or_refused_blocking_channel_reconnects_once(shared_module_gateway):
    """A drop under the blocking channel, or a refused token, is the link's first attempt: it
    reconnects through the gateway once and replays on a new blocking channel; nothing is played
    twice and no asyncio channel is opened."""
    name = unique("echo-fast-drop")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name) as policy:
        link = policy._engine._wire
        a = policy.predict(observation()).action_chunk.actions[0][0]
        b = policy.predict(observation()).action_chunk.actions[0][0]
        channel = link.transports.current            # a loopback worker: its same-host door
        (channel.local.sock if channel.local is not None else channel._sock).shutdown(socket.SHUT_RDWR)   # it goes away
        c = policy.predict(observation()).action_chunk.actions[0][0]
        assert (b, c) == (a + 1, a + 2) and policy.reconnects == 1 and link.transports.opens == 2
        link.session.direct_secret = "rotated-away"     # handed to the channel; its next request is 401
        d = policy.predict(observation())
        assert d.action_chunk.actions[0][0] == a + 3 and policy.reconnects == 2
        assert policy.predict(observation()).action_chunk.actions[0][0] == a + 4
        channel = link.transports.current
        assert isinstance(channel, BlockingChannel) and channel.requests == 2 and link.transports.opens == 3


def test_connect_chooses_the_transport_and_refuses_an_unknown_one(shared_module_gateway):
    name = unique("echo-http")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name, transport="http") as policy:
        pred = policy.predict(observation())
        transports = policy._engine._wire.transports
        assert len(pred.action_chunk) == 10 and transports.mode == "http" and transports.opens == 0
        assert isinstance(transports.current, HttpTransport)
    with pytest.raises(ValueError, match="transport must be one of"):
        connect(shared_module_gateway, name, transport="pigeon")


def test_through_the_gateway_the_channel_is_the_default(shared_module_gateway):
    name = unique("echo-chan")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name) as policy:
        policy.predict(observation())
        policy._engine._wire.session.direct_secret = "rotated-away"   # the channel's next request: 401
        pred = policy.predict(observation())
        transports = policy._engine._wire.transports
        assert len(pred.action_chunk) == 10 and policy.reconnects == 1
        assert transports.mode == "auto" and transports.opens == 2 and transports.current.requests == 1
        policy.predict(observation())                 # the new token's channel takes it
        assert transports.opens == 2 and transports.current.requests == 2   # one websocket at a time


_NO_WEBSOCKETS = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "websockets" or name.startswith("websockets."):
            raise ImportError("blocked for the test")
sys.meta_path.insert(0, Block())
import asyncio
from sequence_ai_core import _channel
from sequence_ai_core._wire import Session, WorkerLink
from _core_support import observation
assert not _channel.available()
async def go():
    wire = WorkerLink("http://127.0.0.1:9", "unused", "w", body_format="binary")
    wire.session = Session(session_id=None, worker_url=sys.argv[1], direct_secret=sys.argv[2])
    pred = await wire.act(observation().to_wire())
    await wire.aclose()
    print("OK", wire.transports.opens, len(pred.action_chunk))
asyncio.run(go())
loop = asyncio.new_event_loop()       # the sync face's path: HTTP on its loop, request after request
link = WorkerLink("http://127.0.0.1:9", "unused", "w", body_format="binary")
link.session = Session(session_id=None, worker_url=sys.argv[1], direct_secret=sys.argv[2])
a, b = (link.act_blocking(observation().to_wire(), loop.run_until_complete) for _ in range(2))
loop.run_until_complete(link.aclose_http())
print("SYNC", link.transports.opens, b.action_chunk.actions[0][0] - a.action_chunk.actions[0][0])
"""


def test_without_websockets_the_wire_falls_back_to_http(worker):
    done = subprocess.run([sys.executable, "-c", _NO_WEBSOCKETS, worker.url, worker.secret], capture_output=True,
                          text=True, timeout=120, env=_env({"PYTHONPATH": f"{ROOT / 'test'}:{ROOT}"}), cwd=ROOT)
    assert done.stdout.split("\n")[:2] == ["OK 0 10", "SYNC 0 1.0"], done.stdout + done.stderr[-2000:]


def test_the_same_host_path_without_websockets_names_the_extra_it_needs(monkeypatch):
    from sequence_ai_core import TransportError, _transport
    monkeypatch.setattr(_transport._channel, "available", lambda: False)
    transports = _transport.Transports("auto", 5.0, lambda: None, shm=True)   # shm: the channel or nothing
    with pytest.raises(TransportError) as caught:
        transports.channel_ok("http://127.0.0.1:9")
    assert "websockets" in str(caught.value) and "sequence-ai[fast]" in caught.value.hint
    assert "transport='auto'" not in caught.value.hint          # auto cannot help: shm has no HTTP fallback


def test_a_worker_without_the_channel_is_reached_over_http(worker):
    """An older worker answers the upgrade with 404: HTTP /act for that worker from then on."""
    async def go():
        wire = _wire(worker)
        wire.session.worker_url = worker.url + "/nochannel"      # /nochannel/act/ws: no such route
        try:
            opened = await wire.transports.aget(wire.session)
            return opened, wire.transports.no_channel
        finally:
            await wire.aclose()
    opened, no_channel = asyncio.run(go())
    assert isinstance(opened, HttpTransport) and no_channel == worker.url + "/nochannel"
    assert httpx.get(worker.url + "/ping", timeout=10).json()["status"] == "ready"


def _usage(worker) -> dict:
    r = httpx.get(f"http://127.0.0.1:{worker.port}/ping", params={"usage_since": 10**9}, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_channel_requests_are_metered_like_http_act(worker):
    before = _usage(worker)
    sent = received = 0
    with _ws(worker) as ws:
        for seq, body in ((1, _body()), (2, _body({"fail": "RuntimeError"})), (3, _body())):
            content, ctype = encode_act_body(body, True)
            ws.send(struct.pack(">IB", seq, 1) + content)
            data = ws.recv(timeout=30)
            sent, received = sent + len(content), received + len(data) - 6
    after = _usage(worker)
    assert after["requests"] - before["requests"] == 3
    assert after["errors"] - before["errors"] == 1            # the policy_error (500)
    assert after["bytes_in"] - before["bytes_in"] == sent
    assert after["bytes_out"] - before["bytes_out"] == received
    assert after["seq"] - before["seq"] == 3
