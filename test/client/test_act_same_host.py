"""The lean /act wire against a real worker process on loopback: the channel's binary answer
(negotiated on the upgrade; a client that does not ask gets JSON), raw frames with no codec
(``observation(codec="raw")``, ``"encoding": "rgb8"``) and the same-host path
(``body_format="shm"``: the frames through a shared-memory segment), with the refusals of each."""
from __future__ import annotations

import asyncio
import contextlib
import base64
import json
import os
import secrets
import signal
import socket
import struct
import time
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sequence_ai
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from _servers import WorkerProcess
from _wait import eventually
from sequence_ai_core._shm import ShmSegment, shm_message
from sequence_ai_core._transport import Transports
from sequence_ai_core._wire import Session, WorkerLink
from sequence_ai_core.protocol import (ANSWER_BINARY, ANSWER_HEADER, LOCAL_HEADER, LOCAL_VERSION_HEADER, SHM_DIR, BinaryBody, FramingError,
                                       decode_act_answer, encode_act_answer, encode_act_body, encode_shm_head, shm_name)
from sequence_ai_server.worker.shm import ChannelSegments

PIXEL = str(Path(__file__).resolve().parents[1] / "policies" / "pixel_policy.py")
CONTRACT = {"observation": {"cameras": {"front": {"width": 32, "height": 24}}, "proprio": {"joint_positions": 7}}}
JOINTS = [0.1 * i + 1.0 / 3.0 for i in range(7)]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = WorkerProcess.start(PIXEL, tmp_path_factory.mktemp("pixel"), name="pixel",
                            env={"SEQ_WORKER_MAX_BODY_BYTES": "200000"})
    yield w
    w.stop()


def _frame(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def _expected(frame: np.ndarray) -> list:
    return [float(frame.astype(np.int64).sum()), float(frame[0, 0, 0]), float(frame[-1, -1, 2]),
            float(frame[:, :, 1].mean()), 24.0, 32.0, JOINTS[0], 1.0]


def _obs(frame: np.ndarray, codec: str = "raw"):
    return sequence_ai.observation(images={"front": frame}, joints=JOINTS, instruction="look", contract=CONTRACT,
                                   codec=codec).to_wire(raw=True)


def _link(worker, body_format: str, transport: str = "channel") -> WorkerLink:
    wire = WorkerLink("http://127.0.0.1:9", "unused", "pixel", body_format=body_format, transport=transport)
    wire.session = Session(session_id=None, worker_url=worker.url, direct_secret=worker.secret)
    return wire


# ---------------------------------------------------------------- the binary answer

def _ws(worker, answer: bool):
    headers = {"Authorization": f"Bearer {worker.secret}", **({ANSWER_HEADER: ANSWER_BINARY} if answer else {})}
    return ws_connect(f"ws://127.0.0.1:{worker.port}/act/ws", max_size=None, proxy=None, additional_headers=headers)


def _request(ws, seq: int, body: dict, fmt: int = 1) -> tuple:
    content, _ = encode_act_body(body, True)
    ws.send(struct.pack(">IB", seq, fmt) + content)
    data = ws.recv(timeout=30)
    got, status = struct.unpack_from(">IH", data)
    return got, status, data[6:]


def test_the_binary_answer_is_asked_for_and_carries_the_json_answers_values(worker):
    frame = _frame(1)
    body = {"observation": _obs(frame), "params": {}, "request_id": "r-9"}
    with _ws(worker, answer=False) as old, _ws(worker, answer=True) as new:
        assert old.response.headers.get(ANSWER_HEADER) is None          # an old client: JSON, as ever
        assert new.response.headers.get(ANSWER_HEADER) == ANSWER_BINARY
        _, status_json, text = _request(old, 1, body)
        _, status_bin, raw = _request(new, 2, body)
    assert status_json == status_bin == 200
    as_json, as_binary = json.loads(text), decode_act_answer(raw)
    assert not raw.startswith(b"{") and as_binary["action_chunk"]["actions"] == as_json["action_chunk"]["actions"]
    assert as_binary["action_chunk"]["actions"] == [_expected(frame)]      # the float64 values, bit for bit
    volatile = {"inference_ms", "server_ms"}
    assert {k: v for k, v in as_binary.items() if k not in volatile} == \
        {k: v for k, v in as_json.items() if k not in volatile}


def test_an_error_on_a_binary_answer_channel_is_the_json_error_body(worker):
    with _ws(worker, answer=True) as ws:
        _, status, raw = _request(ws, 3, {"observation": {"images": [], "proprioception": {}}, "params": {}}, fmt=0)
    assert status == 400 and json.loads(raw)["code"] == "invalid_request"


def test_a_malformed_binary_answer_is_a_framing_error():
    good = encode_act_answer({"action_chunk": {"robot": "r"}, "warnings": []}, struct.pack("<2d", 1.5, -2.0), (1, 2))
    assert decode_act_answer(good)["action_chunk"] == {"robot": "r", "actions": [[1.5, -2.0]]}
    assert decode_act_answer(encode_act_answer({"action_chunk": None, "outputs": 3}, None, None))["outputs"] == 3
    with pytest.raises(ValueError, match="bytes of rows"):
        encode_act_answer({"action_chunk": {}}, b"\0" * 8, (2, 2))
    head = json.dumps({"action_chunk": {"actions": {"blob": [0, 64], "shape": [2, 2], "dtype": "<f8"}}}).encode()
    for bad, words in ((b"\0\0", "4-byte"), (b"\0\0\0\x40{}", "declares 64"), (b"\0\0\0\x02{x", "does not parse"),
                       (len(head).to_bytes(4, "big") + head + b"\0" * 16, "not T x D float64")):
        with pytest.raises(FramingError, match=words):
            decode_act_answer(bad)


# ---------------------------------------------------------------- raw frames (no codec)

def _act_once(worker, body_format: str, obs: dict, transport: str = "http") -> list:
    wire = _link(worker, body_format, transport=transport)

    async def go():
        try:
            return (await wire.act(obs)).action_chunk.actions
        finally:
            await wire.aclose()
    return asyncio.run(go())


def test_raw_frames_reach_the_policy_pixel_for_pixel_on_every_body(worker):
    frame = _frame(2)
    for body_format in ("binary", "json"):
        assert _act_once(worker, body_format, _obs(frame)) == [_expected(frame)], body_format
    lossy = _act_once(worker, "binary", _obs(frame, codec="jpeg"))[0]
    assert lossy[0] != _expected(frame)[0]                  # JPEG q95 of noise is not the pixels


@pytest.mark.parametrize("frame, words", [
    ({"encoding": "rgb9", "shape": [24, 32, 3]}, "is not 'rgb8'"),
    ({"encoding": "rgb8", "shape": [24, 32]}, "must be \\[H, W, 3\\]"),
    ({"encoding": "rgb8", "shape": [24, 32, 4]}, "must be \\[H, W, 3\\]"),
    ({"encoding": "rgb8", "shape": [24, 32, 3], "cut": 1}, "is 2304 bytes, got 2303"),
    ({"encoding": "rgb8", "shape": [32, 24, 3]}, "frame is 24x32, this policy reads 32x24"),
])
def test_a_bad_raw_frame_is_refused_with_a_typed_error(worker, frame, words):
    data = _frame(3).tobytes()[:24 * 32 * 3 - frame.pop("cut", 0)]
    body = {"observation": {"images": [{"view": "front", "data": base64.b64encode(data).decode(), **frame}],
                            "proprioception": {"joint_positions": JOINTS}, "instruction": "look"}, "params": {}}
    r = worker.act(body)
    assert r.status_code == 400 and r.json()["code"] == "invalid_request", r.text
    assert __import__("re").search(words, r.json()["detail"]), r.json()["detail"]


def test_observation_reads_a_contract_once_and_again_when_it_changed_in_place():
    """observation() keeps the typed view of the last contract dict it read (a robot loop builds
    every observation against the same one): an equal dict gets that view, one changed in place
    since is read again."""
    from sequence_ai._image import _contract_of

    contract = json.loads(json.dumps(CONTRACT))
    first = _contract_of(contract)
    assert _contract_of(json.loads(json.dumps(CONTRACT))) is first          # equal: not read again
    frame = sequence_ai.observation(images={"front": _frame(3)}, joints=JOINTS, contract=contract, codec="raw").images[0]
    assert frame.data.pixel_shape == (24, 32, 3)
    contract["observation"]["cameras"]["front"].update(width=16, height=12)  # changed in place
    assert _contract_of(contract) is not first
    frame = sequence_ai.observation(images={"front": _frame(3)}, joints=JOINTS, contract=contract, codec="raw").images[0]
    assert frame.data.pixel_shape == (12, 16, 3)                            # resampled to the size it declares now


def test_observation_refuses_an_unknown_codec():
    with pytest.raises(ValueError, match='codec must be "jpeg" or "raw"'):
        sequence_ai.observation(images={"front": _frame()}, joints=JOINTS, codec="png")


# ---------------------------------------------------------------- the same-host path

@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_the_same_host_path_carries_raw_frames_and_leaves_no_segment(worker, face):
    wire = _link(worker, "shm")
    loop = asyncio.new_event_loop()
    try:
        frames = [_frame(10 + i) for i in range(3)]
        for frame in frames:
            obs = _obs(frame)
            pred = wire.act_blocking(obs, loop.run_until_complete) if face == "blocking" else \
                loop.run_until_complete(wire.act(obs))
            assert pred.action_chunk.actions == [_expected(frame)]
        channel = wire.transports.current
        assert channel.segment is not None and channel.requests == 3
        # both channels carry the messages over the worker's same-host door (a Unix socket)
        assert channel.local is not None
        assert wire.last_request_bytes > 24 * 32 * 3          # the body encoded; its frames went by the segment
        path = os.path.join(SHM_DIR, channel.segment.name)
        assert not channel.segment.linked and not os.path.exists(path)    # unlinked once the worker answered
    finally:
        loop.run_until_complete(wire.aclose())
        loop.close()
    assert channel.segment._map is None and not os.path.exists(path)   # unmapped with its channel


def _door_frame(sock, kind: int, data: bytes) -> None:
    sock.sendall(struct.pack(">BI", kind, len(data)) + data)


def _door_answer(sock) -> tuple:
    head = sock.recv(5, socket.MSG_WAITALL)
    kind, size = struct.unpack(">BI", head)
    data = sock.recv(size, socket.MSG_WAITALL)
    return kind, struct.unpack_from(">IH", data), data[6:]


def _connect_as_nobody(address: str, token: bytes) -> bytes:
    """In a forked child running as user nobody (65534): connect to the door at ``address``, send
    ``token`` as its first message and read what comes back (b"": closed unanswered)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child: only socket calls, then _exit
        code = 1
        try:
            os.close(r)
            os.setgid(65534)
            os.setuid(65534)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(20)
                sock.connect(address)
                try:
                    _door_frame(sock, 1, token)
                    got = sock.recv(64)
                except (BrokenPipeError, ConnectionResetError):   # closed before the token went out
                    got = b""
                os.write(w, b"<" + got + b">")
            code = 0
        except BaseException as exc:               # noqa: BLE001 - said to the parent, which fails
            os.write(w, repr(exc).encode())
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and got.startswith(b"<") and got.endswith(b">"), got
    return got[1:-1]


def test_the_same_host_door_is_private_checks_every_token_and_follows_a_renewal(worker):
    with _ws(worker, answer=True) as ws:
        assert ws.response.headers.get(LOCAL_HEADER) is None          # not asked for: not named
    headers = {"Authorization": f"Bearer {worker.secret}", LOCAL_HEADER: "1"}
    with ws_connect(f"ws://127.0.0.1:{worker.port}/act/ws", proxy=None, additional_headers=headers) as ws:
        path, ticket = ws.response.headers[LOCAL_HEADER].split(" ")
    # an abstract-namespace socket: nothing on disk to leave behind when the worker is killed
    assert path.startswith(f"@seq-door-{worker.proc.pid}-") and len(path) > 30 and len(ticket) == 32
    assert ws.response.headers[LOCAL_VERSION_HEADER] == "2"           # it answers an oversized message 413
    address = "\0" + path[1:]
    if os.geteuid() == 0:                      # another user's process: closed before a byte is read
        assert _connect_as_nobody(address, worker.secret.encode()) == b""
    with socket.socket(socket.AF_UNIX) as sock:                      # a wrong token: 401, then closed
        sock.settimeout(30)
        sock.connect(address)
        _door_frame(sock, 1, b"not-the-secret")
        kind, (seq, status), body = _door_answer(sock)
        assert (kind, seq, status) == (0, 0, 401) and json.loads(body)["code"] == "unauthorized"
        assert sock.recv(1) == b""
    with socket.socket(socket.AF_UNIX) as sock:                      # the secret, then a token that is not good
        sock.settimeout(30)
        sock.connect(address)
        _door_frame(sock, 1, worker.secret.encode())
        assert _door_answer(sock)[1] == (0, 200)
        _door_frame(sock, 1, json.dumps({"token": "revoked-or-forged"}).encode())
        content, _ = encode_act_body({"observation": _obs(_frame(30), "jpeg"), "params": {}}, True)
        _door_frame(sock, 0, struct.pack(">IB", 7, 1) + content)
        kind, (seq, status), body = _door_answer(sock)
        assert (seq, status) == (7, 401), body                          # checked per request, as on the websocket
        _door_frame(sock, 0, b"\0" * 3)
        assert _door_answer(sock)[0] == 1                                # not a request: the text error message
        _door_frame(sock, 0, struct.pack(">IB", 8, 1) + content)
        assert _door_answer(sock)[1] == (8, 401)                         # the connection stays usable
    wire = _link(worker, "shm")
    loop = asyncio.new_event_loop()
    try:
        frame = _frame(31)
        assert wire.act_blocking(_obs(frame), loop.run_until_complete).action_chunk.actions == [_expected(frame)]
        channel = wire.transports.current
        channel.refresh(worker.secret)                                  # a renewal goes over the door too
        assert wire.act_blocking(_obs(frame), loop.run_until_complete).action_chunk.actions == [_expected(frame)]
        assert channel.local is not None and channel.requests == 2
    finally:
        loop.run_until_complete(wire.aclose())
        loop.close()


def test_the_door_takes_over_its_websockets_connection_place_once(tmp_path):
    """One client, one place: at --max-connections 1 the same-host client still gets its door
    (its websocket's place is handed over by the accept's ticket, not taken twice), holds the one
    place while it is open, and a replayed ticket buys nothing."""
    w = WorkerProcess.start(PIXEL, tmp_path, name="pixel", env={"SEQ_WORKER_MAX_CONNECTIONS": "1"})
    loop = asyncio.new_event_loop()
    try:
        wire = _link(w, "shm")
        frame = _frame(40)
        assert wire.act_blocking(_obs(frame), loop.run_until_complete).action_chunk.actions == [_expected(frame)]
        channel = wire.transports.current
        assert channel.local is not None and channel._sock is None      # on the door, its websocket closed
        plain = {"Authorization": f"Bearer {w.secret}"}
        assert _open_ws(w, plain) == 503                                 # the one place is the door's
        loop.run_until_complete(wire.aclose())
        with _ws_once_free(w, {**plain, LOCAL_HEADER: "1"}) as ws:       # the place the door's close freed
            path, ticket = ws.response.headers[LOCAL_HEADER].split(" ")
            with socket.socket(socket.AF_UNIX) as a, socket.socket(socket.AF_UNIX) as b:
                a.settimeout(30)
                b.settimeout(30)
                a.connect("\0" + path[1:])
                _door_frame(a, 1, f"{w.secret}\n{ticket}".encode())
                assert _door_answer(a)[1] == (0, 200)                       # the websocket's place, handed over
                b.connect("\0" + path[1:])
                _door_frame(b, 1, f"{w.secret}\n{ticket}".encode())      # the same ticket again
                kind, (seq, status), body = _door_answer(b)
                assert status == 503 and json.loads(body)["code"] == "too_many_connections", body
        with socket.socket(socket.AF_UNIX) as c:                            # a first message over 4 KiB: closed
            c.settimeout(30)
            c.connect("\0" + path[1:])
            c.sendall(struct.pack(">BI", 1, 5000) + b"y" * 5000)
            assert c.recv(1) == b""
    finally:
        loop.close()
        w.stop()


def _open_ws(w, headers: dict) -> int:
    """Open and close the /act websocket: -> 101, or the refusal's status code."""
    try:
        with ws_connect(f"ws://127.0.0.1:{w.port}/act/ws", proxy=None, additional_headers=headers):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


@contextlib.contextmanager
def _ws_once_free(w, headers: dict, timeout_s: float = 10.0):
    """The /act websocket, asked again while the worker answers 503 (a place freed by a close
    is given back when the worker's handler ends, a moment after the client's close)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ws = ws_connect(f"ws://127.0.0.1:{w.port}/act/ws", proxy=None, additional_headers=headers)
        except InvalidStatus as exc:
            assert exc.response.status_code == 503 and time.monotonic() < deadline, exc
            time.sleep(0.05)
            continue
        with ws:
            yield ws
        return


def test_a_loopback_client_takes_the_door_whatever_its_body_and_a_far_too_big_body_is_still_413(worker, monkeypatch):
    """A blocking channel to a worker on a loopback address goes over the door for JPEG bodies
    too (no websocket framing or event loop on the path); ``SEQ_CLIENT_DOOR=0`` keeps it on the
    websocket. A body far over the worker's limit on the door is answered 413 before the door
    closes (none of it is read), so the robot sees the same payload_too_large as on HTTP and the
    websocket, and the next request opens a new channel."""
    from sequence_ai_core import InvalidRequest
    loop = asyncio.new_event_loop()
    try:
        frame = _frame(50)
        wire = _link(worker, "binary")
        assert wire.act_blocking(_obs(frame), loop.run_until_complete).action_chunk.actions == [_expected(frame)]
        channel = wire.transports.current
        assert channel.local is not None and channel._sock is None and channel.segment is None
        huge = _obs(frame)
        huge["images"][0]["data"] = b"\0" * 600_000       # over twice the 200 kB limit: the door reads none of it
        with pytest.raises(InvalidRequest) as refused:
            wire.act_blocking(huge, loop.run_until_complete)
        assert (refused.value.code, refused.value.status_code) == ("payload_too_large", 413)
        assert refused.value.details["limit_bytes"] == 200000, refused.value.details
        assert wire.act_blocking(_obs(frame), loop.run_until_complete).action_chunk.actions == [_expected(frame)]
        assert wire.transports.current.local is not None
        loop.run_until_complete(wire.aclose())
        monkeypatch.setenv("SEQ_CLIENT_DOOR", "0")
        wire = _link(worker, "binary")
        assert wire.act_blocking(_obs(frame), loop.run_until_complete).action_chunk.actions == [_expected(frame)]
        assert wire.transports.current.local is None and wire.transports.current._sock is not None
        loop.run_until_complete(wire.aclose())
    finally:
        loop.close()


def test_the_same_host_path_needs_the_channel():
    with pytest.raises(ValueError, match='cannot go with transport="http"'):
        Transports("http", 5.0, lambda: None, shm=True)
    with pytest.raises(ValueError, match="body_format must be one of"):
        WorkerLink("http://127.0.0.1:9", "k", "m", body_format="mmap")


def _shm_request(ws, seq: int, head: bytes, frame: np.ndarray) -> tuple:
    content, _ = encode_act_body({"observation": _obs(frame), "params": {}}, True)
    n = int.from_bytes(content[:4], "big")
    ws.send(struct.pack(">IB", seq, 2) + head + content[:4 + n])
    data = ws.recv(timeout=30)
    got, status = struct.unpack_from(">IH", data)
    return status, data[6:]


def _refusal(status: int, raw: bytes, words: str) -> None:
    body = json.loads(raw)
    assert status == 400 and body["code"] == "invalid_request" and body["details"]["reason"] == "shm", body
    assert words in body["detail"], body["detail"]


def test_a_segment_is_refused_unless_it_is_the_clients_own_and_holds_the_frames(worker):
    frame = _frame(20)
    size = len(frame.tobytes())
    segment = ShmSegment()
    try:
        with _ws(worker, answer=True) as mine, _ws(worker, answer=True) as other:
            name, used = segment.write(memoryview(frame.tobytes()))
            mine_fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)   # the worker unlinks the name once it opened it
            _refusal(*_shm_request(mine, 1, b"\x0d../etc/passwd" + size.to_bytes(4, "big"), frame), "not seq-")
            missing = shm_name(secrets.token_hex(16))
            _refusal(*_shm_request(mine, 2, encode_shm_head(missing, size), frame), "cannot be opened")
            _refusal(*_shm_request(mine, 3, encode_shm_head(name, 1 << 30), frame), "over this worker's limit")
            status, raw = _shm_request(mine, 4, encode_shm_head(name, used), frame)
            assert status == 200 and decode_act_answer(raw)["action_chunk"]["actions"] == [_expected(frame)]
            _refusal(*_shm_request(other, 5, encode_shm_head(name, used), frame), "belongs to another connection")
            os.ftruncate(mine_fd, 100)                               # shrunk under the worker: read short
            _refusal(*_shm_request(mine, 6, encode_shm_head(name, used), frame), "holds 100")
            assert not os.path.exists(os.path.join(SHM_DIR, name))  # unlinked by the worker, not by this client
            os.close(mine_fd)
    finally:
        segment.close()
    public = shm_name(secrets.token_hex(16))
    path = os.path.join(SHM_DIR, public)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
    try:
        os.write(fd, frame.tobytes())
        with _ws(worker, answer=True) as ws:
            _refusal(*_shm_request(ws, 7, encode_shm_head(public, size), frame), "not a private file")
    finally:
        os.close(fd)
        os.unlink(path)


def test_shm_message_carries_the_json_and_writes_the_blobs():
    segment = ShmSegment()
    try:
        content, _ = encode_act_body({"observation": _obs(_frame(30)), "params": {}}, True)
        message = shm_message(segment, content)
        n = int.from_bytes(content[:4], "big")
        assert message == encode_shm_head(segment.name, len(content) - 4 - n) + content[:4 + n]
        with open(os.path.join(SHM_DIR, segment.name), "rb") as f:
            assert f.read(len(content) - 4 - n) == content[4 + n:]
        assert os.stat(os.path.join(SHM_DIR, segment.name)).st_mode & 0o777 == 0o600
        big = bytes(3 << 20)                                   # past the first segment: a new one, a new name
        first = segment.name
        name, used = segment.write(memoryview(big))
        assert used == len(big) and name != first and not os.path.exists(os.path.join(SHM_DIR, first))
        with pytest.raises(ValueError, match="binary /act body"):
            shm_message(segment, b"{}")
    finally:
        segment.close()
    assert not os.path.exists(os.path.join(SHM_DIR, segment.name or "x"))


def test_the_same_host_path_writes_each_frame_into_the_segment_from_its_own_bytes(worker, monkeypatch):
    """On the same-host path the body is encoded in its parts (``BinaryBody``) and each raw frame
    goes into the segment straight from the frame's own bytes: the segment and the message are
    the joined body's, and the whole body is never joined (a copy of every frame less), on
    either face."""
    frames = [_frame(60), _frame(61)]
    body = {"observation": dict(_obs(frames[0]), images=[{"view": "front", "data": _obs(f)["images"][0]["data"]}
                                                          for f in frames]), "params": {}}
    split, kind = encode_act_body(body, True, split=True)
    joined, joined_kind = encode_act_body(body, True)
    assert isinstance(split, BinaryBody) and kind == joined_kind and len(split) == len(joined)
    n = int.from_bytes(joined[:4], "big")
    segment = ShmSegment()
    try:
        message = shm_message(segment, split)
        assert message == encode_shm_head(segment.name, len(joined) - 4 - n) + joined[:4 + n]
        with open(os.path.join(SHM_DIR, segment.name), "rb") as f:
            assert f.read(len(joined) - 4 - n) == joined[4 + n:] == frames[0].tobytes() + frames[1].tobytes()
        assert split._joined is None                                  # written from the frames themselves
    finally:
        segment.close()
    assert bytes(split) == joined                                     # any other transport gets the same body

    def joining(self):
        raise AssertionError("the same-host path joined the body")
    monkeypatch.setattr(BinaryBody, "__bytes__", joining)
    for face in ("blocking", "asyncio"):
        wire = _link(worker, "shm")
        loop = asyncio.new_event_loop()
        try:
            frame = _frame(62)
            pred = wire.act_blocking(_obs(frame), loop.run_until_complete) if face == "blocking" else \
                loop.run_until_complete(wire.act(_obs(frame)))
            assert pred.action_chunk.actions == [_expected(frame)], face
        finally:
            loop.run_until_complete(wire.aclose())
            loop.close()


def test_the_worker_reads_a_segment_once_into_frames_of_its_own(worker):
    """The worker copies a request's frames out of the segment once, into the body it hands on
    (the policy's arrays are views of that copy): a client that scribbles on its segment after
    the read (or a same-user process that does, during it, which at worst garbles that
    request's pixels) cannot change the frames a policy holds."""
    frame = _frame(70)
    segment, segments = ShmSegment(), ChannelSegments(1 << 20)
    try:
        content, _ = encode_act_body({"observation": _obs(frame), "params": {}}, True)
        message = shm_message(segment, content)
        body = segments.body(memoryview(message))
        assert isinstance(body, bytearray) and bytes(body) == content
        segment.write(memoryview(bytes(len(frame.tobytes()))))          # scribbled: zeros now
        assert bytes(body) == content                                  # the worker's copy is its own
    finally:
        segments.close()
        segment.close()


def test_a_same_host_body_gets_every_check_of_a_binary_body(worker):
    """The body rebuilt from the segment goes through the pipeline's checks: a NUL in its JSON is
    400 bad_string, and a frame the segment holds too few bytes for is refused by its blob check."""
    frame = _frame(40)
    segment = ShmSegment()
    try:
        with _ws(worker, answer=True) as ws:
            name, used = segment.write(memoryview(frame.tobytes()))
            obs = _obs(frame)
            obs["instruction"] = "lo\x00ok"
            content, _ = encode_act_body({"observation": obs, "params": {}}, True)
            n = int.from_bytes(content[:4], "big")
            ws.send(struct.pack(">IB", 8, 2) + encode_shm_head(name, used) + content[:4 + n])
            data = ws.recv(timeout=30)
            body = json.loads(data[6:])
            assert struct.unpack_from(">IH", data)[1] == 400 and body["details"]["reason"] == "bad_string", body
            status, raw = _shm_request(ws, 9, encode_shm_head(name, used - 1), frame)
            assert status == 400 and "blob" in json.loads(raw)["detail"], raw
    finally:
        segment.close()


def test_a_fifo_named_as_a_segment_is_refused_without_blocking_the_worker(worker):
    """A FIFO in /dev/shm with a segment's name (anyone may make one there): opening it to read
    would wait for a writer on the worker's event loop, freezing every channel and /health; it is
    opened without waiting and refused as not a private file."""
    path = os.path.join(SHM_DIR, shm_name(secrets.token_hex(16)))
    os.mkfifo(path, 0o600)
    try:
        with _ws(worker, answer=True) as ws:
            _refusal(*_shm_request(ws, 10, encode_shm_head(os.path.basename(path), 64), _frame(50)),
                     "not a private file")
    finally:
        try:                               # a worker stuck in open() on it is let go by a writer
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        os.unlink(path)


_KILLED_CLIENT = """
import os, signal, struct, sys
import numpy as np, sequence_ai
from websockets.sync.client import connect
from sequence_ai_core._shm import ShmSegment, shm_message
from sequence_ai_core.protocol import encode_act_body
obs = sequence_ai.observation(images={"front": np.zeros((24, 32, 3), np.uint8)}, joints=[0.0] * 7, instruction="look",
                              contract=%r, codec="raw").to_wire(raw=True)
segment = ShmSegment()
ws = connect(sys.argv[1], proxy=None, additional_headers={"Authorization": "Bearer " + sys.argv[2]})
print("connected", flush=True)
sys.stdin.readline()                       # the test has stopped the worker (SIGSTOP): it reads all at once
ws.send(struct.pack(">IB", 1, 2) + shm_message(segment, encode_act_body({"observation": obs, "params": {}}, True)[0]))
print(segment.name, flush=True)
os.kill(os.getpid(), signal.SIGKILL)       # before the answer: the client never unlinks its segment
""" % (CONTRACT,)


def test_a_client_killed_with_a_request_in_flight_leaves_no_segment_in_dev_shm(worker):
    """The worker unlinks a segment's name once it has opened and checked it: a client killed
    before its answer (which would have unlinked it) leaves no file in /dev/shm, memory no one frees."""
    client = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, f"ws://127.0.0.1:{worker.port}/act/ws",
                               worker.secret], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "connected"
        os.kill(worker.proc.pid, signal.SIGSTOP)   # the request and the close then reach the worker together
        try:
            client.stdin.write("go\n")
            client.stdin.flush()
            name = client.stdout.readline().strip()
            assert client.wait(60) == -signal.SIGKILL and name.startswith("seq-"), name
        finally:
            os.kill(worker.proc.pid, signal.SIGCONT)
    finally:
        if client.poll() is None:
            client.kill()
        client.wait()
    path = os.path.join(SHM_DIR, name)
    try:
        eventually(lambda: not os.path.exists(path), 30, what="the killed client's segment unlinked by the worker")
    finally:
        if os.path.exists(path):
            os.unlink(path)


def test_the_client_opens_only_an_abstract_socket_name():
    """A header naming a path on disk (not what a worker names) is not connected to: the token
    never goes to a file someone else could have put there; the channel stays on its websocket."""
    from sequence_ai_core._local import LocalSocket

    with pytest.raises(PermissionError, match="not an abstract socket name"):
        LocalSocket.open("/tmp/seq-door-x/act.sock", "secret", time.monotonic() + 5)
