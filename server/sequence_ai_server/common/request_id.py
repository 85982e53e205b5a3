"""One id per request, for every server: in the answer, in every log line of the request.

* :func:`request_id_from`: a client's ``X-Request-ID`` when it is well formed (1-64 of
  ``[A-Za-z0-9._-]``), else a new one (``errors.new_request_id``).
* :class:`RequestIdLayer`: pure ASGI middleware (no ``BaseHTTPMiddleware`` task group on a hot
  path) that gives each HTTP request its id in ``scope["state"]["request_id"]`` (read as
  ``request.state.request_id``) and the log context (``logs.REQUEST_ID``), optionally echoes it
  in an ``X-Request-ID`` answer header, and calls ``on_answer(scope, status, started)`` once the
  request is done (``status`` 0: no answer started; ``started``: ``time.perf_counter()`` at its
  start) for a log line or a metrics sample. The worker's HTTP app uses it; the gateway's
  ``install_request_log`` does the same job on ``@app.middleware("http")``.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

from sequence_ai_server.common.errors import ResponseStatus, new_request_id
from sequence_ai_server.common.logs import REQUEST_ID

__all__ = ["RequestIdLayer", "request_id_from"]

_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def request_id_from(incoming: Optional[str]) -> str:
    """``incoming`` (a client's ``X-Request-ID``) when it is 1-64 of ``[A-Za-z0-9._-]``, else a new id."""
    if incoming and len(incoming) <= 64 and _ID_CHARS.issuperset(incoming):
        return incoming
    return new_request_id()


class RequestIdLayer:
    """Pure ASGI middleware (module docstring). ``accept_incoming``: take a well-formed
    ``X-Request-ID`` from the client (else always a new id); ``echo``: add ``X-Request-ID`` to
    every answer that has none; ``on_answer(scope, status, started)``: called after each request
    the app returned from (an exception goes on to the error layer outside, uncalled)."""

    def __init__(self, app: Any, *, accept_incoming: bool = True, echo: bool = False,
                 on_answer: Optional[Callable[[dict, int, float], None]] = None) -> None:
        self.app, self.accept_incoming, self.echo, self.on_answer = app, accept_incoming, echo, on_answer

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        incoming = ""
        if self.accept_incoming:
            incoming = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        rid = request_id_from(incoming)
        scope.setdefault("state", {})["request_id"] = rid
        REQUEST_ID.set(rid)
        if self.echo:
            send = _Echo(send, rid.encode("latin-1"))
        if self.on_answer is None:
            await self.app(scope, receive, send)
            return
        watch = ResponseStatus(send)
        await self.app(scope, receive, watch)
        self.on_answer(scope, watch.status, started)


class _Echo:
    """An ASGI ``send`` adding ``X-Request-ID`` to the answer's head when it has none."""

    __slots__ = ("send", "rid")

    def __init__(self, send: Any, rid: bytes) -> None:
        self.send, self.rid = send, rid

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            head = list(message.get("headers") or [])
            if not any(k.lower() == b"x-request-id" for k, _ in head):
                message = {**message, "headers": head + [(b"x-request-id", self.rid)]}
        await self.send(message)
