"""The worker's HTTP transport, mounted on the worker's app (``asgi.create_app``) beside the
websocket channel ``/act/ws`` (``channel.py``) and openpi's websocket at ``/`` (``openpi.py``).

Routes: ``/ping`` and ``/info`` (open), ``/act`` and ``/episode/end`` (the direct secret: a
gateway-signed lease token or the raw worker secret), ``/control/revoke`` (the raw worker secret
only), ``/openapi.json``. ``/act`` on every transport is the act pipeline (``act.py``); HTTP runs
its checks as ASGI middleware, in its order: credentials from the headers before a byte of the
body is read (``credentials.HeadersFirst`` with :func:`act.check_token`), then the body's size
(``body_limit.BodyLimit``: a declared Content-Length over the limit is refused 413 from the
headers, a chunked body as it crosses the limit), then its strings (``json_guard``), before a
route reads it; parsing and decoding run on the replica's own thread (one thread hop; with
several replicas on a worker thread first, since routing by episode reads the body), never on
the event loop. The process around the app is ``main.py``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from sequence_ai_core.protocol import BINARY_CONTENT_TYPE, JSON_CONTENT_TYPE

from sequence_ai_server.common.body_limit import BodyLimit, CloseUnread
from sequence_ai_server.common.credentials import HeadersFirst, bearer_token, header
from sequence_ai_server.common.known_routes import KnownRoutesFirst
from sequence_ai_server.common.errors import ApiError, ErrorBody, install_error_handlers
from sequence_ai_server.common.json_guard import JsonStringGuard
from sequence_ai_server.common.request_id import RequestIdLayer
from sequence_ai_server.worker.act import (ActPipeline, ActRequest, ActResponse, WorkerState, check_control_token,
                                           check_token)
from sequence_ai_server.worker.host import PolicyError

__all__ = ["CONTROL_MAX_BODY_BYTES", "WorkerState", "add_http"]

log = logging.getLogger("sequence_ai_server.worker")


# ---------------------------------------------------------------- wire models (the OpenAPI document)

class EpisodeEnd(BaseModel):
    episode_id: str


class RevokeRequest(BaseModel):
    """Sessions whose lease tokens this worker refuses from now on: ``{session_id: unix s}``,
    the time each one's last lease would have expired (the entry is dropped after it)."""
    sessions: dict[str, float]


class PingResponse(BaseModel):
    status: str                                  # ready | degraded (an inference runs past timeouts.request)
    name: Optional[str] = None
    pid: int
    oldest_request_s: float = 0.0                # age of the longest-running inference (0 when idle)
    request_timeout_s: Optional[float] = None    # the policy's timeouts.request
    usage: Optional[dict] = None                 # /act counters and recent samples (meter.ActMeter)
    cost: Optional[dict] = None                  # {"batch_ms": {"<batch size>": median ms per call}, "calls": n}
    deadlines: Optional[dict] = None             # {"requests": n with a deadline_ms, "late": n answered past it}
    robots: Optional[dict] = None                # {session id: {"p99_ms", "requests"}}: each robot's recent answers


def _schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


_ACT_BODY = {"requestBody": {"required": True, "content": {
    JSON_CONTENT_TYPE: {"schema": _schema(ActRequest)},
    BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary",
                                     "description": "4-byte big-endian JSON length, the JSON body with "
                                                    "images[].blob = [offset, length], then the raw JPEG/PNG bytes"}}}}}
_ERRORS = {s: {"model": ErrorBody} for s in (400, 401, 413, 500, 503, 504)}
_DIRECT_SECURITY = [{"direct_secret": []}]
CONTROL_MAX_BODY_BYTES = 1024 * 1024          # a /control/revoke body (a few hundred session ids is ~20 KB)
_DIRECT_PATHS = frozenset({"/act", "/episode/end"})       # lease token or worker secret
_CONTROL_PATHS = frozenset({"/control/revoke"})          # the raw worker secret only


# ---------------------------------------------------------------- the HTTP transport

def add_http(app: FastAPI, act: ActPipeline) -> None:
    """The HTTP transport on the worker ``app``: the routes (/ping, /info, /act, /episode/end,
    /control/revoke, the OpenAPI document) and, around them, the act pipeline's checks as
    middleware, innermost first: strings (NUL / lone surrogate in a JSON string -> 400; it reads
    the body), the size (a Content-Length over the limit is 413 from the headers, a chunked body
    is cut off at it), credentials (401 from the headers) -- so credentials -> declared size ->
    body, before JsonStringGuard or a route reads a byte of it; outside those the request id,
    the /act meter, the error shape, and outermost ``CloseUnread``: an answer sent before the
    body was read (a 401, a 413, a 404) closes the connection, so the worker never reads the
    rest of a body it refused to keep it alive. Outside all but that, ``KnownRoutesFirst``
    answers a path no route serves 404 (405 for a method it does not take) before any of them."""
    from sequence_ai_server.worker.meter import MeterLayer
    _add_probe_routes(app, act.state, act.meter)
    _add_act_routes(app, act)
    _add_control_routes(app, act.auth)
    _install_openapi(app)
    app.add_middleware(JsonStringGuard, max_bytes=max(act.max_body_bytes, CONTROL_MAX_BODY_BYTES))
    app.add_middleware(BodyLimit, max_bytes=act.max_body_bytes, limits={"/control/": CONTROL_MAX_BODY_BYTES})
    app.add_middleware(HeadersFirst, check=_credentials_check(act.auth))
    app.add_middleware(RequestIdLayer, on_answer=_log_refusal)
    app.add_middleware(MeterLayer, meter=act.meter)   # outside those: every /act answer is counted
    install_error_handlers(app)
    app.add_middleware(KnownRoutesFirst, router=app.router)   # an unknown path: 404 from the request line
    app.add_middleware(CloseUnread)


def _credentials_check(auth: Any) -> Callable[[dict], None]:
    """The credentials of an HTTP request, from its headers (``credentials.HeadersFirst``):
    ``/act`` and ``/episode/end`` take the direct secret (a lease token or the worker secret,
    :func:`act.check_token`), ``/control/*`` the worker secret only; other paths are open."""

    def check(scope: dict) -> None:
        path = scope.get("path", "")
        if path in _DIRECT_PATHS:
            check_token(auth, bearer_token(header(scope, b"authorization")))
        elif path in _CONTROL_PATHS:
            check_control_token(auth, bearer_token(header(scope, b"authorization")))
    return check


def _log_refusal(scope: dict, status: int, started: float) -> None:
    """One INFO line per HTTP answer >= 400 (``request_id.RequestIdLayer``'s ``on_answer``)."""
    if status >= 400:
        log.info("%s %s -> %d", scope["method"], scope["path"], status)


def _add_probe_routes(app: FastAPI, state: WorkerState, meter: Any) -> None:
    @app.get("/ping", response_model=PingResponse, responses={503: {"model": ErrorBody}})
    async def ping(usage_since: int = -1) -> PingResponse:
        """ready once the policy has loaded and passed its synthetic check; 503 warming before.
        ``degraded`` (still 200) while an inference has run longer than ``timeouts.request``: the
        worker is jammed and the gateway replaces it (clients treat anything but ready as not ready).
        ``usage``: this worker's /act counters and the samples after number ``usage_since`` (usage.py).
        ``cost``: the measured cost curve, ``{"batch_ms": {"1": 41.2, "2": 43.0}, "calls": n}``:
        the median ms of the last calls of each batch size (schedule.CostCurve). ``deadlines``:
        ``{"requests": n, "late": n}``, the /acts that carried a deadline_ms and those answered past it.
        ``robots``: ``{session id: {"p99_ms", "requests"}}``, each robot's p99 queued-to-answered
        time (ms) over its last 128 answers, for the robots answered in the last minute."""
        host = state.ready_host()
        oldest = host.oldest_request_s()
        limit = host.spec.timeouts.request
        return PingResponse(status="degraded" if oldest > limit else "ready", name=state.name, pid=os.getpid(),
                            oldest_request_s=round(oldest, 3), request_timeout_s=limit,
                            usage=meter.snapshot(usage_since), cost=host.cost.snapshot(),
                            deadlines=host.late.snapshot(), robots=host.robot_times.snapshot(time.monotonic()))

    @app.get("/info")
    async def info() -> dict:
        """The hosted class, its contract and params (no secret needed)."""
        host = state.ready_host()
        d = host.spec.to_dict()
        return {"name": state.name, "class_name": d["class_name"], "contract": d["contract"], "params": d["params"],
                "batching": d["batching"], "concurrency": d["concurrency"], "slots": len(host.replicas),
                "mode": host.mode}


def _add_act_routes(app: FastAPI, act_pipeline: ActPipeline) -> None:
    state = act_pipeline.state

    @app.post("/act", response_model=ActResponse, responses=_ERRORS,
              openapi_extra={**_ACT_BODY, "security": _DIRECT_SECURITY})
    async def act(request: Request) -> Response:
        """One observation -> one action chunk (JSON or binary body; see docs/design.md).
        Bearer: the direct secret (checked before the body is read)."""
        rid = request.state.request_id
        raw = await request.body()     # checked by the middleware (create_app)
        content = await act_pipeline.run(raw, request.headers.get("content-type", ""), rid,
                                         token=bearer_token(request.headers.get("authorization", "")))
        return Response(content, media_type="application/json", headers={"X-Request-ID": rid})

    @app.post("/episode/end", responses=_ERRORS, openapi_extra={"security": _DIRECT_SECURITY})
    async def episode_end(body: EpisodeEnd, request: Request) -> dict:
        """End an episode: @seq.on_episode runs on its replica after its queued acts.
        Bearer: the direct secret (checked before the body is read)."""
        host = state.ready_host()
        known = body.episode_id in host.episodes
        try:
            await asyncio.wrap_future(host.end_episode(body.episode_id))
        except PolicyError as exc:
            raise exc.to_api_error() from None
        return {"episode_id": body.episode_id, "ended": known}


def _add_control_routes(app: FastAPI, direct_auth: Any) -> None:
    @app.post("/control/revoke", responses={s: {"model": ErrorBody} for s in (400, 401, 413)},
              openapi_extra={"security": [{"worker_secret": []}],
                             "requestBody": {"required": True, "content": {"application/json": {
                                 "schema": _schema(RevokeRequest)}}}})
    async def control_revoke(request: Request) -> dict:
        """The gateway ends sessions here: their lease tokens are refused (401) from the next
        request on. Bearer: the raw worker secret only (a lease token is refused).
        -> ``{"revoked": n new, "held": n held}``."""
        raw = await request.body()     # bounded by BodyLimit (create_app)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise ApiError("invalid_request", "the body is not JSON", hint='send {"sessions": {"sess_...": unix_s}}') from None
        if not isinstance(body, dict) or "sessions" not in body:
            raise ApiError("invalid_request", 'the body needs "sessions"', hint='send {"sessions": {"sess_...": unix_s}}')
        try:
            new = direct_auth.revocations.add(body["sessions"])
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc), hint='send {"sessions": {"sess_...": unix_s}}') from None
        if new:
            log.info("%d session(s) ended by the gateway; their tokens are refused", new)
        return {"revoked": new, "held": len(direct_auth.revocations)}


def _install_openapi(app: FastAPI) -> None:
    """The OpenAPI document with the two bearer schemes (direct secret, worker secret) declared."""
    base_openapi = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            doc = base_openapi()
            doc.setdefault("components", {})["securitySchemes"] = {
                "direct_secret": {"type": "http", "scheme": "bearer",
                                  "description": "the lease token from POST /v1/connect (or the worker secret)"},
                "worker_secret": {"type": "http", "scheme": "bearer", "description": "the worker secret (the gateway)"}}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi
