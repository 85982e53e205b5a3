"""The wire: one httpx.AsyncClient, the gateway handshake, and /act straight to the worker.

A call is two phases and the gateway is in only the first::

    POST {gateway}/v1/connect   (API key)        -> worker_url, direct_secret, lease, contract
    POST {worker_url}/act       (direct secret)  -> action_chunk        (repeated, one kept-alive connection)

Transparent fallback: a 401 from the worker (rotated secret, expired lease) or a dropped
connection sends the wire back through the gateway for fresh coordinates, once, and the call
is replayed. A second failure is raised. The lease is also renewed *before* it lapses: the
handshake's ``ttl_s`` (else ``expires_at``) sets a local monotonic renewal time, and the first
request after it goes through the gateway first. A 503 warming from the gateway becomes
``Unavailable(warming=True, retry_after_s=...)``; waiting it out is the loop's decision, not
the wire's.

Body formats for /act (docs/design.md): JSON (base64 frames; what curl and non-Python
controllers send) or the binary framing ``application/vnd.sequence-ai.act+bin`` (a 4-byte
big-endian length, that many bytes of JSON whose images carry ``"blob": [offset, length]``
instead of ``"data"``, then the raw JPEG/PNG bytes). ``body_format="auto"`` sends binary and
falls back to JSON for the rest of the session when a worker answers 415.
"""
from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import httpx

from ._errors import ConnectionLost, SequencesError, TransportError, from_response
from ._types import ModelInfo, Prediction

__all__ = ["Session", "Wire", "fetch_models", "encode_act_body", "BINARY_CONTENT_TYPE",
           "BODY_FORMATS"]

BINARY_CONTENT_TYPE = "application/vnd.sequence-ai.act+bin"
BODY_FORMATS = ("json", "binary", "auto")
# Renew a lease this long before it lapses (s), or a tenth of its ttl when that is shorter.
LEASE_MARGIN_S = 5.0


def _raw(data: Any) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return base64.b64decode(data)


def _b64(data: Any) -> str:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(data)).decode("ascii")
    return data


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def encode_act_body(body: Dict[str, Any], binary: bool) -> Tuple[bytes, str]:
    """Serialise an /act body; returns ``(bytes, content_type)``.

    ``body["observation"]["images"][i]["data"]`` may be raw encoded bytes or base64 text. JSON:
    every frame becomes base64 text. Binary: every frame becomes a blob after the JSON header
    (depth frames stay base64 in the header). Raises ValueError for NaN/inf in the body.
    """
    obs = body.get("observation")
    images = obs.get("images") if isinstance(obs, dict) else None
    depth = obs.get("depth") if isinstance(obs, dict) else None
    if depth:
        obs = dict(obs, depth=[dict(d, data=_b64(d["data"])) for d in depth])
        body = dict(body, observation=obs)
    if not images:
        return _dumps(body), "application/json"
    if not binary:
        frames = [dict(img, data=_b64(img["data"])) if "data" in img else img for img in images]
        return _dumps(dict(body, observation=dict(obs, images=frames))), "application/json"
    blobs: List[bytes] = []
    frames = []
    offset = 0
    for img in images:
        if "data" not in img:
            frames.append(img)
            continue
        raw = _raw(img["data"])
        frame = {k: v for k, v in img.items() if k != "data"}
        frame["blob"] = [offset, len(raw)]
        offset += len(raw)
        blobs.append(raw)
        frames.append(frame)
    # depth PNGs (rare) stay base64 inside the header: the framing carries camera images only
    head = _dumps(dict(body, observation=dict(obs, images=frames)))
    return b"".join([len(head).to_bytes(4, "big"), head, *blobs]), BINARY_CONTENT_TYPE

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
    renew_at: Optional[float] = None  # time.monotonic() after which the lease is renewed first

    @property
    def lease_due(self) -> bool:
        """True once the lease is close enough to lapsing that the next call renews it first."""
        return self.renew_at is not None and time.monotonic() >= self.renew_at


def _renew_at(lease: Dict[str, Any], received: float) -> Optional[float]:
    """Monotonic renewal time for a lease: ttl_s (or expires_at - now) less a margin."""
    ttl = lease.get("ttl_s")
    if ttl is None and lease.get("expires_at") is not None:
        ttl = float(lease["expires_at"]) - time.time()
    if ttl is None:
        return None
    ttl = float(ttl)
    return received + max(0.0, ttl - min(LEASE_MARGIN_S, 0.1 * ttl))


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


class Wire:
    """HTTP to the gateway and the worker for one model. Not thread-safe: one event loop uses it.

    Args:
        gateway_url: base URL of the gateway, no trailing slash.
        api_key: the tenant key, sent as ``Authorization: Bearer``.
        model: the deployment name.
        params: inference parameters sent on connect and with every /act.
        timeout_s: per-request HTTP timeout in seconds.
        body_format: "json" (default), "binary" or "auto" (binary, falling back to JSON for the
            session when the worker answers 415).
    """

    def __init__(self, gateway_url: str, api_key: str, model: str,
                 params: Optional[Dict[str, Any]] = None, timeout_s: float = 60.0,
                 body_format: str = "json") -> None:
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
        self._api_key = api_key
        self._http: Optional[httpx.AsyncClient] = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:  # created lazily, inside the event loop that will use it
            self._http = _client(self.timeout_s)
        return self._http

    async def aclose(self) -> None:
        """End the session (best effort) and close the connections."""
        await self.close_session()
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self.session = None

    async def aclose_http(self) -> None:
        """Close the pooled connections but keep the session: the next call opens a new one."""
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
        """``POST /v1/connect``: fresh worker coordinates. Raises the mapped error on failure."""
        url = f"{self.gateway_url}/v1/connect"
        try:
            response = await self._send(
                "POST", url, json={"model": self.model, "params": self.params},
                headers={"Authorization": f"Bearer {self._api_key}"},
            )
        except _DROPPED as exc:
            raise TransportError(
                f"cannot reach the gateway at {self.gateway_url}: {exc!r}",
                hint="is it running? `seq serve` starts it; SEQUENCES_GATEWAY_URL points elsewhere",
            ) from exc
        if response.is_error:
            raise from_response(response)
        return self._adopt(response.json(), time.monotonic())

    def _adopt(self, body: Dict[str, Any], received: float) -> Session:
        """Take the coordinates of a connect (or renew) answer as the current session."""
        lease = body.get("lease") or {}
        self.session = Session(
            session_id=body.get("session_id"),
            worker_url=str(body["worker_url"]).rstrip("/"),
            direct_secret=body["direct_secret"],
            lease=lease,
            contract=body.get("contract") or {},
            params=body.get("params") or {},
            epoch=lease.get("epoch"),
            renew_at=_renew_at(lease, received),
        )
        return self.session

    async def act(self, observation: Dict[str, Any], *, params: Optional[Dict[str, Any]] = None,
                  episode_id: Optional[str] = None) -> Prediction:
        """``POST {worker}/act`` with one observation (wire dict). Returns the Prediction.

        Reconnects through the gateway once on 401 or a dropped connection and replays.

        Raises:
            Unavailable: 503 (``.warming`` while the worker loads).
            PolicyError: the policy raised (500).
            InvalidRequest: the worker refused the observation or params (400).
            AuthError: the API key itself was refused at the gateway.
            TransportError / ConnectionLost: the network failed twice.
        """
        body: Dict[str, Any] = {"observation": observation, "params": {**self.params, **(params or {})}}
        if episode_id is not None:
            body["episode_id"] = episode_id
        started = time.monotonic()
        encoded: Dict[bool, Tuple[bytes, str]] = {}
        attempt = 0
        while True:
            session = self.session
            if session is None:
                session = await self.handshake()
            elif session.lease_due:  # renew before it lapses rather than eat a 401
                session = await self.renew()
            binary = self.body_format != "json"
            if binary not in encoded:
                encoded[binary] = encode_act_body(body, binary)
            content, content_type = encoded[binary]
            self.last_request_bytes = len(content)
            try:
                response = await self._send(
                    "POST", f"{session.worker_url}/act", content=content,
                    headers={"Authorization": f"Bearer {session.direct_secret}",
                             "Content-Type": content_type},
                )
            except _DROPPED as exc:
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
            return Prediction.from_wire(
                response.json(), request_id=response.headers.get("x-request-id"),
                latency_s=time.monotonic() - started,
            )

    async def renew(self) -> Session:
        """Extend the lease before it lapses: ``POST /v1/sessions/{id}/renew`` (same session).

        A gateway that refuses (lease already gone, worker restarted, no such route) gets a fresh
        ``/v1/connect`` instead; an unreachable gateway keeps the current coordinates (the lease
        has not lapsed yet) and tries again a second later.
        """
        session = self.session
        if session is None:
            return await self.handshake()
        if session.session_id:
            try:
                response = await self._send(
                    "POST", f"{self.gateway_url}/v1/sessions/{session.session_id}/renew",
                    headers={"Authorization": f"Bearer {self._api_key}"})
            except (TransportError, *_DROPPED):
                session.renew_at = time.monotonic() + 1.0
                return session
            if response.status_code == 200:
                self.renewals += 1
                return self._adopt(response.json(), time.monotonic())
        try:
            await self._reconnect()
        except TransportError:
            self.session = session
            session.renew_at = time.monotonic() + 1.0
        return self.session  # type: ignore[return-value]

    async def close_session(self) -> None:
        """Best effort ``DELETE /v1/sessions/{id}``: frees the session's slot at once."""
        session = self.session
        if session is None or not session.session_id or self._http is None:
            return
        try:
            await self._http.delete(f"{self.gateway_url}/v1/sessions/{session.session_id}",
                                    headers={"Authorization": f"Bearer {self._api_key}"},
                                    timeout=2.0)
        except Exception:  # noqa: BLE001 - closing is a courtesy; the lease lapses anyway
            pass

    async def _reconnect(self) -> None:
        self.session = None
        self.reconnects += 1
        await self.handshake()

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
