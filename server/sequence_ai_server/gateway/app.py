"""The gateway's FastAPI app: a :class:`~sequence_ai_server.gateway.controller.Gateway`, its middleware
(credentials first, body limit, request log; middleware.py), one router per resource (routes/,
each given the services it calls), and one background loop that runs the gateway's control tick
every 100 ms (``Gateway.tick``: supervision, lease expiry, health rounds, ops each second)."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from pathlib import Path
from typing import Any, Optional

import httpx
from fastapi import FastAPI
from fastapi.responses import Response as RawResponse

from sequence_ai_server.common.body_limit import CloseUnread
from sequence_ai_server.common.known_routes import KnownRoutesFirst
from sequence_ai_server.common.plain_http import client_options
from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.common.errors import install_error_handlers
from sequence_ai_server.gateway.controller import MAX_BODY_BYTES, Gateway
from sequence_ai_server.gateway.metrics import CONTENT_TYPE_LATEST, GatewayMetrics
from sequence_ai_server.gateway.middleware import BodyLimit, CredentialsFirst, install_request_log
from sequence_ai_server.gateway.routes import (account, act_proxy, adapters, auth_for, capture, deployments, keys, models, operations,
                     secrets, sessions, volumes)

__all__ = ["create_app"]

log = logging.getLogger("sequence_ai_server.gateway")


TICK_S = 0.1     # the control tick's period (s)


TICK_JOIN_S = 10.0   # how long shutdown waits for the tick under way (s) before it stops the workers anyway


def _control_loop(gw: Gateway, stop: threading.Event) -> None:
    """``gw.tick(now)`` now and then TICK_S after each tick ends, until ``stop`` is set; a failed
    tick is logged, not fatal. It runs on a thread of its own (a tick may block: a process
    exiting, the store), which shutdown joins before ``gw.close()``: a cancelled asyncio task
    left the tick it had handed to a pool thread running beside the close."""
    while True:
        try:
            gw.tick(time.time())
        except Exception:
            log.exception("control tick failed")
        if stop.wait(TICK_S):
            return


def _lifespan(gw: Gateway, proxy: httpx.AsyncClient) -> Any:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        stop = threading.Event()
        control = threading.Thread(target=_control_loop, args=(gw, stop), name="control tick", daemon=True)
        control.start()
        try:
            yield
        finally:
            stop.set()
            await asyncio.to_thread(control.join, TICK_JOIN_S)   # the tick under way ends before the workers stop
            if control.is_alive():
                log.warning("the control tick has not ended after %.0f s; stopping the workers anyway", TICK_JOIN_S)
            log.info("stopping all workers")
            await proxy.aclose()
            await asyncio.to_thread(gw.close)
    return lifespan


def create_app(data_dir: Optional[Path] = None, config: Optional[ServerConfig] = None) -> FastAPI:
    """The gateway's app over a new Gateway (``config``: default ``ServerConfig.from_env(data_dir)``;
    ``data_dir`` overrides its data dir). Raises DataDirInUse as Gateway does."""
    gw = Gateway(data_dir, config)
    dep, ses = gw.deployments, gw.sessions
    proxy = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0), **client_options())   # plain http to workers
    app = FastAPI(title="sequence-ai gateway", lifespan=_lifespan(gw, proxy))
    app.state.gateway = gw
    metrics = GatewayMetrics(gw.store, ses, gw.supervisor)   # Prometheus /metrics (metrics.py)
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
    # before that: a path no route serves is 404 (a method it does not take 405) from the request line
    app.add_middleware(KnownRoutesFirst, router=app.router)
    # outside it: an answer sent before the body was read (its 401, a 413, a 404) closes the
    # connection, so a refused body is never read to keep the connection alive
    app.add_middleware(CloseUnread)
    for r in (models.router(dep, auth), deployments.router(dep, gw.traffic, ses, auth), *sessions.router(ses, auth),
              keys.router(gw.keys, dep, ses, auth), account.router(gw.account, auth), volumes.router(gw.volumes, auth),
              *operations.router(gw.ops, dep, gw.keys, gw.supervisor, auth),
              *secrets.router(gw.secrets, ses.revoked, auth), act_proxy.router(ses, auth, proxy),
              capture.router(dep, auth), adapters.router(gw.data_dir, auth)):
        app.include_router(r)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict:
        return {"status": "ok"}

    return app
