"""The gateway's HTTP client for Python code outside the client library: the ``seq`` CLI and
``seq.adapter_source()`` ask the gateway through it.

Defaults (one resolver, ``sequence_ai_core``'s): the data directory is the argument, then
``$SEQUENCES_HOME``, then ``~/.sequence-ai``; the gateway is the argument, then
``$SEQUENCES_GATEWAY_URL``, then http://127.0.0.1:8470. The API key is the argument, then
``$SEQUENCES_API_KEY``, then ``<data_dir>/api_key`` (the key file the local gateway writes; unlike
the client library, this client reads it, so ``seq`` works right after ``seq serve``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

# httpx and sequence_ai_core are imported when a client is made, not with this module: the ``seq``
# CLI imports it for every command, and ``seq --help`` or ``seq init`` asks no gateway (the two
# are a fifth of its start-up CPU).

__all__ = ["GatewayError", "GatewayClient", "data_dir_of"]


def _skip_httpx_cli() -> None:
    """Before the first ``import httpx``: mark httpx's own command-line client (``httpx._main``:
    click, rich's progress and pygments' lexers) absent, so httpx puts its stub ``main`` in its
    place; ``seq`` never runs it, and it was 20 ms of each command's CPU. A process that imported
    httpx already keeps it as it is."""
    import sys
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)


class GatewayError(Exception):
    """A gateway's refusal (its error body's ``code``, ``detail``, ``hint``, ``request_id``) or a
    failure found before asking (``unreachable``, ``unauthorized``, ...); ``extra`` holds a
    traceback tail when there is one. The ``seq`` CLI raises it as ``CliError`` and exits with
    the status its ``code`` picks."""

    def __init__(self, code: str, detail: str, hint: Optional[str] = None, request_id: Optional[str] = None,
                 extra: Optional[str] = None):
        super().__init__(detail)
        self.code, self.detail, self.hint, self.request_id, self.extra = code, detail, hint, request_id, extra


def data_dir_of(value: Optional[Path]) -> Path:
    """``--data-dir`` when given (``~`` expanded), else ``sequence_ai_core.data_dir()``
    (``$SEQUENCES_HOME`` or ``~/.sequence-ai``)."""
    from sequence_ai_core import data_dir as default_data_dir
    return value.expanduser() if value else default_data_dir()


class GatewayClient:
    """A thin httpx client for the gateway that turns error bodies into ``GatewayError``.

    Raises:
        GatewayError: ``unauthorized`` when no API key is given, set or found in ``<data_dir>/api_key``.
    """

    def __init__(self, url: Optional[str], api_key: Optional[str], data_dir: Optional[Path]):
        _skip_httpx_cli()
        import httpx
        from sequence_ai_core import AuthError, resolve_api_key, resolve_gateway_url
        self.url = resolve_gateway_url(url)
        self.data_dir = data_dir_of(data_dir)
        try:
            key = resolve_api_key(api_key)
        except AuthError:                # neither given nor set: the key file the local gateway wrote
            key_file = self.data_dir / "api_key"
            try:
                key = key_file.read_text().strip()
            except OSError:
                raise GatewayError("unauthorized", "no API key: none given and none found",
                               hint=f"pass --api-key, set SEQUENCES_API_KEY, or start the gateway with `seq serve` "
                                    f"(it writes {key_file})") from None
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30.0,
                                   trust_env=False)     # as the robot client: its gateway, never via a site proxy

    @property
    def api_key(self) -> str:
        """The key this client sends."""
        return self.client.headers["Authorization"][len("Bearer "):]

    def call(self, method: str, path: str, **kw: Any) -> dict:
        """One request (``kw`` as httpx's); the JSON body.

        Raises:
            GatewayError: ``unreachable`` when the gateway does not answer; the body's ``code``
                (else ``http_<status>``), ``detail``, ``hint`` and ``request_id`` on a 4xx/5xx.
        """
        import httpx
        try:
            resp = self.client.request(method, path, **kw)
        except httpx.InvalidURL as exc:   # e.g. an argument too long for a URL (httpx caps one at 65536 chars)
            raise GatewayError("invalid_request", f"cannot send {method} {path[:60]}{'...' if len(path) > 60 else ''} "
                           f"({len(path)} chars): {str(exc)[:200]}", hint="check the argument you gave") from None
        except httpx.TransportError as exc:
            raise GatewayError("unreachable", f"cannot reach the gateway at {self.url} ({type(exc).__name__})",
                           hint="start it with `seq serve`, or point --gateway / SEQUENCES_GATEWAY_URL at it") from None
        try:
            body = resp.json()
        except ValueError:
            body = {"detail": resp.text[:300]}
        if resp.status_code >= 400:
            raise GatewayError(body.get("code") or f"http_{resp.status_code}", body.get("detail") or resp.reason_phrase,
                           hint=body.get("hint"), request_id=body.get("request_id"))
        return body
