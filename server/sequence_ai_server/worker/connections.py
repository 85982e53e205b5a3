"""The worker's persistent websocket connections: the /act channel (``channel.py``) and the
openpi endpoint (``openpi.py``) share one budget of open connections and one way to refuse an
upgrade.

Open connections: :class:`ConnectionBudget` (``--max-connections`` /
``$SEQ_WORKER_MAX_CONNECTIONS``, default ``MAX_CONNECTIONS`` = 64). Past it a new upgrade is
refused before it is accepted, with HTTP 503 ``too_many_connections`` (retryable, Retry-After)
in the common error body, after its credentials were checked; the open connections are never
dropped. A connection frees its place when its handler ends: a close, or the TCP connection
going away without a closing handshake (a killed client).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from starlette.websockets import WebSocket

from sequence_ai_server.common.errors import ApiError

__all__ = ["ConnectionBudget", "MAX_CONNECTIONS", "connection_budget", "refuse_upgrade"]

log = logging.getLogger("sequence_ai_server.worker")

# Persistent connections (/act channels and openpi websockets together) one worker holds open at
# once: a worker serves a few robots, each with one; the rest of the budget is for reconnects
# overlapping a not-yet-noticed drop. Each costs a file descriptor, a task and its buffers.
MAX_CONNECTIONS = 64
_REFUSAL_LOG_S = 10.0       # at most one warning per this many seconds about refused connections


async def refuse_upgrade(websocket: WebSocket, exc: ApiError) -> None:
    """Refuse the upgrade with ``exc`` as an HTTP answer (the ASGI denial-response extension:
    the common error body, ``X-Request-ID`` and ``Retry-After`` headers), else close before
    accepting (the server then answers 403)."""
    if "websocket.http.response" in (websocket.scope.get("extensions") or {}):
        await websocket.send_denial_response(exc.response())
    else:
        await websocket.close(code=4000 + exc.status, reason=exc.detail[:120])


class ConnectionBudget:
    """The places for persistent websocket connections of one worker, shared by the /act
    channel and the openpi endpoint. ``limit``: the most open at once (>= 1; from
    ``--max-connections`` / ``$SEQ_WORKER_MAX_CONNECTIONS``, default ``MAX_CONNECTIONS``).
    Used from the event loop only: :meth:`take` and :meth:`release` never await, so a check and
    its reservation cannot interleave with another upgrade."""

    def __init__(self, limit: int = MAX_CONNECTIONS) -> None:
        if int(limit) < 1:
            raise ValueError(f"the connection limit is {limit}; give a whole number >= 1 (default {MAX_CONNECTIONS})")
        self.limit = int(limit)
        self.open = 0
        self.refused = 0
        self._logged_at = -_REFUSAL_LOG_S

    def take(self, path: str) -> None:
        """Reserve a place for a connection to ``path`` (for the message). Raises ApiError
        ``too_many_connections`` (503, retryable, ``retry_after_s`` 1) when all are taken."""
        if self.open < self.limit:
            self.open += 1
            return
        self.refused += 1
        now = time.monotonic()
        if now - self._logged_at >= _REFUSAL_LOG_S:
            self._logged_at = now
            log.warning("refused a websocket to %s: %d of %d connections open (%d refused so far); "
                        "raise --max-connections / $SEQ_WORKER_MAX_CONNECTIONS if these are real robots",
                        path, self.open, self.limit, self.refused)
        raise ApiError("too_many_connections", f"this worker already holds {self.open} open websocket connections, "
                       f"its limit ({self.limit}, the /act channel and the openpi endpoint together)",
                       retry_after_s=1.0, details={"open": self.open, "limit": self.limit},
                       hint="close connections you no longer use (one per robot); POST /act still answers, or "
                            "the operator raises the worker's --max-connections / $SEQ_WORKER_MAX_CONNECTIONS")

    def release(self) -> None:
        """Free the place of a connection that ended (or was never accepted)."""
        self.open = max(0, self.open - 1)


def connection_budget(app: Any) -> ConnectionBudget:
    """The worker ``app``'s shared :class:`ConnectionBudget` (``app.state.connections``; made
    with ``MAX_CONNECTIONS`` places when the app has none yet)."""
    budget = getattr(app.state, "connections", None)
    if budget is None:
        budget = app.state.connections = ConnectionBudget()
    return budget
