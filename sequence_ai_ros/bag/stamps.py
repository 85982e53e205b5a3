"""Sensor time in bags: header stamps read from raw CDR, each topic's time source, the command clock.

A bag's log times are the recorder's receipt times (ns), as ``ros2 bag record`` writes them. They
are not the times the data was taken: a recorder whose executor falls behind receives a 33 ms
stream in bunches (3-6 ms apart, with 320-750 ms gaps, measured on a loaded 2-core machine). So every message
that carries a ``std_msgs/Header`` first keeps its sensor time in the bag -- the ``header.stamp``
inside its CDR bytes, which the recorder stores unchanged (JPEG compression copies the header) --
and the export times frames from it. A message type without a header (``std_msgs/Float64MultiArray``
commands, ``std_msgs/String`` markers) has only its receipt time; the bag says which topic is
which in ``metadata.yaml`` ``custom_data`` (:data:`TIME_SOURCES_KEY`), and anyone can derive the
same from the message type (:func:`time_source`), which is what a bag cut before its metadata
was written relies on.

Headerless messages (``std_msgs/Float64MultiArray`` commands) carry no stamp, but DDS does: the
recorder takes each message's source timestamp (the publisher's send time, rclpy's
``MessageInfo["source_timestamp"]``) and the writer stores it as the MCAP ``publish_time`` beside the
log (receipt) time. A headerless topic whose every message had one is declared :data:`SOURCE`.
Headerless commands are timed from those source times (from receipt times when a bag has none),
*de-bunched* against the declared control period (:func:`debunch`): a command was published no
later than it was received, and no later than one period before the next one was published.

Reading a stamp costs one ``struct.unpack`` (:func:`header_stamp_ns`): a CDR message starts with
a 4-byte encapsulation header (byte 1: 1 = little-endian), then ``std_msgs/Header``'s
``builtin_interfaces/Time stamp`` as int32 ``sec`` + uint32 ``nanosec``, at offset 4 (aligned).
"""
from __future__ import annotations

import struct
from typing import Dict, List, Optional, Sequence

#: Time source of a topic whose messages start with a std_msgs/Header: ``header.stamp`` (sensor time).
HEADER = "header"
#: Time source of a headerless topic whose messages all carry a DDS source timestamp (MCAP publish_time).
SOURCE = "source"
#: Time source of a topic whose messages have no header: the recorder's receipt time (log time).
RECEIVE = "receive"
#: ``metadata.yaml`` ``custom_data`` key: JSON ``{topic: "header" | "source" | "receive"}``.
TIME_SOURCES_KEY = "sequence_ai.time_sources"
#: ``metadata.yaml`` ``custom_data`` key: JSON ``{topic: {"n", "unstamped", "lag_ms_p50",
#: "lag_ms_p99", "lag_ms_max"}}`` -- receipt time minus header stamp (ms) per stamped topic.
STAMP_LAG_KEY = "sequence_ai.stamp_lag"

_LE = struct.Struct("<iI")
_BE = struct.Struct(">iI")
_HAS_HEADER: Dict[str, bool] = {
    "sensor_msgs/msg/Image": True, "sensor_msgs/msg/CompressedImage": True,
    "sensor_msgs/msg/JointState": True, "trajectory_msgs/msg/JointTrajectory": True,
    "std_msgs/msg/Float64MultiArray": False, "std_msgs/msg/String": False,
}


def header_stamp_ns(raw) -> Optional[int]:
    """``header.stamp`` (ns since the epoch of the publisher's clock) of a CDR message whose first
    field is a ``std_msgs/Header``; ``None`` when it is zero (an unstamped message), out of range
    (``nanosec`` >= 1e9, negative ``sec``) or the bytes are too short.

    Only meaningful for header-first types (:func:`has_header`): for others it reads whatever the
    first 8 bytes after the encapsulation hold.
    """
    if len(raw) < 12:
        return None
    sec, nsec = (_LE if raw[1] & 1 else _BE).unpack_from(raw, 4)
    if sec < 0 or nsec >= 1_000_000_000 or (sec == 0 and nsec == 0):
        return None
    return sec * 1_000_000_000 + nsec


def has_header(msgtype: str, typestore=None) -> bool:
    """True when ``msgtype`` (``pkg/msg/Name``) starts with a ``std_msgs/msg/Header`` field
    (looked up in ``typestore``, by default rosbags' Jazzy store; an unknown type: False)."""
    known = _HAS_HEADER.get(msgtype)
    if known is not None:
        return known
    try:
        if typestore is None:
            from rosbags.typesys import Stores, get_typestore
            typestore = get_typestore(Stores.ROS2_JAZZY)
        fields = typestore.fielddefs[msgtype][1]
        first = fields[0][1] if fields else None
        found = bool(first) and first[1] == "std_msgs/msg/Header"
    except Exception:   # not in the store (a custom type): no stamp we can trust
        found = False
    _HAS_HEADER[msgtype] = found
    return found


def time_source(msgtype: str, typestore=None) -> str:
    """:data:`HEADER` for a header-first type, else :data:`RECEIVE`."""
    return HEADER if has_header(msgtype, typestore) else RECEIVE


class StampStats:
    """Per-topic receipt-minus-stamp lags (the recorder's stamp error), collected by the writer.

    ``add(topic, recv_ns, stamp_ns)`` for every message of a header-first topic (``stamp_ns`` None
    = unstamped); :meth:`summary` gives :data:`STAMP_LAG_KEY`'s dict. Keeps at most ``cap`` lags per
    topic (the first ones; about 55 min at 30 Hz by default).
    """

    def __init__(self, cap: int = 100_000) -> None:
        self.cap = int(cap)
        self._lags: Dict[str, List[int]] = {}
        self._n: Dict[str, int] = {}
        self._unstamped: Dict[str, int] = {}

    def add(self, topic: str, recv_ns: int, stamp_ns: Optional[int]) -> None:
        self._n[topic] = self._n.get(topic, 0) + 1
        if stamp_ns is None:
            self._unstamped[topic] = self._unstamped.get(topic, 0) + 1
            return
        lags = self._lags.setdefault(topic, [])
        if len(lags) < self.cap:
            lags.append(int(recv_ns) - int(stamp_ns))

    def summary(self) -> dict:
        out = {}
        for topic, n in self._n.items():
            lags = sorted(self._lags.get(topic, []))
            entry = {"n": n, "unstamped": self._unstamped.get(topic, 0)}
            if lags:
                entry.update(lag_ms_p50=round(_pct(lags, 50) / 1e6, 3), lag_ms_p99=round(_pct(lags, 99) / 1e6, 3),
                             lag_ms_max=round(lags[-1] / 1e6, 3))
            out[topic] = entry
        return out


def _pct(sorted_values: Sequence[int], q: float) -> float:
    k = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return float(sorted_values[k])


def debunch(recv_ns: Sequence[int], period_ns: float) -> List[int]:
    """Publish times (ns) of a periodic headerless stream estimated from its receipt times.

    Backward pass: ``t[-1] = recv[-1]``; ``t[k] = min(recv[k], t[k+1] - period)``. A message is
    published before it is received, and a publisher on a drift-free ``period_ns`` grid publishes
    message k at least one period before message k+1; a bunch received at once after an executor
    stall is spread back over the periods it was published in (its last message, taken first off
    the queue's end, was the least delayed). A real pause of the publisher (an underrun) stays a
    pause: the message after it was received late, so its predecessors keep their receipt times.
    """
    out = [int(t) for t in recv_ns]
    for k in range(len(out) - 2, -1, -1):
        out[k] = min(out[k], int(out[k + 1] - period_ns))
    return out


def source_ns(info) -> Optional[int]:
    """The DDS source timestamp (ns) in rclpy's MessageInfo (a dict), None when the middleware gave 0."""
    try:
        value = int(info["source_timestamp"])
    except (TypeError, KeyError, ValueError):
        return None
    return value if value > 0 else None

