"""The client's side of the same-host door: the /act channel over the worker's Unix socket.

A blocking channel on the shared-memory path (``_blocking.BlockingChannel(shm=True)``) asks for
the door on its upgrade (``protocol.LOCAL_HEADER``); when the worker names a socket, the channel
opens it with :meth:`LocalSocket.open` and sends its messages there (framing: ``protocol`` and the
worker's ``local.py``), closing the websocket. The name is an abstract-namespace socket
(``@name``: nothing on disk). Before the token goes out the process behind it must be this user's
(``SO_PEERCRED``); otherwise, or on any failure to open, the channel stays on its websocket.
"""
from __future__ import annotations

import os
import select
import socket
import struct
import time

from .framing import LOCAL_FRAME, FramedSocket, MessageTooLarge

__all__ = ["LocalSocket", "DoorRefused", "MessageTooLarge"]

_ANSWER_HEAD = struct.Struct(">IH")
_PEER = struct.Struct("3i")
_RECV_BYTES = 1 << 16


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
        if not path.startswith("@"):
            raise PermissionError(f"{path!r} is not an abstract socket name (@...): not opened")
        address = "\0" + path[1:]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            sock.connect(address)
            _, uid, _ = _PEER.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size))
            if uid != os.geteuid():
                raise PermissionError(f"the process behind {path} is not this user's")
            door = cls(sock)
            door.send(f"{token}\n{ticket}".encode() if ticket else token.encode(), 1)
            answer = door.receive(deadline)
            _, status = _ANSWER_HEAD.unpack_from(answer)
            if status != 200:
                raise DoorRefused(status, bytes(answer[_ANSWER_HEAD.size:]))
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

