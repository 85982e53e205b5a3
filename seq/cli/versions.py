"""``seq policy versions`` and ``seq policy rollback``: a deployment's kept versions.

    seq policy versions NAME                      the kept versions (5), which one serves, which failed and why
    seq policy rollback NAME [--to N]             build a kept version beside the serving one; it takes over when ready
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, call, fail, out
from .deploy import wait_build

__all__ = ["app"]

app = typer.Typer()


@app.command("versions")
def policy_versions(name: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                    data_dir: Optional[Path] = DataDirOpt) -> None:
    """List NAME's kept versions (newest first)."""
    v = call(gw, api_key, data_dir, "GET", f"/v1/deployments/{name}/versions")
    table = Table("version", "status", "serving", "load s", "created", "file / error")
    for r in v["versions"]:
        table.add_row(f"v{r['version']}", r["status"], "*" if r["serving"] else "",
                      f"{r['load_s']:.1f}" if r.get("load_s") is not None else "",
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"])),
                      r.get("error") or r["file"])
    out.print(table)


@app.command("rollback")
def policy_rollback(name: str, to: Optional[int] = typer.Option(None, "--to", help="version number (default: the previous one)"),
                    wait: bool = typer.Option(True, "--wait/--no-wait"), timeout: float = typer.Option(1800.0, "--timeout"),
                    gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                    data_dir: Optional[Path] = DataDirOpt) -> None:
    """Serve an older kept version again; it builds beside the serving one and takes over when ready."""
    try:
        g = GatewayClient(gw, api_key, data_dir)
        d = g.call("POST", f"/v1/deployments/{name}/rollback", json={"to": to})
        b = d.get("build") or {}
        out.print(f"rolling {name} back to v{b.get('version', d['version'])}")
        if wait and b.get("status") == "building":
            wait_build(g, name, d, timeout, time.monotonic())
    except CliError as exc:
        fail(exc)
