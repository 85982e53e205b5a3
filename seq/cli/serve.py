"""``seq serve``: run the local gateway in the foreground.

    seq serve [--host 127.0.0.1] [--port 8470] [--data-dir ~/.sequence-ai] [--backend local|ray]
              [--ray-address local|auto|HOST:PORT]
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ._client import CliError, DataDirOpt, data_dir_of, fail, out

__all__ = ["app"]

app = typer.Typer()


@app.command()
def serve(host: str = typer.Option("127.0.0.1", help="address to bind"),
          port: int = typer.Option(8470, help="port to bind (0: any free port)"),
          data_dir: Optional[Path] = DataDirOpt,
          backend: str = typer.Option("local", help="where workers run: local (subprocesses) or ray (Ray actors)"),
          ray_address: str = typer.Option("local", "--ray-address",
                                          help="with --backend ray: a Ray cluster HOST:PORT, auto, or local (a private loopback head)")) -> None:
    """Run the gateway in the foreground; Ctrl-C stops it and every worker it started."""
    import logging
    import os

    if backend not in ("local", "ray"):
        fail(CliError("invalid_request", f"unknown --backend {backend!r}", hint="use --backend local or --backend ray"))
    os.environ["SEQ_BACKEND"], os.environ["SEQ_RAY_ADDRESS"] = backend, ray_address   # read by the gateway

    from sequence_ai_server.gateway.main import serve as run_gateway

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    directory = data_dir_of(data_dir)

    def ready(info: dict) -> None:
        out.print(f"[bold green]gateway[/] serving on {info['url']}")
        out.print(f"  data dir  {info['data_dir']}")
        out.print(f"  API key   {info['api_key_file']}  (export SEQUENCES_API_KEY=$(cat {info['api_key_file']}))")
        out.print("  Ctrl-C stops the gateway and its workers")
    from sequence_ai_server.gateway.main import BadSetting
    from sequence_ai_server.gateway.supervisor import DataDirInUse

    try:
        run_gateway(host, port, directory, on_ready=ready)
    except BadSetting as exc:
        fail(CliError("invalid_request", f"cannot start the gateway: {exc}",
                      hint="fix or unset that variable, then run seq serve again"))
    except DataDirInUse as exc:     # the data dir is the cause, not the port
        fail(CliError("unavailable", f"cannot serve from {directory}: {exc}",
                      hint="stop the gateway holding it (Ctrl-C where it runs, or kill the pid above), "
                           "or pass another --data-dir"))
    except OSError as exc:
        fail(CliError("unavailable", f"cannot serve on {host}:{port}: {exc}",
                      hint=f"is another gateway or program on port {port}? pick another --port "
                           "(0: any free port)"))
    out.print("gateway stopped")
