"""Episodes kept by a worker (capture) as dataset frames.

A worker with capture on keeps each /act of a kept episode as one JSON step (observation,
chunk, time ``t`` in s) plus its image files; :func:`frames_from_kept` turns one such episode into
an :class:`~sequence_ai_data.episode.EpisodeFrames` for the dataset writer, and
:func:`act_rate_hz` picks the export's fps. The gateway's capture export
(``seq policy data export --format lerobot``) uses both.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

import numpy as np

from .episode import EpisodeFrames, ExportError


def frames_from_kept(directory: Path, episode_id: str, steps: list[dict], label: Optional[dict], fps: float):
    """One kept episode -> :class:`~sequence_ai_data.episode.EpisodeFrames`: one frame per /act,
    ``observation.state`` = the proprioception fields in the order sent, ``action`` = the chunk's
    first row, the instruction as the task, frames (``--images`` episodes) decoded to RGB, the
    label as ``next.success``. Raises ExportError for steps that do not line up."""
    state, action, tasks = [], [], []
    images: dict[str, list] = {}
    names: list[str] = []
    for s in steps:
        obs = s.get("observation") or {}
        chunk = s.get("chunk") or {}
        rows = chunk.get("actions") or []
        if not rows:
            raise ExportError(f"episode {episode_id}: step {s.get('step')} returned no actions")
        proprio = obs.get("proprioception") or {}
        vec: list[float] = []
        step_names: list[str] = []
        for field, values in proprio.items():
            vals = values if isinstance(values, list) else [values]
            vec += [float(v) for v in vals]
            step_names += [f"{field}.{i}" for i in range(len(vals))] if len(vals) > 1 else [field]
        names = names or step_names
        state.append(vec)
        action.append([float(v) for v in rows[0]])
        tasks.append(obs.get("instruction") or "")
        for frame in obs.get("images") or []:
            if frame.get("file"):
                images.setdefault(frame["view"], []).append(_decode_rgb(Path(directory) / frame["file"]))
    imgs = {}
    for view, frames in images.items():
        if len(frames) != len(steps):
            raise ExportError(f"episode {episode_id}: view {view!r} has {len(frames)} frames for {len(steps)} steps "
                              "(history > 1 or a view missing on some steps)")
        imgs[view] = np.stack(frames)
    width = {len(v) for v in state}
    if len(width) > 1:
        raise ExportError(f"episode {episode_id}: proprioception widths differ between steps: {sorted(width)}")
    success = None if label is None else bool(label.get("success"))
    return EpisodeFrames(task=tasks[0], fps=fps, images=imgs, state=np.asarray(state, dtype=np.float32),
                         action=np.asarray(action, dtype=np.float32), success=success, state_names=names,
                         action_names=[f"a{i}" for i in range(len(action[0]))], source=f"episode {episode_id}",
                         tasks=tasks)


def _decode_rgb(path: Path):
    data = path.read_bytes()
    if data[:2] == b"\xff\xd8":
        import simplejpeg
        return simplejpeg.decode_jpeg(data, colorspace="RGB")
    from PIL import Image
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def act_rate_hz(episodes: list) -> float:
    """Frames per second for an export: 1 / the median time between /acts over all episodes,
    rounded to an integer >= 1 (LeRobot needs one integer fps); 1 when no episode has 2 steps."""
    gaps = [b["t"] - a["t"] for _, steps, _ in episodes for a, b in zip(steps, steps[1:]) if b["t"] > a["t"]]
    return float(max(1, round(1.0 / float(np.median(gaps))))) if gaps else 1.0
