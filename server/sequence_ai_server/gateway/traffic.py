"""Traffic between a deployment's versions: a canary split and per-key pins.

Where it sits: ``POST /v1/connect`` asks :class:`TrafficRouter` which version a new session
starts on; the session keeps that version for all of its lease renewals (the gateway records it
on the session). The gateway stores the policy as JSON in the deployment row
(``traffic_json``)::

    {"split": {"5": 10.0, "4": 90.0},     # version -> share (any positive weights; normalised)
     "pins":  {"key_7": 5}}               # API key id -> version (a robot key bound to the deployment)

Assignment is deterministic, not a coin toss: each admitted session goes to the version that is
furthest below its share so far (a smooth weighted round robin), so 200 sessions over a 30/70
split land on exactly 60/140 and a 10 % canary sees one session in ten from the first ten on.
Only admitted sessions count: a connect answered 503 (the canary still loading) does not use up
its version's turn. The counts restart whenever the split changes.

    seq policy traffic NAME                       show the split and the pins
    seq policy traffic NAME v5=10 v4=90           set a split (versions serving or kept)
    seq policy traffic NAME --pin arm-7 v5        pin a robot key to a version
    seq policy traffic NAME --unpin arm-7         let it follow the split again
    seq policy traffic NAME --clear               everything to the serving version again
"""
from __future__ import annotations

import json
import re
import threading
from typing import Any, Optional

__all__ = ["TrafficError", "TrafficRouter", "parse_version", "parse_split", "load_policy", "dump_policy"]

_VERSION = re.compile(r"^v?(\d+)$")


class TrafficError(ValueError):
    """A split or pin that cannot be applied; the message names the bad part and the fix."""


def parse_version(text: Any) -> int:
    """``"v5"``, ``"5"`` or ``5`` -> ``5``. Raises TrafficError for anything else."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    m = _VERSION.match(str(text).strip())
    if not m or int(m.group(1)) < 1:
        raise TrafficError(f"{text!r} is not a version; write it as v5 (or 5)")
    return int(m.group(1))


def parse_split(items: dict[str, Any]) -> dict[int, float]:
    """``{"v5": 10, "v4": 90}`` -> ``{5: 10.0, 4: 90.0}``.

    Shares are weights: any non-negative numbers with a positive, finite sum (10/90, 1/9 and
    0.1/0.9 are the same split). A version may appear once. Raises TrafficError naming the bad entry."""
    if not items:
        raise TrafficError("an empty split; give at least one version=share, e.g. v5=10 v4=90")
    out: dict[int, float] = {}
    for k, share in items.items():
        v = parse_version(k)
        if v in out:
            raise TrafficError(f"v{v} appears twice in the split")
        try:
            f = float(share)
        except (TypeError, ValueError):
            raise TrafficError(f"the share of v{v} ({share!r}) is not a number") from None
        if not f >= 0 or f == float("inf"):
            raise TrafficError(f"the share of v{v} ({share!r}) must be a finite number >= 0")
        out[v] = f
    total = sum(out.values())
    if total <= 0:
        raise TrafficError("the shares add up to 0; give at least one version a positive share")
    if total == float("inf"):        # each share finite, their sum is not: every share would read as 0 %
        raise TrafficError("the shares add up to more than a float holds; give percentages, e.g. v5=10 v4=90")
    return out


def load_policy(text: Optional[str]) -> dict:
    """The stored JSON -> ``{"split": {int: float}, "pins": {key_id: int}}`` (empty when unset)."""
    raw = json.loads(text) if text else {}
    return {"split": {int(k): float(v) for k, v in (raw.get("split") or {}).items()},
            "pins": {str(k): int(v) for k, v in (raw.get("pins") or {}).items()}}


def dump_policy(policy: dict) -> Optional[str]:
    """The inverse of :func:`load_policy`; None when neither a split nor a pin is set."""
    if not policy.get("split") and not policy.get("pins"):
        return None
    return json.dumps({"split": {str(k): v for k, v in (policy.get("split") or {}).items()},
                       "pins": dict(policy.get("pins") or {})})


class TrafficRouter:
    """Picks the version of each new session of a deployment under its split (thread-safe).

    ``pick`` proposes a version; ``admitted`` counts it once the session is really open. Pinned
    sessions and sessions on a deployment without a split are not counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, tuple[tuple, dict[int, int]]] = {}   # name -> (split signature, counts)

    @staticmethod
    def _sig(split: dict[int, float]) -> tuple:
        return tuple(sorted(split.items()))

    def _state(self, name: str, split: dict[int, float]) -> dict[int, int]:
        sig = self._sig(split)
        held = self._counts.get(name)
        if held is None or held[0] != sig:          # a new split starts counting afresh
            held = (sig, {v: 0 for v in split})
            self._counts[name] = held
        return held[1]

    def pick(self, name: str, split: dict[int, float]) -> int:
        """The version furthest below its share among ``split`` (ties: the larger share, then the
        newer version). ``split`` must be non-empty with a positive sum."""
        total_w = sum(split.values())
        with self._lock:
            counts = self._state(name, split)
            n = sum(counts.values()) + 1
            return max(split, key=lambda v: (split[v] / total_w * n - counts[v], split[v], v))

    def admitted(self, name: str, split: dict[int, float], version: int) -> None:
        """Count one admitted session on ``version`` under ``split``."""
        with self._lock:
            counts = self._state(name, split)
            if version in counts:
                counts[version] += 1

    def counts(self, name: str, split: dict[int, float]) -> dict[int, int]:
        """Sessions admitted per version since ``split`` was set (a copy)."""
        with self._lock:
            return dict(self._state(name, split))

    def forget(self, name: str) -> None:
        """Drop the counts of ``name`` (it was removed or its split cleared)."""
        with self._lock:
            self._counts.pop(name, None)
