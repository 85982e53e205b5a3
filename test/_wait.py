"""eventually(): the one way a test waits for something that happens on its own time.

    port = eventually(lambda: read_port(log), 30, what="the server's port")

The predicate is polled until it returns something truthy, and that value is returned. When the
timeout has passed it is asked once more (a check that came true just then still counts), then the
test fails with an AssertionError naming what was awaited and the last value seen. An exception the
predicate raises ends the wait at once: assert inside it to give up early, e.g. when the process
being waited on has exited.

Waiting is for things that happen. A test that proves something does *not* happen within a time
(nothing starts, nothing is published) sleeps for that time on purpose and asserts after it; it is
not a use for this helper.
"""
from __future__ import annotations

import inspect
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


def _describe(predicate: Callable) -> str:
    name = getattr(predicate, "__qualname__", None) or repr(predicate)
    if "<lambda>" not in name:
        return name
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return name


def eventually(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.02, *,
               what: Optional[str] = None, detail: Optional[Callable[[], str]] = None) -> T:
    """Poll ``predicate()`` every ``interval`` s until it returns something truthy; return that value.

    Fails (AssertionError) once ``timeout`` s have passed and one more call is still falsy; the
    message names ``what`` (default: the predicate's name or source line), the last value, and
    ``detail()`` when given (say, the tail of a log).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left < 0:
            break
        time.sleep(min(interval, left))
    message = f"timed out after {timeout} s waiting for {what or _describe(predicate)} (last value: {value!r})"
    if detail is not None:
        message += "\n" + str(detail())
    raise AssertionError(message)
