"""The gateway's open robot sessions: :class:`SessionRec` (one admitted session: its version,
lease expiry, params) and :class:`SessionTable` (``session_id -> SessionRec``, written through
to state.db so a restarted gateway keeps the sessions whose leases robots hold)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from .store import Store

__all__ = ["SessionRec", "SessionTable"]


@dataclass
class SessionRec:
    """One admitted robot session. Times are unix seconds."""
    id: str
    model: str
    key_id: str
    epoch: int
    version: int
    params: dict
    created_at: float
    expires_at: float
    requested: dict = field(default_factory=dict)   # the robot's own params; deployment defaults fill the rest
    side: str = ""     # workers key of the side worker (a split/pinned version); "" = the serving worker


class SessionTable(dict):
    """``session_id -> SessionRec``, written through to the ``sessions`` table of state.db on every
    set and removal, so a restarted gateway still knows the sessions whose leases robots hold
    (renewals go on, slots stay counted). A changed record is stored by setting it again."""

    def __init__(self, store: "Store"):
        super().__init__()
        self._store = store

    def load(self) -> list[SessionRec]:
        """The stored sessions (into this table, without writing); returns them."""
        out = []
        for rec in self._store.session_records():
            with contextlib.suppress(TypeError):
                sess = SessionRec(**rec)
                dict.__setitem__(self, sess.id, sess)
                out.append(sess)
        return out

    def __setitem__(self, key: str, value: SessionRec) -> None:
        super().__setitem__(key, value)
        self._store.put_session(dict(value.__dict__))

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._store.delete_sessions([key])

    def pop(self, key: str, *default: Any) -> Any:
        had = key in self
        value = super().pop(key, *default)
        if had:
            self._store.delete_sessions([key])
        return value

    def clear(self) -> None:
        ids = list(self)
        super().clear()
        self._store.delete_sessions(ids)
