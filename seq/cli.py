"""The ``seq`` command: run the local gateway and deploy policies to it.

    seq serve [--host 127.0.0.1] [--port 8470] [--data-dir ~/.sequence-ai]
    seq deploy FILE [--name NAME] [--class CLS] [--wait/--no-wait] [--timeout S]
    seq policy ls
    seq policy status NAME
    seq policy stop NAME        emergency stop: workers end, connects refused until `seq policy start NAME`

Commands other than serve read the API key from --api-key, then $SEQUENCES_API_KEY, then
``<data_dir>/api_key``; the gateway from --gateway, then $SEQUENCES_GATEWAY_URL, then
http://127.0.0.1:8470. A failure prints ``error[<code>]: <detail>`` and ``hint: ...`` on stderr
and exits with:

    0 success            4 not_found          7 timed out waiting
    1 failed / error     5 invalid_request
    2 usage              6 unavailable (warming, worker_failed, gateway unreachable)
    3 unauthorized
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import typer
from rich.console import Console
from rich.table import Table

__all__ = ["app", "main"]

# Under `python -m seq.cli` this module is __main__; make `from seq import cli` in the command
# modules registered below (seq/_cli_*.py) get this same module instead of importing a second copy.
if __name__ == "__main__":
    import sys as _sys
    _sys.modules.setdefault("seq.cli", _sys.modules[__name__])

DEFAULT_GATEWAY = "http://127.0.0.1:8470"
EXIT = {"unauthorized": 3, "lease_expired": 3, "not_found": 4, "invalid_request": 5, "warming": 6,
        "worker_failed": 6, "unreachable": 6, "timeout": 7}

app = typer.Typer(help="Author, serve and deploy sequence-ai policies.", no_args_is_help=True, add_completion=False)
policy_app = typer.Typer(help="Inspect and control deployments.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")

# soft_wrap: a line is never broken at the terminal width, so piped output (scripts, logs) keeps
# whole lines; tables still fit the width
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class CliError(Exception):
    def __init__(self, code: str, detail: str, hint: Optional[str] = None, request_id: Optional[str] = None,
                 extra: Optional[str] = None):
        super().__init__(detail)
        self.code, self.detail, self.hint, self.request_id, self.extra = code, detail, hint, request_id, extra


def _fail(exc: CliError) -> None:
    err.print(f"error[{exc.code}]: {exc.detail}", style="bold red", highlight=False, markup=False, soft_wrap=True)
    if exc.extra:
        err.print(exc.extra, highlight=False, markup=False, soft_wrap=True)
    if exc.hint:
        err.print(f"hint: {exc.hint}", highlight=False, markup=False, soft_wrap=True)
    if exc.request_id and exc.code in ("policy_error", "internal"):
        err.print(f"request_id: {exc.request_id}", highlight=False, markup=False)
    raise typer.Exit(EXIT.get(exc.code, 1))


def _data_dir(value: Optional[Path]) -> Path:
    if value:
        return value.expanduser()
    return Path(os.environ.get("SEQUENCES_HOME") or Path.home() / ".sequence-ai").expanduser()


class Gateway:
    """A thin httpx client for the gateway that turns error bodies into CliError."""

    def __init__(self, url: Optional[str], api_key: Optional[str], data_dir: Optional[Path]):
        self.url = (url or os.environ.get("SEQUENCES_GATEWAY_URL") or DEFAULT_GATEWAY).rstrip("/")
        self.data_dir = _data_dir(data_dir)
        key = api_key or os.environ.get("SEQUENCES_API_KEY")
        if not key:
            key_file = self.data_dir / "api_key"
            try:
                key = key_file.read_text().strip()
            except OSError:
                raise CliError("unauthorized", "no API key: none given and none found",
                               hint=f"pass --api-key, set SEQUENCES_API_KEY, or start the gateway with `seq serve` "
                                    f"(it writes {key_file})")
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30.0)

    def call(self, method: str, path: str, **kw: Any) -> dict:
        try:
            resp = self.client.request(method, path, **kw)
        except httpx.InvalidURL as exc:   # e.g. an argument too long for a URL (httpx caps one at 65536 chars)
            raise CliError("invalid_request", f"cannot send {method} {path[:60]}{'...' if len(path) > 60 else ''} "
                           f"({len(path)} chars): {str(exc)[:200]}", hint="check the argument you gave") from None
        except httpx.TransportError as exc:
            raise CliError("unreachable", f"cannot reach the gateway at {self.url} ({type(exc).__name__})",
                           hint="start it with `seq serve`, or point --gateway / SEQUENCES_GATEWAY_URL at it") from None
        try:
            body = resp.json()
        except ValueError:
            body = {"detail": resp.text[:300]}
        if resp.status_code >= 400:
            raise CliError(body.get("code") or f"http_{resp.status_code}", body.get("detail") or resp.reason_phrase,
                           hint=body.get("hint"), request_id=body.get("request_id"))
        return body


def _call(gateway: Optional[str], api_key: Optional[str], data_dir: Optional[Path], method: str, path: str,
          **kw: Any) -> dict:
    """One gateway request for a command: the JSON body, or on failure ``error[<code>]`` /
    ``hint:`` on stderr and exit with the code's status (the table above)."""
    try:
        return Gateway(gateway, api_key, data_dir).call(method, path, **kw)
    except CliError as exc:
        _fail(exc)


GatewayOpt = typer.Option(None, "--gateway", help="gateway URL (default: $SEQUENCES_GATEWAY_URL or http://127.0.0.1:8470)")
ApiKeyOpt = typer.Option(None, "--api-key", help="API key (default: $SEQUENCES_API_KEY or <data-dir>/api_key)")
DataDirOpt = typer.Option(None, "--data-dir", help="data dir (default: $SEQUENCES_HOME or ~/.sequence-ai)")


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
        _fail(CliError("invalid_request", f"unknown --backend {backend!r}", hint="use --backend local or --backend ray"))
    os.environ["SEQ_BACKEND"], os.environ["SEQ_RAY_ADDRESS"] = backend, ray_address   # read by the gateway

    from sequence_ai_server.gateway import serve as run_gateway

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    directory = _data_dir(data_dir)

    def ready(info: dict) -> None:
        out.print(f"[bold green]gateway[/] serving on {info['url']}")
        out.print(f"  data dir  {info['data_dir']}")
        out.print(f"  API key   {info['api_key_file']}  (export SEQUENCES_API_KEY=$(cat {info['api_key_file']}))")
        out.print("  Ctrl-C stops the gateway and its workers")
    try:
        run_gateway(host, port, directory, on_ready=ready)
    except OSError as exc:
        _fail(CliError("unavailable", f"cannot serve on {host}:{port}: {exc}",
                       hint="is another gateway running? pick another --port"))
    out.print("gateway stopped")


def _default_name(file: Path) -> str:
    stem = file.parent.name if file.stem in ("policy", "__init__") else file.stem
    name = "".join(c if c.isalnum() else "-" for c in stem.lower()).strip("-")
    return name or "policy"


def _show_failure(d: dict) -> CliError:
    details = d.get("details") or {}
    extra = None
    tb = details.get("remote_traceback")
    if tb:
        extra = "\n".join(tb.rstrip().splitlines()[-12:])
    elif details.get("log_tail"):
        extra = "\n".join(details["log_tail"][-12:])
    error = d.get("error") or "the worker failed"
    missing = re.search(r"no volume named '([^']+)'", error + "\n" + (extra or ""))
    if missing:     # the policy is fine; its weights were never uploaded
        hint = (f"upload the weights first: `seq volume put {missing.group(1)} DIR`, then deploy again "
                f"(`seq volume ls` lists what this gateway has)")
    else:
        hint = f"fix the policy and deploy again; `seq policy status {d['name']}` shows the error"
    return CliError("worker_failed", error, extra=extra, hint=hint)


@app.command()
def deploy(file: Path = typer.Argument(..., help="the policy file"),
           name: Optional[str] = typer.Option(None, "--name", help="deployment name (default: from the file name)"),
           class_name: Optional[str] = typer.Option(None, "--class", help="the @seq.policy class, if the file has several"),
           wait: bool = typer.Option(True, "--wait/--no-wait", help="block until the worker is ready or failed"),
           timeout: float = typer.Option(1800.0, "--timeout", help="seconds to wait with --wait"),
           dry_run: bool = typer.Option(False, "--dry-run", help="print what would be deployed (as seq validate); send nothing"),
           gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
           data_dir: Optional[Path] = DataDirOpt) -> None:
    """Register FILE with the gateway and start its worker."""
    try:
        path = file.expanduser().resolve()
        if not path.is_file():
            raise CliError("invalid_request", f"no such file: {file}", hint="give the path of a .py file with a @seq.policy class")
        if not dry_run and _declares_adapter(path):   # an adapter registers; nothing builds
            from seq._cli_adapter import deploy_adapter
            deploy_adapter(path, class_name, gateway, api_key, data_dir)
            return
        if dry_run:
            from seq._cli_author import validate_target
            validate_target(f"{path}:{class_name}" if class_name else str(path), name or _default_name(path))
            out.print("dry run: nothing was sent to the gateway")
            return
        gw = Gateway(gateway, api_key, data_dir)
        name = name or _default_name(path)
        d = gw.call("POST", "/v1/deployments", json={"name": name, "file": str(path), "class_name": class_name})
        b = d.get("build") or {}
        if b.get("status") == "building" and b.get("version") == d["version"]:
            # the gateway keeps an unchanged file's version and restarts it beside itself
            out.print(f"{name}: {path} is unchanged since v{d['version']}, so no new version; "
                      f"v{d['version']} keeps serving while a fresh worker of it starts beside it",
                      highlight=False, markup=False)
        elif b.get("status") == "building":
            out.print(f"deploying [bold]{name}[/] v{b['version']} from {path} (v{d['version']} serves until it is ready)")
        else:
            out.print(f"deploying [bold]{name}[/] v{d['version']} from {path}")
        if not wait:
            out.print(f"status: {d['status']} (seq policy status {name})")
            return
        t0 = time.monotonic()
        if (d.get("build") or {}).get("status") == "building":   # issue 5: a new version builds beside the serving one
            from seq._cli_platform import wait_build
            wait_build(gw, name, d, timeout, out, t0)
            return
        last_phase = None
        while True:
            d = gw.call("GET", f"/v1/deployments/{name}")
            if d.get("phase") != last_phase:
                last_phase = d.get("phase")
                out.print(f"  {time.monotonic() - t0:6.1f}s  {last_phase}")
            if d["status"] == "ready":
                out.print(f"[bold green]ready[/]: {name} v{d['version']} at {d['worker_url']} (load {d['load_s']:.1f} s)")
                if d.get("stopped_at"):   # a redeploy does not lift `seq policy stop`
                    out.print(f"note: {name} is stopped (`seq policy stop`): connects are refused until "
                              f"`seq policy start {name}`", markup=False, highlight=False)
                return
            if d["status"] in ("failed", "stopped"):
                raise _show_failure(d)
            if time.monotonic() - t0 > timeout:
                raise CliError("timeout", f"{name} is still {d['phase']} after {timeout:g} s",
                               hint=f"it keeps loading; watch it with `seq policy status {name}`")
            time.sleep(0.25)
    except CliError as exc:
        _fail(exc)


@policy_app.command("ls")
def policy_ls(gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """List deployments."""
    rows = _call(gateway, api_key, data_dir, "GET", "/v1/deployments")["deployments"]
    table = Table("name", "version", "status", "phase", "worker", "load s", "file")
    for d in rows:
        table.add_row(d["name"], f"v{d['version']}", d["status"], d.get("phase") or "", d.get("worker_url") or "",
                      f"{d['load_s']:.1f}" if d.get("load_s") is not None else "", d["file"])
    out.print(table)


@policy_app.command("status")
def policy_status(name: str, gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                  data_dir: Optional[Path] = DataDirOpt) -> None:
    """Show one deployment: status, worker, contract, params, and the error if it failed."""
    d = _call(gateway, api_key, data_dir, "GET", f"/v1/deployments/{name}")
    out.print(f"[bold]{d['name']}[/] v{d['version']}  status={d['status']}  phase={d.get('phase')}")
    out.print(f"  file      {d['file']}" + (f" ({d['class_name']})" if d.get("class_name") else ""))
    if d.get("worker_url"):
        out.print(f"  worker    {d['worker_url']} (pid {d.get('pid')})")
    if d.get("load_s") is not None:
        out.print(f"  load      {d['load_s']:.2f} s")
    contract = d.get("contract") or {}
    action, obs = contract.get("action"), contract.get("observation")
    if action:
        out.print(f"  action    {action['robot']} {action['action_space']} x{action['action_dim']} "
                  f"@ {action['control_frequency_hz']:g} Hz" + (" (bounded)" if action.get("bounds") else ""))
    if obs:
        cams = ", ".join(f"{v} {c['width']}x{c['height']}" + (" +depth" if c.get("depth") else "") for v, c in obs["cameras"].items())
        out.print(f"  observe   cameras: {cams or 'none'}; proprio: {obs['proprio']}; history {obs['history']}")
    for p in d.get("params") or []:
        out.print(f"  param     {p['name']}: {p['type'] or 'any'} = {p['default']!r}")
    spec = d.get("spec") or {}
    recorded = {k: v for k, v in (spec.get("resources") or {}).items() if v is not None}
    if recorded:
        out.print(f"  declared  {recorded} (recorded; not used self-hosted)")
    if d.get("stopped_at"):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d["stopped_at"]))
        out.print(f"  stopped   {when} by `seq policy stop`: connects are refused until `seq policy start {d['name']}`",
                  markup=False, highlight=False)
    sessions = d.get("sessions")
    if sessions is not None:
        out.print(f"  robots    {len(sessions)} connected" + (" (params: its own over the deployment's defaults, "
                  "as of its last lease renewal)" if sessions else ""), markup=False, highlight=False)
        for x in sessions:
            out.print(f"    {x['session_id']}  key {x['key_id'] or '-'}  v{x['version']}  params "
                      f"{json.dumps(x['params'], sort_keys=True)}", markup=False, highlight=False)
    if d.get("error"):
        err.print(f"  error     {d['error']}", markup=False, highlight=False)
    health = d.get("health") or {}
    if health:   # a worker the health check found jammed (an inference past timeouts.request)
        what = ("jammed: a fresh worker is starting" if health["state"] == "jammed"
                else f"replaced by pid {health.get('new_pid')}")
        out.print(f"  health    worker pid {health.get('pid')} {what} (an inference ran "
                  f"{health.get('oldest_request_s', 0):.1f} s; timeouts.request {health.get('request_timeout_s')} s)",
                  markup=False, highlight=False)


@policy_app.command("stop")
def policy_stop(name: str, gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """Emergency stop: every worker of NAME ends now and every connect is refused until `seq policy start NAME`."""
    d = _call(gateway, api_key, data_dir, "DELETE", f"/v1/deployments/{name}")
    out.print(f"stopped {d['name']}: its workers ended and robots are disconnected; every connect is refused "
              f"until `seq policy start {d['name']}`", highlight=False, markup=False)


# issue 5 (platform): `seq keys create/ls/revoke`, `seq account`, `seq policy rotate-secret`
from seq._cli_platform import register as _register_platform  # noqa: E402

_register_platform(app, policy_app, __import__("sys").modules[__name__])

# issue 4 (authoring): `seq validate`, `seq init`, `seq image dockerfile`
from seq._cli_author import register as _register_author  # noqa: E402

_register_author(app)

# issue 9 (evaluation): `seq eval run/status/report/ls/cancel`
from seq._cli_eval import eval_app as _eval_app  # noqa: E402

app.add_typer(_eval_app, name="eval")

# adapters: `seq adapter ls/show/pull/check` (seq deploy adapter.py registers one)
from seq._cli_adapter import adapter_app as _adapter_app  # noqa: E402
from seq._adapter import file_declares_adapter as _declares_adapter  # noqa: E402

app.add_typer(_adapter_app, name="adapter")

# issue 7 (capture): `seq policy capture`, `seq policy data export`
from seq._cli_capture import register as _register_capture  # noqa: E402

_register_capture(policy_app, __import__("sys").modules[__name__])


def main() -> None:
    app()


if __name__ == "__main__":
    main()
