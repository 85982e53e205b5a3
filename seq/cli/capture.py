"""``seq policy capture`` and ``seq policy data export``: episodes kept by the workers.

    seq policy capture NAME                          what is kept (settings, episodes, steps, labels, size)
    seq policy capture NAME --rate 0.1 [--images] [--retention-days 30]
                                                     keep that share of episodes (running workers pick
                                                     it up within seconds; no redeploy)
    seq policy capture NAME --off                    stop keeping; what was kept stays for its retention
    seq policy data export NAME --out DIR [--format lerobot|jsonl] [--version 2.1|3.0]
                                 [--fps N] [--append | --overwrite]

``--format lerobot`` writes LeRobot dataset format v2.1 by default, the format the platform
documents and every lerobot release before 0.4 reads; ``--version 3.0`` writes the format
lerobot 0.4.0 and later read (their ``convert_dataset_v21_to_v30`` also migrates a v2.1 one).

The export runs on the gateway, which writes ``--out`` on its own machine (self-hosted: this one).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, fail, human_size, out as console

__all__ = ["app"]

app = typer.Typer()
data_app = typer.Typer(help="Export the episodes kept by capture.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@app.command("capture")
def capture(name: str,
            rate: Optional[float] = typer.Option(None, "--rate", help="share of episodes kept, 0 < rate <= 1"),
            images: bool = typer.Option(False, "--images", help="keep the camera frames too"),
            retention_days: float = typer.Option(30.0, "--retention-days", help="days kept episodes live"),
            off: bool = typer.Option(False, "--off", help="stop keeping episodes"),
            gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
            data_dir: Optional[Path] = DataDirOpt) -> None:
    """Keep a share of a deployment's episodes whole (observations, chunks, params), or show what is kept."""
    try:
        client = GatewayClient(gw, api_key, data_dir)
        if off and rate is not None:
            raise CliError("invalid_request", "--off and --rate together", hint="pass one of them")
        if off:
            d = client.call("PUT", f"/v1/deployments/{name}/capture", json={"off": True})
        elif rate is not None:
            d = client.call("PUT", f"/v1/deployments/{name}/capture",
                            json={"rate": rate, "images": images, "retention_days": retention_days})
        else:
            d = client.call("GET", f"/v1/deployments/{name}/capture")
    except CliError as exc:
        fail(exc)
    state = (f"on: rate {d['rate']:g}, {'with' if d['images'] else 'without'} images, "
             f"retention {d['retention_days']:g} days" if d["enabled"] else "off")
    console.print(f"capture {name}: {state}", highlight=False, markup=False)
    oldest = time.strftime("%Y-%m-%d %H:%M", time.localtime(d["oldest"])) if d.get("oldest") else "-"
    console.print(f"kept: {d['episodes']} episodes, {d['steps']} steps, {d['labeled']} labeled, "
                   f"{human_size(d['bytes'])}, oldest {oldest}", highlight=False, markup=False)


@data_app.command("export")
def export(name: str,
           out: Path = typer.Option(..., "--out", help="the dataset directory"),
           fmt: str = typer.Option("lerobot", "--format", help="lerobot (a LeRobot dataset) or jsonl (files as kept)"),
           version: str = typer.Option("2.1", "--version",
                                       help="LeRobot dataset format: 2.1 (default; lerobot < 0.4 and openpi "
                                            "read it) or 3.0 (lerobot >= 0.4)"),
           fps: Optional[float] = typer.Option(None, "--fps", help="frames per second (default: the measured /act rate)"),
           append: bool = typer.Option(False, "--append", help="add episodes to an earlier export of this "
                                       "server at --out (lerobot)"),
           overwrite: bool = typer.Option(False, "--overwrite", help="replace an earlier export of this server "
                                          "at --out (it carries the server's signed marker); any other "
                                          "non-empty folder is refused"),
           gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
           data_dir: Optional[Path] = DataDirOpt) -> None:
    """Write the kept episodes as a LeRobot dataset (one frame per /act) or copy them as JSONL."""
    try:
        if append and overwrite:
            raise CliError("invalid_request", "--append and --overwrite together", hint="pass one of them")
        if fmt not in ("lerobot", "jsonl"):
            raise CliError("invalid_request", f"--format must be lerobot or jsonl, got {fmt!r}")
        mode = "append" if append else "overwrite" if overwrite else "new"
        body = {"format": fmt, "out": str(out.expanduser().resolve()), "version": version, "mode": mode, "fps": fps}
        client = GatewayClient(gw, api_key, data_dir)
        client.client.timeout = None   # a large export takes a while
        r = client.call("POST", f"/v1/deployments/{name}/capture/export", json=body)
    except CliError as exc:
        fail(exc)
    if fmt == "jsonl":
        console.print(f"exported {r['episodes']} episodes ({r['steps']} steps) as jsonl to {r['out']}",
                       highlight=False, markup=False)
    else:
        console.print(f"exported {r['added_episodes']} episodes ({r['added_frames']} frames at {r['fps']:g} fps) "
                       f"as LeRobot v{r['version']} to {r['out']}", highlight=False, markup=False)
