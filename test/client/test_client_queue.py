"""The client against a one-slot deployment on the real gateway: waiting in line before the
control loop (on_queue, Retry-After, queue_timeout, interrupt, no ghost left in line), reconnects
that never queue a robot behind its own session, and run() ending its episode at the worker
(``@seq.on_episode``). Policy: test/policies/one_slot_policy.py (queue_timeout_s 4 s)."""
from __future__ import annotations

import asyncio
import re
import threading
import time
from pathlib import Path

import pytest

import sequence_ai
from _core_support import Recorder, after, connect, observation, unique
from _servers import GatewayProcess
from _wait import eventually

ONE_SLOT = str(Path(__file__).resolve().parents[1] / "policies" / "one_slot_policy.py")
QUEUE_TIMEOUT_S = 4.0     # one_slot_policy.QUEUE_TIMEOUT_S
PERIOD = 1 / 15
SLACK = 0.05              # scheduling slack on a busy 2-core box

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


@pytest.fixture(scope="module")
def slot_gateway(tmp_path_factory):
    """A gateway whose workers log ended episodes to ``gw.episode_log``."""
    tmp = tmp_path_factory.mktemp("queue-gateway")
    log = tmp / "episodes.log"
    gw = GatewayProcess.start(tmp, env={"EPISODE_LOG": str(log)})
    gw.episode_log = log
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture(scope="module")
def one_slot(slot_gateway):
    name = unique("one-slot")
    d = slot_gateway.deploy(ONE_SLOT, name, wait=True)
    assert d["status"] == "ready", d
    return name


def gauge(gw, metric: str, model: str) -> float:
    """A Prometheus gauge of the gateway for one deployment (0 when absent)."""
    text = gw.client.get("/metrics").text
    m = re.search(rf'^{metric}{{deployment="{re.escape(model)}"}} ([0-9.e+-]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


class QueueLog:
    """on_queue target: (monotonic time, position, estimate_s) per queued answer."""

    def __init__(self):
        self.calls: list[tuple[float, int, object]] = []
        self.first = threading.Event()

    def __call__(self, position, estimate_s):
        self.calls.append((time.monotonic(), position, estimate_s))
        self.first.set()


@pytest.fixture
def holder(slot_gateway, one_slot):
    """Robot A, holding the only slot; closed at the end of the test if it still is."""
    a = connect(slot_gateway, one_slot)
    try:
        yield a
    finally:
        a.close()
        eventually(lambda: gauge(slot_gateway, "seq_gateway_sessions", one_slot) == 0, 5.0)


# ------------------------------------------------------------------ waiting in line

def test_a_second_robot_waits_in_line_and_gets_the_slot_when_the_first_closes(slot_gateway, one_slot, holder):
    queue = QueueLog()
    got: dict = {}

    def robot_b():
        with connect(slot_gateway, one_slot, on_queue=queue) as b:
            got["connected_at"] = time.monotonic()
            got["out"] = b.run(observation, Recorder(), max_actions=5, progress=False)

    t = threading.Thread(target=robot_b, daemon=True)
    t.start()
    assert queue.first.wait(10), "robot B was never put in line"
    assert queue.calls[0][1] == 1 and isinstance(queue.calls[0][2], float) and queue.calls[0][2] > 0
    assert gauge(slot_gateway, "seq_gateway_queue_depth", one_slot) == 1.0
    time.sleep(1.5)                           # B keeps asking with its ticket, at Retry-After (1 s)
    assert "out" not in got and 2 <= len(queue.calls) <= 4, queue.calls
    assert all(p == 1 for _, p, _ in queue.calls)
    gaps = [b[0] - a[0] for a, b in zip(queue.calls, queue.calls[1:])]
    assert all(g >= 0.8 for g in gaps), gaps  # a modest pace: it respects Retry-After
    closed_at = time.monotonic()
    holder.close()                            # A gives its slot up: B gets in at its next ask
    t.join(15)
    assert not t.is_alive()
    assert got["out"].reason == "completed" and got["out"].actions == 5
    assert got["connected_at"] - closed_at < 2.0   # at its next ask (Retry-After 1 s)
    assert gauge(slot_gateway, "seq_gateway_queue_depth", one_slot) == 0.0


def test_waiting_in_line_gives_up_with_queue_timeout_and_prints_the_line(slot_gateway, one_slot, holder, capfd):
    t0 = time.monotonic()
    with pytest.raises(sequence_ai.Unavailable) as err:
        connect(slot_gateway, one_slot)       # default on_queue: the stderr line
    waited = time.monotonic() - t0
    assert err.value.code == "queue_timeout" and err.value.retryable is False
    assert "queue_timeout_s" in str(err.value) and err.value.details["queue_timeout_s"] == QUEUE_TIMEOUT_S
    assert QUEUE_TIMEOUT_S <= waited < QUEUE_TIMEOUT_S + 4
    lines = [x for x in capfd.readouterr().err.splitlines() if "queued for a GPU slot" in x]
    assert len(lines) == 1, lines             # printed when the position changes, not on every ask
    assert re.fullmatch(r"\[sequences\] queued for a GPU slot: position 1, about \d+s …", lines[0])
    assert gauge(slot_gateway, "seq_gateway_queue_depth", one_slot) == 0.0


def test_interrupt_stops_the_wait_in_line_within_one_period_and_leaves_no_ghost(slot_gateway, one_slot, holder):
    queue = QueueLog()
    marks: dict = {}

    async def main():
        b = sequence_ai.aconnect(one_slot, api_key=slot_gateway.api_key, gateway_url=slot_gateway.url,
                                 on_queue=queue)

        async def interrupt_when_queued():
            while not queue.calls:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)          # between two asks: the wait is a sleep, not a call
            marks["interrupt"] = time.monotonic()
            b.interrupt()

        task = asyncio.ensure_future(interrupt_when_queued())
        try:
            async with b:
                marks["entered"] = True
        except sequence_ai.SequencesError as exc:
            marks["stopped"] = time.monotonic()
            marks["code"] = exc.code
        await task
        await b.aclose()

    asyncio.run(main())
    assert "entered" not in marks and marks["code"] == "interrupted"
    assert marks["stopped"] - marks["interrupt"] <= PERIOD + SLACK
    # its place in line is given up at once, not left for the gateway's 15 s abandon timer
    eventually(lambda: gauge(slot_gateway, "seq_gateway_queue_depth", one_slot) == 0.0, 1.0)


def test_interrupting_a_run_that_waits_in_line_holds_within_one_period(slot_gateway, one_slot, holder):
    queue = QueueLog()
    rec = Recorder()
    marks: dict = {}
    b = sequence_ai.AsyncPolicy(one_slot, api_key=slot_gateway.api_key, gateway_url=slot_gateway.url,
                                on_queue=queue)

    def interrupt():
        marks["interrupt"] = time.monotonic()
        marks["queued_answers"] = len(queue.calls)
        b.interrupt()

    async def main():
        try:                                  # no handshake first: run() meets the line itself
            threading.Timer(1.5, interrupt).start()
            return await b.run(observation, rec, hold=rec.hold, max_actions=10, progress=False)
        finally:
            await b.aclose()

    out = asyncio.run(main())
    assert marks["queued_answers"] >= 1, "the run never reached the line"
    assert out.reason == "interrupted" and out.actions == 0 and rec.rows == [] and rec.holds == 1
    assert rec.hold_times[0] - marks["interrupt"] <= PERIOD + SLACK
    eventually(lambda: gauge(slot_gateway, "seq_gateway_queue_depth", one_slot) == 0.0, 1.0)


def test_closing_a_policy_while_queued_gives_its_place_to_the_next_robot(slot_gateway, one_slot, holder):
    queue = QueueLog()

    async def main():
        b = sequence_ai.aconnect(one_slot, api_key=slot_gateway.api_key, gateway_url=slot_gateway.url,
                                 on_queue=queue)
        ok, eta = await b.ready()             # one attempt: it is now in line, ticket kept
        assert (ok, queue.calls[0][1]) == (False, 1) and eta > 0
        assert gauge(slot_gateway, "seq_gateway_queue_depth", one_slot) == 1.0
        await b.aclose()

    asyncio.run(main())
    assert gauge(slot_gateway, "seq_gateway_queue_depth", one_slot) == 0.0
    holder.close()                            # the slot is free and nobody is in line:
    c = slot_gateway.connect(one_slot)        # the next robot gets it at once
    assert c.status_code == 200, c.text
    slot_gateway.client.delete(f"/v1/sessions/{c.json()['session_id']}")


# ------------------------------------------------------------------ reconnects on one slot

def test_a_rotated_secret_on_a_one_slot_deployment_never_queues_the_robot_behind_itself(slot_gateway, one_slot):
    queue = QueueLog()
    rec = Recorder()
    with connect(slot_gateway, one_slot, on_queue=queue, params={"chunk_len": 4}) as policy:
        session = policy._engine._wire.session.session_id
        after(0.4, lambda: slot_gateway.client.post(f"/v1/deployments/{one_slot}/rotate-secret").raise_for_status())
        out = policy.run(observation, rec, max_actions=20, progress=False)
        wire = policy._engine._wire
        assert out.reason == "completed" and out.actions == 20
        assert policy.reconnects == 1 and wire.resumed == 1 and wire.session.session_id == session
        assert queue.calls == [] and wire.queued_answers == 0
        assert gauge(slot_gateway, "seq_gateway_sessions", one_slot) == 1.0
    eventually(lambda: gauge(slot_gateway, "seq_gateway_sessions", one_slot) == 0.0, 2.0)


def test_a_dropped_connection_on_a_one_slot_deployment_resumes_its_session(slot_gateway, one_slot):
    queue = QueueLog()
    with connect(slot_gateway, one_slot, on_queue=queue) as policy:
        wire = policy._engine._wire
        session, url = wire.session.session_id, wire.session.worker_url
        wire.session.worker_url = "http://127.0.0.1:9"   # nothing listens: the connection fails
        prediction = policy.predict(observation())
        assert len(prediction.action_chunk.actions) == 10
        assert policy.reconnects == 1 and wire.session.worker_url == url and wire.session.session_id == session
        assert queue.calls == [] and gauge(slot_gateway, "seq_gateway_sessions", one_slot) == 1.0


def test_a_session_the_gateway_dropped_is_closed_and_replaced_without_queueing(slot_gateway, one_slot):
    queue = QueueLog()
    with connect(slot_gateway, one_slot, on_queue=queue) as policy:
        wire = policy._engine._wire
        old = wire.session.session_id
        slot_gateway.client.delete(f"/v1/sessions/{old}").raise_for_status()   # as a lapsed lease
        wire.session.direct_secret = "stale"           # the worker answers 401 to the old token
        prediction = policy.predict(observation())
        assert len(prediction.action_chunk.actions) == 10
        assert policy.reconnects == 1 and wire.resumed == 0 and wire.session.session_id != old
        assert queue.calls == [] and gauge(slot_gateway, "seq_gateway_sessions", one_slot) == 1.0


# ------------------------------------------------------------------ episodes

def ended_episodes(gw) -> dict:
    path = Path(gw.episode_log)
    if not path.exists():
        return {}
    return {eid: int(n) for eid, n in (line.split() for line in path.read_text().splitlines() if line.strip())}


def test_run_ends_its_episode_at_the_worker_when_it_returns(slot_gateway, one_slot):
    with connect(slot_gateway, one_slot, params={"chunk_len": 4}) as policy:
        out = policy.run(observation, Recorder(), max_actions=10, progress=False)
        episode = policy.last_episode_id
        # on_episode ran for it (no 5-minute idle wait), with every act of the episode counted
        eventually(lambda: episode in ended_episodes(slot_gateway), 10.0)   # sent beside the next call; a loaded machine is slow to deliver it
        assert ended_episodes(slot_gateway)[episode] == out.chunks == 3
        out2 = policy.run(observation, Recorder(), max_actions=4, progress=False)
        assert policy.last_episode_id != episode
        eventually(lambda: policy.last_episode_id in ended_episodes(slot_gateway), 10.0)
        assert ended_episodes(slot_gateway)[policy.last_episode_id] == out2.chunks == 1


def test_run_ends_its_episode_even_when_act_raises(slot_gateway, one_slot):
    rec = Recorder()

    def act(row):
        rec(row)
        if len(rec.rows) == 3:
            raise RuntimeError("arm fault")

    with connect(slot_gateway, one_slot, params={"chunk_len": 10}) as policy:
        with pytest.raises(RuntimeError, match="arm fault"):
            policy.run(observation, act, hold=rec.hold, max_actions=30, progress=False)
        assert rec.holds == 1
        eventually(lambda: policy.last_episode_id in ended_episodes(slot_gateway), 10.0)
        assert ended_episodes(slot_gateway)[policy.last_episode_id] >= 1


def test_close_from_another_thread_while_a_predict_is_in_flight_waits_for_it_and_frees_the_slot(slot_gateway, one_slot):
    """A supervisor thread closing the robot's Policy mid-request: close() returns without error
    once the driving call has ended (before: RuntimeError 'Cannot close a running event loop'),
    the session is gone from the gateway and the next robot gets the only slot without queueing."""
    policy = connect(slot_gateway, one_slot, params={"latency_ms": 800})
    got: dict = {}

    def drive():
        try:
            got["rows"] = len(policy.predict(observation()).action_chunk.actions)
        except sequence_ai.SequencesError as exc:
            got["code"] = exc.code

    t = threading.Thread(target=drive)
    t.start()
    time.sleep(0.3)                       # the predict is on the worker (infer sleeps 0.8 s)
    policy.close()
    t.join(5)
    assert not t.is_alive() and (got.get("rows") == 10 or got.get("code") in ("interrupted", "closed")), got
    with pytest.raises(sequence_ai.SequencesError) as err:
        policy.predict(observation())
    assert err.value.code == "closed"
    eventually(lambda: gauge(slot_gateway, "seq_gateway_sessions", one_slot) == 0, 5.0)
    queue = QueueLog()
    with connect(slot_gateway, one_slot, on_queue=queue):
        assert queue.calls == []
