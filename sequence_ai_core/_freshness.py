"""Camera freshness: is each stream still delivering new frames?

A camera that freezes (the driver keeps handing back its last frame) or stalls (its stamps stop
advancing) would let the policy plan from a picture of the past while the arm moves. The loop
checks every observation before it is sent (``_loop._start_fetch``); a stream that has not
advanced for longer than its maximum age stops new requests, the run holds, and it ends with
``StaleCamera`` naming the stream (``RunOutcome.reason == "stale_camera"``).

A stream advances when its frame bytes differ from the previous observation's AND, when it
carries ``timestamp_ms``, that stamp is later. Its age is the time (monotonic s) since the
observation at which it last advanced. Stamps are compared with each other only, never with
this machine's clock (a camera's clock may be its own, or simulated).
"""
from __future__ import annotations

import difflib
import hashlib
import time
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

from ._errors import InvalidRequest, StaleCamera

__all__ = ["CameraWatch"]


def _digest(frame: Mapping[str, Any]) -> bytes:
    data = frame.get("data")
    if isinstance(data, str):
        data = data.encode("ascii", "replace")
    return hashlib.blake2b(bytes(data or b""), digest_size=16).digest()


class CameraWatch:
    """Per-stream freshness over one run.

    Args:
        max_frame_age_s: the most a stream may go without a new frame (s): one number for
            every view, or ``{view: seconds}`` (views not named are not watched). None: off.

    Raises:
        ValueError: an age that is not a positive finite number.
    """

    def __init__(self, max_frame_age_s: Union[None, float, Mapping[str, float]]) -> None:
        ages = max_frame_age_s if isinstance(max_frame_age_s, Mapping) else None
        for view, age in (ages or {"*": max_frame_age_s}).items():
            if age is not None and (isinstance(age, bool) or not isinstance(age, (int, float))
                                    or not 0 < float(age) < float("inf")):
                raise ValueError(f"max_frame_age_s for {view!r} must be a positive number of seconds, not {age!r}")
        self._default = None if ages is not None or max_frame_age_s is None else float(max_frame_age_s)
        self._ages: Dict[str, float] = {str(k): float(v) for k, v in (ages or {}).items()}
        self._last: Dict[str, Tuple[bytes, Optional[float], float]] = {}

    @property
    def enabled(self) -> bool:
        """True when at least one stream is watched."""
        return self._default is not None or bool(self._ages)

    def check_views(self, declared: Optional[Iterable[str]]) -> None:
        """Refuse a ``{view: seconds}`` naming a view the contract does not declare (it would never
        be watched). ``declared``: the contract's camera views; None (no contract): nothing checked.

        Raises:
            InvalidRequest: ``code="unknown_view"``, naming the view(s) and listing the declared ones.
        """
        if declared is None:
            return
        views = list(declared)
        unknown = sorted(v for v in self._ages if v not in views)
        if unknown:
            near = [v for v in views if unknown[0] in v or v in unknown[0]]
            near = near or difflib.get_close_matches(unknown[0], views, n=1) or views[:1]
            raise InvalidRequest(
                f"max_frame_age_s names camera view(s) {unknown} that the contract does not declare "
                f"(its views: {views})", code="unknown_view",
                details={"unknown": unknown, "views": views},
                hint=f"key max_frame_age_s by the contract's view names, e.g. {{{near[0]!r}: 0.5}}" if views
                else "this policy declares no camera views: pass max_frame_age_s=None")

    def _age_for(self, view: str) -> Optional[float]:
        return self._ages.get(view, self._default)

    def check(self, wire: Mapping[str, Any], now: Optional[float] = None) -> None:
        """Record the frames of one wire observation; raise if a watched stream is stale.

        Raises:
            StaleCamera: a watched view has not advanced for more than its maximum age
                (``.stream`` names it, ``.age_s`` says for how long), or a watched view is
                missing from the observation.
        """
        now = time.monotonic() if now is None else now
        seen = set()
        for frame in wire.get("images") or []:
            view = str(frame.get("view"))
            limit = self._age_for(view)
            if limit is None:
                continue
            seen.add(view)
            digest, stamp = _digest(frame), frame.get("timestamp_ms")
            previous = self._last.get(view)
            if previous is None:
                self._last[view] = (digest, stamp, now)
                continue
            old_digest, old_stamp, advanced_at = previous
            stamp_moved = stamp is None or old_stamp is None or float(stamp) > float(old_stamp)
            if digest != old_digest and stamp_moved:
                self._last[view] = (digest, stamp, now)
                continue
            age = now - advanced_at
            if age > limit:
                why = "sends the same frame" if digest == old_digest else "stamps stopped advancing"
                raise StaleCamera(
                    f"camera stream {view!r} {why}: no new frame for {age:.2f} s (max_frame_age_s {limit:g} s)",
                    stream=view, age_s=age)
        for view in self._ages:
            if view not in seen and view in self._last:
                raise StaleCamera(f"camera stream {view!r} is missing from the observation", stream=view,
                                  age_s=now - self._last[view][2])
