"""``GET /v1/account``: usage and configured limits of this local account (any key; a robot key
sees its own deployment only)."""
from __future__ import annotations

from typing import Callable

from fastapi import APIRouter, Depends

from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.gateway.routes import Auth


def router(account_of: Callable[[KeyRecord], dict], auth: Auth) -> APIRouter:
    """The account route: ``account_of(key)`` is the answer (``Gateway.account``)."""
    account_router = APIRouter(prefix="/v1/account", tags=["account"])

    @account_router.get("")
    async def account(key: KeyRecord = Depends(auth.require_key)) -> dict:
        return account_of(key)

    return account_router
