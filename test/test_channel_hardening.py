"""The /act channel under misuse, against a real worker process on loopback: a cancel for a
request that is not in flight, a peer that floods one channel with requests, and a worker that
stops reading (SIGSTOP) or dies (SIGKILL) under the client's request -- the client raises a
typed error within its timeout, never hangs."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import time

import pytest
from websockets.sync.client import connect as ws_connect

from _core_support import ECHO
from _servers import WorkerProcess, echo_observation
from sequence_ai_core._channel import ActChannel, ChannelDropped
from sequence_ai_core.protocol import encode_act_body
from sequence_ai_server.act_channel import MAX_IN_FLIGHT


def _ws(worker):
    return ws_connect(f"ws://127.0.0.1:{worker.port}/act/ws", max_size=None, proxy=None,
                      additional_headers={"Authorization": f"Bearer {worker.secret}"})


def _send(ws, seq, params=None):
    content, _ = encode_act_body({"observation": echo_observation(), "params": params or {}}, True)
    ws.send(struct.pack(">IB", seq, 1) + content)


def _answer(ws, timeout=30):
    data = ws.recv(timeout=timeout)
    seq, status = struct.unpack_from(">IH", data)
    return seq, status, json.loads(data[6:])


def test_a_cancel_for_a_request_not_in_flight_does_not_drop_a_later_one(worker):
    """A cancel for a seq never sent (or answered already) is ignored: a request that later
    carries that number is answered."""
    with _ws(worker) as ws:
        ws.send(json.dumps({"cancel": 7}))
        ws.send(json.dumps({"cancel": "x"}))
        ws.send("not json")
        _send(ws, 6)
        assert _answer(ws)[:2] == (6, 200)        # the cancels were read before this answer
        _send(ws, 7)
        seq, status, body = _answer(ws, timeout=20)
    assert (seq, status) == (7, 200) and len(body["action_chunk"]["actions"]) > 0


def test_a_flood_of_requests_on_one_channel_is_refused_past_the_in_flight_limit(worker):
    n = MAX_IN_FLIGHT + 8
    with _ws(worker) as ws:
        for seq in range(1, n + 1):
            _send(ws, seq, {"latency_ms": 50})
        answers = [_answer(ws, timeout=60) for _ in range(n)]
        _send(ws, n + 1)
        after = _answer(ws)
    statuses = {seq: status for seq, status, _ in answers}
    assert sorted(statuses) == list(range(1, n + 1))
    refused = [b for _, s, b in answers if s == 503]
    assert len(refused) >= 8 and all(b["code"] == "unavailable" and b["details"]["max_in_flight"] == MAX_IN_FLIGHT
                                     for b in refused)
    assert sum(1 for s in statuses.values() if s == 200) >= MAX_IN_FLIGHT - 1
    assert after[:2] == (n + 1, 200)             # the channel still serves


def test_a_worker_that_stops_reading_or_dies_gives_a_typed_error_within_the_timeout(tmp_path):
    w = WorkerProcess.start(ECHO, tmp_path, name="stopped")
    try:
        async def stalled():
            ch = ActChannel(w.url, w.secret, timeout_s=2.0)
            assert await ch.connect() is None
            os.kill(w.proc.pid, signal.SIGSTOP)
            t0 = time.monotonic()
            try:
                # far more than the loopback socket buffers hold: the send itself blocks
                with pytest.raises(asyncio.TimeoutError):
                    await ch.request(b"\0" * (48 << 20), True)
            finally:
                os.kill(w.proc.pid, signal.SIGCONT)
            took = time.monotonic() - t0
            reopened = not ch.open and await ch.connect() is None     # the stuck websocket was dropped
            await ch.aclose()
            return took, reopened
        took, reopened = asyncio.run(stalled())
        assert took < 6.0 and reopened

        async def killed():
            ch = ActChannel(w.url, w.secret, timeout_s=30.0)
            assert await ch.connect() is None
            content, _ = encode_act_body({"observation": echo_observation(), "params": {"latency_ms": 3000}}, True)
            asyncio.get_running_loop().call_later(0.5, os.kill, w.proc.pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(ChannelDropped):
                await ch.request(content, True)
            return time.monotonic() - t0
        assert asyncio.run(killed()) < 10.0
    finally:
        w.stop()
