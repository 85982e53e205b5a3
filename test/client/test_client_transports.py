"""The client's /act transports (``sequence_ai_core/_transport.py``) against a real worker process on
loopback: HTTP, the asyncio channel and the blocking channel answer the same request the same way
(status, body, errors, a refused token), and a session keeps one websocket across lease renewals
(the worker's side of the connection is counted by the kernel, not by the client)."""
from __future__ import annotations

import asyncio
import os
import subprocess
import time

import httpx
import pytest

from _core_support import ECHO, connect, observation, unique
from _servers import echo_observation
from sequence_ai_core._blocking import BlockingChannel
from sequence_ai_core._channel import ActChannel, answer_data
from sequence_ai_core._transport import HttpTransport
from sequence_ai_core.protocol import encode_act_body

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")

# Fields of a 200 answer that differ between any two requests (ids and timings).
_VOLATILE = {"request_id", "inference_ms", "queue_ms", "server_ms", "timing"}


def _requests():
    """(name, /act body, binary) for the same requests over every transport."""
    good = {"observation": echo_observation(joint_positions=[0, 0, 1, 2, 3, 4, 5]), "params": {"chunk_len": 4}}
    failing = {"observation": echo_observation(), "params": {"fail": "RuntimeError"}}
    bad_image = {"observation": echo_observation(views={"exterior_1": "bm90IGFuIGltYWdl"}), "params": {}}
    return [("binary", good, True), ("json", good, False), ("policy error", failing, True),
            ("bad image", bad_image, False)]


def _answers(worker, token=None):
    """Every request of ``_requests`` over each transport, in turn -> {transport: [(status, body)]},
    and each transport's answer to ``token`` (a refused open is the channel's answer)."""
    token = worker.secret if token is None else token
    bodies = [(name, *encode_act_body(body, binary)) for name, body, binary in _requests()]
    out, flags = {}, {}

    async def over_asyncio():
        async with httpx.AsyncClient(trust_env=False, timeout=30.0) as client:
            http = HttpTransport(lambda: client, worker.url, token)
            out["http"] = [await http.request(content, ctype.endswith("+bin")) for _, content, ctype in bodies]
        channel = ActChannel(worker.url, token, 30.0)
        refusal = await channel.connect()
        try:
            out["channel"] = [refusal] if refusal is not None else \
                [await channel.request(content, ctype.endswith("+bin")) for _, content, ctype in bodies]
            flags["channel_binary"] = channel.binary_answers
        finally:
            await channel.aclose()
    asyncio.run(over_asyncio())
    blocking = BlockingChannel(worker.url, token, 30.0)
    refusal = blocking.connect()
    try:
        out["blocking"] = [refusal] if refusal is not None else \
            [blocking.request(content, ctype.endswith("+bin")) for _, content, ctype in bodies]
        flags["blocking_binary"] = blocking.binary_answers
    finally:
        blocking.close()
    # the channels' 200s are binary answers (protocol.encode_act_answer): read as the client reads them
    return {kind: [(r.status_code, answer_data(r)) for r in answers] for kind, answers in out.items()} | flags


def _steady(body: dict) -> dict:
    """A 200 answer without what differs between requests: ids, timings, the echo policy's call
    counter (column 0 of every row)."""
    body = {k: v for k, v in body.items() if k not in _VOLATILE}
    chunk = dict(body.get("action_chunk") or {})
    if chunk.get("actions"):
        chunk["actions"] = [row[1:] for row in chunk["actions"]]
        body["action_chunk"] = chunk
    return body


def test_every_transport_answers_the_same_request_the_same(worker):
    answers = _answers(worker)
    binary = {k: answers.pop(k) for k in ("channel_binary", "blocking_binary")}
    http = answers.pop("http")
    assert [status for status, _ in http] == [200, 200, 500, 400], http
    counters = {}
    for kind, got in answers.items():
        assert [status for status, _ in got] == [status for status, _ in http], (kind, got)
        for (status, body), (_, want) in zip(got, http):
            if status == 200:
                assert _steady(body) == _steady(want), (kind, body, want)
            else:      # the same error body: code, message, retryable, hint, details
                assert {k: v for k, v in body.items() if k != "request_id"} == \
                    {k: v for k, v in want.items() if k != "request_id"}, (kind, body, want)
        counters[kind] = [body["action_chunk"]["actions"][0][0] for status, body in got if status == 200]
    # one worker, one counter: each transport's two good requests ran once each, in order
    firsts = [b["action_chunk"]["actions"][0][0] for s, b in http if s == 200]
    assert firsts[1] == firsts[0] + 1
    assert counters["channel"][1] == counters["channel"][0] + 1
    assert counters["blocking"][1] == counters["blocking"][0] + 1
    assert binary == {"channel_binary": True, "blocking_binary": True}, "both channels asked for binary answers and got them"


def test_every_transport_refuses_a_wrong_token_the_same(worker):
    answers = _answers(worker, token="not-the-secret")
    answers.pop("channel_binary", None), answers.pop("blocking_binary", None)
    shapes = {kind: [(status, body.get("code")) for status, body in got] for kind, got in answers.items()}
    assert shapes["http"] == [(401, "unauthorized")] * 4, shapes
    assert shapes["channel"] == shapes["blocking"] == [(401, "unauthorized")], shapes    # refused at the open
    assert answers["channel"][0][1]["detail"] == answers["blocking"][0][1]["detail"] == answers["http"][0][1]["detail"]


def _client_ports_of(worker_port: int) -> list:
    """The local ports of this process's established TCP connections to ``worker_port`` (the
    gateway's health checks connect there too: they are not ours)."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( dport = :{worker_port} )"],
                         capture_output=True, text=True, timeout=30).stdout
    mine = [line.split() for line in out.strip().splitlines() if f"pid={os.getpid()}," in line]
    return sorted(int(fields[2].rsplit(":", 1)[1]) for fields in mine)


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_session_keeps_one_websocket_across_lease_renewals(shared_module_gateway, face):
    """Three lease renewals through the gateway, each beside the session's requests: every request
    rides the one channel the session opened first (the same TCP connection, seen from the
    worker's port; for the sync face, the same-host door's one socket), each renewal's token
    handed to it; no second socket, no reconnect."""
    name = unique(f"echo-renew-{face}")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    if face == "sync":
        with connect(shared_module_gateway, name) as policy:
            seen = _renew_three_times(policy._engine._wire, lambda: policy.predict(observation()))
            reconnects = policy.reconnects
    else:
        import sequence_ai

        async def go():
            async with sequence_ai.aconnect(name, api_key=shared_module_gateway.api_key,
                                            gateway_url=shared_module_gateway.url) as policy:
                link = policy._wire
                loop = asyncio.get_running_loop()
                predicts = []

                def predict():     # _renew_three_times is plain code: run each predict to its end
                    predicts.append(asyncio.run_coroutine_threadsafe(policy.predict(observation()), loop))
                    return predicts[-1].result(60)
                seen = await loop.run_in_executor(None, _renew_three_times, link, predict)
                return seen, policy.reconnects
        seen, reconnects = asyncio.run(go())
    ports, opens, refreshes, renewals, tokens = seen
    assert renewals == 3 and reconnects == 0 and len(set(tokens)) == 4     # a new token each time
    assert opens == 1 and refreshes == 3
    assert len(ports[0]) == 1 and all(p == ports[0] for p in ports), ports    # one socket, never reopened


def _connections_of(link, worker_port: int) -> list:
    """The session's connections to its worker: its same-host door's Unix socket (the inode: the
    sync face on a loopback worker moves its channel there), else :func:`_client_ports_of`."""
    local = getattr(link.transports.current, "local", None)
    if local is not None:
        assert _client_ports_of(worker_port) == []      # the websocket it came through is closed
        return [("door", os.fstat(local.sock.fileno()).st_ino)]
    return _client_ports_of(worker_port)


def _renew_three_times(link, predict):
    """Predict, then force three renewals (each beside the requests), predicting until each lands.
    -> (the client's connections to the worker after each step, channels opened, tokens handed
    to an open channel, renewals, the session's tokens)."""
    predict()
    worker_port = int(link.session.worker_url.rsplit(":", 1)[1])
    ports, tokens = [_connections_of(link, worker_port)], [link.session.direct_secret]
    for renewal in (1, 2, 3):
        link.session.renew_at = 0.0               # due now: renewed beside the next requests
        deadline = time.monotonic() + 30
        while link.renewals < renewal:
            assert time.monotonic() < deadline, (link.renewals, link.renew_failures)
            predict()
            time.sleep(0.02)
        predict()                                 # carries the renewed token
        ports.append(_connections_of(link, worker_port))
        tokens.append(link.session.direct_secret)
    transports = link.transports
    assert transports.current.token == link.session.direct_secret
    return ports, transports.opens, transports.refreshes, link.renewals, tokens


@pytest.mark.parametrize("transport", ["http", "auto"])
def test_sync_predict_goes_on_over_whichever_transport_the_link_picked(shared_module_gateway, transport):
    """transport="http" (or a channel that cannot be used): every sync predict after the first
    still reaches the worker, over HTTP on the event loop; "auto": over the one blocking channel."""
    name = unique(f"echo-sync-{transport}")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name, transport=transport) as policy:
        firsts = [policy.predict(observation()).action_chunk.actions[0][0] for _ in range(4)]
        transports = policy._engine._wire.transports
        assert firsts == [firsts[0] + i for i in range(4)]
        if transport == "http":
            assert isinstance(transports.current, HttpTransport) and transports.opens == 0
        else:
            assert isinstance(transports.current, BlockingChannel) and transports.opens == 1
            assert transports.current.requests == 4
