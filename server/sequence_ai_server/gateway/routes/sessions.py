"""``POST /v1/connect`` (admit a robot session, sign its lease) and ``/v1/sessions`` (renew a
lease, close a session or a queued robot's place in line). Any live key; a robot key reaches
only its own deployment and the sessions it opened."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request

from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.gateway.schemas import ConnectRequest, ConnectResponse
from sequence_ai_server.gateway.routes import Auth

if TYPE_CHECKING:
    from sequence_ai_server.gateway.sessions import SessionService


def router(service: "SessionService", auth: Auth) -> list[APIRouter]:
    """``[connect, sessions]`` routers over the session ``service``."""
    require_key = auth.require_key
    connect = APIRouter(prefix="/v1/connect", tags=["connect"], dependencies=[Depends(require_key)])

    @connect.post("", response_model=ConnectResponse)
    async def connect_(request: Request, body: ConnectRequest, key: KeyRecord = Depends(require_key)) -> ConnectResponse:
        request.state.deployment = body.model     # the request's log line names it (logs.py)
        return await asyncio.to_thread(service.connect, body, key)

    sessions = APIRouter(prefix="/v1/sessions", tags=["sessions"])

    @sessions.post("/{session_id}/renew", response_model=ConnectResponse)
    async def renew(session_id: str, key: KeyRecord = Depends(require_key)) -> ConnectResponse:
        return await asyncio.to_thread(service.renew, session_id, key)

    @sessions.delete("/{session_id}")
    async def close_session(session_id: str, key: KeyRecord = Depends(require_key)) -> dict:
        return await asyncio.to_thread(service.close_session, session_id, key)

    return [connect, sessions]
