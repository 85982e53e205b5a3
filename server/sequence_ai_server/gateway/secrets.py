"""Secrets of the local gateway: named sets of environment variables, encrypted at rest.

    seq secret set NAME --env VAR [--env VAR ...]   values from stdin (one line per VAR) or a hidden prompt
    seq secret ls                                   names and variable names only
    seq secret rm NAME

Values are encrypted with cryptography's Fernet (AES-128-CBC + HMAC-SHA256); the key is
``<data_dir>/secret.key`` (created 0600 on first use). The SQLite table ``secrets`` holds the
name, the variable names (plaintext) and the Fernet token of the ``{VAR: value}`` JSON.

Injection: a worker whose policy declares ``secrets=[seq.Secret.from_name("hf")]`` asks the
gateway for exactly those names (``POST /v1/internal/worker-secrets``, authenticated with its own
worker secret) after import and before load, and puts the variables in its environment. An
undeclared secret never reaches a worker. Values are never logged or returned by any other route.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from cryptography.fernet import Fernet

from sequence_ai_server.common.state_db import StateDB

__all__ = ["SecretStore", "SECRET_NAME", "ENV_NAME"]

SECRET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS secrets (
    name TEXT PRIMARY KEY,
    env_names TEXT NOT NULL,
    token BLOB NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""


def _load_key(path: Path) -> bytes:
    """The Fernet key at ``path``, created 0600 when missing (and made 0600 when looser)."""
    if not path.exists():
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(Fernet.generate_key())
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    return path.read_bytes().strip()


class SecretStore:
    """Encrypted secrets in the gateway's state.db, through ``state`` (the gateway's Store)."""

    def __init__(self, state: StateDB, key_file: Path):
        self._sql, self.key_file = state, Path(key_file)
        self._fernet = Fernet(_load_key(self.key_file))
        self._sql.ensure_schema(_SCHEMA)

    def set(self, name: str, env: dict[str, str]) -> dict:
        """Create or replace secret ``name`` = ``{VAR: value}``. Raises ValueError on a bad name,
        no variables, a bad variable name or a non-string value."""
        if not SECRET_NAME.match(name or ""):
            raise ValueError(f"secret name {name!r} is not valid: use lowercase letters, digits, '-' and '_'")
        if not env:
            raise ValueError("a secret needs at least one variable (--env VAR)")
        for var, value in env.items():
            if not ENV_NAME.match(var):
                raise ValueError(f"{var!r} is not an environment variable name")
            if not isinstance(value, str):
                raise ValueError(f"the value of {var} must be text")
        token = self._fernet.encrypt(json.dumps(env).encode())
        now = time.time()
        with self._sql.transaction() as db:
            db.execute("INSERT INTO secrets (name, env_names, token, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
                       "ON CONFLICT(name) DO UPDATE SET env_names = excluded.env_names, token = excluded.token, "
                       "updated_at = excluded.updated_at", (name, json.dumps(sorted(env)), token, now, now))
        return {"name": name, "env": sorted(env), "updated_at": now}

    def list(self) -> list[dict]:
        """``[{"name", "env": [VAR names], "created_at", "updated_at"}]``; never values."""
        with self._sql.read() as db:
            rows = db.execute("SELECT name, env_names, created_at, updated_at FROM secrets ORDER BY name").fetchall()
        return [{"name": r[0], "env": json.loads(r[1]), "created_at": r[2], "updated_at": r[3]} for r in rows]

    def remove(self, name: str) -> bool:
        with self._sql.transaction() as db:
            return db.execute("DELETE FROM secrets WHERE name = ?", (name,)).rowcount > 0

    def environment(self, names: list[str]) -> dict[str, str]:
        """The decrypted variables of ``names`` merged in order. Raises KeyError(name) for a missing one."""
        out: dict[str, str] = {}
        for name in names:
            with self._sql.read() as db:
                row = db.execute("SELECT token FROM secrets WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise KeyError(name)
            out.update(json.loads(self._fernet.decrypt(row[0])))
        return out
