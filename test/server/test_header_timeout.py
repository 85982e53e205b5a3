"""A deadline on a request's headers (common/header_timeout.py), against a real gateway and a real
worker process on loopback with ``SEQ_HEADER_TIMEOUT_S=1``: a connection that sends part of its
headers, or dribbles them a byte at a time, is answered 408 and closed once the deadline has
passed (never before); so is a kept-alive connection that starts its next request and stalls; a
whole request is answered as always, and the /act channel, once upgraded, stays open past it."""
from __future__ import annotations

import json
import socket
import struct
import time

import pytest
from websockets.sync.client import connect as ws_connect

from _core_support import ECHO
from _servers import GatewayProcess, WorkerProcess, echo_observation
from sequence_ai_core.protocol import encode_act_body
from sequence_ai_server.common.header_timeout import header_timeout_setting

TIMEOUT_S = 1.0
PATH = {"worker": b"/ping", "gateway": b"/healthz"}      # a route each answers without credentials
ENV = {"SEQ_HEADER_TIMEOUT_S": str(TIMEOUT_S)}
BOUND_S = 15.0          # the close must come within this on a loaded 2-core machine


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    worker = WorkerProcess.start(ECHO, tmp_path_factory.mktemp("w"), name="slow-headers", env=ENV)
    gateway = GatewayProcess.start(tmp_path_factory.mktemp("gw"), env=ENV)
    try:
        yield {"worker": worker.port, "gateway": int(gateway.url.rsplit(":", 1)[1]), "secret": worker.secret}
    finally:
        gateway.close()
        worker.stop()


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    s.settimeout(BOUND_S)
    return s


def _until_closed(s: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed (monotonic)."""
    got = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            return got, time.monotonic()
        got += chunk


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_headers_that_stop_half_way_get_408_and_a_close_once_the_deadline_passes(servers, server):
    with _connect(servers[server]) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        got, closed = _until_closed(s)
    assert got.startswith(b"HTTP/1.1 408 "), got
    assert closed - t0 >= TIMEOUT_S * 0.9, f"closed after {closed - t0:.2f} s, before the {TIMEOUT_S} s deadline"


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_dribbling_header_bytes_does_not_extend_the_deadline(servers, server):
    line = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 400
    with _connect(servers[server]) as s:
        t0 = time.monotonic()
        sent_until = None
        for i in range(len(line)):        # one byte every 20 ms: 8 s of dribble for a 1 s deadline
            try:
                s.sendall(line[i:i + 1])
            except OSError:               # the server closed while we were still sending
                sent_until = time.monotonic()
                break
            time.sleep(0.02)
            if i % 10 == 0:
                s.setblocking(False)
                try:
                    peek = s.recv(4096, socket.MSG_PEEK)
                except BlockingIOError:
                    peek = None
                finally:
                    s.setblocking(True)
                    s.settimeout(BOUND_S)
                if peek is not None:      # the answer (or the close) arrived
                    sent_until = time.monotonic()
                    break
        assert sent_until is not None, "the connection was still open after 8 s of dribbled headers"
        assert sent_until - t0 < TIMEOUT_S + BOUND_S
        got, _ = _until_closed(s)
    assert got.startswith(b"HTTP/1.1 408 "), got


@pytest.mark.parametrize("server", ["worker", "gateway"])
def test_a_kept_alive_connection_that_starts_its_next_request_and_stalls_is_closed(servers, server):
    with _connect(servers[server]) as s:
        s.sendall(b"GET " + PATH[server] + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(4096)
        assert head.startswith(b"HTTP/1.1 200"), head
        t0 = time.monotonic()
        s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        got, closed = _until_closed(s)
    assert b"HTTP/1.1 408 " in got, got
    assert closed - t0 >= TIMEOUT_S * 0.9


def test_the_act_channel_stays_open_past_the_deadline_once_upgraded(servers):
    with ws_connect(f"ws://127.0.0.1:{servers['worker']}/act/ws", max_size=None, proxy=None,
                    additional_headers={"Authorization": f"Bearer {servers['secret']}"}) as ws:
        time.sleep(TIMEOUT_S * 2.5)       # well past the header deadline, idle
        content, _ = encode_act_body({"observation": echo_observation(), "params": {}}, True)
        ws.send(struct.pack(">IB", 1, 1) + content)
        data = ws.recv(timeout=BOUND_S)
    seq, status = struct.unpack_from(">IH", data)
    assert (seq, status) == (1, 200), json.loads(data[6:])


def test_a_bad_setting_is_refused_naming_the_variable():
    assert header_timeout_setting({}) == 10.0
    assert header_timeout_setting({"SEQ_HEADER_TIMEOUT_S": " 2.5 "}) == 2.5
    for bad in ("0", "0.000001", "-1", "nan", "inf", "1e9", "soon"):
        with pytest.raises(ValueError, match="SEQ_HEADER_TIMEOUT_S"):
            header_timeout_setting({"SEQ_HEADER_TIMEOUT_S": bad})
