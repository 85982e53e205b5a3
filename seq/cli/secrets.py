"""``seq secret``: secrets stored encrypted at rest, declared by policies with ``seq.Secret.from_name``.

    seq secret set NAME --env VAR [--env VAR ...]  values from stdin (one line each) or a hidden prompt
    seq secret ls                                  names and variable names, never values
    seq secret rm NAME                             running workers keep their environment
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, call, fail, out

__all__ = ["app"]

app = typer.Typer(help="Store secrets (encrypted at rest) that policies declare with seq.Secret.from_name.",
                         no_args_is_help=True)


@app.command("set")
def secret_set(name: str, env: list[str] = typer.Option(..., "--env", help="a variable name; repeat for more"),
               gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
               data_dir: Optional[Path] = DataDirOpt) -> None:
    """Create or replace secret NAME. Values are read from stdin (one line per --env, in order)
    or, on a terminal, from a hidden prompt; never from the command line."""
    import getpass
    import sys
    try:
        values = {}
        for var in env:
            if sys.stdin.isatty():
                values[var] = getpass.getpass(f"{var}: ")
            else:
                line = sys.stdin.readline()
                if not line:
                    raise CliError("invalid_request", f"stdin ended before the value of {var}",
                                        hint="send one line per --env, in order")
                values[var] = line.rstrip("\r\n")
        s = GatewayClient(gw, api_key, data_dir).call("PUT", f"/v1/secrets/{name}", json={"env": values})
    except CliError as exc:
        fail(exc)
    out.print(f"stored secret {s['name']} ({', '.join(s['env'])})", highlight=False, markup=False)


@app.command("ls")
def secret_ls(gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """List secrets: names and variable names, never values."""
    rows = call(gw, api_key, data_dir, "GET", "/v1/secrets")["secrets"]
    table = Table("name", "variables", "updated")
    for r in rows:
        table.add_row(r["name"], ", ".join(r["env"]), time.strftime("%Y-%m-%d %H:%M", time.localtime(r["updated_at"])))
    out.print(table)


@app.command("rm")
def secret_rm(name: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """Delete secret NAME (workers already running keep their environment)."""
    call(gw, api_key, data_dir, "DELETE", f"/v1/secrets/{name}")
    out.print(f"removed secret {name}")
