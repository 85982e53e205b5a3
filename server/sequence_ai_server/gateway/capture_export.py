"""Export of the episodes a deployment's workers kept (capture.py): a jsonl copy or a LeRobot
dataset, written where the caller says but never into, over or above the server's data dir, and
never over a folder this server did not write (its signed :data:`EXPORT_MARKER`).

Every export is built in a temp folder beside ``out`` and moved into place (``_staged_export``),
so a failure leaves ``out`` as it was.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from sequence_ai_data.marker import EXPORT_MARKER, is_marked, load_key, write_marker

from sequence_ai_server.worker.capture import CaptureError, read_episodes

__all__ = ["export_jsonl", "export_lerobot", "check_export_target", "is_own_export", "ExportRefused",
           "EXPORT_MARKER", "EXPORT_KEY_FILE", "DEFAULT_LEROBOT_VERSION"]

EXPORT_KEY_FILE = "export.key"               # <data_dir>/export.key: signs the markers (0600)
_EXPORT_MODES = ("new", "overwrite", "append")


class ExportRefused(CaptureError):
    """An export target the server will not write: the data dir, a folder inside or above it, a
    file, or a non-empty folder that is not an earlier export of this server (overwrite/append).
    The message names the path, the rule and what to do."""


def _export_key(data_dir: Path) -> bytes:
    """This server's export key (``<data_dir>/export.key``, 32 random bytes as hex, mode 0600),
    created on first use. Markers are signed with it, so a marker copied elsewhere does not count."""
    return load_key(Path(data_dir) / EXPORT_KEY_FILE)


def is_own_export(out: Path, data_dir: Path) -> bool:
    """True when ``out`` (a resolved directory) holds this server's export marker, signed for
    exactly that path. A missing, symlinked, unreadable or foreign marker is False."""
    return is_marked(out, _export_key(data_dir))


def _write_marker(target: Path, out: Path, data_dir: Path, fmt: str, deployment: Optional[str]) -> None:
    write_marker(target, out, _export_key(data_dir), server="sequence-ai gateway", format=fmt,
                 deployment=deployment)


def check_export_target(out: Any, data_dir: Path, mode: str = "new") -> Path:
    """Where an export may go: ``out`` resolved (symlinks and ``..``), checked against the rules.

    Rules: ``out`` is absolute; it is not the server's data dir, nor inside it, nor one of its
    ancestors; it is not a file; a non-empty ``out`` is refused for mode ``new``
    (DatasetExistsError) and, for ``overwrite``/``append``, unless it is an earlier export of this
    server (its :data:`EXPORT_MARKER`, signed for that path).

    Returns the resolved directory. Raises ExportRefused / CaptureError (invalid_request) or
    DatasetExistsError, each naming the path and what to do."""
    if mode not in _EXPORT_MODES:
        raise CaptureError(f"mode must be new, append or overwrite, got {mode!r}")
    try:
        os.fsencode(str(out))
        if "\x00" in str(out):
            raise ValueError("NUL byte")
    except ValueError:   # a NUL or a lone surrogate: no file system path (was a 500 from resolve())
        raise CaptureError(f"out {str(out)!r} is not a usable path (NUL byte or invalid unicode)") from None
    raw = Path(str(out))   # no ~ expansion: "~/x" is relative, and would land in the gateway user's home
    if not raw.is_absolute():
        raise CaptureError(f"out must be an absolute path (no ~), got {str(out)!r}")
    resolved = raw.resolve()
    data = Path(data_dir).resolve()
    where = f"{raw}" + (f" (resolves to {resolved})" if resolved != raw else "")
    if resolved == data:
        rule = "is the server's data dir"
    elif data in resolved.parents:
        rule = f"is inside the server's data dir {data}"
    elif resolved in data.parents:
        rule = f"is an ancestor of the server's data dir {data}"
    else:
        rule = None
    if rule:
        raise ExportRefused(f"refused: out {where} {rule}; an export never goes into or over the server's "
                            f"own state. Pick a folder outside {data}")
    if resolved.exists() and not resolved.is_dir():
        raise ExportRefused(f"refused: out {where} is a file, not a folder; pick a new or empty folder")
    if resolved.is_dir() and any(resolved.iterdir()):
        if mode == "new":
            from sequence_ai_data.lerobot import DatasetExistsError
            raise DatasetExistsError(f"{where} is not empty; pass --overwrite to replace an earlier export "
                                     "(or --append for lerobot)")
        if not is_own_export(resolved, data):
            raise ExportRefused(
                f"refused: out {where} is not empty and is not an earlier export of this server (no valid "
                f"{EXPORT_MARKER} in it); --{mode} only replaces an export this server wrote there. "
                "Pick a new or empty folder, or remove that folder yourself")
    return resolved


def _staged_export(out: Path, mode: str, data_dir: Path, fmt: str, deployment: Optional[str],
                   build: Any) -> dict:
    """Run ``build(target)`` (it creates the directory ``target`` and returns a summary) in a temp
    folder beside ``out``, sign it with the export marker and move it into place: a new ``out`` is
    renamed in; an empty one keeps its folder and gets the files; an earlier export of this server
    is swapped out and only then deleted. A failure anywhere leaves ``out`` as it was.

    ``out`` must come from :func:`check_export_target` (re-checked right before the swap)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        target = staging / "new"
        if mode == "append" and out.is_dir() and any(out.iterdir()):
            shutil.copytree(out, target, symlinks=True, ignore=shutil.ignore_patterns(EXPORT_MARKER))
        res = build(target)
        _write_marker(target, out, data_dir, fmt, deployment)
        check_export_target(out, data_dir, mode)   # nothing else was put there meanwhile
        if out.is_dir() and any(out.iterdir()):
            old = staging / "old"
            os.rename(out, old)
            try:
                os.rename(target, out)
            except BaseException:
                os.rename(old, out)
                raise
        elif out.is_dir():
            moved = []
            try:
                for child in sorted(target.iterdir()):
                    os.rename(child, out / child.name)
                    moved.append(out / child.name)
            except BaseException:
                for p in moved:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
                raise
        else:
            os.rename(target, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {**res, "out": str(out)}


def _copy_kept(directory: Path, target: Path) -> dict:
    target.mkdir()
    steps = n = 0
    for sub in ("episodes", "frames", "labels"):
        if (directory / sub).exists():
            shutil.copytree(directory / sub, target / sub, ignore=shutil.ignore_patterns(".*"))
    for p in (target / "episodes").glob("*.jsonl") if (target / "episodes").exists() else []:
        n += 1
        steps += sum(1 for _ in open(p, "rb"))
    return {"format": "jsonl", "episodes": n, "steps": steps}


def export_jsonl(directory: Path, out: Path, mode: str = "new", *, data_dir: Optional[Path] = None) -> dict:
    """Copy the kept files as they are (episodes/, frames/, labels/) to ``out``, built in a temp
    folder beside it and moved into place (:func:`_staged_export`); ``out`` gets the export marker.
    ``data_dir`` (default: ``directory``'s grandparent, the capture layout) is the server's, which
    ``out`` may not touch. Returns ``{"out", "format", "episodes", "steps"}``.
    Raises DatasetExistsError (``out`` not empty and mode new), ExportRefused (see
    :func:`check_export_target`), CaptureError (append)."""
    directory = Path(directory)
    data_dir = Path(data_dir) if data_dir is not None else directory.parent.parent
    if mode == "append":
        raise CaptureError("--append is for --format lerobot; jsonl exports are whole copies (use --overwrite)")
    target = check_export_target(out, data_dir, mode)
    return _staged_export(target, mode, data_dir, "jsonl", directory.name, lambda t: _copy_kept(directory, t))


# The LeRobot dataset format `seq policy data export --format lerobot` writes unless --version says
# otherwise: v2.1, the one the platform documents and the one every lerobot release before 0.4
# reads (openpi's training pipeline still reads it); "3.0" is what lerobot >= 0.4.0 reads.
DEFAULT_LEROBOT_VERSION = "2.1"


def export_lerobot(directory: Path, out: Path, *, version: str = DEFAULT_LEROBOT_VERSION, mode: str = "new",
                   fps: Optional[float] = None, robot_type: Optional[str] = None,
                   data_dir: Optional[Path] = None) -> dict:
    """Write every kept episode as a LeRobot dataset (``write_dataset``, v2.1 by default, or v3.0),
    built in a temp folder beside ``out`` and moved into place with the export marker (as
    :func:`export_jsonl`; ``append`` adds to an earlier export of this server). ``fps`` defaults
    to :func:`act_rate_hz`. Returns write_dataset's summary plus ``fps``.
    Raises ExportError (no kept episode, mismatched episodes), DatasetExistsError, ExportRefused."""
    from sequence_ai_data.episode import ExportError
    from sequence_ai_data.kept import act_rate_hz, frames_from_kept
    from sequence_ai_data.lerobot import write_dataset

    directory = Path(directory)
    data_dir = Path(data_dir) if data_dir is not None else directory.parent.parent
    target = check_export_target(out, data_dir, mode)
    episodes = list(read_episodes(directory))
    if not episodes:
        raise ExportError(f"no kept episodes in {directory}; turn capture on with `seq policy capture NAME --rate R`")
    rate = float(fps) if fps else act_rate_hz(episodes)
    frames = [frames_from_kept(directory, ep, steps, label, rate) for ep, steps, label in episodes]

    def build(t: Path) -> dict:
        return write_dataset(frames, t, version=version, mode="append" if t.exists() else "new",
                             robot_type=robot_type)
    res = _staged_export(target, mode, data_dir, "lerobot", directory.name, build)
    return {**res, "format": "lerobot", "fps": rate}
