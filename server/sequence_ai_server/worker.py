"""The worker: one process hosting one ``@seq.policy`` class behind ``POST /act``.

Where it sits: the robot client calls ``/act`` here directly (the gateway only hands out this
worker's URL and direct secret). The hosting itself -- contracts, decoding, params, replicas,
batching, episodes -- lives in ``_hosting.PolicyHost``; this module is the HTTP face and the
process around it. Per request the worker

  1. refuses a wrong bearer secret (401, constant-time) from the headers alone, before a byte of
     the body is read (``_AuthFirst``), then a body over the size limit (413),
  2. parses the body (JSON, or the binary framing with raw JPEG/PNG blobs) and checks it against
     the ObservationContract and the declared params, decoding each frame once -- on a thread,
     never on the event loop,
  3. queues it on its replica (sticky per episode); infer() runs on that replica's thread,
  4. answers 504 request_timeout if infer runs past ``timeouts.request`` (it still finishes),
  5. checks the chunk against the ActionContract (clip with warnings, or refuse).

Startup: the socket is bound and served at once; ``/ping`` and ``/act`` answer 503 warming with
Retry-After and the load's ``job_id`` while the policy is imported, loaded, warmed up and checked
with one synthetic observation in the background. A start that raises, or runs past
``timeouts.startup``, writes ``<ready-file>.error`` and exits 3. Once ready the worker writes
``--ready-file`` atomically (``{"port", "pid", "url", "load_s", ...}``); ``<ready-file>.phase``
holds the current phase all along. SIGTERM runs ``@seq.on_episode`` for open episodes, then
``@seq.shutdown``.

Who may call what: ``/act`` and ``/episode/end`` take the direct secret (a gateway-signed lease
token, or the raw worker secret); ``/control/revoke`` takes only the raw worker secret (the
gateway ends sessions there, ``leases.py``); ``/ping``, ``/info`` and ``/openapi.json`` are open.

    python -m sequence_ai_server.worker --file policy.py [--class C] --port 0 \\
        --secret S --ready-file /tmp/w.json [--name N] [--weights-dir D] [--cache-dir D] \\
        [--mode serve|eval] [--max-body-bytes N] [--parent-pid PID] [--supervisor-file F]

The secret may come from ``$SEQ_WORKER_SECRET`` instead of ``--secret`` (keeps it out of ps).
Supervision: ``--supervisor-file`` (what the local gateway passes) names the gateway supervising
the worker; when it dies the worker keeps serving the leases robots hold, a restarted gateway
adopts it, and without one it stops after the policy's ``idle_timeout`` with no request
(``_Supervision``). ``--parent-pid`` (a Ray actor) stops it as soon as that process goes away.
``$SEQ_EPISODE_IDLE_S`` overrides the 300 s after which an idle episode is ended.
A worker started by a gateway (``$SEQ_GATEWAY_URL``) polls it for ended sessions every
``$SEQ_REVOCATION_POLL_S`` (1 s; ``leases.RevocationPoller``); a gateway that does not answer
changes nothing on /act.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets as _secrets
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Optional

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from ._hosting import (BINARY_CONTENT_TYPE, DEFAULT_MAX_BODY_BYTES, EPISODE_IDLE_S, PolicyError, PolicyHost,
                       export_compile_caches, finish_chunk, load_policy_class)
from .errors import ApiError, ErrorBody, install_error_handlers, new_request_id
from .logs import REQUEST_ID, install_json_log

__all__ = ["PolicyHost", "WorkerState", "load_policy_class", "create_app", "main"]

log = logging.getLogger("sequence_ai_server.worker")


# ---------------------------------------------------------------- wire models (the OpenAPI document)

class ActRequest(BaseModel):
    """The JSON /act body (the binary body carries the same JSON after a length prefix)."""
    observation: dict[str, Any]
    params: dict[str, Any] = {}
    episode_id: Optional[str] = None
    end_episode: bool = False


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


def _schema(model: type[BaseModel]) -> dict:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


_ACT_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": _schema(ActRequest)},
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


def create_app(state: WorkerState, secret: str, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The worker's FastAPI app: /ping, /info, /act, /episode/end, /openapi.json.

    The bearer token is the worker secret or a lease token signed with it (``leases.DirectAuth``:
    rotation via ``$SEQ_WORKER_SECRET_FILE``, idle tracking via ``$SEQ_WORKER_ACTIVITY_FILE``)."""
    app = FastAPI(title=f"sequence-ai worker: {state.name or 'policy'}", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  description="Direct robot -> worker endpoints. Errors share one shape (ErrorBody). "
                              "/act and /episode/end take the direct secret (a lease token from the gateway's "
                              "POST /v1/connect, or the worker secret); /control/revoke only the worker secret; "
                              "/ping and /info are open. Credentials are checked before the body is read.")

    # Platform (issue 5): the direct secret may also be a gateway-signed lease token (expired ->
    # 401 lease_expired), the secret is rotated through $SEQ_WORKER_SECRET_FILE, and accepted
    # requests touch $SEQ_WORKER_ACTIVITY_FILE (idle stop). All of it lives in leases.py.
    from .leases import DirectAuth
    direct_auth = DirectAuth.from_env(secret)
    app.state.direct_auth = direct_auth       # main() starts the revocation poll on it (leases.py)

    # Capture (issue 7): with $SEQ_CAPTURE_DIR set (the gateway sets it) kept episodes are
    # written by capture.CaptureWriter's own thread; /act only hands it references (offer()).
    from .capture import CaptureWriter
    capture = CaptureWriter.from_env()
    app.state.capture = capture

    # Credentials of /act, /episode/end and /control/* are checked by _AuthFirst (added below)
    # from the headers alone: an unauthenticated request is answered 401 before its body is read.

    async def read_body(request: Request, limit: int = max_body_bytes) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise ApiError("payload_too_large", f"body is {int(length)} bytes; this worker takes at most {limit}",
                           hint="send JPEG frames at the declared camera size (the binary body avoids base64)",
                           details={"limit_bytes": limit})
        if length is not None:
            return await request.body()
        buf = bytearray()
        async for part in request.stream():
            buf += part
            if len(buf) > limit:
                raise ApiError("payload_too_large", f"body is over this worker's limit of {limit} bytes",
                               details={"limit_bytes": limit})
        return bytes(buf)

    @app.get("/ping", response_model=PingResponse, responses={503: {"model": ErrorBody}})
    async def ping() -> PingResponse:
        """ready once the policy has loaded and passed its synthetic check; 503 warming before.
        ``degraded`` (still 200) while an inference has run longer than ``timeouts.request``: the
        worker is jammed and the gateway replaces it (clients treat anything but ready as not ready)."""
        host = state.ready_host()
        oldest = host.oldest_request_s()
        limit = host.spec.timeouts.request
        return PingResponse(status="degraded" if oldest > limit else "ready", name=state.name, pid=os.getpid(),
                            oldest_request_s=round(oldest, 3), request_timeout_s=limit)

    @app.get("/info")
    async def info() -> dict:
        """The hosted class, its contract and params (no secret needed)."""
        host = state.ready_host()
        d = host.spec.to_dict()
        return {"name": state.name, "class_name": d["class_name"], "contract": d["contract"], "params": d["params"],
                "batching": d["batching"], "concurrency": d["concurrency"], "slots": len(host.replicas),
                "mode": host.mode}

    @app.post("/act", response_model=ActResponse, responses=_ERRORS,
              openapi_extra={**_ACT_BODY, "security": _DIRECT_SECURITY})
    async def act(request: Request) -> Response:
        """One observation -> one action chunk (JSON or binary body; see docs/design.md).
        Bearer: the direct secret (checked before the body is read)."""
        rid = request.state.request_id
        raw = await read_body(request)
        host = state.ready_host()
        prepared = await anyio.to_thread.run_sync(host.prepare, raw, request.headers.get("content-type", ""))
        future = asyncio.wrap_future(host.submit(prepared))
        timeout = host.spec.timeouts.request
        try:
            result, seconds, batch = await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            log.warning("%s ran past the request timeout (%g s); the worker finishes it", rid, timeout)
            raise ApiError("request_timeout", f"inference ran past the request timeout of {timeout:g} s; "
                           "the worker finishes it before serving again", retry_after_s=1.0,
                           details={"timeout_s": timeout},
                           hint="raise timeouts=seq.Timeouts(request=...) or make infer faster") from None
        except PolicyError as exc:
            log.warning("%s %s", rid, exc)
            raise exc.to_api_error() from None
        chunk, more, outputs = finish_chunk(result, host.spec)
        if more:
            log.info("%s clipped: %s", rid, more[0])
        payload = {"action_chunk": chunk, "warnings": prepared.warnings + more,
                   "inference_ms": round(seconds * 1000.0, 3), "batch_size": batch, "request_id": rid,
                   "outputs": outputs}
        try:
            content = json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ApiError("policy_error", f"infer() returned outputs that are not JSON ({exc})",
                           details={"reason": "outputs"}, hint="return dicts/lists of numbers and strings") from None
        if capture is not None:   # issue 7: non-blocking hand-off to the capture writer thread
            capture.offer(raw, request.headers.get("content-type", ""), prepared.episode_id, prepared.params,
                          chunk, rid, payload["inference_ms"])
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

    @app.post("/control/revoke", responses={s: {"model": ErrorBody} for s in (400, 401, 413)},
              openapi_extra={"security": [{"worker_secret": []}],
                             "requestBody": {"required": True, "content": {"application/json": {
                                 "schema": _schema(RevokeRequest)}}}})
    async def control_revoke(request: Request) -> dict:
        """The gateway ends sessions here: their lease tokens are refused (401) from the next
        request on. Bearer: the raw worker secret only (a lease token is refused).
        -> ``{"revoked": n new, "held": n held}``."""
        raw = await read_body(request, CONTROL_MAX_BODY_BYTES)
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
    from .json_guard import JsonStringGuard   # NUL/lone surrogate in a JSON string -> 400 (inside the auth check)
    app.add_middleware(JsonStringGuard)
    app.add_middleware(_AuthFirst, auth=direct_auth)
    app.add_middleware(_RequestIdMiddleware)
    install_error_handlers(app)
    return app


class _AuthFirst:
    """Pure ASGI middleware: the credentials of ``/act``, ``/episode/end`` (the direct secret:
    a lease token or the worker secret) and ``/control/*`` (the worker secret only) are checked
    from the request headers; a refused request is answered 401 without reading its body (the
    server discards whatever of it still arrives, so the connection stays usable)."""

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
        status = 0

        async def send_and_see(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, send_and_see)
        if status >= 400:
            log.info("%s %s -> %d", scope["method"], scope["path"], status)


# ---------------------------------------------------------------- process entry point

def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _resolve_weights_dir(spec: Any, file: str, weights_dir: str) -> Any:
    """A local directory named by weights= is handed to load as is; otherwise the deployment's
    own directory (created, nothing fetched self-hosted). Named parts -> {part: directory}."""
    def one(ref: Any, part: Optional[str]) -> str:
        if isinstance(ref, str) and ref.startswith("vol://"):   # an uploaded volume (volumes.py), read-only
            from .volumes import resolve_volume
            root = os.environ.get("SEQ_VOLUMES_DIR") or str(Path(weights_dir).parent.parent / "volumes")
            return str(resolve_volume(Path(root), ref))
        if isinstance(ref, str):
            local = ref[len("file://"):] if ref.startswith("file://") else ref
            if "://" not in local:
                p = Path(local) if Path(local).is_absolute() else Path(file).resolve().parent / local
                if p.is_dir():
                    return str(p)
                raise FileNotFoundError(f"weights directory not found: {p}")
            log.warning("weights %s are not fetched by a self-hosted worker; load() gets %s", ref, weights_dir)
        d = Path(weights_dir) / part if part else Path(weights_dir)
        d.mkdir(parents=True, exist_ok=True)
        return str(d)
    if isinstance(spec.weights, dict):
        return {part: one(ref, part) for part, ref in spec.weights.items()}
    if spec.weights is None:
        Path(weights_dir).mkdir(parents=True, exist_ok=True)
        return weights_dir
    return one(spec.weights, None)


def _default_cache_dir(weights_dir: str, name: str) -> str:
    """<data_dir>/cache/<name> beside <data_dir>/weights/<name>; else <weights_dir>-cache."""
    w = Path(weights_dir)
    if w.parent.name == "weights":
        return str(w.parent.parent / "cache" / name)
    return str(w.with_name(w.name + "-cache"))


def _inject_secrets(names: list, worker_secret: str) -> None:
    """Platform (issue 5): fetch the policy's declared secrets from the gateway that started this
    worker ($SEQ_GATEWAY_URL, authenticated with the worker secret) and set them in os.environ.
    Values are never logged. Raises RuntimeError when there is no gateway or it refuses."""
    import httpx
    url = os.environ.get("SEQ_GATEWAY_URL")
    if not url:
        raise RuntimeError(f"the policy declares secrets {names} but this worker was not started by a gateway")
    r = httpx.post(f"{url}/v1/internal/worker-secrets", json={"names": list(names)},
                   headers={"Authorization": f"Bearer {worker_secret}"}, timeout=30.0)
    if r.status_code != 200:
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        raise RuntimeError(f"could not fetch secrets {names}: {body.get('detail') or r.status_code}"
                           + (f" ({body['hint']})" if body.get("hint") else ""))
    os.environ.update(r.json()["env"])


class _Supervision:
    """Whether the gateway that supervises this worker is alive, and when an unsupervised worker
    should stop.

    The gateway keeps ``{"pid", "start"}`` (``_proc.process_start``) in the worker's supervisor
    file; a restarted gateway that adopts the worker writes its own there. While the process it
    names is gone (the gateway crashed, or was SIGKILLed) the worker is *orphaned*: it keeps
    serving the robots whose leases it can still verify itself, and stops once no request has
    come for the policy's ``idle_timeout`` (seconds; counted from the later of the last request
    -- the mtime of ``$SEQ_WORKER_ACTIVITY_FILE`` -- and the moment it was orphaned), so a
    gateway that never comes back leaves no worker running for ever. The gateway's own idle
    stop does the same while it is alive."""

    def __init__(self, path: str):
        self.path = path
        self.orphaned_at: Optional[float] = None
        self._alive = True

    def gateway_alive(self) -> bool:
        from ._proc import process_alive
        try:
            raw = Path(self.path).read_text()
            sup = json.loads(raw)
            pid, start = int(sup["pid"]), sup.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            return self._alive            # unreadable for a moment: no change
        return process_alive(pid, start)

    def orphan_idle_expired(self, host: Optional[PolicyHost]) -> bool:
        now = time.time()
        if self.gateway_alive():
            if self.orphaned_at is not None:
                log.info("a gateway supervises this worker again")
            self.orphaned_at, self._alive = None, True
            return False
        limit = float(getattr(getattr(host, "spec", None), "idle_timeout", None) or 600.0)
        if self.orphaned_at is None:
            self.orphaned_at, self._alive = now, False
            log.warning("the gateway supervising this worker is gone; it keeps serving valid leases and "
                        "stops after %g s (idle_timeout) without a request", limit)
        last = self.orphaned_at
        activity = os.environ.get("SEQ_WORKER_ACTIVITY_FILE")
        if activity:
            with contextlib.suppress(OSError):
                last = max(last, os.stat(activity).st_mtime)
        if now - last > limit:
            log.warning("no gateway and no request for %.0f s (idle_timeout %g s): stopping", now - last, limit)
            return True
        return False


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sequence_ai_server.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True, help="the policy file")
    parser.add_argument("--class", dest="class_name", default=None, help="the @seq.policy class (if the file has several)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = an ephemeral port")
    parser.add_argument("--secret", default=None, help="direct secret (or $SEQ_WORKER_SECRET)")
    parser.add_argument("--ready-file", required=True, help="written atomically once serving: {port, pid, ...}")
    parser.add_argument("--name", default=None)
    parser.add_argument("--weights-dir", default=None, help="the deployment's weights directory")
    parser.add_argument("--cache-dir", default=None, help="compile caches (default: <data_dir>/cache/<name>)")
    parser.add_argument("--mode", choices=("serve", "eval"), default=os.environ.get("SEQ_WORKER_MODE", "serve"),
                        help="serve: batches never wait for more requests; eval: they gather (eval_wait_ms)")
    parser.add_argument("--max-body-bytes", type=int,
                        default=int(os.environ.get("SEQ_WORKER_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)))
    parser.add_argument("--load-estimate-s", type=float, default=10.0, help="Retry-After basis while loading")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process goes away (a Ray actor hosting the worker)")
    parser.add_argument("--supervisor-file", default=None,
                        help="JSON {pid, start} of the gateway supervising this worker (rewritten by a gateway "
                             "that adopts it); while that process is gone the worker keeps serving and exits "
                             "after the policy's idle_timeout without a request")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s worker %(levelname)s %(message)s")
    if os.environ.get("SEQ_JSON_LOG"):   # the gateway's structured log for this deployment (logs.py)
        version = os.environ.get("SEQ_DEPLOYMENT_VERSION")
        install_json_log(Path(os.environ["SEQ_JSON_LOG"]), "worker", deployment=args.name,
                         version=int(version) if version and version.isdigit() else None)
    secret = args.secret or os.environ.get("SEQ_WORKER_SECRET")
    if not secret:
        parser.error("a direct secret is required: --secret or $SEQ_WORKER_SECRET")
    name = args.name or Path(args.file).stem
    ready_file = os.path.abspath(args.ready_file)
    phase_file, error_file = ready_file + ".phase", ready_file + ".error"
    for stale in (ready_file, error_file):
        if os.path.exists(stale):
            os.remove(stale)
    weights_dir = args.weights_dir or os.path.join(os.path.expanduser("~/.sequence-ai"), "weights", name)
    caches = export_compile_caches(args.cache_dir or _default_cache_dir(weights_dir, name))
    idle_s = float(os.environ.get("SEQ_EPISODE_IDLE_S", EPISODE_IDLE_S))

    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol is
    # IPPROTO_TCP; with 0 every response waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    url = f"http://{args.host}:{port}"
    state = WorkerState(args.name, args.load_estimate_s)
    info: dict[str, Any] = {"pid": os.getpid(), "port": port, "url": url, "name": args.name, "job_id": state.job_id,
                            "caches": caches}
    lock = threading.Lock()
    finished = threading.Event()

    def phase(p: str, **extra: Any) -> None:
        with lock:
            state.phase = p
            info.update(phase=p, t=time.time(), **extra)
            log.info("phase=%s", p)
            _write_json_atomic(phase_file, info)

    def fail(stage: str, exc: BaseException, tb: str) -> None:
        with lock:
            if finished.is_set():
                return
            finished.set()
        detail = f"{type(exc).__name__}: {exc}"
        log.error("failed while %s: %s\n%s", stage, detail, tb)
        _write_json_atomic(error_file, {"phase": stage, "exception_type": type(exc).__name__, "detail": detail,
                                        "traceback": tb, "job_id": state.job_id})
        phase("failed")
        sys.stdout.flush()
        os._exit(3)

    def load() -> None:
        try:
            phase("importing")
            cls = load_policy_class(args.file, args.class_name)
            host = PolicyHost(cls, args.name, mode=args.mode, episode_idle_s=idle_s)
            phase("importing", spec=host.spec.to_dict())
            state.host = host
            if host.spec.secrets:   # platform (issue 5): declared secrets only, into the env, before load
                _inject_secrets(host.spec.secrets, secret)
            weights = _resolve_weights_dir(host.spec, args.file, weights_dir)
            host.start(weights, phase)
        except BaseException as exc:  # noqa: BLE001 - report whatever stops the start, then exit
            inner = exc.exc if isinstance(exc, PolicyError) else exc
            tb = exc.remote_traceback if isinstance(exc, PolicyError) else traceback.format_exc()
            fail(state.phase, inner, tb)
            return
        with lock:
            if finished.is_set():
                return
            finished.set()
        phase("ready")
        _write_json_atomic(ready_file, {"port": port, "pid": os.getpid(), "url": url, **host.timings,
                                        "job_id": state.job_id, "spec": host.spec.to_dict(), "caches": caches})
        log.info("serving %s on %s (%d slot(s), mode %s)", host.name, url, len(host.replicas), host.mode)

    supervision = _Supervision(args.supervisor_file) if args.supervisor_file else None

    import uvicorn
    worker_app = create_app(state, secret, max_body_bytes=args.max_body_bytes)
    from .leases import RevocationPoller   # sessions the gateway ended, when its push did not arrive
    RevocationPoller.from_env(worker_app.state.direct_auth)
    server = uvicorn.Server(uvicorn.Config(worker_app,
                                           log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=5))
    # uvicorn re-raises the signal it caught once it has stopped: make that a no-op.
    signal.signal(signal.SIGTERM, lambda s, f: None)
    signal.signal(signal.SIGINT, lambda s, f: None)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.005)
        phase("importing")
        threading.Thread(target=load, name="policy-load", daemon=True).start()

        async def watch() -> None:
            while not server.should_exit:
                host = state.host
                if host is not None and not host.ready and not finished.is_set():
                    limit = host.spec.timeouts.startup
                    if time.monotonic() - state.t0 > limit:
                        fail(state.phase, TimeoutError(f"the policy did not load within the startup timeout ({limit:g} s)"), "")
                if host is not None and host.ready:
                    host.reap_idle_episodes()
                if args.parent_pid and os.getppid() != args.parent_pid:
                    log.warning("parent %d went away; stopping", args.parent_pid)
                    server.should_exit = True
                if supervision is not None and supervision.orphan_idle_expired(host):
                    server.should_exit = True
                await asyncio.sleep(min(0.5, idle_s / 4))
        asyncio.create_task(watch())
        await task

    try:
        try:   # uvloop (libuv) when installed: ~0.5 ms less CPU per /act than asyncio's selector loop
            import uvloop
        except ImportError:
            asyncio.run(serve())
        else:
            uvloop.run(serve())
    finally:
        host = state.host
        if host is not None and host.ready:
            log.info("stopping: calling @seq.shutdown (open episodes end first)")
            host.stop()
        if worker_app.state.capture is not None:   # issue 7: write the kept steps still queued
            worker_app.state.capture.close()
        log.info("stopped")
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
