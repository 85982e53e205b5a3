"""Unknown routes refused from the request line, before any body is read.

A request for a path no route serves (404) or a method the path does not take (405) is answered
by the router only after the middleware inside it has run, and one of those (the JSON guard)
reads the whole body first: a client with no credentials could park up to the body limit
(32 MiB) in memory per connection on a path that does not exist. :class:`KnownRoutesFirst`
answers those requests from the request line alone, in the common error shape (``not_found``
404; ``invalid_request`` 405, as the app's own handler answers them), and
``body_limit.CloseUnread`` outside it closes the connection so the body is never read.

A path that only differs from a route by its trailing slash is passed on (the router answers it
with its redirect, reading nothing).
"""
from __future__ import annotations

from typing import Any

from starlette.routing import Match

from sequence_ai_server.common.errors import ApiError, new_request_id

__all__ = ["KnownRoutesFirst"]


class KnownRoutesFirst:
    """Pure ASGI middleware over ``app``: an HTTP request that none of ``router``'s routes matches
    (a Starlette/FastAPI router: ``app.router``) is answered 404 ``not_found``, one whose path a
    route serves under another method 405 ``invalid_request``, before the app below reads its
    body. Websocket and lifespan scopes pass through. Requests to a path with no parameters are
    found in a set (one lookup on the hot path); others are matched route by route."""

    def __init__(self, app: Any, router: Any) -> None:
        self.app, self.router = app, router
        self._exact: set = set()
        for route in getattr(router, "routes", ()):
            path, methods = getattr(route, "path", None), getattr(route, "methods", None)
            if isinstance(path, str) and "{" not in path and methods:
                self._exact.update((m, path) for m in methods)

    def _match(self, scope: dict) -> Match:
        best = Match.NONE
        for route in self.router.routes:
            found, _ = route.matches(scope)
            if found is Match.FULL:
                return found
            if found is Match.PARTIAL:
                best = found
        return best

    def _known(self, scope: dict) -> Match:
        if (scope["method"], scope["path"]) in self._exact:
            return Match.FULL
        found = self._match(scope)
        if found is Match.NONE and getattr(self.router, "redirect_slashes", False) and scope["path"] != "/":
            path = scope["path"]
            other = dict(scope, path=path[:-1] if path.endswith("/") else path + "/")
            if self._match(other) is not Match.NONE:
                return Match.FULL        # the router's slash redirect answers it, reading nothing
        return found

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            found = self._known(scope)
            if found is not Match.FULL:
                if found is Match.PARTIAL:
                    err = ApiError("invalid_request", "Method Not Allowed",
                                   hint=f"{scope['path']} does not take {scope['method']}; see the API reference")
                else:
                    err = ApiError("not_found", "Not Found", hint=f"no route serves {scope['path']}")
                err.request_id = new_request_id()
                response = err.response()
                if found is Match.PARTIAL:
                    response.status_code = 405
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
