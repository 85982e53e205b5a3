"""How a recorded bag becomes dataset frames (:class:`~sequence_ai_data.episode.EpisodeFrames`).

:class:`~sequence_ai_data.episode.EpisodeFrames` is the one input of the dataset writer
(:mod:`sequence_ai_data.lerobot`); this module builds one from a robot bag.

:func:`frames_from_bag` resamples a bag to one frame per control step and builds every frame's
observation with the driver's own :class:`~sequence_ai_ros.observation.ObservationAssembler`,
configured from the bag's start marker (views, joint order, time bases, alignments, max age) and
driven by the bag's *sensor* clock (:func:`episode_timing`): each sensor message is fed at its
``header.stamp`` (the time it was taken) when it has one, at its receipt time otherwise, and each
observation is built at its step's time. So a frame holds the samples taken at or before its
instant, however late or bunched the recorder received them.

Rate and time (measured: a recorder that fell behind received a 30 Hz command stream 3-6 ms
apart, and an fps measured from those receipts made a 3.4 s episode 0.32 s of dataset time):

* fps is the commands' declared rate -- the start marker's ``control_frequency_hz`` (the policy
  contract's rate the driver publishes at), or for a RecordEpisode episode the rate its goal or
  the recorder's ``control_frequency_hz`` parameter declared -- not a measurement; ``fps``
  (``--fps``) overrides it. A bag whose recorder could only measure the command rate (marked
  ``measured``) takes that, rounded; a bag from before rates were declared measures it from the
  commands' receipt times -- their median period, or the mean over their span when bunched
  receipts make the median a bunch's -- with a warning saying so.
* Step times: a command's ``header.stamp`` when it has one; else its DDS source timestamp (the
  publisher's send time, the MCAP ``publish_time``); else its receipt time -- the last two
  de-bunched at the declared period (:func:`.stamps.debunch`).
* Every stream with a rate in the bag (:func:`declared_rates`: the start marker's
  ``stream_rates_hz`` with their origins in ``stream_rate_sources``, the control rate, the end
  marker's ``measured_rates_hz``) is checked against it. Header stamps that disagree (median
  period off by more than :data:`RATE_TOLERANCE`), or source timestamps that do (the median of
  their de-bunched periods, or a mean over their span above the rate by more than
  :data:`RECEIVE_RATE_TOLERANCE`), raise :class:`~sequence_ai_data.episode.StreamRateError`
  naming the stream -- the export never compresses or stretches it silently; pass ``--fps`` to
  resample on a grid of sensor time instead. Against a rate the recorder only measured (before
  the episode) a disagreement is a warning naming the stream. A stream timed by receipt times
  alone is checked by their mean period over its span (:data:`RECEIVE_RATE_TOLERANCE`), and a
  disagreement is a warning, as the recorder's lag and the publisher's rate cannot be told apart.

Steps: with ``fps`` equal to the control rate (the default), each published command is one step,
at its time. With another ``fps``, steps sit on a uniform grid from the first command's time and
each takes the latest command at or before it. The hold the driver publishes after the last
action is not a step (the end marker's ``actions`` count bounds the commands used).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from sequence_ai_data.episode import EpisodeFrames, ExportError, StreamRateError, control_rate_hz

#: A stream's rate measured from its header stamps may differ from its declared one by this
#: fraction (10 %) before the export refuses it.
RATE_TOLERANCE = 0.10
#: ... and one measured from receipt times (mean over the span) by this one (25 %) before the
#: export warns: a recorder that falls behind or catches up moves the span's ends by its lag.
RECEIVE_RATE_TOLERANCE = 0.25
#: Stamps further than this from their receipt times (median, s) are on another clock than the
#: recorder's: that stream is placed by receipt time instead (and the report says so).
MAX_CLOCK_OFFSET_S = 10.0


@dataclass
class StreamTiming:
    """One stream of an episode: ``topic``; ``time_source`` (``"header"`` stamps, ``"source"`` DDS
    source timestamps or ``"receive"`` times) the export used; ``n`` messages; ``declared_hz``
    (``None`` = none declared) and ``rate_origin`` (who declared it: ``contract``, ``goal``,
    ``parameter``, ``declared``, or ``measured`` by the recorder); ``median_hz`` (1 / median period) and ``mean_hz`` ((n - 1) / span) measured from those times
    (Hz); ``span_s`` first to last (s); ``lag_ms_p50``/``lag_ms_p99``: receipt minus stamp (ms,
    stamped and source-timed streams); ``verdict``: ``ok`` | ``disagrees`` | ``unchecked``."""

    topic: str
    time_source: str
    n: int
    declared_hz: Optional[float] = None
    rate_origin: Optional[str] = None
    median_hz: Optional[float] = None
    mean_hz: Optional[float] = None
    span_s: float = 0.0
    lag_ms_p50: Optional[float] = None
    lag_ms_p99: Optional[float] = None
    verdict: str = "unchecked"


@dataclass
class EpisodeTiming:
    """How an episode's frames are timed (:func:`episode_timing`).

    ``fps`` (Hz) of the dataset; ``declared_hz`` the control rate the bag declares (``None``:
    none) and ``fps_from`` where ``fps`` came from; ``step_times`` (ns, sensor clock) and
    ``step_commands`` (one per frame); ``streams`` per topic; ``recorded_s`` the commands' span
    plus one period (s) and ``exported_s`` frames / fps (s); ``warnings``: text for the user.
    """

    fps: float
    declared_hz: Optional[float]
    fps_from: str
    step_times: list
    step_commands: list
    command_times: list
    streams: dict = field(default_factory=dict)
    recorded_s: float = 0.0
    exported_s: float = 0.0
    warnings: list = field(default_factory=list)

    def as_dict(self) -> dict:
        """JSON-friendly summary (no per-step lists)."""
        return {"fps": self.fps, "declared_hz": self.declared_hz, "fps_from": self.fps_from,
                "frames": len(self.step_times), "recorded_s": round(self.recorded_s, 4),
                "exported_s": round(self.exported_s, 4), "warnings": list(self.warnings),
                "streams": {t: dict(vars(s)) for t, s in self.streams.items()}}


def _abs(topic: str) -> str:
    return topic if topic.startswith("/") else "/" + topic


def _stamp_ns(msg) -> Optional[int]:
    header = getattr(msg, "header", None)
    if header is None:
        return None
    ns = int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)
    return ns if ns > 0 else None


def _measure(times: list) -> tuple:
    """(median_hz, mean_hz, span_s) of sorted-by-arrival times (ns); rates None below 2 times."""
    if len(times) < 2:
        return None, None, 0.0
    t = np.asarray(times, dtype=np.int64)
    span = float(t.max() - t.min())
    d = np.diff(np.sort(t))
    d = d[d > 0]
    median = float(1e9 / np.median(d)) if len(d) else None
    mean = float((len(t) - 1) * 1e9 / span) if span > 0 else None
    return median, mean, span * 1e-9


def _sensor_series(rec) -> dict:
    """topic -> (time_source, [(sensor t_ns, receipt t_ns, kind, view, msg)]) for every sensor
    stream, with stamps used where the stream has trustworthy ones."""
    from .stamps import HEADER, RECEIVE

    topics = dict(rec.start.get("image_topics") or {})
    out = {}
    streams = [(topics.get(v, v), "image", v, msgs) for v, msgs in rec.images.items()]
    streams.append((_abs(rec.start.get("joint_state_topic", "joint_states")), "joints", None, rec.joints))
    for topic, kind, view, msgs in streams:
        stamps = [_stamp_ns(m) for _, m in msgs]
        source = rec.time_sources.get(topic, HEADER if stamps and stamps[0] is not None else RECEIVE)
        usable = source == HEADER and msgs and all(s is not None for s in stamps)
        if usable:
            offset = float(np.median([t - s for (t, _), s in zip(msgs, stamps)])) * 1e-9
            usable = abs(offset) <= MAX_CLOCK_OFFSET_S
        if usable:
            out[topic] = (HEADER, [(s, t, kind, view, m) for (t, m), s in zip(msgs, stamps)])
        else:
            out[topic] = (RECEIVE, [(t, t, kind, view, m) for t, m in msgs])
            # a wholly unstamped stream (header.stamp 0 throughout) is simply a receipt-time one;
            # partly stamped, or stamped on another clock, is worth a word
            if source == HEADER and msgs and any(s is not None for s in stamps):
                why = ("some messages are unstamped (header.stamp 0)" if any(s is None for s in stamps)
                       else f"its stamps are {offset:+.1f} s from their receipt times (another clock)")
                out[topic] = (RECEIVE + " (stamps unusable: " + why + ")", out[topic][1])
    return out


def _episode_commands(rec) -> tuple:
    """(commands, stamps, sources) of the steps: the hold after the last action is cut (the end
    marker's ``actions`` count); ``stamps`` is one header stamp or ``None`` per command, ``sources``
    one DDS source timestamp or ``None``."""
    commands = list(rec.commands)
    stamps = list(rec.command_stamps) or [None] * len(commands)
    sources = list(getattr(rec, "command_sources", None) or []) or [None] * len(commands)
    outcome = (rec.end or {}).get("outcome") or {}
    n_actions = outcome.get("actions")
    if isinstance(n_actions, int) and 0 < n_actions < len(commands):   # the hold after the last action is not a step
        commands, stamps, sources = commands[:n_actions], stamps[:n_actions], sources[:n_actions]
    if not commands:
        raise ExportError(f"{rec.path}: no commands recorded (nothing was driven)")
    return commands, stamps, sources


def _command_clock(stamps: list, sources: list, recv: list, period_hz: Optional[float]) -> tuple:
    """(time source, step times ns, raw times ns) of the commands: their header stamps when all have
    one; else their DDS source timestamps when all have one; else their receipt times. Source and
    receipt times are de-bunched at ``period_hz`` when there is one (``raw``: before that)."""
    from .stamps import HEADER, RECEIVE, SOURCE, debunch

    if all(s is not None for s in stamps):
        times = [int(s) for s in stamps]
        return HEADER, times, times
    source, raw = (SOURCE, [int(s) for s in sources]) if all(s is not None for s in sources) else (RECEIVE, recv)
    return source, (debunch(raw, 1e9 / period_hz) if period_hz else list(raw)), raw


def declared_rates(rec, cmd_topic: str) -> tuple:
    """``({topic: Hz}, {topic: origin})`` of an episode: the start marker's ``stream_rates_hz`` (origin
    from its ``stream_rate_sources``: ``contract``, ``goal``, ``parameter``, ``measured``; default
    ``declared``), its ``control_frequency_hz`` for the commands (origin ``contract`` for an Act
    episode), then the end marker's ``measured_rates_hz`` for streams still without one (``measured``)."""
    start, end = rec.start, rec.end or {}
    origins_in = {_abs(str(k)): str(v) for k, v in (start.get("stream_rate_sources") or {}).items()}
    rates, origins = {}, {}
    for k, v in (start.get("stream_rates_hz") or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            rates[_abs(str(k))] = float(v)
            origins[_abs(str(k))] = origins_in.get(_abs(str(k)), "declared")
    hz = start.get("control_frequency_hz")
    if isinstance(hz, (int, float)) and not isinstance(hz, bool) and hz > 0:
        rates[cmd_topic] = float(hz)
        origins[cmd_topic] = origins_in.get(cmd_topic, "contract" if start.get("source") == "act" else "declared")
    for k, v in (end.get("measured_rates_hz") or {}).items():
        if _abs(str(k)) not in rates and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            rates[_abs(str(k))], origins[_abs(str(k))] = float(v), "measured"
    return rates, origins


def _stream_timing(topic: str, source: str, ts: list, rts: list, raw: list, hz: Optional[float],
                   origin: Optional[str]) -> StreamTiming:
    """A stream's measured timing (verdict not yet set): ``ts`` its times, ``rts`` its receipts,
    ``raw`` its source times before de-bunching (the mean over their span is measured from them)."""
    from .stamps import HEADER, RECEIVE, SOURCE

    base = source if source in (HEADER, SOURCE) else RECEIVE
    median, mean, span = _measure(ts if base != RECEIVE else rts)
    if base == SOURCE:
        mean = _measure(raw)[1]
    entry = StreamTiming(topic=topic, time_source=base, n=len(ts), declared_hz=hz, rate_origin=origin,
                         median_hz=median, mean_hz=mean, span_s=span)
    if base != RECEIVE:
        lags = sorted(r - t for t, r in zip(raw, rts))
        if lags:
            entry.lag_ms_p50 = lags[len(lags) // 2] / 1e6
            entry.lag_ms_p99 = lags[min(len(lags) - 1, int(round(0.99 * (len(lags) - 1))))] / 1e6
    return entry


def _agrees(entry: StreamTiming) -> tuple:
    """(agrees, the measured Hz shown) of a stream against its declared rate: header stamps by their
    median period (:data:`RATE_TOLERANCE`); source timestamps by the median of their de-bunched
    periods (a publisher-side bunch is spread back, a slow stream stays slow) and the mean over
    their span (a fast stream shows there, :data:`RECEIVE_RATE_TOLERANCE`); receipt times by that
    mean alone."""
    from .stamps import HEADER, SOURCE

    hz = entry.declared_hz
    if entry.time_source == HEADER:
        m = entry.median_hz
        return m is not None and abs(m - hz) <= RATE_TOLERANCE * hz, m
    if entry.time_source == SOURCE:
        m, mean = entry.median_hz, entry.mean_hz
        ok = m is not None and abs(m - hz) <= RATE_TOLERANCE * hz and (
            mean is None or mean <= (1 + RECEIVE_RATE_TOLERANCE) * hz)
        return ok, (m if m is None or abs(m - hz) > RATE_TOLERANCE * hz else mean)
    m = entry.mean_hz
    return m is not None and abs(m - hz) <= RECEIVE_RATE_TOLERANCE * hz, m


def _check_rate(entry: StreamTiming, cmd_topic: str, fps: Optional[float], src: str, warnings: list) -> None:
    """Set ``entry.verdict`` against its declared rate (unchecked below 3 messages or without one).
    A disagreement raises :class:`StreamRateError` when the times are the publisher's (header
    stamps, source timestamps), the rate was declared (not measured by the recorder) and no ``fps``
    was given; otherwise it is a warning naming the stream."""
    hz, topic = entry.declared_hz, entry.topic
    if hz is None or entry.n < 3:
        return
    ok, measured = _agrees(entry)
    if ok:
        entry.verdict = "ok"
        return
    entry.verdict = "disagrees"
    shown = "no spread" if measured is None else f"{measured:.2f} Hz"
    what_times = {"header": "header stamps", "source": "DDS source timestamps"}.get(entry.time_source)
    if what_times is None:
        warnings.append(
            f"{topic}: declared {hz:g} Hz, but its receipt times average {shown} over {entry.span_s:.2f} s "
            f"({entry.n} messages, no header stamps): the recorder's lag and the publisher's rate cannot "
            f"be told apart; exported at {hz:g} Hz, one frame per message")
        return
    if topic == cmd_topic:
        what = (f"one frame per command at {hz:g} Hz would "
                f"{'stretch' if measured and measured > hz else 'compress'} the episode's time")
    else:
        what = "the observations would not be sampled as declared"
    origin = entry.rate_origin or "declared"
    text = (f"stream {topic} declares {hz:g} Hz ({origin}) but its {what_times} are {shown} apart "
            f"({entry.n} messages): {what}")
    if fps is None and origin != "measured":
        raise StreamRateError(
            f"{src}: {text}. Fix the publisher's rate or stamps (or the declaration), or pass "
            "--fps N to export on sensor time anyway (the mismatch is then a warning)",
            source=src, stream=topic, declared_hz=hz, measured_hz=measured, time_source=entry.time_source)
    warnings.append(f"{text}; " + (f"exported at --fps {fps:g} on sensor time" if fps is not None else
                                   "the rate was measured by the recorder before the episode, so this is a warning"))


def _stream_timings(rec, cmd_topic: str, cmd_series: tuple, rates: tuple, fps: Optional[float],
                    warnings: list) -> dict:
    """topic -> :class:`StreamTiming` of the commands (``cmd_series``: source, times, receipts, raw)
    and every sensor stream, each checked against its declared rate (``rates``: Hz, origins)."""
    from .stamps import RECEIVE

    series = {cmd_topic: cmd_series}
    for topic, (source, msgs) in _sensor_series(rec).items():
        ts = [m[0] for m in msgs]
        series[topic] = (source, ts, [m[1] for m in msgs], ts)
        if source.startswith(RECEIVE + " ("):
            warnings.append(f"{topic}: placed by receipt time, {source[len(RECEIVE) + 2:-1]}")
    streams = {}
    hz, origins = rates
    for topic, (source, ts, rts, raw) in series.items():
        entry = streams[topic] = _stream_timing(topic, source, ts, rts, raw, hz.get(topic), origins.get(topic))
        _check_rate(entry, cmd_topic, fps, str(rec.path), warnings)
    return streams


def _measured_fps(rec, cmd: StreamTiming, recv: list, warnings: list) -> tuple:
    """(fps, measured command rate Hz) of a bag that declares no control rate, from the commands'
    receipt times: their median rate, or the span's mean when bunched receipts make them differ."""
    if len(recv) < 2:
        raise ExportError(f"{rec.path}: one command only and no declared control rate; pass --fps")
    median = control_rate_hz(recv)
    if cmd.mean_hz is not None and abs(median - cmd.mean_hz) <= 0.25 * cmd.mean_hz:
        measured = median
        fps = float(max(1, round(measured)))
    else:   # bunched receipts: the median period is a bunch's; the span's mean is not
        measured = cmd.mean_hz or median
        fps = float(max(1, round(measured)))
        warnings.append(f"{cmd.topic}: the bag declares no control rate (no control_frequency_hz in its start "
                        f"marker) and its receipt times are bunched (median {median:.1f} Hz, mean "
                        f"{measured:.1f} Hz over the episode): fps {fps:g} from the mean; pass --fps N to set it")
    cmd.declared_hz = None
    return fps, measured


def _choose_fps(rec, fps: Optional[float], declared: Optional[float], origin: Optional[str], cmd: StreamTiming,
                recv: list, warnings: list) -> tuple:
    """(fps, fps_from, command rate Hz or None) -- ``fps`` given, the commands' declared rate (the
    control rate, a RecordEpisode goal's or the recorder's parameter), the rate the recorder measured,
    or measured here from receipt times (:func:`_measured_fps`)."""
    cmd_rate = None
    if declared is None and len(recv) > 1:
        median = control_rate_hz(recv)
        mean = cmd.mean_hz
        cmd_rate = median if mean is None or abs(median - mean) <= 0.25 * mean else mean
    if fps is not None:
        return float(fps), "--fps", declared or cmd_rate
    if declared is not None:
        if origin == "measured":
            fps = float(max(1, round(declared)))
            return fps, "the command rate the recorder measured (no declared rate)", declared
        if abs(declared - round(declared)) > 1e-6:
            raise ExportError(f"{rec.path}: the declared control rate {declared:g} Hz is not an integer, which "
                              "a LeRobot dataset needs: pass --fps N to resample")
        where = "declared control_frequency_hz" if origin in ("contract", "declared") else f"declared by the {origin}"
        return float(round(declared)), where, declared
    fps, cmd_rate = _measured_fps(rec, cmd, recv, warnings)
    return fps, "measured from command receipt times (no declared rate)", cmd_rate


def _steps(times: list, commands: list, rate: Optional[float], fps: float) -> tuple:
    """(step times ns, step commands): one step per command when ``fps`` is the command rate, else
    a uniform grid from the first command's time, each step taking the latest command at or before it."""
    if rate is not None and abs(rate - fps) < 0.5:
        return list(times), [c for _, c in commands]     # one step per command
    t0, t_end = times[0], times[-1]
    period = 1e9 / fps
    step_times, step_commands, j = [], [], 0
    for k in range(int((t_end - t0) // period) + 1):
        t = int(t0 + k * period)
        while j + 1 < len(times) and times[j + 1] <= t:
            j += 1
        step_times.append(t)
        step_commands.append(commands[j][1])
    return step_times, step_commands


def episode_timing(rec, fps: Optional[float] = None) -> EpisodeTiming:
    """Rates, time sources and step times of a :class:`~.reader.RecordedEpisode` (module docstring).

    Args:
        rec: the episode read from a bag.
        fps: the dataset's frames per second (Hz); ``None`` = the declared control rate.
    Raises:
        StreamRateError: a stream's header stamps or source timestamps disagree with its declared
            rate (``fps`` not given; with ``fps``, or a rate the recorder measured, it is a warning).
        ExportError: no commands; a declared rate that is not an integer with no ``fps``; fps <= 0.
    """
    commands, stamps, sources = _episode_commands(rec)
    if fps is not None and fps <= 0:
        raise ExportError(f"fps must be > 0, got {fps}")
    cmd_topic = _abs(rec.start.get("command_topic", "joint_commands"))
    rates = declared_rates(rec, cmd_topic)
    declared, origin = rates[0].get(cmd_topic), rates[1].get(cmd_topic)
    warnings: list = []
    recv = [t for t, _ in commands]
    cmd_source, times, raw = _command_clock(stamps, sources, recv, declared)
    streams = _stream_timings(rec, cmd_topic, (cmd_source, times, recv, raw), rates, fps, warnings)
    fps, fps_from, rate = _choose_fps(rec, fps, declared, origin, streams[cmd_topic], recv, warnings)
    step_times, step_commands = _steps(times, commands, rate, fps)
    recorded = (times[-1] - times[0]) * 1e-9 + 1.0 / (rate or fps)
    return EpisodeTiming(fps=float(fps), declared_hz=declared if origin != "measured" else None, fps_from=fps_from,
                         step_times=step_times, step_commands=step_commands, command_times=list(times),
                         streams=streams, recorded_s=recorded, exported_s=len(step_times) / float(fps),
                         warnings=warnings)


def _jpeg_to_rgb(data) -> np.ndarray:
    """An observation frame's JPEG (raw bytes, or base64 text) -> HxWx3 uint8 RGB."""
    import simplejpeg

    raw = bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else base64.b64decode(data)
    return simplejpeg.decode_jpeg(raw, colorspace="RGB")


def observations_from_bag(rec, fps: Optional[float] = None, timing: Optional[EpisodeTiming] = None):
    """Resample a :class:`~.reader.RecordedEpisode` to control steps; build each observation.

    Args:
        rec: the episode.
        fps: frames per second (Hz); ``None`` = the declared control rate (see the module docstring).
        timing: an :func:`episode_timing` of ``rec`` already computed (else computed here).
    Returns:
        ``(fps, steps)``: ``steps`` is a list of ``(t_ns, Observation, command)`` -- one per
        control step, ``t_ns`` its time on the sensor clock (ns), ``Observation`` from the
        assembler at ``t_ns``, ``command`` the action (list).
    Raises:
        ExportError: no commands, or a sensor stream is stale/missing after the first step.
        StreamRateError: see :func:`episode_timing`.
    """
    from ..observation import MissingSensorError, StaleSensorError
    from .events import assembler_from_start

    if timing is None:
        timing = episode_timing(rec, fps)
    fps = timing.fps
    steps = list(zip(timing.step_times, timing.step_commands))

    now = {"t": 0.0}
    assembler = assembler_from_start(rec.start, clock=lambda: now["t"], header_clock=lambda: now["t"])
    # every sensor message at its sensor time (its stamp, else its receipt): images before joints at a tie
    stream = [(t, 0 if kind == "image" else 1, kind, view, m)
              for _, msgs in _sensor_series(rec).values() for t, _, kind, view, m in msgs]
    stream.sort(key=lambda x: (x[0], x[1]))
    instructions = sorted(rec.instructions)
    out, i, ins_i = [], 0, 0
    task = rec.task
    for t_step, command in steps:
        while i < len(stream) and stream[i][0] <= t_step:
            t, _, kind, view, msg = stream[i]
            now["t"] = t * 1e-9
            try:
                if kind == "image":
                    assembler.on_image(view, msg, "sensor_msgs/msg/CompressedImage")
                else:
                    assembler.on_joint_state(msg)
            except Exception:
                pass   # a malformed message is dropped, as live; the assembler records the fault
            i += 1
        while ins_i < len(instructions) and instructions[ins_i][0] <= t_step:
            task = instructions[ins_i][1]
            ins_i += 1
        now["t"] = t_step * 1e-9
        try:
            obs = assembler.build(task)
        except MissingSensorError:
            if not out:
                continue   # before every stream has delivered: not a step a policy could have taken
            raise ExportError(f"{rec.path}: a stream stopped at {t_step * 1e-9:.3f} s")
        except StaleSensorError as exc:
            raise ExportError(f"{rec.path}: at {(t_step - steps[0][0]) * 1e-9:.2f} s into the episode: {exc}") from exc
        out.append((t_step, obs, list(command)))
    if not out:
        raise ExportError(f"{rec.path}: no control step had every sensor stream")
    return fps, out


def frames_from_bag(bag: Path, fps: Optional[float] = None) -> EpisodeFrames:
    """Read one episode bag and resample it (see the module docstring).

    Args:
        bag: a bag directory written by ``episode_recorder`` (a cut bag is recovered).
        fps: frames per second (Hz); ``None`` = the declared control rate (a bag without one: the
            rate measured from the commands, rounded to an integer).
    Raises:
        ExportError (StreamRateError) / BagReadError: see :func:`episode_timing`,
            :func:`observations_from_bag` and :func:`.reader.read_episode`.
    """
    from .reader import read_episode

    rec = read_episode(bag)
    timing = episode_timing(rec, fps)
    fps, steps = observations_from_bag(rec, timing=timing)
    views = list(rec.start.get("views") or [])
    images = {v: np.stack([_jpeg_to_rgb(next(f.data for f in obs.images if f.view == v)) for _, obs, _ in steps])
              for v in views}
    state = np.asarray([list(obs.proprioception.joint_positions) + list(obs.proprioception.gripper or [])
                        for _, obs, _ in steps], dtype=np.float32)
    action = np.asarray([c for _, _, c in steps], dtype=np.float32)
    joints = list(rec.start.get("joint_names") or [])
    grip = rec.start.get("gripper_joint")
    names = joints + ([grip] if grip else [])
    from .events import provenance
    return EpisodeFrames(
        task=rec.task, fps=float(fps), images=images, state=state, action=action, success=rec.success,
        state_names=names if len(names) == state.shape[1] else [f"s{i}" for i in range(state.shape[1])],
        action_names=names if len(names) == action.shape[1] else [f"a{i}" for i in range(action.shape[1])],
        source=str(bag), tasks=[obs.instruction for _, obs, _ in steps], cut=rec.end is None,
        timing=dict(timing.as_dict(), frames=len(steps), exported_s=round(len(steps) / float(fps), 4)),
        provenance=provenance(rec.start, rec.end),
        state_groups=_groups(len(joints), bool(grip), state.shape[1]),
        action_groups=_groups(len(joints), bool(grip), action.shape[1]),
    )


def _groups(n_joints: int, gripper: bool, width: int) -> Optional[dict]:
    """``{"single_arm": [0, n_joints), "gripper": [n_joints, width)}`` (GR00T's names) when a vector
    is the joints then the gripper (``single_arm`` alone without one); ``None`` when its width says otherwise."""
    if n_joints and width == n_joints + (1 if gripper else 0):
        return {"single_arm": [0, n_joints], **({"gripper": [n_joints, width]} if gripper else {})}
    return None
