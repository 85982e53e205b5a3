"""The client's side of the same-host door: the /act channel over the worker's Unix socket.

Both client channels ask for the door on their upgrade (``protocol.LOCAL_HEADER``) on the
shared-memory path and for any worker on a loopback address (:func:`same_host`;
``$SEQ_CLIENT_DOOR=0`` opts out); when the worker names a socket, the channel opens it and sends
its messages there (framing: ``framing`` and the worker's ``local.py``), closing the websocket:
the blocking channel (``_blocking.BlockingChannel``) with :class:`LocalSocket`, on its thread,
the asyncio channel (``_channel.ActChannel``: ``AsyncPolicy``, ``Policy.run``) with
:class:`AsyncDoor`, on its event loop, which it never blocks. The name is an abstract-namespace
socket (``@name``: nothing on disk). Before the token goes out the process behind it must be
this user's (``SO_PEERCRED``); otherwise, or on any failure to open, the channel stays on its
websocket.
"""
from __future__ import annotations

import asyncio
import collections
import ipaddress
import os
import select
import socket
import struct
import time
from typing import Any, Deque, Optional, Union
from urllib.parse import urlsplit

from .framing import LOCAL_FRAME, FramedSocket, MessageTooLarge

__all__ = ["AsyncDoor", "LocalSocket", "DoorRefused", "MessageTooLarge", "door_version", "same_host"]

_ANSWER_HEAD = struct.Struct(">IH")
_PEER = struct.Struct("3i")
_RECV_BYTES = 1 << 16


def same_host(worker_url: str) -> bool:
    """True when ``worker_url``'s host is a loopback address (``127.0.0.0/8``, ``::1``,
    ``::ffff:127.x``, ``localhost``): the worker runs on this machine, so a channel asks for its
    door, unless ``$SEQ_CLIENT_DOOR`` is ``0``."""
    if os.environ.get("SEQ_CLIENT_DOOR", "1").strip() == "0":
        return False
    host = urlsplit(worker_url).hostname or ""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)      # ::ffff:127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def door_version(value: Optional[str]) -> int:
    """The accept's ``protocol.LOCAL_VERSION_HEADER`` as a number (absent or unreadable: 1, a door
    that closes on an oversized message without answering it 413)."""
    try:
        return int(value or 1)
    except ValueError:
        return 1


def _abstract(path: str) -> str:
    """``@name`` -> the abstract socket address; PermissionError for any other name (a path)."""
    if not path.startswith("@"):
        raise PermissionError(f"{path!r} is not an abstract socket name (@...): not opened")
    return "\0" + path[1:]


def _check_peer(sock: socket.socket, path: str) -> None:
    _, uid, _ = _PEER.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
    if uid != os.geteuid():
        raise PermissionError(f"the process behind {path} is not this user's")


def _refusal(answer: bytes) -> None:
    """The door's answer to the token: DoorRefused unless it is 200."""
    if len(answer) < _ANSWER_HEAD.size:
        raise ConnectionResetError("the same-host door's answer to the token is malformed")
    _, status = _ANSWER_HEAD.unpack_from(answer)
    if status != 200:
        raise DoorRefused(status, bytes(answer[_ANSWER_HEAD.size:]))


class DoorRefused(ConnectionError):
    """The door answered the token with an error: ``status`` and ``body`` (the JSON error body)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"the worker's same-host door refused the token ({status})")
        self.status, self.body = status, body


class LocalSocket(FramedSocket):
    """One connection to a worker's door: ``framing.FramedSocket`` (``send``,
    ``receive_message``, ``close``) with the client's opening and reads. Not thread-safe.
    ``send`` / ``receive`` raise OSError (``socket.timeout`` past the deadline) and
    ConnectionError when the worker closed it."""

    @classmethod
    def open(cls, path: str, token: str, deadline: float, ticket: str = "") -> "LocalSocket":
        """Connect to ``path`` (``@name``: a socket in the abstract namespace), check it is the
        worker's (a peer process of this user), send ``token`` (and the accept's ``ticket``, which
        hands the websocket's connection place to the door) and read the door's answer. Raises
        PermissionError (not this user's, or not an ``@name``), DoorRefused, OSError."""
        address = _abstract(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(address)
            _check_peer(sock, path)
            door = cls(sock)
            door.send(f"{token}\n{ticket}".encode() if ticket else token.encode(), 1)
            _refusal(door.receive(deadline))
            return door
        except BaseException:
            sock.close()
            raise

    def receive(self, deadline: float) -> bytes:
        """The next binary message (text ones, errors with no ``seq``, are skipped)."""
        while True:
            kind, message = self.receive_message(deadline)
            if kind == 0:
                return message

    def take_pending(self) -> None:
        """Read what arrived while idle without waiting and drop its whole messages (no request
        is outstanding: late answers). Raises ConnectionResetError when the worker closed it."""
        while select.select([self.sock], [], [], 0)[0]:
            try:
                data = self.sock.recv(_RECV_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not data:
                raise ConnectionResetError("the worker closed the same-host door")
            self._buf += data
        buf = self._buf
        while len(buf) >= LOCAL_FRAME.size and len(buf) >= LOCAL_FRAME.size + LOCAL_FRAME.unpack_from(buf)[1]:
            del buf[:LOCAL_FRAME.size + LOCAL_FRAME.unpack_from(buf)[1]]



class AsyncDoor(asyncio.Protocol):
    """One connection to a worker's door on an event loop: the asyncio channel's counterpart of
    :class:`LocalSocket`, with the small surface ``_channel.ActChannel`` uses of its websocket
    (``send``, ``recv``, ``close``, ``transport`` to abort), so the channel's request, refresh
    and cancel code is the same on either. Nothing in it blocks the loop: the socket is
    non-blocking, a message is sent at once when the kernel takes it (``sendmsg``, no joined
    copy) and only what it does not take waits in the transport's buffer.

    Errors are OSError, as the channel maps a failed websocket: ``send`` raises
    ConnectionResetError when the door closed before the message went out (nothing of it was
    sent); once part of it went out a close surfaces in ``recv``, which first hands over every
    answer that came before the close -- the door answers a message over its limit 413 with the
    request's ``seq``, then closes without reading the rest, so the send fails midway and the 413
    is still the answer. An answer over ``max_size`` bytes drops the door. Made by :meth:`open`.
    """

    def __init__(self, sock: socket.socket, max_size: int) -> None:
        self.sock, self.max_size = sock, max_size
        self.transport: Any = None
        self._buf = bytearray()
        self._answers: Deque[bytes] = collections.deque()
        self._waiter: Optional[asyncio.Future] = None
        self._drained: Optional[asyncio.Future] = None
        self._paused = False
        self._lost: Optional[BaseException] = None

    @classmethod
    async def open(cls, path: str, token: str, ticket: str, max_size: int) -> "AsyncDoor":
        """Connect to ``path`` (``@name``), check it is the worker's (a peer process of this
        user), send ``token`` and the accept's ``ticket`` and read the door's answer, all on the
        running loop (bound it with a timeout: a cancelled open closes its socket). Raises
        PermissionError (not this user's, or not an ``@name``), DoorRefused, OSError."""
        loop = asyncio.get_running_loop()
        address = _abstract(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        door = cls(sock, max_size)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            _check_peer(sock, path)
            await loop.create_unix_connection(lambda: door, sock=sock)
            await door.send(f"{token}\n{ticket}" if ticket else token)
            _refusal(await door.recv())
            return door
        except BaseException:
            if door.transport is not None:
                door.transport.abort()
            sock.close()
            raise

    @property
    def closed(self) -> bool:
        """True once the door's connection is gone (its answers may still be read)."""
        return self._lost is not None

    async def send(self, message: Union[bytes, str]) -> None:
        """Send one message (``str``: a text message, else binary) whole; waits only while the
        transport's buffer is over its high-water mark. Raises ConnectionResetError when the
        door is closed already (nothing was sent)."""
        kind, data = (1, message.encode()) if isinstance(message, str) else (0, message)
        if self._lost is not None or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError(f"the same-host door is closed ({self._lost!r})")
        head = LOCAL_FRAME.pack(kind, len(data))
        sent = 0
        if self.transport.get_write_buffer_size() == 0:    # nothing queued ahead: straight to the socket
            try:
                sent = self.sock.sendmsg((head, data), (), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                raise ConnectionResetError(f"the same-host door is closed ({exc!r})") from exc
        if sent < len(head):
            self.transport.write(head[sent:])
            self.transport.write(data)
        elif sent < len(head) + len(data):
            self.transport.write(memoryview(data)[sent - len(head):])
        if self._paused and self._lost is None:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                await self._drained
            finally:
                self._drained = None

    async def recv(self, decode: bool = False) -> bytes:
        """The next binary message (text ones, errors with no ``seq``, are skipped). Raises
        ConnectionResetError once the door is closed and every answer before the close was read."""
        answers = self._answers
        while not answers:
            if self._lost is not None:
                raise ConnectionResetError(f"the same-host door closed ({self._lost!r})")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return answers.popleft()

    async def close(self) -> None:
        """Close the connection (what is queued is sent first; ``transport.abort`` does not wait)."""
        if self.transport is not None:
            self.transport.close()

    # ---- asyncio.Protocol

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        head = LOCAL_FRAME.size
        while len(buf) >= head:
            kind, size = LOCAL_FRAME.unpack_from(buf)
            if size > self.max_size:
                self._lost = MessageTooLarge(kind, size, self.max_size, bytes(buf[head:head + 5]))
                buf.clear()
                self.transport.abort()
                break
            if len(buf) < head + size:
                break
            if kind == 0:
                self._answers.append(bytes(buf[head:head + size]))
            del buf[:head + size]
        if self._answers:
            self._wake()

    def eof_received(self) -> bool:
        return False                  # the door closed its end: close ours (connection_lost follows)

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        if self._lost is None:
            self._take_rest()           # a write that failed stops the reads: the socket may hold a last answer
        if self._lost is None:
            self._lost = exc if exc is not None else ConnectionResetError("the worker closed the same-host door")
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _take_rest(self) -> None:
        """Read what the socket still holds without waiting (the transport closes it next)."""
        try:
            while self._lost is None:
                data = self.sock.recv(_RECV_BYTES, socket.MSG_DONTWAIT)
                if not data:
                    break
                self.data_received(data)
        except OSError:
            pass
