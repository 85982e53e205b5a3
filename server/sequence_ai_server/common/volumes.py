"""Volumes: named, versioned directories of weights that a policy loads with
``weights="vol://NAME@vN"`` (or ``seq.Volume.from_name(NAME)`` for the newest version).

Where it sits: ``seq volume put NAME DIR`` uploads a directory through the gateway; the files
land under ``<data_dir>/volumes/NAME/`` and a worker whose policy names the volume gets that
version's directory as ``weights_dir`` in ``@seq.load``. Layout::

    volumes/NAME/.upload-vN/<files>     an upload in progress (resumable: the same manifest resumes it)
    volumes/NAME/vN/<files>             an active version: files 0444, directories 0555 (read-only)

An upload is three steps: ``begin`` (the manifest: every file's relative path, size and md5;
answers the version and how many bytes of each file the gateway holds already), ``write``
(bytes of one file at an offset; a write must continue where the file ends), ``complete``
(every file's size and md5 are checked, and only then is the version moved into place and made
active). A new put of the same name makes the next version. ``remove`` is refused while a
deployment's weights name the volume. State lives in the gateway's SQLite (``volumes`` table).

Self-hosted notes: "mounted read-only" is the files' mode bits (a policy running as root can
still write); ``vol://NAME`` without a version resolves to the newest active version when the
worker starts.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Optional

from sequence_ai_server.common.state_db import StateDB

__all__ = ["VolumeError", "VolumeStore", "resolve_volume", "parse_volume_uri"]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")     # as seq.Volume.from_name accepts
_URI = re.compile(r"^vol://([A-Za-z][A-Za-z0-9_.-]{0,62})(?:@v(\d+))?/?$")
MAX_FILES = 100_000
MAX_NAME_BYTES = 255       # one path part (NAME_MAX of Linux file systems)
MAX_PATH_BYTES = 2048      # a whole relative path (the volume root adds its own prefix under PATH_MAX)
MAX_UPLOAD_BYTES = 2 ** 53  # a volume version's bytes, all files together ($SEQ_VOLUME_MAX_BYTES may lower it)


def max_upload_bytes() -> int:
    """The largest volume version in bytes: ``$SEQ_VOLUME_MAX_BYTES`` capped at MAX_UPLOAD_BYTES
    (2**53: exact as a JSON number and an SQLite integer)."""
    try:
        return min(MAX_UPLOAD_BYTES, int(os.environ.get("SEQ_VOLUME_MAX_BYTES") or MAX_UPLOAD_BYTES))
    except ValueError:
        return MAX_UPLOAD_BYTES

_SCHEMA = """
CREATE TABLE IF NOT EXISTS volumes (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    state TEXT NOT NULL,            -- uploading | active
    manifest_json TEXT NOT NULL,    -- [{"path", "size", "md5"}]
    manifest_sha TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_at REAL NOT NULL,
    completed_at REAL,
    PRIMARY KEY (name, version)
);
"""


class VolumeError(ValueError):
    """A volume request that cannot be done. ``code`` is the API error code (invalid_request |
    not_found); the message names the problem and the fix."""

    def __init__(self, code: str, message: str, hint: Optional[str] = None):
        super().__init__(message)
        self.code, self.hint = code, hint


def parse_volume_uri(uri: str) -> tuple[str, Optional[int]]:
    """``"vol://ckpt@v2"`` -> ``("ckpt", 2)``; ``"vol://ckpt"`` -> ``("ckpt", None)``.
    Raises VolumeError (invalid_request) for anything else."""
    m = _URI.match(uri.strip())
    if not m:
        raise VolumeError("invalid_request", f"{uri!r} is not vol://NAME or vol://NAME@vN")
    return m.group(1), int(m.group(2)) if m.group(2) else None


def resolve_volume(volumes_dir: Path, uri: str) -> Path:
    """The directory of the active volume version ``uri`` names (newest when unversioned).
    Raises FileNotFoundError saying which volume or version is missing and how to add it."""
    name, version = parse_volume_uri(uri)
    root = Path(volumes_dir) / name
    active = sorted((int(p.name[1:]) for p in root.glob("v[0-9]*") if p.is_dir() and p.name[1:].isdigit()),
                    reverse=True) if root.is_dir() else []
    if not active:
        raise FileNotFoundError(f"weights {uri}: no volume named {name!r} here; upload it with "
                                f"`seq volume put {name} DIR`")
    if version is None:
        return root / f"v{active[0]}"
    if version not in active:
        raise FileNotFoundError(f"weights {uri}: volume {name!r} has no active v{version} "
                                f"(active: {', '.join(f'v{v}' for v in active)}); `seq volume ls` lists them")
    return root / f"v{version}"


def _safe_relpath(path: Any) -> str:
    """A manifest path: relative, '/'-separated, no '..', no empty parts, each part at most
    MAX_NAME_BYTES and the whole at most MAX_PATH_BYTES (UTF-8). Raises VolumeError."""
    if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
        raise VolumeError("invalid_request", f"file path {path!r} is not a relative POSIX path")
    p = PurePosixPath(path)
    if p.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise VolumeError("invalid_request", f"file path {path!r} must be relative with no '.' or '..' parts")
    longest = max(len(part.encode("utf-8", "surrogatepass")) for part in path.split("/"))
    if longest > MAX_NAME_BYTES or len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise VolumeError("invalid_request", f"file path {path[:60]!r}... is too long: at most {MAX_NAME_BYTES} bytes "
                          f"per name and {MAX_PATH_BYTES} in all", hint="rename the file (file systems refuse longer names)")
    return str(p)


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class VolumeStore:
    """The volumes of one gateway: rows of state.db's ``volumes`` table, through ``state`` (the
    gateway's Store), plus files under ``root``. ``in_use(name)`` is a callable answering which deployments use a volume (the
    gateway's), so ``remove`` can refuse."""

    def __init__(self, state: StateDB, root: Path, in_use: Callable[[str], list[str]]):
        self._sql, self.root = state, Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._in_use = in_use
        self._files_lock = threading.Lock()
        self._sql.ensure_schema(_SCHEMA)

    # -- helpers
    def _rows(self, name: str) -> list[dict]:
        with self._sql.read() as db:
            return [dict(r) for r in db.execute(
                "SELECT * FROM volumes WHERE name = ? ORDER BY version DESC", (name,))]

    def _row(self, name: str, version: int) -> dict:
        for r in self._rows(name):
            if r["version"] == version:
                return r
        raise VolumeError("not_found", f"volume {name!r} has no upload or version v{version}",
                          hint="start the upload again with `seq volume put NAME DIR`")

    @staticmethod
    def _check_name(name: str) -> None:
        if not _NAME.match(name or ""):
            raise VolumeError("invalid_request", f"volume name {name!r} is not valid",
                              hint="letters, digits, '_', '-' or '.', starting with a letter (up to 63)")

    def _staging(self, name: str, version: int) -> Path:
        return self._inside(self.root / name / f".upload-v{version}", f"the upload of {name!r} v{version}")

    def _inside(self, path: Path, what: str) -> Path:
        """``path`` when it resolves (symlinks, ``..``) inside the volumes root; else VolumeError
        invalid_request naming both (a link planted under the root never redirects a write or rm)."""
        root = self.root.resolve()
        real = Path(path).resolve()
        if real != root and root not in real.parents:
            raise VolumeError("invalid_request", f"{what}: {path} resolves to {real}, outside the volumes root {root}; refused",
                              hint="the volumes root holds only what the gateway wrote; remove the link there "
                                   "and run `seq volume put` again")
        return Path(path)

    # -- upload
    def begin(self, name: str, files: list[dict]) -> dict:
        """Start (or resume) an upload of ``files`` = ``[{"path", "size", "md5"}]``. The same
        manifest as an unfinished upload resumes it. Returns ``{"name", "version", "have": {path:
        bytes already held}}``. Raises VolumeError invalid_request for a bad manifest."""
        self._check_name(name)
        if not isinstance(files, list) or not files or len(files) > MAX_FILES:
            raise VolumeError("invalid_request", f"an upload needs 1 to {MAX_FILES} files, got "
                              f"{len(files) if isinstance(files, list) else type(files).__name__}",
                              hint="seq volume put NAME DIR uploads every file under DIR")
        manifest, seen = [], set()
        for f in files:
            path = _safe_relpath((f or {}).get("path"))
            size, md5 = f.get("size"), f.get("md5")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise VolumeError("invalid_request", f"{path}: size {size!r} is not a byte count")
            if not isinstance(md5, str) or not re.fullmatch(r"[0-9a-f]{32}", md5):
                raise VolumeError("invalid_request", f"{path}: md5 {md5!r} is not 32 hex digits")
            if path in seen:
                raise VolumeError("invalid_request", f"{path} appears twice in the manifest")
            seen.add(path)
            manifest.append({"path": path, "size": size, "md5": md5})
        total, bound = sum(x["size"] for x in manifest), max_upload_bytes()
        if total > bound:
            raise VolumeError("invalid_request", f"the manifest's files hold {total} bytes; a volume version may hold "
                              f"at most {bound} bytes", hint="split the files over several volumes")
        folders = {str(parent) for path in seen for parent in PurePosixPath(path).parents}
        clash = sorted(seen & folders)
        if clash:
            raise VolumeError("invalid_request", f"{clash[0]} is both a file and a folder in the manifest",
                              hint="a path names a file or a folder, not both; rename one of them")
        manifest.sort(key=lambda x: x["path"])
        sha = hashlib.sha256(json.dumps(manifest).encode()).hexdigest()
        # the versions are read and the new one inserted in one transaction: two uploads to a new
        # name at once get v1 and v2 (or, with the same manifest, the same resumed v1)
        with self._sql.transaction() as db:
            rows = [dict(r) for r in db.execute("SELECT * FROM volumes WHERE name = ? ORDER BY version DESC", (name,))]
            resume = next((r for r in rows if r["state"] == "uploading" and r["manifest_sha"] == sha), None)
            if resume is None:
                version = max([r["version"] for r in rows], default=0) + 1
                db.execute("INSERT INTO volumes (name, version, state, manifest_json, manifest_sha, size, "
                           "created_at) VALUES (?, ?, 'uploading', ?, ?, ?, ?)",
                           (name, version, json.dumps(manifest), sha, sum(x["size"] for x in manifest), time.time()))
            else:
                version = resume["version"]
        staging = self._staging(name, version)
        staging.mkdir(parents=True, exist_ok=True)
        have = {}
        for x in manifest:
            p = staging / x["path"]
            have[x["path"]] = p.stat().st_size if p.is_file() else 0
        return {"name": name, "version": version, "resumed": resume is not None, "have": have}

    def write(self, name: str, version: int, path: str, offset: int, data: bytes) -> dict:
        """Append ``data`` to ``path`` of an unfinished upload at ``offset`` (which must be the
        bytes held so far, or 0 to start the file over). Returns ``{"path", "size"}``."""
        row = self._row(name, version)
        if row["state"] != "uploading":
            raise VolumeError("invalid_request", f"volume {name!r} v{version} is complete; a new put makes v{version + 1}")
        path = _safe_relpath(path)
        want = {x["path"]: x for x in json.loads(row["manifest_json"])}.get(path)
        if want is None:
            raise VolumeError("invalid_request", f"{path} is not in the manifest of {name} v{version}")
        target = self._inside(self._staging(name, version) / path, f"{name} v{version}: {path}")
        with self._files_lock:
            target.parent.mkdir(parents=True, exist_ok=True)
            held = target.stat().st_size if target.is_file() else 0
            if offset not in (0, held):
                raise VolumeError("invalid_request", f"{path}: write at offset {offset} but {held} bytes are held",
                                  hint="resume from the held size (seq volume put does this for you)")
            if offset + len(data) > want["size"]:
                raise VolumeError("invalid_request", f"{path}: {offset + len(data)} bytes is more than the "
                                  f"manifest's {want['size']}")
            with open(target, "r+b" if offset and target.exists() else "wb") as f:
                f.seek(offset)
                f.write(data)
                f.truncate()
        return {"path": path, "size": offset + len(data)}

    def complete(self, name: str, version: int) -> dict:
        """Check every file's size and md5, then move the upload into place read-only and mark
        the version active. A mismatch raises VolumeError invalid_request naming the file (the
        upload stays, so the put can be resumed)."""
        row = self._row(name, version)
        if row["state"] == "active":
            return self.describe(name, version)
        staging = self._staging(name, version)
        for x in json.loads(row["manifest_json"]):
            p = staging / x["path"]
            size = p.stat().st_size if p.is_file() else -1
            if size != x["size"]:
                raise VolumeError("invalid_request", f"{x['path']}: {max(size, 0)} of {x['size']} bytes arrived",
                                  hint="run the same `seq volume put` again; it resumes")
            got = _md5(p)
            if got != x["md5"]:
                p.unlink()
                raise VolumeError("invalid_request", f"{x['path']}: md5 {got} does not match the manifest's {x['md5']}",
                                  hint="the file changed or was corrupted in transit; run `seq volume put` again")
        final = self._inside(self.root / name / f"v{version}", f"volume {name!r} v{version}")
        for dirpath, dirnames, filenames in os.walk(staging):
            for f in filenames:
                os.chmod(os.path.join(dirpath, f), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        for dirpath, _, _ in os.walk(staging, topdown=False):
            os.chmod(dirpath, 0o555)
        os.replace(staging, final)
        with self._sql.transaction() as db:
            db.execute("UPDATE volumes SET state = 'active', completed_at = ? WHERE name = ? AND version = ?",
                       (time.time(), name, version))
        return self.describe(name, version)

    # -- views and removal
    def describe(self, name: str, version: int) -> dict:
        """``{"name", "version", "state", "size", "files", "created_at", "completed_at", "uri"}``."""
        r = self._row(name, version)
        return {"name": name, "version": version, "state": r["state"], "size": r["size"],
                "files": len(json.loads(r["manifest_json"])), "created_at": r["created_at"],
                "completed_at": r["completed_at"], "uri": f"vol://{name}@v{version}"}

    def list(self, limit: int = 50, cursor: Optional[str] = None) -> dict:
        """One row per volume (its newest version, active if any): ``{"volumes": [...], "next_cursor"}``;
        ``cursor`` is the last name of the previous page."""
        with self._sql.read() as db:
            names = [r[0] for r in db.execute("SELECT DISTINCT name FROM volumes ORDER BY name")]
        if cursor:
            names = [n for n in names if n > cursor]
        out = []
        for n in names[:limit]:
            rows = self._rows(n)
            active = [r for r in rows if r["state"] == "active"]
            top = active[0] if active else rows[0]
            out.append({**self.describe(n, top["version"]), "versions": [r["version"] for r in active],
                        "uploading": [r["version"] for r in rows if r["state"] == "uploading"],
                        "used_by": self._in_use(n)})
        return {"volumes": out, "next_cursor": names[limit - 1] if len(names) > limit else None}

    def remove(self, name: str) -> dict:
        """Delete every version of ``name``. Refused (invalid_request) while a deployment uses it;
        not_found when there is none."""
        self._check_name(name)
        if not self._rows(name):
            raise VolumeError("not_found", f"no volume named {name!r}", hint="`seq volume ls` lists them")
        users = self._in_use(name)
        if users:
            raise VolumeError("invalid_request", f"volume {name!r} is used by deployment(s) {', '.join(users)}; not removed",
                              hint=f"remove those first (`seq policy rm {users[0]}`)")
        root = self._inside(self.root / name, f"volume {name!r}")
        if root.is_symlink():
            raise VolumeError("invalid_request", f"volume {name!r}: {root} is a link, not a folder the gateway wrote; "
                              "refused", hint=f"remove the link {root} yourself")
        for dirpath, _, _ in os.walk(root):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(root, ignore_errors=True)
        with self._sql.transaction() as db:
            db.execute("DELETE FROM volumes WHERE name = ?", (name,))
        return {"name": name, "removed": True}
