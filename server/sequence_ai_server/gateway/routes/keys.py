"""``/v1/keys``: create, list and revoke API keys (account key). Revoking a key ends its robots'
sessions at once (their lease tokens stop working at the workers)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import KeyRecord, KeyStore
from sequence_ai_server.gateway.schemas import KeyCreate
from sequence_ai_server.gateway.routes import Auth

if TYPE_CHECKING:
    from sequence_ai_server.gateway.deployments import DeploymentService
    from sequence_ai_server.gateway.sessions import SessionService


def router(store: KeyStore, deployments: "DeploymentService", sessions: "SessionService", auth: Auth) -> APIRouter:
    """The key routes over the key ``store`` (a revoked key's sessions end in ``sessions``)."""
    account_key = auth.account_key
    keys = APIRouter(prefix="/v1/keys", tags=["keys"])

    @keys.post("")
    async def create_key(body: KeyCreate, key: KeyRecord = Depends(account_key)) -> dict:
        if body.deployment is not None:
            deployments.require(body.deployment)
        if body.name and store.find(body.name) is not None:
            raise ApiError("invalid_request", f"a key named {body.name!r} exists already",
                           hint="pick another --name, or revoke the old key first")
        try:
            rec, plaintext = store.create(body.name, body.deployment)
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc), hint="e.g. --name arm-7") from None
        return {**rec.to_dict(), "key": plaintext}

    @keys.get("")
    async def list_keys(key: KeyRecord = Depends(account_key)) -> dict:
        return {"keys": [r.to_dict() for r in store.list()]}

    @keys.delete("/{ref}")
    async def revoke_key(ref: str, key: KeyRecord = Depends(account_key)) -> dict:
        rec = store.find(ref)
        if rec is None:
            raise ApiError("not_found", f"no API key {ref!r}", hint="`seq keys ls` lists key ids and names")
        revoked = store.revoke(rec.id).to_dict()
        await asyncio.to_thread(sessions.end_key_sessions, rec.id)   # its robots' leases stop working now
        return revoked

    return keys
