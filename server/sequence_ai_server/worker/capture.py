"""Field data kept by the worker: capture, labels, retention and export (the server side).

Where it sits: beside the /act path, never in it. The gateway owns the settings and writes them
to ``<data_dir>/capture/<name>/config.json``; every worker of that deployment is started with
``$SEQ_CAPTURE_DIR`` pointing there and re-reads the file (at most every
``$SEQ_CAPTURE_POLL_S``, default 2 s) on its own writer thread -- so ``seq policy capture`` takes
effect on running workers within seconds, with no redeploy.

Per /act the worker's only extra work is :meth:`CaptureWriter.offer`: a hash of the episode id
against the rate and, when the episode is kept, one ``put_nowait`` of references it already holds
(raw body, params, chunk). The writer thread re-parses the body, writes the frames (``--images``
only) and appends one JSON line. A full queue drops the step (counted, logged) rather than wait.

Layout under ``<data_dir>/capture/<name>/``::

    config.json                       {"enabled", "rate", "images", "retention_days", "updated_at"}
    episodes/<ep>.jsonl               one line per /act: {"episode_id", "step", "t", "request_id",
                                      "observation" (images -> {"view", "timestamp_ms", "file"}),
                                      "params", "chunk", "inference_ms"}
    frames/<ep>/<step>_<view>_<k>.jpg the frames as sent (JPEG or PNG bytes), with --images only
    labels/<ep>.json                  {"episode_id", "success", "notes", "t"}

``<ep>`` is the episode id when it is a plain file name, else its SHA-256 (the id is inside).
Sampling is per episode: an episode is kept when ``sha256(episode_id)`` maps below the rate, so
every /act of a kept episode is kept and no worker needs to remember a decision. A request with
no episode id is its own episode (its request id). Retention: an episode whose last write is
older than ``retention_days`` is deleted with its frames and label (worker: every minute;
gateway: on every ``GET``/export). ``Gateway.remove`` deletes the whole directory.

The export of kept episodes (jsonl copy or LeRobot dataset) is ``capture_export.py``; the
gateway's routes are ``routes/capture.py``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

log = logging.getLogger("sequence_ai_server.worker.capture")

__all__ = ["CaptureConfig", "CaptureError", "CaptureWriter", "capture_dir", "episode_key", "keeps", "prune",
           "summary", "write_label", "read_episodes", "DEFAULT_RETENTION_DAYS"]

DEFAULT_RETENTION_DAYS = 30.0     # days a kept episode lives unless --retention-days says otherwise
CONFIG_POLL_S = 2.0               # how often a worker re-reads config.json (a stat; read on change)
PRUNE_EVERY_S = 60.0              # how often a worker enforces retention
QUEUE_MAX = 1024                  # steps waiting for the writer before offer() drops
_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")


class CaptureError(ValueError):
    """Bad capture settings or export arguments (the message says what to change)."""


def capture_dir(data_dir: Path, name: str) -> Path:
    """``<data_dir>/capture/<name>``: where one deployment's kept episodes live."""
    return Path(data_dir) / "capture" / name


def episode_key(episode_id: str) -> str:
    """File-name form of an episode id: the id itself when safe, else its SHA-256 hex."""
    return episode_id if _SAFE.match(episode_id) else hashlib.sha256(episode_id.encode()).hexdigest()


def keeps(episode_id: str, rate: float) -> bool:
    """True when the episode falls in the kept share ``rate`` (0..1), the same on every worker."""
    if rate >= 1.0:
        return True
    if rate <= 0.0:
        return False
    h = int.from_bytes(hashlib.sha256(episode_id.encode()).digest()[:8], "big")
    return h / 2.0 ** 64 < rate


class CaptureConfig:
    """The capture settings of one deployment.

    Attributes: enabled (bool), rate (share of episodes kept, 0 < rate <= 1), images (keep camera
    frames), retention_days (days a kept episode lives after its last write; default 30, spec)."""

    def __init__(self, enabled: bool = False, rate: float = 0.0, images: bool = False,
                 retention_days: float = DEFAULT_RETENTION_DAYS, updated_at: float = 0.0):
        self.enabled, self.rate, self.images = bool(enabled), float(rate), bool(images)
        self.retention_days, self.updated_at = float(retention_days), float(updated_at)

    @classmethod
    def load(cls, directory: Path) -> "CaptureConfig":
        """Read ``config.json`` (absent or unreadable -> capture off)."""
        try:
            d = json.loads((Path(directory) / "config.json").read_text())
            return cls(d.get("enabled", False), d.get("rate", 0.0), d.get("images", False),
                       d.get("retention_days", DEFAULT_RETENTION_DAYS), d.get("updated_at", 0.0))
        except (OSError, ValueError, TypeError, AttributeError):
            return cls()

    def save(self, directory: Path) -> None:
        """Write ``config.json`` atomically (a worker never reads half a file)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".config.{os.getpid()}.{threading.get_ident()}.tmp"
        tmp.write_text(json.dumps(self.to_dict()))
        os.replace(tmp, directory / "config.json")

    def to_dict(self) -> dict:
        return {"enabled": self.enabled, "rate": self.rate, "images": self.images,
                "retention_days": self.retention_days, "updated_at": self.updated_at}


# ---------------------------------------------------------------- the worker side

class CaptureWriter:
    """Keeps the sampled episodes of one worker: ``offer`` on the /act path, a thread writes.

    Args:
        directory: ``<data_dir>/capture/<name>`` (from ``$SEQ_CAPTURE_DIR``).
        poll_s: config re-read period in s (default ``$SEQ_CAPTURE_POLL_S`` or 2 s).
    """

    def __init__(self, directory: Path, poll_s: Optional[float] = None):
        self.dir = Path(directory)
        self.poll_s = float(poll_s if poll_s is not None else os.environ.get("SEQ_CAPTURE_POLL_S", CONFIG_POLL_S))
        self.config = CaptureConfig.load(self.dir)
        self._mtime: Optional[float] = None
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue(maxsize=QUEUE_MAX)
        self._steps: dict[str, int] = {}
        self.dropped = 0
        self.written = 0
        self._next_prune = 0.0
        self._thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls) -> Optional["CaptureWriter"]:
        """A writer for ``$SEQ_CAPTURE_DIR`` (set by the gateway), or None when unset."""
        d = os.environ.get("SEQ_CAPTURE_DIR")
        return cls(Path(d)) if d else None

    def offer(self, raw: bytes, content_type: str, episode_id: Optional[str], params: dict, chunk: Any,
              request_id: str, inference_ms: float) -> bool:
        """Queue one /act for the writer when its episode is kept; never blocks, never raises.
        Returns True when queued."""
        cfg = self.config
        if not cfg.enabled:
            return False
        ep = episode_id or request_id
        if not keeps(ep, cfg.rate):
            return False
        try:
            self._queue.put_nowait((bytes(raw), content_type, ep, params, chunk, request_id, inference_ms,
                                    time.time(), cfg.images))
            return True
        except queue.Full:
            self.dropped += 1
            if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                log.warning("capture queue full: %d step(s) not kept (the disk is slower than /act)", self.dropped)
            return False

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued step is on disk (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the thread."""
        self.flush(timeout)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout)

    # -- the writer thread
    def _reload(self) -> None:
        try:
            m = (self.dir / "config.json").stat().st_mtime
        except OSError:
            m = None
        if m != self._mtime:
            self._mtime = m
            self.config = CaptureConfig.load(self.dir)
            log.info("capture: %s", self.config.to_dict())

    def _run(self) -> None:
        next_poll = 0.0
        while True:
            now = time.monotonic()
            if now >= next_poll:
                self._reload()
                next_poll = now + self.poll_s
            if now >= self._next_prune:
                self._next_prune = now + PRUNE_EVERY_S
                try:
                    prune(self.dir, self.config.retention_days)
                except Exception:   # noqa: BLE001 - retention never stops the writer
                    log.exception("capture: prune failed")
            try:
                item = self._queue.get(timeout=min(self.poll_s, 0.5))
            except queue.Empty:
                continue
            try:
                if item is None:
                    return
                self._write(*item)
                self.written += 1
            except Exception:   # noqa: BLE001 - a bad step is logged, the writer goes on
                log.exception("capture: a step could not be written")
            finally:
                self._queue.task_done()

    def _write(self, raw: bytes, content_type: str, ep: str, params: dict, chunk: Any, request_id: str,
               inference_ms: float, t: float, images: bool) -> None:
        from sequence_ai_server.worker.act_body import frame_data, parse_act_body
        body, blobs = parse_act_body(raw, content_type)
        key = episode_key(ep)
        path = self.dir / "episodes" / f"{key}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        step = self._steps.get(key)
        if step is None:   # another process (a version built beside) may have started this file
            step = sum(1 for _ in open(path, "rb")) if path.exists() else 0
        self._steps[key] = step + 1
        obs = dict(body.get("observation") or {})
        kept_images = []
        for k, frame in enumerate(obs.get("images") or []):
            if not isinstance(frame, dict):
                continue
            entry = {"view": frame.get("view"), "timestamp_ms": frame.get("timestamp_ms")}
            if images:
                data = bytes(frame_data(frame, f"view {frame.get('view')!r}", blobs))
                ext = "png" if data[:4] == b"\x89PNG" else "jpg"
                view = re.sub(r"[^A-Za-z0-9_.\-]", "_", str(frame.get("view")))
                rel = f"frames/{key}/{step:06d}_{view}_{k}.{ext}"
                (self.dir / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.dir / rel).write_bytes(data)
                entry["file"] = rel
            kept_images.append(entry)
        obs["images"] = kept_images
        obs.pop("depth", None)   # depth frames are not kept (not part of a LeRobot frame)
        line = {"episode_id": ep, "step": step, "t": t, "request_id": request_id, "observation": obs,
                "params": params, "chunk": chunk, "inference_ms": inference_ms}
        with open(path, "a") as f:
            f.write(json.dumps(line, separators=(",", ":"), default=_jsonable) + "\n")


def _jsonable(v: Any) -> Any:
    if hasattr(v, "tolist"):
        return v.tolist()
    return str(v)


# ---------------------------------------------------------------- shared: retention, labels, reading

def prune(directory: Path, retention_days: float, now: Optional[float] = None) -> int:
    """Delete kept episodes (file, frames, label) whose last write is older than
    ``retention_days``; returns how many were deleted."""
    directory = Path(directory)
    cutoff = (now if now is not None else time.time()) - float(retention_days) * 86400.0
    removed = 0
    for path in sorted((directory / "episodes").glob("*.jsonl")):
        try:
            if path.stat().st_mtime >= cutoff:
                continue
        except FileNotFoundError:
            continue
        key = path.stem
        path.unlink(missing_ok=True)
        shutil.rmtree(directory / "frames" / key, ignore_errors=True)
        (directory / "labels" / f"{key}.json").unlink(missing_ok=True)
        removed += 1
    for label in (directory / "labels").glob("*.json"):   # labels of episodes never kept
        if not (directory / "episodes" / f"{label.stem}.jsonl").exists() and label.stat().st_mtime < cutoff:
            label.unlink(missing_ok=True)
    return removed


def summary(directory: Path) -> dict:
    """What is kept: settings, episode and step counts, labeled episodes, bytes on disk, oldest."""
    directory = Path(directory)
    cfg = CaptureConfig.load(directory)
    files = sorted((directory / "episodes").glob("*.jsonl"))
    steps = 0
    for p in files:
        with open(p, "rb") as f:
            steps += sum(1 for _ in f)
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) if directory.exists() else 0
    labeled = sum(1 for p in files if (directory / "labels" / f"{p.stem}.json").exists())
    mtimes = [p.stat().st_mtime for p in files]
    return {**cfg.to_dict(), "episodes": len(files), "steps": steps, "labeled": labeled, "bytes": size,
            "oldest": min(mtimes) if mtimes else None, "newest": max(mtimes) if mtimes else None,
            "dir": str(directory)}


MAX_LABEL_NOTES = 4096   # characters of a label's notes (POST /v1/episodes/{id}/label)
MAX_UNKEPT_LABELS = 10_000   # label files per deployment for episodes not kept ($SEQ_MAX_UNKEPT_LABELS)


def _max_unkept_labels() -> int:
    try:
        return int(os.environ.get("SEQ_MAX_UNKEPT_LABELS") or MAX_UNKEPT_LABELS)
    except ValueError:
        return MAX_UNKEPT_LABELS


def write_label(directory: Path, episode_id: str, success: bool, notes: str = "") -> bool:
    """Store an episode's label; returns True when the episode is kept (a label for one not
    (yet) written is stored too: the writer may still be behind).

    Raises CaptureError when ``notes`` is over MAX_LABEL_NOTES characters, or when the label is
    new, its episode is not kept and the deployment already holds ``$SEQ_MAX_UNKEPT_LABELS``
    (default MAX_UNKEPT_LABELS) labels of episodes not kept (retention prunes those after
    ``retention_days``). Labels of kept episodes, and rewrites of a stored label, are not bounded."""
    if len(notes) > MAX_LABEL_NOTES:
        raise CaptureError(f"notes is {len(notes)} characters; a label's notes may hold at most {MAX_LABEL_NOTES}")
    key = episode_key(episode_id)
    d = Path(directory) / "labels"
    d.mkdir(parents=True, exist_ok=True)
    episodes = Path(directory) / "episodes"
    if not (episodes / f"{key}.jsonl").exists() and not (d / f"{key}.json").exists():
        bound = _max_unkept_labels()
        unkept = sum(1 for p in d.glob("*.json") if not (episodes / f"{p.stem}.jsonl").exists())
        if unkept >= bound:
            raise CaptureError(f"this deployment already holds {unkept} labels of episodes the server has not kept "
                               f"(the bound is {bound}); label episodes that capture kept, or wait for retention "
                               "to prune old labels")
    tmp = d / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(json.dumps({"episode_id": episode_id, "success": bool(success), "notes": notes, "t": time.time()}))
    os.replace(tmp, d / f"{key}.json")
    return (Path(directory) / "episodes" / f"{key}.jsonl").exists()


def read_episodes(directory: Path) -> Iterator[tuple[str, list[dict], Optional[dict]]]:
    """Yield ``(episode_id, steps, label)`` per kept episode, oldest first; steps sorted by step
    (a torn last line, from a killed worker, is skipped)."""
    directory = Path(directory)
    files = sorted((directory / "episodes").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    for p in files:
        steps = []
        for text in p.read_text().splitlines():
            try:
                steps.append(json.loads(text))
            except ValueError:
                continue
        if not steps:
            continue
        steps.sort(key=lambda s: s.get("step", 0))
        label = None
        lp = directory / "labels" / f"{p.stem}.json"
        if lp.exists():
            try:
                label = json.loads(lp.read_text())
            except ValueError:
                label = None
        yield steps[0]["episode_id"], steps, label
