"""``seq volume``: weights uploaded once as named, versioned volumes (``weights="vol://NAME@vN"``).

    seq volume put NAME DIR                       upload DIR as the next version of volume NAME (resumable:
                                                  run it again after an interruption; md5 checked)
    seq volume ls [--limit N] [--cursor C]        name, state, version, size, files, used by
    seq volume rm NAME                            refused while a deployment's weights name it
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, call, err, fail, out

__all__ = ["app"]

app = typer.Typer(help="Upload weights once as a named, versioned volume (weights=\"vol://NAME@vN\").",
                         no_args_is_help=True)


@app.command("put")
def volume_put(name: str, directory: Path = typer.Argument(..., help="the directory to upload"),
               chunk_mb: float = typer.Option(8.0, "--chunk-mb", help="MiB per request (the gateway takes 32)"),
               gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
               data_dir: Optional[Path] = DataDirOpt) -> None:
    """Upload DIR as the next version of volume NAME. Every file's md5 is checked before the
    version becomes active; an interrupted put resumes when run again with the same files."""
    import hashlib
    root = directory.expanduser()
    if not root.is_dir():
        fail(CliError("invalid_request", f"{directory} is not a directory",
                                 hint="seq volume put NAME ./checkpoints/NAME"))
    files = []
    for p in sorted(x for x in root.rglob("*") if x.is_file()):
        h = hashlib.md5()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        files.append({"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "md5": h.hexdigest()})
    if not files:
        fail(CliError("invalid_request", f"{directory} holds no files", hint="point at a checkpoint directory"))
    g = GatewayClient(gw, api_key, data_dir)
    step = max(1, int(chunk_mb * 1024 * 1024))
    try:
        up = g.call("POST", f"/v1/volumes/{name}/uploads", json={"files": files})
        v, sent = up["version"], 0
        if up["resumed"]:
            err.print(f"resuming the upload of {name} v{v}", highlight=False, markup=False)
        for f in files:
            offset = up["have"].get(f["path"], 0)
            offset = 0 if offset > f["size"] else offset
            with open(root / f["path"], "rb") as fh:
                fh.seek(offset)
                while True:
                    data = fh.read(step)
                    if not data and offset > 0:
                        break
                    g.call("PUT", f"/v1/volumes/{name}/uploads/{v}", params={"path": f["path"], "offset": offset},
                           content=data, headers={"Content-Type": "application/octet-stream"})
                    offset += len(data)
                    sent += len(data)
                    if offset >= f["size"]:
                        break
        d = g.call("POST", f"/v1/volumes/{name}/uploads/{v}/complete")
    except CliError as exc:
        fail(exc)
    out.print(f"uploaded {name} v{d['version']}: {d['files']} files, {d['size']} bytes ({sent} sent), "
                   f"md5 verified; use weights=\"{d['uri']}\"", highlight=False, markup=False)


@app.command("ls")
def volume_ls(limit: int = typer.Option(50, "--limit"), cursor: Optional[str] = typer.Option(None, "--cursor"),
              gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """List volumes: name, state, newest version, size, files, and the deployments using it."""
    page = call(gw, api_key, data_dir, "GET", "/v1/volumes", params={"limit": limit, **({"cursor": cursor} if cursor else {})})
    table = Table("name", "state", "version", "size", "files", "versions", "used by")
    for r in page["volumes"]:
        table.add_row(r["name"], r["state"], f"v{r['version']}", str(r["size"]), str(r["files"]),
                      ", ".join(f"v{x}" for x in r["versions"]), ", ".join(r["used_by"]))
    out.print(table)
    if page.get("next_cursor"):
        out.print(f"more: --cursor {page['next_cursor']}", highlight=False, markup=False)


@app.command("rm")
def volume_rm(name: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """Delete volume NAME (every version); refused while a deployment's weights name it."""
    call(gw, api_key, data_dir, "DELETE", f"/v1/volumes/{name}")
    out.print(f"removed volume {name}")
