"""Traffic between a deployment's versions: a canary split and per-key pins, and
:class:`TrafficService`, which picks the version of each new session (``pick_version``), shows
and changes a deployment's traffic (``view``, ``update``; it starts the side workers the named
versions need through the supervisor).

Where it sits: ``POST /v1/connect`` asks :class:`TrafficService` which version a new session
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
import logging
import re
import threading
from typing import TYPE_CHECKING, Any, Optional

from sequence_ai_server.common.errors import ApiError

if TYPE_CHECKING:
    from sequence_ai_server.gateway.keys import KeyRecord, KeyStore
    from sequence_ai_server.gateway.schemas import TrafficUpdate
    from sequence_ai_server.gateway.store import DeploymentRow, Store, VersionRow
    from sequence_ai_server.gateway.supervisor import Supervisor

__all__ = ["TrafficError", "TrafficRouter", "TrafficService", "parse_version", "parse_split", "load_policy",
           "dump_policy"]

log = logging.getLogger("sequence_ai_server.gateway")

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


class TrafficService:
    """The traffic of every deployment: version picks, the traffic view and its updates.

    ``keys``: the key store (pins name keys); ``max_gpus``: the most workers that may run at once
    (None: no cap). Its counts are the :class:`TrafficRouter`'s; the policy itself lives in the
    deployment row."""

    def __init__(self, store: "Store", supervisor: "Supervisor", keys: "KeyStore",
                 max_gpus: Optional[int] = None) -> None:
        self.store, self.supervisor, self.keys, self.max_gpus = store, supervisor, keys, max_gpus
        self.router = TrafficRouter()

    def usable_versions(self, name: str, row: "DeploymentRow") -> dict[int, "VersionRow"]:
        """The versions a split or pin may name: the serving one and kept ones that served."""
        kept = {v.version: v for v in self.store.versions(name)}
        return {n: v for n, v in kept.items() if n == row.version or v.status in ("ready", "retired")}

    def pick_version(self, row: "DeploymentRow", key: Optional["KeyRecord"]) -> tuple[int, Optional[dict[int, float]]]:
        """The version a new session of ``row`` starts on, and the split it was drawn from (None
        for a pin or no split). A pin or split naming a version no longer kept is ignored."""
        pol = row.traffic
        if not pol["split"] and not pol["pins"]:
            return row.version, None
        usable = self.usable_versions(row.name, row)
        if key is not None and pol["pins"].get(key.id) in usable:
            return pol["pins"][key.id], None
        split = {v: w for v, w in pol["split"].items() if v in usable}
        if split and sum(split.values()) > 0:
            return self.router.pick(row.name, split), split
        return row.version, None

    def admitted(self, name: str, split: dict[int, float], version: int) -> None:
        """Count one session admitted on ``version`` under ``split``."""
        self.router.admitted(name, split, version)

    def forget(self, name: str) -> None:
        """Restart ``name``'s counts (its split changed, it was removed, or a new version took over)."""
        self.router.forget(name)

    def view(self, name: str, held: dict[str, int]) -> dict:
        """``{"name", "serving", "split": [{"version", "share_pct", "sessions", "worker"}], "pins": [{"key",
        "key_name", "version", "worker"}], "side_workers": [{"version", "pid", "worker", "sessions"}]}``;
        ``split`` is empty when every new session goes to the serving version; ``side_workers`` are the
        running workers of versions other than the serving one (``held``: open sessions per worker key).
        ``sessions`` counts sessions admitted per version since the split was set; ``worker`` is
        serving | ready | loading | failed | not running. Raises ApiError not_found."""
        from sequence_ai_server.gateway.worker_record import Role, worker_key
        row = self.store.require(name)
        pol = row.traffic
        total = sum(pol["split"].values()) or 1.0
        counts = self.router.counts(name, pol["split"]) if pol["split"] else {}
        sides = self.supervisor.of(Role.SIDE, name)

        def worker(v: int) -> str:
            if v == row.version:
                return "serving"
            sk = worker_key(Role.SIDE, name, v)
            w = sides.get(sk)
            if w is not None:
                return "ready" if w.port else "loading"
            return "failed" if sk in self.supervisor.side_failed else "not running"

        split = [{"version": v, "share_pct": round(share / total * 100, 3), "sessions": counts.get(v, 0),
                  "worker": worker(v)} for v, share in sorted(pol["split"].items(), reverse=True)]
        names = {r.id: r.name for r in self.keys.list()}
        pins = [{"key": k, "key_name": names.get(k), "version": v, "worker": worker(v)}
                for k, v in sorted(pol["pins"].items())]
        side = [{"version": w.version, "pid": w.proc.pid, "worker": worker(w.version), "sessions": held.get(k, 0)}
                for k, w in sorted(sides.items())]
        return {"name": name, "serving": row.version, "split": split, "pins": pins, "side_workers": side}

    def _policy_after(self, name: str, row: "DeploymentRow", upd: "TrafficUpdate") -> dict:
        """``row``'s traffic policy with ``upd`` applied (nothing stored). Raises ApiError."""
        pol = row.traffic
        usable = self.usable_versions(name, row)
        hint_versions = f"`seq policy versions {name}` lists them; serving or kept: " + \
            ", ".join(f"v{v}" for v in sorted(usable, reverse=True))
        try:
            if upd.clear:
                return {"split": {}, "pins": {}}
            if upd.split is not None:
                split = parse_split(upd.split)
                bad = [v for v in split if v not in usable]
                if bad:
                    raise ApiError("not_found", f"{name} has no serving or kept version {', '.join(f'v{v}' for v in bad)}",
                                   hint=hint_versions)
                pol["split"] = split
            elif upd.pin is not None:
                rec = self.keys.find(upd.pin)
                if rec is None or rec.revoked_at is not None:
                    raise ApiError("not_found", f"no live API key {upd.pin!r}", hint="`seq keys ls` lists keys")
                if rec.deployment != name:
                    raise ApiError("invalid_request", f"key {upd.pin!r} is not bound to {name}; only a robot key "
                                   "of this deployment can be pinned",
                                   hint=f"seq keys create --name arm-7 --deployment {name}")
                if upd.version is None:
                    raise ApiError("invalid_request", "a pin needs a version", hint=f"seq policy traffic {name} --pin {upd.pin} v2")
                v = parse_version(upd.version)
                if v not in usable:
                    raise ApiError("not_found", f"{name} has no serving or kept version v{v}", hint=hint_versions)
                pol["pins"][rec.id] = v
            else:
                rec = self.keys.find(upd.unpin or "")
                if rec is None or rec.id not in pol["pins"]:
                    raise ApiError("not_found", f"key {upd.unpin!r} is not pinned on {name}",
                                   hint=f"`seq policy traffic {name}` lists the pins")
                pol["pins"].pop(rec.id)
        except TrafficError as exc:
            raise ApiError("invalid_request", str(exc), hint=f"e.g. seq policy traffic {name} v5=10 v4=90") from None
        return pol

    def update(self, name: str, upd: "TrafficUpdate", held: dict[str, int]) -> dict:
        """Apply one of: a split, a pin, an unpin, or clear (split and pins); returns the new
        :meth:`view`. Versions must be the serving one or kept ones that served; a pinned key must be
        bound to ``name``. Workers for the named versions start at once while the deployment runs.
        Raises ApiError invalid_request (bad split, several actions, unbound key), not_found
        (version, key) or gpu_limit_reached (those workers would pass $SEQ_MAX_GPUS; nothing is changed)."""
        from sequence_ai_server.gateway.worker_record import Role, worker_key
        chosen = [upd.split is not None, upd.pin is not None, upd.unpin is not None, upd.clear]
        if sum(chosen) != 1:
            raise ApiError("invalid_request", "give exactly one of a split, --pin KEY vN, --unpin KEY or --clear",
                           hint=f"e.g. seq policy traffic {name} v5=10 v4=90")
        row = self.store.require(name)
        pol = self._policy_after(name, row, upd)
        # the named versions' workers start now, so the first sessions sent there find them loading
        # or ready; each is one more card, so SEQ_MAX_GPUS is checked before anything is stored
        start: list[int] = []
        if row.status in ("ready", "starting"):
            wanted = {v for v, share in pol["split"].items() if share > 0} | set(pol["pins"].values())
            start = [v for v in sorted(wanted - {row.version})
                     if not self.supervisor.busy(worker_key(Role.SIDE, name, v))]
        if start and self.max_gpus is not None:
            running = sum(1 for r in self.supervisor.running() if r.role not in ("build", "retiring"))
            if running + len(start) > self.max_gpus:
                raise ApiError("gpu_limit_reached",
                               f"{', '.join(f'v{v}' for v in start)} of {name} would need {len(start)} more worker(s); "
                               f"{running} run and this machine allows {self.max_gpus} (SEQ_MAX_GPUS); traffic unchanged",
                               details={"max_gpus": self.max_gpus},
                               hint="stop a deployment (`seq policy stop NAME`) or raise SEQ_MAX_GPUS")
        self.store.update(name, traffic=pol)
        self.forget(name)
        for v in start:
            self.supervisor.start_side(name, v)
        log.info("traffic of %s is now split=%s pins=%s", name, pol["split"], pol["pins"])
        return self.view(name, held)
