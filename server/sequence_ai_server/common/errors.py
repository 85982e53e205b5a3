"""The one error shape every sequence-ai server answers with, and the code table.

The table itself lives in ``sequence_ai_core.protocol.ERROR_CODES`` (shared with the client);
its main rows:

    {"detail": str, "code": str, "retryable": bool, "retry_after_s": float | null,
     "request_id": str | null, "hint": str | null, "details": object | null}

| code            | HTTP | retryable | when                                                      |
|-----------------|------|-----------|-----------------------------------------------------------|
| invalid_request | 400  | no        | malformed body, contract mismatch, unknown param          |
| unauthorized    | 401  | no        | missing/wrong API key or direct secret; an ended session  |
| lease_expired   | 401  | no        | a lease from an older worker epoch                        |
| not_found       | 404  | no        | unknown deployment / model / route                        |
| payload_too_large | 413 | no       | a request body over the server's size limit               |
| policy_error    | 500  | no        | the policy's own code raised, or returned a bad chunk     |
| internal        | 500  | no        | a bug in the server itself                                |
| warming         | 503  | yes       | the worker is loading; Retry-After says when to ask again |
| worker_failed   | 503  | no        | the worker failed to load or died                         |
| too_many_connections | 503 | yes   | a worker's open websockets (/act/ws + openpi) at its limit |
| request_timeout | 504  | yes       | one inference ran past timeouts.request (it still finishes)|

``install_error_handlers(app)`` makes every error a FastAPI app raises -- our ``ApiError``,
pydantic validation errors, Starlette HTTP errors and unexpected exceptions -- come out in
this shape, with ``request_id`` echoed in the ``X-Request-ID`` header. An unexpected exception
is answered by ``CatchAll`` as a complete 500 ``internal`` response and goes no further: the
keep-alive connection stays usable (Starlette's own last-resort handler re-raises after its
answer, and uvicorn then drops the connection without ``Connection: close``). A client that
goes away before its body arrived (Starlette's ``ClientDisconnect`` from reading it) is no
error: one INFO line, nothing sent (nobody is there to read it), no 5xx in the metrics.
"""
from __future__ import annotations

import json
import logging
import math
import secrets
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from sequence_ai_core.protocol import ERROR_CODES

__all__ = ["ErrorBody", "ApiError", "CODES", "CatchAll", "ResponseStatus", "install_error_handlers", "internal_error",
           "new_request_id", "scrub"]

log = logging.getLogger("sequence_ai_server")

# code -> (HTTP status, retryable), from the wire protocol's table (the client reads the same one)
CODES: dict[str, tuple[int, bool]] = {code: (row.status, row.retryable) for code, row in ERROR_CODES.items()}


class ErrorBody(BaseModel):
    detail: str
    code: str
    retryable: bool = False
    retry_after_s: Optional[float] = None
    request_id: Optional[str] = None
    hint: Optional[str] = None
    details: Optional[dict[str, Any]] = None


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


def scrub(value: Any) -> Any:
    """``value`` (nested dicts/lists/strings) with every unpaired surrogate written as a
    ``\\udXXX`` escape, so it encodes as UTF-8; other values are returned as they are. An error
    message that echoes such a string from a request must still render, not fail with a 500."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub(v) for v in value]
    return value


class ApiError(Exception):
    """Raise anywhere in a handler; the app answers with the error shape and the code's status."""

    def __init__(self, code: str, detail: str, *, hint: Optional[str] = None, details: Optional[dict] = None,
                 retry_after_s: Optional[float] = None, request_id: Optional[str] = None):
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(detail)
        self.code = code
        self.status, self.retryable = CODES[code]
        self.detail = detail
        self.hint = hint
        self.details = details
        self.retry_after_s = retry_after_s
        self.request_id = request_id

    def body(self) -> ErrorBody:
        return ErrorBody(detail=self.detail, code=self.code, retryable=self.retryable,
                         retry_after_s=self.retry_after_s, request_id=self.request_id,
                         hint=self.hint, details=self.details)

    def response(self) -> JSONResponse:
        """The HTTP answer: the error body, ``X-Request-ID`` and ``Retry-After`` headers."""
        headers = {}
        if self.request_id:
            headers["X-Request-ID"] = self.request_id
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return JSONResponse(scrub(self.body().model_dump()), status_code=self.status, headers=headers)

    def json_bytes(self) -> bytes:
        """The error body as compact JSON bytes, for a transport that is no HTTP answer (a
        websocket message)."""
        return json.dumps(scrub(self.body().model_dump()), separators=(",", ":")).encode()


def _request_id(request: Request) -> str:
    rid = getattr(request.state, "request_id", None)
    if not rid:
        rid = new_request_id()
        request.state.request_id = rid
    return rid


def _is_json(content_type: Optional[str]) -> bool:
    """``application/json`` or a ``+json`` type (parameters such as ``charset`` ignored)."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _field_path(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def internal_error(exc: BaseException, request_id: Optional[str]) -> ApiError:
    """The 500 ``internal`` error for a bug in the server (``exc`` escaped a handler)."""
    return ApiError("internal", f"internal server error: {type(exc).__name__}: {str(exc)[:500]}",
                    hint="this is a bug in sequence-ai; the server log has the traceback",
                    request_id=request_id or new_request_id())


class ResponseStatus:
    """An ASGI ``send`` that passes every message on and notes the response's HTTP status:
    ``status`` is 0 until ``http.response.start`` went out, then that status. One per request."""

    def __init__(self, send: Any) -> None:
        self.send = send
        self.status = 0

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


class CatchAll:
    """Pure ASGI middleware: an exception that escapes the app before the response started is
    answered 500 ``internal`` (the common shape, logged with its traceback) and not re-raised, so
    the server keeps the keep-alive connection. After the response started nothing can be sent
    cleanly: it is re-raised and the server closes the connection (the client sees a short body).
    ``ClientDisconnect`` (the client left while its body was being read) is logged at INFO in
    one line and nothing is answered."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        watch = ResponseStatus(send)
        try:
            await self.app(scope, receive, watch)
        except ClientDisconnect:
            declared = dict(scope.get("headers") or []).get(b"content-length", b"").strip().decode("latin-1")
            log.info("%s %s: the client left before its body arrived%s; nothing answered",
                     scope.get("method"), scope.get("path"), f" ({declared} bytes declared)" if declared else "")
        except Exception as exc:
            if watch.status:   # the response started: nothing can be sent cleanly now
                raise
            log.exception("unhandled error")
            await internal_error(exc, (scope.get("state") or {}).get("request_id")).response()(scope, receive, send)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error ``app`` raises in the common shape (see the module docstring); adds
    ``CatchAll`` as the outermost middleware added so far (call it after the app's own)."""
    app.add_middleware(CatchAll)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        if exc.request_id is None:
            exc.request_id = _request_id(request)
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [f"{_field_path(tuple(e.get('loc', ())))}: {e.get('msg')}" for e in exc.errors()]
        detail = "request body does not match the schema: " + "; ".join(problems[:5])
        hint = "see docs/design.md for the body this endpoint takes"
        content_type = request.headers.get("content-type")
        if content_type and not _is_json(content_type):
            # curl -d sends application/x-www-form-urlencoded, and FastAPI then reads no JSON at all
            # (a request without the header is read as JSON)
            detail += (f" (the request's Content-Type is {content_type!r}, not application/json, so the "
                       "body was not read as JSON)")
            hint = 'send the body as JSON with the header "Content-Type: application/json" (curl: -H ' \
                   '"Content-Type: application/json" -d \'{...}\'); ' + hint
        err = ApiError("invalid_request", detail, hint=hint, details={"errors": problems},
                       request_id=_request_id(request))
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "unauthorized", 404: "not_found"}.get(exc.status_code, "invalid_request")
        err = ApiError(code, str(exc.detail), request_id=_request_id(request))
        resp = err.response()
        if exc.status_code not in (401, 404, 400):
            resp.status_code = exc.status_code
        return resp

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Reached only by an exception raised outside CatchAll (a middleware added later).
        log.exception("unhandled error")
        return internal_error(exc, _request_id(request)).response()
