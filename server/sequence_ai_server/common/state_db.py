"""What a table's store needs of the gateway's one SQLite connection (``<data_dir>/state.db``):
:class:`StateDB`. The gateway's ``Store`` (gateway/store.py) provides it; the keys, secrets,
volumes and ops stores (limits, schedules, webhooks, usage) take it, so none of them holds the
connection or its lock, and ops/ needs nothing of the gateway to reach its tables.

Every call goes through the one lock of that connection, so concurrent writes from request
threads and the control tick stay serialised::

    with db.transaction() as conn:        # BEGIN ... COMMIT, or ROLLBACK when the block raises
        conn.execute("INSERT ...", (...))
    with db.read() as conn:               # no transaction; fetch inside the block
        rows = conn.execute("SELECT ...").fetchall()
    db.ensure_schema("CREATE TABLE IF NOT EXISTS ...;")   # a store's own tables, at construction
"""
from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Protocol

__all__ = ["StateDB"]


class StateDB(Protocol):
    """The gateway's state.db as the stores use it. Each method holds the connection's one lock
    for as long as its block (or call) runs; a block must not call back into the same StateDB."""

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """The connection inside ``BEGIN``: committed when the block ends, rolled back (and the
        exception re-raised) when it raises."""
        ...

    def read(self) -> AbstractContextManager[sqlite3.Connection]:
        """The connection for reads (no transaction opened); rows are ``sqlite3.Row``."""
        ...

    def ensure_schema(self, script: str) -> None:
        """Run ``script`` (``CREATE TABLE IF NOT EXISTS ...`` statements) on the connection."""
        ...
