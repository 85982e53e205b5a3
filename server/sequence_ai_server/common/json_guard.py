"""Strings a server cannot store or echo: a JSON body whose strings hold a NUL or an unpaired
surrogate (``"\\u0000"``, ``"\\ud800"``) is refused 400 ``invalid_request`` before any route sees
it, naming the JSON path of the first offender (``details={"reason": "bad_string", "path": ...}``).

:func:`check_strings` is that check, written once: ``JsonStringGuard`` (pure ASGI middleware for
the gateway's and the worker's HTTP routes) and the worker's websocket act channel both call it.
It checks ``application/json`` bodies and the JSON part of the binary ``/act`` framing (``>I``
length, the JSON, the blobs). Install the middleware inside the credentials check and the
body-size cap: it buffers the body (at most ``max_bytes``; a longer one is passed on unchecked
for the size cap to refuse). Rendering such a string safely in an error message is
``errors.scrub``.
"""
from __future__ import annotations

import json
import re
import struct
from typing import Any, Optional

from sequence_ai_core.protocol import BINARY_CONTENT_TYPE, JSON_CONTENT_TYPE, MAX_BODY_BYTES

from sequence_ai_server.common.errors import ApiError, new_request_id, scrub

__all__ = ["JsonStringGuard", "first_bad_string", "check_json", "check_strings", "json_part"]

# cheap prefilter on the raw bytes: a \u escape of NUL or of a surrogate (raw surrogate bytes fail a strict decode)
_SUSPECT = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def _bad(s: str) -> Optional[str]:
    if "\x00" in s:
        return "a NUL character"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"an unpaired surrogate (\\u{ord(s[exc.start]):04x})"
    return None


def _show(key: str) -> str:
    """``key`` printable in a JSON path: a NUL as ``\\x00``, a lone surrogate as ``\\udXXX``."""
    return scrub(key).replace("\x00", "\\x00")


def first_bad_string(obj: Any, path: str = "$") -> Optional[tuple[str, str]]:
    """The first string (object keys too) in parsed JSON ``obj`` holding a NUL or an unpaired
    surrogate: ``(JSON path like "$.params.fail" or "$.files[0].path", what is wrong)``, else None."""
    stack = [(obj, path)]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            what = _bad(value)
            if what:
                return where, what
        elif isinstance(value, dict):
            items = []
            for k, v in value.items():
                kp = f"{where}.{_show(k)}"
                what = _bad(k)
                if what:
                    return kp, what + " in the key"
                items.append((v, kp))
            stack.extend(reversed(items))
        elif isinstance(value, list):
            stack.extend(reversed([(v, f"{where}[{i}]") for i, v in enumerate(value)]))
    return None


def check_json(text: bytes) -> Optional[tuple[str, str]]:
    """``first_bad_string`` of the JSON ``text`` (bytes); None when it holds none, or is not JSON
    (the route reports that). Parses only when the bytes could hold an offender."""
    try:
        text.decode("utf-8")
        if not _SUSPECT.search(text):
            return None
    except UnicodeDecodeError:
        pass
    try:
        return first_bad_string(json.loads(text))
    except (ValueError, RecursionError):
        return None


def json_part(body: bytes, content_type: str) -> Optional[bytes]:
    """The JSON an /act-style body holds: all of a JSON body, the JSON part of the binary
    framing; None for another content type (or a binary body too short for its length)."""
    if content_type.startswith(JSON_CONTENT_TYPE):
        return body
    if content_type.startswith(BINARY_CONTENT_TYPE) and len(body) >= 4:
        (n,) = struct.unpack_from(">I", body, 0)
        return body[4:4 + n]
    return None


def check_strings(body: bytes, content_type: str) -> None:
    """Raise 400 ``invalid_request`` (``details.reason`` ``bad_string``, ``details.path`` the
    JSON path) when the JSON in ``body`` (:func:`json_part`) holds a NUL or an unpaired surrogate
    in a string or key; a body that is not JSON, or holds none, passes."""
    part = json_part(body, content_type)
    bad = check_json(part) if part is not None else None
    if bad is not None:
        path, what = bad
        raise ApiError("invalid_request", f"the request body's string at {path} holds {what}; strings must be "
                       "valid Unicode without NUL", details={"reason": "bad_string", "path": path},
                       hint="send text as UTF-8 without NUL bytes or lone surrogates")


class JsonStringGuard:
    """Pure ASGI middleware: a JSON body (or the binary /act body's JSON part) holding a NUL or
    an unpaired surrogate in any string is answered 400 ``invalid_request`` with
    ``details={"reason": "bad_string", "path": ...}``; other requests pass unchanged."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        ctype = headers.get(b"content-type", b"").decode("latin-1").lower()
        if not (ctype.startswith(JSON_CONTENT_TYPE) or ctype.startswith(BINARY_CONTENT_TYPE)):
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":      # disconnect: let the app see it
                chunks.append(msg)
                break
            chunks.append(msg)
            size += len(msg.get("body", b""))
            more = msg.get("more_body", False)
            if size > self.max_bytes:
                break
        if not more and size <= self.max_bytes:
            body = b"".join(m.get("body", b"") for m in chunks if m["type"] == "http.request")
            try:
                check_strings(body, ctype)
            except ApiError as err:
                err.request_id = (scope.get("state") or {}).get("request_id") or new_request_id()
                await err.response()(scope, receive, send)
                return
        pending = list(chunks)

        async def replay() -> dict:
            if pending:
                return pending.pop(0)
            return await receive()
        await self.app(scope, replay, send)
