"""The wire: one httpx.AsyncClient, the gateway handshake, and /act straight to the worker.

A call is two phases and the gateway is in only the first::

    POST {gateway}/v1/connect   (API key)        -> worker_url, direct_secret, lease, contract
    POST {worker_url}/act       (direct secret)  -> action_chunk        (repeated, one kept-alive connection)

Transparent fallback: a 401 from the worker (rotated secret, expired lease) or a dropped
connection sends the wire back through the gateway for fresh coordinates, once, and the call
is replayed. A second failure is raised. A 503 warming from the gateway becomes
``Unavailable(warming=True, retry_after_s=...)``; waiting it out is the loop's decision, not
the wire's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import httpx

from ._errors import ConnectionLost, SequencesError, TransportError, from_response
from ._types import ModelInfo, Prediction

__all__ = ["Session", "Wire", "fetch_models"]

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


def _client(timeout_s: float) -> httpx.AsyncClient:
    # Two hosts (gateway, worker), one kept-alive connection to each is all we need.
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
        limits=httpx.Limits(max_connections=4, max_keepalive_connections=2),
        trust_env=False,  # a robot talks to its own gateway; never route loopback via a proxy
    )


class Wire:
    """HTTP to the gateway and the worker for one model. Not thread-safe: one event loop uses it.

    Args:
        gateway_url: base URL of the gateway, no trailing slash.
        api_key: the tenant key, sent as ``Authorization: Bearer``.
        model: the deployment name.
        params: inference parameters sent on connect and with every /act.
        timeout_s: per-request HTTP timeout in seconds.
    """

    def __init__(self, gateway_url: str, api_key: str, model: str,
                 params: Optional[Dict[str, Any]] = None, timeout_s: float = 60.0) -> None:
        self.gateway_url = gateway_url
        self.model = model
        self.params = dict(params or {})
        self.timeout_s = timeout_s
        self.session: Optional[Session] = None
        self.reconnects = 0
        self._api_key = api_key
        self._http: Optional[httpx.AsyncClient] = None

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:  # created lazily, inside the event loop that will use it
            self._http = _client(self.timeout_s)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        self.session = None

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
        body = response.json()
        lease = body.get("lease") or {}
        self.session = Session(
            session_id=body.get("session_id"),
            worker_url=str(body["worker_url"]).rstrip("/"),
            direct_secret=body["direct_secret"],
            lease=lease,
            contract=body.get("contract") or {},
            params=body.get("params") or {},
            epoch=lease.get("epoch"),
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
        for attempt in (0, 1):
            session = self.session or await self.handshake()
            try:
                response = await self._send(
                    "POST", f"{session.worker_url}/act", json=body,
                    headers={"Authorization": f"Bearer {session.direct_secret}"},
                )
            except _DROPPED as exc:
                if attempt == 0:
                    await self._reconnect()
                    continue
                raise ConnectionLost(f"connection to the worker dropped twice: {exc!r}") from exc
            if response.status_code == 401 and attempt == 0:
                await self._reconnect()
                continue
            if response.is_error:
                raise from_response(response)
            return Prediction.from_wire(
                response.json(), request_id=response.headers.get("x-request-id"),
                latency_s=time.monotonic() - started,
            )
        raise SequencesError("unreachable")  # pragma: no cover

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
