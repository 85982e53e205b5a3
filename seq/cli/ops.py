"""Operations commands: scheduled scaling, usage, limits, alert webhooks and the card inventory.

    seq policy scale NAME --min N [--during "Mon-Fri 08:00-18:00"] [--tz Europe/Berlin] | --clear
    seq policy usage NAME [--since 24h | 7d | 2026-12-01]
    seq account limits [--workers N] [--cards N] [--worker-hours H] [--key KEY] [--clear LIMIT]
    seq alerts ls | add URL [--event E ...] [--error-rate 0.05] [--p95-ms 500] | rm ID | test ID
    seq gpus

``seq/cli/__init__.py`` hangs ``scale_app`` under ``seq policy``, ``limits_app`` under
``seq account``, ``alerts_app`` as ``seq alerts`` and ``gpus_app`` at the top.
"""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayOpt, call, fail, human_size, out

__all__ = ["scale_app", "alerts_app", "gpus_app", "limits_app", "parse_since", "scale_line"]

scale_app = typer.Typer()
alerts_app = typer.Typer(help="Signed webhook alerts: build failed, worker crashed, error rate, p95, quota.",
                         no_args_is_help=True)
gpus_app = typer.Typer()
limits_app = typer.Typer()


def _print(line: str) -> None:
    out.print(line, markup=False, highlight=False)


def parse_since(text: Optional[str], now: Optional[float] = None) -> float:
    """Unix s for ``--since``: ``30m``, ``24h``, ``7d`` ago, or a date ``YYYY-MM-DD`` (UTC);
    None/empty is 0 (all). Raises CliError invalid_request for anything else."""
    if not text:
        return 0.0
    now = time.time() if now is None else now
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        raise CliError("invalid_request", f"--since {text!r} is not a duration or a date",
                       hint="write e.g. 24h, 7d, 30m or 2026-12-01") from None


def scale_line(view: dict) -> Optional[str]:
    """The ``scale`` line of ``seq policy status`` for a ``GET .../scale`` body (None without one)."""
    s = view.get("scale")
    if not s:
        return None
    when = f"during {s['during']} ({s['tz']})" if s.get("during") else "always"
    state = f"open now: {s['warm_now']} kept warm" if s["active"] else "closed now: workers idle out"
    nxt = ""
    if s.get("next_change"):
        nxt = ", " + ("closes" if s["active"] else "opens") + " " + datetime.fromtimestamp(
            s["next_change"], timezone.utc).strftime("%a %Y-%m-%d %H:%M UTC")
    return f"  scale     min {s['min']} {when}; {state}{nxt}"


@scale_app.command("scale")
def policy_scale(name: str,
                 minimum: Optional[int] = typer.Option(None, "--min", help="workers to keep warm, up to the deployment's max_gpus (see docs/guides/scaling.md)"),
                 during: Optional[str] = typer.Option(None, "--during", help='weekly window, e.g. "Mon-Fri 08:00-18:00" (default: always)'),
                 tz: Optional[str] = typer.Option(None, "--tz", help="IANA time zone of the window (default UTC)"),
                 clear: bool = typer.Option(False, "--clear", help="remove the scheduled floor"),
                 gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                 data_dir: Optional[Path] = DataDirOpt) -> None:
    """Keep workers warm, always or in a weekly window; outside it they idle out as usual."""
    if not clear and minimum is None:
        fail(CliError("invalid_request", "give --min N or --clear",
                      hint='e.g. seq policy scale NAME --min 1 --during "Mon-Fri 08:00-18:00" --tz Europe/Berlin'))
    body = {"clear": True} if clear else {"min": minimum, "during": during, "tz": tz}
    view = call(gw, api_key, data_dir, "POST", f"/v1/deployments/{name}/scale", json=body)
    _print(scale_line(view) or f"  scale     none: {name} keeps min_workers={view['min_workers']} only")


@scale_app.command("usage")
def policy_usage(name: str, since: Optional[str] = typer.Option(None, "--since", help="24h, 7d, 30m or YYYY-MM-DD (default: all)"),
                 gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                 data_dir: Optional[Path] = DataDirOpt) -> None:
    """A deployment's usage: worker-seconds by card type, requests, errors, bytes, captured bytes."""
    try:
        start = parse_since(since)
    except CliError as exc:
        fail(exc)
    u = call(gw, api_key, data_dir, "GET", f"/v1/deployments/{name}/usage", params={"since": start})
    t = u["totals"]
    cards = ", ".join(f"{c} {s:.1f} s" for c, s in sorted(t["worker_s"].items())) or "none"
    _print(f"{name}: usage since {'the start' if not start else datetime.fromtimestamp(start, timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")
    _print(f"  worker-seconds  {cards}")
    _print(f"  requests        {t['requests']} ({t['errors']} errors)")
    _print(f"  bytes           in {t['bytes_in']} ({human_size(t['bytes_in'])}), out {t['bytes_out']} ({human_size(t['bytes_out'])})")
    _print(f"  captured        {u['captured_bytes']} bytes ({human_size(u['captured_bytes'])})")
    h = u.get("last_hour") or {}
    if h.get("requests"):
        _print(f"  last hour       {h['requests']} requests, error rate {h['error_rate']:.1%}, p95 {h['p95_ms']:.1f} ms")
    table = Table("hour (UTC)", "card", "worker s", "requests", "errors", "bytes in", "bytes out")
    for r in u["hours"]:
        table.add_row(datetime.fromtimestamp(r["hour"], timezone.utc).strftime("%Y-%m-%d %H:00"), r["card"],
                      f"{r['worker_s']:.1f}", str(r["requests"]), str(r["errors"]), str(r["bytes_in"]), str(r["bytes_out"]))
    if u["hours"]:
        out.print(table)


@limits_app.command("limits")
def account_limits(workers: Optional[int] = typer.Option(None, "--workers", help="most concurrent workers"),
                   cards: Optional[int] = typer.Option(None, "--cards", help="most cards held at once"),
                   worker_hours: Optional[float] = typer.Option(None, "--worker-hours", help="most worker-hours per day (UTC)"),
                   key: Optional[str] = typer.Option(None, "--key", help="a key id or name: its own limits (default: the account's)"),
                   clear: List[str] = typer.Option([], "--clear", help="max_workers, max_cards, worker_hours_per_day or all"),
                   gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                   data_dir: Optional[Path] = DataDirOpt) -> None:
    """Show or set limits; reaching one refuses new connects and builds (running sessions go on)."""
    if workers is None and cards is None and worker_hours is None and not clear:
        body = call(gw, api_key, data_dir, "GET", "/v1/account/limits")
    else:
        body = call(gw, api_key, data_dir, "POST", "/v1/account/limits",
                    json={"key": key, "max_workers": workers, "max_cards": cards,
                          "worker_hours_per_day": worker_hours, "clear": clear})
    if not body["limits"]:
        _print("no limits set")
    for lim in body["limits"]:
        parts = []
        for k, label in (("max_workers", "workers"), ("max_cards", "cards"), ("worker_hours_per_day", "worker-hours/day")):
            if lim.get(k) is not None:
                parts.append(f"{label} {lim['used'][k]:g}/{lim[k]:g}")
        _print(f"{lim['scope']:<12} {', '.join(parts) or 'none'}")


@alerts_app.command("ls")
def alerts_ls(gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt, data_dir: Optional[Path] = DataDirOpt) -> None:
    """List webhooks, their thresholds and their last deliveries."""
    hooks = call(gw, api_key, data_dir, "GET", "/v1/alerts")["webhooks"]
    if not hooks:
        _print("no webhooks; add one with `seq alerts add URL`")
    for h in hooks:
        thr = ", ".join(x for x in (f"error rate > {h['error_rate']:g}" if h.get("error_rate") is not None else "",
                                    f"p95 > {h['p95_ms']:g} ms" if h.get("p95_ms") is not None else "") if x)
        _print(f"{h['id']}  {h['url']}  events {','.join(h['events'])}"
               + (f"  deployment {h['deployment']}" if h.get("deployment") else "") + (f"  ({thr})" if thr else ""))
        for d in h.get("deliveries") or []:
            when = datetime.fromtimestamp(d["at"], timezone.utc).strftime("%H:%M:%S")
            state = f"delivered ({d['status']})" if d["delivered"] else f"FAILED: {d['error']}"
            _print(f"    {when} {d['event']:<15} {d.get('deployment') or '-':<12} {state} after {d['attempts']} attempt(s)")


@alerts_app.command("add")
def alerts_add(url: str, event: List[str] = typer.Option([], "--event", help="an event to send (repeat; default all)"),
               deployment: Optional[str] = typer.Option(None, "--deployment", help="only this deployment's events"),
               error_rate: Optional[float] = typer.Option(None, "--error-rate", help="alert when the hour's error share passes it (0.05 = 5 %)"),
               p95_ms: Optional[float] = typer.Option(None, "--p95-ms", help="alert when the hour's p95 /act time passes it (ms)"),
               min_requests: int = typer.Option(20, "--min-requests", help="requests in the hour before a rate is judged"),
               gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt, data_dir: Optional[Path] = DataDirOpt) -> None:
    """Add a webhook; its signing secret is printed once."""
    h = call(gw, api_key, data_dir, "POST", "/v1/alerts",
             json={"url": url, "events": event or None, "deployment": deployment, "error_rate": error_rate,
                   "p95_ms": p95_ms, "min_requests": min_requests})
    _print(f"added {h['id']} -> {h['url']}")
    _print(f"secret {h['secret']}")
    _print("(shown once: verify X-Seq-Signature = sha256=HMAC(secret, X-Seq-Timestamp + '.' + body))")


@alerts_app.command("rm")
def alerts_rm(hook_id: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
              data_dir: Optional[Path] = DataDirOpt) -> None:
    """Remove a webhook."""
    call(gw, api_key, data_dir, "DELETE", f"/v1/alerts/{hook_id}")
    _print(f"removed {hook_id}")


@alerts_app.command("test")
def alerts_test(hook_id: str, gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """Send one signed test delivery now; exits 1 when it was not delivered."""
    d = call(gw, api_key, data_dir, "POST", f"/v1/alerts/{hook_id}/test")
    if not d["delivered"]:
        fail(CliError("unavailable", f"the test delivery to {hook_id} failed after {d['attempts']} attempt(s): {d['error']}",
                      hint="check the URL and that the receiver answers 2xx"))
    _print(f"delivered {d['id']} to {hook_id}: {d['status']} after {d['attempts']} attempt(s)")


@gpus_app.command("gpus")
def gpus(gw: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt, data_dir: Optional[Path] = DataDirOpt) -> None:
    """The machine's cards (NVML, else nvidia-smi, else CPU; SEQ_FAKE_GPUS on the gateway fakes
    them), which worker holds each card, what each deployment holds and what is free."""
    g = call(gw, api_key, data_dir, "GET", "/v1/gpus")
    cpu = g["cpu"]
    _print(f"source      {g['source']}" + (f" ({g['error']})" if g.get("error") else ""))
    _print(f"cpu         {cpu['cores']} cores, {cpu['memory_gib']} GiB memory")
    if g["cards"]:
        table = Table("index", "type", "name", "memory MiB", "held by")
        for c in g["cards"]:
            held = ", ".join(f"{h['deployment']} ({h['role']} {h['worker']}" + (f", pid {h['pid']})" if h.get("pid") else ")")
                             for h in c.get("held_by") or []) or ("free" if "held_by" in c else "-")
            table.add_row(str(c["index"]), c["type"], c["name"], str(c["memory_mib"]), held)
        out.print(table)
        _print("free        " + ", ".join(f"{t} {n}/{g['types'][t]}" for t, n in sorted(g["free"].items())))
    else:
        _print('cards       none: gpu="cpu" (or no gpu=) is what deploys here')
    for name, h in sorted(g["held"].items()):
        held = ", ".join(f"{t} x{n}" for t, n in h["cards"].items()) or "no card"
        _print(f"held        {name}: {h['workers']} worker(s), {held}")
