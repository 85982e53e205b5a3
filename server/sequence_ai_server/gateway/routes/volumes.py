"""``/v1/volumes``: list, upload (begin, write, complete) and remove weight volumes (account key;
volumes.py keeps them)."""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from fastapi import APIRouter, Depends, Request

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.gateway.schemas import VolumeUpload
from sequence_ai_server.common.volumes import VolumeError, VolumeStore
from sequence_ai_server.gateway.routes import Auth


def _volume_call(fn, *args):
    """``fn(*args)`` with a VolumeError turned into the ApiError of its code."""
    try:
        return fn(*args)
    except VolumeError as exc:
        raise ApiError(exc.code, str(exc), hint=exc.hint or "seq volume put NAME DIR") from None


def router(store: VolumeStore, auth: Auth) -> APIRouter:
    """The volume routes over the volume ``store``."""
    account_key = auth.account_key
    volumes = APIRouter(prefix="/v1/volumes", tags=["volumes"])

    @volumes.get("")
    async def list_volumes(limit: int = 50, cursor: Optional[str] = None, key: KeyRecord = Depends(account_key)) -> dict:
        if not 1 <= limit <= 500:
            raise ApiError("invalid_request", f"limit must be 1..500, got {limit}", hint="--limit 50")
        return await asyncio.to_thread(_volume_call, store.list, limit, cursor)

    @volumes.post("/{name}/uploads")
    async def begin_upload(name: str, body: VolumeUpload, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(_volume_call, store.begin, name, body.files)

    @volumes.put("/{name}/uploads/{version}")
    async def write_upload(name: str, version: int, path: str, offset: int, request: Request,
                           key: KeyRecord = Depends(account_key)) -> dict:
        data = await request.body()
        return await asyncio.to_thread(_volume_call, store.write, name, version, path, offset, data)

    @volumes.post("/{name}/uploads/{version}/complete")
    async def complete_upload(name: str, version: int, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(_volume_call, store.complete, name, version)

    @volumes.delete("/{name}")
    async def remove_volume(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        return await asyncio.to_thread(_volume_call, store.remove, name)

    return volumes
