"""``seq policy traffic``: a canary split between a deployment's versions, and per-key pins.

    seq policy traffic NAME [vN=SHARE ...]        with no split, show it
        [--pin KEY vN] [--unpin KEY] [--clear]    pin a robot key to a version; --clear: all to serving
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayOpt, call, fail, out

__all__ = ["app"]

app = typer.Typer()


@app.command("traffic")
def policy_traffic(name: str,
                   split: Optional[list[str]] = typer.Argument(None, help="vN=SHARE pairs (v5=10 v4=90); "
                                                               "with --pin, the one version to pin to"),
                   pin: Optional[str] = typer.Option(None, "--pin", help="a robot key (bound to NAME) to pin: --pin arm-7 v5"),
                   unpin: Optional[str] = typer.Option(None, "--unpin", help="let this key follow the split again"),
                   clear: bool = typer.Option(False, "--clear", help="drop the split and pins: all to the serving version"),
                   gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                   data_dir: Optional[Path] = DataDirOpt) -> None:
    """Split new sessions between NAME's versions (a canary), pin a robot key to one, or show
    the split. A session keeps the version it started on for all its lease renewals."""
    path = f"/v1/deployments/{name}/traffic"
    try:
        if pin is not None:
            if len(split or []) != 1:
                raise CliError("invalid_request", "--pin takes a key and one version",
                                    hint=f"seq policy traffic {name} --pin arm-7 v5")
            body: Optional[dict] = {"pin": pin, "version": split[0]}
        elif unpin is not None or clear:
            if split:
                raise CliError("invalid_request", "--unpin/--clear take no split",
                                    hint=f"seq policy traffic {name} --clear")
            body = {"unpin": unpin} if unpin is not None else {"clear": True}
        elif split:
            shares = {}
            for item in split:
                v, sep, share = item.partition("=")
                if not sep or not v:
                    raise CliError("invalid_request", f"{item!r} is not vN=SHARE",
                                        hint=f"e.g. seq policy traffic {name} v5=10 v4=90")
                shares[v] = share
            body = {"split": shares}
        else:
            body = None
    except CliError as exc:
        fail(exc)
    t = call(gw, api_key, data_dir, "GET", path) if body is None else call(gw, api_key, data_dir, "POST", path, json=body)
    table = Table("version", "share", "sessions", "worker")
    if t["split"]:
        for r in t["split"]:
            table.add_row(f"v{r['version']}", f"{r['share_pct']:g} %", str(r["sessions"]), r["worker"])
    else:
        table.add_row(f"v{t['serving']}", "100 %", "", "serving")
    out.print(table)
    for p in t["pins"]:
        out.print(f"pinned  {p['key_name'] or p['key']} -> v{p['version']} ({p['worker']})",
                       highlight=False, markup=False)
