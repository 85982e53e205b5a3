"""What every ``seq`` command shares: the gateway's HTTP client, the error type, exit codes,
the common options and the two consoles.

Defaults (one resolver, ``sequence_ai_core``'s): the data directory is ``--data-dir``, then
``$SEQUENCES_HOME``, then ``~/.sequence-ai``; the gateway is ``--gateway``, then
``$SEQUENCES_GATEWAY_URL``, then http://127.0.0.1:8470. The API key is ``--api-key``, then
``$SEQUENCES_API_KEY``, then ``<data_dir>/api_key`` (the key file the local gateway writes; unlike
the client library, the CLI reads it, so ``seq`` works right after ``seq serve``).

A failure prints ``error[<code>]: <detail>`` and ``hint: ...`` on stderr and exits with:

    0 success            4 not_found          7 timed out waiting
    1 failed / error     5 invalid_request
    2 usage              6 unavailable (warming, worker_failed, gateway unreachable)
    3 unauthorized
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn, Optional

import httpx
import typer
from rich.console import Console

from sequence_ai_core import AuthError, resolve_api_key, resolve_gateway_url
from sequence_ai_core import data_dir as default_data_dir

__all__ = ["EXIT", "CliError", "GatewayClient", "fail", "call", "data_dir_of", "out", "err",
           "GatewayOpt", "ApiKeyOpt", "DataDirOpt"]

EXIT = {"unauthorized": 3, "lease_expired": 3, "not_found": 4, "invalid_request": 5, "warming": 6,
        "worker_failed": 6, "unreachable": 6, "timeout": 7}
"""Exit status per error code; any other code exits 1."""

# soft_wrap: a line is never broken at the terminal width, so piped output (scripts, logs) keeps
# whole lines; tables still fit the width
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class CliError(Exception):
    """A command's failure: ``code`` picks the exit status (``EXIT``), ``detail`` and ``hint``
    are printed, ``extra`` (a traceback tail) is printed between them, and ``request_id`` is
    printed for server-side faults (policy_error, internal)."""

    def __init__(self, code: str, detail: str, hint: Optional[str] = None, request_id: Optional[str] = None,
                 extra: Optional[str] = None):
        super().__init__(detail)
        self.code, self.detail, self.hint, self.request_id, self.extra = code, detail, hint, request_id, extra


def fail(exc: CliError) -> NoReturn:
    """Print ``exc`` on stderr (``error[<code>]: <detail>``, its extra lines, ``hint: ...``) and
    exit with its code's status. Raises ``typer.Exit``."""
    err.print(f"error[{exc.code}]: {exc.detail}", style="bold red", highlight=False, markup=False, soft_wrap=True)
    if exc.extra:
        err.print(exc.extra, highlight=False, markup=False, soft_wrap=True)
    if exc.hint:
        err.print(f"hint: {exc.hint}", highlight=False, markup=False, soft_wrap=True)
    if exc.request_id and exc.code in ("policy_error", "internal"):
        err.print(f"request_id: {exc.request_id}", highlight=False, markup=False)
    raise typer.Exit(EXIT.get(exc.code, 1))


def data_dir_of(value: Optional[Path]) -> Path:
    """``--data-dir`` when given (``~`` expanded), else ``sequence_ai_core.data_dir()``
    (``$SEQUENCES_HOME`` or ``~/.sequence-ai``)."""
    return value.expanduser() if value else default_data_dir()


class GatewayClient:
    """A thin httpx client for the gateway that turns error bodies into ``CliError``.

    Raises:
        CliError: ``unauthorized`` when no API key is given, set or found in ``<data_dir>/api_key``.
    """

    def __init__(self, url: Optional[str], api_key: Optional[str], data_dir: Optional[Path]):
        self.url = resolve_gateway_url(url)
        self.data_dir = data_dir_of(data_dir)
        try:
            key = resolve_api_key(api_key)
        except AuthError:                # neither given nor set: the key file the local gateway wrote
            key_file = self.data_dir / "api_key"
            try:
                key = key_file.read_text().strip()
            except OSError:
                raise CliError("unauthorized", "no API key: none given and none found",
                               hint=f"pass --api-key, set SEQUENCES_API_KEY, or start the gateway with `seq serve` "
                                    f"(it writes {key_file})") from None
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30.0)

    @property
    def api_key(self) -> str:
        """The key this client sends."""
        return self.client.headers["Authorization"][len("Bearer "):]

    def call(self, method: str, path: str, **kw: Any) -> dict:
        """One request (``kw`` as httpx's); the JSON body.

        Raises:
            CliError: ``unreachable`` when the gateway does not answer; the body's ``code``
                (else ``http_<status>``), ``detail``, ``hint`` and ``request_id`` on a 4xx/5xx.
        """
        try:
            resp = self.client.request(method, path, **kw)
        except httpx.InvalidURL as exc:   # e.g. an argument too long for a URL (httpx caps one at 65536 chars)
            raise CliError("invalid_request", f"cannot send {method} {path[:60]}{'...' if len(path) > 60 else ''} "
                           f"({len(path)} chars): {str(exc)[:200]}", hint="check the argument you gave") from None
        except httpx.TransportError as exc:
            raise CliError("unreachable", f"cannot reach the gateway at {self.url} ({type(exc).__name__})",
                           hint="start it with `seq serve`, or point --gateway / SEQUENCES_GATEWAY_URL at it") from None
        try:
            body = resp.json()
        except ValueError:
            body = {"detail": resp.text[:300]}
        if resp.status_code >= 400:
            raise CliError(body.get("code") or f"http_{resp.status_code}", body.get("detail") or resp.reason_phrase,
                           hint=body.get("hint"), request_id=body.get("request_id"))
        return body


def call(gateway: Optional[str], api_key: Optional[str], data_dir: Optional[Path], method: str, path: str,
         **kw: Any) -> dict:
    """One gateway request for a command: the JSON body, or on failure ``error[<code>]`` /
    ``hint:`` on stderr and exit with the code's status (``EXIT``)."""
    try:
        return GatewayClient(gateway, api_key, data_dir).call(method, path, **kw)
    except CliError as exc:
        fail(exc)


GatewayOpt = typer.Option(None, "--gateway", help="gateway URL (default: $SEQUENCES_GATEWAY_URL or http://127.0.0.1:8470)")
ApiKeyOpt = typer.Option(None, "--api-key", help="API key (default: $SEQUENCES_API_KEY or <data-dir>/api_key)")
DataDirOpt = typer.Option(None, "--data-dir", help="data dir (default: $SEQUENCES_HOME or ~/.sequence-ai)")
