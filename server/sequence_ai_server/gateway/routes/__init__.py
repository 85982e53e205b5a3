"""The gateway's HTTP routes, one module per resource; each exposes ``router(<the services it
calls>, auth)`` -> ``APIRouter`` (a deployment service, the session service, a store...).
``app.py`` builds them from the :class:`~sequence_ai_server.gateway.controller.Gateway`'s services
and only mounts them.

Who may call a route is stated by its key dependency, one of :class:`Auth`'s three:
``require_key`` (any live key; the route narrows a robot key to its deployment),
``account_key`` (an account key; a robot key is 401 key_bound), ``worker_secret`` (the direct
secret of a worker this gateway runs). ``CredentialsFirst`` (middleware.py) reads them off each
route and checks the headers before any body is read; docs/design.md's table lists them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from fastapi import Depends, Header, Request

from sequence_ai_server.gateway.keys import KeyRecord
from sequence_ai_server.gateway.middleware import bearer_or_api_key, check_worker_bearer

if TYPE_CHECKING:
    from sequence_ai_server.gateway.controller import Gateway

__all__ = ["Auth", "auth_for"]


@dataclass(frozen=True)
class Auth:
    """The three key dependencies of one gateway (see the module docstring)."""
    require_key: Callable[..., KeyRecord]
    account_key: Callable[..., KeyRecord]
    worker_secret: Callable[..., None]

    def markers(self) -> dict:
        """``{dependency: scope}`` in priority order, for ``route_scopes`` / ``CredentialsFirst``."""
        return {self.account_key: "account", self.worker_secret: "worker", self.require_key: "key"}


def auth_for(gw: "Gateway") -> Auth:
    """The key dependencies checking credentials against gateway ``gw`` (its key store and its
    workers' secrets). Each raises ApiError unauthorized (401)."""

    def require_key(request: Request, authorization: Optional[str] = Header(default=None),
                    x_api_key: Optional[str] = Header(default=None)) -> KeyRecord:
        rec = gw.authenticate(bearer_or_api_key(authorization, x_api_key))
        request.state.key = rec
        return rec

    def account_key(rec: KeyRecord = Depends(require_key)) -> KeyRecord:
        gw.require_scope(rec)
        return rec

    def worker_secret(authorization: Optional[str] = Header(default=None)) -> None:
        """Dependency: the bearer is the direct secret of a worker this gateway runs."""
        check_worker_bearer(gw, authorization)

    return Auth(require_key, account_key, worker_secret)
