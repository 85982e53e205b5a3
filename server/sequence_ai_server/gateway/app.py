"""The gateway's FastAPI app: a :class:`~sequence_ai_server.gateway.controller.Gateway`, its middleware
(credentials first, body limit, request log; middleware.py), one router per resource
(routes/), and the background loops (supervision every 100 ms, health; health.py, operations
each second: usage, alerts; operations.py)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Optional

import httpx
from fastapi import FastAPI
from fastapi.responses import Response as RawResponse

from sequence_ai_server.common.body_limit import CloseUnread
from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.common.errors import install_error_handlers
from sequence_ai_server.gateway.health import health_loop
from sequence_ai_server.gateway.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from sequence_ai_server.gateway.middleware import BodyLimit, CredentialsFirst, install_request_log
from sequence_ai_server.gateway.routes import (account, act_proxy, adapters, auth_for, capture, deployments, keys, models, operations,
                     secrets, sessions, volumes)

__all__ = ["create_app"]

log = logging.getLogger("sequence_ai_server.gateway")


async def _supervise(gw: Any) -> None:
    """``gw.poll()`` every 100 ms, forever (cancel to stop); a failed poll is logged, not fatal."""
    while True:
        try:
            await asyncio.to_thread(gw.poll)
        except Exception:
            log.exception("supervisor poll failed")
        await asyncio.sleep(0.1)


async def _operations(gw: Any) -> None:
    """``gw.ops_tick()`` every second (usage, alerts; operations.py), forever; failures are logged."""
    while True:
        try:
            await asyncio.to_thread(gw.ops_tick)
        except Exception:
            log.exception("operations tick failed")
        await asyncio.sleep(1.0)


def _lifespan(gw: Any, proxy: httpx.AsyncClient) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        tasks = [asyncio.create_task(_supervise(gw)), asyncio.create_task(health_loop(gw)),
                 asyncio.create_task(_operations(gw))]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            log.info("stopping all workers")
            await proxy.aclose()
            await asyncio.to_thread(gw.close)
    return lifespan


def create_app(data_dir: Optional[Path] = None, config: Optional[ServerConfig] = None) -> FastAPI:
    """The gateway's app over a new Gateway (``config``: default ``ServerConfig.from_env(data_dir)``;
    ``data_dir`` overrides its data dir). Raises DataDirInUse as Gateway does."""
    from sequence_ai_server.gateway.controller import MAX_BODY_BYTES, Gateway
    gw = Gateway(data_dir, config)
    proxy = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
    app = FastAPI(title="sequence-ai gateway", lifespan=_lifespan(gw, proxy))
    app.state.gateway = gw
    metrics = GatewayMetrics(gw)   # Prometheus /metrics (metrics.py)
    install_request_log(app, metrics)

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Any:
        body = await asyncio.to_thread(metrics.render)
        return RawResponse(body, media_type=CONTENT_TYPE_LATEST)

    install_error_handlers(app)
    from sequence_ai_server.common.json_guard import JsonStringGuard   # NUL/lone surrogate in a JSON string -> 400, inside BodyLimit
    app.add_middleware(JsonStringGuard, max_bytes=gw.config.max_body_bytes or MAX_BODY_BYTES)
    app.add_middleware(BodyLimit, max_bytes=gw.config.max_body_bytes or MAX_BODY_BYTES)
    auth = auth_for(gw)
    # outermost: credentials before any body is read (scopes read off each route's dependencies)
    app.add_middleware(CredentialsFirst, gateway=gw, fastapi_app=app, markers=auth.markers())
    # outside it: an answer sent before the body was read (its 401, a 413, a 404) closes the
    # connection, so a refused body is never read to keep the connection alive
    app.add_middleware(CloseUnread)
    for r in (models.router(gw, auth), deployments.router(gw, auth), *sessions.router(gw, auth),
              keys.router(gw, auth), account.router(gw, auth), volumes.router(gw, auth), *operations.router(gw, auth),
              *secrets.router(gw, auth), act_proxy.router(gw, auth, proxy),
              capture.router(gw, auth),
              adapters.router(gw, auth)):
        app.include_router(r)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict:
        return {"status": "ok"}

    return app
