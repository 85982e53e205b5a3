"""The gateway's health check: every ``health_interval_s`` it pings each serving worker; one whose
``/ping`` says ``degraded`` (an inference ran past timeouts.request) is replaced by a fresh worker
of the same version (``Gateway.replace_jammed``). A worker that does not answer is left to the
supervisor (it notices the exit)."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

__all__ = ["health_loop"]

log = logging.getLogger("sequence_ai_server.gateway")


async def health_loop(gw: Any) -> None:
    """Ping every serving worker of ``gw`` each ``gw.health_interval_s`` s, forever (cancel to stop)."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as http:
        while True:
            await asyncio.sleep(gw.health_interval_s)
            try:
                for name, url in await asyncio.to_thread(gw.health_targets):
                    try:
                        r = await http.get(f"{url}/ping")
                        body = r.json() if r.status_code == 200 else {}
                    except (httpx.HTTPError, ValueError):
                        continue          # a dead worker is the supervisor's business
                    if body.get("status") == "degraded":
                        await asyncio.to_thread(gw.replace_jammed, name, body, int(url.rsplit(":", 1)[1]))
            except Exception:
                log.exception("health check failed")
