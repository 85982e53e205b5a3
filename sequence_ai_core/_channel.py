"""The client end of the persistent /act channel: one websocket to the worker's ``/act/ws``.

The worker side and the message layout are in ``server/sequence_ai_server/worker/channel.py`` and
docs/design.md ("The /act channel"): a request is ``seq`` (u32) ``format`` (u8) + the /act body
exactly as HTTP /act takes it (``protocol.encode_act_body``); an answer is ``seq`` (u32)
``status`` (u16) + the JSON body HTTP /act would answer. ``ActChannel.request`` hands that back as
an ``httpx.Response`` (an ``_transport.AsyncActTransport``) so the session client's HTTP handling
(401 -> reconnect, 415, the error table) applies unchanged. A text message ``{"token": ...}``
hands the worker a renewed lease, so a renewal keeps the socket.

To a worker on this machine (a loopback address, ``_local.same_host``; or on the shared-memory
path) the channel asks for the worker's same-host door on its upgrade and, when it is named,
moves there as the blocking channel does (``_local.AsyncDoor``: the same messages over a Unix
socket, without the websocket's framing, masking and ASGI hops) and closes the websocket;
``$SEQ_CLIENT_DOOR=0`` keeps it on the websocket, and so does a door that cannot be opened or
has no place (503).

The websocket client is the ``websockets`` package (asyncio API). It is optional: when it is not
installed (``available()`` is False) the wire uses HTTP /act, and so it does when a worker has no
channel (an older worker: the upgrade is answered 403/404) -- ``ChannelUnsupported``.
Why a robot client carries the extra package (``bench/bench_wire.py``, one run on a loaded 2-core
machine, 2 x 224x224 JPEG frames): per request the channel cost 0.97 ms of client CPU and 1.09 ms
of worker CPU against 2.23 ms and 1.53 ms for httpx + ``POST /act``, and p50 1.81 ms against 3.70 ms.
"""
from __future__ import annotations

import asyncio
import json
import struct
import sys
from typing import Any, Optional

import httpx

from . import _local, _shm
from ._errors import TransportError
from .protocol import (ACT_CHANNEL_PATH, ANSWER_BINARY, ANSWER_HEADER, BINARY_ANSWER_CONTENT_TYPE, CHANNEL_FORMAT_BINARY,
                       CHANNEL_FORMAT_JSON, CHANNEL_FORMAT_SHM, LOCAL_HEADER, LOCAL_VERSION_HEADER, MAX_BODY_BYTES,
                       FramingError, decode_act_answer)

__all__ = ["ActChannel", "ChannelDropped", "ChannelUnsupported", "available", "channel_url"]

_REQUEST_HEAD = struct.Struct(">IB")
_ANSWER_HEAD = struct.Struct(">IH")
_JSON_HEADERS = {"content-type": "application/json"}
_BINARY_HEADERS = {"content-type": BINARY_ANSWER_CONTENT_TYPE}


class ChannelAnswer:
    """A 200 answer off a channel: what the wire reads of an ``httpx.Response`` (``status_code``,
    ``is_error``, ``headers.get``, ``content``, ``json()``, ``text``), without building one (an
    ``httpx.Response`` costs ~13 us of client CPU per answer, this 0.2 us). ``headers["content-type"]`` is
    ``BINARY_ANSWER_CONTENT_TYPE`` for a binary answer, else JSON."""

    __slots__ = ("content", "headers")
    status_code = 200
    is_error = False

    def __init__(self, content: bytes, binary: bool) -> None:
        self.content, self.headers = content, _BINARY_HEADERS if binary else _JSON_HEADERS

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


def answer_response(status: int, body: bytes, binary_answers: bool) -> Any:
    """One channel answer's body as the response the wire reads: a 200 is a ``ChannelAnswer``
    (binary, ``protocol.decode_act_answer``, on a channel whose worker echoed
    ``protocol.ANSWER_HEADER``, else JSON); any other status an ``httpx.Response`` holding the
    JSON error body (``from_response`` reads it)."""
    if status == 200:
        return ChannelAnswer(body, binary_answers)
    return httpx.Response(status, content=body, headers=_JSON_HEADERS)


def request_message(seq: int, content: Any, binary: bool, segment: Any) -> bytes:
    """One request message: the 5-byte head then the body (bytes, or a ``protocol.BinaryBody``);
    with a same-host ``segment`` (``_shm.ShmSegment``) a binary body's frames go into it
    (``CHANNEL_FORMAT_SHM``)."""
    if segment is not None and binary:
        return _REQUEST_HEAD.pack(seq, CHANNEL_FORMAT_SHM) + _shm.shm_message(segment, content)
    return _REQUEST_HEAD.pack(seq, CHANNEL_FORMAT_BINARY if binary else CHANNEL_FORMAT_JSON) + bytes(content)


def answer_data(response: httpx.Response) -> Any:
    """A 2xx /act answer's data: its JSON, or the channel's binary answer decoded
    (``protocol.decode_act_answer``). Raises TransportError for a binary answer that does not
    decode (a worker fault)."""
    if response.headers.get("content-type") != BINARY_ANSWER_CONTENT_TYPE:
        return response.json()
    try:
        return decode_act_answer(response.content)
    except FramingError as exc:
        raise TransportError(f"the worker's binary /act answer is malformed: {exc}",
                             hint="the worker and this client disagree on protocol.encode_act_answer") from None
# Open (upgrade) timeout (s): a worker on loopback answers in milliseconds.
OPEN_TIMEOUT_S = 10.0
# Keepalive pings while the channel is idle (s); a dead peer is noticed within about twice this.
PING_INTERVAL_S = 20.0

try:  # optional: without it the wire uses HTTP /act
    from websockets.asyncio.client import connect as _ws_connect
    from websockets.exceptions import ConnectionClosed as _Closed
    from websockets.exceptions import InvalidStatus as _InvalidStatus
    from websockets.exceptions import WebSocketException as _WsError
except ImportError:  # pragma: no cover - exercised by the fallback test with a blocked import
    _ws_connect = None


def available() -> bool:
    """True when the ``websockets`` package can be imported (the channel can be used)."""
    return _ws_connect is not None


class ChannelDropped(ConnectionError):
    """The channel closed or failed under a request: the wire reconnects and replays, as for a
    dropped HTTP connection. ``sent``: the request had started to go out (the worker may have
    run it)."""

    sent = False


class ChannelUnsupported(Exception):
    """The worker has no /act channel (its upgrade answer was not 101 nor an error of ours):
    the wire uses HTTP /act for this session."""


def channel_url(worker_url: str) -> str:
    """``http://host:port`` -> ``ws://host:port/act/ws`` (https -> wss)."""
    if worker_url.startswith("https://"):
        return "wss://" + worker_url[len("https://"):] + ACT_CHANNEL_PATH
    return "ws://" + worker_url.split("://", 1)[-1] + ACT_CHANNEL_PATH


def _timeout(seconds: float) -> Any:
    if sys.version_info >= (3, 11):
        return asyncio.timeout(seconds)   # no extra task per request (wait_for makes one before 3.12)
    return _WaitFor(seconds)


class _WaitFor:  # pragma: no cover - Python 3.10 only
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.handle: Optional[asyncio.TimerHandle] = None
        self.fired = False

    async def __aenter__(self) -> None:
        task = asyncio.current_task()

        def fire() -> None:
            self.fired = True
            task.cancel()
        self.handle = asyncio.get_running_loop().call_later(self.seconds, fire)

    async def __aexit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        self.handle.cancel()
        if self.fired and kind is asyncio.CancelledError:
            raise asyncio.TimeoutError
        return False


def _too_large(size: int) -> httpx.Response:
    """The answer for a message the worker closed the channel on (1009, message too big): the
    same 413 ``payload_too_large`` error body HTTP /act answers."""
    body = {"detail": f"body is {size} bytes; over this worker's limit (it closed the channel: 1009)",
            "code": "payload_too_large", "retryable": False,
            "hint": "send JPEG frames at the declared camera size (the binary body avoids base64)"}
    return httpx.Response(413, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


class ActChannel:
    """One open websocket to one worker, bound to the token it was opened with; or, to a worker
    on this machine, its same-host door (``local``), which the websocket handed over to.

    Not thread-safe: one event loop, one request at a time (the wire's ``act`` is sequential).
    A request cancelled while it waits (interrupt) sends a cancel message: the worker drops it
    if it has not started; an answer that still arrives is skipped by its sequence number.

    Args:
        worker_url: the worker's base URL (``http://127.0.0.1:PORT``).
        token: the direct secret / lease token, sent as ``Authorization: Bearer`` when opening.
        timeout_s: how long a request may wait for its answer (s; the wire's ``timeout_s``).
        shm: send binary bodies' frames through a shared-memory segment (the same-host path,
            ``_shm``; the worker must run on this machine as this user).

    The door is asked for, taken and left as by ``_blocking.BlockingChannel``: on the
    shared-memory path and to any worker on a loopback address (``$SEQ_CLIENT_DOOR=0``: never);
    a client without a segment takes only a door of ``LOCAL_VERSION_HEADER`` 2 or later (one that
    answers an oversized message 413); a door that cannot be opened or answers 503 leaves the
    channel on its websocket, and its 401 is returned as the websocket's refusal would be.
    """

    def __init__(self, worker_url: str, token: str, timeout_s: float, shm: bool = False) -> None:
        self.worker_url, self.token, self.timeout_s = worker_url, token, timeout_s
        self.segment = _shm.ShmSegment() if shm else None
        self._ws: Any = None
        self._seq = 0
        self.requests = 0
        self.binary_answers = False     # the worker echoed protocol.ANSWER_HEADER: 200s are binary

    @property
    def open(self) -> bool:
        """True while the websocket (or the door) is open."""
        return self._ws is not None

    @property
    def local(self) -> Optional[_local.AsyncDoor]:
        """The same-host door while the channel is on it, else None."""
        ws = self._ws
        return ws if isinstance(ws, _local.AsyncDoor) else None

    async def connect(self) -> Optional[httpx.Response]:
        """Open the websocket. -> None when open, or the worker's refusal as an httpx.Response
        (e.g. 401 with the error body: the wire reconnects through the gateway).

        Raises:
            ChannelUnsupported: the worker has no channel (403/404/426 without our error body).
            ChannelDropped: the worker could not be reached or the upgrade failed midway.
        """
        headers = {"Authorization": f"Bearer {self.token}", ANSWER_HEADER: ANSWER_BINARY}
        if self.segment is not None or _local.same_host(self.worker_url):
            headers[LOCAL_HEADER] = "1"
        deadline = asyncio.get_running_loop().time() + min(OPEN_TIMEOUT_S, self.timeout_s)
        try:
            self._ws = await _ws_connect(
                channel_url(self.worker_url), additional_headers=headers,
                max_size=MAX_BODY_BYTES + 1024, compression=None, open_timeout=min(OPEN_TIMEOUT_S, self.timeout_s),
                ping_interval=PING_INTERVAL_S, ping_timeout=PING_INTERVAL_S, proxy=None, user_agent_header=None)
        except _InvalidStatus as exc:
            response = exc.response
            body = bytes(response.body or b"")
            if response.status_code in (401, 503) and body.startswith(b"{"):
                return httpx.Response(response.status_code, content=body,
                                      headers={"content-type": "application/json"})
            raise ChannelUnsupported(f"{self.worker_url} answered the channel upgrade with "
                                     f"{response.status_code}") from None
        except (OSError, asyncio.TimeoutError, _WsError) as exc:
            raise ChannelDropped(f"could not open the /act channel to {self.worker_url}: {exc!r}") from exc
        accept = self._ws.response.headers
        self.binary_answers = accept.get(ANSWER_HEADER) == ANSWER_BINARY
        named = accept.get(LOCAL_HEADER)
        if not named or (self.segment is None and _local.door_version(accept.get(LOCAL_VERSION_HEADER)) < 2):
            return None         # no door, or an older one: it closes on a body over its limit without the 413
        try:
            return await self._enter_door(named, deadline)
        except BaseException:           # cancelled midway: nothing is left open
            self._drop(self._ws)
            raise

    async def _enter_door(self, named: str, deadline: float) -> Optional[httpx.Response]:
        """Move to the worker's same-host door (``named``: the accept's header, "PATH TICKET") and
        close the websocket. -> None, or the door's refusal of the token as an httpx.Response
        (401). A door that cannot be opened, is not the worker's, or is full (503) leaves the
        websocket in use. ``deadline``: the open's (loop time), shared with the upgrade as on the
        blocking channel."""
        path, _, ticket = named.partition(" ")
        try:
            door = await asyncio.wait_for(_local.AsyncDoor.open(path, self.token, ticket, MAX_BODY_BYTES + 1024),
                                          max(0.001, deadline - asyncio.get_running_loop().time()))
        except _local.DoorRefused as exc:
            if exc.status == 503:          # no place for the door: the websocket still has its own
                return None
            await self.aclose()
            return httpx.Response(exc.status, content=exc.body, headers={"content-type": "application/json"})
        except (OSError, asyncio.TimeoutError):
            return None
        ws, self._ws = self._ws, door
        self.binary_answers = True            # the door always answers 200s in the binary form
        try:           # the closing handshake within what is left of the open's deadline, else aborted
            await asyncio.wait_for(ws.close(), min(2.0, max(0.001, deadline - asyncio.get_running_loop().time())))
        except Exception:  # noqa: BLE001 - the door has the channel now
            pass
        finally:
            self._drop(ws)
        return None

    async def request(self, content: bytes, binary: bool) -> httpx.Response:
        """Send one /act body (``binary``: the binary framing, else JSON) and wait for its answer.

        Returns the answer as an ``httpx.Response`` (status and JSON body as HTTP /act). Raises
        ChannelDropped when the websocket (or the door) closes or fails; asyncio.TimeoutError past
        ``timeout_s``. On the door a message over the worker's limit is answered 413 before it
        closes (``_local.AsyncDoor.recv`` hands that answer over first).
        """
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        seq = self._seq
        message = request_message(seq, content, binary, self.segment)
        ws = self._ws
        sent = False
        try:
            async with _timeout(self.timeout_s):      # the send too: a stalled worker stops reading
                await ws.send(message)
                sent = True
                while True:
                    answer = await ws.recv(decode=False)
                    if len(answer) >= _ANSWER_HEAD.size:
                        got, status = _ANSWER_HEAD.unpack_from(answer)
                        if got == seq:
                            break        # an older, cancelled request's late answer is skipped
        except (asyncio.CancelledError, asyncio.TimeoutError):
            if sent:
                self._cancel_soon(seq)
            else:                       # a frame may be half-written: this websocket is unusable
                self._drop(ws)
            raise
        except (_Closed, OSError) as exc:
            self._ws = None
            self._release()
            if isinstance(exc, _Closed) and exc.rcvd is not None and exc.rcvd.code == 1009:
                return _too_large(len(content))      # the worker would not read it: as HTTP's 413
            dropped = ChannelDropped(f"the /act channel to {self.worker_url} closed: {exc!r}")
            dropped.sent = sent
            raise dropped from exc
        self.requests += 1
        if self.segment is not None:
            self.segment.answered()    # the worker holds it open now: no other process may open it
        if ws.__class__ is _local.AsyncDoor and (status == 413 or ws.closed):
            self._drop(ws)             # the door answers a message over its limit 413, then closes: open anew
        return answer_response(status, answer[_ANSWER_HEAD.size:], self.binary_answers)

    async def refresh(self, token: str) -> None:
        """Hand the worker ``token`` (a renewed lease of this session) for the requests that follow
        (a ``{"token": ...}`` text message; the worker reads it before the next request). Raises
        ChannelDropped when the websocket is closed or fails."""
        ws = self._ws
        try:
            if ws is None:
                raise OSError("the channel is closed")
            await asyncio.wait_for(ws.send(json.dumps({"token": token})), min(OPEN_TIMEOUT_S, self.timeout_s))
        except (_Closed, OSError, asyncio.TimeoutError) as exc:
            if ws is not None:
                self._drop(ws)
            raise ChannelDropped(f"the /act channel to {self.worker_url} closed: {exc!r}") from exc
        self.token = token

    def _drop(self, ws: Any) -> None:
        """Forget ``ws`` and abort its connection at once (no closing handshake: it is stuck)."""
        if self._ws is ws:
            self._ws = None
            self._release()
        transport = getattr(ws, "transport", None)
        if transport is not None:
            transport.abort()

    def _release(self) -> None:
        """Unmap and unlink the same-host segment (a closed channel's; the next one makes its own)."""
        if self.segment is not None:
            self.segment.close()

    def _cancel_soon(self, seq: int) -> None:
        """Tell the worker to drop request ``seq`` if it has not started (best effort, not awaited)."""
        ws = self._ws
        if ws is None:
            return
        task = asyncio.ensure_future(ws.send(json.dumps({"cancel": seq})))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def aclose(self) -> None:
        """Close the websocket (best effort): the closing handshake for up to 2 s, then the
        connection is aborted all the same (a hung worker never answers the close; its socket
        must not stay open until garbage collection)."""
        ws, self._ws = self._ws, None
        self._release()
        if ws is not None:
            try:
                await asyncio.wait_for(ws.close(), 2.0)
            except Exception:  # noqa: BLE001 - closing a dead channel
                pass
            finally:
                self._drop(ws)          # a no-op once the close completed
