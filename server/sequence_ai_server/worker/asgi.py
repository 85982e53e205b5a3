"""The worker's ASGI app: its three transports over one act pipeline.

``create_app`` builds the app the worker process serves (``main.py``): the worker's state and
credentials (``leases.DirectAuth``), the capture writer, the /act meter and the websockets'
connection budget go into one ``act.ActPipeline``, which HTTP (``app.py``), the /act channel
(``channel.py``) and the openpi endpoint (``openpi.py``) are then mounted over. This module only
composes them; none of the three imports another.
"""
from __future__ import annotations

import logging
from typing import Optional

from fastapi import FastAPI

from sequence_ai_core.protocol import MAX_BODY_BYTES

from sequence_ai_server.worker.act import ActPipeline, WorkerState
from sequence_ai_server.worker.app import add_http
from sequence_ai_server.worker.channel import add_act_channel
from sequence_ai_server.worker.connections import MAX_CONNECTIONS, ConnectionBudget
from sequence_ai_server.worker.meter import ActMeter

try:                                             # openpi's websocket protocol at / (needs msgpack)
    from sequence_ai_server.worker.openpi import add_openpi_endpoint
except ImportError:
    add_openpi_endpoint = None

__all__ = ["WorkerState", "create_app"]

log = logging.getLogger("sequence_ai_server.worker")


def create_app(state: WorkerState, secret: str, *, max_body_bytes: int = MAX_BODY_BYTES,
               max_connections: Optional[int] = None) -> FastAPI:
    """The worker's FastAPI app: /ping, /info, /act, /episode/end, /control/revoke, /openapi.json
    (``app.add_http``), the /act channel at /act/ws (``channel.py``) and openpi's websocket at /
    (``openpi.py``; only with msgpack installed), all over one ``act.ActPipeline``.

    The bearer token is the worker secret or a lease token signed with it (``leases.DirectAuth``:
    rotation via ``$SEQ_WORKER_SECRET_FILE``, idle tracking via ``$SEQ_WORKER_ACTIVITY_FILE``).
    ``max_body_bytes``: the largest /act body read (default ``protocol.MAX_BODY_BYTES``, 32 MiB).
    ``max_connections``: the open websockets (/act channels and openpi together) it holds at once
    (default ``connections.MAX_CONNECTIONS``, 64; ``connections.ConnectionBudget``).
    With ``$SEQ_CAPTURE_DIR`` set, kept episodes are written by ``capture.CaptureWriter``'s own
    thread; /act only hands it references."""
    from sequence_ai_server.common.leases import DirectAuth
    from sequence_ai_server.worker.capture import CaptureWriter
    app = FastAPI(title=f"sequence-ai worker: {state.name or 'policy'}", docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  description="Direct robot -> worker endpoints. Errors share one shape (ErrorBody). "
                              "/act and /episode/end take the direct secret (a lease token from the gateway's "
                              "POST /v1/connect, or the worker secret); /control/revoke only the worker secret; "
                              "/ping and /info are open. Credentials are checked before the body is read.")
    direct_auth = DirectAuth.from_env(secret)
    app.state.direct_auth = direct_auth       # main() starts the revocation poll on it (leases.py)
    app.state.capture = CaptureWriter.from_env()
    app.state.act_meter = ActMeter()          # /act counters the gateway collects through /ping (meter.py)
    app.state.connections = ConnectionBudget(max_connections or MAX_CONNECTIONS)   # the channel's and openpi's
    act = app.state.act = ActPipeline(state, direct_auth, max_body_bytes=max_body_bytes, capture=app.state.capture,
                                      meter=app.state.act_meter, budget=app.state.connections)
    add_http(app, act)
    add_act_channel(app, act)
    if add_openpi_endpoint is None:
        log.info("msgpack is not installed: no openpi-compatible endpoint")
    else:
        add_openpi_endpoint(app, act)
    return app
