"""``POST /v1/act``: the worker's ``/act`` through the gateway, for curl and scripts (robots
talk to their worker directly after connect). Any live key; a robot key only its deployment.
The body is the worker's body plus ``"model"``; the worker's answer comes back as it is.

The proxy forwards with the worker's secret, so the worker cannot tell one caller's requests from
another's: a ``deadline_ms`` / ``period_ms`` in the body is dropped here (the worker then serves
the request first come, first served), since only a robot's own session may claim a deadline. A
NaN or Infinity anywhere in the body (Python's JSON reader takes them; JSON has none) is 400
naming where it is, before anything is forwarded."""
from __future__ import annotations

import asyncio
import json
import math
from typing import TYPE_CHECKING, Any, Optional

import httpx
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response as RawResponse

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import KeyRecord, require_scope
from sequence_ai_server.gateway.routes import Auth
from sequence_ai_server.gateway.worker_record import _worker_url

if TYPE_CHECKING:
    from sequence_ai_server.gateway.sessions import SessionService

_HINT = 'send {"model": NAME, "observation": {...}, "params": {}}'
_SESSION_ONLY = ("deadline_ms", "period_ms")   # a robot's own session claims its deadline, never the proxy


def _not_finite(value: Any, path: str = "$") -> Optional[str]:
    """The JSON path of the first NaN or Infinity in ``value``, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        items = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for sub, v in items:
        found = _not_finite(v, sub)
        if found:
            return found
    return None


def router(sessions: "SessionService", auth: Auth, proxy: httpx.AsyncClient) -> APIRouter:
    """The proxy route (``sessions`` starts or waits for the worker); ``proxy`` is the client that forwards to the worker
    (the app closes it when it stops)."""
    act = APIRouter(prefix="/v1/act", tags=["act"])

    @act.post("")
    async def act_via_gateway(request: Request, key: KeyRecord = Depends(auth.require_key)) -> Any:
        """The worker's /act through the gateway (for curl): body = the worker body plus "model"."""
        try:
            body = json.loads(await request.body())
        except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
            raise ApiError("invalid_request", "the body is not JSON", hint=_HINT) from None
        bad = _not_finite(body)
        if bad:
            raise ApiError("invalid_request", f"{bad} is NaN or Infinity, which JSON does not have",
                           hint="send a finite number (or leave the field out)", details={"path": bad})
        model = body.pop("model", None) if isinstance(body, dict) else None
        for field in _SESSION_ONLY:
            if isinstance(body, dict):
                body.pop(field, None)
        if not isinstance(model, str):
            raise ApiError("invalid_request", 'the body needs "model": the deployment name', hint=_HINT)
        require_scope(key, model)
        request.state.deployment = model
        row = await asyncio.to_thread(sessions.ready_or_warming, model)
        rid = request.state.request_id
        try:
            resp = await proxy.post(f"{_worker_url(row)}/act", json=body,
                                    headers={"Authorization": f"Bearer {row.secret}", "X-Request-ID": rid})
        except httpx.HTTPError as exc:
            raise ApiError("worker_failed", f"the worker of {model!r} did not answer: {type(exc).__name__}",
                           hint="retry; `seq policy status NAME` shows the worker") from None
        return RawResponse(resp.content, status_code=resp.status_code, media_type="application/json",
                           headers={"X-Request-ID": resp.headers.get("x-request-id", rid)})

    return act
