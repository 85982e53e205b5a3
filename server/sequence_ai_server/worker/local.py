"""The same-host door: the /act channel's messages over a Unix socket instead of the websocket.

A client on the shared-memory path (``body_format="shm"``), or of a worker on a loopback
address (either client channel: the sync face's blocking one and the asyncio one,
``sequence_ai_core._local``), asks for it on the channel's upgrade (``protocol.LOCAL_HEADER:
1``); the worker then opens its door (once, on the first ask: a worker no same-host client
talks to has none) and names the socket's path in the accept's header. The
client connects there and the channel goes on as before (``channel._DoorChannel``: the same
requests, answers, tokens, limits and segments) with none of the websocket's framing, masking
and ASGI messages: on loopback those were about a third of a same-host round trip.

Threads: each door connection is served on a thread of its own, blocking on its socket and
calling the act pipeline directly (no event loop, task or future wake-up on the path); a cheap
policy's request runs right on that thread when its replica is idle (``_Replica.run_inline``),
so a call that hangs holds that robot's connection (and the replica, as it would on the
replica's own thread), never the event loop that serves /ping and the other robots. Listening is
a thread too. What the event loop owns stays there: the connection budget's place is taken on
the loop (``run_coroutine_threadsafe``) and given back there.

Framing (``sequence_ai_core.framing.LOCAL_FRAME``): kind u8 (0 binary, 1 text) and length u32, then the message.
The client's first message is its token (text; then a newline and the ticket the accept named
beside the path), checked like the upgrade's ``Authorization`` (401 when it is not good) and
answered with one binary answer message (seq 0, the status, the error body or ``{}``). The
ticket hands the connection-budget place of the websocket it came from over to the door (the
client closes that websocket next), so one client holds one place; without a valid ticket the
door takes a place of its own (503 ``too_many_connections`` past the limit). A first message of
more than ``FIRST_MESSAGE_BYTES`` closes the connection.
Answers are always the binary answer (``protocol.encode_act_answer``).

Where: a socket in Linux's abstract namespace (named ``@seq-door-<pid>-<random>`` in the header,
``\0`` instead of ``@`` on the wire): nothing on disk, so nothing is left behind when the worker
is killed (a socket file in a directory of its own was, on every SIGKILL). Who may come in: the
peer's user (``SO_PEERCRED``) must be the worker's -- another user's connection is closed before a
byte is read -- and its token a valid direct secret, checked again on every request as on the
websocket (the name is random, but ``/proc/net/unix`` lists it in the network namespace: these
checks are the guard). The client checks, before its token goes out, that the
process behind it is its own user's. A message longer than the channel's message limit closes the
connection; so does one whose token message does not come within ``OPEN_TIMEOUT_S``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import struct
import threading
import time
from typing import Any, Callable, Optional

from sequence_ai_core.framing import FramedSocket

from sequence_ai_server.common.errors import ApiError, new_request_id

__all__ = ["LocalDoor", "LOCAL_PATH"]

log = logging.getLogger("sequence_ai_server.worker")

LOCAL_PATH = "/act/local"          # what the connection budget and logs call a door's connection
OPEN_TIMEOUT_S = 10.0
FIRST_MESSAGE_BYTES = 4096          # the first message is a token and a ticket: a bigger one closes the door
BACKLOG = 64
WATCH_S = 0.1                       # how often the watch looks for a request run past its timeout (s)
_ANSWER_HEAD = struct.Struct(">IH")
_PEER = struct.Struct("3i")         # SO_PEERCRED: pid, uid, gid


class LocalDoor:
    """One worker's door. ``act``: its ``ActPipeline`` (credentials, budget); ``channel(conn,
    token)``: the channel of an admitted connection (a ``FramedSocket``), whose ``serve()`` runs
    on the connection's thread until it ends and whose ``overdue(now)`` the door's watch thread
    calls every ``WATCH_S`` while it is open (``channel._DoorChannel``: a request run past its
    timeout is answered 504 there)."""

    def __init__(self, act: Any, channel: Callable[[FramedSocket, str], Any]) -> None:
        self.act, self.channel = act, channel
        self._open: set = set()             # the channels being served
        self.path: Optional[str] = None
        self._listener: Optional[socket.socket] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        #: hand-over tickets: ticket -> the _Hold of the websocket it was issued to (its budget place)
        self._tickets: dict = {}
        self._lock = threading.Lock()       # the listener and the tickets (the loop's and the doors' threads)

    async def address(self) -> Optional[str]:
        """The socket's name (``@...``: abstract namespace), the door opened on the first call
        (on the event loop, which keeps the connection budget); None where abstract Unix sockets
        and ``SO_PEERCRED`` are missing (not Linux) or the door cannot be made (the client then
        stays on the websocket)."""
        with self._lock:
            if self._listener is None and hasattr(socket, "AF_UNIX") and hasattr(socket, "SO_PEERCRED"):
                name = f"seq-door-{os.getpid()}-{secrets.token_hex(12)}"
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    listener.bind("\0" + name)
                    listener.listen(BACKLOG)
                except OSError:
                    listener.close()
                    return None
                self._listener, self.path, self._loop = listener, "@" + name, asyncio.get_running_loop()
                threading.Thread(target=self._accept, args=(listener,), name="seq-door", daemon=True).start()
                threading.Thread(target=self._watch, args=(listener,), name="seq-door-watch", daemon=True).start()
        return self.path

    def issue(self) -> str:
        """A one-time ticket for the websocket being accepted (it holds a budget place): named
        beside the path in the accept's header, sent back with the token on the door, it hands
        that place over, so one client is never counted twice (at the limit, the door would
        otherwise refuse a client its own websocket had just been admitted for)."""
        ticket = secrets.token_hex(16)
        with self._lock:
            self._tickets[ticket] = _Hold()
        return ticket

    def settle(self, ticket: str) -> bool:
        """The websocket of ``ticket`` ended -> True when its budget place is free now (release
        it): False while the door connection its ticket admitted is still open (that one gives the
        place back when it ends). The place is one client's until both are gone."""
        with self._lock:
            hold = self._tickets.get(ticket)
            if hold is None:
                return True
            hold.holders -= 1
            if hold.holders:
                return False
            del self._tickets[ticket]
            return True

    def _let_go(self, hold: "_Hold", ticket: str) -> None:
        """A door connection is done with its place (once: its thread's end, or the watch giving
        up on it): given back on the event loop when no websocket holds it any more."""
        with self._lock:
            if hold.door_gone:
                return
            hold.door_gone = True
            hold.holders -= 1
            if hold.holders:
                return
            if self._tickets.get(ticket) is hold:
                del self._tickets[ticket]
        self._on_loop(self.act.budget.release)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:            # closed (close()), or out of descriptors: the door is done
                return
            threading.Thread(target=self._connected, args=(sock,), name="seq-door-conn", daemon=True).start()

    def _connected(self, sock: socket.socket) -> None:
        """One connection, on its own thread: the peer's user, then the token (and ticket) within
        ``OPEN_TIMEOUT_S``, a budget place, the answer, then the channel until it ends."""
        conn, hold, ticket = FramedSocket(sock), None, ""
        try:
            _, uid, _ = _PEER.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
            if uid != os.geteuid():
                return
            kind, first = conn.receive_message(time.monotonic() + OPEN_TIMEOUT_S, FIRST_MESSAGE_BYTES)
            if kind != 1:
                return
            token, _, ticket = first.decode("utf-8", "replace").partition("\n")
            try:
                self.act.check_token(token)
                hold = self._take_place(ticket)
            except ApiError as exc:
                exc.request_id = new_request_id()
                conn.send(_ANSWER_HEAD.pack(0, exc.status) + exc.json_bytes())
                return
            conn.send(_ANSWER_HEAD.pack(0, 200) + b"{}")
            channel = self.channel(conn, token)
            entry = (channel, conn, hold, ticket)
            with self._lock:
                self._open.add(entry)
            try:
                channel.serve()
            finally:
                with self._lock:
                    self._open.discard(entry)
        except OSError:               # the client went away, a timeout, a first message over the cap
            pass
        finally:
            if hold is not None:
                self._let_go(hold, ticket)
            conn.close()

    def _watch(self, listener: socket.socket) -> None:
        """Every ``WATCH_S`` while the door is open: each open channel's ``overdue(now)``. A
        channel that answered its running request 504 there is given up: its thread is held by
        the call that ran past its time, so nothing would read the client's next request; the
        connection is shut (the client's next request opens a new one, answered 504 while the
        replica is held, as on the websocket) and its budget place given back at once."""
        while self._listener is listener:
            time.sleep(WATCH_S)
            with self._lock:
                entries = list(self._open)
            now = time.perf_counter()
            for channel, conn, hold, ticket in entries:
                try:
                    if channel.overdue(now):
                        with self._lock:
                            self._open.discard((channel, conn, hold, ticket))
                        conn.shut()
                        self._let_go(hold, ticket)
                except Exception:  # noqa: BLE001 - one channel's failure must not end the watch
                    log.exception("the same-host door's watch failed on a connection")

    def _take_place(self, ticket: str) -> "_Hold":
        """The connection's budget place -> its _Hold: the place of the websocket ``ticket`` was
        issued to (once), else a place of its own, taken on the event loop. Raises ApiError (503
        too_many_connections); OSError when the loop does not answer within OPEN_TIMEOUT_S (a
        place it takes after that is given back)."""
        with self._lock:
            hold = self._tickets.get(ticket)
            if hold is not None and not hold.used:
                hold.used, hold.holders = True, hold.holders + 1
                return hold

        state, guard = {"taken": False, "given_up": False}, threading.Lock()

        async def take() -> None:
            with guard:
                if not state["given_up"]:
                    self.act.budget.take(LOCAL_PATH)
                    state["taken"] = True
        try:
            asyncio.run_coroutine_threadsafe(take(), self._loop).result(OPEN_TIMEOUT_S)
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001 - the loop closed or stalled: the worker is going away
            # a cancel cannot stop a step already scheduled: the place is taken late, or never
            with guard:
                state["given_up"] = True
                taken = state["taken"]
            if taken:
                self._on_loop(self.act.budget.release)
            raise OSError(f"the worker's event loop did not answer ({exc!r})") from None
        hold = _Hold()
        hold.used = True
        return hold

    def _on_loop(self, fn: Callable[[], None]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(fn)
            except RuntimeError:      # closed in between: the worker is going away
                pass

    def close(self) -> None:
        """Stop listening (idempotent); the abstract name goes with the socket. Connections
        already open go on until their clients close them."""
        with self._lock:
            listener, self._listener, self.path = self._listener, None, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)   # wakes the accept thread
            except OSError:
                pass
            listener.close()


class _Hold:
    """One client's place in the connection budget, held by its websocket (from ``issue``) and/or
    its door connection; given back when the last holder lets go. ``used``: a door connection
    took it (a ticket admits one)."""
    __slots__ = ("holders", "used", "door_gone")

    def __init__(self) -> None:
        self.holders, self.used, self.door_gone = 1, False, False
