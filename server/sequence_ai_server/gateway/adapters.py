"""Registered adapters: versioned copies of ``@seq.adapter`` files, kept by the gateway.

An adapter has no machine: registering one builds nothing and starts nothing. ``seq deploy
adapter.py`` reads the declaration locally and sends the file's text with it; the gateway keeps
``<data_dir>/adapters/<name>/v<N>/<file>`` plus ``adapter.json`` (the declaration, the sha256 of
the text, when). The same text again is the version it already is; a changed one is the next
version. The gateway never imports the file (the eval's env processes do).

Routes (``routes/adapters.py``; account key: an adapter belongs to the account, not to one deployment):

- ``POST /v1/adapters`` ``{"name", "class_name", "filename", "source", "spec"}`` ->
  ``{"name", "version", "created": bool, "sha256", "class_name", "filename", "spec", "lossy", "created_at"}``
- ``GET /v1/adapters`` -> ``{"adapters": [{"name", "latest", "versions", "lossy", "policy_io", "created_at"}]}``
- ``GET /v1/adapters/{name}`` -> ``{"name", "versions": [record, ...]}``
- ``GET /v1/adapters/{name}/versions/{version}`` -> record plus ``"source"`` and ``"path"``
  (``version`` may be ``latest``).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Optional

from pydantic import BaseModel

from sequence_ai_server.common.errors import ApiError

__all__ = ["AdapterStore", "AdapterRegister", "MAX_SOURCE_BYTES"]

MAX_SOURCE_BYTES = 1024 * 1024
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_FILENAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}\.py$")
_CLASS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,100}$")


class AdapterRegister(BaseModel):
    """``seq deploy adapter.py``: the file's text and the declaration the CLI read from it."""

    name: str
    class_name: str
    filename: str
    source: str
    spec: dict


class AdapterStore:
    """The adapters under ``root`` (``<data_dir>/adapters``). Thread-safe; writes are atomic
    (a version directory appears whole or not at all)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()

    def _versions(self, name: str) -> list[dict]:
        folder = self.root / name
        out = []
        if folder.is_dir():
            for d in folder.iterdir():
                meta = d / "adapter.json"
                if d.is_dir() and re.fullmatch(r"v\d+", d.name) and meta.is_file():
                    try:
                        out.append(json.loads(meta.read_text()))
                    except ValueError:
                        continue
        return sorted(out, key=lambda r: r["version"])

    def register(self, body: AdapterRegister) -> dict:
        """Keep ``body.source`` as a version of ``body.name``: the existing version with the same
        text, or the next one. Raises ApiError(invalid_request) naming a bad field."""
        if not _NAME.match(body.name):
            raise ApiError("invalid_request", f"{body.name!r} is not an adapter name",
                           hint='lower-case letters, digits and dashes, e.g. "toy-adapter"')
        if not _FILENAME.match(body.filename):
            raise ApiError("invalid_request", f"{body.filename!r} is not a plain .py file name")
        if not _CLASS.match(body.class_name):
            raise ApiError("invalid_request", f"{body.class_name!r} is not a class name")
        data = body.source.encode("utf-8")
        if len(data) > MAX_SOURCE_BYTES:
            raise ApiError("invalid_request", f"the adapter file is {len(data)} bytes; at most {MAX_SOURCE_BYTES}",
                           hint="an adapter is one small file; keep models and data out of it")
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            versions = self._versions(body.name)
            for rec in versions:
                if rec["sha256"] == digest and rec["class_name"] == body.class_name:
                    return {**rec, "created": False}
            version = (versions[-1]["version"] + 1) if versions else 1
            spec = dict(body.spec)
            rec = {"name": body.name, "version": version, "sha256": digest, "class_name": body.class_name,
                   "filename": body.filename, "spec": spec, "lossy": list(spec.get("lossy") or []),
                   "policy_io": spec.get("policy_io"), "created_at": time.time()}
            folder = self.root / body.name
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".v{version}.{os.getpid()}.tmp"
            tmp.mkdir()
            (tmp / body.filename).write_bytes(data)
            (tmp / "adapter.json").write_text(json.dumps(rec, indent=2))
            os.replace(tmp, folder / f"v{version}")
        return {**rec, "created": True}

    def list(self) -> list[dict]:
        """One line per adapter: its latest version, how many, whether the latest is lossy."""
        out = []
        if self.root.is_dir():
            for d in sorted(self.root.iterdir()):
                versions = self._versions(d.name) if d.is_dir() else []
                if versions:
                    last = versions[-1]
                    out.append({"name": d.name, "latest": last["version"], "versions": len(versions),
                                "lossy": bool(last["lossy"]), "policy_io": last.get("policy_io"),
                                "created_at": last["created_at"]})
        return out

    def versions(self, name: str) -> list[dict]:
        """Every version of ``name``, oldest first. Raises ApiError(not_found)."""
        versions = self._versions(name) if _NAME.match(name) else []
        if not versions:
            raise ApiError("not_found", f"no adapter named {name!r}", hint="`seq adapter ls` lists them; "
                           "`seq deploy adapter.py` registers one")
        return versions

    def get(self, name: str, version: Optional[int]) -> dict:
        """One version (None: the latest) with its ``source`` and ``path``. Raises ApiError(not_found)."""
        versions = self.versions(name)
        if version is None:
            rec = versions[-1]
        else:
            found = [r for r in versions if r["version"] == version]
            if not found:
                raise ApiError("not_found", f"adapter {name!r} has no v{version}",
                               hint=f"its versions: {', '.join('v%d' % r['version'] for r in versions)}")
            rec = found[0]
        path = self.root / name / f"v{rec['version']}" / rec["filename"]
        return {**rec, "path": str(path), "source": path.read_text(encoding="utf-8")}
