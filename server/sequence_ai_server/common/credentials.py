"""Credentials read from the request headers, for every server and transport.

* :func:`bearer_token`: the token of an ``Authorization`` header in one of the given schemes
  (``Bearer`` by default; openpi's client sends ``Api-Key``), else ``""``.
* :func:`header`: one header of an ASGI scope, decoded (``""`` when absent).
* :class:`HeadersFirst`: pure ASGI middleware that runs a check on each HTTP request's scope
  before anything reads its body. An ``ApiError`` the check raises is the answer (the common
  error shape, with the request's id), and the body is never read: ``body_limit.CloseUnread``,
  outside it, closes the connection after such an answer, so an unauthenticated client cannot
  push a large body into a 401. The worker's HTTP app uses it for the direct and the worker
  secret; the gateway's ``CredentialsFirst`` does the same job for API keys (with
  ``in_thread=True``, its check reads the key store).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable

from sequence_ai_server.common.errors import ApiError, new_request_id

__all__ = ["HeadersFirst", "bearer_token", "header"]


def bearer_token(authorization: str, schemes: tuple[str, ...] = ("bearer",)) -> str:
    """The token of ``authorization`` (an ``Authorization`` header's value) when its scheme is
    one of ``schemes`` (lower case, compared without case), stripped; else ``""``."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() in schemes else ""


def header(scope: dict, name: bytes) -> str:
    """The first ``name`` header (lower-case bytes) of the ASGI ``scope``, latin-1; ``""`` if none."""
    return next((v.decode("latin-1") for k, v in scope.get("headers") or () if k == name), "")


class HeadersFirst:
    """Pure ASGI middleware: ``check(scope)`` runs for each HTTP request before the app reads a
    byte of its body (module docstring); it returns to let the request through or raises
    ``ApiError``, which is answered at once (``request_id``: the error's own, else the one in
    ``scope["state"]``, else a new one). ``in_thread``: run ``check`` on a worker thread (a
    check that does I/O); otherwise on the event loop (a check that only compares strings)."""

    def __init__(self, app: Any, check: Callable[[dict], None], in_thread: bool = False) -> None:
        self.app, self.check, self.in_thread = app, check, in_thread

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            try:
                if self.in_thread:
                    await asyncio.to_thread(self.check, scope)
                else:
                    self.check(scope)
            except ApiError as exc:
                exc.request_id = exc.request_id or (scope.get("state") or {}).get("request_id") or new_request_id()
                await exc.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
