"""The ``/v1/adapters`` routes (account key; adapters.py keeps the files): register a version,
list adapters, list one adapter's versions, read one version with its source."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from sequence_ai_server.gateway.adapters import AdapterRegister, AdapterStore
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.routes import Auth

__all__ = ["router"]


def router(data_dir: Path, auth: Auth) -> APIRouter:
    """The ``/v1/adapters`` routes over ``<data_dir>/adapters`` (all need an account key)."""
    store = AdapterStore(Path(data_dir) / "adapters")
    adapter_router = APIRouter(prefix="/v1/adapters", tags=["adapters"], dependencies=[Depends(auth.account_key)])

    @adapter_router.post("")
    async def register_adapter(request: Request) -> dict:
        # the key is checked (the router's dependency) before the body is read
        try:
            body = AdapterRegister.model_validate_json(await request.body())
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {}
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise ApiError("invalid_request", f"bad adapter registration: {where or 'body'}: {first.get('msg', exc)}",
                           hint='send {"name", "class_name", "filename", "source", "spec"} (seq deploy adapter.py does)') from None
        return await asyncio.to_thread(store.register, body)

    @adapter_router.get("")
    async def list_adapters() -> dict:
        return {"adapters": await asyncio.to_thread(store.list)}

    @adapter_router.get("/{name}")
    async def adapter_versions(name: str) -> dict:
        return {"name": name, "versions": await asyncio.to_thread(store.versions, name)}

    @adapter_router.get("/{name}/versions/{version}")
    async def adapter_version(name: str, version: str) -> dict:
        if version == "latest":
            v = None
        else:
            try:
                v = int(version.lstrip("v"))
            except ValueError:
                raise ApiError("invalid_request", f"{version!r} is not a version",
                               hint="give a number (2 or v2) or latest") from None
        return await asyncio.to_thread(store.get, name, v)

    return adapter_router
