"""The gateway's ASGI middleware and the request log: ``CredentialsFirst`` checks a route's
credentials from the headers before any body is read (each route's scope read off its key
dependency, :func:`route_scopes`), ``BodyLimit`` refuses a body over the limit with 413
(``details.limit_bytes``, as the worker's), and
:func:`install_request_log` gives every request an id, a log line and a metrics sample."""
from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any, Optional

from fastapi import FastAPI, Request

from sequence_ai_server.common.body_limit import BodyLimit as _BodyLimit, too_large
from sequence_ai_server.common.errors import ApiError, new_request_id
from sequence_ai_server.common.logs import DEPLOYMENT, REQUEST_ID

__all__ = ["BodyLimit", "CredentialsFirst", "route_scopes", "bearer_or_api_key", "check_worker_bearer",
           "install_request_log"]

log = logging.getLogger("sequence_ai_server.gateway")

_DEPLOYMENT_PATH = re.compile(r"^/v1/deployments/([a-z0-9][a-z0-9_-]{0,62})(?:/|$)")
_QUIET_ROUTES = {"/metrics", "/healthz", "/v1/deployments/{name}/logs", "/v1/deployments/{name}",
                 "/v1/internal/revocations"}  # polled: not logged


class BodyLimit(_BodyLimit):
    """ASGI middleware: refuse a request body over ``max_bytes`` with 413 payload_too_large in
    the common error shape (``body_limit.BodyLimit``: a declared Content-Length is checked
    before anything is read; a chunked body is counted as it streams and cut off at the limit).
    The gateway passes its MAX_BODY_BYTES (32 MiB, the worker's cap), or
    $SEQ_GATEWAY_MAX_BODY_BYTES (config.ServerConfig)."""

    def error(self, limit: int, size: Optional[int]) -> ApiError:
        return too_large(limit, size, what="the body", server="gateway",
                         hint="send camera frames as JPEG (see docs) or fewer/smaller views")


def bearer_or_api_key(authorization: Optional[str], x_api_key: Optional[str]) -> Optional[str]:
    """The API key a request carries: ``Authorization: Bearer <key>``, else ``X-API-Key``."""
    scheme, _, token = (authorization or "").partition(" ")
    return token if scheme.lower() == "bearer" and token else x_api_key


def check_worker_bearer(gw: Any, authorization: Optional[str]) -> None:
    """The bearer must be the direct secret of a worker this gateway runs; else 401 unauthorized."""
    token = (authorization or "").partition(" ")[2].strip()
    if not token or not gw.is_worker_secret(token):
        raise ApiError("unauthorized", "only a worker of this gateway may call this route")


def route_scopes(routes: Any, markers: dict, prefix: str = "") -> list[tuple[str, str, str]]:
    """``[(method, path, scope)]`` for every route under ``routes`` (FastAPI's included routers
    followed, HEAD left out). A route's scope is read off its dependencies: the first of
    ``markers`` (``{dependency callable: scope}``, in priority order) found among them, else
    ``"none"``."""
    out = []
    for route in routes:
        inner = getattr(route, "original_router", None)       # newer FastAPI keeps included routers as nodes
        if inner is not None:
            context = getattr(route, "include_context", None)
            out += route_scopes(inner.routes, markers, prefix + (getattr(context, "prefix", "") or ""))
            continue
        calls: set = set()
        stack = [getattr(route, "dependant", None)]
        while stack:
            d = stack.pop()
            for sub in getattr(d, "dependencies", None) or ():
                calls.add(sub.call)
                stack.append(sub)
        scope = next((v for k, v in markers.items() if k in calls), "none")
        out += [(m, prefix + route.path, scope) for m in sorted(getattr(route, "methods", None) or ()) if m != "HEAD"]
    return out


class CredentialsFirst:
    """ASGI middleware: the caller's credentials are checked from the headers before any route
    reads its body. Each route's scope comes from its own dependencies (:func:`route_scopes`):
    ``account`` (an account key; a robot key is 401 ``key_bound``), ``key`` (any live key; the
    route narrows a robot key to its deployment itself), ``worker`` (a worker's direct secret),
    ``none``. A missing, unknown or revoked key is 401 here; the route's dependency checks again.
    The refusal goes out before the body is read: ``body_limit.CloseUnread`` (outside this) adds
    ``Connection: close`` to it, so the server never reads the rest of the refused body."""

    def __init__(self, app: Any, gateway: Any, fastapi_app: Any, markers: dict):
        self.app, self.gw, self._fastapi, self._markers = app, gateway, fastapi_app, markers
        self._table: Optional[list] = None

    def _scope_of(self, method: str, path: str) -> Optional[str]:
        if self._table is None:
            from starlette.routing import compile_path
            self._table = [(m, compile_path(p)[0], sc) for m, p, sc in route_scopes(self._fastapi.routes, self._markers)]
        method = "GET" if method == "HEAD" else method
        return next((sc for m, rx, sc in self._table if m == method and rx.match(path)), None)

    def _check(self, scope_name: str, headers: dict) -> None:
        auth = headers.get(b"authorization", b"").decode("latin-1") or None
        if scope_name == "worker":
            check_worker_bearer(self.gw, auth)
            return
        rec = self.gw.authenticate(bearer_or_api_key(auth, headers.get(b"x-api-key", b"").decode("latin-1") or None))
        if scope_name == "account":
            self.gw.require_scope(rec)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            needed = self._scope_of(scope["method"], scope["path"])
            if needed not in (None, "none"):
                try:
                    await asyncio.to_thread(self._check, needed, dict(scope.get("headers") or []))
                except ApiError as exc:
                    exc.request_id = exc.request_id or new_request_id()
                    await exc.response()(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def install_request_log(app: FastAPI, metrics: Any) -> None:
    """Give every request of ``app`` an ``X-Request-ID`` (and the log context: request id,
    deployment), feed ``metrics.observe(route, status, started)`` and log one line per request
    (polled routes left out; 5xx at WARNING)."""

    @app.middleware("http")
    async def request_id(request: Request, call_next):
        request.state.request_id = new_request_id()
        REQUEST_ID.set(request.state.request_id)              # every log line of this request carries it
        m = _DEPLOYMENT_PATH.match(request.url.path)
        DEPLOYMENT.set(m.group(1) if m else None)
        started = time.perf_counter()
        response = await call_next(request)
        response.headers.setdefault("X-Request-ID", request.state.request_id)
        route = getattr(request.scope.get("route"), "path", None) or "unmatched"
        metrics.observe(route, response.status_code, started)
        if route not in _QUIET_ROUTES:
            log.log(logging.WARNING if response.status_code >= 500 else logging.INFO, "%s %s -> %d in %.1f ms",
                    request.method, request.url.path, response.status_code, (time.perf_counter() - started) * 1000,
                    extra={"deployment": getattr(request.state, "deployment", None) or (m.group(1) if m else None)})
        return response
