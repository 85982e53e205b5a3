"""The sync client's blocking /act transport (``sequence_ai_core/_blocking.py``) under faults, against real
gateway and worker processes on loopback: a connection cut after the request went out (the
request is played at most twice, as over the asyncio wire), a worker that stops answering (a
typed error within the wire's own time), a body far over the worker's limit (413 without a second
upload), Ctrl-C while the channel opens (its socket closes at once), the worker's websocket
places (one per session, kept across lease renewals, so a second robot is not pushed onto HTTP;
an asyncio channel closed to a hung worker closes its socket), and a body without frames (JSON)."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from _core_support import ECHO, connect, observation, unique
from _servers import GatewayProcess, WorkerProcess, freeze
from sequence_ai_core import ConnectionLost, InvalidRequest, TransportError
from sequence_ai_core._blocking import BlockingChannel
from sequence_ai_core._wire import Session, WorkerLink

pytestmark = pytest.mark.filterwarnings("ignore:run\\(\\)/act\\(\\) called with validate=None")


def _cut(channel) -> None:
    """Cut a blocking channel's connection from another thread (a dup of its descriptor, shut
    down both ways): its same-host door's Unix socket (a loopback worker's), else its websocket."""
    sock = channel.local.sock if channel.local is not None else channel._sock
    dup = socket.socket(fileno=os.dup(sock.fileno()))
    try:
        dup.shutdown(socket.SHUT_RDWR)
    finally:
        dup.close()


def _first(prediction) -> float:
    return prediction.action_chunk.actions[0][0]       # the echo policy's call counter


def _worker_pid(policy) -> int:
    """The pid of the process listening on the session's worker port (``ss``)."""
    port = int(policy._engine._wire.session.worker_url.rsplit(":", 1)[1])
    out = subprocess.run(["ss", "-tlnpH", f"( sport = :{port} )"], capture_output=True, text=True,
                         timeout=30).stdout
    assert "pid=" in out, out
    return int(out.split("pid=", 1)[1].split(",", 1)[0])


def test_a_request_cut_after_it_went_out_is_played_at_most_twice(shared_module_gateway):
    """The blocking channel drops while the worker runs the request (it ran: the worker's counter
    moved); the link reconnects and replays it once on a new blocking channel, and when that
    replay's connection is cut too the call raises ConnectionLost -- the request ran twice, never
    three times."""
    name = unique("echo-cut")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name) as policy:
        transports = policy._engine._wire.transports
        a = _first(policy.predict(observation()))
        first, cut = transports.current, []

        def cutter():
            t0 = time.monotonic()
            time.sleep(0.3)                               # the first run (1 s) is under way
            _cut(first)
            cut.append("blocking")
            deadline = time.monotonic() + 10
            while transports.current in (None, first) and time.monotonic() < deadline:
                time.sleep(0.005)
            # the replay waits in the worker's queue behind the first run, then runs 1 s
            time.sleep(max(0.0, t0 + 1.5 - time.monotonic()))
            _cut(transports.current)
            cut.append("replay")
        thread = threading.Thread(target=cutter, daemon=True)
        thread.start()
        with pytest.raises(ConnectionLost, match="dropped twice"):
            policy.predict(observation(), params={"latency_ms": 1000})
        thread.join(10)
        assert cut == ["blocking", "replay"]
        assert _first(policy.predict(observation())) == a + 3     # ran twice, then this one
        assert policy.reconnects == 1 and transports.opens == 3


def test_a_worker_that_stops_answering_costs_what_it_costs_the_asyncio_wire(shared_module_gateway):
    """A SIGSTOPped worker: a request on the open blocking channel raises TransportError after
    timeout_s; the next predict's channel open times out too, which counts as the first attempt:
    one reconnect and one more try, ConnectionLost after about 2 x timeout_s (not 3 x)."""
    name = unique("echo-stop")
    shared_module_gateway.deploy(ECHO, name, wait=True)
    with connect(shared_module_gateway, name, timeout_s=2.0) as policy:
        a = _first(policy.predict(observation()))
        pid = _worker_pid(policy)
        freeze(pid)           # not just kill(): the door's thread, woken by the request, could still answer it
        try:
            t0 = time.monotonic()
            with pytest.raises(TransportError, match="timed out after 2s") as timed_out:
                policy.predict(observation())
            first_s = time.monotonic() - t0
            t0 = time.monotonic()
            with pytest.raises(ConnectionLost):
                policy.predict(observation())
            second_s = time.monotonic() - t0
        finally:
            os.kill(pid, signal.SIGCONT)
        assert type(timed_out.value) is TransportError and 1.9 <= first_s < 3.0
        assert 3.9 <= second_s < 5.5, second_s      # two opens of 2 s (the old path: three)
        deadline = time.monotonic() + 30
        while True:                                 # the worker serves again once resumed
            try:
                b = _first(policy.predict(observation()))
                break
            except TransportError:
                assert time.monotonic() < deadline
        assert a < b <= a + 2                        # the timed-out request may have run, nothing more




def _link(worker):
    link = WorkerLink("http://127.0.0.1:9", "unused", "blk", timeout_s=10.0, body_format="binary")
    link.session = Session(session_id=None, worker_url=worker.url, direct_secret=worker.secret)
    return link


@pytest.mark.parametrize("size", [5_000_000, 40_000_000])
@pytest.mark.parametrize("door", [True, False], ids=["door", "websocket"])
def test_a_body_far_over_the_limit_is_payload_too_large_on_the_blocking_path(small_body_worker, size, door,
                                                                            monkeypatch):
    """Far over the limit the worker stops reading while the body is still going out, and the
    connection resets under the send: on the websocket (``SEQ_CLIENT_DOOR=0``) it closes with
    1009, which the blocking channel reads; on the same-host door it answers 413 first, naming
    the limit. Either way the robot gets the same 413 as HTTP, which the link raises rather than
    uploading the body again."""
    monkeypatch.setenv("SEQ_CLIENT_DOOR", "1" if door else "0")
    link, loop = _link(small_body_worker), asyncio.new_event_loop()
    try:
        obs = observation().to_wire()
        obs["images"][0]["data"] = b"\xff\xd8" + b"\0" * size
        with pytest.raises(InvalidRequest) as refused:
            link.act_blocking(obs, loop.run_until_complete)
        assert (refused.value.code, refused.value.status_code) == ("payload_too_large", 413)
        said = "takes at most 200000 bytes" if door else "1009"
        assert said in str(refused.value) and link.reconnects == 0, refused.value
        before = _first(link.act_blocking(observation().to_wire(), loop.run_until_complete))  # a new channel
        assert _first(link.act_blocking(observation().to_wire(), loop.run_until_complete)) == before + 1
        assert link.transports.current.requests == 2 and link.transports.opens == 2
    finally:
        loop.run_until_complete(link.aclose_http())
        loop.close()


def _interrupt_main(when, got: dict) -> threading.Thread:
    """A thread that waits for ``when()`` (-> True once the main thread is where it should be
    interrupted; it may store what it saw in ``got``), then sends the main thread SIGINT and
    notes the time; any failure of its own is stored as ``got["error"]``."""
    main = threading.get_ident()

    def run():
        try:
            deadline = time.monotonic() + 60
            while not when():
                assert time.monotonic() < deadline, "the main thread never got there"
                time.sleep(0.001)
            got["interrupted_at"] = time.monotonic()
            signal.pthread_kill(main, signal.SIGINT)
        except BaseException as exc:        # noqa: BLE001 - reported by the test
            got["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_while_the_channel_opens_closes_its_socket_at_once():
    """A worker that accepted the TCP connection and read the whole upgrade request, but holds
    its 101 back; Ctrl-C then, so it lands mid-upgrade however slow the machine: the socket is
    closed when KeyboardInterrupt leaves, not when its traceback is collected (a REPL keeps the
    last one). The signal is sent once the request is in, not after a fixed time."""
    server = socket.create_server(("127.0.0.1", 0))
    port, got = server.getsockname()[1], {}

    def upgrade_read() -> bool:
        peer, _ = server.accept()
        peer.settimeout(60.0)
        got["peer"], upgrade = peer, b""
        while b"\r\n\r\n" not in upgrade:
            chunk = peer.recv(65536)
            assert chunk, upgrade
            upgrade += chunk
        got["upgrade"] = upgrade
        return True
    try:
        thread = _interrupt_main(upgrade_read, got)
        with pytest.raises(KeyboardInterrupt) as stopped:
            BlockingChannel(f"http://127.0.0.1:{port}", "token", 60.0).connect()
        thread.join(60)
        assert "error" not in got, got.get("error")
        assert got["upgrade"].startswith(b"GET /act/ws HTTP/1.1")
        with got["peer"] as peer:
            peer.settimeout(30.0)                 # generous: 'at once' is the bound below
            assert peer.recv(65536) == b""        # closed, with the traceback still alive
            closed_after = time.monotonic() - got["interrupted_at"]
        assert stopped.value is not None and closed_after < 5.0, closed_after
    finally:
        server.close()


def _syn_sent_to(port: int) -> int:
    """This machine's TCP sockets in SYN-SENT to 127.0.0.1:``port`` (/proc/net/tcp: no subprocess)."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as table:
        return sum(1 for line in table.readlines()[1:] if line.split()[2] == want and line.split()[3] == "02")


def test_ctrl_c_while_the_channel_dials_closes_its_socket_at_once():
    """A worker whose accept queue is full drops the SYN, so the TCP connect waits; Ctrl-C then
    (once the socket is seen in SYN-SENT): the socket is closed when KeyboardInterrupt leaves,
    not kept by the traceback (socket.create_connection closes it only on OSError)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=0)
    port, got, queued = server.getsockname()[1], {}, []
    try:
        for _ in range(4):                        # fill the accept queue (never accepted)
            try:
                queued.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
            except OSError:
                break
        before = _syn_sent_to(port)
        thread = _interrupt_main(lambda: _syn_sent_to(port) > before, got)
        with pytest.raises(KeyboardInterrupt) as stopped:
            BlockingChannel(f"http://127.0.0.1:{port}", "token", 60.0).connect()
        thread.join(60)
        assert "error" not in got, got.get("error")
        assert _syn_sent_to(port) == before       # closed, with the traceback still alive
        assert stopped.value is not None
    finally:
        for sock in queued:
            sock.close()
        server.close()


def test_a_session_holds_one_websocket_across_renewals_so_a_second_robot_keeps_its_channel(tmp_path):
    """A worker with two websocket places and two robots. Robot A's lease renewals hand the new
    token to A's open channel (no second socket, no reopen: the worker counts one channel open
    for A however many renewals), so robot B's channel opens instead of being refused
    (too_many_connections, which would send B to HTTP for 30 s)."""
    gw = GatewayProcess.start(tmp_path, env={"SEQ_WORKER_MAX_CONNECTIONS": "2"})
    try:
        name = "echo-places"
        gw.deploy(ECHO, name, wait=True)
        with connect(gw, name) as a, connect(gw, name) as b:
            link_a = a._engine._wire
            a.predict(observation())
            channel, token = link_a.transports.current, link_a.session.direct_secret
            for renewal in (1, 2):
                link_a.session.renew_at = 0.0             # the lease is due: renewed beside the requests
                deadline = time.monotonic() + 30
                while link_a.renewals < renewal:          # until the renewal beside them landed
                    assert time.monotonic() < deadline, (link_a.renewals, link_a.renew_failures)
                    a.predict(observation())
                    time.sleep(0.02)
                a.predict(observation())                  # goes out with the renewed token
            assert link_a.session.direct_secret != token and channel.token == link_a.session.direct_secret
            assert link_a.transports.current is channel and channel.open
            assert (link_a.transports.opens, link_a.transports.refreshes, a.reconnects) == (1, 2, 0)
            b.predict(observation())
            transports_b = b._engine._wire.transports
            assert isinstance(transports_b.current, BlockingChannel) and transports_b.current.requests == 1
            assert transports_b.paused_until == 0.0 and transports_b.opens == 1
    finally:
        gw.close()


def test_a_request_without_frames_goes_out_as_json_on_the_blocking_path(shared_module_gateway):
    """A policy with no contract takes a plain dict: its body has no frames, so it is JSON even
    though the session asks for the binary body ("auto"); the blocking channel's format byte says
    so and the worker answers it (not a 400 for a binary framing it cannot find)."""
    from _servers import POLICIES
    name = unique("raw-blk")
    shared_module_gateway.deploy(str(POLICIES / "raw_policy.py"), name, wait=True)
    with connect(shared_module_gateway, name) as policy:
        assert policy._engine._wire.body_format == "auto"
        first = policy.predict({"op": "echo", "x": 1})
        second = policy.predict({"op": "echo", "x": 2})
        assert first["echo"] == {"op": "echo", "x": 1} and second["calls"] == first["calls"] + 1
        transports = policy._engine._wire.transports
        assert isinstance(transports.current, BlockingChannel) and transports.current.requests == 2
        assert transports.opens == 1


def _connections_to(port: int) -> int:
    """This machine's established TCP connections to ``port`` (their client ends)."""
    out = subprocess.run(["ss", "-tnH", "state", "established", f"( dport = :{port} )"], capture_output=True,
                         text=True, timeout=30).stdout
    return len(out.strip().splitlines())


def test_closing_the_asyncio_channel_to_a_hung_worker_closes_its_socket(tmp_path, monkeypatch):
    """The link closes an asyncio channel before a blocking one opens (one websocket at a time).
    To a worker that stopped answering, the closing handshake gives up after 2 s and the
    connection is closed then, not left open until garbage collection. (On its websocket:
    ``SEQ_CLIENT_DOOR=0``; the same-host door has no closing handshake to wait for.)"""
    monkeypatch.setenv("SEQ_CLIENT_DOOR", "0")
    worker = WorkerProcess.start(ECHO, tmp_path, name="hung")
    try:
        async def go():
            wire = WorkerLink("http://127.0.0.1:9", "unused", "hung", timeout_s=5.0, body_format="binary")
            wire.session = Session(session_id=None, worker_url=worker.url, direct_secret=worker.secret)
            try:
                await wire.act(observation().to_wire())
                opened = _connections_to(worker.port)
                freeze(worker.proc.pid)
                try:
                    t0 = time.monotonic()
                    await wire.transports.aclose()
                    took = time.monotonic() - t0
                    await asyncio.sleep(0.05)          # the loop completes the close
                    return opened, took, _connections_to(worker.port), wire.transports.channel_open
                finally:
                    os.kill(worker.proc.pid, signal.SIGCONT)
            finally:
                await wire.aclose_http()
        opened, took, left, still_open = asyncio.run(go())
        assert (opened, left, still_open) == (1, 0, False)
        assert 1.9 <= took < 4.0
    finally:
        worker.stop()
