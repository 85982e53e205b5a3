"""A deadline on reading a request's headers, for the gateway's and the worker's HTTP servers.

uvicorn bounds the wait *between* requests on a kept-alive connection (``timeout_keep_alive``),
but once a request's first byte has arrived it waits for the rest of its headers for ever. A
client that opens connections and sends a header line now and then (slowloris) holds a socket,
a file descriptor and a parser per connection, however few bytes it sends; a few hundred of them
keep a robot's gateway from accepting anyone else. nginx's ``client_header_timeout`` (60 s) and
Apache's ``mod_reqtimeout`` close such connections; this module does the same for uvicorn.

:func:`timed_http_protocol` returns uvicorn's HTTP protocol class (httptools when installed,
else h11) with one addition: from the moment a connection opens, or a kept-alive connection
receives the first byte of its next request, the request line and every header must have
arrived within ``timeout_s`` seconds -- a total, not a per-byte, deadline, so dribbling bytes
does not extend it. Past it the server answers ``408 Request Timeout`` with ``Connection:
close`` and closes the connection. A request whose headers are complete is never timed by this
(its body and its answer take what they take), and neither is a websocket once upgraded (the
/act channel stays open as long as its robot wants). Two waits stay with uvicorn's keep-alive
timeout (5 s) instead: the rest of a pipelined request whose first bytes came while the one
before it was being served, and a body sent slowly after complete headers (a credentialed
client only: a route refuses a missing credential before it reads the body).

The deadline: ``$SEQ_HEADER_TIMEOUT_S``, default :data:`HEADER_TIMEOUT_S` (10 s: a robot's
request arrives in one or two segments in well under a millisecond on a LAN, and a client
across a slow link still sends its few hundred header bytes in far less than that).
"""
from __future__ import annotations

import asyncio
import math
from typing import Mapping, Optional

HEADER_TIMEOUT_S = 10.0
MIN_HEADER_TIMEOUT_S = 0.5      # below it an ordinary client on a busy machine gets 408s
MAX_HEADER_TIMEOUT_S = 3600.0
ENV = "SEQ_HEADER_TIMEOUT_S"

_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def header_timeout_setting(env: Mapping[str, str]) -> float:
    """``$SEQ_HEADER_TIMEOUT_S`` in ``env`` (s), :data:`HEADER_TIMEOUT_S` when unset or blank.
    Raises ValueError naming the variable when the value is not a number in [0.5, 3600]."""
    raw = (env.get(ENV) or "").strip()
    if not raw:
        return HEADER_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and MIN_HEADER_TIMEOUT_S <= value <= MAX_HEADER_TIMEOUT_S):
        raise ValueError(f"{ENV}={raw!r} is not a number of seconds in [{MIN_HEADER_TIMEOUT_S:g}, "
                         f"{MAX_HEADER_TIMEOUT_S:g}]; "
                         f"unset it for the default {HEADER_TIMEOUT_S:g} s, or give one (e.g. {ENV}=30)")
    return value


def _base_protocol(http: Optional[str]) -> type:
    if http is None:
        try:
            import httptools  # noqa: F401
            http = "httptools"
        except ImportError:
            http = "h11"
    if http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol
    return H11Protocol


def timed_http_protocol(timeout_s: float, http: Optional[str] = None) -> type:
    """uvicorn's HTTP protocol class for ``http`` (``"httptools"``, ``"h11"``; None: httptools
    when installed, else h11) with the header deadline of this module (``timeout_s``, s). Pass it
    as ``uvicorn.Config(http=...)``."""
    base = _base_protocol(http)

    class HeaderDeadline(base):   # type: ignore[misc, valid-type]
        header_timeout_s = float(timeout_s)
        _header_timer: Optional[asyncio.TimerHandle] = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            # uvicorn keeps the last request's cycle until the next one's headers are parsed: no
            # cycle, or a finished one, means these bytes begin (or continue) a request's headers
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before or self.transport.get_protocol() is not self:
                self._disarm()      # headers complete (a new cycle), or upgraded to a websocket

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            transport = self.transport
            if transport.is_closing() or transport.get_protocol() is not self:
                return
            if self.cycle is not None and not self.cycle.response_complete:
                return                  # a request is being served: its headers did arrive
            transport.write(_TIMED_OUT)
            transport.close()

    HeaderDeadline.__name__ = HeaderDeadline.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline
