"""How one /act body reaches the worker: the ``ActTransport`` interface, its three implementations,
and ``Transports``, the session client's one slot for them.

In httpx's shape (``BaseTransport.handle_request``): a transport takes one encoded /act body and
hands back the worker's answer as an ``httpx.Response``, the same status and JSON body whichever
carried it, so the session client (``_wire.WorkerLink``) reads every answer the same way:

* ``HttpTransport`` -- ``POST {worker}/act`` on the client's pooled ``httpx.AsyncClient`` (async);
* ``_channel.ActChannel`` -- the persistent websocket ``/act/ws``, driven by asyncio (async);
* ``_blocking.BlockingChannel`` -- the same websocket protocol on the calling thread, no event
  loop (sync): the sync ``Policy.predict``'s steady state.

``Transports`` picks one, opens it, keeps it while the worker stays the same and closes it; one is
open at a time, so a session holds at most one websocket on its worker (whose places are counted:
``--max-connections``). A lease renewal changes the token, not the socket: the open channel is
told the new token (``refresh``) and goes on. A different worker, a refused token (401: a rotated
secret) or a dropped connection opens a new one.

What a transport raises: ``_channel.ChannelDropped`` or one of httpx's connection errors
(``_lease._DROPPED``) when the connection went away under the request (the link reconnects and
replays once); ``TimeoutError`` when no answer came within the
link's ``timeout_s`` (``asyncio.TimeoutError`` before Python 3.11); ``TransportError`` for any
other HTTP failure.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Protocol, Union

import httpx

from . import _blocking, _channel
from ._errors import TransportError
from ._lease import _DROPPED, Session
from .protocol import BINARY_CONTENT_TYPE, JSON_CONTENT_TYPE

__all__ = ["ActTransport", "AsyncActTransport", "HttpTransport", "Transports", "TRANSPORTS", "CHANNEL_PAUSE_S"]

# How /act travels: "auto" the persistent channel (a websocket) when the ``websockets`` package is
# installed and the worker has one, else HTTP; "http" always HTTP; "channel" the channel only (an
# error when it cannot be used).
TRANSPORTS = ("auto", "http", "channel")
# After a worker refused the channel for want of websocket places (``too_many_connections``),
# "auto" sends /act over HTTP for this long (s) before it tries the channel again.
CHANNEL_PAUSE_S = 30.0


class ActTransport(Protocol):
    """A blocking transport: one /act at a time on the calling thread (``BlockingChannel``)."""

    worker_url: str
    token: str

    @property
    def open(self) -> bool: ...

    def request(self, content: bytes, binary: bool) -> httpx.Response:
        """Send one encoded /act body (``binary``: the binary framing, else JSON) -> the answer."""

    def refresh(self, token: str) -> None:
        """Carry ``token`` (a renewed lease) from the next request on."""

    def close(self) -> None: ...


class AsyncActTransport(Protocol):
    """An asyncio transport: ``HttpTransport``, ``ActChannel``."""

    worker_url: str
    token: str

    @property
    def open(self) -> bool: ...

    async def request(self, content: bytes, binary: bool) -> httpx.Response:
        """Send one encoded /act body (``binary``: the binary framing, else JSON) -> the answer."""

    async def refresh(self, token: str) -> None:
        """Carry ``token`` (a renewed lease) from the next request on."""

    async def aclose(self) -> None: ...


class HttpTransport:
    """``POST {worker_url}/act`` on the client's pooled connections (``client()`` hands the
    ``httpx.AsyncClient``; the pool is the client's, so closing this closes nothing)."""

    open = True

    def __init__(self, client: Callable[[], httpx.AsyncClient], worker_url: str, token: str) -> None:
        self._client, self.worker_url, self.token = client, worker_url, token

    async def request(self, content: Any, binary: bool) -> httpx.Response:
        """``content``: bytes, or a ``protocol.BinaryBody`` (joined here). Raises httpx's
        connection errors (``_DROPPED``) as they are, TimeoutError past the client's timeout,
        TransportError for any other HTTP failure."""
        url = f"{self.worker_url}/act"
        try:
            return await self._client().post(url, content=bytes(content), headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": BINARY_CONTENT_TYPE if binary else JSON_CONTENT_TYPE})
        except _DROPPED:
            raise
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"POST {url}: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise TransportError(f"POST {url} failed: {exc!r}") from exc

    async def refresh(self, token: str) -> None:
        self.token = token

    async def aclose(self) -> None:
        pass


AnyTransport = Union[HttpTransport, "_channel.ActChannel", "_blocking.BlockingChannel"]


def _error_code(response: httpx.Response) -> Optional[str]:
    try:
        return (response.json() or {}).get("code")
    except ValueError:
        return None


class Transports:
    """The session client's /act transport: one open at a time, for the session's worker.

    Args:
        mode: one of ``TRANSPORTS``.
        timeout_s: how long a request may take (s), handed to the channels.
        client: ``() -> httpx.AsyncClient``, the pool ``HttpTransport`` posts on.
        shm: the same-host path (``body_format="shm"``): binary bodies' frames through shared
            memory, so only the channel carries /act (``mode`` "auto" acts as "channel").

    Raises ValueError for an unknown ``mode``, or ``shm`` with mode "http".
    """

    def __init__(self, mode: str, timeout_s: float, client: Callable[[], httpx.AsyncClient], shm: bool = False) -> None:
        if mode not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {mode!r}")
        if shm and mode == "http":
            raise ValueError('body_format="shm" travels on the /act channel; it cannot go with transport="http"')
        self.mode, self.timeout_s, self._client, self.shm = ("channel" if shm else mode), timeout_s, client, shm
        self.current: Optional[AnyTransport] = None
        self.opens = 0                          # websockets opened (either kind)
        self.refreshes = 0                      # renewed tokens handed to an open channel
        self.paused_until = 0.0                 # monotonic s: the worker's websocket places were all taken
        self.no_channel: Optional[str] = None   # a worker URL that has no channel (HTTP /act there)

    def channel_ok(self, worker_url: str) -> bool:
        """True when /act to ``worker_url`` may go over a channel now. Raises TransportError
        under mode "channel" when it cannot (no ``websockets``, or the worker has none)."""
        if self.mode == "http" or (self.mode == "auto" and time.monotonic() < self.paused_until):
            return False
        if not _channel.available() or self.no_channel == worker_url:
            if self.mode == "channel":
                raise TransportError("the /act channel cannot be used: " + (
                    "the websockets package is not installed" if not _channel.available()
                    else f"the worker at {worker_url} has none"),
                    hint=("the same-host path (body_format='shm') needs the channel: pip install 'sequence-ai[fast]' "
                          "(websockets) and a worker of this version" if self.shm else
                          "pip install 'sequence-ai[fast]' (websockets), or transport='auto' to fall back to HTTP"))
            return False
        return True

    def fits(self, session: Session, blocking: bool) -> bool:
        """True when the open transport can carry the next request to ``session``'s worker:
        the same worker, and a channel of the kind asked for (``blocking``), or HTTP while no
        channel may be used."""
        current = self.current
        if current is None or not current.open or current.worker_url != session.worker_url:
            return False
        if isinstance(current, HttpTransport):
            return not self.channel_ok(session.worker_url)
        return isinstance(current, _blocking.BlockingChannel) == blocking

    async def aget(self, session: Session) -> Union[AsyncActTransport, httpx.Response]:
        """The asyncio transport for ``session`` (kept, its token refreshed, or opened now), or
        the worker's refusal of a channel open (401/503) to answer the request with.
        Raises ChannelDropped (the channel could not be opened), TransportError (mode "channel")."""
        current = self.current
        if self.fits(session, blocking=False):
            if current.token != session.direct_secret:
                await current.refresh(session.direct_secret)
                self.refreshes += 1
            return current
        await self.aclose()
        if self.channel_ok(session.worker_url):
            channel = _channel.ActChannel(session.worker_url, session.direct_secret, self.timeout_s, shm=self.shm)
            try:
                refusal = await channel.connect()
            except _channel.ChannelUnsupported:
                self.no_channel = session.worker_url    # an older worker: HTTP /act from now on
                return await self.aget(session)
            opened = self._opened(channel, refusal)
            if opened is not None:
                return opened
        self.current = HttpTransport(self._client, session.worker_url, session.direct_secret)
        return self.current

    async def arequest(self, session: Session, content: bytes, binary: bool) -> httpx.Response:
        """One /act body to ``session``'s worker on the asyncio transport (``aget``) -> its
        answer, or the worker's refusal of a channel open. Raises what ``aget`` and the
        transport raise."""
        transport = await self.aget(session)
        if isinstance(transport, httpx.Response):
            return transport
        return await transport.request(content, binary)

    def get_blocking(self, session: Session) -> Union[ActTransport, httpx.Response, None]:
        """The blocking channel for ``session`` (kept, its token refreshed, or opened now), the
        worker's refusal of the open, or None: no blocking channel now (HTTP, no ``websockets``,
        a worker without a channel, places all taken): use ``aget`` on an event loop. An open
        asyncio transport must be closed first (``aclose``). Raises ChannelDropped, TransportError."""
        current = self.current
        if self.fits(session, blocking=True):
            if not isinstance(current, _blocking.BlockingChannel):
                return None               # HTTP: an asyncio transport
            if current.token != session.direct_secret:
                current.refresh(session.direct_secret)
                self.refreshes += 1
            return current
        if not _blocking.available() or not self.channel_ok(session.worker_url):
            return None
        assert current is None or not current.open, "close the open transport first"
        channel = _blocking.BlockingChannel(session.worker_url, session.direct_secret, self.timeout_s, shm=self.shm)
        try:
            refusal = channel.connect()
        except _channel.ChannelUnsupported:
            self.no_channel = session.worker_url
            return None
        return self._opened(channel, refusal)

    def _opened(self, channel: Any, refusal: Optional[httpx.Response]) -> Any:
        """After an open: the channel (kept), the refusal to answer with, or None (HTTP: "auto"
        met a worker with no websocket place left, ``pause_for``)."""
        if refusal is None:
            self.current = channel
            self.opens += 1
            return channel
        return None if self.pause_for(refusal) else refusal

    def pause_for(self, refusal: httpx.Response) -> bool:
        """Pause the channel (CHANNEL_PAUSE_S; HTTP /act meanwhile) after an "auto" open refused
        for want of places -> True; False for any other refusal."""
        if self.mode != "auto" or _error_code(refusal) != "too_many_connections":
            return False
        self.paused_until = time.monotonic() + CHANNEL_PAUSE_S
        return True

    @property
    def channel_open(self) -> bool:
        """True while a websocket (either kind) is open."""
        return self.current is not None and self.current.open and not isinstance(self.current, HttpTransport)

    async def aclose(self) -> None:
        """Close the open transport (best effort; an asyncio channel's closing handshake waits at
        most 2 s). The next request opens a new one."""
        current, self.current = self.current, None
        if isinstance(current, _blocking.BlockingChannel):
            current.close()
        elif current is not None:
            await current.aclose()
