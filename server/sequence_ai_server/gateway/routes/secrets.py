"""``/v1/secrets`` (set, list, remove encrypted secrets; account key) and the two internal routes
a worker calls with its direct secret: ``/v1/internal/worker-secrets`` (its declared secrets)
and ``/v1/internal/revocations`` (sessions ended early)."""
from __future__ import annotations

from typing import Any

from sequence_ai_server.common.leases import RevocationList

from fastapi import APIRouter, Depends

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.gateway.schemas import SecretSet, WorkerSecretsRequest
from sequence_ai_server.gateway.routes import Auth
from sequence_ai_server.gateway.secrets import SecretStore


def router(store: SecretStore, revoked: RevocationList, auth: Auth) -> list[APIRouter]:
    """``[secrets, internal]`` routers over the secret ``store`` and the ``revoked`` sessions list."""
    account_key = auth.account_key
    secrets_router = APIRouter(prefix="/v1/secrets", tags=["secrets"])

    @secrets_router.put("/{name}")
    async def set_secret(name: str, body: SecretSet, key: KeyRecord = Depends(account_key)) -> dict:
        try:
            return store.set(name, body.env)
        except ValueError as exc:
            raise ApiError("invalid_request", str(exc), hint="seq secret set NAME --env VAR [--env VAR ...]") from None

    @secrets_router.get("")
    async def list_secrets(key: KeyRecord = Depends(account_key)) -> dict:
        return {"secrets": store.list()}

    @secrets_router.delete("/{name}")
    async def remove_secret(name: str, key: KeyRecord = Depends(account_key)) -> dict:
        if not store.remove(name):
            raise ApiError("not_found", f"no secret named {name!r}", hint="`seq secret ls` lists them")
        return {"name": name, "removed": True}

    internal = APIRouter(tags=["internal"])

    @internal.post("/v1/internal/worker-secrets", include_in_schema=False, dependencies=[Depends(auth.worker_secret)])
    async def worker_secrets(body: WorkerSecretsRequest) -> dict:
        """A worker's declared secrets; the bearer must be the secret of a worker this gateway runs."""
        try:
            return {"env": store.environment(body.names)}
        except KeyError as exc:
            raise ApiError("not_found", f"the policy declares secret {exc.args[0]!r}, which is not set",
                           hint=f"seq secret set {exc.args[0]} --env VAR") from None

    @internal.get("/v1/internal/revocations", include_in_schema=False, dependencies=[Depends(auth.worker_secret)])
    async def revocations() -> dict:
        """Sessions ended early, polled by workers (leases.RevocationPoller); worker secret only."""
        return {"sessions": revoked.snapshot()}

    return [secrets_router, internal]
