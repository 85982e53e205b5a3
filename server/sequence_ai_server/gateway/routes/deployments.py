"""``/v1/deployments``: deploy, list, status, emergency stop and start, remove, versions and
rollback, secret rotation, doctor, logs, traffic and default params of one deployment."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Optional

from fastapi import APIRouter, Depends

from sequence_ai_server.gateway.keys import KeyRecord, require_scope
from sequence_ai_server.gateway.schemas import Deployment, DeploymentList, DeployRequest, ParamsUpdate, RollbackRequest, TrafficUpdate
from sequence_ai_server.gateway.routes import Auth

if TYPE_CHECKING:
    from sequence_ai_server.gateway.deployments import DeploymentService
    from sequence_ai_server.gateway.sessions import SessionService
    from sequence_ai_server.gateway.traffic import TrafficService


def router(deployments: "DeploymentService", traffic: "TrafficService", sessions: "SessionService",
           auth: Auth) -> APIRouter:
    """The deployment routes over ``deployments`` (and its ``traffic``, whose view counts the open
    ``sessions``); every route needs a key (``auth``)."""
    r = APIRouter(prefix="/v1/deployments", tags=["deployments"], dependencies=[Depends(auth.require_key)])
    _lifecycle(r, deployments, auth)
    _operations(r, deployments, traffic, sessions, auth)
    return r


def _lifecycle(r: APIRouter, dep: "DeploymentService", auth: Auth) -> None:
    """Deploy, list, status, stop, start, remove, versions and rollback."""
    require_key, account_key = auth.require_key, auth.account_key

    @r.get("", response_model=DeploymentList)
    async def list_deployments(key: KeyRecord = Depends(require_key)) -> DeploymentList:
        rows = [row for row in dep.store.all() if key.deployment in (None, row.name)]
        return DeploymentList(deployments=[dep.describe(row) for row in rows])

    @r.post("", response_model=Deployment)
    async def create_deployment(body: DeployRequest, key: KeyRecord = Depends(account_key)) -> Deployment:
        await asyncio.to_thread(dep.check_build_quota, key, body.name)   # limits (quotas.py)
        return await asyncio.to_thread(dep.deploy, body)

    @r.get("/{name}", response_model=Deployment)
    async def get_deployment(name: str, key: KeyRecord = Depends(require_key)) -> Deployment:
        require_scope(key, name)
        return await asyncio.to_thread(dep.status, name)

    @r.delete("/{name}", response_model=Deployment)
    async def stop_deployment(name: str, key: KeyRecord = Depends(account_key)) -> Deployment:
        return await asyncio.to_thread(dep.stop, name)

    @r.get("/{name}/versions")
    async def list_versions(name: str, key: KeyRecord = Depends(require_key)) -> dict:
        require_scope(key, name)
        return await asyncio.to_thread(dep.versions, name)

    @r.post("/{name}/rollback", response_model=Deployment)
    async def rollback(name: str, body: RollbackRequest, key: KeyRecord = Depends(account_key)) -> Deployment:
        return await asyncio.to_thread(dep.rollback, name, body.to)

    @r.post("/{name}/start", response_model=Deployment)
    async def start_deployment(name: str, key: KeyRecord = Depends(account_key)) -> Deployment:
        return await asyncio.to_thread(dep.start, name)

    @r.post("/{name}/remove")
    async def remove_deployment(name: str, force: bool = False, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(dep.remove, name, force)


def _operations(r: APIRouter, dep: "DeploymentService", traffic: "TrafficService", sessions: "SessionService",
                auth: Auth) -> None:
    """Secret rotation, doctor, logs, traffic and default params."""
    require_key, account_key = auth.require_key, auth.account_key

    @r.post("/{name}/rotate-secret")
    async def rotate_secret(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(dep.rotate_secret, name)

    @r.get("/{name}/doctor")
    async def doctor(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(dep.doctor, name)

    @r.get("/{name}/logs")
    async def get_logs(name: str, request_id: Optional[str] = None, lines: int = 200, since: Optional[float] = None,
                       key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(dep.logs, name, request_id, lines, since)

    @r.get("/{name}/build-log")
    async def get_build_log(name: str, offset: int = 0, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(dep.build_log, name, offset)

    @r.get("/{name}/traffic")
    async def get_traffic(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(lambda: traffic.view(name, sessions.held()))

    @r.post("/{name}/traffic")
    async def set_traffic(name: str, body: TrafficUpdate, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(lambda: traffic.update(name, body, sessions.held()))

    @r.get("/{name}/params")
    async def get_params(name: str, key: KeyRecord = Depends(require_key)) -> dict:
        require_scope(key, name)
        return await asyncio.to_thread(dep.params, name)

    @r.post("/{name}/params")
    async def set_params(name: str, body: ParamsUpdate, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(dep.set_params, name, body)
