"""The worker's inline rule in process: a request to an idle replica whose recent requests were
cheap is served on the caller's thread (no hand-off to the replica's thread), never at once with
the replica's thread, never for a batching policy or a replica that is busy or has a queue. The
thresholds are patched so the tests decide by structure, not by this machine's speed; the real
workers of test_openpi_compat.py and the channel tests serve through the same path."""
from __future__ import annotations

import json
import threading

import pytest

import seq
from _wait import eventually
from sequence_ai_server.worker import host as host_module
from sequence_ai_server.worker.host import INLINE_WINDOW, PolicyHost


@seq.policy(action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=1,
                                      control_frequency_hz=10.0))
class _Counter(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        self.threads = []
        self.release = threading.Event()
        self.release.set()

    @seq.infer
    def infer(self, obs, *, tag: float = 0.0, hold: bool = False):
        self.threads.append(threading.current_thread().name)
        if hold:
            self.release.wait(30)
        return seq.ActionChunk([[tag]])


@seq.policy(action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=1,
                                      control_frequency_hz=10.0))
class _Batched(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.batched(max_batch_size=2)
    @seq.infer
    def infer(self, obs, *, tag: float = 0.0) -> list:
        return [seq.ActionChunk([[t]]) for t in tag]


def _body(tag: float, **extra) -> bytes:
    return json.dumps({"observation": {}, "params": {"tag": tag, **extra}}).encode()


@pytest.fixture
def started(tmp_path):
    hosts = []

    def start(cls, inline=True):
        host = PolicyHost(cls, inline=inline)
        host.start(str(tmp_path))
        hosts.append(host)
        return host
    yield start
    for host in hosts:
        host.stop()


def _warm(host, n=INLINE_WINDOW):
    """``n`` requests through the replica's thread, one at a time (the window the rule reads)."""
    for i in range(n):
        future, _ = host.submit_raw(_body(float(i)), "application/json")
        future.result(30)


def test_a_cheap_policy_is_served_inline_once_its_window_is_measured(started, monkeypatch):
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)         # every request counts as cheap
    monkeypatch.setattr(host_module, "INLINE_MAX_MS", 1e9)
    host = started(_Counter)
    replica, policy = host.replicas[0], host.replicas[0].instance
    _warm(host, INLINE_WINDOW - 1)
    assert replica.inline == 0 and set(policy.threads[-3:]) == {"policy-0"}    # a window not yet full: hand-offs
    _warm(host, 1)
    # the replica's thread notes the request's time and lets go of its lock just after the answer
    assert eventually(lambda: len(replica.item_ms) == INLINE_WINDOW and not replica.run_lock.locked(),
                      what="the replica's thread is done with its last request")
    future, item = host.submit_raw(_body(7.0), "application/json")
    assert future.done(), "served before submit_raw returned"
    result, _, batch = future.result()
    assert result.actions.tolist() == [[7.0]] and batch == 1 and item.prepared is not None
    assert replica.inline == 1 and policy.threads[-1] == threading.current_thread().name
    decoded = host.prepare(_body(8.0))                          # the decoded form (openpi's) too
    assert host.submit(decoded).done() and replica.inline == 2


def test_a_host_not_made_inline_hands_every_cheap_request_to_the_replica(started, monkeypatch):
    # the default (a hang inline would hold the event loop, /ping with it): opt-in only
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)
    monkeypatch.setattr(host_module, "INLINE_MAX_MS", 1e9)
    host = started(_Counter, inline=False)
    _warm(host, INLINE_WINDOW + 4)
    future, _ = host.submit_raw(_body(99.0), "application/json")
    future.result(30)
    assert host.replicas[0].inline == 0
    assert set(host.replicas[0].instance.threads) == {"policy-0"}


def test_the_worker_serves_inline_only_when_asked(monkeypatch):
    from sequence_ai_server.worker.main import _parser
    base = ["--file", "p.py", "--ready-file", "r"]
    monkeypatch.delenv("SEQ_WORKER_INLINE", raising=False)
    assert _parser().parse_args(base).inline is False
    assert _parser().parse_args(base + ["--inline"]).inline is True
    monkeypatch.setenv("SEQ_WORKER_INLINE", "1")
    assert _parser().parse_args(base).inline is True
    assert _parser().parse_args(base + ["--no-inline"]).inline is False


def test_an_expensive_window_hands_off_to_the_replica(started, monkeypatch):
    monkeypatch.setattr(host_module, "INLINE_MS", 0.0)         # no request is cheap enough
    host = started(_Counter)
    _warm(host, INLINE_WINDOW + 4)
    assert host.replicas[0].inline == 0
    assert set(host.replicas[0].instance.threads) == {"policy-0"}


def test_one_slow_request_in_the_window_stops_inlining(started, monkeypatch):
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)
    host = started(_Counter)
    replica = host.replicas[0]
    _warm(host)
    monkeypatch.setattr(host_module, "INLINE_MAX_MS", 1e-6)    # now every measured request is over the cap
    future, _ = host.submit_raw(_body(1.0), "application/json")
    future.result(30)
    assert replica.inline == 0


def test_a_busy_replica_or_a_queue_hands_off_in_order(started, monkeypatch):
    monkeypatch.setattr(host_module, "INLINE_MAX_MS", 1e9)
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)
    host = started(_Counter)
    replica, policy = host.replicas[0], host.replicas[0].instance
    _warm(host)
    policy.release.clear()
    monkeypatch.setattr(host_module, "INLINE_MS", 0.0)         # the held request goes to the replica's thread
    held, _ = host.submit_raw(_body(-1.0, hold=True), "application/json")
    assert eventually(lambda: replica.busy, what="the held request runs on the replica")
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)         # cheap again: only the busy replica hands off
    first, _ = host.submit_raw(_body(1.0), "application/json")
    second, _ = host.submit_raw(_body(2.0), "application/json")
    assert not first.done() and not second.done() and replica.inline == 0
    policy.release.set()
    held.result(30)
    assert [f.result(30)[0].actions.tolist() for f in (first, second)] == [[[1.0]], [[2.0]]]
    assert policy.threads[-3:] == ["policy-0"] * 3 and replica.inline == 0


def test_a_batching_policy_is_never_served_inline(started, monkeypatch):
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)
    monkeypatch.setattr(host_module, "INLINE_MAX_MS", 1e9)
    host = started(_Batched)
    for i in range(INLINE_WINDOW + 4):
        assert host.submit(host.prepare(_body(float(i)))).result(30)[0].actions.tolist() == [[float(i)]]
    assert host.replicas[0].inline == 0


@seq.policy(action=seq.ActionContract(robot="arm", action_space="joint_absolute", action_dim=1,
                                      control_frequency_hz=10.0))
class _Exits(seq.Policy):
    @seq.load
    def load(self, weights_dir):
        pass

    @seq.infer
    def infer(self, obs, *, tag: float = 0.0):
        if tag < 0:
            raise SystemExit(3) if tag == -1.0 else KeyboardInterrupt()
        return seq.ActionChunk([[tag]])


def test_systemexit_or_keyboardinterrupt_inline_is_the_policys_error(started, monkeypatch):
    """Out of an inline call they would unwind the event loop's thread (the channel's task, or
    uvicorn's); they are the request's PolicyError, as on the replica's thread."""
    monkeypatch.setattr(host_module, "INLINE_MS", 1e9)
    monkeypatch.setattr(host_module, "INLINE_MAX_MS", 1e9)
    host = started(_Exits)
    replica = host.replicas[0]
    _warm(host)
    eventually(lambda: len(replica.item_ms) == INLINE_WINDOW and not replica.run_lock.locked(),
               what="the replica's thread is done with its last request")
    for tag, kind in ((-1.0, "SystemExit"), (-2.0, "KeyboardInterrupt")):
        future, _ = host.submit_raw(_body(tag), "application/json")
        assert future.done() and future.exception().exception_type == kind
    assert replica.inline == 2
    future, _ = host.submit_raw(_body(5.0), "application/json")
    assert future.result(30)[0].actions.tolist() == [[5.0]]
