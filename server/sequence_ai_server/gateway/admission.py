"""Admission at the deadline: may one more robot join a worker without making the robots it
already serves late?

Each robot asks for a chunk at its *request rate* (requests/s, ``request_hz``): what its client
declared at connect (``"request_hz"`` in the connect body), else the policy's
``control_frequency_hz`` over the rows it plays per chunk (the session's ``replan_steps`` or
``open_loop_horizon`` param when the policy declares one, else ``DEFAULT_REPLAN_ROWS``). Its
*deadline* is one request period (1 / request_hz): the next chunk has to arrive before the
current one has played.

Each worker measures its *cost curve*, the median milliseconds of one inference call by batch
size, and reports it in its ``/ping`` as ``"cost": {"batch_ms": {"1": 41.2, ...}, "calls": N}``;
the health check hands every ping to :meth:`Admission.observe`. Once a worker has made
``MIN_CALLS`` calls, admission predicts, for the robots it would hold with the new one, the worst
round trip: every robot asks at once (as robots started together do), each of the worker's
copies takes its share of the requests in batches of at most ``max_batch_size`` (1 without
``@seq.batched``), one after the other. A robot is admitted when that worst round trip stays
within ``DEADLINE_SHARE`` of the shortest deadline among them, and within the worker's robot cap
(``@seq.concurrent(max_inputs=N)``, else its slots). A worker with no robot always takes one.
Robots are counted only for a policy that declares ``@seq.concurrent`` (as slots always were):
without it every robot is admitted, since a client that reconnects opens a new session without
closing its old one, and a lone robot would otherwise wait behind its own stale session.

Before a worker has measured anything (no ``cost`` in its ping, or fewer than MIN_CALLS calls),
or when a robot's rate cannot be known (the contract names no control rate), admission counts
robots against the cap alone: the slot counting of before. docs/guides/scaling.md ("Admission at
the deadline") says the same for users."""
from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.gateway.slots import slots_of

__all__ = ["CostCurve", "Load", "Admission", "request_hz", "robot_cap", "start_after", "max_batch",
           "DEADLINE_SHARE", "MIN_CALLS", "UNCOUNTED", "DEFAULT_REPLAN_ROWS", "MAX_REQUEST_HZ"]

DEADLINE_SHARE = 0.85      # the predicted worst round trip may use this share of the shortest deadline
MIN_CALLS = 3              # calls a worker measures before its cost curve is trusted
DEFAULT_REPLAN_ROWS = 8    # rows a robot plays per chunk when nothing says (pi0.5-DROID's replan_steps)
MAX_REQUEST_HZ = 1000.0    # the most requests/s one robot may declare
MIN_REQUEST_HZ = 0.01      # the least: one chunk per 100 s (below it the deadline is as good as none)
UNCOUNTED = 1_000_000      # the robot cap of a policy that declares no @seq.concurrent
ROOM_COUNTED = 64          # room() counts at most this many more robots per worker
_MAX_BATCH_KEY = 4096
_P99_SAMPLES = 512         # /act handler times kept per worker for its p99
_ROBOTS_KEPT = 1024        # per-robot p99s kept per worker from its /ping


@dataclass(frozen=True)
class CostCurve:
    """Median ms of one inference call by batch size, from a worker's own measured calls."""
    batch_ms: dict[int, float]
    calls: int

    @classmethod
    def from_ping(cls, cost: Any) -> Optional["CostCurve"]:
        """The curve in a /ping's ``cost`` value; None when absent or malformed (an entry whose
        batch size is not an integer in 1..4096 or whose time is not finite in (0, 1e6) ms is left out)."""
        if not isinstance(cost, dict) or not isinstance(cost.get("batch_ms"), dict):
            return None
        out: dict[int, float] = {}
        for k, v in cost["batch_ms"].items():
            try:
                b, ms = int(k), float(v)
            except (TypeError, ValueError):
                continue
            if 1 <= b <= _MAX_BATCH_KEY and math.isfinite(ms) and 0.0 < ms < 1e6:
                out[b] = ms
        calls = cost.get("calls")
        calls = int(calls) if isinstance(calls, (int, float)) and not isinstance(calls, bool) and calls >= 0 else 0
        return cls(out, calls) if out else None

    @property
    def measured(self) -> bool:
        return self.calls >= MIN_CALLS and bool(self.batch_ms)

    def ms(self, b: int) -> float:
        """Predicted ms of one call of batch size ``b`` (>= 1): measured, else interpolated
        between measured sizes, else extrapolated from the two largest (with one measured size
        ``s``: proportionally, ``ms(s) * b / s``, assuming no gain from batching)."""
        pts = sorted(self.batch_ms.items())
        if b in self.batch_ms:
            return self.batch_ms[b]
        if b < pts[0][0]:
            return pts[0][1]
        for (b0, m0), (b1, m1) in zip(pts, pts[1:]):
            if b0 < b < b1:
                return m0 + (m1 - m0) * (b - b0) / (b1 - b0)
        if len(pts) == 1:
            return pts[0][1] * b / pts[0][0]
        (b0, m0), (b1, m1) = pts[-2], pts[-1]
        return m1 + max(0.0, (m1 - m0) / (b1 - b0)) * (b - b1)


@dataclass(frozen=True)
class Load:
    """The prediction for one worker holding robots at ``rates`` (requests/s each)."""
    robots: int
    rate_hz: float           # the robots' summed requests/s
    worst_ms: float          # predicted worst round trip (all ask at once)
    deadline_ms: float       # the shortest robot deadline (1 / its request rate)
    utilisation: float       # predicted share of the worker's time spent in calls
    fits: bool

    def to_dict(self) -> dict:
        return {"robots": self.robots, "rate_hz": round(self.rate_hz, 3), "worst_ms": round(self.worst_ms, 1),
                "deadline_ms": round(self.deadline_ms, 1), "budget_ms": round(self.deadline_ms * DEADLINE_SHARE, 1),
                "utilisation": round(self.utilisation, 3), "fits": self.fits}


def predict(curve: CostCurve, rates: list[float], copies: int, batch: int) -> Load:
    """The worst round trip of a worker with ``copies`` model copies, batches of at most ``batch``
    and cost ``curve`` when robots at ``rates`` (requests/s, each > 0) all ask at once. A robot
    whose rate brings a second request within the deadline window counts for each."""
    if not rates:
        return Load(0, 0.0, 0.0, math.inf, 0.0, True)
    deadline_ms = min(1000.0 / r for r in rates)
    window_s = DEADLINE_SHARE * deadline_ms / 1000.0
    requests = sum(max(1, math.ceil(window_s * r - 1e-9)) for r in rates)
    per_copy = math.ceil(requests / max(1, copies))
    full, rest = divmod(per_copy, max(1, batch))
    worst = full * curve.ms(batch) + (curve.ms(rest) if rest else 0.0)
    rate = sum(rates)
    utilisation = (rate / max(1, copies)) * (worst / per_copy) / 1000.0
    fits = len(rates) == 1 or worst <= DEADLINE_SHARE * deadline_ms
    return Load(len(rates), rate, worst, deadline_ms, utilisation, fits)


def robot_cap(spec: Optional[dict]) -> int:
    """The most robots one worker takes: ``@seq.concurrent(max_inputs=N)``, else its slots;
    UNCOUNTED for a policy without ``@seq.concurrent`` (whose robots are not counted at all)."""
    conc = (spec or {}).get("concurrency") or {}
    if not conc:
        return UNCOUNTED
    return max(int(conc.get("max_inputs") or 0), slots_of(spec)) if conc.get("max_inputs") else slots_of(spec)


def start_after(spec: Optional[dict]) -> int:
    """Robots a worker holds before another starts beside it (``target_inputs``, else its slots;
    at most the cap)."""
    conc = (spec or {}).get("concurrency") or {}
    return min(int(conc.get("target_inputs") or slots_of(spec)), robot_cap(spec))


def max_batch(spec: Optional[dict]) -> int:
    """Requests one call takes: ``@seq.batched(max_batch_size=)``, else 1."""
    return int(((spec or {}).get("batching") or {}).get("max_batch_size") or 1)


def request_hz(spec: Optional[dict], params: Optional[dict], declared: Optional[float]) -> Optional[float]:
    """A robot's requests/s: ``declared`` (the connect body's ``request_hz``), else the contract's
    control_frequency_hz over the rows per chunk (the ``replan_steps`` / ``open_loop_horizon``
    param, else DEFAULT_REPLAN_ROWS); None when neither is known. Raises ApiError invalid_request
    for a declared rate that is not a finite number in [MIN_REQUEST_HZ, MAX_REQUEST_HZ]."""
    if declared is not None:
        # the range first: an int too large for a float (10**400) compares, math.isfinite raises
        if isinstance(declared, bool) or not isinstance(declared, (int, float)) \
                or not MIN_REQUEST_HZ <= declared <= MAX_REQUEST_HZ or not math.isfinite(declared):
            raise ApiError("invalid_request", f"request_hz {declared!r} is not a rate in [{MIN_REQUEST_HZ:g}, "
                           f"{MAX_REQUEST_HZ:g}] "
                           "requests per second", details={"field": "request_hz"},
                           hint="send the chunks per second this robot asks for, e.g. 1.875 (15 Hz, replanning "
                                "every 8 rows), or leave request_hz out")
        return float(declared)
    action = ((spec or {}).get("contract") or {}).get("action") or {}
    hz = action.get("control_frequency_hz")
    if not isinstance(hz, (int, float)) or isinstance(hz, bool) or not math.isfinite(hz) or hz <= 0:
        return None
    rows = DEFAULT_REPLAN_ROWS
    for name in ("replan_steps", "open_loop_horizon"):
        v = (params or {}).get(name)
        if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= sys.float_info.max:   # 10**400: no rate
            rows = v
            break
    return float(hz) / rows


class Admission:
    """What each worker measured (the cost curve and /act times its pings carry) and the
    admission decisions made from it. Thread-safe: the health check's ping threads write, the
    connects read. Workers are named by key (``name``, ``name#N``) and pid."""

    def __init__(self) -> None:
        self._seen: dict[str, dict] = {}
        self._lock = threading.Lock()

    def observe(self, key: str, pid: Optional[int], body: dict) -> None:
        """Note one /ping answer of worker ``key`` (process ``pid``): its ``cost`` curve and the
        /act handler times in its ``usage`` samples. A ping without ``cost`` changes no curve."""
        curve = CostCurve.from_ping(body.get("cost"))
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        with self._lock:
            seen = self._seen.get(key)
            if seen is None or seen["pid"] != pid:
                seen = self._seen[key] = {"pid": pid, "curve": None, "ms": []}
            if curve is not None:
                seen["curve"] = curve
            if curve is not None and isinstance(usage.get("requests"), int):
                answered = usage["requests"] - int(usage.get("errors") or 0)   # refused ones ran no call
                seen.setdefault("first", (answered, curve.calls))               # the synthetic check's calls before it
                seen["last"] = (answered, curve.calls)
            late = body.get("deadlines")
            if isinstance(late, dict) and all(isinstance(late.get(k), int) for k in ("requests", "late")):
                seen["deadlines"] = {"requests": late["requests"], "late": late["late"]}
            robots = body.get("robots")
            if isinstance(robots, dict):
                seen["robots"] = {str(k): float(v["p99_ms"]) for k, v in list(robots.items())[:_ROBOTS_KEPT]
                                  if isinstance(v, dict) and isinstance(v.get("p99_ms"), (int, float))
                                  and not isinstance(v.get("p99_ms"), bool) and math.isfinite(v["p99_ms"])}
            ms = [s[1] for s in usage.get("samples") or [] if isinstance(s, list) and len(s) >= 2
                  and isinstance(s[1], (int, float)) and not (len(s) > 2 and s[2])]
            seen["ms"] = (seen["ms"] + ms)[-_P99_SAMPLES:]

    def curve(self, key: str, pid: Optional[int]) -> Optional[CostCurve]:
        """Worker ``key``'s measured curve (None before MIN_CALLS calls or for another pid)."""
        with self._lock:
            seen = self._seen.get(key)
            curve = seen["curve"] if seen is not None and seen["pid"] == pid else None
        return curve if curve is not None and curve.measured else None

    def fleet_curve(self, workers: list[tuple[str, Optional[int]]]) -> Optional[CostCurve]:
        """The measured curve of the worker of ``workers`` (``[(key, pid)]``, one deployment's
        workers of one version) that made the most calls; None when none has measured yet."""
        curves = [c for c in (self.curve(k, p) for k, p in workers) if c is not None]
        return max(curves, key=lambda c: c.calls) if curves else None

    def load(self, key: str, pid: Optional[int], spec: Optional[dict], rates: list[Optional[float]],
             like: Optional[CostCurve] = None) -> Optional[Load]:
        """The prediction for worker ``key`` holding robots at ``rates``; None when it has not
        measured its cost (and no ``like``, a sibling's curve, stands in: :meth:`fleet_curve`)
        or a rate is unknown (slot counting applies)."""
        curve = self.curve(key, pid) or like
        if curve is None or any(r is None for r in rates):
            return None
        return predict(curve, [float(r) for r in rates if r is not None], slots_of(spec), max_batch(spec))

    def admits(self, key: str, pid: Optional[int], spec: Optional[dict], rates: list[Optional[float]],
               rate: Optional[float], like: Optional[CostCurve] = None) -> tuple[bool, Optional[Load]]:
        """May worker ``key``, holding robots at ``rates``, take one more at ``rate``? ->
        ``(yes, the prediction with it)``; the prediction is None under slot counting. ``like``:
        the curve to predict with while ``key`` has measured none of its own (a sibling's)."""
        if len(rates) >= robot_cap(spec):
            return False, None
        with_it = self.load(key, pid, spec, [*rates, rate], like)
        return (with_it is None or with_it.fits), with_it

    def room(self, key: str, pid: Optional[int], spec: Optional[dict], rates: list[Optional[float]],
             rate: Optional[float], like: Optional[CostCurve] = None) -> int:
        """How many more robots at ``rate`` worker ``key`` admits now (``like`` as for :meth:`admits`)."""
        n, more = 0, list(rates)
        while n < ROOM_COUNTED and self.admits(key, pid, spec, more, rate, like)[0]:
            more.append(rate)
            n += 1
        return n

    def view(self, key: str, pid: Optional[int], spec: Optional[dict], rates: list[Optional[float]],
             robots: Optional[list[str]] = None) -> dict:
        """The status view of worker ``key``: ``cost`` (its curve, or None), ``mean_batch``
        (answered /acts per inference call between its first ping with a curve and its last), ``act_p99_ms`` (p99 of its recent /act handler
        times, all its robots), ``deadlines`` (``{"requests", "late"}``: the /acts that carried a
        deadline and those answered past it, when its /ping says), ``robot_p99_ms`` (``{session id:
        ms}``: each robot's p99 queued-to-answered time on the worker, as its /ping reports it, for
        the sessions in ``robots``, or all it reported when None; None before it reported any), and ``admission`` (robots, summed rate, predicted worst round
        trip, deadline and utilisation; ``measured`` False under slot counting)."""
        with self._lock:
            seen = dict(self._seen.get(key) or {})
        mine = seen.get("pid") == pid
        curve: Optional[CostCurve] = seen.get("curve") if mine else None
        ms = sorted(seen.get("ms") or []) if mine else []
        known = [r for r in rates if r is not None]
        load = self.load(key, pid, spec, rates)
        adm = load.to_dict() if load is not None and rates else {"robots": len(rates), "rate_hz": round(sum(known), 3)}
        adm.update(measured=load is not None, cap=robot_cap(spec))   # no robot: nothing to predict
        return {"cost": {"batch_ms": {str(b): m for b, m in sorted(curve.batch_ms.items())}, "calls": curve.calls}
                if curve is not None else None,
                "mean_batch": _mean_batch(seen) if mine else None,
                "act_p99_ms": round(ms[min(len(ms) - 1, math.ceil(0.99 * len(ms)) - 1)], 1) if ms else None,
                "deadlines": seen.get("deadlines") if mine else None,
                "robot_p99_ms": _robot_p99(seen, robots) if mine else None,
                "admission": adm}

    def forget(self, keep: set[str]) -> None:
        """Drop what was seen of the workers not in ``keep`` (stopped ones)."""
        with self._lock:
            for k in [k for k in self._seen if k not in keep]:
                del self._seen[k]


def _robot_p99(seen: dict, robots: Optional[list[str]]) -> Optional[dict[str, float]]:
    """The reported per-robot p99s (ms) of ``robots`` (all when None); None before any report."""
    got = seen.get("robots")
    if got is None:
        return None
    return dict(got) if robots is None else {k: got[k] for k in robots if k in got}


def _mean_batch(seen: dict) -> Optional[float]:
    """Answered /acts per call between the first and the last ping that carried both."""
    if "first" not in seen or "last" not in seen:
        return None
    (r0, c0), (r1, c1) = seen["first"], seen["last"]
    return round((r1 - r0) / (c1 - c0), 2) if c1 > c0 and r1 >= r0 else None
