"""The asyncio /act channel (``_channel.ActChannel``: ``AsyncPolicy``, ``Policy.run``, the ROS
driver's control loop) on the worker's same-host door, against a real worker process on
loopback: it asks for the door as the blocking channel does, moves there and closes its
websocket, and carries requests, token refreshes and cancels over it; the opt-out and the
fallbacks keep it on its websocket; a killed worker, a cancelled request and a body over the
limit behave as on the websocket."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import sequence_ai
from websockets.protocol import State

from _servers import WorkerProcess, freeze
from sequence_ai_core import _channel, _local
from sequence_ai_core._channel import ActChannel, ChannelDropped, answer_data
from sequence_ai_core._wire import Session, WorkerLink
from sequence_ai_core.protocol import encode_act_body

POLICIES = Path(__file__).resolve().parents[1] / "policies"
PIXEL, DELAY = str(POLICIES / "pixel_policy.py"), str(POLICIES / "delay_policy.py")
CONTRACT = {"observation": {"cameras": {"front": {"width": 32, "height": 24}}, "proprio": {"joint_positions": 7}}}
JOINTS = [0.1 * i + 1.0 / 3.0 for i in range(7)]


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = WorkerProcess.start(PIXEL, tmp_path_factory.mktemp("pixel"), name="pixel",
                            env={"SEQ_WORKER_MAX_BODY_BYTES": "200000"})
    yield w
    w.stop()


@pytest.fixture
def delay_worker(tmp_path):
    w = WorkerProcess.start(DELAY, tmp_path, name="delay")
    yield w
    w.stop()


@pytest.fixture
def opened(monkeypatch):
    """The websockets the asyncio channel opens (to assert the door's hand-over closed them)."""
    made = []
    real = _channel._ws_connect

    async def recording(*args, **kwargs):
        ws = await real(*args, **kwargs)
        made.append(ws)
        return ws
    monkeypatch.setattr(_channel, "_ws_connect", recording)
    return made


def _frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def _expected(frame: np.ndarray) -> list:
    return [float(frame.astype(np.int64).sum()), float(frame[0, 0, 0]), float(frame[-1, -1, 2]),
            float(frame[:, :, 1].mean()), 24.0, 32.0, JOINTS[0], 1.0]


def _obs(frame: np.ndarray) -> dict:
    return sequence_ai.observation(images={"front": frame}, joints=JOINTS, instruction="look", contract=CONTRACT,
                                   codec="raw").to_wire(raw=True)


def _link(w, body_format: str) -> WorkerLink:
    wire = WorkerLink("http://127.0.0.1:9", "unused", "pixel", body_format=body_format, transport="channel")
    wire.session = Session(session_id=None, worker_url=w.url, direct_secret=w.secret)
    return wire


def _delay_body(latency_s: float = 0.0) -> bytes:
    body = {"observation": {"images": [], "proprioception": {"joint_positions": [0.0, 0.0, 0.0]},
                            "instruction": "move"}, "params": {"latency_s": latency_s}}
    return encode_act_body(body, False)[0]          # no camera: a JSON body


def _run(coro, timeout_s: float = 60.0):
    """Run ``coro`` on a fresh loop, bounded: a test here never hangs."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


@pytest.mark.parametrize("body_format", ["binary", "json", "shm"])
def test_the_asyncio_channel_takes_the_door_and_carries_requests_and_refreshes_over_it(worker, opened, body_format):
    async def go():
        wire = _link(worker, body_format)
        try:
            frames = [_frame(60 + i) for i in range(3)]
            assert (await wire.act(_obs(frames[0]))).action_chunk.actions == [_expected(frames[0])]
            channel = wire.transports.current
            assert isinstance(channel, ActChannel) and channel.open
            assert isinstance(channel.local, _local.AsyncDoor) and channel.binary_answers
            assert (channel.segment is not None) == (body_format == "shm")
            assert len(opened) == 1 and opened[0].state is State.CLOSED     # the websocket handed over and closed
            await channel.refresh("not-the-secret")               # a token refresh goes over the door...
            json_body = encode_act_body({"observation": _obs(frames[1]), "params": {}}, False)[0]
            refused = await channel.request(json_body, False)
            assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
            await channel.refresh(worker.secret)                   # ...and the good one after it
            assert channel.token == worker.secret
            for frame in frames[1:]:
                assert (await wire.act(_obs(frame))).action_chunk.actions == [_expected(frame)]
            assert wire.transports.current is channel and channel.local is not None
            assert channel.requests >= 3 and len(opened) == 1      # one channel, never reopened
        finally:
            await wire.aclose()
        assert not channel.open and channel.local is None
    _run(go())


def test_seq_client_door_0_keeps_the_asyncio_channel_on_its_websocket(worker, opened, monkeypatch):
    async def go(expect_door: bool):
        wire = _link(worker, "binary")
        try:
            frame = _frame(70)
            assert (await wire.act(_obs(frame))).action_chunk.actions == [_expected(frame)]
            channel = wire.transports.current
            assert (channel.local is not None) == expect_door
            assert opened[-1].state is (State.CLOSED if expect_door else State.OPEN)
        finally:
            await wire.aclose()
    _run(go(True))                                  # by default a loopback worker's door
    monkeypatch.setenv("SEQ_CLIENT_DOOR", "0")
    _run(go(False))


@pytest.mark.parametrize("how", ["full", "unopenable"])
def test_a_door_that_is_full_or_cannot_be_opened_leaves_the_channel_on_its_websocket(tmp_path, opened, monkeypatch,
                                                                                       how):
    """At --max-connections 1 the websocket holds the one place; a door open without its ticket
    (which would hand that place over) is answered 503. A door name nothing listens on is
    refused by the kernel. Either way the channel stays on its websocket and serves."""
    w = WorkerProcess.start(PIXEL, tmp_path, name="pixel", env={"SEQ_WORKER_MAX_CONNECTIONS": "1"})
    tries = []
    real = _local.AsyncDoor.open.__func__

    async def door_open(cls, path, token, ticket, max_size):
        tries.append(path)
        if how == "full":
            ticket = ""
        else:
            path = f"@seq-door-nobody-{os.getpid()}-{time.monotonic_ns()}"
        try:
            return await real(cls, path, token, ticket, max_size)
        except _local.DoorRefused as exc:
            tries.append(exc.status)
            raise
        except OSError as exc:
            tries.append(type(exc).__name__)
            raise
    monkeypatch.setattr(_local.AsyncDoor, "open", classmethod(door_open))

    async def go():
        wire = _link(w, "shm")
        try:
            for seed in (80, 81):
                frame = _frame(seed)
                assert (await wire.act(_obs(frame))).action_chunk.actions == [_expected(frame)]
            channel = wire.transports.current
            assert channel.local is None and opened[0].state is State.OPEN and channel.requests == 2
        finally:
            await wire.aclose()
    try:
        _run(go())
    finally:
        w.stop()
    assert len(tries) == 2 and tries[1] == (503 if how == "full" else "ConnectionRefusedError"), tries


def test_a_worker_killed_mid_request_on_the_door_is_channel_dropped_not_a_hang(delay_worker):
    async def go():
        channel = ActChannel(delay_worker.url, delay_worker.secret, timeout_s=30.0)
        assert await channel.connect() is None and channel.local is not None
        assert (await channel.request(_delay_body(), False)).status_code == 200
        asyncio.get_running_loop().call_later(0.3, os.kill, delay_worker.proc.pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(ChannelDropped) as dropped:
            await channel.request(_delay_body(latency_s=20.0), False)
        assert dropped.value.sent and time.monotonic() - t0 < 10
        assert not channel.open
        with pytest.raises(ChannelDropped):       # a closed channel stays closed
            await channel.refresh(delay_worker.secret)
        await channel.aclose()
    _run(go(), 30)
    delay_worker.proc.wait(10)


def test_a_cancelled_request_leaves_the_door_usable(delay_worker):
    """A request cancelled while the policy runs (``interrupt()``, a timeout) sends its cancel;
    the door serves one request at a time, so the next request is answered after the first
    finishes, and the first's late answer is skipped by its ``seq``."""
    async def go():
        channel = ActChannel(delay_worker.url, delay_worker.secret, timeout_s=30.0)
        assert await channel.connect() is None
        door = channel.local
        assert door is not None
        count = answer_data(await channel.request(_delay_body(), False))["action_chunk"]["actions"][0][0]
        slow = asyncio.ensure_future(channel.request(_delay_body(latency_s=0.6), False))
        await asyncio.sleep(0.2)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        answer = await channel.request(_delay_body(), False)
        assert answer.status_code == 200 and channel.local is door
        rows = answer_data(answer)["action_chunk"]["actions"]
        assert rows[0][0] == count + 2             # the next request's chunk, not the cancelled one's late one
        assert answer_data(await channel.request(_delay_body(), False))["action_chunk"]["actions"][0][0] == count + 3
        await channel.aclose()
    _run(go(), 30)


def test_a_body_far_over_the_limit_on_the_door_is_still_413(worker):
    """The door answers a message over its limit 413 with the request's seq (none of it is read)
    and closes; the asyncio channel hands that answer back, and the next request opens a new
    channel, on the door again."""
    from sequence_ai_core import InvalidRequest

    async def go():
        wire = _link(worker, "binary")
        try:
            frame = _frame(90)
            assert (await wire.act(_obs(frame))).action_chunk.actions == [_expected(frame)]
            first = wire.transports.current
            assert first.local is not None
            huge = _obs(frame)
            huge["images"][0]["data"] = b"\0" * 600_000       # over twice the 200 kB limit
            with pytest.raises(InvalidRequest) as refused:
                await wire.act(huge)
            assert (refused.value.code, refused.value.status_code) == ("payload_too_large", 413)
            assert refused.value.details["limit_bytes"] == 200000, refused.value.details
            assert not first.open                      # closed by the door: no reconnect through the gateway
            assert (await wire.act(_obs(frame))).action_chunk.actions == [_expected(frame)]
            assert wire.transports.current is not first and wire.transports.current.local is not None
        finally:
            await wire.aclose()
    _run(go())


@pytest.mark.parametrize("stopped", ["at_the_door_open", "after_the_door_answered"])
def test_the_door_open_and_the_websockets_close_keep_to_the_channel_open_deadline(delay_worker, monkeypatch, stopped):
    """The upgrade, the door open and the websocket's closing handshake share one deadline,
    min(OPEN_TIMEOUT_S, timeout_s), as on the blocking channel. A worker stopped (SIGSTOP) at the
    door open leaves the channel on its websocket, one stopped right after its door answered 200
    (it never answers the websocket's close) leaves it on the door, the websocket aborted: either
    way connect() is back by the deadline (the door open had a whole timeout_s of its own after
    the upgrade's time, and the close 2 s more)."""
    real_ws, real_open = _channel._ws_connect, _local.AsyncDoor.open.__func__

    async def slow_upgrade(*args, **kwargs):
        await asyncio.sleep(1.2)                 # the upgrade took most of the deadline
        return await real_ws(*args, **kwargs)

    async def open_with_a_stop(cls, *args):
        if stopped == "at_the_door_open":
            freeze(delay_worker.proc.pid)     # all of it: a door thread still running would answer the open
            return await real_open(cls, *args)
        door = await real_open(cls, *args)
        freeze(delay_worker.proc.pid)
        return door
    monkeypatch.setattr(_channel, "_ws_connect", slow_upgrade)
    monkeypatch.setattr(_local.AsyncDoor, "open", classmethod(open_with_a_stop))

    async def go():
        channel = ActChannel(delay_worker.url, delay_worker.secret, timeout_s=2.0)
        t0 = time.monotonic()
        try:
            assert await channel.connect() is None
            assert (channel.local is not None) == (stopped == "after_the_door_answered")
            assert time.monotonic() - t0 < 2.0 + 0.5, time.monotonic() - t0
        finally:
            os.kill(delay_worker.proc.pid, signal.SIGCONT)
            await channel.aclose()
    _run(go(), 30)


def test_the_door_version_header_reads_absent_or_unreadable_as_version_1():
    """A worker that names no version, or one the client cannot read, is taken as a version-1
    door (it closes on an oversized message without the 413), so a JPEG client does not take it."""
    assert [_local.door_version(v) for v in (None, "", "2", "3", "two", "2.0")] == [1, 1, 2, 3, 1, 1]
