"""Who may reach the worker's direct path, and when that ends: credentials are checked from the
headers before a byte of the body is read, and a session ended at the gateway (DELETE
/v1/sessions/{id}, or its API key revoked) is refused at the worker at once, not when its lease
runs out -- while the worker keeps serving the leases it holds when its gateway is gone.

Real gateway and worker processes on loopback. The poll fallback is checked against a bare
worker whose ``$SEQ_GATEWAY_URL`` is a small stdlib HTTP server answering the gateway's
``GET /v1/internal/revocations`` (stopping it is how "the gateway is down" is made here)."""
from __future__ import annotations

import collections
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from _servers import ECHO_POLICY, GatewayProcess, WorkerProcess, echo_observation, send_json

from sequence_ai_server.common.leases import sign_lease

BODY = {"observation": echo_observation()}
UPLOAD = 30 * 1024 * 1024          # bytes each unauthenticated upload declares and sends
RSS_LIMIT = 40 * 1024 * 1024       # the worker's RSS may grow by this much over 32 concurrent uploads


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _act(url: str, token: str) -> httpx.Response:
    return httpx.post(f"{url}/act", json=BODY, headers={"Authorization": f"Bearer {token}"}, timeout=30)


# ---------------------------------------------------------------- revocation through the real gateway

@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    g = GatewayProcess.start(tmp_path_factory.mktemp("auth"))
    try:
        g.deploy(ECHO_POLICY, "echo")
        yield g
    finally:
        g.close()


def _connect(gw: GatewayProcess, key: str) -> dict:
    r = httpx.post(f"{gw.url}/v1/connect", json={"model": "echo"}, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _refused_as_ended(r: httpx.Response, session_id: str) -> None:
    assert r.status_code == 401, r.text
    body = r.json()
    assert body["code"] == "unauthorized" and body["details"] == {"reason": "session_ended", "session_id": session_id}
    assert session_id in body["detail"] and "connect" in body["hint"]


def test_revoking_a_key_refuses_its_sessions_next_act_at_the_worker_at_once(gw):
    r = gw.client.post("/v1/keys", json={"name": "arm-3", "deployment": "echo"})
    assert r.status_code == 200, r.text
    robot_key = r.json()["key"]
    robot = [_connect(gw, robot_key) for _ in range(2)]        # two sessions of the key to revoke
    other = _connect(gw, gw.api_key)                             # a session of another key
    for s in robot + [other]:
        assert _act(s["worker_url"], s["direct_secret"]).status_code == 200

    assert gw.client.delete("/v1/keys/arm-3").status_code == 200
    revoked_at = time.monotonic()
    for s in robot:                        # the very next /act of each session, no retry, no wait
        _refused_as_ended(_act(s["worker_url"], s["direct_secret"]), s["session_id"])
    assert time.monotonic() - revoked_at < 1.0
    r = _act(other["worker_url"], other["direct_secret"])
    assert r.status_code == 200 and r.json()["action_chunk"], r.text
    assert gw.connect("echo").status_code == 200                  # the gateway itself goes on
    r = httpx.post(f"{gw.url}/v1/connect", json={"model": "echo"}, headers={"Authorization": f"Bearer {robot_key}"})
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_closing_a_session_refuses_its_next_act_at_the_worker_at_once(gw):
    a, b = _connect(gw, gw.api_key), _connect(gw, gw.api_key)
    assert _act(a["worker_url"], a["direct_secret"]).status_code == 200
    r = gw.client.delete(f"/v1/sessions/{a['session_id']}")
    assert r.status_code == 200 and r.json() == {"session_id": a["session_id"], "closed": True}
    closed_at = time.monotonic()
    _refused_as_ended(_act(a["worker_url"], a["direct_secret"]), a["session_id"])
    assert time.monotonic() - closed_at < 1.0
    r = httpx.post(f"{a['worker_url']}/episode/end", json={"episode_id": "e1"},
                   headers={"Authorization": f"Bearer {a['direct_secret']}"})
    _refused_as_ended(r, a["session_id"])
    assert _act(b["worker_url"], b["direct_secret"]).status_code == 200     # other sessions unaffected


def test_the_gateway_serves_revocations_to_its_workers_only(gw):
    a = _connect(gw, gw.api_key)
    assert gw.client.delete(f"/v1/sessions/{a['session_id']}").status_code == 200
    url = f"{gw.url}/v1/internal/revocations"
    for header in ("Bearer", f"Bearer {gw.api_key}", f"Bearer {a['direct_secret']}", "Bearer not-a-secret"):
        r = httpx.get(url, headers={"Authorization": header})
        assert r.status_code == 401 and r.json()["code"] == "unauthorized", r.text
    secrets = [p.read_text() for p in (gw.data_dir / "run").glob("echo.*.secret")]
    assert secrets
    r = httpx.get(url, headers={"Authorization": f"Bearer {secrets[0]}"})
    assert r.status_code == 200, r.text
    sessions = r.json()["sessions"]
    assert a["session_id"] in sessions and sessions[a["session_id"]] == pytest.approx(a["lease"]["expires_at"], abs=1e-3)


# ---------------------------------------------------------------- the poll fallback, the gateway gone

class _Revocations(BaseHTTPRequestHandler):
    """``GET /v1/internal/revocations`` as the gateway answers it, for the worker secret only."""
    secret = ""
    sessions: dict = {}
    polls = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        ok = self.path == "/v1/internal/revocations" and self.headers.get("Authorization") == f"Bearer {self.secret}"
        type(self).polls += ok
        send_json(self, 200 if ok else 401, {"sessions": type(self).sessions} if ok else {"code": "unauthorized"})

    def log_message(self, *args) -> None:
        pass


def test_a_worker_learns_revocations_from_its_poll_and_keeps_serving_when_the_gateway_is_gone(tmp_path):
    handler = type("Handler", (_Revocations,), {"secret": "", "sessions": {}, "polls": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    w = WorkerProcess.start(ECHO_POLICY, tmp_path, name="polled",
                            env={"SEQ_GATEWAY_URL": f"http://127.0.0.1:{server.server_address[1]}",
                                 "SEQ_REVOCATION_POLL_S": "0.2"})
    try:
        secret = handler.secret = w.secret          # polls answer 401 until now: nothing is learnt from them
        expires = time.time() + 300
        a, b = sign_lease(secret, "sess_a", 1, expires), sign_lease(secret, "sess_b", 1, expires)
        assert _act(w.url, a).status_code == 200 and _act(w.url, b).status_code == 200
        handler.sessions = {"sess_a": expires}              # the gateway ended sess_a; its push never came
        deadline = time.monotonic() + 1.0 + 0.2 * 5
        while _act(w.url, a).status_code == 200:
            assert time.monotonic() < deadline, f"sess_a still served after its revocation ({handler.polls} polls)"
            time.sleep(0.05)
        _refused_as_ended(_act(w.url, a), "sess_a")
        assert handler.polls >= 1
        server.shutdown()                                    # the gateway is gone
        server.server_close()
        time.sleep(1.0)                                      # several failed polls
        for _ in range(3):
            assert _act(w.url, b).status_code == 200         # the lease it holds is still served
            _refused_as_ended(_act(w.url, a), "sess_a")      # and what it learnt is kept
        assert w.proc.poll() is None
    finally:
        w.stop()
        server.server_close()


def test_only_the_worker_secret_reaches_the_control_route(tmp_path):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path, name="control")
    try:
        lease = sign_lease(w.secret, "sess_x", 1, time.time() + 300)
        body = {"sessions": {"sess_x": time.time() + 300}}
        for header in (f"Bearer {lease}", "Bearer wrong", "Bearer", "Basic " + w.secret):
            r = httpx.post(f"{w.url}/control/revoke", json=body, headers={"Authorization": header})
            assert r.status_code == 401 and r.json()["code"] == "unauthorized", r.text
        assert _act(w.url, lease).status_code == 200                      # a robot cannot end its own (or others') session
        r = httpx.post(f"{w.url}/control/revoke", json={"sessions": {"sess_x": "soon"}},
                       headers={"Authorization": f"Bearer {w.secret}"})
        assert r.status_code == 400 and "sessions.sess_x" in r.json()["detail"], r.text
        r = httpx.post(f"{w.url}/control/revoke", json=body, headers={"Authorization": f"Bearer {w.secret}"})
        assert r.status_code == 200 and r.json() == {"revoked": 1, "held": 1}, r.text
        _refused_as_ended(_act(w.url, lease), "sess_x")
        assert _act(w.url, w.secret).status_code == 200                   # the raw secret is not a session
    finally:
        w.stop()


# ---------------------------------------------------------------- credentials before the body

@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    w = WorkerProcess.start(ECHO_POLICY, tmp_path_factory.mktemp("auth-worker"), name="echo")
    yield w
    w.stop()


def _head(path: str, token: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode()


def _status(sock: socket.socket, timeout: float) -> str:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data.split(b"\r\n", 1)[0].decode()


@pytest.mark.parametrize("path", ["/act", "/episode/end"])
def test_a_wrong_secret_is_refused_before_the_body_is_read(echo, path):
    """Headers and 64 KiB of a declared 30 MiB body: the 401 comes back while the rest of the
    upload has not been sent (a worker that read the body first would still be waiting)."""
    with socket.create_connection(("127.0.0.1", echo.port)) as sock:
        sock.sendall(_head(path, "wrong-secret", UPLOAD) + b" " * 65536)
        assert _status(sock, timeout=10.0) == "HTTP/1.1 401 Unauthorized"
    with socket.create_connection(("127.0.0.1", echo.port)) as sock:    # no Authorization at all
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {UPLOAD}\r\n\r\n".encode() + b" " * 1024)
        assert _status(sock, timeout=10.0) == "HTTP/1.1 401 Unauthorized"
    with socket.create_connection(("127.0.0.1", echo.port)) as sock:    # the right secret waits for its body
        sock.sendall(_head(path, echo.secret, UPLOAD) + b" " * 1024)
        with pytest.raises(socket.timeout):
            _status(sock, timeout=1.0)


def test_32_concurrent_unauthenticated_30_mib_uploads_leave_the_worker_rss_flat(echo):
    assert echo.act(BODY).status_code == 200
    before = _rss(echo.proc.pid)
    statuses: list = []
    chunk = b" " * (1024 * 1024)

    sent: list = []

    def upload() -> None:
        # the 401 goes out from the headers and the worker closes the connection after it (the
        # rest of the body is never read): the client's send fails once the socket buffers fill
        with socket.create_connection(("127.0.0.1", echo.port)) as sock:
            sock.sendall(_head("/act", "wrong-secret", UPLOAD))
            n = 0
            try:
                for _ in range(UPLOAD // len(chunk)):
                    sock.sendall(chunk)
                    n += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            sent.append(n)
            try:
                statuses.append(_status(sock, timeout=60.0))
            except ConnectionResetError:
                statuses.append("reset")

    threads = [threading.Thread(target=upload) for _ in range(32)]
    for t in threads:
        t.start()
    peak = before
    while any(t.is_alive() for t in threads):
        peak = max(peak, _rss(echo.proc.pid))
        time.sleep(0.02)
    for t in threads:
        t.join()
    print(f"statuses {collections.Counter(statuses)}, sent before the close: max {max(sent) / 2**20:.1f} MiB")
    assert statuses == ["HTTP/1.1 401 Unauthorized"] * 32
    assert max(sent) < UPLOAD, "the worker read a whole refused body"
    assert peak - before < RSS_LIMIT, f"worker RSS grew by {(peak - before) / 2**20:.0f} MiB"
    assert echo.act(BODY).status_code == 200
