"""Export markers: how an exporting tool recognizes a folder it wrote itself.

Every export (the gateway's capture export, ``sequence-ai bag export``) leaves
:data:`EXPORT_MARKER` inside the folder it wrote: a JSON file with a random ``export_id`` and an
HMAC-SHA256 of ``export_id`` and the folder's resolved path, keyed by the tool's own key file.
``--overwrite``/``--append`` replace a non-empty folder only when it holds a marker that verifies
for exactly that path with that key (:func:`is_marked`): a marker copied elsewhere, one written
with another key, or a symlinked marker does not count -- so a tool never deletes a folder it did
not create.

Stdlib only, so both the gateway's capture export (``sequence_ai_server.worker.capture``) and
``sequence-ai bag export`` (:mod:`sequence_ai_data.lerobot`) use it.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from pathlib import Path

#: File name of the marker inside every export folder.
EXPORT_MARKER = ".sequence-ai-export.json"


def load_key(path: Path) -> bytes:
    """The key in file ``path`` (32 random bytes as hex, mode 0600), created on first use.

    The file appears whole, once (written aside and hard-linked into place): two processes
    creating it together read the same key. Raises OSError when the folder cannot be written.
    """
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip().encode()


def marker_mac(key: bytes, out: Path, export_id: str) -> str:
    """HMAC-SHA256 (hex) of ``export_id`` and the export folder's path ``out``."""
    return hmac.new(key, f"{export_id}\n{out}".encode(), hashlib.sha256).hexdigest()


def is_marked(out: Path, key: bytes) -> bool:
    """True when folder ``out`` (resolved) holds an :data:`EXPORT_MARKER` signed with ``key`` for
    exactly that path. A missing, symlinked, unreadable or foreign marker is False."""
    marker = Path(out) / EXPORT_MARKER
    try:
        if marker.is_symlink() or not marker.is_file():
            return False
        d = json.loads(marker.read_text())
        export_id, mac = str(d["export_id"]), str(d["mac"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return hmac.compare_digest(marker_mac(key, Path(out), export_id), mac)


def write_marker(target: Path, out: Path, key: bytes, **fields) -> None:
    """Write :data:`EXPORT_MARKER` into ``target`` (the staged folder that will be renamed to
    ``out``), signed for ``out``; ``fields`` (JSON values: who wrote it, the format, ...) are
    kept beside ``export_id``, ``path``, ``created_at`` (s since the epoch) and ``mac``."""
    export_id = secrets.token_hex(16)
    (Path(target) / EXPORT_MARKER).write_text(json.dumps({
        "export_id": export_id, **fields, "path": str(out), "created_at": time.time(),
        "mac": marker_mac(key, Path(out), export_id)}, indent=2))
