"""Operations routes: a deployment's scheduled floor and usage, the account's limits, alert
webhooks and the card inventory (operations.py wires the services behind them).

    GET  /v1/deployments/{name}/scale    robot     the floor, whether its window is open now
    POST /v1/deployments/{name}/scale    account   {"min", "during", "tz"} or {"clear": true}
    GET  /v1/deployments/{name}/usage    robot     ?since=unix s: totals by card, hourly rows, captured bytes
    GET  /v1/account/limits              account   every scope's limits with what it uses
    POST /v1/account/limits              account   {"key"?, "max_workers", "max_cards", "worker_hours_per_day", "clear"}
    GET  /v1/alerts                      account   webhooks (no secrets) and recent deliveries
    POST /v1/alerts                      account   a new webhook; its secret is in this answer only
    DELETE /v1/alerts/{ref}              account
    POST /v1/alerts/{ref}/test           account   one signed test delivery, its outcome
    GET  /v1/gpus                        robot     cards, what each deployment holds, what is free
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Optional

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import KeyRecord, KeyStore, require_scope
from sequence_ai_server.gateway.routes import Auth
from sequence_ai_server.ops.service import OpsService

if TYPE_CHECKING:
    from sequence_ai_server.gateway.deployments import DeploymentService
    from sequence_ai_server.gateway.supervisor import Supervisor


# The largest count or number of hours a limit or floor takes: the state database stores 64-bit
# integers, and a larger number would fail there (a 500) instead of being refused here (a 400).
MAX_COUNT = 1_000_000
MAX_HOURS = 1e9


class ScaleUpdate(BaseModel):
    """``POST /v1/deployments/{name}/scale``."""
    model_config = ConfigDict(extra="forbid")
    min: Optional[StrictInt] = Field(default=None, le=MAX_COUNT, description="workers kept warm, up to the deployment's max_gpus (for a CPU policy it counts workers)")
    during: Optional[str] = Field(default=None, description='weekly window, e.g. "Mon-Fri 08:00-18:00"; none: always')
    tz: Optional[str] = Field(default=None, description="IANA time zone of the window (default UTC)")
    clear: bool = False


class LimitsUpdate(BaseModel):
    """``POST /v1/account/limits``: a None limit is left as it is unless named in ``clear``."""
    model_config = ConfigDict(extra="forbid")
    key: Optional[str] = Field(default=None, description="a key id (or name): its own limits; none: the account's")
    max_workers: Optional[int] = Field(default=None, le=MAX_COUNT)
    max_cards: Optional[int] = Field(default=None, le=MAX_COUNT)
    worker_hours_per_day: Optional[float] = Field(default=None, le=MAX_HOURS, allow_inf_nan=False)
    clear: list[str] = Field(default_factory=list, description='limits to remove, or ["all"]')


class WebhookCreate(BaseModel):
    """``POST /v1/alerts``."""
    model_config = ConfigDict(extra="forbid")
    url: str
    events: Optional[list[str]] = None
    deployment: Optional[str] = None
    error_rate: Optional[float] = Field(default=None, allow_inf_nan=False)
    p95_ms: Optional[float] = Field(default=None, allow_inf_nan=False)
    min_requests: int = Field(default=20, le=MAX_COUNT)


def _invalid(exc: ValueError, hint: str) -> ApiError:
    return ApiError("invalid_request", str(exc), hint=hint)


def router(ops: OpsService, deployments: "DeploymentService", keys: KeyStore, supervisor: "Supervisor",
           auth: Auth) -> list[APIRouter]:
    """The operations routes over ``ops`` (``supervisor`` tells which workers run; ``keys`` names
    the key a limit is for)."""
    return [_deployment_routes(ops, deployments, supervisor, auth), _account_routes(ops, deployments, keys, supervisor, auth)]


def _deployment_routes(ops: OpsService, deployments: "DeploymentService", supervisor: "Supervisor",
                       auth: Auth) -> APIRouter:
    r = APIRouter(tags=["operations"])

    @r.get("/v1/deployments/{name}/scale")
    async def get_scale(name: str, key: KeyRecord = Depends(auth.require_key)) -> dict:
        require_scope(key, name)
        return await asyncio.to_thread(ops.scale_view, name)

    @r.post("/v1/deployments/{name}/scale")
    async def set_scale(name: str, body: ScaleUpdate, key: KeyRecord = Depends(auth.account_key)) -> dict:
        row = deployments.require(name)
        cap = supervisor.fleets.cap(row)
        if body.min is not None and not body.clear and body.min > cap:
            raise ApiError("invalid_request", f"--min {body.min} is more workers than {name!r} may run at once ({cap})",
                           hint="raise max_gpus in @seq.policy (for a CPU policy also $SEQ_CPU_WORKERS) and "
                                f"redeploy, or keep at most {cap} warm", details={"field": "min", "max": cap})
        if body.clear:
            ops.scales.clear(name)
        elif body.min is None:
            raise ApiError("invalid_request", "give --min N (workers to keep warm) or --clear",
                           hint='e.g. `seq policy scale NAME --min 1 --during "Mon-Fri 08:00-18:00" --tz Europe/Berlin`')
        else:
            try:
                ops.scales.set(name, body.min, body.during, body.tz)
            except ValueError as exc:
                raise _invalid(exc, "see `seq policy scale --help` for the window form") from None
        return await asyncio.to_thread(ops.scale_view, name)

    @r.get("/v1/deployments/{name}/usage")
    async def get_usage(name: str, since: float = 0.0, key: KeyRecord = Depends(auth.require_key)) -> dict:
        require_scope(key, name)
        return await asyncio.to_thread(ops.usage_view, name, since)

    @r.get("/v1/gpus")
    async def gpus(key: KeyRecord = Depends(auth.require_key)) -> dict:
        return await asyncio.to_thread(lambda: ops.gpus_view(supervisor.running()))

    return r


def _account_routes(ops: OpsService, deployments: "DeploymentService", keys: KeyStore, supervisor: "Supervisor",
                    auth: Auth) -> APIRouter:
    r = APIRouter(tags=["operations"], dependencies=[Depends(auth.account_key)])

    @r.get("/v1/account/limits")
    async def get_limits(key: KeyRecord = Depends(auth.account_key)) -> dict:
        return await asyncio.to_thread(lambda: ops.limits_view(supervisor.running()))

    @r.post("/v1/account/limits")
    async def set_limits(body: LimitsUpdate, key: KeyRecord = Depends(auth.account_key)) -> dict:
        scope = "account"
        if body.key:
            rec = keys.find(body.key)
            if rec is None:
                raise ApiError("not_found", f"no key {body.key!r}", hint="`seq keys ls` lists key ids")
            scope = f"key:{rec.id}"
        names = ("max_workers", "max_cards", "worker_hours_per_day")
        bad = [c for c in body.clear if c not in (*names, "all")]
        if bad:
            raise ApiError("invalid_request", f"cannot clear {bad}: the limits are {', '.join(names)} (or all)")
        values = {n: getattr(body, n) for n in names if getattr(body, n) is not None}
        values.update({n: None for n in names if "all" in body.clear or n in body.clear})
        try:
            ops.limits.set(scope, **values)
        except ValueError as exc:
            raise _invalid(exc, "limits are counts (workers, cards) or hours, 0 or more") from None
        return await asyncio.to_thread(lambda: ops.limits_view(supervisor.running()))

    @r.get("/v1/alerts")
    async def list_alerts(key: KeyRecord = Depends(auth.account_key)) -> dict:
        hooks = ops.webhooks.all()
        return {"webhooks": [{**h.public(), "deliveries": ops.webhooks.deliveries(h.id, 5)} for h in hooks]}

    @r.post("/v1/alerts")
    async def add_alert(body: WebhookCreate, key: KeyRecord = Depends(auth.account_key)) -> dict:
        if body.deployment:
            deployments.require(body.deployment)
        try:
            hook = ops.webhooks.add(body.url, events=body.events, deployment=body.deployment,
                                   error_rate=body.error_rate, p95_ms=body.p95_ms, min_requests=body.min_requests)
        except ValueError as exc:
            raise _invalid(exc, "see `seq alerts add --help`") from None
        return {**hook.public(), "secret": hook.secret}

    @r.delete("/v1/alerts/{ref}")
    async def remove_alert(ref: str, key: KeyRecord = Depends(auth.account_key)) -> dict:
        if not ops.webhooks.remove(ref):
            raise ApiError("not_found", f"no webhook {ref!r}", hint="`seq alerts ls` lists them")
        return {"id": ref, "removed": True}

    @r.post("/v1/alerts/{ref}/test")
    async def test_alert(ref: str, key: KeyRecord = Depends(auth.account_key)) -> dict:
        hook = ops.webhooks.get(ref)
        if hook is None:
            raise ApiError("not_found", f"no webhook {ref!r}", hint="`seq alerts ls` lists them")
        return await ops.alerts.test_async(hook)      # its own threads: a hanging receiver blocks nothing else

    return r
