"""The same-host door's framing, for both ends: the client's ``_local.LocalSocket`` and the
worker's door connections (``sequence_ai_server.worker.local``).

Pure standard library, like ``protocol`` (the server may import both and nothing else of the
client's core). The door itself -- how a client asks for it on the /act channel's upgrade
(``protocol.LOCAL_HEADER``) and what each end sends -- is described beside those headers in
``protocol``; this module is the byte framing under it: each message is ``LOCAL_FRAME`` (kind u8:
0 binary, 1 text; length u32 big-endian) then that many bytes.
"""
from __future__ import annotations

import math
import select
import socket
import struct
import time
from typing import Any, Optional, Tuple

__all__ = ["LOCAL_FRAME", "LOCAL_SEND_TIMEOUT_S", "FramedSocket", "MessageTooLarge"]

LOCAL_FRAME = struct.Struct(">BI")
LOCAL_SEND_TIMEOUT_S = 10.0    # a door message the other end does not take within this long: the door failed
_LOCAL_RECV_BYTES = 1 << 16


def _poll_ms(seconds: float) -> int:
    """A ``poll`` timeout (ms, rounded up so a wait never ends early) for ``seconds`` > 0, at most
    an hour a call (the caller polls again until its deadline)."""
    return min(math.ceil(seconds * 1000), 3_600_000)


class MessageTooLarge(OSError):
    """A message on the door longer than the reader's limit (the reader then closes it):
    ``kind``, ``size`` (bytes, from its head) and ``head``, its first bytes already read (up to 5:
    a request's ``seq`` and format)."""

    def __init__(self, kind: int, size: int, limit: int, head: bytes) -> None:
        super().__init__(f"a {size}-byte message (the limit is {limit})")
        self.kind, self.size, self.head = kind, size, head


class FramedSocket:
    """The door's framing (``LOCAL_FRAME``) over a blocking stream socket, for both ends: the
    client's ``_local.LocalSocket`` and the worker's door connections. Not thread-safe (``shut``
    excepted).

    The socket stays in blocking mode (no Python timeout: ``settimeout(None)`` once, here) and no
    call changes it: a send is tried at once without waiting (``MSG_DONTWAIT``; a message the
    kernel takes whole, as a door message almost always is, costs one syscall) and only the rest of
    one it does not take waits for the socket to be writable, up to ``timeout_s``; a read with a
    deadline waits with ``poll`` and then reads what is there. So a request costs no
    ``settimeout`` (an ``ioctl``) and no wait before a send, on either end."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self._buf = bytearray()
        if sock.gettimeout() is not None:
            sock.settimeout(None)
        self._poll_in = select.poll()
        self._poll_in.register(sock, select.POLLIN)
        self._poll_out: Any = None

    def send(self, message: bytes, kind: int = 0, timeout_s: float = LOCAL_SEND_TIMEOUT_S) -> None:
        """Send one message (``kind`` 0 binary, 1 text) whole, within ``timeout_s`` (s;
        ``socket.timeout`` past it: the message may be partly sent, so the connection is done)."""
        head = LOCAL_FRAME.pack(kind, len(message))
        size = len(head) + len(message)
        try:
            sent = self.sock.sendmsg((head, message), (), socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        if sent < size:
            self._send_rest(memoryview(head + message)[sent:], time.monotonic() + timeout_s)

    def _send_rest(self, rest: memoryview, deadline: float) -> None:
        """What the kernel did not take at once: sent as the socket turns writable, by ``deadline``
        (``time.monotonic()`` s; ``socket.timeout`` past it)."""
        if self._poll_out is None:
            self._poll_out = select.poll()
            self._poll_out.register(self.sock, select.POLLOUT)
        while rest:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("timed out")
            if not self._poll_out.poll(_poll_ms(remaining)):
                continue
            try:
                rest = rest[self.sock.send(rest, socket.MSG_DONTWAIT):]
            except BlockingIOError:
                pass

    def receive_message(self, deadline: Optional[float] = None, max_size: Optional[int] = None) -> Tuple[int, bytes]:
        """The next message -> ``(kind, bytes)`` (kind 0 binary, 1 text), waiting up to
        ``deadline`` (``time.monotonic()`` s; None: as long as it takes). Raises
        ``socket.timeout`` past the deadline, ConnectionResetError when the other end closed,
        MessageTooLarge for a message whose head says more than ``max_size`` bytes (none of it is
        read: the reader closes the connection)."""
        buf = self._buf
        while True:
            if len(buf) >= LOCAL_FRAME.size:
                kind, size = LOCAL_FRAME.unpack_from(buf)
                if max_size is not None and size > max_size:
                    raise MessageTooLarge(kind, size, max_size, bytes(buf[LOCAL_FRAME.size:LOCAL_FRAME.size + 5]))
                end = LOCAL_FRAME.size + size
                if len(buf) >= end:
                    message = bytes(buf[LOCAL_FRAME.size:end])
                    del buf[:end]
                    return kind, message
            if deadline is None:
                data = self.sock.recv(_LOCAL_RECV_BYTES)
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise socket.timeout("timed out")
                if not self._poll_in.poll(_poll_ms(remaining)):
                    continue
                try:
                    data = self.sock.recv(_LOCAL_RECV_BYTES, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
            if not data:
                raise ConnectionResetError("the other end closed the same-host door")
            buf += data

    def shut(self) -> None:
        """Shut the connection both ways from any thread (the other end reads its end; a thread
        of ours blocked on it wakes with an error); ``close`` still frees it."""
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Close the socket (idempotent)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
