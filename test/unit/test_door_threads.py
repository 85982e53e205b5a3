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
            self.release.wait(30)
        return seq.ActionChunk([[tag]])


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
    yield name, host, ticks, act
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
    name, host, ticks, act = door
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
        policy.release.set()                                  # the hung call returns: its result is dropped
        got, status, body = _ask(conn, 101, tag=6.0)
        assert (got, status) == (101, 200) and body["action_chunk"]["actions"] == [[6.0]], body
    finally:
        conn.close()
    assert eventually(lambda: act.budget.open == 0, what="the door's place given back on the loop")
