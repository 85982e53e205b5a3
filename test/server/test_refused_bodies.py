"""What a server does with a body it will not read, on real worker and gateway processes:

* an answer sent before the body was read -- a wrong secret or key (401), an unknown route
  (404, a JSON body included: before, the JSON guard read up to 32 MiB of it first) or method
  (405) -- carries ``Connection: close`` and the server closes the connection after it, so a
  client pushing a 1 GB (or endless chunked) body into a refusal is cut off after what the socket
  buffers hold (before: uvicorn read and discarded all of it to keep the connection alive, 1 GB
  in under a second);
* a declared ``Content-Length`` with optional whitespace after the digits (RFC 9110 OWS) is
  read as its digits: over the limit, 413 from the headers (before: no answer at all), with the
  limit in ``details.limit_bytes`` on the gateway as on the worker;
* a client that goes away while its body is being sent is one INFO line, no traceback and no
  ERROR, nothing answered, no 5xx in the gateway's metrics and no /act counted by the worker's
  meter, and the server keeps serving.

Raw sockets, so only the headers (or part of a body) are sent. ``BOUND_S`` bounds each wait and
leaves room for a loaded 2-core machine (the servers answer in milliseconds)."""
from __future__ import annotations

import re
import socket
import time

import httpx
import pytest

from _servers import echo_observation
from _wait import eventually
from sequence_ai_core.protocol import JSON_CONTENT_TYPE, MAX_BODY_BYTES

CLAIM = 1_000_000_000          # a declared 1 GB
BOUND_S = 2.0
PUSH_LIMIT = 64 * 1024 * 1024  # far more than loopback socket buffers hold: a server still reading
PIECE = b"x" * 65536


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _request(port: int, method: str, path: str, token: str | None, length: int | str | None,
             ctype: str = JSON_CONTENT_TYPE) -> socket.socket:
    """Send only the head of a request declaring ``length`` (None: chunked; a str is sent as is)."""
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(BOUND_S)
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: {ctype}\r\n"
                 f"{size}\r\n".encode("latin-1"))
    return sock


def _response(sock: socket.socket) -> tuple[int, dict, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            raise AssertionError(f"no answer within {BOUND_S} s (got {data!r})") from None
        assert chunk, f"closed without an answer (got {data!r})"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the answer was cut short"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _pushed_until_closed(sock: socket.socket, chunked: bool) -> tuple[int, float]:
    """Keep sending the body after the answer until the server's close stops it -> (bytes the
    socket took, seconds). Fails when the server reads on (``PUSH_LIMIT`` taken) or neither
    reads nor closes (a send blocks ``BOUND_S``)."""
    piece = f"{len(PIECE):x}\r\n".encode() + PIECE + b"\r\n" if chunked else PIECE
    pushed, t0 = 0, time.perf_counter()
    try:
        while pushed < PUSH_LIMIT:
            sock.sendall(piece)
            pushed += len(piece)
            if time.perf_counter() - t0 > BOUND_S:
                break
    except (BrokenPipeError, ConnectionResetError):
        return pushed, time.perf_counter() - t0
    except socket.timeout:
        raise AssertionError(f"after {pushed} bytes the server neither read nor closed for {BOUND_S} s") from None
    raise AssertionError(f"the server read {pushed} bytes of a refused body in "
                         f"{time.perf_counter() - t0:.2f} s and kept the connection")


def _assert_cut_off(sock: socket.socket, expect: int, length: int | None) -> None:
    with sock:
        status, headers, _ = _response(sock)
        assert status == expect, status
        assert headers.get("connection") == "close", headers
        pushed, took = _pushed_until_closed(sock, chunked=length is None)
    print(f"pushed {pushed} bytes after the answer, cut off in {took * 1000:.1f} ms")
    assert pushed < PUSH_LIMIT // 2 and took < BOUND_S, (pushed, took)


LENGTHS = [CLAIM, None]


@pytest.mark.parametrize("length", LENGTHS, ids=["1GB", "chunked"])
@pytest.mark.parametrize("method,path,token,expect", [
    ("POST", "/act", "wrong-secret", 401),
    ("POST", "/act", None, 401),
    ("POST", "/control/revoke", "wrong-secret", 401),
    ("POST", "/no-such-route", None, 404),   # a JSON body: refused from the request line, not read
    ("PATCH", "/act", None, 405),
])
def test_a_worker_refusal_before_the_body_closes_the_connection(worker, method, path, token, expect, length):
    sock = _request(worker.port, method, path, token, length)
    _assert_cut_off(sock, expect, length)
    assert worker.act({"observation": echo_observation()}).status_code == 200


@pytest.mark.parametrize("length", LENGTHS, ids=["1GB", "chunked"])
@pytest.mark.parametrize("method,path,token,expect", [
    ("POST", "/v1/deployments", "sk-wrong", 401),
    ("POST", "/v1/act", None, 401),
    ("PUT", "/v1/volumes/vol1/uploads/1?path=a.bin&offset=0", "sk-wrong", 401),
    ("POST", "/v1/no-such-route", None, 404),
    ("POST", "/healthz", None, 405),
])
def test_a_gateway_refusal_before_the_body_closes_the_connection(module_gateway, method, path, token, expect, length):
    sock = _request(_port(module_gateway.url), method, path, token, length)
    _assert_cut_off(sock, expect, length)
    assert module_gateway.client.get("/v1/deployments").status_code == 200


def test_an_answer_after_the_body_keeps_the_connection(worker):
    """Only a body left unread closes: an /act whose body was read keeps its keep-alive."""
    with httpx.Client(base_url=worker.url, headers={"Authorization": f"Bearer {worker.secret}"}) as c:
        for _ in range(3):
            r = c.post("/act", json={"observation": echo_observation()})
            assert r.status_code == 200 and "connection" not in r.headers, r.headers
        r = c.post("/act", content=b"{", headers={"Content-Type": JSON_CONTENT_TYPE})
        assert r.status_code == 400 and "connection" not in r.headers, r.headers


# ---------------------------------------------------------------- whitespace around a declared length

@pytest.mark.parametrize("ows", [" ", "\t", "  \t"], ids=["space", "tab", "mixed"])
def test_a_declared_length_with_trailing_whitespace_is_413_from_the_headers(worker, module_gateway, ows):
    for port, path, token, server in [(worker.port, "/act", worker.secret, "worker"),
                                      (_port(module_gateway.url), "/v1/act", module_gateway.api_key, "gateway")]:
        sock = _request(port, "POST", path, token, f"999999999{ows}")
        with sock:
            status, headers, body = _response(sock)
        err = httpx.Response(status, content=body).json()
        assert (status, err["code"]) == (413, "payload_too_large"), (server, body)
        assert err["details"] == {"limit_bytes": MAX_BODY_BYTES}, (server, err)   # one key on both
        assert "is 999999999 bytes" in err["detail"] and headers["connection"] == "close", (server, err)


# ---------------------------------------------------------------- a client that leaves mid-body

def _leave_mid_body(port: int, method: str, path: str, token: str, sent: int) -> None:
    sock = _request(port, method, path, token, 10_000_000)
    with sock:
        sock.sendall(b"x" * sent)


def _wait_log(read, needle: str, count: int, timeout: float = 15.0) -> str:
    def logged():
        text = read()
        return text if text.count(needle) >= count else None

    return eventually(logged, timeout, 0.05, what=f"{count} x {needle!r} in the log", detail=lambda: read()[-3000:])


LEFT = "the client left before its body arrived"


def test_a_client_leaving_mid_upload_is_no_error_on_the_worker(worker):
    before = worker.client.get("/ping").json()["usage"]
    for _ in range(2):
        _leave_mid_body(worker.port, "POST", "/act", worker.secret, 1_000_000)
    text = _wait_log(worker.log, f"POST /act: {LEFT} (10000000 bytes declared); nothing answered", 2)
    assert "Traceback" not in text and " ERROR " not in text and "ClientDisconnect" not in text, text[-3000:]
    usage = worker.client.get("/ping").json()["usage"]
    assert (usage["requests"], usage["errors"]) == (before["requests"], before["errors"]), (before, usage)
    assert worker.act({"observation": echo_observation()}).status_code == 200


def test_a_client_leaving_mid_upload_is_no_error_on_the_gateway(module_gateway):
    gw = module_gateway
    uploads = "/v1/volumes/vol1/uploads/1?path=a.bin&offset=0"
    _leave_mid_body(_port(gw.url), "PUT", uploads, gw.api_key, 4_000_000)
    _leave_mid_body(_port(gw.url), "POST", "/v1/act", gw.api_key, 1_000_000)
    read = gw.log_path.read_text
    _wait_log(read, f"PUT /v1/volumes/vol1/uploads/1: {LEFT}", 1)
    text = _wait_log(read, f"POST /v1/act: {LEFT}", 1)
    assert "Traceback" not in text and " ERROR " not in text and "ClientDisconnect" not in text, text[-3000:]
    metrics = gw.client.get("/metrics").text
    assert not re.search(r'seq_gateway_requests_total\{[^}]*status="5\d\d"', metrics), metrics
    assert gw.client.get("/v1/deployments").status_code == 200
