"""The worker refuses a body over its limit from what the client declares, before anything reads
the body (order: credentials -> declared size -> body):

* an HTTP ``Content-Length`` over the limit is answered 413 ``payload_too_large`` from the
  headers -- JSON and binary /act bodies, the worker secret or a lease token, /episode/end and
  the tighter /control/revoke limit; a wrong or missing secret is still 401 first;
* a chunked body (no Content-Length) is refused 413 once it has streamed past the limit, and the
  connection is closed: the rest is never read;
* a websocket frame claiming more than the channel's message limit (the /act channel and the
  openpi endpoint; ``act_channel.channel_max_size``) closes the connection with 1009 from the
  frame header, a whole message or its second fragment.

Real worker processes on loopback; raw sockets send only the headers (or a frame header), so an
answer proves the worker never waited for the body. Each answer must come within ``BOUND_S``
(the worker answers in milliseconds; the bound leaves room for a loaded 2-core machine)."""
from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time

import pytest

from _servers import echo_observation
from sequence_ai_core.protocol import ACT_CHANNEL_PATH, BINARY_CONTENT_TYPE, JSON_CONTENT_TYPE, MAX_BODY_BYTES
from sequence_ai_server.worker.channel import channel_max_size
from sequence_ai_server.common.leases import sign_lease
from sequence_ai_server.worker.app import CONTROL_MAX_BODY_BYTES

CLAIM = 1_000_000_000          # the declared size: 1 GB, never sent
BOUND_S = 2.0
SMALL_LIMIT = 200_000          # conftest's small_body_worker
CONTENT_TYPES = [JSON_CONTENT_TYPE, BINARY_CONTENT_TYPE]


class NoAnswer(AssertionError):
    pass


def _open(port: int, head: str) -> tuple[socket.socket, float]:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(BOUND_S)
    t0 = time.perf_counter()
    sock.sendall(head.encode("latin-1"))
    return sock, t0


def _post(port: int, path: str, token: str | None, ctype: str, length: int | None) -> tuple[socket.socket, float]:
    """Send only the headers of a POST declaring ``length`` bytes (None: chunked)."""
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return _open(port, f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: {ctype}\r\n{size}\r\n")


def _recv(sock: socket.socket, n: int = 65536) -> bytes:
    try:
        return sock.recv(n)
    except socket.timeout:
        raise NoAnswer(f"nothing from the worker within {BOUND_S} s") from None


def _response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """(status, lower-cased headers, body) of one HTTP response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = _recv(sock)
        assert chunk, f"the worker closed the connection without an answer (got {data!r})"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = _recv(sock)
        assert chunk, "the answer was cut short"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _closed(sock: socket.socket) -> None:
    """The worker closes the connection after its answer (nothing more of the body is read)."""
    try:
        rest = _recv(sock)
    except ConnectionResetError:
        return
    assert rest == b"", f"more than one answer: {rest!r}"


def _refused_too_large(sock: socket.socket, t0: float, limit: int, size: int | None) -> float:
    status, headers, body = _response(sock)
    took = time.perf_counter() - t0
    err = json.loads(body)
    assert (status, err["code"]) == (413, "payload_too_large"), body
    assert err["details"] == {"limit_bytes": limit} and f"at most {limit} bytes" in err["detail"], err
    assert (f"is {size} bytes" if size is not None else "over the limit") in err["detail"], err
    assert "JPEG" in err["hint"] and err["request_id"] == headers["x-request-id"], err
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    assert took < BOUND_S, f"413 after {took:.3f} s"
    _closed(sock)
    return took


def _lease(worker) -> str:
    return sign_lease(worker.secret, "sess_big", 1, time.time() + 300)


# ---------------------------------------------------------------- a declared Content-Length

@pytest.mark.parametrize("credential", ["secret", "lease"])
@pytest.mark.parametrize("ctype", CONTENT_TYPES)
def test_an_authenticated_act_declaring_1_gb_is_413_from_its_headers(worker, ctype, credential):
    token = worker.secret if credential == "secret" else _lease(worker)
    for _ in range(3):                   # and again on fresh connections: nothing was left waiting
        sock, t0 = _post(worker.port, "/act", token, ctype, CLAIM)
        with sock:
            _refused_too_large(sock, t0, MAX_BODY_BYTES, CLAIM)
    r = worker.act({"observation": echo_observation()})
    assert r.status_code == 200 and r.json()["action_chunk"], r.text


@pytest.mark.parametrize("ctype", CONTENT_TYPES)
@pytest.mark.parametrize("token", [None, "wrong-secret"])
def test_credentials_come_before_the_declared_size(worker, ctype, token):
    sock, t0 = _post(worker.port, "/act", token, ctype, CLAIM)
    with sock:
        status, _, body = _response(sock)
        took = time.perf_counter() - t0
    assert (status, json.loads(body)["code"]) == (401, "unauthorized"), body
    assert took < BOUND_S, f"401 after {took:.3f} s"


def test_episode_end_and_control_revoke_refuse_a_claim_over_their_limits(worker):
    sock, t0 = _post(worker.port, "/episode/end", _lease(worker), JSON_CONTENT_TYPE, CLAIM)
    with sock:
        _refused_too_large(sock, t0, MAX_BODY_BYTES, CLAIM)
    over = CONTROL_MAX_BODY_BYTES + 1            # the control route's own, tighter limit
    sock, t0 = _post(worker.port, "/control/revoke", worker.secret, JSON_CONTENT_TYPE, over)
    with sock:
        _refused_too_large(sock, t0, CONTROL_MAX_BODY_BYTES, over)
    sock, _ = _post(worker.port, "/control/revoke", _lease(worker), JSON_CONTENT_TYPE, over)
    with sock:                                   # a lease token is refused there before its size
        assert _response(sock)[0] == 401


# ---------------------------------------------------------------- a chunked body

@pytest.mark.parametrize("ctype", CONTENT_TYPES)
def test_a_chunked_act_streaming_past_the_limit_is_413_once_it_crosses_it(small_body_worker, ctype):
    """Chunks a little past the 200 kB limit, then nothing: the 413 comes back without the body
    ending, and the connection is closed (the worker reads no more of it)."""
    w = small_body_worker
    sock, _ = _post(w.port, "/act", w.secret, ctype, None)
    with sock:
        piece = b"x" * 16384
        chunk = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        for _ in range(SMALL_LIMIT // len(piece) + 1):
            sock.sendall(chunk)
        t0 = time.perf_counter()                 # the limit is crossed by now
        _refused_too_large(sock, t0, SMALL_LIMIT, None)
    r = w.act({"observation": echo_observation()})
    assert r.status_code == 200, r.text


def test_a_chunked_act_under_the_limit_is_served(small_body_worker):
    w = small_body_worker
    body = json.dumps({"observation": echo_observation()}).encode()
    sock, _ = _post(w.port, "/act", w.secret, JSON_CONTENT_TYPE, None)
    with sock:
        for i in range(0, len(body), 1000):
            piece = body[i:i + 1000]
            sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        sock.sendall(b"0\r\n\r\n")
        status, _, answer = _response(sock)
    assert status == 200 and json.loads(answer)["action_chunk"], answer


# ---------------------------------------------------------------- a websocket frame's claim

def _upgrade(port: int, path: str, token: str) -> socket.socket:
    key = base64.b64encode(os.urandom(16)).decode()
    sock, _ = _open(port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                          f"Authorization: Bearer {token}\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = _recv(sock, 1)                   # byte by byte: what follows the head is a frame
        assert chunk, "closed during the upgrade"
        data += chunk
    assert data.startswith(b"HTTP/1.1 101"), data
    return sock


def _frame_head(opcode: int, length: int, fin: bool = True) -> bytes:
    """A client frame's header (masked) declaring ``length`` payload bytes."""
    return struct.pack(">BBQ", (0x80 if fin else 0) | opcode, 0x80 | 127, length) + os.urandom(4)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = _recv(sock, n - len(data))
        assert chunk, "closed without a close frame"
        data += chunk
    return data


def _close_code(sock: socket.socket) -> int:
    """Read server frames (a first metadata message is passed over) up to the close frame: its code."""
    while True:
        b0, b1 = _exactly(sock, 2)
        n = b1 & 0x7F
        if n >= 126:
            n = int.from_bytes(_exactly(sock, 2 if n == 126 else 8), "big")
        payload = _exactly(sock, n)
        if b0 & 0x0F == 0x8:
            return struct.unpack(">H", payload[:2])[0]


@pytest.mark.parametrize("fragmented", [False, True])
@pytest.mark.parametrize("path", [ACT_CHANNEL_PATH, "/"])
def test_a_websocket_frame_claiming_1_gb_closes_it_with_1009_from_the_header(worker, path, fragmented):
    assert CLAIM > channel_max_size(MAX_BODY_BYTES)
    with _upgrade(worker.port, path, worker.secret) as sock:
        if fragmented:                           # a small first fragment, then one claiming 1 GB
            first = b"\0" * 1024
            mask = os.urandom(4)
            sock.sendall(struct.pack(">BBH", 0x02, 0x80 | 126, len(first)) + mask
                         + bytes(c ^ mask[i % 4] for i, c in enumerate(first)))
            head = _frame_head(0x0, CLAIM)
        else:
            head = _frame_head(0x2, CLAIM)
        t0 = time.perf_counter()
        sock.sendall(head)
        code = _close_code(sock)
        took = time.perf_counter() - t0
        assert code == 1009, code
        assert took < BOUND_S, f"1009 after {took:.3f} s"
        _closed(sock)
