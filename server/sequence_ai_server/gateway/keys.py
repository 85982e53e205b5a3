"""API keys of the local gateway, in the ``keys`` table of ``<data_dir>/state.db``.

Only a key's sha256 is stored; the plaintext is shown once, when it is created. A key is either
an *account key* (no deployment: may deploy, manage keys, connect to anything) or a *robot key*
bound to one deployment (may only connect to / act on / read that deployment). A revoked key is
kept (for ``ls``) and refused: lookups fail closed.

    ks = KeyStore(store)                       # the gateway's Store (a common.state_db.StateDB)
    rec, plaintext = ks.create(name="arm-7", deployment="pick-place")
    ks.lookup(plaintext) -> KeyRecord | None     # revoked keys come back with revoked_at set
    ks.revoke("key_2") / ks.list()
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from typing import Optional

from sequence_ai_server.common.state_db import StateDB

__all__ = ["KeyRecord", "KeyStore", "hash_key", "require_scope", "KEY_PREFIX"]

KEY_PREFIX = "seq_local_"
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def hash_key(key: str) -> str:
    """sha256 hex of a plaintext key (what the table stores)."""
    return hashlib.sha256(key.strip().encode()).hexdigest()


@dataclass
class KeyRecord:
    """One key as listed: never the plaintext. ``created_at``/``revoked_at`` are unix seconds."""
    id: str
    name: Optional[str]
    prefix: str
    deployment: Optional[str]
    created_at: float
    revoked_at: Optional[float] = None

    def to_dict(self) -> dict:
        return asdict(self)


def require_scope(key: KeyRecord, deployment: Optional[str] = None) -> None:
    """Robot keys reach only their own deployment; account-wide actions (``deployment`` None) need
    an unbound key. Raises ApiError unauthorized (401, reason ``key_bound``) otherwise."""
    if key.deployment is None or (deployment is not None and deployment == key.deployment):
        return
    from sequence_ai_server.common.errors import ApiError
    what = f"deployment {deployment!r}" if deployment else "this endpoint"
    raise ApiError("unauthorized", f"this key is bound to deployment {key.deployment!r} and may not use {what}",
                   hint="use an account key (one made by `seq keys create` without --deployment)",
                   details={"reason": "key_bound", "deployment": key.deployment})


class KeyStore:
    """Key rows of state.db's ``keys`` table, through ``state`` (the gateway's Store)."""

    def __init__(self, state: StateDB):
        self._sql = state
        with self._sql.transaction() as db:
            cols = {r[1] for r in db.execute("PRAGMA table_info(keys)")}
            for col, decl in (("name", "TEXT"), ("deployment", "TEXT"), ("revoked_at", "REAL")):
                if col not in cols:   # a state.db from before keys had names / bindings
                    db.execute(f"ALTER TABLE keys ADD COLUMN {col} {decl}")
        # (hash, record) of every key, read once and kept until a create or revoke. The cache is
        # filled and dropped under one lock, and dropped only after the change has committed: a
        # lookup that read the rows just before a revoke cannot put them back after it.
        self._cache: Optional[list[tuple[str, KeyRecord]]] = None
        self._cache_lock = threading.Lock()

    @staticmethod
    def _record(row: sqlite3.Row) -> KeyRecord:
        return KeyRecord(id=f"key_{row['id']}", name=row["name"], prefix=row["prefix"], deployment=row["deployment"],
                         created_at=row["created_at"], revoked_at=row["revoked_at"])

    def _rows(self) -> list[tuple[str, KeyRecord]]:
        cached = self._cache
        if cached is not None:
            return cached
        with self._cache_lock:
            if self._cache is None:
                with self._sql.read() as db:
                    rows = db.execute("SELECT * FROM keys ORDER BY id").fetchall()
                self._cache = [(r["hash"], self._record(r)) for r in rows]
            return self._cache

    def _changed(self) -> None:
        """Drop the cache; called once a change to the keys table has committed."""
        with self._cache_lock:
            self._cache = None

    def count(self) -> int:
        return len(self._rows())

    def create(self, name: Optional[str] = None, deployment: Optional[str] = None) -> tuple[KeyRecord, str]:
        """Make a key; returns its record and the plaintext (shown once).

        Raises ValueError when ``name`` is not 1-63 of letters, digits, ``_ . -``."""
        if name is not None and not _KEY_NAME.match(name):
            raise ValueError(f"key name {name!r} is not valid: use 1-63 letters, digits, '_', '.', '-'")
        plaintext = KEY_PREFIX + secrets.token_urlsafe(24)
        with self._sql.transaction() as db:
            cur = db.execute(
                "INSERT INTO keys (hash, prefix, created_at, name, deployment) VALUES (?, ?, ?, ?, ?)",
                (hash_key(plaintext), plaintext[:14], time.time(), name, deployment))
            row = db.execute("SELECT * FROM keys WHERE id = ?", (cur.lastrowid,)).fetchone()
        self._changed()
        return self._record(row), plaintext

    def list(self) -> list[KeyRecord]:
        return [rec for _, rec in self._rows()]

    def find(self, ref: str) -> Optional[KeyRecord]:
        """A key by id (``key_3``), name or plaintext prefix."""
        for _, rec in self._rows():
            if ref in (rec.id, rec.name) or (len(ref) >= 12 and rec.prefix.startswith(ref[:14])):
                return rec
        return None

    def revoke(self, key_id: str) -> KeyRecord:
        """Mark a key revoked (idempotent). Raises KeyError for an unknown id."""
        num = key_id.removeprefix("key_")
        with self._sql.transaction() as db:
            n = db.execute("UPDATE keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?",
                                 (time.time(), num)).rowcount
        self._changed()
        if not n:
            raise KeyError(key_id)
        rec = self.find(key_id)
        assert rec is not None
        return rec

    def lookup(self, plaintext: Optional[str]) -> Optional[KeyRecord]:
        """The record whose hash matches ``plaintext`` (constant-time compare over all rows), or None."""
        if not plaintext:
            return None
        digest = hash_key(plaintext)
        found = None
        for h, rec in self._rows():
            if hmac.compare_digest(digest, h):
                found = rec
        return found
