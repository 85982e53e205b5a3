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

* fps is the declared control rate -- the start marker's ``control_frequency_hz``, the policy
  contract's rate the driver publishes at -- not a measurement; ``fps`` (``--fps``) overrides it.
  Only a bag without a declared rate (a RecordEpisode episode; a bag from before the marker
  carried it) measures it from the commands' receipt times -- their median period, or the mean
  over their span when bunched receipts make the median a bunch's -- with a warning saying so.
* Step times: a command's ``header.stamp`` when it has one; else its receipt time de-bunched at
  the declared period (:func:`.stamps.debunch`).
* Every stream with a declared rate (the commands; any ``stream_rates_hz`` of the start marker)
  is checked against it: stamps that disagree (median period off by more than
  :data:`RATE_TOLERANCE`) raise :class:`~sequence_ai_data.episode.StreamRateError` naming the
  stream -- the export never compresses or stretches it silently; pass ``--fps`` to resample on
  a grid of sensor time instead. A headerless stream is checked from its receipt times (mean
  period over its span, which bunching leaves alone; :data:`RECEIVE_RATE_TOLERANCE`): there a
  disagreement is a warning, as
  the recorder's lag and the publisher's rate cannot be told apart.

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
    """One stream of an episode: ``topic``; ``time_source`` (``"header"`` stamps or ``"receive"``
    times) the export used; ``n`` messages; ``declared_hz`` (``None`` = none declared);
    ``median_hz`` (1 / median period) and ``mean_hz`` ((n - 1) / span) measured from those times
    (Hz); ``span_s`` first to last (s); ``lag_ms_p50``/``lag_ms_p99``: receipt minus stamp (ms,
    stamped streams); ``verdict``: ``ok`` | ``disagrees`` | ``unchecked``."""

    topic: str
    time_source: str
    n: int
    declared_hz: Optional[float] = None
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
    """(commands, stamps) of the steps: the hold after the last action is cut (the end marker's
    ``actions`` count); ``stamps`` is one header stamp or ``None`` per command."""
    commands = list(rec.commands)
    stamps = list(rec.command_stamps) or [None] * len(commands)
    outcome = (rec.end or {}).get("outcome") or {}
    n_actions = outcome.get("actions")
    if isinstance(n_actions, int) and 0 < n_actions < len(commands):
        commands, stamps = commands[:n_actions], stamps[:n_actions]   # the hold after the last action is not a step
    if not commands:
        raise ExportError(f"{rec.path}: no commands recorded (nothing was driven)")
    return commands, stamps


def _command_clock(stamps: list, recv: list, declared: Optional[float]) -> tuple:
    """(time source, step times ns) of the commands: their header stamps when all have one, else
    receipt times (de-bunched at the declared period when there is one)."""
    from .stamps import HEADER, RECEIVE, debunch

    if all(s is not None for s in stamps):
        return HEADER, [int(s) for s in stamps]
    if declared is not None:
        return RECEIVE, debunch(recv, 1e9 / declared)
    return RECEIVE, recv


def _declared_rates(rec, cmd_topic: str, declared: Optional[float]) -> dict:
    """topic -> declared Hz: the start marker's ``stream_rates_hz`` and the commands' control rate."""
    rates = {_abs(str(k)): float(v) for k, v in (rec.start.get("stream_rates_hz") or {}).items()
             if isinstance(v, (int, float)) and v > 0}
    if declared is not None:
        rates[cmd_topic] = declared
    return rates


def _stream_timing(topic: str, source: str, ts: list, rts: list, hz: Optional[float]) -> StreamTiming:
    """A stream's measured timing (verdict not yet set): ``ts`` its times, ``rts`` its receipts."""
    from .stamps import HEADER, RECEIVE

    base = HEADER if source == HEADER else RECEIVE
    median, mean, span = _measure(ts if base == HEADER else rts)
    entry = StreamTiming(topic=topic, time_source=base, n=len(ts), declared_hz=hz,
                         median_hz=median, mean_hz=mean, span_s=span)
    if base == HEADER:
        lags = sorted(r - t for t, r in zip(ts, rts))
        if lags:
            entry.lag_ms_p50 = lags[len(lags) // 2] / 1e6
            entry.lag_ms_p99 = lags[min(len(lags) - 1, int(round(0.99 * (len(lags) - 1))))] / 1e6
    return entry


def _check_rate(entry: StreamTiming, cmd_topic: str, fps: Optional[float], src: str, warnings: list) -> None:
    """Set ``entry.verdict`` against its declared rate (unchecked below 3 messages or without one);
    a disagreement raises :class:`StreamRateError` (header stamps, no ``fps``) or is a warning."""
    from .stamps import HEADER

    hz, topic, header = entry.declared_hz, entry.topic, entry.time_source == HEADER
    if hz is None or entry.n < 3:
        return
    measured = entry.median_hz if header else entry.mean_hz
    tolerance = RATE_TOLERANCE if header else RECEIVE_RATE_TOLERANCE
    if measured is not None and abs(measured - hz) <= tolerance * hz:
        entry.verdict = "ok"
        return
    entry.verdict = "disagrees"
    shown = "no spread" if measured is None else f"{measured:.2f} Hz"
    if not header:
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
    text = (f"stream {topic} declares {hz:g} Hz but its header stamps are {shown} apart (median "
            f"period of {entry.n} messages): {what}")
    if fps is None:
        raise StreamRateError(
            f"{src}: {text}. Fix the publisher's rate or stamps (or the declaration), or pass "
            "--fps N to export on sensor time anyway (the mismatch is then a warning)",
            source=src, stream=topic, declared_hz=hz, measured_hz=measured, time_source=HEADER)
    warnings.append(f"{text}; exported at --fps {fps:g} on sensor time")


def _stream_timings(rec, cmd_topic: str, cmd_series: tuple, rates: dict, fps: Optional[float],
                    warnings: list) -> dict:
    """topic -> :class:`StreamTiming` of the commands (``cmd_series``: source, times, receipts)
    and every sensor stream, each checked against its declared rate."""
    from .stamps import RECEIVE

    series = {cmd_topic: cmd_series}
    for topic, (source, msgs) in _sensor_series(rec).items():
        series[topic] = (source, [m[0] for m in msgs], [m[1] for m in msgs])
        if source.startswith(RECEIVE + " ("):
            warnings.append(f"{topic}: placed by receipt time, {source[len(RECEIVE) + 2:-1]}")
    streams = {}
    for topic, (source, ts, rts) in series.items():
        entry = streams[topic] = _stream_timing(topic, source, ts, rts, rates.get(topic))
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


def _choose_fps(rec, fps: Optional[float], declared: Optional[float], cmd: StreamTiming, recv: list,
                warnings: list) -> tuple:
    """(fps, fps_from, command rate Hz or None) -- ``fps`` given, the declared control rate, or
    measured (:func:`_measured_fps`)."""
    cmd_rate = None
    if declared is None and len(recv) > 1:
        median = control_rate_hz(recv)
        mean = cmd.mean_hz
        cmd_rate = median if mean is None or abs(median - mean) <= 0.25 * mean else mean
    if fps is not None:
        return float(fps), "--fps", cmd_rate
    if declared is not None:
        if abs(declared - round(declared)) > 1e-6:
            raise ExportError(f"{rec.path}: the declared control rate {declared:g} Hz is not an integer, which "
                              "a LeRobot dataset needs: pass --fps N to resample")
        return float(round(declared)), "declared control_frequency_hz", cmd_rate
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
        StreamRateError: a stream's header stamps disagree with its declared rate (``fps`` not
            given; with ``fps`` it is a warning in the report).
        ExportError: no commands; a declared rate that is not an integer with no ``fps``; fps <= 0.
    """
    commands, stamps = _episode_commands(rec)
    if fps is not None and fps <= 0:
        raise ExportError(f"fps must be > 0, got {fps}")
    cmd_topic = _abs(rec.start.get("command_topic", "joint_commands"))
    declared = rec.start.get("control_frequency_hz")
    declared = float(declared) if isinstance(declared, (int, float)) and declared > 0 else None
    warnings: list = []
    recv = [t for t, _ in commands]
    cmd_source, times = _command_clock(stamps, recv, declared)
    rates = _declared_rates(rec, cmd_topic, declared)
    streams = _stream_timings(rec, cmd_topic, (cmd_source, times, recv), rates, fps, warnings)
    fps, fps_from, cmd_rate = _choose_fps(rec, fps, declared, streams[cmd_topic], recv, warnings)
    rate = declared if declared is not None else cmd_rate
    step_times, step_commands = _steps(times, commands, rate, fps)
    recorded = (times[-1] - times[0]) * 1e-9 + 1.0 / (rate or fps)
    return EpisodeTiming(fps=float(fps), declared_hz=declared, fps_from=fps_from, step_times=step_times,
                         step_commands=step_commands, command_times=list(times), streams=streams,
                         recorded_s=recorded, exported_s=len(step_times) / float(fps), warnings=warnings)


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
    return EpisodeFrames(
        task=rec.task, fps=float(fps), images=images, state=state, action=action, success=rec.success,
        state_names=names if len(names) == state.shape[1] else [f"s{i}" for i in range(state.shape[1])],
        action_names=names if len(names) == action.shape[1] else [f"a{i}" for i in range(action.shape[1])],
        source=str(bag), tasks=[obs.instruction for _, obs, _ in steps], cut=rec.end is None,
        timing=dict(timing.as_dict(), frames=len(steps), exported_s=round(len(steps) / float(fps), 4)),
    )
