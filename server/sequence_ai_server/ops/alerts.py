"""Alerts: signed webhook deliveries (``seq alerts ls / add / rm / test``).

Events: ``build_failed`` (a version failed to load: the first one of a deployment or one built
beside the serving one), ``worker_crashed`` (a serving worker exited), ``error_rate`` and
``p95_latency`` (the last hour's ``/act`` error share or 95th-percentile handler time of a
deployment crossed the webhook's threshold, once at least ``min_requests`` were seen; fired once
per crossing, again only after it fell back below), ``quota_reached`` (a connect or build was
refused by a limit, quotas.py; at most once a minute per limit), and ``test``.

Each delivery is ``POST <url>`` with a JSON body ``{"id", "event", "deployment", "at", "details"}``
and the headers ``X-Seq-Event``, ``X-Seq-Delivery``, ``X-Seq-Timestamp`` (unix s) and
``X-Seq-Signature: sha256=<hex>``: HMAC-SHA256 with the webhook's secret (printed once, by
``seq alerts add``) over ``"<timestamp>." + body``. A receiver checks it with
:func:`verify_signature`, which also refuses a timestamp more than 300 s off (a replayed
delivery). A delivery that is not answered 2xx is retried with backoff (0.5, 1, 2, 4 s: five
attempts); the outcome of each is kept (the last 200) and shown by ``seq alerts ls``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional
from urllib.parse import urlparse

import httpx

from sequence_ai_server.common.state_db import StateDB

__all__ = ["EVENTS", "Webhook", "WebhookStore", "sign", "verify_signature", "deliver", "Dispatcher",
           "TOLERANCE_S", "BACKOFF_S"]

log = logging.getLogger("sequence_ai_server.gateway")

EVENTS = ("build_failed", "worker_crashed", "error_rate", "p95_latency", "quota_reached")
TOLERANCE_S = 300.0
BACKOFF_S = (0.5, 1.0, 2.0, 4.0)
_KEEP_DELIVERIES = 200
# threads that run `seq alerts test` deliveries (more at once wait their turn)
TEST_THREADS = 4


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 with ``secret`` over ``timestamp + "." + body``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(secret: str, timestamp: Optional[str], body: bytes, signature: Optional[str], *,
                     now: Optional[float] = None, tolerance_s: float = TOLERANCE_S) -> bool:
    """Whether a delivery is authentic and fresh: ``signature`` (the ``X-Seq-Signature`` header)
    is :func:`sign` of ``timestamp`` (``X-Seq-Timestamp``) and ``body`` with ``secret``, compared in
    constant time, and the timestamp is within ``tolerance_s`` (s) of ``now`` (default: the clock)."""
    if not timestamp or not signature:
        return False
    try:
        ts = float(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


@dataclass
class Webhook:
    """One webhook: ``events`` it receives (all of EVENTS by default), optional ``deployment``
    (None: every one), thresholds ``error_rate`` (0..1) and ``p95_ms`` (ms) for the two rate
    alerts (None: not sent), ``min_requests`` before a rate is judged."""
    id: str
    url: str
    secret: str
    events: list = field(default_factory=lambda: list(EVENTS))
    deployment: Optional[str] = None
    error_rate: Optional[float] = None
    p95_ms: Optional[float] = None
    min_requests: int = 20
    created_at: float = 0.0

    def public(self) -> dict:
        """The webhook without its secret."""
        d = asdict(self)
        d.pop("secret")
        return d

    def wants(self, event: str, deployment: Optional[str]) -> bool:
        """Whether ``event`` of ``deployment`` goes to this webhook (``test`` always does)."""
        if event == "test":
            return True
        return event in self.events and (self.deployment is None or deployment in (None, self.deployment))


def check_webhook(url: str, events: Optional[list], error_rate: Optional[float], p95_ms: Optional[float],
                  min_requests: int) -> None:
    """Raise ValueError naming the bad argument of a new webhook."""
    u = urlparse(url or "")
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"--url {url!r} is not an http(s) URL; give e.g. https://hooks.example.com/seq")
    bad = [e for e in events or [] if e not in EVENTS]
    if bad:
        raise ValueError(f"unknown event(s) {bad}; the events are {', '.join(EVENTS)}")
    if error_rate is not None and not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"--error-rate {error_rate} is not a share between 0 and 1 (0.05 is 5 %)")
    if p95_ms is not None and p95_ms < 0:
        raise ValueError(f"--p95-ms {p95_ms} is negative")
    if min_requests < 1:
        raise ValueError(f"--min-requests {min_requests} must be 1 or more")


class WebhookStore:
    """The ``webhooks`` and ``deliveries`` tables of state.db (through the gateway's Store, a StateDB)."""

    def __init__(self, state: StateDB):
        self._sql = state
        with self._sql.transaction() as db:
            db.execute("CREATE TABLE IF NOT EXISTS webhooks (id TEXT PRIMARY KEY, record_json TEXT NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS deliveries (n INTEGER PRIMARY KEY AUTOINCREMENT, "
                       "webhook TEXT NOT NULL, record_json TEXT NOT NULL)")

    def add(self, url: str, *, events: Optional[list] = None, deployment: Optional[str] = None,
            error_rate: Optional[float] = None, p95_ms: Optional[float] = None, min_requests: int = 20) -> Webhook:
        """A new webhook with a fresh secret. Raises ValueError (check_webhook)."""
        check_webhook(url, events, error_rate, p95_ms, min_requests)
        hook = Webhook(id="wh_" + secrets.token_hex(4), url=url, secret="whsec_" + secrets.token_urlsafe(24),
                       events=list(events or EVENTS), deployment=deployment, error_rate=error_rate, p95_ms=p95_ms,
                       min_requests=int(min_requests), created_at=time.time())
        with self._sql.transaction() as db:
            db.execute("INSERT INTO webhooks (id, record_json) VALUES (?, ?)", (hook.id, json.dumps(asdict(hook))))
        return hook

    def all(self) -> list[Webhook]:
        """Every webhook, oldest first."""
        with self._sql.read() as db:
            rows = db.execute("SELECT record_json FROM webhooks").fetchall()
        return sorted((Webhook(**json.loads(r[0])) for r in rows), key=lambda h: h.created_at)

    def get(self, hook_id: str) -> Optional[Webhook]:
        return next((h for h in self.all() if h.id == hook_id), None)

    def remove(self, hook_id: str) -> bool:
        with self._sql.transaction() as db:
            return db.execute("DELETE FROM webhooks WHERE id = ?", (hook_id,)).rowcount > 0

    def record(self, hook_id: str, outcome: dict) -> None:
        """Keep one delivery's outcome (the newest _KEEP_DELIVERIES overall)."""
        with self._sql.transaction() as db:
            db.execute("INSERT INTO deliveries (webhook, record_json) VALUES (?, ?)", (hook_id, json.dumps(outcome)))
            db.execute("DELETE FROM deliveries WHERE n <= (SELECT MAX(n) FROM deliveries) - ?", (_KEEP_DELIVERIES,))

    def deliveries(self, hook_id: Optional[str] = None, limit: int = 20) -> list[dict]:
        """The newest outcomes first (of ``hook_id``, or of every webhook)."""
        with self._sql.read() as db:
            if hook_id:
                rows = db.execute("SELECT record_json FROM deliveries WHERE webhook = ? ORDER BY n DESC LIMIT ?",
                                  (hook_id, limit)).fetchall()
            else:
                rows = db.execute("SELECT record_json FROM deliveries ORDER BY n DESC LIMIT ?", (limit,)).fetchall()
        return [json.loads(r[0]) for r in rows]


def deliver(hook: Webhook, event: str, deployment: Optional[str], details: dict, *,
            backoff_s: tuple = BACKOFF_S, sleep: Callable[[float], None] = time.sleep) -> dict:
    """POST one signed delivery to ``hook``, retrying a non-2xx answer or a transport error after
    each of ``backoff_s`` (s). -> ``{"id", "webhook", "event", "deployment", "delivered", "attempts",
    "status", "error", "at"}``. Never raises for the receiver's failure."""
    delivery_id = "dl_" + secrets.token_hex(6)
    payload = {"id": delivery_id, "event": event, "deployment": deployment, "at": time.time(), "details": details}
    body = json.dumps(payload, separators=(",", ":"), default=str).encode()
    status, error, attempts = None, None, 0
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        for attempt, wait in enumerate((0.0, *backoff_s)):
            if wait:
                sleep(wait)
            attempts = attempt + 1
            ts = str(int(time.time()))        # signed anew each attempt: a retry is fresh, not a replay
            headers = {"Content-Type": "application/json", "X-Seq-Event": event, "X-Seq-Delivery": delivery_id,
                       "X-Seq-Timestamp": ts, "X-Seq-Signature": sign(hook.secret, ts, body),
                       "User-Agent": "sequence-ai-alerts"}
            try:
                r = client.post(hook.url, content=body, headers=headers)
                status, error = r.status_code, None if 200 <= r.status_code < 300 else f"answered {r.status_code}"
            except httpx.HTTPError as exc:
                status, error = None, f"{type(exc).__name__}: {exc}"[:200]
            if error is None:
                break
    outcome = {"id": delivery_id, "webhook": hook.id, "event": event, "deployment": deployment,
               "delivered": error is None, "attempts": attempts, "status": status, "error": error, "at": payload["at"]}
    if error is not None:
        log.warning("alert %s to %s not delivered after %d attempts: %s", event, hook.url, attempts, error)
    return outcome


class Dispatcher:
    """Sends events to the webhooks that want them, each delivery on its own thread (a slow
    receiver holds up nothing else), and records every outcome in the store."""

    def __init__(self, store: WebhookStore, backoff_s: tuple = BACKOFF_S):
        from concurrent.futures import ThreadPoolExecutor
        self.store, self.backoff_s = store, backoff_s
        self._test_pool = ThreadPoolExecutor(max_workers=TEST_THREADS, thread_name_prefix="alert-test")
        self._last: dict[tuple, float] = {}      # (event, key) -> unix s: rate limit of repeated events

    def emit(self, event: str, deployment: Optional[str], details: dict, *, once_per_s: float = 0.0,
             key: Any = None) -> int:
        """Queue ``event`` for every webhook that wants it; ``once_per_s`` drops a repeat of the
        same ``(event, key)`` sooner than that. Returns the number of deliveries started."""
        if once_per_s:
            now = time.time()
            if now - self._last.get((event, key), 0.0) < once_per_s:
                return 0
            self._last[(event, key)] = now
        hooks = [h for h in self.store.all() if h.wants(event, deployment)]
        for h in hooks:
            self.send(h, event, deployment, details)
        if hooks:
            log.info("alert %s%s -> %d webhook(s)", event, f" ({deployment})" if deployment else "", len(hooks))
        return len(hooks)

    def send(self, hook: Webhook, event: str, deployment: Optional[str], details: dict) -> None:
        """Deliver in the background; the outcome lands in the store."""
        def run() -> None:
            self.store.record(hook.id, deliver(hook, event, deployment, details, backoff_s=self.backoff_s))
        threading.Thread(target=run, name=f"alert-{event}", daemon=True).start()

    async def test_async(self, hook: Webhook) -> dict:
        """:meth:`test` on the alerts' own threads (``TEST_THREADS``), never the event loop's
        shared pool: a receiver that hangs (up to five 10 s attempts) holds up only other test
        deliveries, not the gateway's connects and polls that share that pool."""
        import asyncio
        return await asyncio.wrap_future(self._test_pool.submit(self.test, hook))

    def test(self, hook: Webhook) -> dict:
        """Deliver a ``test`` event now and return its outcome (also recorded)."""
        outcome = deliver(hook, "test", None, {"message": "a test delivery from `seq alerts test`"},
                          backoff_s=self.backoff_s)
        self.store.record(hook.id, outcome)
        return outcome
