"""A stopped deployment (``seq policy stop``, its ``halted_at``) runs no worker until
``seq policy start``: a deploy or rollback while stopped records the version and leaves it
stopped."""
from __future__ import annotations

import logging
from typing import Any

__all__ = ["spawn_unless_halted"]

log = logging.getLogger("sequence_ai_server")


def spawn_unless_halted(gw: Any, name: str) -> bool:
    """Start ``name``'s serving worker on gateway ``gw`` unless the deployment is stopped; a
    stopped one keeps status/phase ``stopped`` (its new version serves at ``start``).
    Returns True when a worker was started."""
    row = gw.store.get(name)
    if row is not None and row.halted_at:
        gw.store.update(name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
        log.info("%s: v%s recorded; it is stopped, so no worker starts until `seq policy start %s`",
                 name, row.version, name)
        return False
    gw._spawn(name)
    return True
