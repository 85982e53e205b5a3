"""Direct-secret checks for a worker: leases, secret rotation and idle tracking, with the gateway
off the /act path.

A robot's ``direct_secret`` (from ``POST /v1/connect``) is a *lease token*:

    lease.<session_id>.<epoch>.<expires_at_ms>.<sig>     sig = hex HMAC-SHA256(worker secret, "<session_id>.<epoch>.<expires_at_ms>")

The worker verifies it with its own secret (no call to the gateway): a bad signature is 401
``unauthorized``, a token past ``expires_at`` is 401 ``lease_expired``. Either way the client
reconnects through the gateway, which hands out a fresh token (or refuses, fail closed). The
raw worker secret itself is accepted too (the gateway's ``/v1/act`` proxy and tests use it).

Rotation: the gateway writes the worker's current secret to ``$SEQ_WORKER_SECRET_FILE`` (0600).
The worker re-reads it when the file's mtime changes, so a rotated secret invalidates every
token signed with the old one at once (401, the client reconnects).

Idle tracking: on each accepted request the worker touches ``$SEQ_WORKER_ACTIVITY_FILE`` (at
most once a second); the gateway reads its mtime to tell how long the worker has been idle.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from typing import Optional

from .errors import ApiError

__all__ = ["sign_lease", "DirectAuth", "TOKEN_PREFIX"]

TOKEN_PREFIX = "lease."


def sign_lease(secret: str, session_id: str, epoch: int, expires_at: float) -> str:
    """A lease token for ``session_id`` valid until ``expires_at`` (unix seconds), signed with ``secret``."""
    body = f"{session_id}.{int(epoch)}.{int(expires_at * 1000)}"
    sig = hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()
    return f"{TOKEN_PREFIX}{body}.{sig}"


def _unauthorized() -> ApiError:
    return ApiError("unauthorized", "missing or wrong direct secret",
                    hint="reconnect through the gateway (POST /v1/connect) for fresh worker coordinates")


class DirectAuth:
    """The worker side of the direct secret.

    Args:
        secret: the worker secret given at start (``$SEQ_WORKER_SECRET``).
        secret_file: optional path re-read on mtime change (rotation); its content replaces ``secret``.
        activity_file: optional path touched (mtime) on each accepted request, at most once per second.

    ``check(token)`` raises ``ApiError`` 401 (``unauthorized`` or ``lease_expired``) or returns None.
    """

    def __init__(self, secret: str, secret_file: Optional[str] = None, activity_file: Optional[str] = None):
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
            if len(parts) != 4:
                raise _unauthorized()
            session_id, epoch, expires_ms, sig = parts
            want = hmac.new(secret.encode(), f"{session_id}.{epoch}.{expires_ms}".encode(), hashlib.sha256).hexdigest()
            if not hmac.compare_digest(sig.encode(), want.encode()):
                raise _unauthorized()
            try:
                expires_at = int(expires_ms) / 1000.0
            except ValueError:
                raise _unauthorized() from None
            if time.time() > expires_at:
                raise ApiError("lease_expired", f"the lease of session {session_id} expired",
                               hint="reconnect through the gateway (POST /v1/connect) for a new lease")
        elif not hmac.compare_digest(token.encode(), secret.encode()):
            raise _unauthorized()
        self._touch()

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
