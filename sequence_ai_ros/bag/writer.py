"""The bag writer: one rosbag2 bag per episode, written on its own thread.

Recording must never block the control loop, so callers only ever call :meth:`BagWriter.put`,
which puts raw CDR bytes on a bounded queue and returns at once; when the queue is full the
message is dropped and counted (:attr:`BagStats.dropped_queue`). A writer thread owns the
``rosbags`` writer: it runs optional per-message transforms (JPEG compression of camera frames),
writes, and closes an MCAP chunk -- flushing it to the OS -- whenever the chunk holds
``chunk_bytes`` or is ``chunk_s`` old. So a SIGKILL loses at most the chunk being filled.

A bag may not grow past ``max_bag_bytes``: beyond it messages are dropped and counted
(:attr:`BagStats.dropped_disk`). The recorder node keeps the whole output folder under its disk
bound by deleting the oldest bags before a new one opens (:func:`prune_bags`).

The chunk control reaches into the ``rosbags`` MCAP storage writer (``Writer.storage``, its
``chunk``, ``close_chunk()`` and ``bio``), the one place this module depends on rosbags internals
(checked against rosbags 0.11); everything else is its public API.
"""
from __future__ import annotations

import queue
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

#: Default chunk size bound (bytes): about half a second of two 224x224 JPEG streams at 15 Hz.
DEFAULT_CHUNK_BYTES = 256 * 1024
#: Default chunk age bound (s): a slow bag still closes a chunk this often.
DEFAULT_CHUNK_S = 1.0


class BagWriterError(RuntimeError):
    """The bag cannot be opened or written (the message says which and why)."""


@dataclass
class BagStats:
    """Counters of one bag (all counts; ``bytes`` on disk).

    ``written``: messages in the bag; ``dropped_queue``: dropped because the writer queue was full;
    ``dropped_disk``: dropped because the bag reached ``max_bag_bytes``; ``failed``: transforms
    that raised (message skipped); ``chunks``: MCAP chunks closed.
    """

    path: Optional[Path] = None
    written: int = 0
    dropped_queue: int = 0
    dropped_disk: int = 0
    failed: int = 0
    chunks: int = 0
    bytes: int = 0
    started_ns: int = 0
    ended_ns: int = 0

    @property
    def dropped(self) -> int:
        """All dropped messages (queue + disk)."""
        return self.dropped_queue + self.dropped_disk


_Transform = Callable[[bytes], tuple]   # raw CDR -> (msgtype, raw CDR)


class BagWriter:
    """Writes episodes to rosbag2 bags (MCAP) from a thread of its own.

    Args:
        queue_size: messages the queue holds before :meth:`put` drops (default 256: about 4 s
            of two cameras + joints + commands at 15 Hz).
        chunk_bytes: close an MCAP chunk once it holds this many bytes (default 256 KiB).
        chunk_s: ... or once it is this old (s, default 1.0).
        max_bag_bytes: drop messages once the bag file reaches this size (bytes; ``None`` = no
            bound).

    Use: :meth:`open` (from any thread), :meth:`put` (from subscription callbacks; never blocks),
    :meth:`close` (blocks until the bag is complete); :meth:`shutdown` when done with the writer.
    """

    def __init__(self, queue_size: int = 256, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 chunk_s: float = DEFAULT_CHUNK_S, max_bag_bytes: Optional[int] = None) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        if chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be >= 1024, got {chunk_bytes}")
        if chunk_s <= 0:
            raise ValueError(f"chunk_s must be > 0 s, got {chunk_s}")
        self.chunk_bytes = int(chunk_bytes)
        self.chunk_s = float(chunk_s)
        self.max_bag_bytes = None if max_bag_bytes is None else int(max_bag_bytes)
        self._queue: queue.Queue = queue.Queue(maxsize=int(queue_size))
        self._lock = threading.Lock()
        self._open = False           # True between open() and close() (caller side)
        self.stats = BagStats()
        self._writer = None
        self._connections: dict = {}
        self._typestore = None
        self._chunk_t0 = 0.0
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="bag-writer", daemon=True)
        self._thread.start()

    # -- caller side -------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """True while a bag is open (between :meth:`open` and :meth:`close`)."""
        return self._open

    def open(self, path: Path) -> None:
        """Start a new bag in directory ``path`` (must not exist; its parent is created).

        Raises:
            BagWriterError: a bag is already open, or ``path`` exists.
        """
        path = Path(path)
        with self._lock:
            if self._open:
                raise BagWriterError(f"a bag is already open ({self.stats.path}); close it first")
            if path.exists():
                raise BagWriterError(f"{path} exists: a bag directory must be new")
            path.parent.mkdir(parents=True, exist_ok=True)
            self._open = True
            self.stats = BagStats(path=path, started_ns=time.time_ns())
            self._queue.put(("open", path))   # control items wait for room; they are never dropped

    def put(self, topic: str, msgtype: str, t_ns: int, raw: bytes,
            transform: Optional[_Transform] = None, essential: bool = False) -> bool:
        """Queue one message; never blocks.

        Args:
            topic: bag topic name (absolute, e.g. ``/joint_states``).
            msgtype: ROS type name (``sensor_msgs/msg/JointState``); a transform may change it.
            t_ns: log time (ns since the epoch).
            raw: the CDR bytes (``rclpy.serialization.serialize_message`` / a raw subscription).
            transform: optional ``raw -> (msgtype, raw)`` run on the writer thread (e.g. JPEG).
            essential: never dropped for the disk bound (episode markers).
        Returns:
            True if queued; False if no bag is open or the queue was full (counted as dropped).
        """
        if not self._open:
            return False
        try:
            self._queue.put_nowait(("msg", topic, msgtype, int(t_ns), raw, transform, essential))
            return True
        except queue.Full:
            self.stats.dropped_queue += 1
            return False

    def flush(self) -> None:
        """Ask the writer thread to close and flush the current chunk now (e.g. after the start
        marker, so even a bag killed in its first second keeps it). Never blocks."""
        if self._open:
            try:
                self._queue.put_nowait(("flush",))
            except queue.Full:
                pass

    def close(self, timeout_s: float = 30.0) -> BagStats:
        """Finish the open bag (drains the queue first) and return its :class:`BagStats`.

        Raises:
            BagWriterError: no bag is open, the writer failed, or it did not finish in ``timeout_s``.
        """
        with self._lock:
            if not self._open:
                raise BagWriterError("no bag is open")
            self._open = False
            done = threading.Event()
            self._queue.put(("close", done))
        if not done.wait(timeout_s):
            raise BagWriterError(f"the bag writer did not finish {self.stats.path} within {timeout_s} s")
        if self._error is not None:
            err, self._error = self._error, None
            raise BagWriterError(f"writing {self.stats.path} failed: {err}") from err
        return self.stats

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Close any open bag and stop the writer thread."""
        if self._open:
            try:
                self.close(timeout_s)
            except BagWriterError:
                pass
        self._queue.put(("stop",))
        self._thread.join(timeout_s)

    # -- writer thread -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            kind = item[0]
            try:
                if kind == "stop":
                    return
                if kind == "open":
                    self._start(item[1])
                elif kind == "msg":
                    self._write(*item[1:])
                elif kind == "flush":
                    if self._writer is not None:
                        self._flush_chunk()
                elif kind == "close":
                    try:
                        self._finish()
                    finally:
                        item[1].set()
            except Exception as exc:  # keep the thread alive; report on close()
                self._error = exc
                self._abort()

    def _start(self, path: Path) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer
        from rosbags.typesys import Stores, get_typestore

        if self._typestore is None:
            self._typestore = get_typestore(Stores.ROS2_JAZZY)
        self._error = None
        self._writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        self._connections = {}
        self._chunk_t0 = time.monotonic()

    def _write(self, topic: str, msgtype: str, t_ns: int, raw: bytes, transform, essential: bool) -> None:
        w = self._writer
        if w is None:
            return
        storage = w.storage
        if not essential and self.max_bag_bytes is not None and storage.bio.tell() + storage.chunk.bio.tell() >= self.max_bag_bytes:
            self.stats.dropped_disk += 1
            return
        if transform is not None:
            try:
                msgtype, raw = transform(raw)
            except Exception:
                self.stats.failed += 1
                return
        conn = self._connections.get(topic)
        if conn is None:
            conn = w.add_connection(topic, msgtype, typestore=self._typestore)
            self._connections[topic] = conn
        w.write(conn, t_ns, raw)
        self.stats.written += 1
        if storage.chunk.bio.tell() >= self.chunk_bytes or time.monotonic() - self._chunk_t0 >= self.chunk_s:
            self._flush_chunk()

    def _flush_chunk(self) -> None:
        storage = self._writer.storage
        if storage.chunk.bio.tell():
            storage.close_chunk()
            self.stats.chunks += 1
        storage.bio.flush()   # to the OS: a killed process loses nothing already closed
        self._chunk_t0 = time.monotonic()

    def _finish(self) -> None:
        w, self._writer = self._writer, None
        if w is None:
            return
        if w.storage.chunk.bio.tell():
            self.stats.chunks += 1
        w.close()
        self.stats.ended_ns = time.time_ns()
        self.stats.bytes = bag_size(self.stats.path)

    def _abort(self) -> None:
        w, self._writer = self._writer, None
        if w is not None:
            try:
                w.close()
            except Exception:
                pass


def bag_size(path: Path) -> int:
    """Bytes on disk under a bag directory (0 if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prune_bags(folder: Path, max_bytes: int, keep: Optional[Path] = None) -> list[Path]:
    """Delete the oldest bag directories in ``folder`` until all of them fit in ``max_bytes``.

    A bag directory is a subfolder holding a ``.mcap`` file; ``keep`` is never deleted.
    Returns the deleted paths (oldest first).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    bags = sorted((p for p in folder.iterdir() if p.is_dir() and any(p.glob("*.mcap"))),
                  key=lambda p: p.stat().st_mtime)
    sizes = {p: bag_size(p) for p in bags}
    total = sum(sizes.values())
    deleted = []
    for p in bags:
        if total <= max_bytes:
            break
        if keep is not None and p.resolve() == Path(keep).resolve():
            continue
        shutil.rmtree(p, ignore_errors=True)
        total -= sizes[p]
        deleted.append(p)
    return deleted
