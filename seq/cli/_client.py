"""What every ``seq`` command shares: the gateway's HTTP client and its error type (from
``seq.gateway_client``; the error is ``CliError`` here), exit codes, the common options and the
two consoles.

Defaults: ``--data-dir``, ``--gateway`` and ``--api-key`` resolve as ``seq.gateway_client``
says (then ``$SEQUENCES_HOME`` / ``$SEQUENCES_GATEWAY_URL`` / ``$SEQUENCES_API_KEY`` and
``<data_dir>/api_key``).

A failure prints ``error[<code>]: <detail>`` and ``hint: ...`` on stderr and exits with:

    0 success            4 not_found          7 timed out waiting
    1 failed / error     5 invalid_request
    2 usage              6 unavailable (warming, worker_failed, gateway unreachable)
    3 unauthorized
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from rich.console import Console

from ..gateway_client import GatewayClient, data_dir_of
from ..gateway_client import GatewayError as CliError

__all__ = ["EXIT", "CliError", "GatewayClient", "fail", "call", "data_dir_of", "out", "err",
           "GatewayOpt", "ApiKeyOpt", "DataDirOpt", "human_size"]

EXIT = {"unauthorized": 3, "lease_expired": 3, "not_found": 4, "invalid_request": 5, "warming": 6,
        "worker_failed": 6, "unreachable": 6, "timeout": 7}
"""Exit status per error code; any other code exits 1."""

# soft_wrap: a line is never broken at the terminal width, so piped output (scripts, logs) keeps
# whole lines; tables still fit the width
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


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


def human_size(n: float) -> str:
    """``n`` bytes as B / KiB / MiB / GiB for a person (``1536`` -> ``"1.5 KiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return str(n)
