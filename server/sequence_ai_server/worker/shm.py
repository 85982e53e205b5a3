"""The worker's side of the same-host /act path: the segments one /act channel's client named.

A ``CHANNEL_FORMAT_SHM`` request (``sequence_ai_core._shm``) carries the binary /act body's JSON
on the socket and its blobs in a shared-memory segment of the client's (``/dev/shm/seq-<32 hex>``).
:meth:`ChannelSegments.body` rebuilds the binary body from the two: the JSON, then a copy of the
segment's first ``used`` bytes read into the same buffer (the policy gets frames the client cannot
change under it, copied once).

What a segment must be, else the request is answered 400 ``invalid_request`` with
``details.reason`` ``"shm"`` (the channel stays open): a name of the protocol's form (no path can
be named), a regular file in ``/dev/shm`` (no symlink followed, opened without waiting: a FIFO is refused, not waited on) owned by the worker's own user and
readable by nobody else (mode 0600: another user's process can neither make nor read one), at most
the worker's body limit, and holding the ``used`` bytes the request claims (read with ``pread``
from the segment's open file, never mapped: a segment the client shrank reads short and is
refused, it cannot fault the worker). A name
is bound to the channel that first named it: another channel naming it is refused while that
channel is open (the worker unlinks the name once it has opened and checked it, and the client once answered,
so no new process can open it, and a client killed mid-request leaves no file behind).
A channel holds at most :data:`MAX_SEGMENTS` segments open (the oldest is closed past that) and
closes them all when it closes. Same-user processes can always signal or trace each other, so
the owner check is the boundary; the binding keeps two sessions' frames apart.
"""
from __future__ import annotations

import os
import stat

from sequence_ai_core.protocol import SHM_DIR, FramingError, decode_shm_head

from sequence_ai_server.common.errors import ApiError

__all__ = ["ChannelSegments", "MAX_SEGMENTS"]

MAX_SEGMENTS = 4
_HINT = ('body_format="shm" needs the client and the worker on one machine, as one user; '
         'use body_format="binary" otherwise (docs/design.md: The same-host path)')
_BOUND: dict[str, int] = {}            # segment name -> id() of the channel that named it first


def _refuse(detail: str, **details: object) -> ApiError:
    return ApiError("invalid_request", detail, hint=_HINT, details={"reason": "shm", **details})


def _unlink_if_same(path: str, info: os.stat_result) -> None:
    """Unlink ``path`` when it is still the file ``info`` describes: the worker reads the segment
    through its open file from now on, and a client killed before its answer (which unlinks it
    too) leaves nothing in /dev/shm."""
    try:
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
            os.unlink(path)
    except FileNotFoundError:
        pass


class ChannelSegments:
    """The segments one channel's client named. ``limit``: the worker's body limit (bytes)."""

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.fds: dict[str, int] = {}          # segment name -> its open file (O_RDONLY)

    def body(self, message: memoryview) -> bytearray:
        """A ``CHANNEL_FORMAT_SHM`` request's part after the 5-byte channel head -> the binary
        /act body it stands for: a bytearray of the worker's own (the frames are read into it
        once, and the policy's arrays are views of it). Raises ApiError 400 (reason ``shm``) as
        the module docstring says."""
        try:
            name, used, at = decode_shm_head(message)
        except FramingError as exc:
            raise _refuse(exc.detail) from None
        if used > self.limit:
            raise _refuse(f"the request claims {used} bytes of frames, over this worker's limit of {self.limit}",
                          used=used, limit=self.limit)
        fd = self.fds.get(name)
        if fd is None:
            fd = self._open(name)
        head = len(message) - at
        body = bytearray(head + used)                   # the JSON, then the frames read straight after it
        body[:head] = message[at:]
        got = os.preadv(fd, [memoryview(body)[head:]], 0) if used else 0
        if got < used:
            raise _refuse(f"the request claims {used} bytes of frames; segment {name} holds {got}", used=used)
        return body

    def _open(self, name: str) -> int:
        owner = _BOUND.get(name)
        if owner is not None and owner != id(self):
            raise _refuse(f"segment {name} belongs to another connection")
        try:
            # O_NONBLOCK: a FIFO of that name would otherwise hold the event loop until a writer came
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise _refuse(f"segment {name} cannot be opened on the worker's machine ({exc.strerror})") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
                raise _refuse(f"segment {name} is not a private file of the worker's user")
            if not 0 < info.st_size <= 2 * self.limit + (1 << 20):
                raise _refuse(f"segment {name} is {info.st_size} bytes; at most this worker's limit of {self.limit}")
        except BaseException:
            os.close(fd)
            raise
        _unlink_if_same(os.path.join(SHM_DIR, name), info)
        if len(self.fds) >= MAX_SEGMENTS:
            self._drop(next(iter(self.fds)))
        self.fds[name] = fd
        _BOUND[name] = id(self)
        return fd

    def _drop(self, name: str) -> None:
        fd = self.fds.pop(name)
        if _BOUND.get(name) == id(self):
            del _BOUND[name]
        os.close(fd)

    def close(self) -> None:
        """Close every segment (the channel closed)."""
        for name in list(self.fds):
            self._drop(name)


