"""The same-host door's threads in process (server/sequence_ai_server/worker/local.py and
channel._DoorChannel): each connection is served on a thread of its own that calls the act
pipeline directly, so a cheap policy runs on that thread even on a worker not made ``--inline``
(nothing on the event loop waits for it); a request that hangs there is answered 504
``request_timeout`` by the door's watch while the event loop stays free, and its late result is
dropped, never taken for the next request's. The real worker's door is tested end to end in
test/client/test_act_same_host.py; the inline thresholds are patched here so the test decides
by structure, not by this machine's speed."""
from __future__ import annotations

import asyncio
import json
import struct
import threading
import time

import pytest

import seq
from _wait import eventually
from sequence_ai_core._local import LocalSocket
from sequence_ai_core.protocol import decode_act_answer
from sequence_ai_server.common.leases import DirectAuth
from sequence_ai_server.worker import host as host_module
from sequence_ai_server.worker import local as local_module
from sequence_ai_server.worker.act import ActPipeline, WorkerState
from sequence_ai_server.worker.channel import _DoorChannel, channel_max_size
from sequence_ai_server.worker.host import INLINE_WINDOW, PolicyHost
from sequence_ai_server.worker.local import LocalDoor

SECRET = "door-secret"
TIMEOUT_S = 0.5


@seq.policy(action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=1,
                                      control_frequency_hz=10.0),
            timeouts=seq.Timeouts(request=TIMEOUT_S))
class _Tagged(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.threads = []
        self.release = threading.Event()

    @seq.infer
    def infer(self, obs, *, tag: float = 0.0, hold: bool = False):
        self.threads.append(threading.current_thread().name)
        if hold:
            self.threads.append("holding")
            self.release.wait(30)
            self.threads.append("released")
        return seq.ActionChunk([[tag]])

    @seq.shutdown
    def shutdown(self):
        self.threads.append("shutdown")


@pytest.fixture
def door(tmp_path, monkeypatch):
    """(the door's name, the host, the event loop's thread's ticks) with a live event loop."""
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)         # every request counts as cheap
    monkeypatch.setattr(host_module, "INLINE_MAX_MS", 1e9)
    host = PolicyHost(_Tagged, inline=False)                  # the worker's default: the loop never runs infer
    host.start(str(tmp_path))
    state = WorkerState("tagged")
    state.host = host
    act = ActPipeline(state, DirectAuth(SECRET))
    max_size = channel_max_size(act.max_body_bytes)
    made = LocalDoor(act, lambda conn, token: _DoorChannel(conn, token, act, max_size))
    loop = asyncio.new_event_loop()
    ticks = []

    beating = threading.Event()
    beating.set()

    async def beat():                                         # the loop's heartbeat: it must never stall
        while beating.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.02)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    beat_done = asyncio.run_coroutine_threadsafe(beat(), loop)
    name = asyncio.run_coroutine_threadsafe(made.address(), loop).result(10)
    yield name, host, ticks, act, made, loop
    host.replicas[0].instance.release.set()
    made.close()
    beating.clear()
    beat_done.result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    host.stop()


def _ask(conn: LocalSocket, seq_: int, **params) -> tuple[int, int, dict]:
    conn.send(struct.pack(">IB", seq_, 0) + json.dumps({"observation": {}, "params": params}).encode())
    answer = conn.receive(time.monotonic() + 30)
    got, status = struct.unpack_from(">IH", answer)
    body = answer[6:]
    return got, status, decode_act_answer(body) if status == 200 else json.loads(body)


def test_a_door_connection_runs_a_cheap_policy_on_its_own_thread_and_a_hang_is_answered_504(door):
    name, host, ticks, act, _, _ = door
    replica, policy = host.replicas[0], host.replicas[0].instance
    conn = LocalSocket.open(name, SECRET, time.monotonic() + 10)
    try:
        for i in range(INLINE_WINDOW + 1):                   # the first window through the replica's thread
            assert _ask(conn, i + 1, tag=float(i))[:2] == (i + 1, 200)
            assert eventually(lambda: not replica.run_lock.locked(), what="the replica let go of its lock")
        assert replica.inline >= 1 and policy.threads[-1].startswith("seq-door-conn"), policy.threads[-3:]
        assert act.budget.open == 1                          # the door's own place (no ticket), taken on the loop

        started = time.monotonic()
        got, status, body = _ask(conn, 100, tag=5.0, hold=True)  # hangs on the door's thread...
        waited = time.monotonic() - started
        assert (got, status, body["code"]) == (100, 504, "request_timeout"), body   # ...answered by the watch
        assert TIMEOUT_S <= waited < 10.0, waited
        assert host.oldest_request_s() > 0                    # /ping's figure: the worker reads degraded
        beat = ticks[-1]
        assert eventually(lambda: ticks[-1] > beat, what="the event loop ran on meanwhile")
        # the connection is given up (its thread is held by the call): shut, its place back at once
        with pytest.raises(OSError):
            _ask(conn, 101, tag=6.0)
        assert eventually(lambda: act.budget.open == 0, what="the given-up connection's place back")
        again = LocalSocket.open(name, SECRET, time.monotonic() + 10)   # a new one is answered 504 while held
        try:
            got, status, body = _ask(again, 102, tag=7.0)
            assert (got, status, body["code"]) == (102, 504, "request_timeout"), body
            assert policy.threads[-1] == "holding"                       # the held call's: 102 never ran
            policy.release.set()                              # the hung call returns: its result is dropped
            got, status, body = _ask(again, 103, tag=8.0)
            assert (got, status) == (103, 200) and body["action_chunk"]["actions"] == [[8.0]], body
        finally:
            again.close()
    finally:
        conn.close()
    assert eventually(lambda: act.budget.open == 0, what="the door's place given back on the loop")


def _on(loop, fn):
    return asyncio.run_coroutine_threadsafe(_call(fn), loop).result(10)


async def _call(fn):
    return fn()


def test_a_ticket_place_is_the_clients_until_both_its_websocket_and_its_door_are_gone(door):
    name, _, _, act, made, loop = door
    for door_first in (True, False):
        _on(loop, lambda: act.budget.take("/act/ws"))           # the websocket's place, as its upgrade takes it
        ticket = made.issue()
        conn = LocalSocket.open(name, SECRET, time.monotonic() + 10, ticket)
        assert act.budget.open == 1                             # handed over, not taken twice
        if door_first:
            conn.close()
            assert eventually(lambda: made._tickets[ticket].door_gone, what="the door connection let go of its place")
            assert act.budget.open == 1                          # the websocket still holds it
            assert made.settle(ticket) is True                   # the last one out gives it back
            _on(loop, act.budget.release)
        else:
            assert made.settle(ticket) is False                  # the door still holds it
            conn.close()
        assert eventually(lambda: act.budget.open == 0, what="the place given back once")
        replayed = LocalSocket.open(name, SECRET, time.monotonic() + 10, ticket)   # a spent ticket buys nothing:
        try:
            assert act.budget.open == 1                          # a place of its own
        finally:
            replayed.close()
        assert eventually(lambda: act.budget.open == 0, what="its own place back")


def test_a_place_taken_after_the_door_gave_up_on_a_stalled_loop_is_given_back(door, monkeypatch):
    name, _, _, act, _, loop = door
    monkeypatch.setattr(local_module, "OPEN_TIMEOUT_S", 0.5)
    loop.call_soon_threadsafe(time.sleep, 1.5)                  # the event loop stalls (a hang under --inline)
    with pytest.raises(OSError):
        LocalSocket.open(name, SECRET, time.monotonic() + 10)   # the door waits 0.5 s for its place, then closes
    assert eventually(lambda: _on(loop, lambda: (act.budget.open, act.budget.refused)) == (0, 0),
                      what="the place the loop took late, given back")


def test_shutdown_waits_for_a_call_running_on_a_door_thread(door):
    name, host, _, _, _, _ = door
    policy = host.replicas[0].instance
    conn = LocalSocket.open(name, SECRET, time.monotonic() + 10)
    try:
        for i in range(INLINE_WINDOW + 1):
            assert _ask(conn, i + 1)[1] == 200
            assert eventually(lambda: not host.replicas[0].run_lock.locked(), what="the replica let go")
        conn.send(struct.pack(">IB", 99, 0) + json.dumps({"observation": {}, "params": {"hold": True}}).encode())
        assert eventually(lambda: policy.threads[-1] == "holding", what="the held call under way")
        assert policy.threads[-2].startswith("seq-door-conn"), policy.threads[-3:]    # on the door's thread
        stopping = threading.Thread(target=host.stop, daemon=True)
        stopping.start()
        time.sleep(0.3)
        assert "shutdown" not in policy.threads                  # not while infer runs on the door's thread
        policy.release.set()
        stopping.join(10)
        assert policy.threads[-2:] == ["released", "shutdown"], policy.threads[-3:]
    finally:
        conn.close()


# ---------------------------------------------------------------- the door's framing, per message

class _Counted:
    """A socket that counts the calls that change its timeout (each an ``ioctl``)."""

    def __init__(self, sock) -> None:
        self.sock, self.settimeouts = sock, 0

    def settimeout(self, value) -> None:
        self.settimeouts += 1
        self.sock.settimeout(value)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def test_a_door_message_changes_no_socket_timeout_and_a_deadline_still_holds():
    """``FramedSocket`` keeps its socket blocking (set once when made) and waits with ``poll``: a
    message each way, with and without a deadline, costs no ``settimeout`` on either end (it
    set one on every read and every send); a read past its deadline, a message bigger than
    the socket's buffer and a send the other end never reads keep their meaning."""
    from sequence_ai_core.framing import FramedSocket
    import socket as socket_module

    a, b = socket_module.socketpair()
    a.settimeout(3.0)                                     # made with a timeout: cleared once, here
    client, worker = _Counted(a), _Counted(b)
    ends = FramedSocket(client), FramedSocket(worker)
    try:
        assert a.gettimeout() is None and b.gettimeout() is None
        made = (client.settimeouts, worker.settimeouts)
        for i in range(5):
            ends[0].send(b"request %d" % i, 0, 5.0)
            assert ends[1].receive_message(None, 1 << 20) == (0, b"request %d" % i)
            ends[1].send(b"answer %d" % i)
            assert ends[0].receive_message(time.monotonic() + 5) == (0, b"answer %d" % i)
        assert (client.settimeouts, worker.settimeouts) == made
        started = time.monotonic()
        with pytest.raises(socket_module.timeout):
            ends[0].receive_message(time.monotonic() + 0.2)
        assert 0.2 <= time.monotonic() - started < 5
        big = bytes(range(256)) * (8 << 12)               # 8 MiB: far over a socket buffer, sent as it drains
        got = []
        reader = threading.Thread(target=lambda: got.append(ends[1].receive_message(time.monotonic() + 30)))
        reader.start()
        ends[0].send(big, 0, 30.0)
        reader.join(30)
        assert got == [(0, big)]
        started = time.monotonic()
        with pytest.raises(socket_module.timeout):         # nobody reads: the send gives up at its time
            ends[0].send(big, 0, 0.3)
        assert 0.3 <= time.monotonic() - started < 5
        assert (client.settimeouts, worker.settimeouts) == made
    finally:
        a.close()
        b.close()


# ---------------------------------------------------------------- the inline rule's window

def test_the_inline_windows_median_and_max_are_kept_as_the_times_come():
    """``RecentTimes`` (``_Replica.item_ms``) keeps the last ``size`` times' median (the upper
    one, ``sorted(window)[size // 2]``, as the rule always read it) and maximum as each comes in,
    so ``run_inline`` reads them instead of sorting the window on every request; None until
    the window is full."""
    import collections
    import random

    from sequence_ai_server.worker.host import RecentTimes

    rng = random.Random(7)
    times, window = RecentTimes(INLINE_WINDOW), collections.deque(maxlen=INLINE_WINDOW)
    for i in range(5 * INLINE_WINDOW):
        ms = rng.choice([0.1, 0.25, 0.25, 3.0, rng.random() * 6])    # repeats too
        times.append(ms)
        window.append(ms)
        assert len(times) == len(window)
        if len(window) < INLINE_WINDOW:
            assert times.summary is None
        else:
            assert times.summary == (sorted(window)[INLINE_WINDOW // 2], max(window)), i
