"""How a recorded bag becomes dataset frames (:class:`~sequence_ai_data.episode.EpisodeFrames`).

:class:`~sequence_ai_data.episode.EpisodeFrames` is the one input of the dataset writer
(:mod:`sequence_ai_data.lerobot`); this module builds one from a robot bag.

:func:`frames_from_bag` resamples a bag to one frame per control step and builds every frame's
observation with the driver's own :class:`~sequence_ai_ros.observation.ObservationAssembler`,
configured from the bag's start marker (views, joint order, time bases, alignments, max age) and
driven by the bag's clock: messages are fed in log-time order, the assembler's clocks read the
log time of the message being fed, and each observation is built at its step's time. So a frame
holds what the policy would have been given at that instant.

Steps: with ``fps`` equal to the control rate (the default; the rate is measured from the
commands' median period), each published command is one step, at its log time. With another
``fps``, steps sit on a uniform grid from the first command and each takes the latest command at
or before it. The hold the driver publishes after the last action is not a step (the end
marker's ``actions`` count bounds the commands used).
"""
from __future__ import annotations

import base64
from pathlib import Path
from typing import Optional

import numpy as np

from sequence_ai_data.episode import EpisodeFrames, ExportError, control_rate_hz


def _jpeg_to_rgb(data) -> np.ndarray:
    """An observation frame's JPEG (raw bytes, or base64 text) -> HxWx3 uint8 RGB."""
    import simplejpeg

    raw = bytes(data) if isinstance(data, (bytes, bytearray, memoryview)) else base64.b64decode(data)
    return simplejpeg.decode_jpeg(raw, colorspace="RGB")


def observations_from_bag(rec, fps: Optional[float] = None):
    """Resample a :class:`~.reader.RecordedEpisode` to control steps; build each observation.

    Returns:
        ``(fps, steps)``: ``steps`` is a list of ``(t_ns, Observation, command)`` -- one per
        control step, ``Observation`` from the assembler at ``t_ns``, ``command`` the action (list).
    Raises:
        ExportError: no commands, or a sensor stream is stale/missing after the first step.
    """
    from ..observation import MissingSensorError, StaleSensorError
    from .events import assembler_from_start

    commands = list(rec.commands)
    outcome = (rec.end or {}).get("outcome") or {}
    n_actions = outcome.get("actions")
    if isinstance(n_actions, int) and 0 < n_actions < len(commands):
        commands = commands[:n_actions]   # the hold after the last action is not a step
    if not commands:
        raise ExportError(f"{rec.path}: no commands recorded (nothing was driven)")
    rate = control_rate_hz([t for t, _ in commands]) if len(commands) > 1 else None
    if fps is None:
        if rate is None:
            raise ExportError(f"{rec.path}: one command only; pass --fps")
        fps = float(round(rate))
    if fps <= 0:
        raise ExportError(f"fps must be > 0, got {fps}")
    if rate is not None and abs(rate - fps) < 0.5:
        steps = commands                                           # one step per command
    else:
        t0, t_end = commands[0][0], commands[-1][0]
        period = 1e9 / fps
        steps, j = [], 0
        for k in range(int((t_end - t0) // period) + 1):
            t = int(t0 + k * period)
            while j + 1 < len(commands) and commands[j + 1][0] <= t:
                j += 1
            steps.append((t, commands[j][1]))

    now = {"t": 0.0}
    assembler = assembler_from_start(rec.start, clock=lambda: now["t"], header_clock=lambda: now["t"])
    stream = [(t, 0, "image", v, m) for v, msgs in rec.images.items() for t, m in msgs]
    stream += [(t, 1, "joints", None, m) for t, m in rec.joints]
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
        fps: frames per second; ``None`` = the measured control rate, rounded to an integer.
    Raises:
        ExportError / BagReadError: see :func:`observations_from_bag` and :func:`.reader.read_episode`.
    """
    from .reader import read_episode

    rec = read_episode(bag)
    fps, steps = observations_from_bag(rec, fps)
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
    )
