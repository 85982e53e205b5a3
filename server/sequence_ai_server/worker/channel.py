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
import threading
import time
from typing import Any, Optional

from starlette.websockets import WebSocket, WebSocketDisconnect

from sequence_ai_core.protocol import (ACT_CHANNEL_PATH, ANSWER_BINARY, ANSWER_HEADER, BINARY_CONTENT_TYPE,
                                       CHANNEL_FORMAT_BINARY, CHANNEL_FORMAT_JSON, CHANNEL_FORMAT_SHM,
                                       JSON_CONTENT_TYPE, LOCAL_HEADER, LOCAL_VERSION, LOCAL_VERSION_HEADER)
from sequence_ai_core.framing import MessageTooLarge

from sequence_ai_server.common.body_limit import too_large
from sequence_ai_server.common.errors import ApiError, new_request_id
from sequence_ai_server.worker.act import ActPipeline, request_timed_out
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
WATCH_SEND_S = 1.0          # how long the door's watch waits to hand a 504 to a client not reading (s)
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
        await self.send_error(*_short_request(data))

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
        word, value = _control(text)
        if word == "token":
            self.token = value
            return
        if word is None:
            await self.send_error(_bad_control(text))
            return
        seq = value
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
        request), the format byte, size and strings (:func:`_checked`), then the pipeline's run."""
        raw = _checked(self.act, self.token, fmt, body, self.segments)
        content_type = _CONTENT_TYPES[fmt]

        def on_queued(future: Any) -> None:
            if seq in self.cancelled:       # cancelled while it was being decoded: never runs
                future.cancel()
            else:
                self.queued[seq] = future
        return await self.act.run(raw, content_type, rid, on_queued=on_queued, token=self.token,
                                  binary_answer=self.binary_answer)


def _short_request(data: bytes) -> tuple[ApiError, Any]:
    """A binary message shorter than the request head -> (its 400, its ``seq`` or None)."""
    seq = struct.unpack_from(">I", data)[0] if len(data) >= 4 else None
    return ApiError("invalid_request", f"a channel request is seq (u32) and format (u8), then the /act body; "
                    f"this binary message has {len(data)} bytes", details={"reason": "short_request"},
                    hint="see docs/design.md: The /act channel"), seq


def _control(text: str) -> tuple[Optional[str], Any]:
    """A text message -> ``("cancel", seq)``, ``("token", t)`` (the client's renewed lease, so a
    renewal keeps the socket; not checked here: every request checks the channel's token), or
    ``(None, None)`` for anything else."""
    if len(text) > MAX_CONTROL_CHARS:
        return None, None
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):   # RecursionError: absurdly nested JSON
        return None, None
    if isinstance(message, dict) and set(message) == {"token"} and isinstance(message["token"], str):
        return "token", message["token"]
    if isinstance(message, dict) and set(message) == {"cancel"}:      # exactly one key: no mixtures
        seq = message["cancel"]
        if isinstance(seq, int) and not isinstance(seq, bool):
            return "cancel", seq
    return None, None


def _bad_control(text: str) -> ApiError:
    log.info("/act channel: a text message that is neither a cancel nor a token (%d characters); answered 400",
             len(text))
    return ApiError("invalid_request", 'a text message on the /act channel is only {"cancel": seq} or '
                    f'{{"token": t}} (at most {MAX_CONTROL_CHARS} characters); requests are binary messages',
                    details={"reason": "bad_control"}, hint="see docs/design.md: The /act channel")


class _DoorChannel:
    """The channel's messages on one same-host door connection (``local.py``), served on that
    connection's own thread, one request at a time: read, checked and run through the act
    pipeline's blocking form (``ActPipeline.run_blocking``: a cheap policy runs right here), then
    answered, with no event loop or task between the socket and the policy. The messages,
    answers, errors, limits and metering are the websocket's (:class:`_Channel`); since nothing
    is in flight while the door reads, a cancel always names a request answered already and is
    ignored, and there is no in-flight limit to meet. A request still running past
    ``timeouts.request`` (one that hangs on this thread) is answered 504 ``request_timeout`` by
    the door's watch (:meth:`overdue`), as the event loop's timer answers it on the websocket, and
    the door shuts the connection (its late result is dropped; the client's next request comes on
    a new connection). ``conn``: a ``framing.FramedSocket``."""

    def __init__(self, conn: Any, token: str, act: ActPipeline, max_size: int) -> None:
        self.conn, self.token, self.act, self.max_size = conn, token, act, max_size
        self.segments = ChannelSegments(act.max_body_bytes)
        self._send_lock = threading.Lock()     # this thread's answers and the watch's 504s
        self._running: Optional[tuple] = None    # (seq, started perf_counter s, request id, bytes in)

    def serve(self) -> None:
        """Until the client closes the connection or sends a message over ``max_size``."""
        try:
            while True:
                kind, data = self.conn.receive_message(None, self.max_size)
                if kind != 0:
                    word, value = _control(data.decode("utf-8", "replace"))
                    if word == "token":
                        self.token = value
                    elif word is None:
                        self.send_error(_bad_control(data.decode("utf-8", "replace")))
                elif len(data) < _REQUEST_HEAD.size:
                    self.send_error(*_short_request(data))
                else:
                    self.answer(data)
        except MessageTooLarge as exc:   # none of it read: answer 413 when it names its seq, then close
            if exc.kind == 0 and len(exc.head) >= 4:
                try:
                    self.send_error(too_large(self.act.max_body_bytes, exc.size - _REQUEST_HEAD.size),
                                    struct.unpack_from(">I", exc.head)[0])
                except OSError:
                    pass
        except OSError:           # closed or reset
            pass
        finally:
            self.segments.close()

    def send_error(self, exc: ApiError, seq: Any = None) -> None:
        exc.request_id = exc.request_id or new_request_id()
        if seq is None:
            self.conn.send(exc.json_bytes(), 1)
        else:
            self.conn.send(_ANSWER_HEAD.pack(seq, exc.status) + exc.json_bytes())

    def answer(self, data: bytes) -> None:
        t0 = time.perf_counter()
        seq, fmt = _REQUEST_HEAD.unpack_from(data)
        rid = new_request_id()
        self._running = (seq, t0, rid, len(data) - _REQUEST_HEAD.size)
        status, content = self.act.settle_blocking(
            rid, lambda: self.run(fmt, memoryview(data)[_REQUEST_HEAD.size:], rid), "the same-host door")
        with self._send_lock:
            if self._running is None:  # the watch answered it 504 already: a late result is dropped
                return
            self._running = None
            try:
                self.conn.send(_ANSWER_HEAD.pack(seq, status) + content)
            except OSError:
                status = 0            # the client went away
                raise
            finally:
                self.act.count(t0, status, len(data) - _REQUEST_HEAD.size, len(content))

    def overdue(self, now: float) -> bool:
        """Called by the door's watch thread (``now``: ``time.perf_counter()``): answer the running
        request 504 ``request_timeout`` once it has run the host's ``timeouts.request`` -> True
        (the door then gives this connection up: its thread is held by the call, which goes on).
        False while nothing is overdue."""
        running = self._running
        if running is None:
            return False
        timeout_s = self.act.request_timeout_s()
        if timeout_s is None or now - running[1] <= timeout_s:
            return False
        with self._send_lock:
            if self._running is not running:
                return False
            self._running = None
            seq, t0, rid, size_in = running
            exc = request_timed_out(rid, timeout_s)
            exc.request_id = rid
            try:
                self.conn.send(_ANSWER_HEAD.pack(seq, exc.status) + exc.json_bytes(), 0, WATCH_SEND_S)
            except OSError:
                pass                  # the client went away, or is not reading: the door shuts it
            self.act.count(t0, exc.status, size_in, len(exc.json_bytes()))
            return True

    def run(self, fmt: int, body: memoryview, rid: str) -> bytes:
        """:meth:`_Channel.run`'s checks, then the pipeline on this thread."""
        raw = _checked(self.act, self.token, fmt, body, self.segments)
        return self.act.run_blocking(raw, _CONTENT_TYPES[fmt], rid, token=self.token, binary_answer=True)


def _checked(act: ActPipeline, token: str, fmt: int, body: memoryview, segments: ChannelSegments) -> Any:
    """One channel request's checks -> its /act body: credentials (expiry and revocation, per
    request), the format byte (a shared-memory request's frames read from its segment), size
    and strings. Raises ApiError."""
    act.check_token(token)
    content_type = _CONTENT_TYPES.get(fmt)
    if content_type is None:
        raise ApiError("invalid_request", f"channel request format {fmt} is not 0 (JSON), 1 (binary) or 2 "
                       "(binary, frames in shared memory)", hint="see docs/design.md: The /act channel")
    if fmt == CHANNEL_FORMAT_SHM:
        body = segments.body(body)              # the JSON here, the frames from the client's segment
    return act.check_body(body, content_type)   # 413 and bad_string as HTTP /act words them


def add_act_channel(app: Any, act: ActPipeline) -> None:
    """Add the ``/act/ws`` websocket route to the worker ``app``; ``act``: the worker's
    ``ActPipeline`` (its credentials, limits, capture, meter and connection budget). A client
    that asks with ``protocol.LOCAL_HEADER`` is told the same-host door's socket (``local.py``)."""
    max_size = channel_max_size(act.max_body_bytes)
    door = LocalDoor(act, lambda conn, token: _DoorChannel(conn, token, act, max_size))

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
                    headers.append((LOCAL_VERSION_HEADER.encode(), str(LOCAL_VERSION).encode()))
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
