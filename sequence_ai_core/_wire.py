"""The wire: one httpx.AsyncClient, the gateway handshake, and /act straight to the worker.

A call is two phases and the gateway is in only the first::

    POST {gateway}/v1/connect   (API key)        -> worker_url, direct_secret, lease, contract
    WS   {worker_url}/act/ws    (direct secret)  -> action_chunk        (repeated, one open websocket)
      or POST {worker_url}/act                                          (one kept-alive connection)

The persistent channel (``_channel.py``) is used when the ``websockets`` package is installed and
the worker has one (``transport="auto"``); it carries the same /act body and answers with the
same body and status, so everything below holds for both. Lease renewal is in ``_lease.py``.

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
from ._types import ModelInfo, Prediction
from .protocol import JSON_CONTENT_TYPE, encode_act_body

__all__ = ["Session", "Wire", "fetch_models", "BODY_FORMATS", "TRANSPORTS"]

BODY_FORMATS = ("json", "binary", "auto")
# How /act travels: "auto" the persistent channel (a websocket, ``_channel.py``) when the
# ``websockets`` package is installed and the worker has one, else HTTP; "http" always HTTP;
# "channel" the channel only (an error when it cannot be used).
TRANSPORTS = ("auto", "http", "channel")
# Errors after which a connection (HTTP or the channel) is gone but a fresh one may work.
_GONE = (*_DROPPED, _channel.ChannelDropped)
# Asking again while queued: the gateway's Retry-After, clamped to this range (s). The gateway
# drops a robot that has not asked for 15 s (slots.ABANDON_S).
QUEUE_POLL_MIN_S = 0.25
QUEUE_POLL_MAX_S = 5.0
# After a worker refused the channel for want of websocket places (``too_many_connections``),
# "auto" sends /act over HTTP for this long (s) before it tries the channel again.
CHANNEL_PAUSE_S = 30.0
# Bound on the best-effort calls made while unwinding (episode end, leaving the line, closing).
COURTESY_TIMEOUT_S = 2.0


def _error_code(response: httpx.Response) -> Optional[str]:
    try:
        return (response.json() or {}).get("code")
    except ValueError:
        return None


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


class Wire(LeaseRenewal):
    """HTTP to the gateway, HTTP or the /act channel to the worker, for one model. Not thread-safe: one event loop uses it.

    Args:
        gateway_url: base URL of the gateway, no trailing slash.
        api_key: the tenant key, sent as ``Authorization: Bearer``.
        model: the deployment name.
        params: inference parameters sent on connect and with every /act.
        timeout_s: per-request HTTP timeout in seconds.
        body_format: "json" (default), "binary" or "auto" (binary, falling back to JSON for the
            session when the worker answers 415).
        on_queue: ``(position, estimate_s) -> None`` for each ``queued`` answer while ``join``
            waits in line; None: silent.
        transport: how /act travels (``TRANSPORTS``): "auto" (the persistent channel when the
            ``websockets`` package is installed and the worker has one, else HTTP), "http" or
            "channel". None: ``$SEQUENCE_AI_TRANSPORT``, else "auto".
    """

    def __init__(self, gateway_url: str, api_key: str, model: str,
                 params: Optional[Dict[str, Any]] = None, timeout_s: float = 60.0,
                 body_format: str = "json",
                 on_queue: Optional[Callable[[int, Optional[float]], Any]] = None,
                 transport: Optional[str] = None) -> None:
        if body_format not in BODY_FORMATS:
            raise ValueError(f"body_format must be one of {BODY_FORMATS}, not {body_format!r}")
        self.body_format = body_format
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
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        self.transport = transport
        self.channel_opens = 0                  # times the /act channel was opened
        self._channel: Optional[_channel.ActChannel] = None
        self._no_channel: Optional[str] = None  # a worker URL that has no channel (HTTP /act there)
        self._refusal: Optional[httpx.Response] = None   # the worker's answer to a refused channel open
        self.channel_paused_until = 0.0         # monotonic s: the worker's websocket places were all taken
        # Set by the sync client's blocking path (``_blocking.BlockingAct``) when it spent the next
        # request's first attempt on a gone connection: ``act`` reconnects first and replays once.
        self.first_attempt_spent = False

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
        await self._drop_channel()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self.session = None

    async def aclose_http(self) -> None:
        """Close the pooled connections but keep the session: the next call opens a new one."""
        await self._cancel_renewal()
        await self._drop_channel()
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
            self._leave_in_background()
            raise

    def _leave_in_background(self) -> None:
        """Give the place in line up without holding up a cancellation (interrupt-to-hold)."""
        ticket, self.ticket = self.ticket, None
        if ticket:
            self._background = [t for t in self._background if not t.done()]
            self._background.append(asyncio.ensure_future(self._delete(ticket)))

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
        task = asyncio.ensure_future(self._end_episode(episode_id))
        self._background = [t for t in self._background if not t.done()] + [task]
        return task

    async def settle(self, wait_s: float) -> None:
        """Give the background courtesy calls (episode end, leaving the line) up to ``wait_s``
        seconds to finish; those still running go on in the background."""
        pending = [t for t in self._background if not t.done()]
        if pending and wait_s > 0:
            await asyncio.wait(pending, timeout=wait_s)

    async def _end_episode(self, episode_id: str) -> bool:
        session = self.session
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
            renew_at=_renew_at(lease, received, self.request_interval_s()),
            ttl_s=ttl,
            expires_mono=None if ttl is None else received + ttl,
        )
        return self.session

    async def act(self, observation: Dict[str, Any], *, params: Optional[Dict[str, Any]] = None,
                  episode_id: Optional[str] = None, delay: Optional[Dict[str, Any]] = None) -> Prediction:
        """One observation (wire dict) to the worker's /act -> the Prediction. Over the
        persistent channel (``transport``), else ``POST {worker}/act``.

        ``delay``: the delay fields sent beside the observation (``prefix``, ``delay_steps``,
        ``obs_time``, ``request_id``, ``generation``; ``_delay.DelayTracker.fields``); the
        answer's echo lands in ``Prediction.request_id`` / ``Prediction.extra["generation"]``.

        Reconnects through the gateway once on 401 or a dropped connection (HTTP or channel)
        and replays; with ``first_attempt_spent`` set (the sync client's blocking path already
        tried, on a connection that failed) it reconnects first and that replay is the only one.

        Raises:
            Unavailable: 503 (``.warming`` while the worker loads).
            PolicyError: the policy raised (500).
            InvalidRequest: the worker refused the observation or params (400).
            AuthError: the API key itself was refused at the gateway.
            TransportError / ConnectionLost: the network failed twice.
        """
        body = self._body(observation, params, episode_id, delay)
        started = time.monotonic()
        self.note_request()
        encoded: Dict[bool, Tuple[bytes, str]] = {}
        attempt = 0
        if self.first_attempt_spent:     # the blocking path sent it, or could not open: this is the replay
            self.first_attempt_spent = False
            attempt = 1
            await self._reconnect()
        while True:
            session = await self._current_session()
            binary = self.body_format != "json"
            if binary not in encoded:
                encoded[binary] = encode_act_body(body, binary)
            content, content_type = encoded[binary]
            self.last_request_bytes = len(content)
            try:
                response = await self._post_act(session, content, content_type)
            except _GONE as exc:
                if attempt == 0:
                    attempt += 1
                    await self._reconnect()
                    continue
                raise ConnectionLost(f"connection to the worker dropped twice: {exc!r}") from exc
            if binary and self.body_format == "auto" and _refuses_binary(response):
                self.body_format = "json"  # this worker predates the binary body
                continue
            if response.status_code == 401 and attempt == 0:
                attempt += 1
                await self._reconnect()
                continue
            if response.is_error:
                raise from_response(response)
            return self.prediction(response, started)

    def _body(self, observation: Dict[str, Any], params: Optional[Dict[str, Any]],
              episode_id: Optional[str], delay: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        body: Dict[str, Any] = {"observation": observation, "params": {**self.params, **(params or {})}}
        if episode_id is not None:
            body["episode_id"] = episode_id
        if delay:
            body.update(delay)
        return body

    def encode_body(self, observation: Dict[str, Any], params: Optional[Dict[str, Any]] = None,
                    episode_id: Optional[str] = None, delay: Optional[Dict[str, Any]] = None) -> Tuple[bytes, bool]:
        """The /act body of one request as ``act`` would send it now -> ``(bytes, binary)``
        (``binary``: the binary framing; a body without frames is JSON either way)."""
        content, content_type = encode_act_body(self._body(observation, params, episode_id, delay),
                                                self.body_format != "json")
        self.last_request_bytes = len(content)
        return content, content_type != JSON_CONTENT_TYPE

    @staticmethod
    def prediction(response: httpx.Response, started: float) -> Prediction:
        """A 2xx /act answer -> the Prediction (``latency_s`` counted from ``started``, monotonic s)."""
        return Prediction.from_wire(response.json(), request_id=response.headers.get("x-request-id"),
                                    latency_s=time.monotonic() - started)

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

    async def _post_act(self, session: Session, content: bytes, content_type: str) -> httpx.Response:
        """Send one encoded /act body: over the channel when ``transport`` allows and the worker
        has one, else HTTP. Raises what ``_send`` raises, ChannelDropped, TransportError (the
        channel timed out)."""
        if self.transport != "http":
            channel = await self._open_channel(session)
            if channel is not None:
                try:
                    return await channel.request(content, content_type != JSON_CONTENT_TYPE)
                except asyncio.TimeoutError as exc:
                    raise TransportError(f"/act over the channel to {session.worker_url} timed out after "
                                         f"{self.timeout_s:g}s",
                                         hint="raise timeout_s= on connect() for slow policies") from exc
                except _channel.ChannelDropped:
                    await self._drop_channel()
                    raise
            if self._refusal is not None:
                refusal, self._refusal = self._refusal, None
                return refusal
        return await self._send("POST", f"{session.worker_url}/act", content=content,
                                headers={"Authorization": f"Bearer {session.direct_secret}",
                                         "Content-Type": content_type})

    async def _open_channel(self, session: Session) -> Optional["_channel.ActChannel"]:
        """The open channel for ``session``'s worker and token (reopened when either changed),
        or None: HTTP for this request (no ``websockets``, a worker without a channel, or a
        refused open, kept in ``_refusal`` for the caller). Raises ChannelDropped."""
        channel = self._channel
        if channel is not None and channel.open and channel.worker_url == session.worker_url \
                and channel.token == session.direct_secret:
            return channel
        await self._drop_channel()
        if self.transport == "auto" and time.monotonic() < self.channel_paused_until:
            return None
        if not _channel.available() or self._no_channel == session.worker_url:
            if self.transport == "channel":
                raise TransportError("the /act channel cannot be used: " + (
                    "the websockets package is not installed" if not _channel.available()
                    else f"the worker at {session.worker_url} has none"),
                    hint="pip install websockets, or transport='auto' to fall back to HTTP")
            return None
        channel = _channel.ActChannel(session.worker_url, session.direct_secret, self.timeout_s)
        try:
            self._refusal = await channel.connect()
        except _channel.ChannelUnsupported:
            self._no_channel = session.worker_url    # an older worker: HTTP /act from now on
            return await self._open_channel(session)
        if self._refusal is not None:
            if self.pause_channel_for(self._refusal):
                self._refusal = None          # HTTP /act is not limited that way: use it for a while
            return None
        self._channel = channel
        self.channel_opens += 1
        return channel

    def pause_channel_for(self, refusal: httpx.Response) -> bool:
        """Pause the channel (CHANNEL_PAUSE_S; HTTP /act meanwhile) after an "auto" open refused for want of places."""
        if self.transport != "auto" or _error_code(refusal) != "too_many_connections":
            return False
        self.channel_paused_until = time.monotonic() + CHANNEL_PAUSE_S
        return True

    @property
    def channel_open(self) -> bool:
        """True while this wire's /act channel is open."""
        return self._channel is not None and self._channel.open

    async def close_channel(self) -> None:
        """Close this wire's /act channel (best effort); the next request over it opens a new one."""
        await self._drop_channel()

    async def _drop_channel(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.aclose()

    async def close_session(self) -> None:
        """Best effort ``DELETE /v1/sessions/{id}``: frees the session's slot at once (after ``aclose_http`` too)."""
        session = self.session
        if session is None or not session.session_id:
            return
        await self._delete(session.session_id)

    async def _reconnect(self) -> None:
        """Fresh coordinates after a 401 or a dropped connection: resume the session when the
        gateway still holds it, else close it and open a new one (waiting in line if need be)."""
        self.reconnects += 1
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
