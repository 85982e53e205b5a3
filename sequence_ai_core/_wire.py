"""The session client (``WorkerLink``): one httpx.AsyncClient, the gateway handshake, /act straight to the worker.

A call is two phases and the gateway is in only the first::

    POST {gateway}/v1/connect   (API key)        -> worker_url, direct_secret, lease, contract
    WS   {worker_url}/act/ws    (direct secret)  -> action_chunk        (repeated, one open websocket)
      or POST {worker_url}/act                                          (one kept-alive connection)

How /act travels is the link's own business (``_transport.py``): HTTP, the persistent channel
(``_channel.py``, asyncio) or the same channel on the calling thread (``_blocking.py``, the sync
face's steady state), one open at a time, each carrying the same /act body and answering with the
same body and status, so everything below holds for all three. Callers (``AsyncPolicy``, the
control loop, the sync ``Policy``) call ``act`` or ``act_blocking`` and never see a channel. Lease
renewal is in ``_lease.py``; a renewal hands the open channel the new token and keeps the socket.

Transparent fallback: a 401 from the worker (rotated secret, expired lease) or a dropped
connection sends the wire back through the gateway for fresh coordinates, once, and the call
is replayed. A second failure is raised. The old session is resumed when the gateway still
holds it (``POST /v1/sessions/{id}/renew`` hands back a token signed with the current secret
and the worker's current address), else closed (``DELETE /v1/sessions/{id}``) *before* a new
one is opened, so a robot never waits in line behind its own stale session. The lease is also renewed *before* it lapses: the
handshake's ``ttl_s`` (else ``expires_at``) and the robot's own request interval set a local
monotonic renewal time (``lease_margin``), and the first request after it goes through the
gateway first. A gateway that cannot be reached then (restarting, crashed) does not disturb the
robot: the worker still honours the lease, the request goes on with it, and the renewal is
retried with backoff until the lease lapses. A 503 warming from the gateway becomes
``Unavailable(warming=True, retry_after_s=...)``; waiting it out is the loop's decision, not
the wire's.

Waiting in line (``join``): when every slot of the deployment is taken the gateway answers 503
``queued`` with ``details {position, estimate_s, ticket}``. The wire keeps the ticket, calls
``on_queue(position, estimate_s)`` and asks again after Retry-After (clamped to
QUEUE_POLL_MIN_S..QUEUE_POLL_MAX_S, well inside the gateway's abandon time) with the ticket, until
it is admitted or the gateway refuses with ``queue_timeout``. Cancelling the wait (interrupt,
Ctrl-C, close) gives the place up: ``DELETE /v1/sessions/{ticket}``.

Episodes: ``end_episode_soon`` (``POST {worker}/episode/end``) is how ``run()`` ends the episode it
drove, so the policy's ``@seq.on_episode`` frees its state at once rather than after the
worker's idle timeout.

Body formats for /act (docs/design.md): JSON (base64 frames; what curl and non-Python
controllers send) or the binary framing ``application/vnd.sequence-ai.act+bin`` (``protocol.py``
encodes both). ``body_format="auto"`` sends binary and
falls back to JSON for the rest of the session when a worker answers 415.
"""
from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import httpx

from . import _channel
from ._errors import ConnectionLost, SequencesError, TransportError, Unavailable, from_response
from ._lease import (_DROPPED, INTERVAL_WINDOW, LEASE_MARGIN_FLOOR_S, LEASE_MARGIN_INTERVALS,  # noqa: F401
                     LEASE_MARGIN_MAX_FRACTION, LEASE_MARGIN_S, RENEW_BESIDE_S, RENEW_RETRY_FIRST_S,
                     RENEW_RETRY_MAX_S, RENEW_TIMEOUT_S, LeaseRenewal, Session, _lease_ttl, _renew_at,
                     lease_margin)
from ._prefetch import DeadlineEstimate
from ._types import ModelInfo, Prediction
from ._transport import CHANNEL_PAUSE_S, TRANSPORTS, Transports  # noqa: F401
from .protocol import JSON_CONTENT_TYPE, encode_act_body

__all__ = ["Session", "WorkerLink", "fetch_models", "BODY_FORMATS", "TRANSPORTS"]

BODY_FORMATS = ("json", "binary", "auto", "shm")
# Errors after which a connection (HTTP or the channel) is gone but a fresh one may work.
_GONE = (*_DROPPED, _channel.ChannelDropped)
# No answer within timeout_s (asyncio's is TimeoutError itself from Python 3.11 on).
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)
# What one /act attempt's answer means (``_step``): the answer (returned), the same request again
# as JSON (the worker refused the binary body), or a reconnect through the gateway and one replay.
_ANSWER, _AS_JSON, _RECONNECT = "answer", "json", "reconnect"
# Asking again while queued: the gateway's Retry-After, clamped to this range (s). The gateway
# drops a robot that has not asked for 15 s (slots.ABANDON_S).
QUEUE_POLL_MIN_S = 0.25
QUEUE_POLL_MAX_S = 5.0
# Bound on the best-effort calls made while unwinding (episode end, leaving the line, closing).
COURTESY_TIMEOUT_S = 2.0


def _seconds(value: Any) -> Optional[float]:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _client(timeout_s: float) -> httpx.AsyncClient:
    # Two hosts (gateway, worker), one kept-alive connection to each is all we need.
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=2),
        trust_env=False,  # a robot talks to its own gateway; never route loopback via a proxy
    )


def _refuses_binary(response: httpx.Response) -> bool:
    """A worker that does not take the binary body: 415, or a 400/422 naming the content type."""
    if response.status_code == 415:
        return True
    if response.status_code in (400, 422):
        return "content type" in response.text.lower() or "content-type" in response.text.lower()
    return False


def _act_body(params: Dict[str, Any], observation: Dict[str, Any], extra: Optional[Dict[str, Any]],
              episode_id: Optional[str], delay: Optional[Dict[str, Any]],
              deadline: Optional[Dict[str, float]] = None) -> Dict[str, Any]:
    """The /act body; ``deadline`` (``DeadlineEstimate.fields``) goes first, where the worker
    reads it without parsing the rest."""
    body: Dict[str, Any] = dict(deadline or {})
    body.update({"observation": observation, "params": {**params, **(extra or {})}})
    if episode_id is not None:
        body["episode_id"] = episode_id
    if delay:
        body.update(delay)
    return body


def _deadline(delay: Optional[Dict[str, Any]], estimate: DeadlineEstimate,
              intervals: List[float]) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, float]]]:
    """``delay`` less its ``playback_left_s`` (s, the run loop's actions left when it sends)
    -> (the delay fields, the deadline fields it implies: ``DeadlineEstimate.fields`` with the
    wire's recent request ``intervals``; None without a ``delay``). A loop's request without
    ``playback_left_s`` is a run's first (nothing to play yet): it asks for the soonest answer.
    Sent without a deadline it was ordered 1 s after it came, behind the requests of the robots
    already served, and its robot's prefetch then planned for an answer faster than the start's
    queue (one underrun each for half of a 96-robot fleet)."""
    if delay is None:
        return None, None
    rest = {k: v for k, v in delay.items() if k != "playback_left_s"}
    return rest, estimate.fields(delay.get("playback_left_s") or 0.0, intervals)


def _answered(response: httpx.Response, started: float, sent: float, estimate: DeadlineEstimate) -> Prediction:
    """A 2xx answer (JSON, or the channel's binary one: ``_channel.answer_data``, TransportError
    when malformed) -> its Prediction (``latency_s`` from ``started``, monotonic s); its round trip
    (from ``sent``) less the worker's ``server_ms`` is a network sample for the next deadlines."""
    pred = Prediction.from_wire(_channel.answer_data(response), request_id=response.headers.get("x-request-id"),
                                latency_s=time.monotonic() - started)
    estimate.note_answer(time.monotonic() - sent, pred.extra.get("server_ms"))
    return pred


def _step(response: Optional[httpx.Response], binary: bool, attempt: int, body_format: str) -> str:
    """What one attempt's answer means: ``_ANSWER`` (a 2xx), ``_AS_JSON`` (an "auto" body refused
    as binary), ``_RECONNECT`` (None: a dropped connection; or a 401 on the first attempt).
    Raises the mapped error (``from_response``) of any other error answer."""
    if response is None:
        return _RECONNECT
    if binary and body_format == "auto" and _refuses_binary(response):
        return _AS_JSON
    if response.status_code == 401 and attempt == 0:
        return _RECONNECT
    if response.is_error:
        raise from_response(response)
    return _ANSWER


def _timed_out(session: Session, timeout_s: float) -> TransportError:
    return TransportError(f"/act to {session.worker_url} timed out after {timeout_s:g}s",
                          hint="raise timeout_s= on connect() for slow policies")


class WorkerLink(LeaseRenewal):
    """The session client of one model: HTTP to the gateway, /act to the worker over the
    transport it picks (``transports``, a ``_transport.Transports``). Not thread-safe: one event
    loop uses it (and, for ``act_blocking``, the thread that runs that loop).

    Args:
        gateway_url: base URL of the gateway, no trailing slash.
        api_key: the tenant key, sent as ``Authorization: Bearer``.
        model: the deployment name.
        params: inference parameters sent on connect and with every /act.
        timeout_s: per-request HTTP timeout in seconds.
        body_format: "json" (default), "binary", "shm" (binary, frames through shared memory: the
            same-host path, ``_shm``) or "auto" (binary, falling back to JSON for the
            session when the worker answers 415).
        on_queue: ``(position, estimate_s) -> None`` for each ``queued`` answer while ``join``
            waits in line; None: silent.
        transport: how /act travels (``TRANSPORTS``): "auto" (the persistent channel when the
            ``websockets`` package is installed and the worker has one, else HTTP), "http" or
            "channel". None: ``$SEQUENCE_AI_TRANSPORT``, else "auto".
        request_hz: the chunks per second sent as ``request_hz`` with each connect (the gateway's
            admission counts the robot at it) and, as its period, with each /act; None: not sent.

    Raises ValueError for an unknown body_format or transport.
    """

    def __init__(self, gateway_url: str, api_key: str, model: str,
                 params: Optional[Dict[str, Any]] = None, timeout_s: float = 60.0,
                 body_format: str = "json",
                 on_queue: Optional[Callable[[int, Optional[float]], Any]] = None,
                 transport: Optional[str] = None, request_hz: Optional[float] = None) -> None:
        if body_format not in BODY_FORMATS:
            raise ValueError(f"body_format must be one of {BODY_FORMATS}, not {body_format!r}")
        self.body_format = body_format
        # the deadline_ms / period_ms each /act carries (period_ms: 1 / request_hz when declared)
        self.deadlines = DeadlineEstimate(period_s=1.0 / request_hz if request_hz else None)
        self.last_request_bytes = 0
        self.gateway_url = gateway_url
        self.model = model
        self.params = dict(params or {})
        self.timeout_s = timeout_s
        self.session: Optional[Session] = None
        self.reconnects = 0
        self.renewals = 0
        self.resumed = 0                        # reconnects that kept the session (renewed)
        self.renew_failures = 0                 # renewal tries the gateway did not answer (retried)
        self.last_renewal_left_s: Optional[float] = None   # lease time left at the last renewal (s)
        self._last_request: Optional[float] = None
        self._renewal: Optional["asyncio.Future[Optional[bool]]"] = None   # a renewal running beside requests
        self._intervals: List[float] = []       # recent gaps between /act requests (s)
        self._api_key = api_key
        self._http: Optional[httpx.AsyncClient] = None
        self.on_queue = on_queue
        self.ticket: Optional[str] = None       # our place in a deployment's line, while queued
        self.queued_answers = 0                 # 503 queued answers seen (all joins)
        self._background: List["asyncio.Future[Any]"] = []   # courtesy calls still finishing
        if transport is None:
            transport = os.environ.get("SEQUENCE_AI_TRANSPORT") or "auto"
        self.transports = Transports(transport, timeout_s, lambda: self.http, shm=body_format == "shm")
        self.request_hz = request_hz            # chunks/s declared at connect (None: the gateway derives it)

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:  # created lazily, inside the event loop that will use it
            self._http = _client(self.timeout_s)
        return self._http

    async def aclose(self) -> None:
        """End the session and give up any place in line (best effort), close the connections."""
        await self._cancel_renewal()
        await self.close_session()
        await self.leave_line()
        for task in self._background:
            try:
                await task
            except BaseException:  # noqa: BLE001 - a courtesy call
                pass
        self._background.clear()
        await self.aclose_http()
        self.session = None

    async def aclose_http(self) -> None:
        """Close the /act transport and the pooled connections but keep the session: the next
        call opens new ones."""
        await self._cancel_renewal()
        await self.transports.aclose()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self.http.request(method, url, **kwargs)
        except httpx.TimeoutException as exc:
            raise TransportError(f"{method} {url} timed out after {self.timeout_s:g}s",
                                 hint="raise timeout_s= on connect() for slow policies") from exc
        except _DROPPED:
            raise
        except httpx.HTTPError as exc:
            raise TransportError(f"{method} {url} failed: {exc!r}") from exc

    async def handshake(self) -> Session:
        """One ``POST /v1/connect`` (with our ticket when queued): fresh worker coordinates.

        Raises the mapped error on failure; a full deployment is ``Unavailable`` with code
        ``queued`` (its ``details.ticket`` is kept: the next handshake keeps the place).
        """
        url = f"{self.gateway_url}/v1/connect"
        body: Dict[str, Any] = {"model": self.model, "params": self.params}
        if self.request_hz is not None:
            body["request_hz"] = self.request_hz
        if self.ticket:
            body["ticket"] = self.ticket
        try:
            response = await self._send(
                "POST", url, json=body,
                headers={"Authorization": f"Bearer {self._api_key}"},
            )
        except _DROPPED as exc:
            raise TransportError(
                f"cannot reach the gateway at {self.gateway_url}: {exc!r}",
                hint="is it running? `seq serve` starts it; SEQUENCES_GATEWAY_URL points elsewhere",
            ) from exc
        if response.is_error:
            error = from_response(response)
            if error.code == "queued":
                self.ticket = str((error.details or {}).get("ticket") or "") or self.ticket
            elif error.code in ("queue_timeout", "deployment_full"):
                self.ticket = None  # the gateway has taken us out of the line
            raise error
        self.ticket = None  # admitted: the line is behind us
        return self._adopt(response.json(), time.monotonic())

    async def join(self) -> Session:
        """Handshake, waiting in line while every slot of the deployment is taken.

        Each ``queued`` answer calls ``on_queue(position, estimate_s)`` and the next attempt
        follows Retry-After (clamped to QUEUE_POLL_MIN_S..QUEUE_POLL_MAX_S). Cancelling the
        task gives the place in line up (a ``DELETE`` of the ticket, in the background).

        Raises:
            Unavailable: code ``queue_timeout`` once the deployment's ``queue_timeout_s`` ran
                out, ``warming`` while a worker loads (the caller decides whether to wait), and
                every other error of ``handshake``.
        """
        try:
            while True:
                try:
                    return await self.handshake()
                except Unavailable as exc:
                    if exc.code != "queued":
                        raise
                    self.queued_answers += 1
                    details = exc.details or {}
                    if self.on_queue is not None:
                        self.on_queue(int(details.get("position") or 0), _seconds(details.get("estimate_s")))
                    pause = exc.retry_after_s if exc.retry_after_s is not None else 1.0
                    await asyncio.sleep(min(max(pause, QUEUE_POLL_MIN_S), QUEUE_POLL_MAX_S))
        except asyncio.CancelledError:
            # give the place in line up without holding up the cancellation (interrupt-to-hold)
            ticket, self.ticket = self.ticket, None
            if ticket:
                self._background = [t for t in self._background if not t.done()]
                self._background.append(asyncio.ensure_future(self._delete(ticket)))
            raise

    async def leave_line(self) -> None:
        """Give up our place in line now (best effort): ``DELETE /v1/sessions/{ticket}``."""
        ticket, self.ticket = self.ticket, None
        if ticket:
            await self._delete(ticket)

    async def _delete(self, session_or_ticket: str) -> None:
        """Best-effort ``DELETE /v1/sessions/{id}`` (a session, or a ticket in line)."""
        try:
            await self.http.delete(f"{self.gateway_url}/v1/sessions/{session_or_ticket}",
                                   headers={"Authorization": f"Bearer {self._api_key}"},
                                   timeout=COURTESY_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a courtesy; the gateway drops stale entries anyway
            pass

    def end_episode_soon(self, episode_id: str) -> "asyncio.Future[bool]":
        """Start ``POST {worker}/episode/end`` in the background: the policy's ``@seq.on_episode``
        runs for ``episode_id``.

        The worker registers the end on receipt but answers only after the episode's queued acts
        (an interrupted slow inference), so nobody waits for it here: ``settle(wait_s)`` gives it
        a bounded time and ``aclose`` awaits it. The task's result is True when the worker
        confirmed, False when it could not be sent (no session, worker gone); it never raises,
        and the worker also ends an episode left idle for 5 minutes.
        """
        session = self.session

        async def end() -> bool:
            if session is None:
                return False
            try:
                response = await self.http.post(
                    f"{session.worker_url}/episode/end", json={"episode_id": episode_id},
                    headers={"Authorization": f"Bearer {session.direct_secret}"},
                    timeout=COURTESY_TIMEOUT_S)
            except Exception:  # noqa: BLE001
                return False
            return response.status_code == 200
        task = asyncio.ensure_future(end())
        self._background = [t for t in self._background if not t.done()] + [task]
        return task

    async def settle(self, wait_s: float) -> None:
        """Give the background courtesy calls (episode end, leaving the line) up to ``wait_s``
        seconds to finish; those still running go on in the background."""
        pending = [t for t in self._background if not t.done()]
        if pending and wait_s > 0:
            await asyncio.wait(pending, timeout=wait_s)

    def _adopt(self, body: Dict[str, Any], received: float) -> Session:
        """Take the coordinates of a connect (or renew) answer as the current session."""
        lease = body.get("lease") or {}
        ttl = _lease_ttl(lease)
        self.session = Session(
            session_id=body.get("session_id"),
            worker_url=str(body["worker_url"]).rstrip("/"),
            direct_secret=body["direct_secret"],
            lease=lease,
            contract=body.get("contract") or {},
            params=body.get("params") or {},
            epoch=lease.get("epoch"),
            version=body.get("version", getattr(self.session, "version", None)),   # a renewal may not repeat it
            renew_at=_renew_at(lease, received, self.request_interval_s()),
            ttl_s=ttl,
            expires_mono=None if ttl is None else received + ttl,
        )
        return self.session

    async def act(self, observation: Dict[str, Any], *, params: Optional[Dict[str, Any]] = None,
                  episode_id: Optional[str] = None, delay: Optional[Dict[str, Any]] = None) -> Prediction:
        """One observation (wire dict) to the worker's /act -> the Prediction, over the transport
        ``transports`` picks (the asyncio channel, else ``POST {worker}/act``).

        ``delay``: the delay fields sent beside the observation (``prefix``, ``delay_steps``,
        ``obs_time``, ``request_id``, ``generation``; ``_delay.DelayTracker.fields``); the
        answer's echo lands in ``Prediction.request_id`` / ``Prediction.extra["generation"]``.

        Reconnects through the gateway once on 401 or a dropped connection (HTTP or channel)
        and replays.

        Raises:
            Unavailable: 503 (``.warming`` while the worker loads).
            PolicyError: the policy raised (500).
            InvalidRequest: the worker refused the observation or params (400).
            AuthError: the API key itself was refused at the gateway.
            TransportError: no answer within ``timeout_s``. ConnectionLost: the network failed twice.
        """
        body = _act_body(self.params, observation, params, episode_id, *_deadline(delay, self.deadlines, self._intervals))
        started = time.monotonic()
        self.note_request()
        encoded: Dict[bool, Tuple[bytes, str]] = {}
        attempt = 0
        while True:
            session = await self._current_session()
            binary = self.body_format != "json"
            content, content_type = encoded.get(binary) or encoded.setdefault(
                binary, encode_act_body(body, binary, split=self.body_format == "shm"))
            binary = content_type != JSON_CONTENT_TYPE
            self.last_request_bytes = len(content)
            response: Optional[httpx.Response] = None
            sent = time.monotonic()
            try:
                response = await self.transports.arequest(session, content, binary)
            except _TIMEOUTS as exc:
                raise _timed_out(session, self.timeout_s) from exc
            except _GONE as exc:
                if attempt:
                    raise ConnectionLost(f"connection to the worker dropped twice: {exc!r}") from exc
            step = _step(response, binary, attempt, self.body_format)
            if step == _ANSWER:
                return _answered(response, started, sent, self.deadlines)
            if step == _AS_JSON:
                self.body_format = "json"  # this worker predates the binary body
                continue
            attempt += 1
            await self._reconnect()

    def act_blocking(self, observation: Dict[str, Any], run: Callable[[Any], Any], *,
                     params: Optional[Dict[str, Any]] = None, episode_id: Optional[str] = None,
                     delay: Optional[Dict[str, Any]] = None) -> Prediction:
        """``act`` on the calling thread: the sync face's ``predict``. A session's steady state
        goes out over the blocking channel (``_blocking.BlockingChannel``) without an event loop;
        what needs one (joining, a lease renewal, a reconnect, HTTP /act, closing an asyncio
        channel) goes through ``run`` (``coroutine -> its result``, on the event loop this link
        lives on). The same answers, replays and errors as ``act``."""
        body = _act_body(self.params, observation, params, episode_id, *_deadline(delay, self.deadlines, self._intervals))
        started = time.monotonic()
        self.note_request()
        attempt = 0
        while True:
            session = self.session
            if session is None or session.renew_refused or self.lease_due(session):
                session = run(self._current_session())
            content, content_type = encode_act_body(body, self.body_format != "json",
                                                    split=self.body_format == "shm")   # frames from their own bytes into the segment
            binary = content_type != JSON_CONTENT_TYPE
            self.last_request_bytes = len(content)
            response: Optional[httpx.Response] = None
            sent = time.monotonic()
            try:
                transport = self._blocking_transport(session, run)
                if transport is None:         # no blocking channel now: the event loop's transport
                    response = run(self.transports.arequest(session, content, binary))
                else:
                    response = transport if isinstance(transport, httpx.Response) else \
                        transport.request(content, binary)
            except _TIMEOUTS as exc:
                raise _timed_out(session, self.timeout_s) from exc
            except _GONE as exc:
                if attempt:
                    raise ConnectionLost(f"connection to the worker dropped twice: {exc!r}") from exc
            step = _step(response, binary, attempt, self.body_format)
            if step == _ANSWER:
                return _answered(response, started, sent, self.deadlines)
            if step == _AS_JSON:
                self.body_format = "json"
                continue
            attempt += 1
            run(self._reconnect())

    def _blocking_transport(self, session: Session, run: Callable[[Any], Any]) -> Any:
        """``transports.get_blocking`` after closing an open transport that does not fit (an
        asyncio channel: on the event loop, through ``run``)."""
        transports = self.transports
        if transports.current is not None and not transports.fits(session, blocking=True):
            run(transports.aclose())
        return transports.get_blocking(session)

    async def _current_session(self) -> Session:
        """The session to send with: joined, replaced after a refused renewal, or renewed first
        when its lease is due (beside the request while there is time, else before it)."""
        session = self.session
        if session is None:
            return await self.join()
        if session.renew_refused:     # a renewal beside requests was refused: a new session now
            return await self.renew()
        if self.lease_due(session):  # renew before it lapses rather than eat a 401
            if session.expires_mono is not None and session.expires_mono - time.monotonic() > RENEW_BESIDE_S:
                self._renew_beside(session)   # time enough: the request goes on with the current token
            else:
                return await self.renew()
        return session

    async def close_session(self) -> None:
        """Best effort ``DELETE /v1/sessions/{id}``: frees the session's slot at once (after ``aclose_http`` too)."""
        session = self.session
        if session is None or not session.session_id:
            return
        await self._delete(session.session_id)

    async def _reconnect(self) -> None:
        """Fresh coordinates after a 401 or a dropped connection: resume the session when the
        gateway still holds it, else close it and open a new one (waiting in line if need be).
        The /act transport is closed first: the replay opens a fresh one with the new token."""
        self.reconnects += 1
        await self.transports.aclose()
        old = self.session
        if old is not None and old.session_id:
            try:
                response = await self._send(
                    "POST", f"{self.gateway_url}/v1/sessions/{old.session_id}/renew",
                    headers={"Authorization": f"Bearer {self._api_key}"})
            except _DROPPED as exc:
                raise TransportError(f"cannot reach the gateway at {self.gateway_url}: {exc!r}") from exc
            if response.status_code == 200:
                self.resumed += 1
                self._adopt(response.json(), time.monotonic())
                return
        await self._replace(old)

    async def _replace(self, old: Optional[Session]) -> None:
        """Close ``old`` at the gateway (its slot frees at once), then join for a new session."""
        self.session = old
        await self.close_session()
        self.session = None
        await self.join()

    async def ping(self) -> bool:
        """True when the worker from the current session answers ``GET /ping`` ready."""
        if self.session is None:
            return False
        try:
            response = await self._send("GET", f"{self.session.worker_url}/ping")
        except (SequencesError, *_DROPPED):
            return False
        return response.status_code == 200 and (response.json() or {}).get("status") == "ready"

    async def label(self, episode_id: str, success: bool, notes: str = "") -> Dict[str, Any]:
        """``POST /v1/episodes/{episode_id}/label`` (gateway, API key): mark how an episode went.

        Raises the mapped error (InvalidRequest for an unknown episode, AuthError, ...).
        """
        url = f"{self.gateway_url}/v1/episodes/{episode_id}/label"
        try:
            response = await self._send(
                "POST", url, json={"model": self.model, "success": bool(success), "notes": notes},
                headers={"Authorization": f"Bearer {self._api_key}"})
        except _DROPPED as exc:
            raise TransportError(f"cannot reach the gateway at {self.gateway_url}: {exc!r}") from exc
        if response.is_error:
            raise from_response(response)
        try:
            return response.json()
        except ValueError:
            return {}

    async def deployment(self) -> Dict[str, Any]:
        """``GET /v1/deployments/{model}``: the deployment's status row."""
        try:
            response = await self._send("GET", f"{self.gateway_url}/v1/deployments/{self.model}",
                                        headers={"Authorization": f"Bearer {self._api_key}"})
        except _DROPPED as exc:
            raise TransportError(f"cannot reach the gateway at {self.gateway_url}: {exc!r}") from exc
        if response.is_error:
            raise from_response(response)
        return response.json()


async def fetch_models(gateway_url: str, timeout_s: float = 10.0) -> List[ModelInfo]:
    """``GET /v1/models`` (no key): the catalogue."""
    async with _client(timeout_s) as http:
        try:
            response = await http.get(f"{gateway_url}/v1/models")
        except httpx.HTTPError as exc:
            raise TransportError(f"cannot reach the gateway at {gateway_url}: {exc!r}") from exc
    if response.is_error:
        raise from_response(response)
    return [ModelInfo.from_wire(m) for m in (response.json().get("models") or [])]
