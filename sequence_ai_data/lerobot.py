"""The dataset writer: :class:`~.episode.EpisodeFrames` -> a LeRobot dataset (v3.0 or v2.1).

One writer for every source (robot bags today, worker-kept episodes later). Parquet through
``pyarrow``, MP4 through ``PyAV`` (H.264, yuv420p, a keyframe every 2 frames so random access is
cheap); nothing hand-rolled.

Layouts (``lerobot`` 0.6.1 reads v3.0; v2.1 is the spec's and the seeds'):

* v3.0: ``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet`` (task strings as the
  pandas index, ``task_index``), ``meta/episodes/chunk-000/file-000.parquet`` (one row per
  episode: length, tasks, data and video file indices, video time range),
  ``data/chunk-CCC/file-FFF.parquet`` and ``videos/<key>/chunk-CCC/file-FFF.mp4`` -- one data
  file and one video per key per episode (file index = episode index mod 1000).
* v2.1: ``meta/info.json``, ``meta/episodes.jsonl``, ``meta/tasks.jsonl``,
  ``meta/episodes_stats.jsonl``, ``data/chunk-CCC/episode_EEEEEE.parquet``,
  ``videos/chunk-CCC/<key>/episode_EEEEEE.mp4``.

The contract travels with the data: ``meta/info.json`` gets a ``sequence_ai`` entry
(:func:`contract_info`) holding the observation and action contracts the episodes were recorded
under, the policy (deployment and version), the declared stream rates and the seam statistics,
per episode and summed. With ``gr00t_modality`` a v2.1 dataset also gets GR00T's
``meta/modality.json`` (:func:`gr00t_modality`): the index ranges of ``observation.state`` and
``action`` per body part, the video keys and the task annotation.

Feature mapping: ``images[view]`` -> ``observation.images.<view>`` (video), ``state`` ->
``observation.state``, ``action`` -> ``action``, the label -> ``next.success`` (True on the last
frame of a successful episode), plus ``timestamp``, ``frame_index``, ``episode_index``, ``index``,
``task_index``.

Safety of the output: an export into a non-empty directory is refused unless ``mode`` is
``append`` (add episodes; features and fps must match) or ``overwrite``. The dataset is built in
a temporary directory beside ``out`` and renamed into place at the end, so a failure leaves
either the old dataset or nothing -- never half a dataset. :func:`write_dataset` itself replaces
whatever is at ``out`` in those modes; :func:`write_export` (``sequence-ai bag export``) first
checks that ``out`` is an earlier export of this tool (its signed export marker,
:mod:`sequence_ai_data.marker`, keyed by ``<data dir>/bag-export.key``) and refuses ``/``, the home
folder and the working directory or any folder above it, then signs the new export before the swap.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterable, List, Optional

import numpy as np

from .episode import EpisodeFrames, ExportError

VERSIONS = ("3.0", "2.1")
MODES = ("new", "append", "overwrite")
CHUNKS_SIZE = 1000
_V3_DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
_V3_VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
_V3_EPISODES = "meta/episodes/chunk-000/file-000.parquet"
_V21_DATA = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
_V21_VIDEO = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
_SCALARS = {"timestamp": "float32", "frame_index": "int64", "episode_index": "int64", "index": "int64",
            "task_index": "int64"}


class DatasetExistsError(ExportError):
    """The output directory is not empty and neither append nor overwrite was asked for."""


def _features(ep: EpisodeFrames, fps: int) -> dict:
    feats = {}
    for view, frames in ep.images.items():
        h, w = int(frames.shape[1]), int(frames.shape[2])
        feats[f"observation.images.{view}"] = {
            "dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": h, "video.width": w, "video.codec": "h264", "video.pix_fmt": "yuv420p",
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3, "has_audio": False},
        }
    feats["observation.state"] = {"dtype": "float32", "shape": [int(ep.state.shape[1])], "names": list(ep.state_names)}
    feats["action"] = {"dtype": "float32", "shape": [int(ep.action.shape[1])], "names": list(ep.action_names)}
    feats["next.success"] = {"dtype": "bool", "shape": [1], "names": None}
    for name, dtype in _SCALARS.items():
        feats[name] = {"dtype": dtype, "shape": [1], "names": None}
    return feats


def _stats(values: np.ndarray) -> dict:
    """min/max/mean/std/count over axis 0 of ``(T, ...)`` values (lists, JSON-ready)."""
    v = values.astype(np.float64)
    return {"min": v.min(0).tolist(), "max": v.max(0).tolist(), "mean": v.mean(0).tolist(),
            "std": v.std(0).tolist(), "count": [int(len(v))]}


def _image_stats(frames: np.ndarray) -> dict:
    """Per-channel stats of ``(T, H, W, 3)`` uint8 frames scaled to [0, 1], shaped (3, 1, 1)."""
    step = max(1, len(frames) // 50)           # at most ~50 frames, every 4th pixel: stats, not an audit
    px = frames[::step, ::4, ::4].reshape(-1, 3).astype(np.float32) / 255.0
    shape = lambda a: [[[float(x)]] for x in a]  # noqa: E731
    return {"min": shape(px.min(0)), "max": shape(px.max(0)), "mean": shape(px.mean(0)),
            "std": shape(px.std(0)), "count": [int(len(frames))]}


def _merge_stats(a: dict, b: dict) -> dict:
    """Combine two stats dicts of one feature (count-weighted mean and variance)."""
    na, nb = float(a["count"][0]), float(b["count"][0])
    ma, mb = np.asarray(a["mean"], float), np.asarray(b["mean"], float)
    va, vb = np.asarray(a["std"], float) ** 2, np.asarray(b["std"], float) ** 2
    n = na + nb
    mean = (na * ma + nb * mb) / n
    var = (na * (va + (ma - mean) ** 2) + nb * (vb + (mb - mean) ** 2)) / n
    return {"min": np.minimum(np.asarray(a["min"], float), np.asarray(b["min"], float)).tolist(),
            "max": np.maximum(np.asarray(a["max"], float), np.asarray(b["max"], float)).tolist(),
            "mean": mean.tolist(), "std": np.sqrt(var).tolist(), "count": [int(n)]}


def _write_video(path: Path, frames: np.ndarray, fps: int) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    h, w = int(frames.shape[1]), int(frames.shape[2])
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": "18", "g": "2", "preset": "veryfast"}
        for i, rgb in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _data_table(ep: EpisodeFrames, ep_index: int, start_index: int, task_index: List[int], fps: int):
    import pyarrow as pa

    n = ep.length
    success = np.zeros(n, dtype=bool)
    if ep.success:
        success[-1] = True
    d, a = ep.state.shape[1], ep.action.shape[1]
    cols = {
        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(ep.state.astype(np.float32).ravel()), d),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(ep.action.astype(np.float32).ravel()), a),
        "next.success": pa.array(success),
        "timestamp": pa.array((np.arange(n) / fps).astype(np.float32)),
        "frame_index": pa.array(np.arange(n, dtype=np.int64)),
        "episode_index": pa.array(np.full(n, ep_index, dtype=np.int64)),
        "index": pa.array(np.arange(start_index, start_index + n, dtype=np.int64)),
        "task_index": pa.array(np.asarray(task_index, dtype=np.int64)),
    }
    return pa.table(cols)


def _episode_stats(ep: EpisodeFrames, table) -> dict:
    stats = {f"observation.images.{v}": _image_stats(frames) for v, frames in ep.images.items()}
    for name in ("observation.state", "action"):
        stats[name] = _stats(np.asarray(table.column(name).to_pylist(), dtype=np.float64))
    for name in ("next.success", *_SCALARS):
        stats[name] = _stats(np.asarray(table.column(name).to_pylist(), dtype=np.float64).reshape(-1, 1))
    return stats


def _tasks_table(tasks: List[str]):
    """``meta/tasks.parquet``: task strings as the pandas index (how lerobot reads it), ``task_index``."""
    import pyarrow as pa

    table = pa.table({"task_index": pa.array(range(len(tasks)), type=pa.int64()), "task": pa.array(tasks, type=pa.string())})
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
                            "metadata": {"encoding": "UTF-8"}}],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


class _Existing:
    """What an append starts from: counts, tasks, stats, features of the dataset in ``root`` (a
    copy of ``shown``, the folder the user named, which the errors name)."""

    def __init__(self, root: Path, version: str, shown: Path) -> None:
        import pyarrow.parquet as pq

        self.info = json.loads((root / "meta" / "info.json").read_text())
        found = str(self.info.get("codebase_version", "")).lstrip("v")
        if found != version:
            raise ExportError(f"{shown} is a v{found} dataset; append with --version {found}")
        self.episodes = int(self.info["total_episodes"])
        self.frames = int(self.info["total_frames"])
        if version == "3.0":
            t = pq.read_table(root / "meta" / "tasks.parquet")
            order = np.argsort(t.column("task_index").to_numpy())
            self.tasks = [t.column("task").to_pylist()[i] for i in order]
            self.stats = json.loads((root / "meta" / "stats.json").read_text())
            self.episode_rows = pq.read_table(root / _V3_EPISODES).to_pylist()
        else:
            rows = [json.loads(x) for x in (root / "meta" / "tasks.jsonl").read_text().splitlines() if x.strip()]
            self.tasks = [r["task"] for r in sorted(rows, key=lambda r: r["task_index"])]
            self.stats, self.episode_rows = {}, []


def write_dataset(episodes: Iterable[EpisodeFrames], out: Path, *, version: str = "3.0", mode: str = "new",
                  robot_type: Optional[str] = None,
                  before_swap: Optional[Callable[[Path], None]] = None, gr00t_modality: bool = False) -> dict:
    """Write episodes as a LeRobot dataset at ``out`` (see the module docstring).

    Args:
        episodes: :class:`EpisodeFrames`, all with the same fps, views, image sizes and widths.
        out: the dataset directory.
        version: ``"3.0"`` (default, what lerobot 0.6.1 reads) or ``"2.1"`` (the spec's).
        mode: ``"new"`` (refuse a non-empty ``out``), ``"append"`` or ``"overwrite"``.
        robot_type: ``info.json`` ``robot_type`` (e.g. ``"panda"``); ``None`` leaves it null.
        before_swap: called with the finished temporary folder right before it replaces ``out``
            (:func:`write_export` signs it and re-checks ``out`` there); raising keeps ``out``.
        gr00t_modality: also write GR00T's ``meta/modality.json`` (v2.1 only: GR00T reads v2.1).
    Returns:
        ``{"out", "version", "episodes", "frames", "tasks", "added_episodes", "added_frames"}``.
    Raises:
        DatasetExistsError: ``out`` is not empty and mode is ``new``.
        ExportError: bad version/mode, fps not an integer, episodes that do not match each other
            or the dataset appended to, ``gr00t_modality`` with v3.0. Nothing is left at ``out``
            that was not there before.
    """
    version, out, non_empty = _check_target(out, version, mode)
    if gr00t_modality and version != "2.1":
        raise ExportError(f"GR00T's meta/modality.json goes with a LeRobot v2.1 dataset (GR00T reads v2.1): "
                          f"export with --version 2.1, not {version}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        existing = None
        if non_empty and mode == "append":
            shutil.copytree(out, tmp, dirs_exist_ok=True)
            existing = _Existing(tmp, version, out)
        build = _DatasetBuild(tmp, version, existing)
        for ep in episodes:
            build.add(ep)
        if build.added == 0:
            raise ExportError("no episodes to write")
        build.write_meta(robot_type if existing is None else existing.info.get("robot_type"), modality=gr00t_modality)
        if before_swap is not None:
            before_swap(tmp)
        _swap_into_place(tmp, out)
        return {"out": str(out), "version": version, "episodes": build.ep_index, "frames": build.frame_index,
                "tasks": len(build.tasks), "added_episodes": build.added, "added_frames": build.added_frames}
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _check_target(out: Path, version: str, mode: str) -> tuple:
    """``(version without "v", out resolved, out is non-empty)``; raises as :func:`write_dataset`."""
    version = str(version).lstrip("v")
    if version not in VERSIONS:
        raise ExportError(f"version must be one of {VERSIONS}, got {version!r}")
    if mode not in MODES:
        raise ExportError(f"mode must be one of {MODES}, got {mode!r}")
    out = Path(out).resolve()
    non_empty = out.exists() and any(out.iterdir())
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file, not a directory")
    if non_empty and mode == "new":
        raise DatasetExistsError(f"{out} is not empty; pass --append to add episodes or --overwrite to replace it")
    return version, out, non_empty


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Replace ``out`` by the finished ``tmp``: only now does ``out`` change."""
    if out.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(trash / out.name)
        tmp.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(out)


class _DatasetBuild:
    """A dataset being written into the temporary folder ``tmp``: the running totals, tasks,
    stats and episode rows (starting from ``existing`` on append), one :meth:`add` per episode,
    then :meth:`write_meta`."""

    def __init__(self, tmp: Path, version: str, existing: Optional[_Existing]) -> None:
        self.tmp, self.version = tmp, version
        self.tasks: List[str] = list(existing.tasks) if existing else []
        self.stats = dict(existing.stats) if existing else {}
        self.ep_rows = list(existing.episode_rows) if existing else []
        self.ep_index = existing.episodes if existing else 0
        self.frame_index = existing.frames if existing else 0
        self.features = existing.info["features"] if existing else None
        self.fps = int(existing.info["fps"]) if existing else None
        self.v21_lines: dict = {"episodes": [], "stats": []}
        self.added = self.added_frames = 0
        self.contract = dict(existing.info.get("sequence_ai") or {}) if existing else {}
        self.groups = None   # (state groups, action groups) of the first episode added, for modality.json

    def _check(self, ep: EpisodeFrames) -> None:
        if self.fps is None:
            self.fps = int(round(ep.fps))
        if abs(ep.fps - self.fps) > 1e-6:
            raise ExportError(f"{ep.source}: fps {ep.fps} differs from the dataset's {self.fps} (integers only; use --fps)")
        feats = _features(ep, self.fps)
        if self.features is None:
            self.features = feats
        elif _shape_sig(feats) != _shape_sig(self.features):
            raise ExportError(f"{ep.source}: features {_shape_sig(feats)} differ from the dataset's "
                              f"{_shape_sig(self.features)}")

    def add(self, ep: EpisodeFrames) -> None:
        """Write one episode's data table and videos; raises ExportError when it does not match."""
        import pyarrow.parquet as pq

        self._check(ep)
        fps, ep_index, tmp = self.fps, self.ep_index, self.tmp
        task_idx = []
        for t in ep.tasks:
            if t not in self.tasks:
                self.tasks.append(t)
            task_idx.append(self.tasks.index(t))
        table = _data_table(ep, ep_index, self.frame_index, task_idx, fps)
        chunk, file_ = divmod(ep_index, CHUNKS_SIZE)
        ep_stats = _episode_stats(ep, table)
        ep_tasks = list(dict.fromkeys(ep.tasks))
        if self.version == "3.0":
            path = tmp / _V3_DATA.format(chunk_index=chunk, file_index=file_)
            row = {"episode_index": ep_index, "tasks": ep_tasks, "length": ep.length,
                   "data/chunk_index": chunk, "data/file_index": file_,
                   "dataset_from_index": self.frame_index, "dataset_to_index": self.frame_index + ep.length}
            for view, frames in ep.images.items():
                key = f"observation.images.{view}"
                _write_video(tmp / _V3_VIDEO.format(video_key=key, chunk_index=chunk, file_index=file_), frames, fps)
                row.update({f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file_,
                            f"videos/{key}/from_timestamp": 0.0, f"videos/{key}/to_timestamp": ep.length / fps})
            row.update({"meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0})
            self.ep_rows.append(row)
        else:
            path = tmp / _V21_DATA.format(episode_chunk=chunk, episode_index=ep_index)
            for view, frames in ep.images.items():
                key = f"observation.images.{view}"
                _write_video(tmp / _V21_VIDEO.format(episode_chunk=chunk, video_key=key, episode_index=ep_index), frames, fps)
            self.v21_lines["episodes"].append({"episode_index": ep_index, "tasks": ep_tasks, "length": ep.length})
            self.v21_lines["stats"].append({"episode_index": ep_index, "stats": ep_stats})
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        for name, s in ep_stats.items():
            self.stats[name] = _merge_stats(self.stats[name], s) if name in self.stats else s
        self.contract = contract_info(self.contract, ep, ep_index)
        if self.groups is None:
            self.groups = (ep.state_groups, ep.action_groups)
        self.ep_index += 1
        self.frame_index += ep.length
        self.added += 1
        self.added_frames += ep.length

    def write_meta(self, robot_type: Optional[str], modality: bool = False) -> None:
        """``meta/``: info.json, the tasks, the episode rows and the stats of this version (and
        GR00T's modality.json when ``modality``)."""
        import pyarrow.parquet as pq

        n_videos = sum(1 for f in self.features.values() if f["dtype"] == "video")
        info = {
            "codebase_version": f"v{self.version}", "robot_type": robot_type,
            "total_episodes": self.ep_index, "total_frames": self.frame_index, "total_tasks": len(self.tasks),
            "chunks_size": CHUNKS_SIZE, "fps": self.fps, "splits": {"train": f"0:{self.ep_index}"},
            "features": self.features,
        }
        if self.contract:
            info["sequence_ai"] = self.contract
        meta = self.tmp / "meta"
        meta.mkdir(parents=True, exist_ok=True)
        if self.version == "3.0":
            import pyarrow as pa

            info.update({"data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
                         "data_path": _V3_DATA, "video_path": _V3_VIDEO})
            (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.Table.from_pylist(self.ep_rows), self.tmp / _V3_EPISODES)
            pq.write_table(_tasks_table(self.tasks), meta / "tasks.parquet")
            (meta / "stats.json").write_text(json.dumps(self.stats, indent=2))
        else:
            info.update({"total_videos": self.ep_index * n_videos,
                         "total_chunks": (self.ep_index - 1) // CHUNKS_SIZE + 1,
                         "data_path": _V21_DATA, "video_path": _V21_VIDEO})
            with open(meta / "episodes.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.v21_lines["episodes"])
            with open(meta / "episodes_stats.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.v21_lines["stats"])
            (meta / "tasks.jsonl").write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n"
                                                      for i, t in enumerate(self.tasks)))
        (meta / "info.json").write_text(json.dumps(info, indent=4))
        if modality:
            state_groups, action_groups = self.groups or (None, None)
            (meta / "modality.json").write_text(json.dumps(
                gr00t_modality(self.features, state_groups, action_groups), indent=4))


def contract_info(current: dict, ep: EpisodeFrames, ep_index: int) -> dict:
    """``info.json``'s ``sequence_ai`` entry with episode ``ep`` added: ``observation_contract``,
    ``action_contract`` and ``policy`` of the first episode that has them, ``stream_rates`` (topic ->
    ``{"hz", "origin", "measured_hz"}``, the first episode's), ``seams`` summed over the episodes
    that report seam statistics (``episodes``, ``seams``, ``chunks``, ``max_seam_jump``,
    ``seam_jump_p99_max``, ``seam_rows_trimmed``), and ``episodes``: per episode its index, source,
    policy, seam statistics and whether its contract differs from the dataset's."""
    prov = ep.provenance or {}
    contract = prov.get("contract") or {}
    out = dict(current)
    if "observation_contract" not in out and contract:
        out["observation_contract"] = contract.get("observation")
        out["action_contract"] = contract.get("action")
    if out.get("policy") is None and prov.get("policy"):
        out["policy"] = prov.get("policy")
    if not out.get("stream_rates") and prov.get("stream_rates"):
        out["stream_rates"] = prov.get("stream_rates")
    seams = prov.get("seams")
    if seams:
        total = dict(out.get("seams") or {"episodes": 0, "seams": 0, "chunks": 0, "max_seam_jump": 0.0,
                                          "seam_jump_p99_max": 0.0, "seam_rows_trimmed": 0})
        total["episodes"] += 1
        for key in ("seams", "chunks", "seam_rows_trimmed"):
            total[key] += int(seams.get(key) or 0)
        total["max_seam_jump"] = max(total["max_seam_jump"], float(seams.get("max_seam_jump") or 0.0))
        total["seam_jump_p99_max"] = max(total["seam_jump_p99_max"], float(seams.get("seam_jump_p99") or 0.0))
        out["seams"] = total
    differs = bool(contract) and (contract.get("observation"), contract.get("action")) != (
        out.get("observation_contract"), out.get("action_contract"))
    out["episodes"] = [*(out.get("episodes") or []), {"episode_index": ep_index, "source": ep.source,
                                                      "policy": prov.get("policy"), "seams": seams,
                                                      "contract_differs": differs}]
    return out


def gr00t_modality(features: dict, state_groups: Optional[dict], action_groups: Optional[dict]) -> dict:
    """GR00T's ``meta/modality.json`` for a dataset with ``features`` (``info.json``'s): ``state`` and
    ``action`` map each body part to its ``[start, end)`` index range of ``observation.state`` /
    ``action`` (``original_key``), one part over the whole vector when the groups are ``None``;
    ``video`` maps each view to its ``observation.images.<view>`` key; ``annotation`` maps
    ``human.task_description`` to ``task_index``."""
    def ranges(groups: Optional[dict], key: str) -> dict:
        width = int(features[key]["shape"][0])
        groups = groups or {key.split(".")[-1]: [0, width]}
        return {name: {"start": int(a), "end": int(b), "original_key": key} for name, (a, b) in groups.items()}

    video = {k.split(".", 2)[2]: {"original_key": k} for k, f in features.items()
             if f.get("dtype") == "video" and k.startswith("observation.images.")}
    return {"state": ranges(state_groups, "observation.state"), "action": ranges(action_groups, "action"),
            "video": video, "annotation": {"human.task_description": {"original_key": "task_index"}}}


def _shape_sig(features: dict) -> dict:
    return {k: (v["dtype"], list(v["shape"])) for k, v in features.items()}


#: Key file that signs the export markers of ``sequence-ai bag export`` (in the data dir).
EXPORT_KEY_FILE = "bag-export.key"


class ExportRefused(ExportError):
    """``--out`` is a folder ``sequence-ai bag export`` will not replace: ``/``, the home folder,
    the working directory or a folder above it, a file, or a non-empty folder that is not an
    earlier export of this tool. The message names the path, the rule and what to do."""


def _key_path() -> Path:
    home = os.environ.get("SEQUENCES_HOME") or str(Path.home() / ".sequence-ai")
    return Path(home).expanduser() / EXPORT_KEY_FILE


def check_export_target(out: Path, mode: str = "new") -> Path:
    """Where ``sequence-ai bag export`` may write: ``out`` resolved (symlinks and ``..``), checked.

    Rules: never ``/``, the home folder, or the working directory or one of its ancestors (for
    ``append``/``overwrite``; ``new`` only ever fills an empty or missing folder); never a file; a
    non-empty ``out`` is refused for ``new`` (DatasetExistsError) and, for ``append``/``overwrite``,
    unless it holds this tool's export marker signed for that path (an earlier export of it).

    Returns the resolved path. Raises ExportRefused, DatasetExistsError or ExportError (bad mode).
    """
    from .marker import EXPORT_MARKER, is_marked, load_key

    if mode not in MODES:
        raise ExportError(f"mode must be one of {MODES}, got {mode!r}")
    raw = Path(out).expanduser()
    resolved = raw.resolve()
    where = f"{raw}" + (f" (resolves to {resolved})" if resolved != raw else "")
    if resolved.exists() and not resolved.is_dir():
        raise ExportRefused(f"refused: --out {where} is a file, not a folder; pick a new or empty folder")
    non_empty = resolved.is_dir() and any(resolved.iterdir())
    if not non_empty:
        return resolved
    if mode == "new":
        raise DatasetExistsError(f"{where} is not empty; pass --append to add episodes to or --overwrite to "
                                 "replace an earlier export of `sequence-ai bag export`")
    cwd = Path.cwd().resolve()
    if resolved == Path(resolved.anchor):
        rule = "is the file system root"
    elif resolved == Path.home().resolve():
        rule = "is your home folder"
    elif resolved == cwd or resolved in cwd.parents:
        rule = f"is the working directory {cwd} or a folder above it"
    elif not is_marked(resolved, load_key(_key_path())):
        rule = (f"is not empty and is not an earlier export of `sequence-ai bag export` (no valid {EXPORT_MARKER} "
                "in it)")
    else:
        return resolved
    raise ExportRefused(f"refused: --out {where} {rule}; --{mode} only replaces a dataset this tool exported "
                        "there. Pick a new or empty folder, or remove that folder yourself")


def write_export(episodes: Iterable[EpisodeFrames], out: Path, *, version: str = "3.0", mode: str = "new",
                 robot_type: Optional[str] = None, gr00t_modality: bool = False) -> dict:
    """``sequence-ai bag export``: :func:`write_dataset` into ``out`` after
    :func:`check_export_target`; the dataset is built beside ``out``, signed with this tool's export
    marker, ``out`` is checked again, and only then renamed into place.

    Returns write_dataset's summary. Raises ExportRefused, DatasetExistsError, ExportError (as
    write_dataset); nothing at ``out`` changes when anything is raised.
    """
    from .marker import load_key, write_marker

    target = check_export_target(out, mode)
    key = load_key(_key_path())

    def sign(tmp: Path) -> None:
        write_marker(tmp, target, key, tool="sequence-ai bag export", format="lerobot", version=version)
        check_export_target(target, mode)    # nothing else was put there meanwhile

    return write_dataset(episodes, target, version=version, mode=mode, robot_type=robot_type, before_swap=sign,
                         gr00t_modality=gr00t_modality)
