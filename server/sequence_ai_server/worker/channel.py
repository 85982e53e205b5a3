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
* a message of neither shape is answered 400 ``invalid_request`` (the channel stays open): a
  binary message shorter than the 5-byte head with the binary answer when it holds a ``seq``
  (``details.reason`` ``short_request``), else -- fewer than 4 bytes, or a text message that is
  not ``{"cancel": seq}`` (not JSON, nested past the parser's depth, over ``MAX_CONTROL_CHARS``,
  no integer ``cancel``; ``details.reason`` ``bad_control``) -- with a text message holding the
  common error body, since there is no ``seq`` to answer to.

At most ``MAX_IN_FLIGHT`` requests of one channel are in flight at once; one more is answered 503
``unavailable`` at once (the robot's client sends one at a time).

Credentials: ``Authorization: Bearer <direct secret or lease token>`` on the upgrade request,
checked before the websocket is accepted (a refusal is the HTTP 401 error body, like /act), and
again for every request (a lease that expires or a session the gateway ends is refused 401 from
its next request on; the client then reconnects through the gateway). A message over the body
limit is answered 413 ``payload_too_large``; one over twice the limit closes the channel with
1009 (``channel_max_size``), which the client reports as ``payload_too_large`` as well.

Open connections: the /act channels and the openpi endpoint (``openpi_compat.py``) share one
budget per worker, :class:`ConnectionBudget` (``--max-connections`` /
``$SEQ_WORKER_MAX_CONNECTIONS``, default ``MAX_CONNECTIONS`` = 64). Past it a new upgrade is
refused before it is accepted, with HTTP 503 ``too_many_connections`` (retryable, Retry-After)
in the common error body, after its credentials were checked; the open connections are never
dropped. A connection frees its place when its handler ends: a close, or the TCP connection
going away without a closing handshake (a killed client).

Metering: every answered request is counted in the worker's ``usage.ActMeter`` like an HTTP /act
(status, the body bytes after the request and answer heads, the time to answer). A request that
ran, or was running, when the client went away is counted with status 0 (an error: nothing was
delivered) and no bytes out; a request cancelled before it ran, which gets no answer, is not
counted.
"""
from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from sequence_ai_core.protocol import (ACT_CHANNEL_PATH, BINARY_CONTENT_TYPE, CHANNEL_FORMAT_BINARY,
                                       CHANNEL_FORMAT_JSON, JSON_CONTENT_TYPE)

from sequence_ai_server.common.body_limit import check_size
from sequence_ai_server.common.errors import ApiError, new_request_id
from sequence_ai_server.common.json_guard import _json_part, check_json, scrub

__all__ = ["add_act_channel", "ACT_CHANNEL_PATH", "ConnectionBudget", "connection_budget", "MAX_CONNECTIONS"]

log = logging.getLogger("sequence_ai_server.worker")

_REQUEST_HEAD = struct.Struct(">IB")
_ANSWER_HEAD = struct.Struct(">IH")
# Requests one channel may have in flight (read, queued or running) at once: the robot's client
# sends one at a time, so this only bounds what a misbehaving peer can make the worker hold.
MAX_IN_FLIGHT = 32
# Persistent connections (/act channels and openpi websockets together) one worker holds open at
# once: a worker serves a few robots, each with one; the rest of the budget is for reconnects
# overlapping a not-yet-noticed drop. Each costs a file descriptor, a task and its buffers.
MAX_CONNECTIONS = 64
MAX_CONTROL_CHARS = 4096    # a text (control) message: {"cancel": seq} is ~20 characters
_REFUSAL_LOG_S = 10.0       # at most one warning per this many seconds about refused connections
_CONTENT_TYPES = {CHANNEL_FORMAT_JSON: JSON_CONTENT_TYPE, CHANNEL_FORMAT_BINARY: BINARY_CONTENT_TYPE}


def _bearer(websocket: WebSocket) -> str:
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _error_bytes(exc: ApiError) -> bytes:
    return json.dumps(scrub(exc.body().model_dump()), separators=(",", ":")).encode()


async def _refuse(websocket: WebSocket, exc: ApiError) -> None:
    """Refuse the upgrade with ``exc`` as an HTTP answer (the ASGI denial-response extension:
    the common error body, ``X-Request-ID`` and ``Retry-After`` headers), else close before
    accepting (the server then answers 403)."""
    if "websocket.http.response" in (websocket.scope.get("extensions") or {}):
        await websocket.send_denial_response(exc.response())
    else:
        await websocket.close(code=4000 + exc.status, reason=exc.detail[:120])


class ConnectionBudget:
    """The places for persistent websocket connections of one worker, shared by the /act
    channel and the openpi endpoint. ``limit``: the most open at once (>= 1; from
    ``--max-connections`` / ``$SEQ_WORKER_MAX_CONNECTIONS``, default ``MAX_CONNECTIONS``).
    Used from the event loop only: :meth:`take` and :meth:`release` never await, so a check and
    its reservation cannot interleave with another upgrade."""

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        if int(limit) < 1:
            raise ValueError(f"the connection limit is {limit}; give a whole number >= 1 (default {MAX_CONNECTIONS})")
        self.limit = int(limit)
        self.open = 0
        self.refused = 0
        self._logged_at = -_REFUSAL_LOG_S

    def take(self, path: str) -> None:
        """Reserve a place for a connection to ``path`` (for the message). Raises ApiError
        ``too_many_connections`` (503, retryable, ``retry_after_s`` 1) when all are taken."""
        if self.open < self.limit:
            self.open += 1
            return
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= _REFUSAL_LOG_S:
            self._logged_at = now
            log.warning("refused a websocket to %s: %d of %d connections open (%d refused so far); "
                        "raise --max-connections / $SEQ_WORKER_MAX_CONNECTIONS if these are real robots",
                        path, self.open, self.limit, self.refused)
        raise ApiError("too_many_connections", f"this worker already holds {self.open} open websocket connections, "
                       f"its limit ({self.limit}, the /act channel and the openpi endpoint together)",
                       retry_after_s=1.0, details={"open": self.open, "limit": self.limit},
                       hint="close connections you no longer use (one per robot); POST /act still answers, or "
                            "the operator raises the worker's --max-connections / $SEQ_WORKER_MAX_CONNECTIONS")

    def release(self) -> None:
        """Free the place of a connection that ended (or was never accepted)."""
        self.open = max(0, self.open - 1)


def connection_budget(app: Any) -> ConnectionBudget:
    """The worker ``app``'s shared :class:`ConnectionBudget` (``app.state.connections``; made
    with ``MAX_CONNECTIONS`` places when the app has none yet)."""
    budget = getattr(app.state, "connections", None)
    if budget is None:
        budget = app.state.connections = ConnectionBudget()
    return budget


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
                if data is not None and len(data) < _REQUEST_HEAD.size:
                    await self.refuse_short(data)
                elif data is not None and len(self.tasks) >= MAX_IN_FLIGHT:
                    await self.refuse_busy(data)
                elif data is not None:
                    self.pending.add(_REQUEST_HEAD.unpack_from(data)[0])
                    task = asyncio.ensure_future(self.answer(data))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                elif message.get("text") is not None:
                    await self.control(message["text"])
        except WebSocketDisconnect:
            pass
        finally:
            for seq, future in list(self.queued.items()):
                if future.cancel():      # a request not yet running is not run for a gone client
                    self.queued.pop(seq, None)
            for task in list(self.tasks):
                task.cancel()            # one still running is counted undelivered (answer())

    async def refuse_short(self, data: bytes) -> None:
        """Answer a binary message shorter than the request head with 400 ``invalid_request``:
        tagged with its ``seq`` when it holds one (4 bytes), else as a text message."""
        seq = struct.unpack_from(">I", data)[0] if len(data) >= 4 else None
        await self.send_error(ApiError(
            "invalid_request", f"a channel request is seq (u32) and format (u8), then the /act body; "
            f"this binary message has {len(data)} bytes", details={"reason": "short_request"},
            hint="see docs/design.md: The /act channel"), seq)

    async def refuse_busy(self, data: bytes) -> None:
        """Answer a request over ``MAX_IN_FLIGHT`` at once with 503 ``unavailable`` (not queued)."""
        seq, _ = _REQUEST_HEAD.unpack_from(data)
        exc = ApiError("unavailable", f"this channel already has {MAX_IN_FLIGHT} requests in flight",
                       details={"max_in_flight": MAX_IN_FLIGHT}, request_id=new_request_id(),
                       hint="wait for an answer before sending the next request")
        try:
            await self.ws.send_bytes(_ANSWER_HEAD.pack(seq, exc.status) + _error_bytes(exc))
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    async def send_error(self, exc: ApiError, seq: Any = None) -> None:
        """Answer a message that is no request or cancel with ``exc`` (module docstring): the
        binary answer for ``seq``, or a text message holding the error body when there is none."""
        exc.request_id = exc.request_id or new_request_id()
        try:
            if seq is None:
                await self.ws.send_text(_error_bytes(exc).decode())
            else:
                await self.ws.send_bytes(_ANSWER_HEAD.pack(seq, exc.status) + _error_bytes(exc))
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    async def control(self, text: str) -> None:
        seq = None
        if len(text) <= MAX_CONTROL_CHARS:
            try:
                seq = json.loads(text).get("cancel")
            except (ValueError, AttributeError, RecursionError):   # RecursionError: absurdly nested JSON
                pass
        if not isinstance(seq, int) or isinstance(seq, bool):
            log.info("/act channel: a text message that is not a cancel (%d characters); answered 400", len(text))
            await self.send_error(ApiError(
                "invalid_request", 'a text message on the /act channel is only {"cancel": seq} '
                f"(at most {MAX_CONTROL_CHARS} characters); requests are binary messages",
                details={"reason": "bad_control"}, hint="see docs/design.md: The /act channel"))
            return
        future = self.queued.get(seq)
        if future is None:
            if seq in self.pending:         # read, not queued yet: dropped when it would be queued
                self.cancelled.add(seq)
            # else: answered already, or never sent -- nothing to drop (a later request is answered)
        elif future.cancel():
            self.queued.pop(seq, None)

    async def answer(self, data: bytes) -> None:
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
            if seq in self.queued:      # it ran (or runs on) for a client now gone: undelivered
                self.count(t0, 0, data, b"")
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in the server: 500 internal, the channel stays
            from sequence_ai_server.common.errors import _internal
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
        self.count(t0, status, data, content)

    def count(self, t0: float, status: int, data: bytes, content: bytes) -> None:
        """Meter one request like an HTTP /act (usage.py): ``status`` 0 is an answer that never
        reached the client (counted as an error, with no bytes out)."""
        if self.meter is not None:
            self.meter.count((time.perf_counter() - t0) * 1000.0, status,
                             len(data) - _REQUEST_HEAD.size, len(content) if status else 0)

    async def run(self, seq: int, fmt: int, body: memoryview, rid: str) -> bytes:
        from sequence_ai_server.worker.app import run_act
        self.auth.check(self.token)               # expiry and revocation, per request
        content_type = _CONTENT_TYPES.get(fmt)
        if content_type is None:
            raise ApiError("invalid_request", f"channel request format {fmt} is not 0 (JSON) or 1 (binary)",
                           hint="see docs/design.md: The /act channel")
        check_size(len(body), self.max_body_bytes)    # 413 as HTTP /act words it (body_limit.py)
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
    ``auth``: the app's ``leases.DirectAuth``; ``max_body_bytes``: the /act body limit). Its
    connections count against ``connection_budget(app)``."""
    capture = app.state.capture
    budget = connection_budget(app)

    @app.websocket(ACT_CHANNEL_PATH)
    async def act_channel(websocket: WebSocket) -> None:
        """The persistent /act channel (module docstring). Bearer: the direct secret."""
        token = _bearer(websocket)
        try:
            if not token:
                raise ApiError("unauthorized", "missing or wrong direct secret",
                               hint="send `Authorization: Bearer <direct_secret>` from POST /v1/connect")
            auth.check(token)
            budget.take(ACT_CHANNEL_PATH)
        except ApiError as exc:
            exc.request_id = new_request_id()
            await _refuse(websocket, exc)
            return
        try:
            await websocket.accept()
            await _Channel(websocket, token, state, auth, capture, max_body_bytes,
                           getattr(app.state, "act_meter", None)).serve()
        finally:
            budget.release()


def channel_max_size(max_body_bytes: int) -> int:
    """The websocket message limit (bytes) for a worker with this /act body limit: twice the body
    limit (and 64 KiB more), so that a body somewhat over the limit is read and answered 413 like
    HTTP; a larger message closes the channel with 1009, which the client reports as
    ``payload_too_large`` too."""
    return 2 * max_body_bytes + 65536
