"""The worker's persistent /act channel: a websocket at ``/act/ws`` carrying the /act framing.

One robot keeps one websocket open to its worker; every /act request is one binary message and
every answer one binary message, so a request costs no HTTP parsing, routing or connection
set-up. The semantics are HTTP ``/act``'s (``worker_app.run_act``): the same body (JSON or the
binary framing of ``sequence_ai_core.protocol``, carried unchanged, so any field of the JSON part
rides along), the same answer body, the same error shape, codes and statuses, the same limits.

Messages (all big-endian; docs/design.md "The /act channel"):

* request, binary: ``seq`` (u32, the client's number for it) ``format`` (u8: 0 JSON, 1 the
  binary framing) then the /act body;
* answer, binary: ``seq`` (u32) ``status`` (u16, the HTTP status /act would answer) then the
  JSON answer body (an ``ActResponse`` for 200, else the common ``ErrorBody``);
* cancel, text: ``{"cancel": seq}`` -- a request still waiting in the replica's queue is dropped
  (no answer follows); one already running finishes and its answer is sent (the client drops it).
  A cancel for a seq not in flight (answered already, or never sent) is ignored.

At most ``MAX_IN_FLIGHT`` requests of one channel are in flight at once; one more is answered 503
``unavailable`` at once (the robot's client sends one at a time).

Credentials: ``Authorization: Bearer <direct secret or lease token>`` on the upgrade request,
checked before the websocket is accepted (a refusal is the HTTP 401 error body, like /act), and
again for every request (a lease that expires or a session the gateway ends is refused 401 from
its next request on; the client then reconnects through the gateway). A message over the body
limit is answered 413 ``payload_too_large``; one over twice the limit closes the channel with
1009 (``channel_max_size``), which the client reports as ``payload_too_large`` as well.

Metering: every answered request is counted in the worker's ``usage.ActMeter`` like an HTTP /act
(status, the body bytes after the request and answer heads, the time to answer); a request
cancelled before it ran, which gets no answer, is not counted.
"""
from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from sequence_ai_core.protocol import (ACT_CHANNEL_PATH, BINARY_CONTENT_TYPE, CHANNEL_FORMAT_BINARY,
                                       CHANNEL_FORMAT_JSON, JSON_CONTENT_TYPE)

from .errors import ApiError, new_request_id
from .json_guard import _json_part, check_json, scrub

__all__ = ["add_act_channel", "ACT_CHANNEL_PATH"]

log = logging.getLogger("sequence_ai_server.worker")

_REQUEST_HEAD = struct.Struct(">IB")
_ANSWER_HEAD = struct.Struct(">IH")
# Requests one channel may have in flight (read, queued or running) at once: the robot's client
# sends one at a time, so this only bounds what a misbehaving peer can make the worker hold.
MAX_IN_FLIGHT = 32
_CONTENT_TYPES = {CHANNEL_FORMAT_JSON: JSON_CONTENT_TYPE, CHANNEL_FORMAT_BINARY: BINARY_CONTENT_TYPE}


def _bearer(websocket: WebSocket) -> str:
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _error_bytes(exc: ApiError) -> bytes:
    return json.dumps(scrub(exc.body().model_dump()), separators=(",", ":")).encode()


async def _refuse(websocket: WebSocket, exc: ApiError) -> None:
    """Refuse the upgrade with ``exc`` as an HTTP answer (the ASGI denial-response extension),
    else close before accepting (the server then answers 403)."""
    if "websocket.http.response" in (websocket.scope.get("extensions") or {}):
        body = scrub(exc.body().model_dump())
        await websocket.send_denial_response(JSONResponse(body, status_code=exc.status))
    else:
        await websocket.close(code=4000 + exc.status, reason=exc.detail[:120])


class _Channel:
    """One accepted websocket: reads requests, runs each as its own task, answers in any order."""

    def __init__(self, websocket: WebSocket, token: str, state: Any, auth: Any, capture: Any,
                 max_body_bytes: int, meter: Any = None) -> None:
        self.ws, self.token, self.state, self.auth = websocket, token, state, auth
        self.capture, self.max_body_bytes, self.meter = capture, max_body_bytes, meter
        self.queued: dict[int, Any] = {}     # seq -> the concurrent future of a request not yet answered
        self.tasks: set[asyncio.Task] = set()
        self.pending: set[int] = set()       # seq of every request read and not yet answered
        self.cancelled: set[int] = set()     # cancels that came before their request was queued

    async def serve(self) -> None:
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                data = message.get("bytes")
                if data is not None and len(self.tasks) >= MAX_IN_FLIGHT:
                    await self.refuse_busy(data)
                elif data is not None:
                    if len(data) >= _REQUEST_HEAD.size:
                        self.pending.add(_REQUEST_HEAD.unpack_from(data)[0])
                    task = asyncio.ensure_future(self.answer(data))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                elif message.get("text") is not None:
                    self.control(message["text"])
        except WebSocketDisconnect:
            pass
        finally:
            for future in self.queued.values():
                future.cancel()          # a request not yet running is not run for a gone client
            for task in list(self.tasks):
                task.cancel()

    async def refuse_busy(self, data: bytes) -> None:
        """Answer a request over ``MAX_IN_FLIGHT`` at once with 503 ``unavailable`` (not queued)."""
        if len(data) < _REQUEST_HEAD.size:
            return
        seq, _ = _REQUEST_HEAD.unpack_from(data)
        exc = ApiError("unavailable", f"this channel already has {MAX_IN_FLIGHT} requests in flight",
                       details={"max_in_flight": MAX_IN_FLIGHT}, request_id=new_request_id(),
                       hint="wait for an answer before sending the next request")
        try:
            await self.ws.send_bytes(_ANSWER_HEAD.pack(seq, exc.status) + _error_bytes(exc))
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    def control(self, text: str) -> None:
        try:
            seq = json.loads(text).get("cancel")
        except (ValueError, AttributeError):
            return
        if not isinstance(seq, int):
            return
        future = self.queued.get(seq)
        if future is None:
            if seq in self.pending:         # read, not queued yet: dropped when it would be queued
                self.cancelled.add(seq)
            # else: answered already, or never sent -- nothing to drop (a later request is answered)
        elif future.cancel():
            self.queued.pop(seq, None)

    async def answer(self, data: bytes) -> None:
        if len(data) < _REQUEST_HEAD.size:
            return                      # nothing to answer to: not a request
        t0 = time.perf_counter()
        seq, fmt = _REQUEST_HEAD.unpack_from(data)
        if seq in self.cancelled:
            self.cancelled.discard(seq)
            self.pending.discard(seq)
            return
        rid = new_request_id()
        try:
            status, content = 200, await self.run(seq, fmt, memoryview(data)[_REQUEST_HEAD.size:], rid)
        except ApiError as exc:
            exc.request_id = exc.request_id or rid
            status, content = exc.status, _error_bytes(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in the server: 500 internal, the channel stays
            from .errors import _internal
            log.exception("unhandled error on the /act channel")
            err = _internal(exc, rid)
            status, content = err.status, _error_bytes(err)
        finally:
            self.queued.pop(seq, None)
            self.pending.discard(seq)
            self.cancelled.discard(seq)
        try:
            await self.ws.send_bytes(_ANSWER_HEAD.pack(seq, status) + content)
        except (WebSocketDisconnect, RuntimeError, OSError):
            status = 0                  # the client went away; its requests are cancelled
        if self.meter is not None:      # counted like HTTP /act (usage.py)
            self.meter.count((time.perf_counter() - t0) * 1000.0, status,
                             len(data) - _REQUEST_HEAD.size, len(content))

    async def run(self, seq: int, fmt: int, body: memoryview, rid: str) -> bytes:
        from .worker_app import run_act
        self.auth.check(self.token)               # expiry and revocation, per request
        content_type = _CONTENT_TYPES.get(fmt)
        if content_type is None:
            raise ApiError("invalid_request", f"channel request format {fmt} is not 0 (JSON) or 1 (binary)",
                           hint="see docs/design.md: The /act channel")
        if len(body) > self.max_body_bytes:
            raise ApiError("payload_too_large", f"body is {len(body)} bytes; this worker takes at most "
                           f"{self.max_body_bytes}", details={"limit_bytes": self.max_body_bytes},
                           hint="send JPEG frames at the declared camera size (the binary body avoids base64)")
        raw = bytes(body)
        part = _json_part(raw, content_type)
        bad = check_json(part) if part is not None else None
        if bad is not None:
            path, what = bad
            raise ApiError("invalid_request", f"the request body's string at {path} holds {what}; strings must be "
                           "valid Unicode without NUL", details={"reason": "bad_string", "path": path},
                           hint="send text as UTF-8 without NUL bytes or lone surrogates")
        host = self.state.ready_host()
        def on_queued(future: Any) -> None:
            if seq in self.cancelled:       # cancelled while it was being decoded: never runs
                future.cancel()
            else:
                self.queued[seq] = future
        return await run_act(host, raw, content_type, rid, self.capture, on_queued=on_queued)


def add_act_channel(app: Any, state: Any, auth: Any, max_body_bytes: int) -> None:
    """Add the ``/act/ws`` websocket route to the worker ``app`` (``state``: the WorkerState,
    ``auth``: the app's ``leases.DirectAuth``; ``max_body_bytes``: the /act body limit)."""
    capture = app.state.capture

    @app.websocket(ACT_CHANNEL_PATH)
    async def act_channel(websocket: WebSocket) -> None:
        """The persistent /act channel (module docstring). Bearer: the direct secret."""
        token = _bearer(websocket)
        try:
            if not token:
                raise ApiError("unauthorized", "missing or wrong direct secret",
                               hint="send `Authorization: Bearer <direct_secret>` from POST /v1/connect")
            auth.check(token)
        except ApiError as exc:
            exc.request_id = new_request_id()
            await _refuse(websocket, exc)
            return
        await websocket.accept()
        await _Channel(websocket, token, state, auth, capture, max_body_bytes,
                       getattr(app.state, "act_meter", None)).serve()


def channel_max_size(max_body_bytes: int) -> int:
    """The websocket message limit (bytes) for a worker with this /act body limit: twice the body
    limit (and 64 KiB more), so that a body somewhat over the limit is read and answered 413 like
    HTTP; a larger message closes the channel with 1009, which the client reports as
    ``payload_too_large`` too."""
    return 2 * max_body_bytes + 65536
