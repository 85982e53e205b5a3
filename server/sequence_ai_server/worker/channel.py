"""The worker's persistent /act channel: a websocket at ``/act/ws`` carrying the /act framing.

One robot keeps one websocket open to its worker; every /act request is one binary message and
every answer one binary message, so a request costs no HTTP parsing, routing or connection
set-up. The semantics are HTTP ``/act``'s (``act.py``, the one act pipeline): the same body (JSON or the
binary framing of ``sequence_ai_core.protocol``, carried unchanged, so any field of the JSON part
rides along), the same answer body, the same error shape, codes and statuses, the same limits.

Messages (all big-endian; docs/design.md "The /act channel"):

* request, binary: ``seq`` (u32, the client's number for it) ``format`` (u8: 0 JSON, 1 the
  binary framing, 2 the binary framing with its frames in a shared-memory segment of the
  client's: the same-host path, ``shm.py``) then the /act body;
* answer, binary: ``seq`` (u32) ``status`` (u16, the HTTP status /act would answer) then the
  JSON answer body (an ``ActResponse`` for 200, else the common ``ErrorBody``). A client that
  sent ``x-seq-answer: rows-f64`` on the upgrade (``protocol.ANSWER_HEADER``) has it echoed on
  the accept, and its 200 answers carry the binary answer instead
  (``protocol.encode_act_answer``: the JSON with the chunk's rows as raw float64 after it);
* cancel, text: ``{"cancel": seq}`` -- a request still waiting in the replica's queue is dropped
  (no answer follows); one already running finishes and its answer is sent (the client drops it).
  A cancel for a seq not in flight (answered already, or never sent) is ignored.
* token, text: ``{"token": t}`` -- the channel's credentials from the next request on (a renewed
  lease: a renewal keeps the socket); checked by each request, as the first token is.
* a message of none of these shapes is answered 400 ``invalid_request`` (the channel stays open): a
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
1009 (``channel_max_size``), which the client reports as ``payload_too_large`` as well. These
checks and the string check are the act pipeline's (``act.ActPipeline``), the same as HTTP's.

Open connections: the /act channels and the openpi endpoint (``openpi.py``) share one budget
per worker (``connections.ConnectionBudget``, ``--max-connections``, default 64); past it an
upgrade is refused 503 ``too_many_connections`` before it is accepted.

Metering: every answered request is counted in the worker's ``meter.ActMeter`` like an HTTP /act
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

from sequence_ai_core.protocol import (ACT_CHANNEL_PATH, ANSWER_BINARY, ANSWER_HEADER, BINARY_CONTENT_TYPE,
                                       CHANNEL_FORMAT_BINARY, CHANNEL_FORMAT_JSON, CHANNEL_FORMAT_SHM,
                                       JSON_CONTENT_TYPE, LOCAL_HEADER)

from sequence_ai_server.common.errors import ApiError, new_request_id
from sequence_ai_server.worker.act import ActPipeline
from sequence_ai_server.worker.connections import MAX_CONNECTIONS
from sequence_ai_server.worker.local import LocalDoor
from sequence_ai_server.worker.shm import ChannelSegments

__all__ = ["add_act_channel", "ACT_CHANNEL_PATH", "MAX_CONNECTIONS", "MAX_CONTROL_CHARS", "MAX_IN_FLIGHT",
           "channel_max_size"]

log = logging.getLogger("sequence_ai_server.worker")

_REQUEST_HEAD = struct.Struct(">IB")
_ANSWER_HEAD = struct.Struct(">IH")
# Requests one channel may have in flight (read, queued or running) at once: the robot's client
# sends one at a time, so this only bounds what a misbehaving peer can make the worker hold.
MAX_IN_FLIGHT = 32
MAX_CONTROL_CHARS = 4096    # a text (control) message: {"cancel": seq} is ~20 characters
_CONTENT_TYPES = {CHANNEL_FORMAT_JSON: JSON_CONTENT_TYPE, CHANNEL_FORMAT_BINARY: BINARY_CONTENT_TYPE,
                  CHANNEL_FORMAT_SHM: BINARY_CONTENT_TYPE}
_WHERE = "the /act channel"


class _Channel:
    """One accepted websocket: reads requests, runs each as its own task, answers in any order."""

    def __init__(self, websocket: WebSocket, token: str, act: ActPipeline, binary_answer: bool = False) -> None:
        self.ws, self.token, self.act = websocket, token, act
        self.binary_answer = binary_answer   # 200s as protocol.encode_act_answer (asked for on the upgrade)
        self.queued: dict[int, Any] = {}     # seq -> the concurrent future of a request not yet answered
        self.tasks: set[asyncio.Task] = set()
        self.pending: set[int] = set()       # seq of every request read and not yet answered
        self.cancelled: set[int] = set()     # cancels that came before their request was queued
        self.segments: ChannelSegments = ChannelSegments(act.max_body_bytes)   # the same-host path's (shm.py)

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
            self.segments.close()

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
            await self.ws.send_bytes(_ANSWER_HEAD.pack(seq, exc.status) + exc.json_bytes())
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    async def send_error(self, exc: ApiError, seq: Any = None) -> None:
        """Answer a message that is no request or cancel with ``exc`` (module docstring): the
        binary answer for ``seq``, or a text message holding the error body when there is none."""
        exc.request_id = exc.request_id or new_request_id()
        try:
            if seq is None:
                await self.ws.send_text(exc.json_bytes().decode())
            else:
                await self.ws.send_bytes(_ANSWER_HEAD.pack(seq, exc.status) + exc.json_bytes())
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass

    async def control(self, text: str) -> None:
        seq = None
        if len(text) <= MAX_CONTROL_CHARS:
            try:
                message = json.loads(text)
                if isinstance(message, dict) and set(message) == {"cancel"}:   # exactly one key: no mixtures
                    seq = message["cancel"]
            except (ValueError, RecursionError):   # RecursionError: absurdly nested JSON
                message = None
            if isinstance(message, dict) and set(message) == {"token"} and isinstance(message["token"], str):
                # {"token": t}: the client's renewed lease, so a renewal keeps the socket. Not checked
                # here: every request checks the channel's token (401 when it is not good).
                self.token = message["token"]
                return
        if not isinstance(seq, int) or isinstance(seq, bool):
            log.info("/act channel: a text message that is neither a cancel nor a token (%d characters); answered 400",
                     len(text))
            await self.send_error(ApiError(
                "invalid_request", 'a text message on the /act channel is only {"cancel": seq} or '
                f'{{"token": t}} (at most {MAX_CONTROL_CHARS} characters); requests are binary messages',
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
            status, content = await self.act.settle(rid, self.run(seq, fmt, memoryview(data)[_REQUEST_HEAD.size:], rid),
                                                    _WHERE)
        except asyncio.CancelledError:
            if seq in self.queued:      # it ran (or runs on) for a client now gone: undelivered
                self.act.count(t0, 0, len(data) - _REQUEST_HEAD.size, 0)
            raise
        finally:
            self.queued.pop(seq, None)
            self.pending.discard(seq)
            self.cancelled.discard(seq)
        try:
            await self.ws.send_bytes(_ANSWER_HEAD.pack(seq, status) + content)
        except (WebSocketDisconnect, RuntimeError, OSError):
            status = 0                  # the client went away; its requests are cancelled
        self.act.count(t0, status, len(data) - _REQUEST_HEAD.size, len(content))

    async def run(self, seq: int, fmt: int, body: memoryview, rid: str) -> bytes:
        """One request through the act pipeline: credentials (expiry and revocation, per
        request), the format byte, size and strings, then the pipeline's run."""
        self.act.check_token(self.token)
        content_type = _CONTENT_TYPES.get(fmt)
        if content_type is None:
            raise ApiError("invalid_request", f"channel request format {fmt} is not 0 (JSON), 1 (binary) or 2 "
                           "(binary, frames in shared memory)", hint="see docs/design.md: The /act channel")
        if fmt == CHANNEL_FORMAT_SHM:
            body = self.segments.body(body)              # the JSON here, the frames from the client's segment
        raw = self.act.check_body(body, content_type)    # 413 and bad_string as HTTP /act words them

        def on_queued(future: Any) -> None:
            if seq in self.cancelled:       # cancelled while it was being decoded: never runs
                future.cancel()
            else:
                self.queued[seq] = future
        return await self.act.run(raw, content_type, rid, on_queued=on_queued, token=self.token,
                                  binary_answer=self.binary_answer)


def add_act_channel(app: Any, act: ActPipeline) -> None:
    """Add the ``/act/ws`` websocket route to the worker ``app``; ``act``: the worker's
    ``ActPipeline`` (its credentials, limits, capture, meter and connection budget). A client
    that asks with ``protocol.LOCAL_HEADER`` is told the same-host door's socket (``local.py``)."""
    door = LocalDoor(act, lambda conn, token: _Channel(conn, token, act, True).serve(),
                     channel_max_size(act.max_body_bytes))

    @app.websocket(ACT_CHANNEL_PATH)
    async def act_channel(websocket: WebSocket) -> None:
        """The persistent /act channel (module docstring). Bearer: the direct secret."""
        token = await act.admit(websocket, ACT_CHANNEL_PATH)
        if token is None:
            return
        binary_answer = websocket.headers.get(ANSWER_HEADER, "") == ANSWER_BINARY
        headers = [(ANSWER_HEADER.encode(), ANSWER_BINARY.encode())] if binary_answer else []
        ticket = ""
        try:
            if websocket.headers.get(LOCAL_HEADER) == "1":
                path = await door.address()
                if path is not None:
                    ticket = door.issue()       # the door takes this websocket's budget place over
                    headers.append((LOCAL_HEADER.encode(), f"{path} {ticket}".encode()))
            await websocket.accept(headers=headers or None)
            await _Channel(websocket, token, act, binary_answer).serve()
        finally:
            if door.settle(ticket):
                act.budget.release()


def channel_max_size(max_body_bytes: int) -> int:
    """The websocket message limit (bytes) for a worker with this /act body limit: twice the body
    limit (and 64 KiB more), so that a body somewhat over the limit is read and answered 413 like
    HTTP; a larger message closes the channel with 1009, which the client reports as
    ``payload_too_large`` too."""
    return 2 * max_body_bytes + 65536
