"""Platform commands of the ``seq`` CLI: API keys and the account (registered by ``seq/cli.py``).

    seq keys create [--name N] [--deployment D]   prints the new key once (bind it to a robot with --deployment)
    seq keys ls                                   id, name, prefix, deployment, created, revoked
    seq keys revoke ID|NAME                       the key fails closed from then on
    seq account                                   usage and limits of this gateway's account
    seq policy rotate-secret NAME                 new direct secret; connected robots reconnect by themselves
    seq policy versions NAME                      the kept versions (5), which one serves, which failed and why
    seq policy rollback NAME [--to N]             build a kept version beside the serving one; it takes over when ready
    seq policy start NAME                         start a stopped deployment's worker
    seq policy rm NAME [--force]                  delete it (refused while it runs or robots hold sessions)
    seq policy doctor NAME                        state, version, /ping, one synthetic /act (network vs handler ms)
    seq policy params NAME [k=v ...] [--clear k]  deployment default params (new sessions at once,
                                                  connected robots at their next lease renewal)
    seq policy traffic NAME [vN=SHARE ...]        a canary split between versions; with no split, show it
        [--pin KEY vN] [--unpin KEY] [--clear]    pin a robot key to a version; --clear: all to serving
    seq policy logs NAME [--request-id R]         the gateway's and the workers' JSON log lines, merged by
        [--lines N] [--follow] [--json]           time; --follow keeps printing new ones (Ctrl-C ends)

    seq volume put NAME DIR                       upload DIR as the next version of volume NAME (resumable:
                                                  run it again after an interruption; md5 checked)
    seq volume ls [--limit N] [--cursor C]        name, state, version, size, files, used by
    seq volume rm NAME                            refused while a deployment's weights name it

Errors print ``error[<code>]: <detail>`` / ``hint:`` and exit with the codes in ``seq/cli.py``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

__all__ = ["register", "wait_build"]


_BASE = None   # the seq.cli module that registered us (it may be __main__ under `python -m seq.cli`)
FOLLOW_OVERLAP_S = 2.0   # seq policy logs --follow re-reads this much before the newest line it saw (s)


def wait_build(gw, name: str, d: dict, timeout: float, out, t0: float) -> dict:
    """Follow a version building beside the serving one until it took over (returns the
    deployment) or failed (raises the CLI's worker_failed error, saying the old version serves on)."""
    base = _BASE
    last = None
    serving = d["version"]                       # the version serving when the build began
    building = (d.get("build") or {}).get("version")
    # the same version again (an unchanged file): a fresh worker of it, not a new version
    beside = (f"a fresh v{building} worker beside the serving one" if building == serving
              else f"v{building} beside the serving v{serving}")
    while True:
        b = d.get("build") or {}
        if b.get("phase") != last:
            last = b.get("phase")
            out.print(f"  {time.monotonic() - t0:6.1f}s  {last} ({beside})")
        if b.get("status") in ("ready", "switching"):
            out.print(f"[bold green]ready[/]: {name} v{b.get('version', d['version'])} at {d['worker_url']} "
                      f"(load {d['load_s']:.1f} s)")
            return d
        if b.get("status") == "failed":
            e = base._show_failure({**d, "error": b.get("error"), "details": b.get("details")})
            e.detail = f"v{b.get('version')} failed to build; v{serving} keeps serving: {e.detail}"
            raise e
        if time.monotonic() - t0 > timeout:
            raise base.CliError("timeout", f"{name} v{b.get('version')} is still {b.get('phase')} after {timeout:g} s",
                                hint=f"it keeps building; watch it with `seq policy status {name}`")
        time.sleep(0.25)
        d = gw.call("GET", f"/v1/deployments/{name}")


def _log_line(rec: dict) -> str:
    """One JSON log record for a terminal: ``HH:MM:SS.mmm LEVEL component vN [request_id] message``."""
    t = float(rec.get("time") or 0)
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int((t % 1) * 1000):03d}"
    version = f" v{rec['version']}" if rec.get("version") else ""
    rid = f" [{rec['request_id']}]" if rec.get("request_id") else ""
    return f"{stamp} {rec.get('level', ''):7} {rec.get('component', '')}{version}{rid} {rec.get('message', '')}"


def register(app: typer.Typer, policy_app: typer.Typer, base) -> None:
    """Add the ``keys`` group, ``account`` and ``policy versions/rollback/rotate-secret`` to the CLI.
    ``base`` is the calling seq.cli module (its Gateway client, options, CliError and printer)."""
    global _BASE
    _BASE = base

    keys_app = typer.Typer(help="Create, list and revoke API keys.", no_args_is_help=True)
    app.add_typer(keys_app, name="keys")

    def gateway(gw: Optional[str], key: Optional[str], data_dir: Optional[Path]) -> "base.Gateway":
        return base.Gateway(gw, key, data_dir)

    def call(gw: Optional[str], key: Optional[str], data_dir: Optional[Path], method: str, path: str, **kw) -> dict:
        """One gateway request for a command; a failure prints ``error[<code>]`` / ``hint:`` and
        exits with the code's exit status (seq/cli.py's table)."""
        return base._call(gw, key, data_dir, method, path, **kw)

    @keys_app.command("create")
    def keys_create(name: Optional[str] = typer.Option(None, "--name", help="a label, e.g. the robot's name"),
                    deployment: Optional[str] = typer.Option(None, "--deployment",
                                                             help="bind the key to this deployment (a robot key)"),
                    gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                    data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Create a key. The plaintext is printed once, on stdout, and stored nowhere."""
        k = call(gw, api_key, data_dir, "POST", "/v1/keys", json={"name": name, "deployment": deployment})
        scope = f"bound to {k['deployment']}" if k.get("deployment") else "account-wide"
        base.err.print(f"created {k['id']}{' (' + k['name'] + ')' if k.get('name') else ''}, {scope}; "
                       "it is shown only now", highlight=False, markup=False)
        print(k["key"])

    @keys_app.command("ls")
    def keys_ls(gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """List keys (never their values)."""
        rows = call(gw, api_key, data_dir, "GET", "/v1/keys")["keys"]
        table = Table("id", "name", "prefix", "deployment", "created", "status")
        for k in rows:
            table.add_row(k["id"], k.get("name") or "", k["prefix"] + "…", k.get("deployment") or "(all)",
                          time.strftime("%Y-%m-%d %H:%M", time.localtime(k["created_at"])),
                          "revoked" if k.get("revoked_at") else "active")
        base.out.print(table)

    @keys_app.command("revoke")
    def keys_revoke(ref: str = typer.Argument(..., help="key id (key_3) or name"),
                    gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                    data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Revoke a key: every request with it is refused from now on (401)."""
        k = call(gw, api_key, data_dir, "DELETE", f"/v1/keys/{ref}")
        base.out.print(f"revoked {k['id']}{' (' + k['name'] + ')' if k.get('name') else ''}")

    @app.command("account")
    def account(gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Usage (policies, benchmarks) and configured limits of the key's account; no balance self-hosted."""
        a = call(gw, api_key, data_dir, "GET", "/v1/account")
        from sequence_ai.cli import account_lines
        for line in account_lines(a):
            base.out.print(line, highlight=False, markup=False)

    @policy_app.command("versions")
    def policy_versions(name: str, gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                        data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """List NAME's kept versions (newest first)."""
        v = call(gw, api_key, data_dir, "GET", f"/v1/deployments/{name}/versions")
        table = Table("version", "status", "serving", "load s", "created", "file / error")
        for r in v["versions"]:
            table.add_row(f"v{r['version']}", r["status"], "*" if r["serving"] else "",
                          f"{r['load_s']:.1f}" if r.get("load_s") is not None else "",
                          time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"])),
                          r.get("error") or r["file"])
        base.out.print(table)

    @policy_app.command("rollback")
    def policy_rollback(name: str, to: Optional[int] = typer.Option(None, "--to", help="version number (default: the previous one)"),
                        wait: bool = typer.Option(True, "--wait/--no-wait"), timeout: float = typer.Option(1800.0, "--timeout"),
                        gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                        data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Serve an older kept version again; it builds beside the serving one and takes over when ready."""
        try:
            g = gateway(gw, api_key, data_dir)
            d = g.call("POST", f"/v1/deployments/{name}/rollback", json={"to": to})
            b = d.get("build") or {}
            base.out.print(f"rolling {name} back to v{b.get('version', d['version'])}")
            if wait and b.get("status") == "building":
                wait_build(g, name, d, timeout, base.out, time.monotonic())
        except base.CliError as exc:
            base._fail(exc)

    @policy_app.command("start")
    def policy_start(name: str, gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                     data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Let robots connect to NAME again after `seq policy stop`, and start its worker (serving version)."""
        d = call(gw, api_key, data_dir, "POST", f"/v1/deployments/{name}/start")
        base.out.print(f"starting {d['name']} v{d['version']} (status {d['status']})")

    @policy_app.command("rm")
    def policy_rm(name: str, force: bool = typer.Option(False, "--force", help="stop it first, even with robots connected"),
                  gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                  data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Delete NAME with its kept versions."""
        call(gw, api_key, data_dir, "POST", f"/v1/deployments/{name}/remove", params={"force": force})
        base.out.print(f"removed {name}")

    @policy_app.command("rotate-secret")
    def rotate_secret(name: str, gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                      data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Give NAME's worker a new direct secret; connected robots reconnect on their next call."""
        call(gw, api_key, data_dir, "POST", f"/v1/deployments/{name}/rotate-secret")
        base.out.print(f"rotated the direct secret of {name}; connected robots reconnect on their next call")

    @policy_app.command("params")
    def policy_params(name: str,
                      assignments: Optional[list[str]] = typer.Argument(None, help="k=v defaults to set (v is JSON, else text)"),
                      clear: Optional[list[str]] = typer.Option(None, "--clear", help="drop the default of this param"),
                      gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                      data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Show or change NAME's default params without a redeploy. New sessions get them at once,
        connected robots at their next lease renewal; a robot's own params win over a default."""
        try:
            updates = {}
            for a in assignments or []:
                k, sep, v = a.partition("=")
                if not sep or not k:
                    raise base.CliError("invalid_request", f"{a!r} is not k=v", hint="e.g. seq policy params NAME chunk_len=12")
                try:
                    updates[k] = json.loads(v)
                except ValueError:
                    updates[k] = v
            g = gateway(gw, api_key, data_dir)
            if updates or clear:
                p = g.call("POST", f"/v1/deployments/{name}/params", json={"set": updates, "clear": list(clear or [])})
            else:
                p = g.call("GET", f"/v1/deployments/{name}/params")
        except base.CliError as exc:
            base._fail(exc)
        table = Table("param", "type", "declared default", "deployment default")
        for d in p["declared"]:
            table.add_row(d["name"], str(d.get("type", "")), json.dumps(d.get("default")),
                          json.dumps(p["defaults"][d["name"]]) if d["name"] in p["defaults"] else "")
        base.out.print(table)

    @policy_app.command("traffic")
    def policy_traffic(name: str,
                       split: Optional[list[str]] = typer.Argument(None, help="vN=SHARE pairs (v5=10 v4=90); "
                                                                   "with --pin, the one version to pin to"),
                       pin: Optional[str] = typer.Option(None, "--pin", help="a robot key (bound to NAME) to pin: --pin arm-7 v5"),
                       unpin: Optional[str] = typer.Option(None, "--unpin", help="let this key follow the split again"),
                       clear: bool = typer.Option(False, "--clear", help="drop the split and pins: all to the serving version"),
                       gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                       data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Split new sessions between NAME's versions (a canary), pin a robot key to one, or show
        the split. A session keeps the version it started on for all its lease renewals."""
        path = f"/v1/deployments/{name}/traffic"
        try:
            if pin is not None:
                if len(split or []) != 1:
                    raise base.CliError("invalid_request", "--pin takes a key and one version",
                                        hint=f"seq policy traffic {name} --pin arm-7 v5")
                body: Optional[dict] = {"pin": pin, "version": split[0]}
            elif unpin is not None or clear:
                if split:
                    raise base.CliError("invalid_request", "--unpin/--clear take no split",
                                        hint=f"seq policy traffic {name} --clear")
                body = {"unpin": unpin} if unpin is not None else {"clear": True}
            elif split:
                shares = {}
                for item in split:
                    v, sep, share = item.partition("=")
                    if not sep or not v:
                        raise base.CliError("invalid_request", f"{item!r} is not vN=SHARE",
                                            hint=f"e.g. seq policy traffic {name} v5=10 v4=90")
                    shares[v] = share
                body = {"split": shares}
            else:
                body = None
        except base.CliError as exc:
            base._fail(exc)
        t = call(gw, api_key, data_dir, "GET", path) if body is None else call(gw, api_key, data_dir, "POST", path, json=body)
        table = Table("version", "share", "sessions", "worker")
        if t["split"]:
            for r in t["split"]:
                table.add_row(f"v{r['version']}", f"{r['share_pct']:g} %", str(r["sessions"]), r["worker"])
        else:
            table.add_row(f"v{t['serving']}", "100 %", "", "serving")
        base.out.print(table)
        for p in t["pins"]:
            base.out.print(f"pinned  {p['key_name'] or p['key']} -> v{p['version']} ({p['worker']})",
                           highlight=False, markup=False)

    @policy_app.command("logs")
    def policy_logs(name: str,
                    request_id: Optional[str] = typer.Option(None, "--request-id", "--rid",
                                                             help="only this request's lines (the request_id of an error)"),
                    lines: int = typer.Option(200, "--lines", "-n", help="how many of the newest lines"),
                    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines"),
                    as_json: bool = typer.Option(False, "--json", help="print the JSON objects as stored"),
                    interval: float = typer.Option(0.5, "--interval", hidden=True),
                    gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                    data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Print NAME's structured log: the gateway's lines about it and its workers' lines, oldest
        first. Each line: time, level, component, version, [request_id], message."""
        def show(recs: list) -> None:
            for rec in recs:
                print(json.dumps(rec) if as_json else _log_line(rec), flush=True)

        params = {"lines": lines, **({"request_id": request_id} if request_id else {})}
        path = f"/v1/deployments/{name}/logs"
        recs = call(gw, api_key, data_dir, "GET", path, params=params)["lines"]
        show(recs)
        if request_id and not recs and not follow:   # like grep: nothing matched is a non-zero exit
            base.err.print(f"no log lines of {name} carry request id {request_id}", highlight=False, markup=False)
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

    volume_app = typer.Typer(help="Upload weights once as a named, versioned volume (weights=\"vol://NAME@vN\").",
                             no_args_is_help=True)
    app.add_typer(volume_app, name="volume")

    @volume_app.command("put")
    def volume_put(name: str, directory: Path = typer.Argument(..., help="the directory to upload"),
                   chunk_mb: float = typer.Option(8.0, "--chunk-mb", help="MiB per request (the gateway takes 32)"),
                   gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                   data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Upload DIR as the next version of volume NAME. Every file's md5 is checked before the
        version becomes active; an interrupted put resumes when run again with the same files."""
        import hashlib
        root = directory.expanduser()
        if not root.is_dir():
            base._fail(base.CliError("invalid_request", f"{directory} is not a directory",
                                     hint="seq volume put NAME ./checkpoints/NAME"))
        files = []
        for p in sorted(x for x in root.rglob("*") if x.is_file()):
            h = hashlib.md5()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            files.append({"path": p.relative_to(root).as_posix(), "size": p.stat().st_size, "md5": h.hexdigest()})
        if not files:
            base._fail(base.CliError("invalid_request", f"{directory} holds no files", hint="point at a checkpoint directory"))
        g = gateway(gw, api_key, data_dir)
        step = max(1, int(chunk_mb * 1024 * 1024))
        try:
            up = g.call("POST", f"/v1/volumes/{name}/uploads", json={"files": files})
            v, sent = up["version"], 0
            if up["resumed"]:
                base.err.print(f"resuming the upload of {name} v{v}", highlight=False, markup=False)
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
        except base.CliError as exc:
            base._fail(exc)
        base.out.print(f"uploaded {name} v{d['version']}: {d['files']} files, {d['size']} bytes ({sent} sent), "
                       f"md5 verified; use weights=\"{d['uri']}\"", highlight=False, markup=False)

    @volume_app.command("ls")
    def volume_ls(limit: int = typer.Option(50, "--limit"), cursor: Optional[str] = typer.Option(None, "--cursor"),
                  gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                  data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """List volumes: name, state, newest version, size, files, and the deployments using it."""
        page = call(gw, api_key, data_dir, "GET", "/v1/volumes", params={"limit": limit, **({"cursor": cursor} if cursor else {})})
        table = Table("name", "state", "version", "size", "files", "versions", "used by")
        for r in page["volumes"]:
            table.add_row(r["name"], r["state"], f"v{r['version']}", str(r["size"]), str(r["files"]),
                          ", ".join(f"v{x}" for x in r["versions"]), ", ".join(r["used_by"]))
        base.out.print(table)
        if page.get("next_cursor"):
            base.out.print(f"more: --cursor {page['next_cursor']}", highlight=False, markup=False)

    @volume_app.command("rm")
    def volume_rm(name: str, gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                  data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Delete volume NAME (every version); refused while a deployment's weights name it."""
        call(gw, api_key, data_dir, "DELETE", f"/v1/volumes/{name}")
        base.out.print(f"removed volume {name}")

    secret_app = typer.Typer(help="Store secrets (encrypted at rest) that policies declare with seq.Secret.from_name.",
                             no_args_is_help=True)
    app.add_typer(secret_app, name="secret")

    @secret_app.command("set")
    def secret_set(name: str, env: list[str] = typer.Option(..., "--env", help="a variable name; repeat for more"),
                   gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                   data_dir: Optional[Path] = base.DataDirOpt) -> None:
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
                        raise base.CliError("invalid_request", f"stdin ended before the value of {var}",
                                            hint="send one line per --env, in order")
                    values[var] = line.rstrip("\r\n")
            s = gateway(gw, api_key, data_dir).call("PUT", f"/v1/secrets/{name}", json={"env": values})
        except base.CliError as exc:
            base._fail(exc)
        base.out.print(f"stored secret {s['name']} ({', '.join(s['env'])})", highlight=False, markup=False)

    @secret_app.command("ls")
    def secret_ls(gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                  data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """List secrets: names and variable names, never values."""
        rows = call(gw, api_key, data_dir, "GET", "/v1/secrets")["secrets"]
        table = Table("name", "variables", "updated")
        for r in rows:
            table.add_row(r["name"], ", ".join(r["env"]), time.strftime("%Y-%m-%d %H:%M", time.localtime(r["updated_at"])))
        base.out.print(table)

    @secret_app.command("rm")
    def secret_rm(name: str, gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                  data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Delete secret NAME (workers already running keep their environment)."""
        call(gw, api_key, data_dir, "DELETE", f"/v1/secrets/{name}")
        base.out.print(f"removed secret {name}")

    @policy_app.command("doctor")
    def policy_doctor(name: str, gw: Optional[str] = base.GatewayOpt, api_key: Optional[str] = base.ApiKeyOpt,
                      data_dir: Optional[Path] = base.DataDirOpt) -> None:
        """Diagnose NAME: state, serving version, the worker's /ping and one synthetic /act split
        into network and handler time. Never starts a worker. Exits 0 when the /act answered,
        also when the policy refused the synthetic input (400: printed, not a fault) or the
        deployment is stopped; 1 when the /act failed (5xx or no response: the typed error's code,
        detail and hint are printed) or the deployment failed."""
        d = call(gw, api_key, data_dir, "GET", f"/v1/deployments/{name}/doctor")
        o = base.out
        o.print(f"deployment  {d['name']} v{d['version']}: {d['status']} ({d['phase']}), {d['sessions']} sessions",
                highlight=False, markup=False)
        if d.get("error"):
            o.print(f"error       {d['error']}", highlight=False, markup=False)
        w = d.get("worker")
        if not w:
            o.print("worker      none running (doctor does not start one; `seq policy start` does)")
            if d["status"] == "failed":
                raise typer.Exit(1)     # a deployment whose worker failed does not serve
            return
        ping = w.get("ping") or {}
        state = f" {ping['state']}" if ping.get("state") else ""
        if ping.get("state") == "degraded":
            state += f" (an inference has run {ping.get('oldest_request_s', 0):.1f} s; no synthetic /act sent)"
        o.print(f"ping        {ping.get('status')}{state} in {ping.get('ms', 0):.1f} ms" if ping.get("status") else
                f"ping        failed: {ping.get('error')}", highlight=False, markup=False)
        health = d.get("health") or {}
        if health:
            o.print(f"health      pid {health.get('pid')} {health['state']}"
                    + (f", now pid {health.get('new_pid')}" if health.get("new_pid") else ""), highlight=False, markup=False)
        act = w.get("act")
        if act and act.get("status") == 200:
            o.print(f"act         {act['total_ms']:.1f} ms = network {act['network_ms']:.1f} ms + handler "
                    f"{act['handler_ms']:.1f} ms (request_id {act['request_id']})", highlight=False, markup=False)
        elif act and act.get("status") == 400:
            # the policy's own check refused the synthetic input: the deployment itself works
            o.print(f"act         refused by the policy: error[{act.get('code') or 'invalid_request'}] (400): "
                    f"{act.get('detail') or act.get('error')}", highlight=False, markup=False, soft_wrap=True)
            if act.get("hint"):
                o.print(f"            hint: {act['hint']}", highlight=False, markup=False, soft_wrap=True)
            o.print("            not a broken deployment: doctor sends black frames and zero vectors, which this "
                    "policy refuses; a real robot's observation may pass", highlight=False, markup=False, soft_wrap=True)
        elif act:
            status = act.get("status")
            o.print(f"act         failed: error[{act.get('code') or 'unreachable'}] "
                    f"({status if status else 'no response'}): {act.get('detail') or act.get('error')}",
                    highlight=False, markup=False, soft_wrap=True)
            if act.get("hint"):
                o.print(f"            hint: {act['hint']}", highlight=False, markup=False, soft_wrap=True)
            if act.get("request_id"):
                o.print(f"            request_id: {act['request_id']} (`seq policy logs {d['name']} "
                        f"--request-id {act['request_id']}`)", highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(1)     # a 5xx or a transport failure: the deployment does not serve
