"""One act pipeline behind three transports: HTTP ``POST /act``, the websocket channel
``/act/ws`` and the openpi endpoint at ``/`` refuse the same request with the same typed error,
because each check is written once (``worker/act.py``, ``common/``) and all three call it.

Against one real worker process on loopback (``small_body_worker``: bodies up to 200 kB) with
real clients: a missing or wrong credential, a lease whose session the gateway ended (checked
again on every message of an open websocket), a body over the limit, and a NUL in a JSON string
(the openpi endpoint carries msgpack, so that one is HTTP and channel only). Each refused request
is metered on every transport. The last tests read the source: the three transports import the
pipeline and none imports another, and ``errors`` no longer imports ``json_guard``."""
from __future__ import annotations

import ast
import json
import struct
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from _servers import echo_observation
from sequence_ai_core.protocol import encode_act_body
from sequence_ai_server.common.leases import sign_lease
from sequence_ai_server.worker.openpi import packb

LIMIT = 200_000                      # small_body_worker's SEQ_WORKER_MAX_BODY_BYTES
WORKER = Path(__file__).resolve().parents[2] / "server" / "sequence_ai_server" / "worker"
COMMON = WORKER.parent / "common"


def _http(worker, content: bytes, ctype: str = "application/json", token=None) -> tuple[int, dict]:
    headers = {"Content-Type": ctype}
    if token != "":
        headers["Authorization"] = f"Bearer {worker.secret if token is None else token}"
    r = httpx.post(f"{worker.url}/act", content=content, headers=headers, trust_env=False, timeout=30)
    return r.status_code, r.json()


def _open(worker, path: str, token=None, scheme: str = "Bearer"):
    headers = {} if token == "" else {"Authorization": f"{scheme} {worker.secret if token is None else token}"}
    return ws_connect(f"ws://127.0.0.1:{worker.port}{path}", max_size=None, proxy=None, open_timeout=30,
                      additional_headers=headers).__enter__()


def _refused_upgrade(worker, path: str, token, scheme: str = "Bearer") -> tuple[int, dict]:
    with pytest.raises(InvalidStatus) as refused:
        _open(worker, path, token, scheme).close()
    return refused.value.response.status_code, json.loads(refused.value.response.body)


def _channel(ws, content: bytes, fmt: int = 0) -> tuple[int, dict]:
    ws.send(struct.pack(">IB", 7, fmt) + content)
    seq, status = struct.unpack_from(">IH", data := ws.recv(timeout=30))
    assert seq == 7
    return status, json.loads(data[6:])


def _openpi(ws, message: bytes) -> dict:
    """One message to an open openpi connection -> the error body it answers with (text)."""
    ws.send(message)
    answer = ws.recv(timeout=30)
    assert isinstance(answer, str), "expected an error (a text message), got actions"
    return json.loads(answer)


def _observation() -> bytes:
    return packb({"observation/exterior_1": np.zeros((64, 64, 3), np.uint8),
                  "observation/state": np.arange(8.0), "prompt": "pick"})


def _same(*bodies: dict, but: tuple = ("request_id",)) -> None:
    """The error bodies are equal apart from ``but``."""
    first = {k: v for k, v in bodies[0].items() if k not in but}
    for other in bodies[1:]:
        assert {k: v for k, v in other.items() if k not in but} == first, (bodies[0], other)


def _usage(worker) -> dict:
    return httpx.get(f"{worker.url}/ping", trust_env=False, timeout=30).json()["usage"]


def _grown(worker, before: dict, requests: int, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        now = _usage(worker)
        if now["requests"] - before["requests"] >= requests or time.monotonic() > deadline:
            return {k: now[k] - before[k] for k in ("requests", "errors")}
        time.sleep(0.05)


@pytest.mark.parametrize("token", ["", "not-the-secret"], ids=["missing", "wrong"])
def test_a_missing_or_wrong_credential_is_the_same_401_on_every_transport(small_body_worker, token):
    body, _ = encode_act_body({"observation": echo_observation()}, False)
    status, http = _http(small_body_worker, body, token=token)
    ch_status, channel = _refused_upgrade(small_body_worker, "/act/ws", token)
    op_status, openpi = _refused_upgrade(small_body_worker, "/", token, scheme="Api-Key")
    assert status == ch_status == op_status == 401
    assert http["code"] == channel["code"] == openpi["code"] == "unauthorized"
    _same(http, channel, openpi)


def test_an_ended_session_is_refused_on_the_next_message_of_every_transport(small_body_worker):
    w = small_body_worker
    token = sign_lease(w.secret, "sess_transports", 1, time.time() + 300)
    body, _ = encode_act_body({"observation": echo_observation()}, False)
    assert _http(w, body, token=token)[0] == 200
    channel, openpi = _open(w, "/act/ws", token), _open(w, "/", token, scheme="Api-Key")
    try:
        openpi.recv(timeout=30)                                   # openpi's metadata message
        assert _channel(channel, body)[0] == 200
        assert isinstance(openpi.send(_observation()) or openpi.recv(timeout=30), bytes)   # actions
        r = httpx.post(f"{w.url}/control/revoke", json={"sessions": {"sess_transports": time.time() + 300}},
                       headers={"Authorization": f"Bearer {w.secret}"}, trust_env=False, timeout=30)
        assert r.status_code == 200, r.text
        before = _usage(w)
        status, http = _http(w, body, token=token)
        ch_status, on_channel = _channel(channel, body)
        on_openpi = _openpi(openpi, _observation())
        assert status == ch_status == 401
        assert http["details"] == on_channel["details"] == on_openpi["details"] == {
            "reason": "session_ended", "session_id": "sess_transports"}
        _same(http, on_channel, on_openpi)
        # metered on all three; a 401 is a routine reconnect, not an error (meter.ActMeter)
        assert _grown(w, before, 3) == {"requests": 3, "errors": 0}
    finally:
        channel.close()
        openpi.close()


def test_a_body_over_the_limit_is_the_same_413_on_every_transport(small_body_worker):
    w = small_body_worker
    big = b'{"observation": {"instruction": "' + b"x" * (LIMIT + 1000) + b'"}}'
    channel, openpi = _open(w, "/act/ws"), _open(w, "/", scheme="Api-Key")
    try:
        openpi.recv(timeout=30)
        before = _usage(w)
        status, http = _http(w, big)
        ch_status, on_channel = _channel(channel, big)
        on_openpi = _openpi(openpi, big)
        assert status == ch_status == 413
        for body in (http, on_channel, on_openpi):
            assert body["code"] == "payload_too_large" and body["details"] == {"limit_bytes": LIMIT}, body
        _same(http, on_channel)                      # openpi words it for a message (what, hint)
        assert f"message is {len(big)} bytes" in on_openpi["detail"]
        assert _grown(w, before, 3) == {"requests": 3, "errors": 3}
    finally:
        channel.close()
        openpi.close()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_a_nul_in_a_json_string_is_the_same_400_on_http_and_the_channel(small_body_worker, binary):
    w = small_body_worker
    body, ctype = encode_act_body({"observation": echo_observation(instruction="pick\x00place")}, binary)
    channel = _open(w, "/act/ws")
    try:
        before = _usage(w)
        status, http = _http(w, body, ctype)
        ch_status, on_channel = _channel(channel, body, fmt=int(binary))
        assert status == ch_status == 400
        assert http["details"] == {"reason": "bad_string", "path": "$.observation.instruction"}, http
        _same(http, on_channel)
        assert _grown(w, before, 2) == {"requests": 2, "errors": 2}
    finally:
        channel.close()


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_the_three_transports_import_the_pipeline_and_not_each_other():
    transports = {"app": WORKER / "app.py", "channel": WORKER / "channel.py", "openpi": WORKER / "openpi.py"}
    for name, path in transports.items():
        found = _imports(path)
        assert "sequence_ai_server.worker.act" in found, f"{name} does not run the act pipeline"
        others = {f"sequence_ai_server.worker.{o}" for o in transports if o != name}
        assert not found & others, f"{name} imports {sorted(found & others)}"
    assert not any(m.startswith("sequence_ai_server.worker.") and m.split(".")[2] in transports
                   for m in _imports(WORKER / "act.py"))


def test_errors_and_json_guard_are_no_longer_a_cycle():
    assert not {m for m in _imports(COMMON / "errors.py") if "json_guard" in m}
    assert "sequence_ai_server.common.errors.scrub" in _imports(COMMON / "json_guard.py")
