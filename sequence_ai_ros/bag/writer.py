"""The bag writer: one rosbag2 bag per episode, written on its own thread.

Recording must never block the control loop, so callers only ever call :meth:`BagWriter.put`,
which puts raw CDR bytes on a bounded queue and returns at once; when the queue is full the
message is dropped and counted (:attr:`BagStats.dropped_queue`). A writer thread owns the
``rosbags`` writer: it runs optional per-message transforms (JPEG compression of camera frames),
writes, and closes an MCAP chunk -- flushing it to the OS -- whenever the chunk holds
``chunk_bytes`` or is ``chunk_s`` old. So a SIGKILL loses at most the chunk being filled.

A bag may not grow past ``max_bag_bytes``: beyond it messages are dropped and counted
(:attr:`BagStats.dropped_disk`). The recorder node keeps the bags it wrote under its disk bound by
deleting the oldest of them before a new one opens (:func:`prune_bags`): only bag folders
directly in its output folder (not symlinks) whose start marker carries its recorder id
(:func:`bag_recorder_id`); a bag another tool or recorder put there is never deleted.

Sensor time: for every message whose type starts with a ``std_msgs/Header`` the writer thread
reads ``header.stamp`` straight from the CDR bytes (:func:`.stamps.header_stamp_ns`, one
``struct.unpack``; the subscriptions stay raw) and keeps receipt-minus-stamp lags per topic
(:attr:`BagStats.stamps`). At close it writes into ``metadata.yaml`` ``custom_data`` each topic's
time source (``sequence_ai.time_sources``: ``header`` -- the stamp in the message is its sensor
time -- or ``receive`` -- no header, the log time is all there is) and those lags
(``sequence_ai.stamp_lag``). The messages themselves are stored unchanged, stamp included.

Source time: :meth:`BagWriter.put` takes each message's DDS source timestamp (the publisher's send
time, from rclpy's ``MessageInfo``) and stores it as the MCAP record's ``publish_time`` beside its
log time (the receipt time), as rosbag2 does with ``send_timestamp``. A headerless topic all of
whose messages carried one is declared ``source`` in ``sequence_ai.time_sources`` (the export times
it from those instead of its receipt times). Other caller facts (declared stream rates, the policy
contract, seam statistics) go into ``custom_data`` through :meth:`BagWriter.set_custom_data`.

The chunk control reaches into the ``rosbags`` MCAP storage writer (``Writer.storage``, its
``chunk``, ``close_chunk()`` and ``bio``), the one place this module depends on rosbags internals
(checked against rosbags 0.11); everything else is its public API.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .stamps import HEADER, RECEIVE, SOURCE, STAMP_LAG_KEY, TIME_SOURCES_KEY, StampStats, header_stamp_ns, time_source

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
    that raised (message skipped); ``chunks``: MCAP chunks closed. ``time_sources``: topic ->
    ``"header"`` | ``"source"`` | ``"receive"`` (see :mod:`.stamps`); ``stamps``: topic -> receipt-minus-stamp
    lag summary (``n``, ``unstamped``, ``lag_ms_p50``/``p99``/``max``, ms), filled at close.
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
    time_sources: dict = field(default_factory=dict)
    stamps: dict = field(default_factory=dict)

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
        self._stamps = StampStats()
        self._typestore = None
        self._chunk_t0 = 0.0
        self._error: Optional[BaseException] = None
        self._custom: dict = {}
        self._unsourced: set = set()   # headerless topics with a message that had no source timestamp
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
            self._custom = {}
            self._queue.put(("open", path))   # control items wait for room; they are never dropped

    def set_custom_data(self, key: str, value: str) -> None:
        """Write ``key: value`` (text) into the open bag's ``metadata.yaml`` ``custom_data`` at close
        (a later call with the same key replaces it). Ignored when no bag is open."""
        if self._open:
            self._custom[str(key)] = str(value)

    def put(self, topic: str, msgtype: str, t_ns: int, raw: bytes,
            transform: Optional[_Transform] = None, essential: bool = False,
            source_ns: Optional[int] = None) -> bool:
        """Queue one message; never blocks.

        Args:
            topic: bag topic name (absolute, e.g. ``/joint_states``).
            msgtype: ROS type name (``sensor_msgs/msg/JointState``); a transform may change it.
            t_ns: log time (ns since the epoch).
            raw: the CDR bytes (``rclpy.serialization.serialize_message`` / a raw subscription).
            transform: optional ``raw -> (msgtype, raw)`` run on the writer thread (e.g. JPEG).
            essential: never dropped for the disk bound (episode markers).
            source_ns: the DDS source timestamp (ns since the epoch; the publisher's send time), kept
                as the record's MCAP ``publish_time``; ``None``/0 = unknown (``publish_time`` = ``t_ns``).
        Returns:
            True if queued; False if no bag is open or the queue was full (counted as dropped).
        """
        if not self._open:
            return False
        try:
            self._queue.put_nowait(("msg", topic, msgtype, int(t_ns), raw, transform, essential,
                                    int(source_ns) if source_ns else None))
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
        self._stamps = StampStats()
        self._unsourced = set()
        self._chunk_t0 = time.monotonic()

    def _write(self, topic: str, msgtype: str, t_ns: int, raw: bytes, transform, essential: bool,
               source_ns: Optional[int] = None) -> None:
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
            self.stats.time_sources[topic] = time_source(msgtype, self._typestore)
        if self.stats.time_sources[topic] == HEADER:
            self._stamps.add(topic, t_ns, header_stamp_ns(raw))
        elif source_ns is None:
            self._unsourced.add(topic)
        chunk, at = storage.chunk, storage.chunk.bio.tell()
        w.write(conn, t_ns, raw)
        if source_ns is not None and storage.chunk is chunk:
            # the record's publish_time (op 1, length 8, channel 2, sequence 4, log_time 8 bytes in)
            # is rosbags' copy of log_time: the source timestamp goes there (rosbag2's send_timestamp)
            end = chunk.bio.tell()
            chunk.bio.seek(at + 23)
            chunk.bio.write(struct.pack("<Q", source_ns))
            chunk.bio.seek(end)
        elif source_ns is not None:
            self._unsourced.add(topic)   # rosbags closed the chunk inside write (a message past 1 MiB)
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
        self.stats.stamps = self._stamps.summary()
        for topic, source in self.stats.time_sources.items():
            if source == RECEIVE and topic not in self._unsourced:
                self.stats.time_sources[topic] = SOURCE   # every message carried its source timestamp
        for key, value in self._custom.items():
            w.set_custom_data(key, value)
        w.set_custom_data(TIME_SOURCES_KEY, json.dumps(self.stats.time_sources, sort_keys=True))
        w.set_custom_data(STAMP_LAG_KEY, json.dumps(self.stats.stamps, sort_keys=True))
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
    """Bytes on disk under a bag directory (0 if it does not exist); symlinks inside count 0."""
    path = Path(path)
    if not path.exists():
        return 0
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


#: How far into a bag's MCAP :func:`bag_recorder_id` looks for the start marker (bytes). The recorder
#: writes the marker first and flushes its chunk; a rewritten bag (label, repair) has it after the
#: pre-roll, one sample per sensor stream, well within this.
START_MARKER_SCAN_BYTES = 32 * 1024 * 1024
_MCAP_MAGIC = b"\x89MCAP0\r\n"


def _mcap_str(buf: bytes, at: int) -> tuple:
    (n,) = struct.unpack_from("<I", buf, at)
    return buf[at + 4:at + 4 + n].decode("utf-8", "replace"), at + 4 + n


def _start_in(records: bytes, channels: dict) -> Optional[dict]:
    """Walk MCAP records (no chunk nesting); return the first start marker found, else None."""
    from . import EPISODE_TOPIC

    at = 0
    while at + 9 <= len(records):
        op, length = struct.unpack_from("<BQ", records, at)
        body = records[at + 9:at + 9 + length]
        at += 9 + length
        if len(body) < length:
            return None
        if op == 0x04 and length >= 4:                      # Channel: id, schema id, topic, ...
            (cid,) = struct.unpack_from("<H", body, 0)
            channels[cid] = _mcap_str(body, 4)[0]
        elif op == 0x05 and length >= 22:                   # Message: channel, seq, log/publish time, data
            (cid,) = struct.unpack_from("<H", body, 0)
            if channels.get(cid) == EPISODE_TOPIC:
                data = body[22:]                            # std_msgs/String CDR: header, length, bytes + NUL
                if len(data) < 8:
                    continue
                (n,) = struct.unpack_from("<I" if data[1] else ">I", data, 4)
                try:
                    event = json.loads(data[8:8 + n].rstrip(b"\0").decode("utf-8"))
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("event") == "start":
                    return event
    return None


def bag_recorder_id(bag: Path) -> Optional[str]:
    """The ``recorder`` id in the start marker of bag directory ``bag``, or ``None``.

    Cheap: reads the bag's one ``.mcap`` from its beginning (at most
    :data:`START_MARKER_SCAN_BYTES`) up to the first ``/sequence_ai/episode`` start marker; works on
    a bag cut by SIGKILL too. ``None`` when ``bag`` is a symlink, holds no single regular (not
    symlinked) ``.mcap``, has no start marker in reach, or the marker names no recorder. Never raises
    for an unreadable bag.
    """
    bag = Path(bag)
    try:
        if bag.is_symlink() or not bag.is_dir():
            return None
        files = [f for f in bag.iterdir() if f.suffix == ".mcap"]
        if len(files) != 1 or files[0].is_symlink() or not files[0].is_file():
            return None
        st = files[0].stat()
        key = (str(files[0]), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in _ID_CACHE:
            return _ID_CACHE[key]
        found = _scan_recorder_id(files[0])
        if len(_ID_CACHE) >= 4096:
            _ID_CACHE.clear()
        _ID_CACHE[key] = found
        return found
    except Exception:   # unreadable, cut or foreign data: not a bag of ours
        return None


#: bag_recorder_id's answers by (mcap path, device, inode, size, mtime): a closed bag's start marker
#: does not change, and a rewritten or grown file has another key.
_ID_CACHE: dict = {}


def _scan_recorder_id(mcap: Path) -> Optional[str]:
    try:
        channels: dict = {}
        with open(mcap, "rb") as f:
            if f.read(8) != _MCAP_MAGIC:
                return None
            while f.tell() < START_MARKER_SCAN_BYTES:
                head = f.read(9)
                if len(head) < 9:
                    return None
                op, length = struct.unpack("<BQ", head)
                if op in (0x02, 0x0F) or length > START_MARKER_SCAN_BYTES:   # Footer / DataEnd: no more data
                    return None
                if op not in (0x04, 0x05, 0x06):
                    f.seek(length, os.SEEK_CUR)
                    continue
                body = f.read(length)
                if len(body) < length:
                    return None                              # the record was cut
                if op == 0x06:                               # Chunk: times, sizes, crc, compression, records
                    size = struct.unpack_from("<Q", body, 16)[0]
                    compression, at = _mcap_str(body, 28)
                    (n,) = struct.unpack_from("<Q", body, at)
                    records = body[at + 8:at + 8 + n]
                    if compression:
                        from rosbags.rosbag2.storage_mcap import decompress
                        records = decompress(records, compression, size, 0)
                    event = _start_in(records, channels)
                else:
                    event = _start_in(head + body, channels)
                if event is not None:
                    rec = event.get("recorder")
                    return rec if isinstance(rec, str) and rec else None
    except Exception:   # unreadable, cut or foreign data: not a bag of ours
        return None
    return None


def own_bags(folder: Path, recorder_id: str) -> list:
    """The bag directories recorder ``recorder_id`` wrote in ``folder``, oldest first.

    Only real folders directly in ``folder`` count: a symlink (to a folder in or out of
    ``folder``) never does, nor does a folder whose start marker carries another recorder's id or
    none (:func:`bag_recorder_id`). Order: folder mtime, then name.
    """
    folder = Path(folder).resolve()
    if not folder.is_dir() or not recorder_id:
        return []
    bags = []
    for p in folder.iterdir():
        if p.is_symlink() or not p.is_dir() or p.resolve().parent != folder:
            continue
        if bag_recorder_id(p) == recorder_id:
            bags.append(p)
    return sorted(bags, key=lambda p: (p.stat().st_mtime_ns, p.name))


def prune_bags(folder: Path, max_bytes: int, recorder_id: str, keep: Optional[Path] = None) -> list[Path]:
    """Delete the oldest bags recorder ``recorder_id`` wrote in ``folder`` until the rest of its
    bags fit in ``max_bytes`` (bytes).

    Only :func:`own_bags` are counted and deleted: a bag another tool or recorder put in
    ``folder``, and any symlink, are left alone (and do not count). ``keep`` is never deleted.
    Returns the deleted paths (oldest first).
    """
    bags = own_bags(folder, recorder_id)
    sizes = {p: bag_size(p) for p in bags}
    total = sum(sizes.values())
    deleted = []
    for p in bags:
        if total <= max_bytes:
            break
        if keep is not None and p.resolve() == Path(keep).resolve():
            continue
        shutil.rmtree(p, ignore_errors=True)   # rmtree never follows a link inside the bag
        total -= sizes[p]
        deleted.append(p)
    return deleted
