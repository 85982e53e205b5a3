"""The request-body size limit, written once for every way into a server.

* :class:`BodyLimit`, pure ASGI middleware for HTTP: a declared ``Content-Length`` over the limit
  is answered 413 ``payload_too_large`` from the headers, before anything reads the body; a body
  without one (chunked) is counted as it streams and refused 413 once it crosses the limit, the
  rest never read (the answer carries ``Connection: close``). Install it inside the credentials
  check (credentials -> declared size -> body) and outside anything that reads the body
  (``json_guard.JsonStringGuard``, the routes). The gateway uses it (``middleware.BodyLimit``,
  its own wording) and the worker (``worker/app.py``, a tighter limit for ``/control/*``). The
  declared length is read as RFC 9110 says: optional whitespace (space, tab) around the digits
  is no part of it (``Content-Length: 999999999 `` is 413 too); a value that is not digits is
  left to the HTTP parser.
* :class:`CloseUnread`, outermost: any answer that goes out before the request's body was read
  (a 401 from the credentials check, a 404, the 413 above) carries ``Connection: close`` and the
  server closes the connection after it, so it never reads the rest of a body it refused (uvicorn
  reads and discards it to keep a keep-alive connection: an unauthenticated client could push
  gigabytes into a 401).
* :func:`check_size`: the same refusal for a message a websocket has read (the worker's /act
  channel, the openpi endpoint), so a message over the limit gets the HTTP answer's code,
  wording and ``details``.
"""
from __future__ import annotations

from typing import Any, Optional

from sequence_ai_server.common.errors import ApiError, new_request_id

__all__ = ["ACT_HINT", "BodyLimit", "CloseUnread", "check_size", "declared_length", "too_large"]

ACT_HINT = "send JPEG frames at the declared camera size (the binary body avoids base64)"


def too_large(limit: int, size: Optional[int] = None, *, what: str = "body", server: str = "worker",
              hint: str = ACT_HINT) -> ApiError:
    """The 413 ``payload_too_large`` error for a ``what`` of ``size`` bytes (None: not known,
    only that it is over) against ``limit``, naming the limit (``details.limit_bytes``, on every
    server and channel) and what to do (``hint``)."""
    said = f"{what} is {size} bytes" if size is not None else f"{what} is over the limit"
    return ApiError("payload_too_large", f"{said}; this {server} takes at most {limit} bytes",
                    hint=hint, details={"limit_bytes": limit})


def check_size(size: int, limit: int, **wording: Any) -> None:
    """Raise :func:`too_large` (``wording``: its keyword arguments) when ``size`` > ``limit``."""
    if size > limit:
        raise too_large(limit, size, **wording)


def declared_length(headers: Any) -> Optional[int]:
    """The ``Content-Length`` a request's ASGI ``headers`` declare, without the optional
    whitespace around it (RFC 9110 OWS: space, tab); None when there is none or it is not digits."""
    length = dict(headers or []).get(b"content-length")
    if length is None:
        return None
    length = length.strip(b" \t")
    return int(length) if length.isdigit() else None


class BodyLimit:
    """ASGI middleware: refuse an HTTP request body over ``max_bytes`` (``limits``: a tighter or
    looser limit for a path prefix, the longest match wins) with 413 ``payload_too_large`` in the
    common error shape (module docstring). Subclasses word the error by overriding
    :meth:`error`."""

    def __init__(self, app: Any, max_bytes: int, limits: Optional[dict[str, int]] = None) -> None:
        self.app = app
        self.max_bytes = int(max_bytes)
        self.limits = sorted(((p, int(n)) for p, n in (limits or {}).items()), key=lambda pn: -len(pn[0]))

    def limit_for(self, path: str) -> int:
        return next((n for p, n in self.limits if path.startswith(p)), self.max_bytes)

    def error(self, limit: int, size: Optional[int]) -> ApiError:
        return too_large(limit, size)

    async def _refuse(self, scope: dict, receive: Any, send: Any, limit: int, size: Optional[int]) -> None:
        err = self.error(limit, size)
        err.request_id = err.request_id or (scope.get("state") or {}).get("request_id") or new_request_id()
        resp = err.response()
        resp.headers["Connection"] = "close"       # the rest of the body is never read
        await resp(scope, receive, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        length = declared_length(scope.get("headers"))
        if length is not None and length > limit:
            await self._refuse(scope, receive, send, limit, length)
            return
        seen, over, started = 0, False, False

        async def counted() -> dict:
            # Past the limit the app is told the client left (it stops reading) and its answer is
            # replaced by the 413 below: raising here would reach the app as a body-parse error
            # (400) or an exception group (500) instead.
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit and not started:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: dict) -> None:
            nonlocal started
            if over:
                return              # the app's answer to a cut-off body is dropped
            started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not over:
                raise
        if over:
            await self._refuse(scope, receive, send, limit, None)


class CloseUnread:
    """Pure ASGI middleware, outermost: an HTTP answer that starts before the app has read all of
    the body the request declares (a ``Content-Length`` over 0, or ``Transfer-Encoding``) carries
    ``Connection: close``, and the server closes the connection once it is sent instead of
    reading the rest of the body to keep it alive (module docstring). A request with a body the
    route does not read costs the client a new connection; every other keeps its keep-alive."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope.get("headers") or []
        if not (declared_length(headers) or any(k == b"transfer-encoding" for k, _ in headers)):
            await self.app(scope, receive, send)       # no body: nothing to leave unread
            return
        done = False

        async def reading() -> dict:
            nonlocal done
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                done = True             # all of it read (or the client left: nothing more comes)
            return message

        async def answering(message: dict) -> None:
            if message["type"] == "http.response.start" and not done:
                head = list(message.get("headers") or [])
                if not any(k.lower() == b"connection" and b"close" in v.lower() for k, v in head):
                    head.append((b"connection", b"close"))
                message = {**message, "headers": head}
            await send(message)

        await self.app(scope, reading, answering)
