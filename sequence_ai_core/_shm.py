"""The same-host /act path: a request's frames through a shared-memory segment, not the socket.

When the robot's client and its worker share a machine (on-device serving, a workstation beside
the robot), ``connect(body_format="shm")`` sends each /act over the /act channel as usual, but
the frames' bytes -- typically raw pixels (``sequence_ai.observation(codec="raw")``: no JPEG, a
fidelity choice, see docs/design.md "The same-host path") -- are written into a segment in
``/dev/shm`` that the worker maps, and only the body's JSON travels on the socket.

A channel message of this kind (``protocol.CHANNEL_FORMAT_SHM``): ``seq`` u32, format u8 (2),
then ``protocol.encode_shm_head``: the segment name's length u8, the name (ASCII), the blob
bytes used u32, then the binary /act body's length-prefixed JSON with no blobs after it; the
worker appends the segment's first ``used`` bytes as the blob region and serves it as a binary
/act body.

Who may name a segment: only the client that made it. Its name is ``seq-`` + 32 random hex
digits, created ``O_EXCL`` with mode 0600 (this user only), sent on the client's own
authenticated channel, and unlinked by the client as soon as the worker has answered a request
that named it: from then on no other process can open it, while the worker keeps its mapping for
that channel alone. Linux only (``/dev/shm``).
"""
from __future__ import annotations

import mmap
import os
import secrets
import weakref
from typing import Any, Optional, Sequence, Tuple

from .protocol import SHM_DIR, BinaryBody, encode_shm_head, shm_name

__all__ = ["ShmSegment", "available", "shm_message"]

_MIN_BYTES = 1 << 20                     # a segment is at least 1 MiB, grown by doubling


def available() -> bool:
    """True when this machine has ``/dev/shm`` (Linux)."""
    return os.path.isdir(SHM_DIR)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class ShmSegment:
    """The client's segment for one channel: written before each request, read by the worker.

    Not thread-safe (one channel, one request at a time). ``write(blobs)`` copies the request's
    blob bytes in, ``write_parts(frames)`` each frame's bytes in turn straight from its own
    buffer (growing the segment -- a new one, new name -- when they do not fit);
    ``answered()`` after the worker answered a request naming it unlinks the name;
    ``close()`` unmaps and unlinks (also run when the object is collected or the process exits).

    Raises OSError when ``/dev/shm`` is missing or full.
    """

    def __init__(self) -> None:
        self.name = ""
        self._map: Optional[mmap.mmap] = None
        self._finalizer: Optional[weakref.finalize] = None
        self.linked = False

    def _make(self, size: int) -> None:
        self.close()
        name = shm_name(secrets.token_hex(16))
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        except BaseException:
            _unlink(path)
            raise
        finally:
            os.close(fd)
        self.name, self.linked = name, True
        self._finalizer = weakref.finalize(self, _unlink, path)

    def write(self, blobs: memoryview) -> Tuple[str, int]:
        """Copy ``blobs`` (the binary body's blob region) to the segment's start -> (its name,
        the bytes used)."""
        return self.write_parts((blobs,))

    def write_parts(self, parts: Sequence[Any]) -> Tuple[str, int]:
        """Copy ``parts`` (bytes-like: a binary body's frames, ``protocol.BinaryBody.blobs``) one
        after another to the segment's start, each straight from its own buffer (one copy a
        frame) -> (its name, the bytes used)."""
        used = sum(len(part) for part in parts)
        if self._map is None or used > len(self._map):
            self._make(max(_MIN_BYTES, 1 << max(0, used - 1).bit_length()))
        segment, at = self._map, 0
        for part in parts:
            end = at + len(part)
            segment[at:end] = part
            at = end
        return self.name, used

    def answered(self) -> None:
        """The worker answered a request naming this segment (it maps it now, or refused it):
        unlink the name, so that no other process can open the segment from now on."""
        if self.linked and self._finalizer is not None:
            self._finalizer()
            self.linked = False

    def close(self) -> None:
        """Unmap and unlink (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        if self._map is not None:
            self._map.close()
            self._map = None
        self.linked = False


def shm_message(segment: ShmSegment, content: Any) -> bytes:
    """The part of a ``CHANNEL_FORMAT_SHM`` message after its 5-byte head, for a binary /act
    body ``content`` (``protocol.encode_act_body``: bytes, or a ``protocol.BinaryBody``, whose
    frames are written from their own bytes): its blobs written into ``segment``, then the
    segment's name, the bytes used and the body's length-prefixed JSON. Raises ValueError for a
    body that is not the binary framing."""
    if isinstance(content, BinaryBody):
        name, used = segment.write_parts(content.blobs)
        return b"".join((encode_shm_head(name, used), content.head))
    if len(content) < 4:
        raise ValueError("the same-host path carries the binary /act body")
    n = int.from_bytes(content[:4], "big")
    view = memoryview(content)
    name, used = segment.write(view[4 + n:])
    return b"".join((encode_shm_head(name, used), view[:4 + n]))
