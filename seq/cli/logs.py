"""``seq policy logs``: the gateway's and the workers' JSON log lines about one deployment,
merged by time.

    seq policy logs NAME [--request-id R] [--lines N] [--follow] [--json]
    seq policy logs NAME --build      the image environment build output, as seq deploy showed it
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from ._client import ApiKeyOpt, DataDirOpt, GatewayOpt, call, err

__all__ = ["app"]

app = typer.Typer()

FOLLOW_OVERLAP_S = 2.0   # seq policy logs --follow re-reads this much before the newest line it saw (s)


def _log_line(rec: dict) -> str:
    """One JSON log record for a terminal: ``HH:MM:SS.mmm LEVEL component vN [request_id] message``."""
    t = float(rec.get("time") or 0)
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"
    version = f" v{rec['version']}" if rec.get("version") else ""
    rid = f" [{rec['request_id']}]" if rec.get("request_id") else ""
    return f"{stamp} {rec.get('level', ''):7} {rec.get('component', '')}{version}{rid} {rec.get('message', '')}"


@app.command("logs")
def policy_logs(name: str,
                request_id: Optional[str] = typer.Option(None, "--request-id", "--rid",
                                                         help="only this request's lines (the request_id of an error)"),
                lines: int = typer.Option(200, "--lines", "-n", help="how many of the newest lines"),
                follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines"),
                as_json: bool = typer.Option(False, "--json", help="print the JSON objects as stored"),
                build: bool = typer.Option(False, "--build", help="print the image environment build output instead"),
                interval: float = typer.Option(0.5, "--interval", hidden=True),
                gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """Print NAME's structured log: the gateway's lines about it and its workers' lines, oldest
    first. Each line: time, level, component, version, [request_id], message."""
    def show(recs: list) -> None:
        for rec in recs:
            print(json.dumps(rec) if as_json else _log_line(rec), flush=True)

    if build:
        offset, text = 0, ""
        while True:                      # 1 MiB a request
            got = call(gw, api_key, data_dir, "GET", f"/v1/deployments/{name}/build-log", params={"offset": offset})
            print(got["text"], end="", flush=True)
            text, offset = text + got["text"][-1:], got["offset"]
            if offset >= got["size"] or not got["text"]:
                break
        if text and not text.endswith("\n"):
            print()
        if not text:
            err.print(f"{name} has no image build output (it declares no image=, or it was never built)",
                      highlight=False, markup=False)
        return
    params = {"lines": lines, **({"request_id": request_id} if request_id else {})}
    path = f"/v1/deployments/{name}/logs"
    recs = call(gw, api_key, data_dir, "GET", path, params=params)["lines"]
    show(recs)
    if request_id and not recs and not follow:   # like grep: nothing matched is a non-zero exit
        err.print(f"no log lines of {name} carry request id {request_id}", highlight=False, markup=False)
        raise typer.Exit(1)
    # --follow asks again for lines since a little before the newest one seen (the gateway's and
    # the workers' files are merged by time, so a line stamped earlier can be written later) and
    # skips what it already printed.
    def key(rec: dict) -> tuple:
        return (rec.get("time"), rec.get("pid"), rec.get("component"), rec.get("message"))

    seen = {key(r) for r in recs}
    last = recs[-1]["time"] if recs else time.time() - 1.0
    floor = last            # the tail above ends here: nothing older is printed later
    try:
        while follow:
            time.sleep(interval)
            recs = call(gw, api_key, data_dir, "GET", path,
                        params={**params, "lines": 10000, "since": last - FOLLOW_OVERLAP_S})["lines"]
            fresh = [r for r in recs if r["time"] > floor and key(r) not in seen]
            show(fresh)
            seen.update(key(r) for r in fresh)
            if recs:
                last = max(last, recs[-1]["time"])
                seen = {k for k in seen if k[0] is None or k[0] >= last - 2 * FOLLOW_OVERLAP_S}
    except KeyboardInterrupt:
        pass
