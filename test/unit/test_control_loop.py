"""The gateway's control tick (gateway/app.py): on its own thread, and joined at shutdown before
``gw.close()`` stops the workers -- a tick under way is never cut by the close, and a tick that
never ends holds the shutdown up only for ``TICK_JOIN_S``. A stand-in gateway records the order."""
from __future__ import annotations

import asyncio
import threading
import time

from sequence_ai_server.gateway import app as gateway_app


class _Gateway:
    def __init__(self, tick_s: float):
        self.tick_s = tick_s
        self.events: list = []
        self.ticking = threading.Event()

    def tick(self, now: float) -> None:
        self.events.append(("tick start", threading.current_thread().name))
        self.ticking.set()
        time.sleep(self.tick_s)
        self.events.append(("tick end", None))

    def close(self) -> None:
        self.events.append(("close", None))


class _Proxy:
    async def aclose(self) -> None:
        pass


async def _serve_then_stop(gw: _Gateway) -> None:
    async with gateway_app._lifespan(gw, _Proxy())(None):
        await asyncio.to_thread(gw.ticking.wait, 10.0)      # shutdown comes while a tick runs


def test_shutdown_waits_for_the_tick_under_way_before_closing():
    gw = _Gateway(tick_s=0.3)
    asyncio.run(_serve_then_stop(gw))
    assert gw.events[0] == ("tick start", "control tick")
    assert [e for e, _ in gw.events][-2:] == ["tick end", "close"], gw.events


def test_a_tick_that_never_ends_holds_shutdown_only_for_the_join_limit(monkeypatch):
    monkeypatch.setattr(gateway_app, "TICK_JOIN_S", 0.2)
    gw = _Gateway(tick_s=3.0)
    t0 = time.monotonic()
    asyncio.run(_serve_then_stop(gw))
    assert time.monotonic() - t0 < 2.5
    assert [e for e, _ in gw.events] == ["tick start", "close"], gw.events
