"""The blocking /act channel: one websocket to the worker's ``/act/ws``, driven on the calling thread.

``sequence_ai.Policy`` (the sync face) drives the asyncio engine by entering a private event loop
per call. For ``predict()`` -- one request, nothing to overlap -- that entry (a task, the loop's
selector turn, the wake-up of the waiting task) is a large share of a ~1.5 ms round trip on
loopback. ``BlockingChannel`` is the transport (``_transport.ActTransport``) of that steady state:
it sends the same /act body over a plain blocking socket, driven by the sans-I/O protocol of the
``websockets`` package (``websockets.client.ClientProtocol``), so a request is a ``sendall`` and a
``recv`` on the caller's thread: no event loop, no task, no helper thread.

It only carries requests: which transport a request takes, joining, renewals, reconnects and
replays are the session client's (``_wire.WorkerLink.act_blocking``), which uses the event loop
for those alone.
"""
from __future__ import annotations

import json
import select
import socket
import ssl
import time
from typing import Any, List, Optional
from urllib.parse import urlsplit

import httpx

from . import _channel, _local, _shm
from .protocol import ANSWER_BINARY, ANSWER_HEADER, LOCAL_HEADER, LOCAL_VERSION_HEADER, MAX_BODY_BYTES

__all__ = ["BlockingChannel", "available"]

try:  # optional, as for the asyncio channel
    from websockets.client import ClientProtocol as _ClientProtocol
    from websockets.frames import Opcode as _Opcode
    from websockets.protocol import State as _State
    from websockets.uri import parse_uri as _parse_uri
except ImportError:  # pragma: no cover - exercised by the fallback test with a blocked import
    _ClientProtocol = None

_RECV_BYTES = 1 << 16


same_host = _local.same_host      # the worker is on this machine: ask for its door (``$SEQ_CLIENT_DOOR=0``: don't)


def available() -> bool:
    """True when the ``websockets`` package (its sans-I/O protocol) can be imported."""
    return _ClientProtocol is not None


class BlockingChannel:
    """One websocket to a worker's ``/act/ws``, driven on the calling thread.

    Same messages as ``_channel.ActChannel`` (a request is ``seq`` u32, ``format`` u8, the /act
    body; an answer ``seq`` u32, ``status`` u16, the JSON body); answers come back as
    ``httpx.Response`` so the wire's status handling applies. Not thread-safe: one thread, one
    request at a time.

    Args:
        worker_url: the worker's base URL (``http://127.0.0.1:PORT``).
        token: the direct secret / lease token it is opened with (``Authorization: Bearer``).
        timeout_s: how long a request may take, send and answer together (s).
        shm: send binary bodies' frames through a shared-memory segment (the same-host path,
            ``_shm``; the worker must run on this machine as this user).

    The messages go over the worker's same-host door (a Unix socket, ``_local``) instead of the
    websocket when the worker names one, which it does when asked: on the shared-memory path,
    and for any worker whose URL is a loopback address (:func:`same_host`; a worker on this
    machine: ``$SEQ_CLIENT_DOOR=0`` keeps such a client on its websocket). A door that cannot be
    opened (another network namespace, another user) leaves the channel on its websocket.
    """

    def __init__(self, worker_url: str, token: str, timeout_s: float, shm: bool = False) -> None:
        self.worker_url, self.token, self.timeout_s = worker_url, token, timeout_s
        self.segment = _shm.ShmSegment() if shm else None
        self._sock: Optional[socket.socket] = None
        self._proto: Any = None
        self.local: Optional[_local.LocalSocket] = None   # the same-host door, once opened
        self._seq = 0
        self._partial: List[bytes] = []
        self.requests = 0
        self.binary_answers = False     # the worker echoed protocol.ANSWER_HEADER: 200s are binary

    @property
    def open(self) -> bool:
        """True while the websocket is open."""
        return self._sock is not None or self.local is not None

    def connect(self) -> Optional[httpx.Response]:
        """Open the websocket. -> None when open, or the worker's refusal (401/503 with our error
        body) as an httpx.Response.

        Raises:
            ChannelUnsupported: the worker has no channel (another refusal of the upgrade).
            ChannelDropped: the worker could not be reached or the upgrade failed midway.
        """
        url = _channel.channel_url(self.worker_url)
        deadline = time.monotonic() + min(_channel.OPEN_TIMEOUT_S, self.timeout_s)
        try:
            self._dial(url, deadline)
        except OSError as exc:
            self.abort()
            raise _channel.ChannelDropped(f"could not open the /act channel to {self.worker_url}: {exc!r}") from exc
        except BaseException:          # Ctrl-C mid-dial: the socket is closed now, not when the traceback goes
            self.abort()
            raise
        try:
            self._proto = proto = _ClientProtocol(_parse_uri(url), max_size=MAX_BODY_BYTES + 1024)
            request = proto.connect()
            request.headers["Authorization"] = f"Bearer {self.token}"
            request.headers[ANSWER_HEADER] = ANSWER_BINARY
            if self.segment is not None or same_host(self.worker_url):
                request.headers[LOCAL_HEADER] = "1"
            proto.send_request(request)
            self._flush(deadline)
            response = None
            while response is None:
                self._feed(deadline)
                response = next(iter(proto.events_received()), None)
        except (OSError, _channel.ChannelDropped) as exc:
            self.abort()
            raise _channel.ChannelDropped(f"the /act channel upgrade to {self.worker_url} failed: {exc!r}") from exc
        except BaseException:          # Ctrl-C mid-upgrade: the socket is closed now, not when the traceback goes
            self.abort()
            raise
        if proto.handshake_exc is None:
            self.binary_answers = response.headers.get(ANSWER_HEADER) == ANSWER_BINARY
            named = response.headers.get(LOCAL_HEADER)
            if self.segment is None and _local.door_version(response.headers.get(LOCAL_VERSION_HEADER)) < 2:
                named = None         # an older door closes on a body over its limit without the 413
            return self._enter_door(named, deadline)
        self.abort()
        body = bytes(response.body or b"")
        if response.status_code in (401, 503) and body.startswith(b"{"):
            return httpx.Response(response.status_code, content=body, headers={"content-type": "application/json"})
        raise _channel.ChannelUnsupported(f"{self.worker_url} answered the channel upgrade with "
                                          f"{response.status_code}")

    def _enter_door(self, named: Optional[str], deadline: float) -> Optional[httpx.Response]:
        """Move to the worker's same-host door (``named``: the accept's header, "PATH TICKET";
        None: it named none) and close the websocket. -> None, or the door's refusal of the token
        as an httpx.Response (401). A door that cannot be opened, is not the worker's, or is full
        (503) leaves the websocket in use."""
        if not named:
            return None
        path, _, ticket = named.partition(" ")
        try:
            self.local = _local.LocalSocket.open(path, self.token, deadline, ticket)
        except _local.DoorRefused as exc:
            if exc.status == 503:          # no place for the door: the websocket still has its own
                return None
            self.abort()
            return httpx.Response(exc.status, content=exc.body, headers={"content-type": "application/json"})
        except OSError:
            return None
        self.binary_answers = True            # the door always answers 200s in the binary form
        sock, self._sock = self._sock, None
        try:
            self._proto.send_close(1000)
            for chunk in self._proto.data_to_send():
                sock.sendall(chunk)
        except OSError:
            pass
        sock.close()
        return None

    def _dial(self, url: str, deadline: float) -> None:
        """Connect (TCP, then TLS for wss) and hold the socket in ``_sock`` from its creation on,
        so an interrupt anywhere in the dial leaves it to ``abort`` (``socket.create_connection``
        closes its socket on OSError only: on Ctrl-C the traceback kept it open)."""
        parts = urlsplit(url)
        secure = parts.scheme == "wss"
        port = parts.port or (443 if secure else 80)
        error: Optional[OSError] = None
        for family, kind, number, _, address in socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM):
            self._sock = sock = socket.socket(family, kind, number)
            try:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                sock.connect(address)
            except OSError as exc:
                self.abort()
                error = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if secure:
                self._sock = ssl.create_default_context().wrap_socket(
                    sock, server_hostname=parts.hostname, do_handshake_on_connect=False)
                self._sock.do_handshake()
            return
        raise error if error is not None else OSError(f"no address for {parts.hostname}")

    def request(self, content: bytes, binary: bool) -> httpx.Response:
        """Send one /act body (``binary``: the binary framing, else JSON) and wait for its answer.

        Returns the answer as an ``httpx.Response``; a channel the worker closed with 1009 (the
        message is over its limit) is the 413 ``payload_too_large`` answer HTTP gives, also when
        the worker's close reset the connection before the body was all sent. Raises
        ChannelDropped when the websocket is closed or fails (the worker closed it, a reset; its
        ``sent`` is True once the request had started to go out, so the worker may have run it),
        TimeoutError past ``timeout_s`` (the channel is closed then: a late answer can never be
        taken for the next request's).
        """
        deadline = time.monotonic() + self.timeout_s
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        seq = self._seq
        if self.local is not None:
            return self._request_local(seq, content, binary, deadline)
        proto = self._proto
        sent = False
        try:
            self._take_pending()          # a close the worker sent while we were idle
            proto.send_binary(_channel.request_message(seq, content, binary, self.segment))
            sent = True
            self._flush(deadline)
            while True:
                for message in self._messages(deadline):
                    if len(message) >= _channel._ANSWER_HEAD.size:
                        got, status = _channel._ANSWER_HEAD.unpack_from(message)
                        if got == seq:
                            self.requests += 1
                            if self.segment is not None:
                                self.segment.answered()   # the worker holds it open: no one else may open it
                            return _channel.answer_response(status, message[_channel._ANSWER_HEAD.size:],
                                                            self.binary_answers)
        except socket.timeout as exc:  # the deadline passed
            self.abort()
            raise TimeoutError(f"no /act answer within {self.timeout_s:g} s") from exc
        except (_channel.ChannelDropped, OSError) as exc:
            if sent:
                self._drain()              # a 1009 close that came just before the reset
            close = proto.close_rcvd
            self.abort()
            if close is not None and close.code == 1009:
                return _channel._too_large(len(content))   # the worker would not read it: as HTTP's 413
            dropped = exc if isinstance(exc, _channel.ChannelDropped) else _channel.ChannelDropped(
                f"the /act channel to {self.worker_url} failed: {exc!r}")
            dropped.sent = sent
            if dropped is exc:
                raise
            raise dropped from exc
        except BaseException:          # Ctrl-C mid-request: the channel's state is unknown
            self.abort()
            raise

    def _request_local(self, seq: int, content: bytes, binary: bool, deadline: float) -> httpx.Response:
        """``request`` over the same-host door: the same message, answer and errors (a closed
        door is ChannelDropped; a message over the worker's limit closes it too)."""
        local, sent = self.local, False
        try:
            local.take_pending()
            local.send(_channel.request_message(seq, content, binary, self.segment), 0,
                       max(0.001, deadline - time.monotonic()))
            sent = True
            while True:
                message = local.receive(deadline)
                if len(message) >= _channel._ANSWER_HEAD.size:
                    got, status = _channel._ANSWER_HEAD.unpack_from(message)
                    if got == seq:
                        self.requests += 1
                        if self.segment is not None:
                            self.segment.answered()
                        return _channel.answer_response(status, message[_channel._ANSWER_HEAD.size:], True)
        except socket.timeout as exc:
            self.abort()
            raise TimeoutError(f"no /act answer within {self.timeout_s:g} s") from exc
        except OSError as exc:
            refused = self._last_word(local, seq)
            self.abort()
            if refused is not None:
                return refused
            dropped = _channel.ChannelDropped(f"the same-host door of {self.worker_url} failed: {exc!r}")
            dropped.sent = sent
            raise dropped from exc
        except BaseException:          # Ctrl-C mid-request: the channel's state is unknown
            self.abort()
            raise

    @staticmethod
    def _last_word(local: _local.LocalSocket, seq: int) -> Optional[httpx.Response]:
        """The answer to ``seq`` the door sent before it closed (its 413 for a message over its
        limit: it reads none of it, answers and closes, so the send fails midway), else None."""
        try:
            message = local.receive(time.monotonic() + 1.0)
        except OSError:
            return None
        if len(message) >= _channel._ANSWER_HEAD.size and _channel._ANSWER_HEAD.unpack_from(message)[0] == seq:
            status = _channel._ANSWER_HEAD.unpack_from(message)[1]
            return _channel.answer_response(status, message[_channel._ANSWER_HEAD.size:], True)
        return None

    def refresh(self, token: str) -> None:
        """Hand the worker ``token`` (a renewed lease of this session) for the requests that follow
        (a ``{"token": ...}`` text message; not waited for: the worker reads it before the next
        request). Raises ChannelDropped when the websocket is closed or fails."""
        try:
            if self.local is not None:
                self.local.take_pending()
                self.local.send(json.dumps({"token": token}).encode(), 1)
                self.token = token
                return
            self._take_pending()
            self._proto.send_text(json.dumps({"token": token}).encode())
            self._flush(time.monotonic() + min(_channel.OPEN_TIMEOUT_S, self.timeout_s))
        except (OSError, _channel.ChannelDropped) as exc:
            self.abort()
            raise _channel.ChannelDropped(f"the /act channel to {self.worker_url} failed: {exc!r}") from exc
        self.token = token

    def _drain(self) -> None:
        """Feed the protocol what the socket still holds without waiting (after a send failed:
        the worker's close frame may be queued ahead of its reset)."""
        sock = self._sock
        if sock is None or isinstance(sock, ssl.SSLSocket):
            return
        try:
            sock.setblocking(False)
            while True:
                data = sock.recv(_RECV_BYTES)
                if not data:
                    self._proto.receive_eof()
                    break
                self._proto.receive_data(data)
        except OSError:                 # nothing more queued, or the reset itself
            pass
        for _ in self._proto.events_received():
            pass

    def _messages(self, deadline: float) -> List[bytes]:
        """Read until at least one data frame arrives; -> the complete messages (fragments joined)."""
        out: List[bytes] = []
        while not out:
            self._feed(deadline)
            for frame in self._proto.events_received():
                if frame.opcode is _Opcode.BINARY or frame.opcode is _Opcode.TEXT:
                    self._partial = [frame.data]
                elif frame.opcode is _Opcode.CONT:
                    self._partial.append(frame.data)
                else:
                    continue            # ping (answered by the protocol), pong, close (state)
                if frame.fin:
                    out.append(b"".join(self._partial))
            self._flush(deadline)
            if not out and self._proto.state is not _State.OPEN:
                raise _channel.ChannelDropped(f"the worker closed the /act channel ({self._proto.close_rcvd})")
        return out

    def _feed(self, deadline: float) -> None:
        """One blocking read into the protocol (EOF included)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("timed out")
        self._sock.settimeout(remaining)
        data = self._sock.recv(_RECV_BYTES)
        if not data:
            self._proto.receive_eof()
            raise _channel.ChannelDropped("the worker closed the connection")
        self._proto.receive_data(data)

    def _take_pending(self) -> None:
        """Read whatever arrived while idle (without blocking) and fail early on a closed channel."""
        if not isinstance(self._sock, ssl.SSLSocket) and select.select([self._sock], [], [], 0)[0]:
            self._sock.setblocking(False)
            try:
                data = self._sock.recv(_RECV_BYTES)
            except BlockingIOError:
                data = None
            if data == b"":
                self._proto.receive_eof()
            elif data:
                self._proto.receive_data(data)
            for _ in self._proto.events_received():
                pass                    # no request is outstanding: late answers are dropped
        if self._proto.state is not _State.OPEN:
            raise _channel.ChannelDropped(f"the worker closed the /act channel ({self._proto.close_rcvd})")

    def _flush(self, deadline: float) -> None:
        for chunk in self._proto.data_to_send():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("timed out")
            self._sock.settimeout(remaining)
            if chunk:
                self._sock.sendall(chunk)

    def abort(self) -> None:
        """Close the socket at once (no closing handshake). Idempotent."""
        sock, self._sock = self._sock, None
        if self.local is not None:
            self.local.close()
            self.local = None
        if self.segment is not None:
            self.segment.close()        # the next channel makes its own
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        """Send a close frame (best effort, not waited for) and close the socket."""
        if self._sock is not None and self._proto is not None and self._proto.state is _State.OPEN:
            try:
                self._proto.send_close(1000)
                self._flush(time.monotonic() + 0.5)
            except OSError:
                pass
        self.abort()
