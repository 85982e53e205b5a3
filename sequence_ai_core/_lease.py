"""Leases on the wire: the session a handshake hands back, when to renew its lease, and renewing it.

``Session`` holds the coordinates of one gateway handshake (worker URL, direct secret, lease).
``lease_margin`` / ``_renew_at`` say when a lease is renewed: before it lapses, early enough for
a gateway round trip and the robot's own request interval. ``LeaseRenewal`` is the part of
``_wire.WorkerLink`` that renews (``POST /v1/sessions/{id}/renew``), beside requests while there is
time, with backoff while the gateway cannot be reached (the worker honours the lease until it
lapses). The rest of the wire is in ``_wire.py``.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import httpx

from ._errors import TransportError

__all__ = ["Session", "LeaseRenewal", "lease_margin"]

# Renew a lease this long before it lapses (s), or a tenth of its ttl when that is shorter ...
LEASE_MARGIN_S = 5.0
# ... but never less than this (s): a gateway round trip on a loaded machine, and clock-tick slack ...
LEASE_MARGIN_FLOOR_S = 1.0
# ... nor less than this many of the robot's recent intervals between requests (renewal is
# request-driven: a margin shorter than the interval lets the lease lapse between two requests) ...
LEASE_MARGIN_INTERVALS = 2.0
# ... and at most this fraction of the ttl (a lease is renewed at most about twice per ttl).
LEASE_MARGIN_MAX_FRACTION = 0.5
# A renewal the gateway did not answer (connection refused, reset, timed out) is retried after
# RENEW_RETRY_FIRST_S, doubling up to RENEW_RETRY_MAX_S, until the lease lapses (s).
RENEW_RETRY_FIRST_S = 0.25
RENEW_RETRY_MAX_S = 2.0
# The longest a renewal may hold up the request that triggered it (s): the gateway answers one
# in milliseconds; a hung one must not stall the robot's chunk stream.
RENEW_TIMEOUT_S = 2.0
# A renewal runs beside the robot's requests (they go on with the current token) while the lease
# has more than this left (s): time for the renewal to be answered or to time out (RENEW_TIMEOUT_S)
# before it lapses. Closer to the lapse the request waits for the renewal.
RENEW_BESIDE_S = 2.5
# Request intervals remembered for the margin (the longest of them counts).
INTERVAL_WINDOW = 8


# Errors after which the connection is gone but a fresh one may work. Timeouts are not here:
# a slow inference replayed would only be slower.
_DROPPED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError,
            httpx.CloseError)


@dataclass
class Session:
    """The coordinates one gateway handshake hands back."""

    session_id: Optional[str]
    worker_url: str
    direct_secret: str
    lease: Dict[str, Any] = field(default_factory=dict)
    contract: Dict[str, Any] = field(default_factory=dict)
    params: Dict[str, Any] = field(default_factory=dict)
    epoch: Optional[int] = None
    version: Optional[int] = None     # the deployment version that admitted this session
    renew_at: Optional[float] = None  # time.monotonic() after which the lease is renewed first
    ttl_s: Optional[float] = None     # the lease's length (s)
    expires_mono: Optional[float] = None   # time.monotonic() at which the lease lapses
    retry_at: Optional[float] = None  # set while the gateway is unreachable: the next renewal try
    retries: int = 0                  # renewal tries the gateway did not answer, in a row
    renew_refused: bool = False       # the gateway refused a renewal: the next request reconnects


def _lease_ttl(lease: Dict[str, Any]) -> Optional[float]:
    ttl = lease.get("ttl_s")
    if ttl is None and lease.get("expires_at") is not None:
        ttl = float(lease["expires_at"]) - time.time()
    return None if ttl is None else float(ttl)


def lease_margin(ttl_s: float, interval_s: Optional[float] = None) -> float:
    """How long before a lease of ``ttl_s`` seconds lapses it is renewed (s).

    ``max(min(LEASE_MARGIN_S, 10 % of the ttl), LEASE_MARGIN_INTERVALS x interval_s,
    LEASE_MARGIN_FLOOR_S)``, capped at ``LEASE_MARGIN_MAX_FRACTION`` of the ttl. Where the figures
    come from: 5 s / 10 % is what a long lease (the gateway's default ttl is 300 s) needs for a
    gateway round trip with room to retry; renewal happens on a request, so the margin must also
    span the time between two requests (``interval_s``, the robot's recent longest gap; twice it
    for jitter), else a lease of a few seconds lapses between a robot's requests (1 s apart, a
    3 s lease and a 0.3 s margin did); 1 s covers a round trip to a loaded gateway; the cap at
    half the ttl keeps a slow robot from renewing on every request.
    """
    margin = max(min(LEASE_MARGIN_S, 0.1 * ttl_s), LEASE_MARGIN_FLOOR_S)
    if interval_s is not None:
        margin = max(margin, LEASE_MARGIN_INTERVALS * interval_s)
    return min(margin, LEASE_MARGIN_MAX_FRACTION * ttl_s)


def _renew_at(lease: Dict[str, Any], received: float, interval_s: Optional[float] = None) -> Optional[float]:
    """Monotonic renewal time for a lease received at ``received`` (monotonic s): its ttl_s (or
    expires_at - now) less ``lease_margin``. None when the lease names neither."""
    ttl = _lease_ttl(lease)
    if ttl is None:
        return None
    return received + max(0.0, ttl - lease_margin(ttl, interval_s))


class LeaseRenewal:
    """Lease renewal for ``_wire.WorkerLink`` (a mixin: it uses the link's ``session``, ``_send``,
    ``_adopt``, ``_replace``, ``join``, ``gateway_url``, ``_api_key`` and ``timeout_s``)."""

    session: Optional[Session]
    _renewal: Optional["asyncio.Future[Optional[bool]]"]
    _intervals: List[float]
    _last_request: Optional[float]

    def request_interval_s(self) -> Optional[float]:
        """The longest of the last INTERVAL_WINDOW gaps between this wire's /act requests (s);
        None before the second request."""
        return max(self._intervals) if self._intervals else None

    def note_request(self) -> None:
        """Note that an /act request starts now (the request interval the lease margin uses)."""
        now = time.monotonic()
        if self._last_request is not None:
            self._intervals = (self._intervals + [now - self._last_request])[-INTERVAL_WINDOW:]
        self._last_request = now

    def lease_due(self, session: Session) -> bool:
        """Renew before this request? After a failed try: once its backoff has passed (until the
        lease lapses). Else: at ``renew_at``, or earlier once the robot's request interval has
        grown so that the lease would lapse before its next request (``lease_margin``)."""
        now = time.monotonic()
        if session.retry_at is not None:
            return now >= session.retry_at and (session.expires_mono is None or now < session.expires_mono)
        if session.renew_at is not None and now >= session.renew_at:
            return True
        if session.expires_mono is None or session.ttl_s is None:
            return False
        return now >= session.expires_mono - lease_margin(session.ttl_s, self.request_interval_s())

    def _retry_later(self, session: Session) -> Session:
        """The gateway did not answer a renewal: keep the current coordinates (the worker checks
        the lease itself, so requests go on) and try again after a backoff (RENEW_RETRY_FIRST_S
        doubling to RENEW_RETRY_MAX_S), never past the lease's lapse."""
        self.renew_failures += 1
        now = time.monotonic()
        pause = min(RENEW_RETRY_MAX_S, RENEW_RETRY_FIRST_S * (2 ** session.retries))
        if session.expires_mono is not None:
            pause = min(pause, max(0.05, (session.expires_mono - now) / 2))
        session.retries += 1
        session.retry_at = now + pause
        return session

    async def _try_renew(self, session: Session) -> Optional[bool]:
        """One ``POST /v1/sessions/{id}/renew`` for ``session``. True: renewed (the answer is the
        current session, unless another one replaced ``session`` meanwhile); False: the gateway
        refused; None: it could not be reached (refused, reset, no answer within RENEW_TIMEOUT_S,
        or a 5xx from inside it) and a retry is scheduled (``_retry_later``)."""
        started = time.monotonic()
        try:
            response = await self._send(
                "POST", f"{self.gateway_url}/v1/sessions/{session.session_id}/renew",
                headers={"Authorization": f"Bearer {self._api_key}"},
                timeout=min(self.timeout_s, RENEW_TIMEOUT_S))
        except (TransportError, *_DROPPED):
            self._retry_later(session)
            return None
        if response.status_code == 200:
            self.renewals += 1
            if session.expires_mono is not None:
                self.last_renewal_left_s = session.expires_mono - started
            if self.session is session:
                self._adopt(response.json(), started)
            return True
        if response.status_code >= 500 and response.status_code != 503:
            self._retry_later(session)           # a gateway failing inside: the lease still holds
            return None
        session.renew_refused = True
        return False

    def _renew_beside(self, session: Session) -> None:
        """Renew ``session`` in a background task while requests go on with its current token
        (a slow or restarting gateway then costs the robot nothing); one at a time."""
        if self._renewal is not None and not self._renewal.done():
            return

        async def attempt() -> Optional[bool]:
            try:
                return await self._try_renew(session)
            except Exception:  # noqa: BLE001 - e.g. the connections closed under it: retry later
                self._retry_later(session)
                return None
        self._renewal = asyncio.ensure_future(attempt())

    async def _cancel_renewal(self) -> None:
        task, self._renewal = self._renewal, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled on purpose
                pass

    async def renew(self) -> Session:
        """Extend the lease before it lapses: ``POST /v1/sessions/{id}/renew`` (same session).

        A gateway that refuses (lease already gone, worker restarted, no such route) gets a fresh
        ``/v1/connect`` instead. A gateway that cannot be reached (refused, reset, or no answer
        within RENEW_TIMEOUT_S: it is restarting or gone) keeps the current coordinates -- the
        worker honours the lease until it lapses -- and the renewal is retried with backoff on
        later requests (``_retry_later``) until it lapses.
        """
        session = self.session
        if session is None:
            return await self.join()
        await self._cancel_renewal()
        if session.session_id and not session.renew_refused:
            outcome = await self._try_renew(session)
            if outcome is None:          # unreachable: go on with the current lease, retry later
                return session
            if outcome:
                return self.session or session
        try:
            await self._replace(session)
        except TransportError:
            self.session = session
            session.renew_refused = False
            return self._retry_later(session)
        return self.session  # type: ignore[return-value]
