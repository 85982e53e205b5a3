"""Direct-secret checks for a worker: leases, secret rotation and idle tracking, with the gateway
off the /act path.

A robot's ``direct_secret`` (from ``POST /v1/connect``) is a *lease token*:

    lease.<session_id>.<epoch>.<expires_at_ms>.<sig>     sig = hex HMAC-SHA256(worker secret, "<session_id>.<epoch>.<expires_at_ms>")
    lease.<session_id>.<epoch>.<expires_at_ms>.<period_us>.<sig>   (the same, period_us signed too)

``period_us`` (whole microseconds, present when the gateway knows it) is the request period the
gateway admitted the robot at (1 / its request rate, ``admission.request_hz``). The worker orders
a session's requests by the period it declares with them, never by one shorter than this signed
floor (:func:`period_floor_ms`), so a robot cannot buy the front of the queue by declaring a
shorter period than the rate it was admitted for.

The worker verifies it with its own secret (no call to the gateway): a bad signature is 401
``unauthorized``, a token past ``expires_at`` is 401 ``lease_expired``. Either way the client
reconnects through the gateway, which hands out a fresh token (or refuses, fail closed). The
raw worker secret itself is accepted too (the gateway's ``/v1/act`` proxy and tests use it).

Rotation: the gateway writes the worker's current secret to ``$SEQ_WORKER_SECRET_FILE`` (0600).
The worker re-reads it when the file's mtime changes, so a rotated secret invalidates every
token signed with the old one at once (401, the client reconnects).

Idle tracking: on each accepted request the worker touches ``$SEQ_WORKER_ACTIVITY_FILE`` (at
most once a second); the gateway reads its mtime to tell how long the worker has been idle.

Revocation: a session ended early (``DELETE /v1/sessions/{id}``, or every session of a revoked
key) must stop working at the worker at once, not when its lease runs out. The gateway keeps a
``RevocationList`` (session id -> the time its last lease would have expired) and

  * pushes it to the worker holding the session, ``POST /control/revoke`` authenticated with the
    raw worker secret (a lease token is refused there), before the DELETE returns;
  * serves it at ``GET /v1/internal/revocations`` (worker secret), which every worker started by
    a gateway polls each ``$SEQ_REVOCATION_POLL_S`` (1 s) as the fallback for a push that failed.

The worker keeps a ``Revocations`` set and refuses a revoked session's token with 401
``unauthorized`` (``details.reason = "session_ended"``). Nothing on the /act path calls the
gateway: a worker whose gateway is down keeps serving every lease it holds (and keeps the
revocations it already has); entries are dropped once the lease they revoke has expired anyway.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import logging
import math
import os
import threading
import time
from typing import Any, Iterable, Mapping, Optional

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.plain_http import client_options

__all__ = ["sign_lease", "session_of", "period_floor_ms", "DirectAuth", "Revocations", "RevocationList", "RevocationPoller",
           "push_revocations", "TOKEN_PREFIX", "REVOCATION_POLL_S"]

log = logging.getLogger("sequence_ai_server.common.leases")

TOKEN_PREFIX = "lease."
REVOCATION_POLL_S = 1.0        # a worker asks its gateway for revocations this often ($SEQ_REVOCATION_POLL_S)
REVOCATION_SLACK_S = 5.0       # an entry outlives the lease it revokes by this much (clock skew)
MAX_REVOCATIONS = 100_000      # entries a worker keeps (the soonest-expiring go first past this)


def sign_lease(secret: str, session_id: str, epoch: int, expires_at: float,
               period_ms: Optional[float] = None) -> str:
    """A lease token for ``session_id`` valid until ``expires_at`` (unix seconds), signed with
    ``secret``; ``period_ms``: the request period the robot was admitted at (ms, finite > 0),
    signed into the token as the floor of the periods its requests may declare (None: no floor)."""
    body = f"{session_id}.{int(epoch)}.{int(expires_at * 1000)}"
    if period_ms is not None and math.isfinite(period_ms) and period_ms > 0:
        body += f".{min(int(round(period_ms * 1000)), 10**12)}"
    sig = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
    return f"{TOKEN_PREFIX}{body}.{sig}"


def _lease_parts(token: Optional[str]) -> Optional[list[str]]:
    token = (token or "").strip()
    if not token.startswith(TOKEN_PREFIX):
        return None
    parts = token[len(TOKEN_PREFIX):].split(".")
    return parts if len(parts) in (4, 5) else None


def session_of(token: Optional[str]) -> Optional[str]:
    """The session id a lease token names (unverified), or None for anything else."""
    parts = _lease_parts(token)
    return parts[0] if parts else None


def period_floor_ms(token: Optional[str]) -> Optional[float]:
    """The admitted request period (ms) a lease token carries, or None (an older token, the raw
    worker secret, anything else). Unverified: read it only from a token ``DirectAuth.check`` passed."""
    parts = _lease_parts(token)
    if not parts or len(parts) != 5 or not parts[3].isdigit():
        return None
    return int(parts[3]) / 1000.0


def _unauthorized() -> ApiError:
    return ApiError("unauthorized", "missing or wrong direct secret",
                    hint="reconnect through the gateway (POST /v1/connect) for fresh worker coordinates")


class DirectAuth:
    """The worker side of the direct secret.

    Args:
        secret: the worker secret given at start (``$SEQ_WORKER_SECRET``).
        secret_file: optional path re-read on mtime change (rotation); its content replaces ``secret``.
        activity_file: optional path touched (mtime) on each accepted request, at most once per second.

    ``check(token)`` raises ``ApiError`` 401 (``unauthorized`` or ``lease_expired``) or returns None;
    ``check_control(token)`` accepts only the raw current secret (the gateway's control calls).
    ``revocations`` is the set of sessions ended early (see the module docstring).
    """

    def __init__(self, secret: str, secret_file: Optional[str] = None, activity_file: Optional[str] = None):
        self.revocations = Revocations()
        self._secret = secret
        self._secret_file = secret_file
        self._secret_mtime = 0.0
        self._activity_file = activity_file
        self._touched = 0.0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, secret: str) -> "DirectAuth":
        """Reads ``$SEQ_WORKER_SECRET_FILE`` and ``$SEQ_WORKER_ACTIVITY_FILE`` (both optional)."""
        return cls(secret, os.environ.get("SEQ_WORKER_SECRET_FILE") or None,
                   os.environ.get("SEQ_WORKER_ACTIVITY_FILE") or None)

    def current_secret(self) -> str:
        if self._secret_file:
            try:
                mtime = os.stat(self._secret_file).st_mtime_ns
            except OSError:
                mtime = 0
            if mtime and mtime != self._secret_mtime:
                with self._lock:
                    try:
                        value = open(self._secret_file).read().strip()
                    except OSError:
                        value = ""
                    if value:
                        self._secret, self._secret_mtime = value, mtime
        return self._secret

    def check(self, token: Optional[str]) -> None:
        token = (token or "").strip()
        if not token:
            raise _unauthorized()
        secret = self.current_secret()
        if token.startswith(TOKEN_PREFIX):
            parts = token[len(TOKEN_PREFIX):].split(".")
            if len(parts) not in (4, 5) or (len(parts) == 5 and not parts[3].isdigit()):
                raise _unauthorized()
            session_id, epoch, expires_ms, sig = parts[0], parts[1], parts[2], parts[-1]
            want = hmac.new(secret.encode(), ".".join(parts[:-1]).encode(), hashlib.sha256).hexdigest()
            if not hmac.compare_digest(sig.encode(), want.encode()):
                raise _unauthorized()
            try:
                expires_at = int(expires_ms) / 1000.0
            except ValueError:
                raise _unauthorized() from None
            if time.time() > expires_at:
                raise ApiError("lease_expired", f"the lease of session {session_id} expired",
                               hint="reconnect through the gateway (POST /v1/connect) for a new lease")
            if self.revocations.revoked(session_id):
                raise ApiError("unauthorized", f"session {session_id} was ended (closed, or its API key was revoked)",
                               hint="connect again through the gateway (POST /v1/connect); a revoked key is refused there",
                               details={"reason": "session_ended", "session_id": session_id})
        elif not hmac.compare_digest(token.encode(), secret.encode()):
            raise _unauthorized()
        self._touch()

    def check_control(self, token: Optional[str]) -> None:
        """Accept only the raw current worker secret (constant-time); raises ApiError 401 otherwise.
        A robot's lease token is refused: it must not revoke other robots' sessions."""
        token = (token or "").strip()
        if not token or not hmac.compare_digest(token.encode(), self.current_secret().encode()):
            raise ApiError("unauthorized", "control routes take the worker secret itself",
                           hint="only the gateway that started this worker calls /control/*")

    def _touch(self) -> None:
        if not self._activity_file:
            return
        now = time.time()
        if now - self._touched < 1.0:
            return
        self._touched = now
        try:
            os.utime(self._activity_file, None)
        except FileNotFoundError:
            try:
                open(self._activity_file, "a").close()
            except OSError:
                pass
        except OSError:
            pass


# ---------------------------------------------------------------- revocation

def _entries(raw: Any) -> dict[str, float]:
    """Validate ``{session_id: until_unix_s}``; raises ValueError naming what is wrong."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"sessions must be an object of session id -> unix seconds, got {type(raw).__name__}")
    out: dict[str, float] = {}
    for sid, until in raw.items():
        if not isinstance(sid, str) or not 0 < len(sid) <= 128 or "." in sid:
            raise ValueError(f"session id {str(sid)[:40]!r} is not 1-128 characters without a dot")
        if isinstance(until, bool) or not isinstance(until, (int, float)):
            raise ValueError(f"sessions.{sid} must be unix seconds, got {type(until).__name__}")
        try:
            value = float(until)
        except OverflowError:
            raise ValueError(f"sessions.{sid} is too large") from None
        if not math.isfinite(value):
            raise ValueError(f"sessions.{sid} must be finite")
        out[sid] = value
    return out


class Revocations:
    """Worker side: session ids whose lease tokens are refused, each until the time (unix s) its
    last lease would have expired anyway (plus ``REVOCATION_SLACK_S``). Thread-safe.

    ``add({sid: until})`` merges (keeping the later time); ``revoked(sid)`` is a dict lookup.
    """

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, entries: Mapping[str, float]) -> int:
        """Merge ``{session_id: until}``; -> how many were new. Raises ValueError for a malformed map."""
        clean = _entries(entries)
        now = time.time()
        new = 0
        with self._lock:
            for sid, until in clean.items():
                if until + REVOCATION_SLACK_S < now:
                    continue
                if sid not in self._until:
                    new += 1
                self._until[sid] = max(until, self._until.get(sid, 0.0))
            self._prune(now)
        return new

    def revoked(self, session_id: str) -> bool:
        until = self._until.get(session_id)
        return until is not None and time.time() <= until + REVOCATION_SLACK_S

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            self._prune(time.time())
            return dict(self._until)

    def __len__(self) -> int:
        return len(self._until)

    def _prune(self, now: float) -> None:
        for sid in [s for s, u in self._until.items() if u + REVOCATION_SLACK_S < now]:
            del self._until[sid]
        if len(self._until) > MAX_REVOCATIONS:
            for sid in sorted(self._until, key=self._until.__getitem__)[:len(self._until) - MAX_REVOCATIONS]:
                del self._until[sid]


class RevocationList(Revocations):
    """Gateway side: the same set, served to polling workers (``GET /v1/internal/revocations``)
    and pushed to the worker holding a session as it is ended (``push_revocations``)."""


def push_revocations(targets: Iterable[tuple[str, str]], entries: Mapping[str, float],
                     timeout_s: float = 1.0) -> list[str]:
    """POST ``{"sessions": entries}`` to ``<url>/control/revoke`` of each ``(url, worker secret)``
    target, in parallel, waiting at most ``timeout_s`` in all. -> the URLs that did not confirm
    (their workers learn it from the poll). Never raises."""
    import httpx
    targets = list(dict.fromkeys(targets))
    if not targets or not entries:
        return []

    def one(url: str, secret: str) -> bool:
        try:
            r = httpx.post(f"{url}/control/revoke", json={"sessions": dict(entries)},
                           headers={"Authorization": f"Bearer {secret}"}, timeout=timeout_s, **client_options(url))
            return r.status_code == 200
        except Exception:  # noqa: BLE001 - a worker that is gone or slow polls instead
            return False

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(targets)), thread_name_prefix="revoke")
    futures = {pool.submit(one, url, secret): url for url, secret in targets}
    done, _ = concurrent.futures.wait(futures, timeout=timeout_s + 0.5)
    pool.shutdown(wait=False)
    failed = [url for f, url in futures.items() if f not in done or not f.result()]
    for url in failed:
        log.warning("revocation push to %s not confirmed; the worker picks it up from its poll", url)
    return failed


class RevocationPoller:
    """Worker side fallback: every ``interval_s`` ask ``<gateway_url>/v1/internal/revocations``
    (authenticated with the worker's current secret) and merge the answer into
    ``auth.revocations``. A gateway that is down or refuses is skipped silently: the worker keeps
    serving the leases it holds. Runs on one daemon thread; ``stop()`` ends it."""

    def __init__(self, auth: DirectAuth, gateway_url: str, interval_s: float = REVOCATION_POLL_S):
        self.auth = auth
        self.url = gateway_url.rstrip("/") + "/v1/internal/revocations"
        self.interval_s = max(0.05, float(interval_s))
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="revocation-poll", daemon=True)

    @classmethod
    def from_env(cls, auth: DirectAuth) -> Optional["RevocationPoller"]:
        """A started poller when ``$SEQ_GATEWAY_URL`` is set (``$SEQ_REVOCATION_POLL_S`` = its
        interval, default 1 s); None otherwise."""
        url = os.environ.get("SEQ_GATEWAY_URL")
        if not url:
            return None
        poller = cls(auth, url, float(os.environ.get("SEQ_REVOCATION_POLL_S") or REVOCATION_POLL_S))
        poller._thread.start()
        return poller

    def poll_once(self, client: Any) -> bool:
        """One poll; -> True when the gateway answered with a list that was merged."""
        try:
            r = client.get(self.url, headers={"Authorization": f"Bearer {self.auth.current_secret()}"})
            if r.status_code != 200:
                return False
            self.auth.revocations.add(r.json().get("sessions") or {})
            self.polls += 1
            return True
        except Exception:  # noqa: BLE001 - gateway down, restarting or answering garbage: keep serving
            return False

    def _run(self) -> None:
        import httpx
        with httpx.Client(timeout=httpx.Timeout(2.0, connect=1.0), **client_options(self.url)) as client:
            while not self._stop.wait(self.interval_s):
                self.poll_once(client)

    def stop(self) -> None:
        self._stop.set()
