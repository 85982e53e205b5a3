"""The worker's HTTP face: the FastAPI app over one ``PolicyHost`` (``_hosting.py``).

Routes: ``/ping`` and ``/info`` (open), ``/act``, the websocket ``/act/ws`` (``act_channel.py``)
and ``/episode/end`` (the direct secret: a gateway-signed lease token or the raw worker secret),
``/control/revoke`` (the raw worker secret only), ``/openapi.json``. Credentials are checked from
the headers before a byte of the body is read (``_AuthFirst``), then the body's size
(``body_limit.BodyLimit``: a declared Content-Length over the limit is refused 413 from the
headers, a chunked body as it crosses the limit), before anything reads it; parsing and decoding
run on the replica's own thread (one thread hop; with several replicas on a worker thread first,
since routing by episode reads the body), never on the event loop. The process around the app is
``worker.py``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets as _secrets
import time
from typing import Any, Optional

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from sequence_ai_core.protocol import BINARY_CONTENT_TYPE, JSON_CONTENT_TYPE, MAX_BODY_BYTES

from sequence_ai_server.worker.host import PolicyError, PolicyHost
from sequence_ai_server.common.body_limit import BodyLimit, CloseUnread
from sequence_ai_server.worker.action_check import finish_chunk
from sequence_ai_server.common.errors import ApiError, ErrorBody, ResponseStatus, install_error_handlers, new_request_id
from sequence_ai_server.common.logs import REQUEST_ID

__all__ = ["WorkerState", "create_app"]

log = logging.getLogger("sequence_ai_server.worker")


# ---------------------------------------------------------------- wire models (the OpenAPI document)

class ActRequest(BaseModel):
    """The JSON /act body (the binary body carries the same JSON after a length prefix)."""
    observation: dict[str, Any]
    params: dict[str, Any] = {}
    episode_id: Optional[str] = None
    end_episode: bool = False
    prefix: Optional[list[list[float]]] = None      # the committed rows (absolute, the chunk's action space)
    delay_steps: Optional[int] = None               # estimated inference delay, control steps
    obs_time: Optional[float] = None                # the observation's capture time (unix s)
    request_id: Optional[str] = None                # echoed in the answer
    generation: Optional[int] = None                # the run's generation, echoed in the answer


class ActionChunkOut(BaseModel):
    actions: list[list[float]]
    action_space: Optional[str]
    robot: Optional[str]
    control_frequency_hz: Optional[float]
    open_loop_horizon: Optional[int] = None


class ActResponse(BaseModel):
    action_chunk: Optional[ActionChunkOut]
    warnings: list[str] = []
    inference_ms: float
    batch_size: int = 1
    request_id: str
    generation: Optional[int] = None
    outputs: Any = None


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
    usage: Optional[dict] = None                 # /act counters and recent samples (usage.ActMeter)


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


# ---------------------------------------------------------------- the app

class WorkerState:
    """What the HTTP layer knows: the host once imported, the phase, the load's job id."""

    def __init__(self, name: Optional[str], load_estimate_s: float = 10.0):
        self.name = name
        self.host: Optional[PolicyHost] = None
        self.phase = "importing"
        self.job_id = "load_" + _secrets.token_hex(6)
        self.t0 = time.monotonic()
        self.load_estimate_s = load_estimate_s

    def ready_host(self) -> PolicyHost:
        host = self.host
        if host is None or not host.ready:
            left = max(1.0, self.load_estimate_s - (time.monotonic() - self.t0))
            raise ApiError("warming", f"the policy is still starting ({self.phase})", retry_after_s=left,
                           details={"phase": self.phase, "job_id": self.job_id},
                           hint="retry after Retry-After seconds; the worker answers as soon as load() returns")
        return host


def create_app(state: WorkerState, secret: str, *, max_body_bytes: int = MAX_BODY_BYTES,
               max_connections: Optional[int] = None) -> FastAPI:
    """The worker's FastAPI app: /ping, /info, /act, /episode/end, /control/revoke, /openapi.json.

    The bearer token is the worker secret or a lease token signed with it (``leases.DirectAuth``:
    rotation via ``$SEQ_WORKER_SECRET_FILE``, idle tracking via ``$SEQ_WORKER_ACTIVITY_FILE``).
    ``max_body_bytes``: the largest /act body read (default ``protocol.MAX_BODY_BYTES``, 32 MiB).
    ``max_connections``: the open websockets (/act channels and openpi together) it holds at once
    (default ``act_channel.MAX_CONNECTIONS``, 64; ``act_channel.ConnectionBudget``).
    With ``$SEQ_CAPTURE_DIR`` set, kept episodes are written by ``capture.CaptureWriter``'s own
    thread; /act only hands it references."""
    app = FastAPI(title=f"sequence-ai worker: {state.name or 'policy'}", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  description="Direct robot -> worker endpoints. Errors share one shape (ErrorBody). "
                              "/act and /episode/end take the direct secret (a lease token from the gateway's "
                              "POST /v1/connect, or the worker secret); /control/revoke only the worker secret; "
                              "/ping and /info are open. Credentials are checked before the body is read.")
    from sequence_ai_server.worker.capture import CaptureWriter
    from sequence_ai_server.common.leases import DirectAuth
    direct_auth = DirectAuth.from_env(secret)
    app.state.direct_auth = direct_auth       # main() starts the revocation poll on it (leases.py)
    app.state.capture = CaptureWriter.from_env()
    from sequence_ai_server.worker.meter import ActMeter, MeterLayer
    app.state.act_meter = ActMeter()          # /act counters the gateway collects through /ping (usage.py)
    _add_probe_routes(app, state)
    _add_act_routes(app, state)
    from sequence_ai_server.worker.channel import MAX_CONNECTIONS, ConnectionBudget, add_act_channel  # the persistent /act channel
    app.state.connections = ConnectionBudget(max_connections or MAX_CONNECTIONS)   # shared with openpi's
    add_act_channel(app, state, direct_auth, max_body_bytes)
    try:                                             # openpi's websocket protocol at / (needs msgpack)
        from sequence_ai_server.worker.openpi import add_openpi_endpoint
    except ImportError:
        log.info("msgpack is not installed: no openpi-compatible endpoint")
    else:
        add_openpi_endpoint(app, state, direct_auth, max_body_bytes)
    _add_control_routes(app, direct_auth)
    _install_openapi(app)
    from sequence_ai_server.common.json_guard import JsonStringGuard   # NUL/lone surrogate in a JSON string -> 400 (it reads the body)
    app.add_middleware(JsonStringGuard, max_bytes=max(max_body_bytes, CONTROL_MAX_BODY_BYTES))
    # credentials -> declared size -> body: a Content-Length over the limit is 413 from the headers
    # and a chunked body is cut off at it, before JsonStringGuard or a route reads a byte of it
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes, limits={"/control/": CONTROL_MAX_BODY_BYTES})
    app.add_middleware(_AuthFirst, auth=direct_auth)
    app.add_middleware(_RequestIdMiddleware)
    app.add_middleware(MeterLayer, meter=app.state.act_meter)   # outermost: every /act answer is counted
    install_error_handlers(app)
    # outermost: an answer sent before the body was read (a 401, a 413, a 404) closes the
    # connection, so the worker never reads the rest of a body it refused to keep it alive
    app.add_middleware(CloseUnread)
    return app


def _add_probe_routes(app: FastAPI, state: WorkerState) -> None:
    @app.get("/ping", response_model=PingResponse, responses={503: {"model": ErrorBody}})
    async def ping(usage_since: int = -1) -> PingResponse:
        """ready once the policy has loaded and passed its synthetic check; 503 warming before.
        ``degraded`` (still 200) while an inference has run longer than ``timeouts.request``: the
        worker is jammed and the gateway replaces it (clients treat anything but ready as not ready).
        ``usage``: this worker's /act counters and the samples after number ``usage_since`` (usage.py)."""
        host = state.ready_host()
        oldest = host.oldest_request_s()
        limit = host.spec.timeouts.request
        return PingResponse(status="degraded" if oldest > limit else "ready", name=state.name, pid=os.getpid(),
                            oldest_request_s=round(oldest, 3), request_timeout_s=limit,
                            usage=app.state.act_meter.snapshot(usage_since))

    @app.get("/info")
    async def info() -> dict:
        """The hosted class, its contract and params (no secret needed)."""
        host = state.ready_host()
        d = host.spec.to_dict()
        return {"name": state.name, "class_name": d["class_name"], "contract": d["contract"], "params": d["params"],
                "batching": d["batching"], "concurrency": d["concurrency"], "slots": len(host.replicas),
                "mode": host.mode}


async def _infer(host: PolicyHost, future: Any, rid: str) -> tuple[Any, float, int]:
    """Wait for a queued request's future up to ``timeouts.request`` -> (result, seconds, batch
    size); 504 request_timeout past it (the inference still finishes), the policy's error as its
    ApiError, a refused body's ApiError as it is."""
    timeout = host.spec.timeouts.request
    try:
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
    except asyncio.TimeoutError:
        log.warning("%s ran past the request timeout (%g s); the worker finishes it", rid, timeout)
        raise ApiError("request_timeout", f"inference ran past the request timeout of {timeout:g} s; "
                       "the worker finishes it before serving again", retry_after_s=1.0,
                       details={"timeout_s": timeout},
                       hint="raise timeouts=seq.Timeouts(request=...) or make infer faster") from None
    except PolicyError as exc:
        log.warning("%s %s", rid, exc)
        raise exc.to_api_error() from None


async def queue_act(host: PolicyHost, raw: bytes, content_type: str) -> tuple[Any, Any]:
    """Queue one /act body -> (concurrent Future of (result, seconds, batch), holder whose
    ``.prepared`` is the decoded request once it ran). One replica: the body is parsed and
    decoded on the replica's own thread (one thread hop); several: decoded on a worker thread
    first, since routing by episode needs it. Raises ApiError for a refused body (several)."""
    if host.decodes_on_replica:
        return host.submit_raw(raw, content_type)
    prepared = await anyio.to_thread.run_sync(host.prepare, raw, content_type)
    return host.submit(prepared), _Decoded(prepared)


class _Decoded:
    """The holder ``queue_act`` returns when the body was decoded before queueing."""
    __slots__ = ("prepared",)

    def __init__(self, prepared: Any) -> None:
        self.prepared = prepared


async def run_act(host: PolicyHost, raw: bytes, content_type: str, rid: str, capture: Any = None,
                  on_queued: Any = None) -> bytes:
    """One /act request end to end -> the JSON answer's bytes (``ActResponse``). Shared by the
    HTTP route and the websocket channel (``act_channel.py``). ``on_queued(future)`` sees the
    queued request's future (the channel cancels it on the client's word). Raises ApiError."""
    future, holder = await queue_act(host, raw, content_type)
    if on_queued is not None:
        on_queued(future)
    result, seconds, batch = await _infer(host, future, rid)
    prepared = holder.prepared
    chunk, more, outputs = finish_chunk(result, host.spec)
    if more:
        log.info("%s clipped: %s", rid, more[0])
    payload = {"action_chunk": chunk, "warnings": prepared.warnings + more,
               "inference_ms": round(seconds * 1000.0, 3), "batch_size": batch, "request_id": rid,
               "outputs": outputs, **prepared.echo}   # the client's request_id / generation, when it sent them
    try:
        content = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise ApiError("policy_error", f"infer() returned outputs that are not JSON ({exc})",
                       details={"reason": "outputs"}, hint="return dicts/lists of numbers and strings") from None
    if capture is not None:   # a non-blocking hand-off to the capture writer's thread
        capture.offer(raw, content_type, prepared.episode_id, prepared.params, chunk, rid, payload["inference_ms"])
    return content


def _add_act_routes(app: FastAPI, state: WorkerState) -> None:
    capture = app.state.capture

    @app.post("/act", response_model=ActResponse, responses=_ERRORS,
              openapi_extra={**_ACT_BODY, "security": _DIRECT_SECURITY})
    async def act(request: Request) -> Response:
        """One observation -> one action chunk (JSON or binary body; see docs/design.md).
        Bearer: the direct secret (checked before the body is read)."""
        rid = request.state.request_id
        raw = await request.body()     # bounded by BodyLimit (create_app)
        host = state.ready_host()
        content = await run_act(host, raw, request.headers.get("content-type", ""), rid, capture)
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


class _AuthFirst:
    """Pure ASGI middleware: the credentials of ``/act``, ``/episode/end`` (the direct secret:
    a lease token or the worker secret) and ``/control/*`` (the worker secret only) are checked
    from the request headers; a refused request is answered 401 without reading its body, and
    the connection is closed after it (``body_limit.CloseUnread``: the rest is never read)."""

    def __init__(self, app: Any, auth: Any) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path in _DIRECT_PATHS or path in _CONTROL_PATHS):
            header = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
            scheme, _, token = header.partition(" ")
            try:
                if scheme.lower() != "bearer" or not token.strip():
                    raise ApiError("unauthorized", "missing or wrong direct secret",
                                   hint="send `Authorization: Bearer <direct_secret>` from POST /v1/connect")
                if path in _CONTROL_PATHS:
                    self.auth.check_control(token)
                else:
                    self.auth.check(token)
            except ApiError as exc:
                exc.request_id = scope.get("state", {}).get("request_id")
                await exc.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _RequestIdMiddleware:
    """Pure ASGI middleware (no BaseHTTPMiddleware task group on the /act hot path): takes a
    well-formed ``X-Request-ID`` (1-64 of ``[A-Za-z0-9._-]``) or makes one, puts it in
    ``request.state.request_id`` and the JSON log context (logs.py), and logs replies >= 400."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), "")
        ok = 0 < len(incoming) <= 64 and all(c.isalnum() or c in "-_." for c in incoming)
        rid = incoming if ok else new_request_id()
        scope.setdefault("state", {})["request_id"] = rid
        REQUEST_ID.set(rid)
        watch = ResponseStatus(send)
        await self.app(scope, receive, watch)
        if watch.status >= 400:
            log.info("%s %s -> %d", scope["method"], scope["path"], watch.status)
