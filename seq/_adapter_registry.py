"""Talking to the gateway about adapters: register a local file, resolve ``NAME[@vN]`` or
``FILE[:CLASS]`` to a registered version, fetch a version's text.

Used by ``seq deploy adapter.py``, ``seq adapter ...``, ``seq eval run --adapter`` and
``seq.adapter_source()``. The gateway side is ``sequence_ai_server/gateway/adapters.py``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from ._adapter import file_declares_adapter, get_adapter_spec, load_adapter_file

__all__ = ["register_file", "resolve", "fetch_version", "parse_ref", "split_file_ref"]

_REF = re.compile(r"^([a-z][a-z0-9-]*)(?:@v?(\d+))?$")


def parse_ref(ref: str) -> Optional[tuple[str, Optional[int]]]:
    """``"toy-adapter@v2"`` -> ("toy-adapter", 2); ``"toy-adapter"`` -> ("toy-adapter", None);
    None when ``ref`` is not a registry reference (a file path)."""
    m = _REF.match(ref.strip())
    if not m:
        return None
    return m.group(1), int(m.group(2)) if m.group(2) else None


def split_file_ref(ref: str) -> tuple[Path, Optional[str]]:
    """``"dir/adapter.py:ToyAdapter"`` -> (path, "ToyAdapter"); ``"dir/adapter.py"`` -> (path, None)."""
    if Path(ref).expanduser().exists():
        return Path(ref).expanduser().resolve(), None
    file, sep, cls = ref.rpartition(":")
    if sep and file.endswith(".py"):
        return Path(file).expanduser().resolve(), cls or None
    return Path(ref).expanduser().resolve(), None


def register_file(gw: Any, path: Path, class_name: Optional[str] = None) -> dict:
    """Read ``path``'s ``@seq.adapter`` declaration (importing the file) and register its text.

    Returns the gateway's record (``version``, ``created``: False when this exact file was
    already a version). Raises FileNotFoundError, LookupError, the module's own import error
    (a DeclarationError for a malformed declaration), or the gateway's GatewayError (seq.gateway_client).
    """
    cls = load_adapter_file(str(path), class_name)
    spec = get_adapter_spec(cls)
    return gw.call("POST", "/v1/adapters", json={
        "name": spec.name, "class_name": cls.__name__, "filename": path.name,
        "source": path.read_text(encoding="utf-8"), "spec": spec.to_dict()})


def resolve(gw: Any, ref: str) -> dict:
    """The registered version ``ref`` names, with its ``path`` and ``source``.

    ``NAME`` is the latest version, ``NAME@vN`` (or ``NAME@N``) that one; a ``FILE.py[:CLASS]``
    is registered first (the same file again is the version it already is). Raises the
    gateway's GatewayError (not_found ...), FileNotFoundError, LookupError, DeclarationError.
    """
    parsed = parse_ref(ref)
    if parsed is not None and not ref.endswith(".py"):
        name, version = parsed
        return gw.call("GET", f"/v1/adapters/{name}/versions/{version if version is not None else 'latest'}")
    path, cls = split_file_ref(ref)
    if not path.is_file():
        raise FileNotFoundError(f"no adapter {ref!r}: not a registered name (NAME or NAME@vN) and no such file")
    if not file_declares_adapter(path):
        raise LookupError(f"{path.name} has no @seq.adapter class")
    rec = register_file(gw, path, cls)
    return gw.call("GET", f"/v1/adapters/{rec['name']}/versions/{rec['version']}")


def fetch_version(name: str, version: Optional[int] = None, *, gateway_url: Optional[str] = None,
                  api_key: Optional[str] = None) -> dict:
    """A registered version's record with its ``source``. Raises LookupError (unknown adapter
    or version) or RuntimeError (any other refusal, naming the gateway's code)."""
    from .gateway_client import GatewayClient, GatewayError
    try:
        gw = GatewayClient(gateway_url, api_key, None)
        return gw.call("GET", f"/v1/adapters/{name}/versions/{version if version is not None else 'latest'}")
    except GatewayError as exc:
        if exc.code == "not_found":
            raise LookupError(exc.detail) from None
        raise RuntimeError(f"{exc.code}: {exc.detail}") from None
