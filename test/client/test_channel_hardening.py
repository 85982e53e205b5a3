"""The /act channel under misuse, against a real worker process on loopback: a cancel for a
request that is not in flight, text that is no cancel (deeply nested JSON among it) and binary
messages too short to be a request (each answered 400 in the channel's protocol, the channel
kept), a peer that floods one channel with requests, and a worker that
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
from _servers import WorkerProcess, echo_observation, freeze
from sequence_ai_core._channel import ActChannel, ChannelDropped
from sequence_ai_core.protocol import encode_act_body
from sequence_ai_server.worker.channel import MAX_CONTROL_CHARS, MAX_IN_FLIGHT

BOUND_S = 5.0          # an answer the worker sends at once (room for a loaded 2-core machine)


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


def _text_error(ws, timeout=BOUND_S):
    """The text answer to a message that is neither a request nor a cancel: the error body."""
    data = ws.recv(timeout=timeout)
    assert isinstance(data, str), data
    return json.loads(data)


def test_a_cancel_for_a_request_not_in_flight_does_not_drop_a_later_one(worker):
    """A cancel for a seq never sent (or answered already) is ignored: a request that later
    carries that number is answered. A text message that is no cancel is answered 400."""
    with _ws(worker) as ws:
        ws.send(json.dumps({"cancel": 7}))
        ws.send(json.dumps({"cancel": "x"}))
        ws.send("not json")
        for _ in range(2):
            err = _text_error(ws)
            assert (err["code"], err["details"]) == ("invalid_request", {"reason": "bad_control"}), err
        _send(ws, 6)
        assert _answer(ws)[:2] == (6, 200)        # the cancels were read before this answer
        _send(ws, 7)
        seq, status, body = _answer(ws, timeout=20)
    assert (seq, status) == (7, 200) and len(body["action_chunk"]["actions"]) > 0


@pytest.mark.parametrize("text", ["[" * 150000 + "]" * 150000, '{"a":' * 100000 + "1" + "}" * 100000,
                                  "[1]", '{"ping": 1}', '{"cancel": true}', " " * (MAX_CONTROL_CHARS + 1),
                                  '{"token": "t", "cancel": 1}', '{"token": 5}'],
                         ids=["nested-150k", "nested-objects", "list", "no-cancel", "bool", "over-limit",
                              "token-and-cancel", "token-not-a-string"])
def test_a_text_message_that_is_no_cancel_is_answered_400_and_the_channel_stays(worker, text):
    """Deeply nested JSON (before: RecursionError, the connection dropped without a close frame)
    and any other text that is not {"cancel": seq} get the error body as a text answer, at once;
    the channel then serves the next request."""
    with _ws(worker) as ws:
        t0 = time.perf_counter()
        ws.send(text)
        err = _text_error(ws)
        took = time.perf_counter() - t0
        assert err["code"] == "invalid_request" and err["details"] == {"reason": "bad_control"}, err
        assert '{"cancel": seq}' in err["detail"] and '{"token": t}' in err["detail"] and err["request_id"], err
        assert took < BOUND_S, took
        _send(ws, 3)
        assert _answer(ws)[:2] == (3, 200)
    assert "Traceback" not in worker.log() and "RecursionError" not in worker.log()


@pytest.mark.parametrize("size", [0, 1, 3, 4])
def test_a_binary_message_shorter_than_the_request_head_is_answered_400(worker, size):
    """Under 5 bytes (seq u32, format u8) is no request: with its 4-byte seq the binary answer for
    that seq, under 4 bytes (no seq) a text answer; before, it was dropped and the client waited."""
    with _ws(worker) as ws:
        ws.send(struct.pack(">I", 9)[:size] if size <= 4 else b"")
        if size == 4:
            seq, status, err = _answer(ws, timeout=BOUND_S)
            assert (seq, status) == (9, 400), (seq, status, err)
        else:
            err = _text_error(ws)
        assert err["code"] == "invalid_request" and err["details"] == {"reason": "short_request"}, err
        assert f"has {size} bytes" in err["detail"], err
        _send(ws, 10)
        assert _answer(ws)[:2] == (10, 200)


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
            freeze(w.proc.pid)      # all of it: a door thread still running would answer the 48 MiB 413
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
