"""``seq keys``: the account's API keys.

    seq keys create [--name N] [--deployment D]   prints the new key once (bind it to a robot with --deployment)
    seq keys ls                                   id, name, prefix, deployment, created, revoked
    seq keys revoke ID|NAME                       the key fails closed from then on
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ._client import ApiKeyOpt, DataDirOpt, GatewayOpt, call, err, out

__all__ = ["app"]

app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)


@app.command("create")
def keys_create(name: Optional[str] = typer.Option(None, "--name", help="a label, e.g. the robot's name"),
                deployment: Optional[str] = typer.Option(None, "--deployment",
                                                         help="bind the key to this deployment (a robot key)"),
                gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """Create a key. The plaintext is printed once, on stdout, and stored nowhere."""
    k = call(gw, api_key, data_dir, "POST", "/v1/keys", json={"name": name, "deployment": deployment})
    scope = f"bound to {k['deployment']}" if k.get("deployment") else "account-wide"
    err.print(f"created {k['id']}{' (' + k['name'] + ')' if k.get('name') else ''}, {scope}; "
                   "it is shown only now", highlight=False, markup=False)
    print(k["key"])


@app.command("ls")
def keys_ls(gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
            data_dir: Optional[Path] = DataDirOpt) -> None:
    """List keys (never their values)."""
    rows = call(gw, api_key, data_dir, "GET", "/v1/keys")["keys"]
    table = Table("id", "name", "prefix", "deployment", "created", "status")
    for k in rows:
        table.add_row(k["id"], k.get("name") or "", k["prefix"] + "…", k.get("deployment") or "(all)",
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(k["created_at"])),
                      "revoked" if k.get("revoked_at") else "active")
    out.print(table)


@app.command("revoke")
def keys_revoke(ref: str = typer.Argument(..., help="key id (key_3) or name"),
                gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """Revoke a key: every request with it is refused from now on (401)."""
    k = call(gw, api_key, data_dir, "DELETE", f"/v1/keys/{ref}")
    out.print(f"revoked {k['id']}{' (' + k['name'] + ')' if k.get('name') else ''}")
