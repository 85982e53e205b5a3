"""``GET /v1/models``: the catalogue (deployments, then the ``seq init`` templates; catalogue.py). No key."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Optional

from fastapi import APIRouter

from sequence_ai_server.gateway import catalogue
from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.schemas import ModelEntry, ModelList
from sequence_ai_server.gateway.routes import Auth

if TYPE_CHECKING:
    from sequence_ai_server.gateway.deployments import DeploymentService


def router(deployments: "DeploymentService", auth: Auth) -> APIRouter:
    """The catalogue route over ``deployments`` (``auth`` unused: the catalogue needs no key)."""
    models = APIRouter(prefix="/v1/models", tags=["models"])

    @models.get("", response_model=ModelList)
    async def list_models(kind: Optional[str] = None, endpoint: Optional[str] = None) -> ModelList:
        """Deployments (kind=model), then the `seq init` templates (kind=template); ?kind= and
        ?endpoint=act filter."""
        if kind is not None and kind not in catalogue.KINDS:
            raise ApiError("invalid_request", f"unknown kind {kind!r}", hint=f"kind is one of {', '.join(catalogue.KINDS)}")
        if endpoint is not None and endpoint not in catalogue.ENDPOINTS:
            raise ApiError("invalid_request", f"no endpoint {endpoint!r} on a self-hosted gateway",
                           hint=f"endpoint is one of {', '.join(catalogue.ENDPOINTS)} (chat and decide are hosted-only)")
        rows = []
        for row in deployments.store.all():
            d = deployments.describe(row)
            rows.append(catalogue.model_row(d.name, d.version, d.status, d.contract, d.params))
        if kind != "model":
            rows += await asyncio.to_thread(catalogue.template_rows)
        return ModelList(models=[ModelEntry(**r) for r in catalogue.filter_rows(rows, kind, endpoint)])

    return models
