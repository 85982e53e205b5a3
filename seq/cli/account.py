"""``seq account``: usage and limits of this gateway's account (``seq account limits`` sets the
limits: seq/cli/ops.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._client import ApiKeyOpt, DataDirOpt, GatewayOpt, call, out

__all__ = ["app"]

app = typer.Typer(invoke_without_command=True,
                  help="Usage (per deployment) and limits of the key's account; no balance self-hosted.")


@app.callback()
def account(ctx: typer.Context, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
            data_dir: Optional[Path] = DataDirOpt) -> None:
    """Usage (policies, benchmarks, each deployment's) and configured limits of the key's account;
    no balance self-hosted."""
    if ctx.invoked_subcommand:
        return
    a = call(gw, api_key, data_dir, "GET", "/v1/account")
    from sequence_ai.cli import account_lines
    for line in account_lines(a):
        out.print(line, highlight=False, markup=False)
