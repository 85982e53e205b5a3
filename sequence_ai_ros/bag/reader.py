"""Reading episode bags back, including bags cut short by a crash or SIGKILL.

A complete bag (``metadata.yaml`` present, MCAP footer intact) is read with ``rosbags``'
:class:`~rosbags.rosbag2.Reader`. A cut bag has neither: :func:`recover_mcap` walks the MCAP's
top-level records, keeps every complete one (so every closed chunk), and appends an MCAP
``DataEnd`` + ``Footer`` so that ``rosbags``' MCAP reader can scan it; at most the chunk being
filled when the process died is lost. :func:`repair_bag` (``sequence-ai bag repair``) makes that
permanent: it rewrites the bag with a fresh ``metadata.yaml``.

Times: every message keeps its log time (the recorder's receipt time); a header-first message's
sensor time is the ``header.stamp`` inside it, and every message recorded with a DDS source
timestamp has it as its MCAP ``publish_time`` (:func:`publish_times`; rosbags' reader drops it). :func:`time_sources` says which topic has which
(``metadata.yaml``'s ``custom_data``, else derived from the message types: see :mod:`.stamps`), and
:attr:`RecordedEpisode.time_sources` carries it to the export.

Messages are deserialized with ``rclpy.serialization`` (``rosbags``' own CDR reader rejects some
messages rclpy writes, e.g. a JointState with empty arrays), so reading needs the ROS
environment (``. scripts/env.sh``).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

from . import COMPRESSED_SUFFIX, EPISODE_TOPIC, INSTRUCTION_TOPIC

_MAGIC = b"\x89MCAP0\r\n"
_OP_HEADER, _OP_FOOTER, _OP_DATA_END = 0x01, 0x02, 0x0F


class BagReadError(RuntimeError):
    """A bag cannot be read (not a bag, no MCAP file, nothing recoverable)."""


@dataclass
class RecoveryReport:
    """What :func:`recover_mcap` kept: ``kept_bytes`` of ``total_bytes`` (the rest was a partial
    record), and whether the file was complete already."""

    path: Path
    total_bytes: int
    kept_bytes: int
    complete: bool


def _mcap_file(bag: Path) -> Path:
    bag = Path(bag)
    if bag.is_file() and bag.suffix == ".mcap":
        return bag
    files = sorted(bag.glob("*.mcap"))
    if not files:
        raise BagReadError(f"{bag} holds no .mcap file: pass a rosbag2 bag directory written by the recorder")
    if len(files) > 1:
        raise BagReadError(f"{bag} holds {len(files)} .mcap files; the recorder writes one per bag")
    return files[0]


def _complete(mcap: Path) -> bool:
    size = mcap.stat().st_size
    if size < 8 + 37:
        return False
    with open(mcap, "rb") as f:
        f.seek(-8, os.SEEK_END)
        return f.read(8) == _MAGIC


def recover_mcap(src: Path, dst: Path) -> RecoveryReport:
    """Copy the complete top-level records of MCAP file ``src`` to ``dst`` and close it properly.

    Raises:
        BagReadError: ``src`` is not an MCAP file or holds no complete record after its header.
    """
    total = src.stat().st_size
    with open(src, "rb") as f, open(dst, "wb") as out:
        if f.read(8) != _MAGIC:
            raise BagReadError(f"{src} is not an MCAP file (bad magic)")
        out.write(_MAGIC)
        kept = 8
        while True:
            head = f.read(9)
            if len(head) < 9:
                break
            op, length = struct.unpack("<BQ", head)
            if op in (_OP_DATA_END, _OP_FOOTER) or kept + 9 + length > total:
                break   # the summary section starts, or the record was cut
            body = f.read(length)
            if len(body) < length:
                break
            out.write(head)
            out.write(body)
            kept += 9 + length
        if kept <= 8:
            raise BagReadError(f"{src}: nothing recoverable (not even the MCAP header)")
        out.write(struct.pack("<BQI", _OP_DATA_END, 4, 0))                     # DataEnd, crc 0
        out.write(struct.pack("<BQQQI", _OP_FOOTER, 20, 0, 0, 0))             # Footer, no summary
        out.write(_MAGIC)
    return RecoveryReport(path=src, total_bytes=total, kept_bytes=kept, complete=_complete(src))


@dataclass
class RawMessage:
    """One message as stored: ``topic``, ``msgtype`` (``pkg/msg/Name``), log time ``t_ns``, CDR ``raw``."""

    topic: str
    msgtype: str
    t_ns: int
    raw: bytes


def iter_raw(bag: Path) -> Iterator[RawMessage]:
    """Yield every message of a bag in log-time order, recovering a cut bag on the fly.

    Raises:
        BagReadError: not a bag, or nothing recoverable.
    """
    bag = Path(bag)
    mcap = _mcap_file(bag)
    if (mcap.parent / "metadata.yaml").exists() and _complete(mcap):
        from rosbags.rosbag2 import Reader

        with Reader(mcap.parent) as reader:
            for conn, t_ns, raw in reader.messages():
                yield RawMessage(conn.topic, conn.msgtype, t_ns, bytes(raw))
        return
    from rosbags.rosbag2.storage_mcap import McapReader

    with tempfile.TemporaryDirectory(prefix="seqai-recover-") as tmp:
        fixed = Path(tmp) / mcap.name
        recover_mcap(mcap, fixed)
        reader = McapReader(fixed)
        reader.open()
        try:
            msgs = sorted(
                ((t_ns, i, conn, bytes(raw)) for i, (conn, t_ns, raw)
                 in enumerate(reader.messages_scan(reader.connections))),
                key=lambda m: (m[0], m[1]),
            )
        finally:
            reader.close()
    for t_ns, _, conn, raw in msgs:
        yield RawMessage(conn.topic, conn.msgtype, t_ns, raw)


def _records(buf: bytes, at: int = 0) -> Iterator[tuple]:
    """``(op, body)`` of the complete MCAP records in ``buf`` from ``at``."""
    while at + 9 <= len(buf):
        op, length = struct.unpack_from("<BQ", buf, at)
        if at + 9 + length > len(buf):
            return
        yield op, buf[at + 9:at + 9 + length]
        at += 9 + length


def publish_times(bag: Path, topics: Optional[set] = None) -> dict:
    """``{(topic, log time ns): publish time ns}`` of a bag's messages (``topics``: only those),
    read from the MCAP records themselves (chunks decompressed), so a cut bag's complete records
    count too. A message recorded without a source timestamp has ``publish_time`` == log time.

    Raises:
        BagReadError: not a bag (see :func:`iter_raw`).
    """
    from rosbags.rosbag2.storage_mcap import decompress

    data = _mcap_file(Path(bag)).read_bytes()
    if data[:8] != _MAGIC:
        raise BagReadError(f"{bag} is not an MCAP file (bad magic)")
    channels: dict = {}
    out: dict = {}

    def walk(buf: bytes) -> None:
        for op, body in _records(buf):
            if op == 0x04 and len(body) >= 4:                   # Channel: id, schema id, topic
                (cid,) = struct.unpack_from("<H", body, 0)
                (n,) = struct.unpack_from("<I", body, 4)
                channels[cid] = body[8:8 + n].decode("utf-8", "replace")
            elif op == 0x05 and len(body) >= 22:                # Message: channel, sequence, log, publish
                cid, _, log_ns, pub_ns = struct.unpack_from("<HIQQ", body, 0)
                topic = channels.get(cid)
                if topic is not None and (topics is None or topic in topics):
                    out[(topic, log_ns)] = pub_ns
            elif op == 0x06 and len(body) >= 32:                # Chunk: times, size, crc, compression, records
                size = struct.unpack_from("<Q", body, 16)[0]
                (n,) = struct.unpack_from("<I", body, 28)
                compression = body[32:32 + n].decode()
                (m,) = struct.unpack_from("<Q", body, 32 + n)
                records = body[40 + n:40 + n + m]
                walk(decompress(records, compression, size, 0) if compression else records)
            elif op in (_OP_DATA_END, _OP_FOOTER):
                return

    walk(data[8:])
    return out


def custom_data(bag: Path) -> dict:
    """``metadata.yaml``'s ``custom_data`` of bag directory ``bag`` ({} without metadata or custom data)."""
    meta = Path(bag) / "metadata.yaml"
    if not meta.is_file():
        return {}
    try:
        from ruamel.yaml import YAML

        info = (YAML(typ="safe").load(meta.read_text()) or {}).get("rosbag2_bagfile_information") or {}
        return {str(k): str(v) for k, v in (info.get("custom_data") or {}).items()}
    except Exception:   # unreadable metadata: the reader falls back to the MCAP alone
        return {}


def time_sources(bag: Path, msgtypes: Optional[dict] = None) -> dict:
    """``{topic: "header" | "receive"}`` of a bag: what its ``metadata.yaml`` declares
    (:data:`.stamps.TIME_SOURCES_KEY`), completed from ``msgtypes`` (topic -> type; a cut bag has no
    metadata) with :func:`.stamps.time_source`."""
    from .stamps import TIME_SOURCES_KEY, time_source

    declared = {}
    raw = custom_data(bag).get(TIME_SOURCES_KEY)
    if raw:
        try:
            declared = {str(k): str(v) for k, v in json.loads(raw).items()}
        except (ValueError, AttributeError):
            declared = {}
    for topic, msgtype in (msgtypes or {}).items():
        declared.setdefault(topic, time_source(msgtype))
    return declared


def _rewrite(bag: Path, extra: Sequence["RawMessage"] = ()) -> tuple:
    """Rewrite bag directory ``bag`` in place as a complete bag holding every recoverable message
    plus ``extra``; returns ``(messages written, RecoveryReport)``.

    The new bag is built beside the original (a hidden sibling folder) and swapped in at the end,
    so a failure leaves the original untouched.
    """
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.rosbag2.storage_mcap import McapReader
    from rosbags.typesys import Stores, get_typestore

    from .stamps import TIME_SOURCES_KEY

    bag = Path(bag).resolve()
    mcap = _mcap_file(bag)
    kept_custom = custom_data(bag)
    tmp = Path(tempfile.mkdtemp(prefix=f".{bag.name}.rewrite-", dir=bag.parent))
    try:
        fixed = tmp / "recovered.mcap"
        report = recover_mcap(mcap, fixed)
        reader = McapReader(fixed)
        reader.open()
        out = tmp / bag.name
        n = 0
        try:
            with Writer(out, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
                store = get_typestore(Stores.ROS2_JAZZY)
                conns: dict = {}
                by_topic: dict = {}
                for c in reader.connections:
                    if c.digest:
                        conns[c.id] = writer.add_connection(c.topic, c.msgtype, msgdef=c.msgdef.data, rihs01=c.digest)
                    else:   # MCAP channels carry no hash: take it from the Jazzy type store
                        conns[c.id] = writer.add_connection(c.topic, c.msgtype, typestore=store)
                    by_topic[c.topic] = conns[c.id]
                msgs = [(t, i, conns[c.id], bytes(r)) for i, (c, t, r) in enumerate(reader.messages_scan(reader.connections))]
                for j, m in enumerate(extra):
                    conn = by_topic.get(m.topic)
                    if conn is None:
                        conn = by_topic[m.topic] = writer.add_connection(m.topic, m.msgtype, typestore=store)
                    msgs.append((m.t_ns, len(msgs) + j, conn, m.raw))
                msgs.sort(key=lambda m: (m[0], m[1]))
                for t, _, conn, raw in msgs:
                    writer.write(conn, t, raw)
                    n += 1
                # the bag keeps saying which topic is timed how (a repaired bag says it for the first time)
                for key, value in kept_custom.items():
                    writer.set_custom_data(key, value)
                sources = time_sources(bag, {c.topic: c.msgtype for c in writer.connections})
                writer.set_custom_data(TIME_SOURCES_KEY, json.dumps(sources, sort_keys=True))
        finally:
            reader.close()
        # swap: the original directory's files are replaced by the rewritten ones
        backup = tmp / "original"
        os.rename(bag, backup)
        os.rename(out, bag)
        return n, report
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def repair_bag(bag: Path) -> dict:
    """Rewrite a cut bag in place as a complete one (MCAP footer, index, ``metadata.yaml``).

    A complete bag is left as is. The repaired bag is built beside the original and swapped in
    at the end, so a failure leaves the original untouched.

    Returns:
        ``{"bag", "repaired" (bool), "messages", "kept_bytes", "total_bytes"}``.
    Raises:
        BagReadError: not a bag, or nothing recoverable.
    """
    bag = Path(bag).resolve()
    mcap = _mcap_file(bag)
    if (bag / "metadata.yaml").exists() and _complete(mcap):
        return {"bag": str(bag), "repaired": False, "messages": None,
                "kept_bytes": mcap.stat().st_size, "total_bytes": mcap.stat().st_size}
    n, report = _rewrite(bag)
    return {"bag": str(bag), "repaired": True, "messages": n,
            "kept_bytes": report.kept_bytes, "total_bytes": report.total_bytes}


def label_event(success: Optional[bool], notes: str = "", t_ns: Optional[int] = None) -> str:
    """JSON text of a label marker: ``{"event": "label", "success": true|false|null, "notes", "t_ns"}``.

    Written on the episode topic; the newest label marker of a bag is the episode's label
    (:attr:`RecordedEpisode.success`), whatever the end marker says.
    """
    return json.dumps({"event": "label", "success": None if success is None else bool(success),
                       "notes": str(notes), "t_ns": int(time.time_ns() if t_ns is None else t_ns)})


def label_bag(bag: Path, success: Optional[bool], notes: str = "") -> dict:
    """Label a closed (or cut) episode bag after the fact: add a label marker, rewriting the bag.

    The marker's log time is now (after the end marker), so it is the bag's newest label. A cut
    bag comes out repaired (complete, with ``metadata.yaml``). The rewrite is built beside the
    bag and swapped in, so a failure leaves the bag as it was.

    Args:
        bag: a bag directory written by ``episode_recorder``.
        success: the label (``True``/``False``; ``None`` clears it to unlabeled).
        notes: free text kept in the marker.
    Returns:
        ``{"bag", "success", "notes", "messages"}``.
    Raises:
        BagReadError: not a bag written by the recorder (no start marker), nothing recoverable,
            or damaged bytes that cannot be decoded.
    """
    from rclpy.serialization import serialize_message
    from std_msgs.msg import String

    bag = Path(bag).resolve()
    if not bag.is_dir():
        raise BagReadError(f"{bag} is not a bag directory")
    raw = serialize_message(String(data=label_event(success, notes)))
    try:
        read_episode(bag)   # refuses what is not an episode bag before touching it
        n, _ = _rewrite(bag, [RawMessage(EPISODE_TOPIC, "std_msgs/msg/String", time.time_ns(), raw)])
    except BagReadError:
        raise
    except Exception as exc:   # damaged bytes surface as UnicodeDecodeError, rosbags ReaderError, ...
        raise BagReadError(f"{bag} is damaged and cannot be labeled ({type(exc).__name__}: {exc}); "
                           "the bag was left as it was") from exc
    return {"bag": str(bag), "success": success, "notes": notes, "messages": n}


# -- episodes ------------------------------------------------------------------------------------
@dataclass
class RecordedEpisode:
    """One bag's content, deserialized (rclpy message objects), grouped by stream.

    ``start``/``end``: the JSON episode markers (``end`` is ``None`` for a cut bag);
    ``labels``: the label markers (JSON, log-time order; see :func:`label_event`);
    ``images``: view -> [(t_ns, sensor_msgs/CompressedImage)]; ``joints``: [(t_ns, JointState)];
    ``commands``: [(t_ns, [float])]; ``instructions``: [(t_ns, str)]. Times are log times (ns): the
    recorder's receipt times. ``command_stamps``: per command, its ``header.stamp`` (ns) when the
    command type has a header and it is non-zero, else ``None``; sensor messages carry theirs in
    ``msg.header``. ``command_sources``: per command, its DDS source timestamp (ns, the publisher's
    send time; ``None`` when recorded without one). ``time_sources``: topic -> ``"header"`` |
    ``"source"`` | ``"receive"`` (:func:`time_sources`; a cut bag's headerless commands whose every
    record has a publish time apart from its log time count as ``"source"``).
    Sensor messages logged before the start marker are the recorder's pre-roll (the latest
    sample of each stream when the episode started) and belong to the episode.
    """

    path: Path
    start: dict
    end: Optional[dict]
    images: dict = field(default_factory=dict)
    joints: list = field(default_factory=list)
    commands: list = field(default_factory=list)
    instructions: list = field(default_factory=list)
    labels: list = field(default_factory=list)
    command_stamps: list = field(default_factory=list)
    command_sources: list = field(default_factory=list)
    time_sources: dict = field(default_factory=dict)

    @property
    def task(self) -> str:
        """The instruction in force at the start (the dataset's task string)."""
        if self.instructions:
            return self.instructions[0][1]
        return str(self.start.get("task", ""))

    @property
    def label(self) -> dict:
        """The episode's label ``{"success": bool|None, "notes": str}``: the newest label marker,
        else the end marker's label, else unlabeled (a cut bag with no label marker)."""
        if self.labels:
            newest = self.labels[-1]
            return {"success": newest.get("success"), "notes": str(newest.get("notes") or "")}
        label = (self.end or {}).get("label") or {}
        return {"success": label.get("success"), "notes": str(label.get("notes") or "")}

    @property
    def success(self) -> Optional[bool]:
        """The episode's success label (``None`` when unlabeled); see :attr:`label`."""
        value = self.label["success"]
        return None if value is None else bool(value)


def read_episode(bag: Path) -> RecordedEpisode:
    """Read one episode bag written by the recorder (a cut bag is recovered, see :func:`iter_raw`).

    Raises:
        BagReadError: not a bag, or no episode start marker.
    """
    from rclpy.serialization import deserialize_message

    from ..codecs import message_class as get_message
    from .events import command_values
    from .stamps import has_header, header_stamp_ns

    classes: dict = {}
    msgtypes: dict = {}
    start = end = None
    rec = RecordedEpisode(path=Path(bag), start={}, end=None)
    image_topics: dict = {}
    pending: list = []   # messages logged before the start marker (the pre-roll), sorted once it is seen

    def place(t_ns: int, topic: str, msg, raw: bytes, msgtype: str) -> None:
        if topic == INSTRUCTION_TOPIC:
            rec.instructions.append((t_ns, str(msg.data)))
        elif topic in image_topics:
            rec.images[image_topics[topic]].append((t_ns, msg))
        elif topic == _abs(start.get("joint_state_topic", "joint_states")):
            rec.joints.append((t_ns, msg))
        elif topic == _abs(start.get("command_topic", "joint_commands")):
            rec.commands.append((t_ns, command_values(msg)))   # Float64MultiArray or JointTrajectory
            rec.command_stamps.append(header_stamp_ns(raw) if has_header(msgtype) else None)

    for m in iter_raw(bag):
        cls = classes.get(m.msgtype)
        if cls is None:
            cls = classes[m.msgtype] = get_message(m.msgtype)
        msg = deserialize_message(m.raw, cls)
        msgtypes.setdefault(m.topic, m.msgtype)
        if m.topic == EPISODE_TOPIC:
            event = json.loads(msg.data)
            kind = event.get("event")
            if kind == "start" and start is None:
                start = event
                topics = event.get("image_topics") or {
                    v: _abs(t) + COMPRESSED_SUFFIX for v, t in zip(event.get("views", []), event.get("camera_topics", []))}
                for view, topic in topics.items():
                    image_topics[topic] = view
                    rec.images[view] = []
                for early in pending:
                    place(*early)
                pending = []
            elif kind == "end":
                end = event
            elif kind == "label":
                rec.labels.append(event)
        elif start is None:
            pending.append((m.t_ns, m.topic, msg, m.raw, m.msgtype))
        else:
            place(m.t_ns, m.topic, msg, m.raw, m.msgtype)
    if start is None:
        raise BagReadError(f"{bag}: no episode start marker on {EPISODE_TOPIC}; was it written by recorder_node?")
    rec.start, rec.end = start, end
    rec.time_sources = time_sources(bag, msgtypes)
    _command_sources(rec, _abs(start.get("command_topic", "joint_commands")))
    return rec


def _command_sources(rec: RecordedEpisode, topic: str) -> None:
    """Fill ``rec.command_sources`` from the MCAP publish times of the command topic."""
    from .stamps import RECEIVE, SOURCE

    pubs = publish_times(rec.path, {topic}) if rec.commands else {}
    rec.command_sources = [pubs.get((topic, t)) for t, _ in rec.commands]
    if any(p is None or p == t for p, (t, _) in zip(rec.command_sources, rec.commands)):
        if rec.time_sources.get(topic) == SOURCE:   # declared, but some record lacks it: none trusted
            rec.time_sources[topic] = RECEIVE
        rec.command_sources = [None] * len(rec.commands)
    elif rec.commands and rec.time_sources.get(topic) == RECEIVE:
        rec.time_sources[topic] = SOURCE            # a cut bag (no metadata): the records say it


def _abs(topic: str) -> str:
    return topic if topic.startswith("/") else "/" + topic
