"""The same-host door: the /act channel's messages over a Unix socket instead of the websocket.

A client on the shared-memory path (``body_format="shm"``) asks for it on the channel's upgrade
(``protocol.LOCAL_HEADER: 1``); the worker then opens its door (once, on the first ask: a worker
no same-host client talks to has none) and names the socket's path in the accept's header. The
client connects there and the channel goes on as before (``channel._Channel``: the same
requests, answers, cancels, tokens, limits and segments) with none of the websocket's framing,
masking and ASGI messages: on loopback those were about a third of a same-host round trip.

Framing (``protocol.LOCAL_FRAME``): kind u8 (0 binary, 1 text) and length u32, then the message.
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
websocket. The name is unguessable and the client checks, before its token goes out, that the
process behind it is its own user's. A message longer than the channel's message limit closes the
connection; so does one whose token message does not come within ``OPEN_TIMEOUT_S``.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import socket
import struct
from typing import Any, Awaitable, Callable, Optional

from sequence_ai_core.protocol import LOCAL_FRAME

from sequence_ai_server.common.errors import ApiError, new_request_id

__all__ = ["LocalDoor", "LOCAL_PATH"]

LOCAL_PATH = "/act/local"          # what the connection budget and logs call a door's connection
OPEN_TIMEOUT_S = 10.0
FIRST_MESSAGE_BYTES = 4096          # the first message is a token and a ticket: a bigger one closes the door
_ANSWER_HEAD = struct.Struct(">IH")
_PEER = struct.Struct("3i")         # SO_PEERCRED: pid, uid, gid


class _Socket:
    """One door connection as the channel sees a websocket: ``receive()`` -> an ASGI-like
    message dict, ``send_bytes`` / ``send_text``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_size: int) -> None:
        self.reader, self.writer, self.max_size = reader, writer, max_size

    async def receive(self) -> dict:
        try:
            kind, size = LOCAL_FRAME.unpack(await self.reader.readexactly(LOCAL_FRAME.size))
            if size > self.max_size:
                return {"type": "websocket.disconnect", "code": 1009}
            data = await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return {"type": "websocket.disconnect", "code": 1006}
        if kind == 1:
            return {"type": "websocket.receive", "text": data.decode("utf-8", "replace")}
        return {"type": "websocket.receive", "bytes": data}

    async def send_bytes(self, data: bytes, kind: int = 0) -> None:
        if self.writer.is_closing():
            raise ConnectionResetError("the same-host client went away")
        self.writer.write(LOCAL_FRAME.pack(kind, len(data)) + data)
        if self.writer.transport.get_write_buffer_size() > 1 << 16:
            await self.writer.drain()

    async def send_text(self, text: str) -> None:
        await self.send_bytes(text.encode(), 1)


class LocalDoor:
    """One worker's door. ``act``: its ``ActPipeline`` (credentials, budget); ``serve(socket,
    token)``: runs the channel over an admitted connection; ``max_size``: the channel's message
    limit (bytes)."""

    def __init__(self, act: Any, serve: Callable[[Any, str], Awaitable[None]], max_size: int) -> None:
        self.act, self.serve, self.max_size = act, serve, max_size
        self.path: Optional[str] = None
        self._server: Any = None
        #: hand-over tickets: ticket -> "open" (issued to a websocket that holds a budget place),
        #: "taken" (a door connection took that place over: the websocket must not release it)
        self._tickets: dict = {}
        self._lock = asyncio.Lock()

    async def address(self) -> Optional[str]:
        """The socket's name (``@...``: abstract namespace), the door opened on the first call;
        None where abstract Unix sockets and ``SO_PEERCRED`` are missing (not Linux) or the door
        cannot be made (the client then stays on the websocket)."""
        async with self._lock:
            if self._server is None and hasattr(socket, "AF_UNIX") and hasattr(socket, "SO_PEERCRED"):
                name = f"seq-door-{os.getpid()}-{secrets.token_hex(12)}"
                try:
                    self._server = await asyncio.start_unix_server(self._connected, "\0" + name)
                    self.path = "@" + name
                except OSError:
                    self.close()
        return self.path

    def issue(self) -> str:
        """A one-time ticket for the websocket being accepted (it holds a budget place): named
        beside the path in the accept's header, sent back with the token on the door, it hands
        that place over, so one client is never counted twice (at the limit, the door would
        otherwise refuse a client its own websocket had just been admitted for)."""
        ticket = secrets.token_hex(16)
        self._tickets[ticket] = "open"
        return ticket

    def settle(self, ticket: str) -> bool:
        """The websocket of ``ticket`` ended -> True when it still owns its budget place (release
        it), False when a door connection took the place over."""
        return self._tickets.pop(ticket, "open") != "taken"

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Socket(reader, writer, FIRST_MESSAGE_BYTES)   # the token (and ticket) first: small
        try:
            sock = writer.get_extra_info("socket")
            _, uid, _ = _PEER.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
            if uid != os.geteuid():
                return
            first = await asyncio.wait_for(conn.receive(), OPEN_TIMEOUT_S)
            text = first.get("text")
            if text is None:
                return
            token, _, ticket = text.partition("\n")
            try:
                self.act.check_token(token)
                if self._tickets.get(ticket) == "open":
                    self._tickets[ticket] = "taken"         # the websocket's place is now this one's
                else:
                    self.act.budget.take(LOCAL_PATH)
            except ApiError as exc:
                exc.request_id = new_request_id()
                await conn.send_bytes(_ANSWER_HEAD.pack(0, exc.status) + exc.json_bytes())
                return
            conn.max_size = self.max_size
            try:
                await conn.send_bytes(_ANSWER_HEAD.pack(0, 200) + b"{}")
                await self.serve(conn, token)
            finally:
                self.act.budget.release()
        except (asyncio.TimeoutError, OSError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        """Stop listening (idempotent); the abstract name goes with the socket."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self.path = None
