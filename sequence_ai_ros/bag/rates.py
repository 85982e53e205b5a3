"""Stream rates a recording declares: what each stream's rate is, and who said so.

Every bag the recorder writes declares a rate for each stream it records (the camera views, the
joint states, the commands) in its start marker: ``stream_rates_hz`` (``{topic: Hz}``) and
``stream_rate_sources`` (``{topic: origin}``), so the export (``sequence_ai_ros.bag.frames``)
always has a rate to check a stream's times against. Origins, first found wins:

* ``contract``: the driver's start marker (an ``Act`` episode): the policy contract's
  ``control_frequency_hz`` the driver publishes commands at;
* ``goal``: a ``RecordEpisode`` goal's ``control_frequency_hz`` (the commands);
* ``parameter``: the recorder's ``control_frequency_hz`` / ``camera_rates_hz`` /
  ``joint_state_rate_hz`` parameters;
* ``declared``: a start marker's own ``stream_rates_hz`` entry that names no origin;
* ``measured``: none of those, and the stream is flowing (a message within :data:`PAUSE_S`) --
  the recorder's median over the stream's last
  :data:`RECENT_PERIODS` periods before the episode since its last pause (a gap over :data:`PAUSE_S`;
  a stall just before the episode does not count as one), by their sensor times (header stamp, else DDS source timestamp, else receipt). A stream with too few messages then has no start-marker rate;
  the end marker's ``measured_rates_hz`` (the same median over the episode) covers it.

The export refuses (``StreamRateError``) a stream whose publisher-side times (header stamps, source
timestamps) disagree with a declared rate, and warns, naming it, when the rate was only measured.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Dict, Optional

import numpy as np

#: Messages per stream the pre-episode rate is measured over (about 2 s at 30 Hz).
WINDOW = 64
#: Fewest messages a measured rate needs (5 periods).
MIN_MESSAGES = 6
#: A gap this long (s) in a stream is a pause: its rate is measured from the messages after it.
PAUSE_S = 0.5
#: The pre-episode rate is the median of the stream's last this many periods (a rate that changed
#: just before the episode is measured as the new one once that many periods are in).
RECENT_PERIODS = 10
#: ``metadata.yaml`` ``custom_data`` key: JSON ``{topic: {"hz", "origin", "measured_hz"}}``.
STREAM_RATES_KEY = "sequence_ai.stream_rates"


def _median_hz(times) -> Optional[float]:
    if len(times) < MIN_MESSAGES:
        return None
    d = np.diff(np.sort(np.asarray(times, dtype=np.int64)))
    d = d[d > 0]
    return round(float(1e9 / np.median(d)), 4) if len(d) else None


class RateMeter:
    """Sensor times (ns) per stream -> rates (Hz): the last :data:`WINDOW` always, and every time of
    the open episode (at most ``cap`` per stream) between :meth:`begin` and :meth:`episode_hz`.
    Thread-safe (the recorder's callbacks and its episode thread)."""

    def __init__(self, cap: int = 200_000) -> None:
        self.cap = int(cap)
        self._recent: Dict[str, deque] = {}
        self._episode: Optional[Dict[str, list]] = None
        self._lock = threading.Lock()

    def add(self, topic: str, t_ns: int) -> None:
        """One message of ``topic`` at sensor time ``t_ns`` (ns)."""
        with self._lock:
            self._recent.setdefault(topic, deque(maxlen=WINDOW)).append(int(t_ns))
            if self._episode is not None:
                times = self._episode.setdefault(topic, [])
                if len(times) < self.cap:
                    times.append(int(t_ns))

    def recent_hz(self, topic: str, now_ns: Optional[int] = None) -> Optional[float]:
        """Median rate (Hz) over the stream's last :data:`RECENT_PERIODS` periods after its last pause
        (:data:`PAUSE_S`; across it when fewer than :data:`MIN_MESSAGES` follow it); None
        below :data:`MIN_MESSAGES`, or when its last message is over :data:`PAUSE_S` before
        ``now_ns`` (ns, the sensor clock: the stream is not flowing now)."""
        with self._lock:
            times = sorted(self._recent.get(topic, ()))
        if now_ns is not None and (not times or now_ns - times[-1] > PAUSE_S * 1e9):
            return None
        for k in range(len(times) - 1, 0, -1):
            if times[k] - times[k - 1] > PAUSE_S * 1e9:
                if len(times) - k >= MIN_MESSAGES:   # else a stall just now: the whole window says more
                    times = times[k:]
                break
        return _median_hz(times[-(RECENT_PERIODS + 1):])

    def begin(self) -> None:
        """Start collecting an episode's times."""
        with self._lock:
            self._episode = {}

    def episode_hz(self) -> dict:
        """``{topic: Hz}`` measured over the episode since :meth:`begin` (streams with enough
        messages); stops collecting."""
        with self._lock:
            episode, self._episode = self._episode or {}, None
        return {t: hz for t, hz in ((t, _median_hz(v)) for t, v in episode.items()) if hz is not None}


def configured_rates(p: dict, views: list, image_topics: dict, joint_topic: str, command_topic: str) -> dict:
    """``{bag topic: (Hz, "parameter")}`` from ``camera_rates_hz`` / ``joint_state_rate_hz`` /
    ``control_frequency_hz`` (0 = not configured). Raises ValueError for a bad list or a rate < 0."""
    cams = [float(x) for x in (p["camera_rates_hz"] or [0.0])]
    if len(cams) == 1 and len(views) != 1:
        cams = cams * len(views)
    if len(cams) != len(views):
        raise ValueError(f"camera_rates_hz has {len(cams)} entries for {len(views)} camera_views: give one per view or [0.0]")
    rates = {image_topics[v]: hz for v, hz in zip(views, cams)}
    rates.update({joint_topic: float(p["joint_state_rate_hz"]), command_topic: float(p["control_frequency_hz"])})
    bad = {t: hz for t, hz in rates.items() if not (hz >= 0.0) or hz == float("inf")}
    if bad:
        raise ValueError(f"stream rates must be finite and >= 0 Hz (0 = measured): {bad}")
    return {t: (hz, "parameter") for t, hz in rates.items() if hz > 0}



def declare_rates(start: dict, topics: list, configured: dict, meter: RateMeter, command_topic: str) -> dict:
    """``start`` with ``stream_rates_hz`` and ``stream_rate_sources`` filled for every topic of
    ``topics`` (see the module docstring for the order).

    Args:
        start: the start marker (its own ``stream_rates_hz`` / ``stream_rate_sources`` /
            ``control_frequency_hz`` are kept and win).
        topics: the bag topics recorded (resolved names).
        configured: ``{topic: (Hz, origin)}`` from the goal and the recorder's parameters (Hz <= 0:
            not configured).
        meter: the recorder's :class:`RateMeter` (the ``measured`` fallback).
        command_topic: the commands' bag topic (``control_frequency_hz`` is its rate).
    """
    rates = {str(k): float(v) for k, v in (start.get("stream_rates_hz") or {}).items()
             if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0}
    origins = {str(k): str(v) for k, v in (start.get("stream_rate_sources") or {}).items() if str(k) in rates}
    hz = start.get("control_frequency_hz")
    if command_topic not in rates and isinstance(hz, (int, float)) and not isinstance(hz, bool) and hz > 0:
        rates[command_topic] = float(hz)
        origins[command_topic] = "contract" if start.get("source") == "act" else "declared"
    for topic in topics:
        if topic in rates:
            origins.setdefault(topic, "declared")
            continue
        value, origin = configured.get(topic, (0.0, ""))
        if value and value > 0:
            rates[topic], origins[topic] = float(value), origin
            continue
        measured = meter.recent_hz(topic, time.time_ns())
        if measured is not None:
            rates[topic], origins[topic] = measured, "measured"
    out = {**start, "stream_rates_hz": rates, "stream_rate_sources": origins}
    if rates.get(command_topic) and origins.get(command_topic) in ("goal", "parameter"):
        out["control_frequency_hz"] = rates[command_topic]
    return out


def rates_summary(start: dict, measured: dict) -> dict:
    """:data:`STREAM_RATES_KEY`'s dict: per topic the declared ``hz`` and its ``origin`` (start
    marker) and the ``measured_hz`` over the episode."""
    rates = start.get("stream_rates_hz") or {}
    origins = start.get("stream_rate_sources") or {}
    return {t: {"hz": rates.get(t), "origin": origins.get(t), "measured_hz": measured.get(t)}
            for t in sorted(set(rates) | set(measured))}
