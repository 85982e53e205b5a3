"""Usage metering, the worker's half (the gateway's is ops/usage.py: per hour and card type, for
``seq policy usage NAME --since``, ``seq account``, ``sequence_ai.account()``).

- :class:`ActMeter`, in each worker: a pure ASGI layer counting HTTP ``/act`` requests (and
  :meth:`ActMeter.count`, which the /act channel ``/act/ws`` and the openpi endpoint ``/`` call
  for each request they answer, so every /act is counted alike), the ones
  answered with an error (any status >= 400 except 401, which is a routine reconnect after a
  secret rotation), request and response body bytes, and the handler time of each (ms); a
  request whose client left before its body arrived never ran and is not counted. The
  worker's ``/ping?usage_since=N`` returns the counters and the samples after sequence number N.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any, Optional

from starlette.requests import ClientDisconnect

__all__ = ["ActMeter", "MeterLayer"]

_SAMPLES = 2048          # samples a worker keeps for the gateway to collect (about 4 s at 500 Hz)


class MeterLayer:
    """Pure ASGI middleware counting into ``meter`` (an :class:`ActMeter`):
    ``app.add_middleware(MeterLayer, meter=m)``."""

    def __init__(self, app: Any, meter: "ActMeter") -> None:
        self.app, self.meter = app, meter

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.meter.around(self.app, scope, receive, send)


class ActMeter:
    """Counts ``/act`` traffic of one worker (through :class:`MeterLayer`). ``snapshot(since)``
    -> ``{"requests", "errors", "bytes_in", "bytes_out", "seq", "samples": [[seq, ms, error 0|1], ...]}``."""

    def __init__(self, path: str = "/act") -> None:
        self.path = path
        self.requests = self.errors = self.bytes_in = self.bytes_out = 0
        self.seq = 0
        self.samples: collections.deque = collections.deque(maxlen=_SAMPLES)
        self._lock = threading.Lock()

    async def around(self, app: Any, scope: dict, receive: Any, send: Any) -> None:
        """Run ``app`` on one request, counting it when it is an /act."""
        if scope["type"] != "http" or scope.get("path") != self.path:
            await app(scope, receive, send)
            return
        t0 = time.perf_counter()
        size_in = size_out = 0
        status = 0
        answered = False
        watch: Optional[asyncio.Task] = None

        async def gone() -> bool:
            # Once the body is read, the server's next message is the disconnect: before the
            # answer went out it means the client left (the server drops the answer unsent).
            return (await receive())["type"] == "http.disconnect" and not answered

        async def counted_receive() -> dict:
            nonlocal size_in, watch
            message = await receive()
            if message["type"] == "http.request":
                size_in += len(message.get("body", b""))
                if not message.get("more_body") and watch is None:
                    watch = asyncio.ensure_future(gone())
            return message

        async def counted_send(message: dict) -> None:
            nonlocal size_out, status, answered
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                answered = answered or not message.get("more_body")
                size_out += len(message.get("body", b""))
            await send(message)

        ran = True
        try:
            await app(scope, counted_receive, counted_send)
        except ClientDisconnect:
            ran = watch is not None or bool(status)    # False: the client left before its body arrived
            raise
        finally:
            if watch is not None:
                if watch.done() and not watch.cancelled() and watch.exception() is None and watch.result():
                    status, size_out = 0, 0          # nothing was delivered
                watch.cancel()
            if ran:                                  # one whose body never came never ran: not counted
                self.count((time.perf_counter() - t0) * 1000.0, status, size_in, size_out)

    def count(self, ms: float, status: int, size_in: int, size_out: int) -> None:
        """Count one answered /act: its handler time ``ms`` (ms), HTTP ``status`` (0: no answer
        was sent; an error like any status >= 400 except 401), request and answer body sizes (bytes)."""
        error = status >= 400 and status != 401 or status == 0
        with self._lock:
            self.requests += 1
            self.errors += int(error)
            self.bytes_in += size_in
            self.bytes_out += size_out
            self.seq += 1
            self.samples.append((self.seq, round(ms, 3), int(error)))

    def snapshot(self, since: int = -1) -> dict:
        """The counters and the samples with a sequence number above ``since``."""
        with self._lock:
            return {"requests": self.requests, "errors": self.errors, "bytes_in": self.bytes_in,
                    "bytes_out": self.bytes_out, "seq": self.seq,
                    "samples": [list(s) for s in self.samples if s[0] > since]}
