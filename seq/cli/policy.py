"""``seq policy``: inspect and control deployments.

    seq policy ls
    seq policy status NAME
    seq policy stop NAME                          emergency stop: workers end, connects refused until `seq policy start NAME`
    seq policy start NAME                         start a stopped deployment's worker
    seq policy rm NAME [--force]                  delete it (refused while it runs or robots hold sessions)
    seq policy rotate-secret NAME                 new direct secret; connected robots reconnect by themselves
    seq policy params NAME [k=v ...] [--clear k]  deployment default params (new sessions at once,
                                                  connected robots at their next lease renewal)
    seq policy doctor NAME                        state, version, /ping, one synthetic /act (network vs handler ms)

``seq/cli/__init__.py`` adds the other ``seq policy`` commands (versions, rollback, traffic,
logs, capture, data export) from their own modules.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, call, err, fail, out

__all__ = ["app"]

app = typer.Typer(help="Inspect and control deployments.", no_args_is_help=True)


@app.command("ls")
def policy_ls(gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """List deployments."""
    rows = call(gateway, api_key, data_dir, "GET", "/v1/deployments")["deployments"]
    table = Table("name", "version", "status", "phase", "worker", "load s", "file")
    for d in rows:
        table.add_row(d["name"], f"v{d['version']}", d["status"], d.get("phase") or "", d.get("worker_url") or "",
                      f"{d['load_s']:.1f}" if d.get("load_s") is not None else "", d["file"])
    out.print(table)


@app.command("status")
def policy_status(name: str, gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                  data_dir: Optional[Path] = DataDirOpt) -> None:
    """Show one deployment: status, worker, contract, params, and the error if it failed."""
    d = call(gateway, api_key, data_dir, "GET", f"/v1/deployments/{name}")
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
        delay = action.get("delay") or {}
        limit = delay.get("max_delay_steps")
        out.print(f"  delay     modes {', '.join(delay.get('modes') or ['chunk'])}; "
                  + ("no declared limit" if limit is None else f"max {limit} steps"))
    if obs:
        cams = ", ".join(f"{v} {c['width']}x{c['height']}" + (" +depth" if c.get("depth") else "") for v, c in obs["cameras"].items())
        out.print(f"  observe   cameras: {cams or 'none'}; proprio: {obs['proprio']}; history {obs['history']}")
    for p in d.get("params") or []:
        out.print(f"  param     {p['name']}: {p['type'] or 'any'} = {p['default']!r}")
    spec = d.get("spec") or {}
    recorded = {k: v for k, v in (spec.get("resources") or {}).items() if v is not None}
    if recorded:
        out.print(f"  declared  {recorded}", markup=False, highlight=False)
    workers = d.get("workers") or []
    if workers:   # each worker serving this version: its cards, slots and robots
        cap = workers[0].get("max_workers")
        out.print(f"  workers   {len(workers)}" + (f" of at most {cap}" if cap else "")
                  + " (another starts when every slot is taken; idle ones stop one at a time)",
                  markup=False, highlight=False)
        for w in workers:
            cards = ",".join(map(str, w.get("cards") or [])) or "cpu"
            slots = w.get("slots") or {}
            state = "ready" if w.get("ready") else "loading"
            node = f"  node {w['node'][:8]}" if w.get("node") else ""     # a Ray cluster's machine
            out.print(f"    {w['worker']}  pid {w.get('pid')}  {state}{node}  card {cards}  slots "
                      f"{slots.get('used', 0)}/{slots.get('total', 1)}  robots {', '.join(w.get('robots') or []) or '-'}",
                      markup=False, highlight=False)
            line = _admission_line(w)
            if line:
                out.print(f"      {line}", markup=False, highlight=False)
    from .ops import scale_line
    line = scale_line(call(gateway, api_key, data_dir, "GET", f"/v1/deployments/{name}/scale"))
    if line:
        out.print(line, markup=False, highlight=False)
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


def _admission_line(w: dict) -> str:
    """One worker's measured cost and admission numbers (GET /v1/deployments/{name} ``workers``)."""
    adm = w.get("admission") or {}
    if not adm:
        return ""
    parts = [f"mean batch {w['mean_batch']:g}" if w.get("mean_batch") is not None else "mean batch -",
             f"/act p99 {w['act_p99_ms']:g} ms (worker-side, all its robots)" if w.get("act_p99_ms") is not None
             else "/act p99 -"]
    robots = w.get("robot_p99_ms") or {}
    if robots:             # each robot's own p99 on the worker (queued to answered): the worst and the median
        worst = max(robots, key=robots.get)
        mid = sorted(robots.values())[len(robots) // 2]
        parts.append(f"robot p99 worst {robots[worst]:g} ms ({worst}), median {mid:g} ms over {len(robots)} robots")
    late = w.get("deadlines") or {}
    if late.get("requests"):
        parts.append(f"late {late.get('late', 0)} of {late['requests']} requests with a deadline")
    cap = adm.get("cap")
    cap_s = f" of at most {cap}" if cap and cap < 1_000_000 else ""
    if adm.get("measured") and adm.get("worst_ms") is not None:
        parts.append(f"admitted {adm['robots']}{cap_s} robots asking {adm['rate_hz']:g} requests/s: predicted worst "
                     f"round trip {adm['worst_ms']:g} ms of {adm['budget_ms']:g} ms allowed, utilisation "
                     f"{adm['utilisation']:.0%}")
    elif adm.get("measured"):
        parts.append(f"admitted {adm.get('robots', 0)}{cap_s} robots (cost measured)")
    else:
        parts.append(f"admitted {adm.get('robots', 0)}{cap_s} robots by slot count (no cost measured yet)")
    if w.get("jammed"):
        parts.append(f"replaced a jammed worker pid {w['jammed'].get('pid')} ({w['jammed'].get('reason')})")
    return "  ".join(parts)


@app.command("stop")
def policy_stop(name: str, gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """Emergency stop: every worker of NAME ends now and every connect is refused until `seq policy start NAME`."""
    d = call(gateway, api_key, data_dir, "DELETE", f"/v1/deployments/{name}")
    out.print(f"stopped {d['name']}: its workers ended and robots are disconnected; every connect is refused "
              f"until `seq policy start {d['name']}`", highlight=False, markup=False)


@app.command("start")
def policy_start(name: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                 data_dir: Optional[Path] = DataDirOpt) -> None:
    """Let robots connect to NAME again after `seq policy stop`, and start its worker (serving version)."""
    d = call(gw, api_key, data_dir, "POST", f"/v1/deployments/{name}/start")
    out.print(f"starting {d['name']} v{d['version']} (status {d['status']})")


@app.command("rm")
def policy_rm(name: str, force: bool = typer.Option(False, "--force", help="stop it first, even with robots connected"),
              gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """Delete NAME with its kept versions."""
    call(gw, api_key, data_dir, "POST", f"/v1/deployments/{name}/remove", params={"force": force})
    out.print(f"removed {name}")


@app.command("rotate-secret")
def rotate_secret(name: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                  data_dir: Optional[Path] = DataDirOpt) -> None:
    """Give NAME's worker a new direct secret; connected robots reconnect on their next call."""
    call(gw, api_key, data_dir, "POST", f"/v1/deployments/{name}/rotate-secret")
    out.print(f"rotated the direct secret of {name}; connected robots reconnect on their next call")


@app.command("params")
def policy_params(name: str,
                  assignments: Optional[list[str]] = typer.Argument(None, help="k=v defaults to set (v is JSON, else text)"),
                  clear: Optional[list[str]] = typer.Option(None, "--clear", help="drop the default of this param"),
                  gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                  data_dir: Optional[Path] = DataDirOpt) -> None:
    """Show or change NAME's default params without a redeploy. New sessions get them at once,
    connected robots at their next lease renewal; a robot's own params win over a default."""
    try:
        updates = {}
        for a in assignments or []:
            k, sep, v = a.partition("=")
            if not sep or not k:
                raise CliError("invalid_request", f"{a!r} is not k=v", hint="e.g. seq policy params NAME chunk_len=12")
            try:
                updates[k] = json.loads(v)
            except ValueError:
                updates[k] = v
        g = GatewayClient(gw, api_key, data_dir)
        if updates or clear:
            p = g.call("POST", f"/v1/deployments/{name}/params", json={"set": updates, "clear": list(clear or [])})
        else:
            p = g.call("GET", f"/v1/deployments/{name}/params")
    except CliError as exc:
        fail(exc)
    table = Table("param", "type", "declared default", "deployment default")
    for d in p["declared"]:
        table.add_row(d["name"], str(d.get("type", "")), json.dumps(d.get("default")),
                      json.dumps(p["defaults"][d["name"]]) if d["name"] in p["defaults"] else "")
    out.print(table)


@app.command("doctor")
def policy_doctor(name: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                  data_dir: Optional[Path] = DataDirOpt) -> None:
    """Diagnose NAME: state, serving version, the worker's /ping and one synthetic /act split
    into network and handler time. Never starts a worker. Exits 0 when the /act answered,
    also when the policy refused the synthetic input (400: printed, not a fault) or the
    deployment is stopped; 1 when the /act failed (5xx or no response: the typed error's code,
    detail and hint are printed) or the deployment failed."""
    d = call(gw, api_key, data_dir, "GET", f"/v1/deployments/{name}/doctor")
    o = out
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
