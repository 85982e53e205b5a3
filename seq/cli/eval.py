"""``seq eval``: score a deployed policy on a simulated benchmark.

    seq eval run POLICY --benchmark NAME [--adapter NAME[@vN]|FILE.py[:CLASS]] [--envs N] [--episodes K]
                 [--tasks N|a,b] [--seed S]
                 [--param k=v]... [--sweep k=a,b]... [--compare OTHER]... [--gate success>=0.9]...
                 [--videos] [--realtime] [--dry-run]
    seq eval status ID
    seq eval report ID [--csv PATH|-]
    seq eval ls [POLICY] [--limit N]
    seq eval cancel ID

The runner lives in ``sequence_ai_eval``; evals are kept under ``<data_dir>/evals``.
Exit codes are the ``seq`` command's (see ``seq.cli._client``), plus 5 for a contract mismatch and
8 when ``--gate`` finds a metric below its bar.
"""
from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from ._client import EXIT, ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, data_dir_of, err, out
from ._client import fail as _fail_cli

__all__ = ["app"]

app = typer.Typer(help="Score deployed policies on simulated benchmarks.", no_args_is_help=True)

GATE_EXIT = 8
_EXIT = {"contract_mismatch": 5, "gate_failed": GATE_EXIT, "canceled": 1, "failed": 1}


def _fail(code: str, detail: str, hint: Optional[str] = None) -> None:
    """Print ``error[code]: detail`` (+ hint) on stderr and exit with the code's number."""
    err.print(f"error[{code}]: {detail}", style="bold red", highlight=False, markup=False, soft_wrap=True)
    if hint:
        err.print(f"hint: {hint}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(_EXIT.get(code, EXIT.get(code, 1)))


def _say(text: str = "") -> None:
    out.print(text, highlight=False, markup=False, soft_wrap=True)


def _store(data_dir: Optional[Path]):
    from sequence_ai_data.evals import EvalStore
    return EvalStore(data_dir_of(data_dir))


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def _params_line(arm: dict) -> str:
    parts = []
    defaults = arm.get("defaults") or {}
    for scope in ("policy", "benchmark", "adapter", "eval"):
        if "params" in arm:
            given = arm["params"].get(scope) or {}
        else:
            given = arm.get(f"{scope}_params" if scope != "benchmark" else "bench_params") or {}
        items = {**{k.split(".", 1)[1]: v for k, v in defaults.items() if k.startswith(scope + ".")}, **given}
        for k, v in items.items():
            mark = " (default)" if f"{scope}.{k}" in defaults else ""
            parts.append(f"{scope}.{k}={v!r}{mark}")
    return ", ".join(parts) or "none"


def _print_report(report: dict, gates: Optional[list] = None) -> None:
    _say(f"report {report['id']}: benchmark {report['benchmark']}, {len(report['tasks'])} task(s) x "
         f"{report['episodes_per_task']} episode(s), seeds {report['seeds'][0]}..{report['seeds'][-1]}, "
         f"{report['envs']} env(s), {report['loop']} loop")
    if report.get("adapter"):
        ad = report["adapter"]
        lossy = report.get("adapter_lossy") or []
        _say(f"adapter {ad['name']}@v{ad['version']}: " + (f"lossy ({len(lossy)} step(s))" if lossy else "lossless"))
        for item in lossy:
            _say(f"  lossy    {item['kind']} step {item['method']}: {item['reason']}")
    for arm in report["arms"]:
        version = f" v{arm['version']}" if arm.get("version") is not None else ""
        _say()
        _say(f"arm {arm['name']} (policy {arm['policy']}{version}): {arm['episodes']} episode(s), "
             f"{arm['errors']} error(s), {_fmt(arm['wall_s_per_episode'])} s wall per episode")
        _say(f"  params   {_params_line(arm)}")
        names = list(arm["metrics"])
        width = max([len("task")] + [len(t) for t in report["tasks"]]) + 2
        _say("  " + "task".ljust(width) + "episodes".rjust(9) + "".join(n.rjust(max(12, len(n) + 2)) for n in names))
        rows = [("all", arm["metrics"], None)] + [(t, arm["metrics"], t) for t in report["tasks"]]
        for label, metrics, task in rows:
            first = metrics[names[0]] if names else None
            n = (first["episodes"] if task is None else first["per_task"][task]["episodes"]) if first else 0
            cells = []
            for name in names:
                m = metrics[name]
                value = m["overall"] if task is None else m["per_task"][task]["value"]
                cells.append(_fmt(value).rjust(max(12, len(name) + 2)))
            _say("  " + label.ljust(width) + str(n).rjust(9) + "".join(cells))
        for message in arm.get("error_messages") or []:
            _say(f"  error    {message}")
        if arm["videos"]:
            _say(f"  videos   {len(arm['videos'])} in {Path(arm['videos'][0]).parent.parent}")
            for v in arm["videos"]:
                _say(f"           {v}")
    for g in gates or []:
        verdict = "PASS" if g["passed"] else "FAIL"
        why = f" ({g['errors']} errored episode(s))" if g["errors"] else ""
        _say(f"gate {g['gate']} on {g['arm']}: {_fmt(g['value'])} {verdict}{why}")


def _csv_text(report: dict) -> str:
    names: list = []
    for arm in report["arms"]:
        names += [n for n in arm["metrics"] if n not in names]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["eval", "arm", "policy", "task", "episodes", *names])
    for arm in report["arms"]:
        for task in [None, *report["tasks"]]:
            row = [report["id"], arm["name"], arm["policy"], task or "all"]
            first = arm["metrics"].get(names[0]) if names else None
            row.append((first["episodes"] if task is None else first["per_task"][task]["episodes"]) if first else 0)
            for n in names:
                m = arm["metrics"].get(n)
                v = None if m is None else (m["overall"] if task is None else m["per_task"][task]["value"])
                row.append("" if v is None else repr(float(v)))
            w.writerow(row)
    return buf.getvalue()


def _deployments(gw: GatewayClient, names: List[str]) -> dict:
    """Each deployment's gateway record by name.

    Raises:
        CliError: ``worker_failed`` for a deployment that failed to deploy; the gateway's errors.
    """
    deployments = {}
    for name in names:
        d = gw.call("GET", f"/v1/deployments/{name}")
        if d.get("status") == "failed":
            raise CliError("worker_failed", f"{name} failed to deploy: {d.get('error')}",
                           hint=f"`seq policy status {name}` shows why; deploy it again")
        deployments[name] = d
    return deployments


def _adapter_record(gw: GatewayClient, adapter: Optional[str]) -> Optional[dict]:
    """The registered adapter ``NAME[@vN]`` or ``FILE.py[:CLASS]`` (registered first); None without one.

    Raises:
        CliError: ``not_found`` for an unknown adapter, ``invalid_request`` for a file that fails
            to import or declare.
    """
    if not adapter:
        return None
    from seq._adapter_registry import resolve as _resolve_adapter
    try:
        return _resolve_adapter(gw, adapter)
    except (FileNotFoundError, LookupError) as exc:
        raise CliError("not_found", str(exc), hint="`seq adapter ls` lists the registered adapters")
    except Exception as exc:  # noqa: BLE001 - a local file that fails to import or declare
        raise CliError("invalid_request", f"adapter {adapter}: {type(exc).__name__}: {exc}",
                       hint=f"`seq adapter check {adapter}` shows the declaration")


def _past_episode_s(store, benchmark: str, loop: str) -> list:
    """Wall seconds of up to ~200 earlier error-free episodes of BENCHMARK in LOOP (the estimate's input)."""
    past = []
    for rec in store.all():
        if rec.get("benchmark") == benchmark and rec.get("status") == "done" and rec.get("loop") == loop:
            past += [e["wall_s"] for e in store.episodes(rec["id"]) if e.get("wall_s") and not e.get("error")]
        if len(past) >= 200:
            break
    return past


def _print_plan(plan, spec, ref: str, loop: str, arms: list, seed: int, policy: str, gates: list,
                dry_run: bool) -> None:
    """The layout of an eval before it runs: benchmark, tasks, episodes, adapter, arms, estimate, gates."""
    _say(("dry run: nothing started\n" if dry_run else "") +
         f"benchmark  {spec.name} ({ref}), {loop} loop")
    _say(f"tasks      {len(plan.tasks)} of {len(spec.tasks)}: {', '.join(plan.tasks)}")
    _say(f"episodes   {plan.episodes} per task and arm, seeds {seed}..{seed + plan.episodes - 1}")
    if plan.adapter:
        ad = plan.adapter
        _say(f"adapter    {ad['name']}@v{ad['version']} ({ad.get('policy_io')}), "
             + (f"lossy: {len(ad['lossy'])} step(s)" if ad.get("lossy") else "lossless"))
        for item in ad.get("lossy") or []:
            _say(f"  lossy    {item['kind']} step {item['method']}: {item['reason']}")
    _say(f"arms       {len(arms)}")
    for a in arms:
        version = f" v{a['version']}" if a.get("version") is not None else ""
        _say(f"  {a['name']} (policy {a['policy']}{version}): {_params_line(a)}")
    n_env = min(plan.envs, plan.total_episodes)
    _say(f"layout     {plan.total_episodes} episodes over {n_env} env process(es) on this machine "
         f"({os.cpu_count()} cores); policies on their deployed workers")
    _say(f"estimate   ~{plan.estimate_wall_s():.0f} s wall-clock ({plan.estimate_episode_s:.1f} s per episode per env; "
         f"{plan.estimate_source})")
    if gates:
        _say(f"gates      {', '.join(str(g) for g in gates)} (on {policy})")


def _progress(ep: dict, done: int, total: int) -> None:
    """One line per finished episode: its metrics, or its error."""
    if ep.get("error"):
        what = f"ERROR {ep['error']}"
    else:
        what = " ".join(f"{k}={_fmt(v)}" for k, v in ep["metrics"].items())
    _say(f"  [{done}/{total}] {ep['arm']} {ep['task']} seed {ep['seed']}: {what} ({ep['wall_s']:.1f} s)")


def _verdict(record: dict, results: list, eval_id: str) -> None:
    """Exit non-zero for an eval that was canceled, failed, measured nothing, or missed a gate."""
    if record["status"] == "canceled":
        _fail("canceled", f"eval {eval_id} was canceled after {record['done_episodes']} episode(s)")
    if record["status"] == "failed":
        _fail("failed", f"eval {eval_id} failed: {record.get('error')}")
    scoreless = [a for a in record["report"]["arms"] if a["errors"] and a["errors"] >= a["episodes"]]
    if scoreless:       # nothing was measured: a bad parameter or a broken env, not a result
        a = scoreless[0]
        first = (a.get("error_messages") or ["see the report"])[0]
        _fail("failed", f"eval {eval_id}: every episode of {a['name']} errored ({a['errors']}), e.g. {first}",
              f"see `seq eval report {eval_id}`")
    missed = [r for r in results if not r["passed"]]
    if missed:
        _fail("gate_failed", "; ".join(f"{r['arm']}: {r['gate']} not met ({_fmt(r['value'])})" for r in missed),
              f"see `seq eval report {eval_id}`")


@app.command("run")
def eval_run(policy: str = typer.Argument(..., help="the deployed policy (deployment name)"),
             benchmark: str = typer.Option(..., "--benchmark", help="benchmark name (pick-place) or path/to/benchmark.py"),
             envs: int = typer.Option(2, "--envs", help="environments run at once (one process each)"),
             episodes: int = typer.Option(1, "--episodes", help="episodes per task and arm"),
             tasks: Optional[str] = typer.Option(None, "--tasks", help="the first N tasks, or task ids a,b (default: all)"),
             seed: int = typer.Option(0, "--seed", help="first episode seed; episode k uses seed+k"),
             param: List[str] = typer.Option([], "--param", help="k=v for the policy, the benchmark (setup) or eval.*"),
             sweep: List[str] = typer.Option([], "--sweep", help="k=a,b: one arm per value"),
             compare: List[str] = typer.Option([], "--compare", help="another deployed policy, run on the same episodes"),
             adapter: Optional[str] = typer.Option(None, "--adapter", help="NAME[@vN] of a registered @seq.adapter, or "
                                                   "FILE.py[:CLASS] (registered first) between the benchmark and the policy"),
             gate: List[str] = typer.Option([], "--gate", help="metric>=bar; exit 8 when missed"),
             videos: bool = typer.Option(False, "--videos", help="record a GIF per episode"),
             realtime: bool = typer.Option(False, "--realtime", help="drive with policy.act (paced, prefetching) "
                                                                   "instead of the faster-than-real-time sim loop"),
             dry_run: bool = typer.Option(False, "--dry-run", help="print the layout and an estimate; run nothing"),
             gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
             data_dir: Optional[Path] = DataDirOpt) -> None:
    """Run POLICY on a benchmark and print each metric overall and per task."""
    from sequence_ai_eval.runner import EvalError, check_gates, load_benchmark, parse_gate, plan_eval, run_eval

    try:
        gw = GatewayClient(gateway, api_key, data_dir)
        deployments = _deployments(gw, [policy, *compare])
        adapter_rec = _adapter_record(gw, adapter)
    except CliError as exc:
        _fail_cli(exc)
    store = _store(data_dir)
    loop = "realtime" if realtime else "sim"
    try:
        bench_cls, ref = load_benchmark(benchmark)
        from seq.spec import get_benchmark_spec
        spec = get_benchmark_spec(bench_cls)
        gates = [parse_gate(g, spec) for g in gate]
        plan = plan_eval(bench_cls=bench_cls, benchmark_ref=ref, policy=policy, deployments=deployments,
                         compare=list(compare), params=list(param), sweep=list(sweep), tasks=tasks,
                         episodes=episodes, seed=seed, envs=envs, videos=videos, realtime=realtime,
                         past_episode_s=_past_episode_s(store, spec.name, loop), adapter=adapter_rec)
    except EvalError as exc:
        _fail(exc.code, exc.detail, exc.hint)
        return
    arms = [{"name": a.name, "policy": a.policy, "version": a.version, "policy_params": a.policy_params,
             "bench_params": a.bench_params, "eval_params": a.eval_params, "defaults": a.defaults,
             "adapter_params": a.adapter_params} for a in plan.arms]
    _print_plan(plan, spec, ref, loop, arms, seed, policy, gates, dry_run)
    if dry_run:
        return
    eval_id = store.new_id()
    store.create({"id": eval_id, "status": "running", "created_at": time.time(), "pid": os.getpid(),
                  "benchmark": spec.name, "benchmark_ref": ref, "policy": policy, "arms": arms,
                  "tasks": plan.tasks, "episodes": plan.episodes, "seeds": [seed + k for k in range(plan.episodes)],
                  "envs": plan.envs, "videos": videos, "loop": loop, "metrics": spec.metrics,
                  "adapter": plan.adapter,
                  "total_episodes": plan.total_episodes, "done_episodes": 0, "gates": [str(g) for g in gates]})
    _say(f"eval       {eval_id} (seq eval status {eval_id}; seq eval cancel {eval_id})")
    try:
        record = run_eval(plan, store, eval_id, gateway_url=gw.url, api_key=gw.api_key, on_episode=_progress)
    except KeyboardInterrupt:
        store.update(eval_id, status="canceled", finished_at=time.time())
        _fail("canceled", f"eval {eval_id} interrupted")
        return
    _say()
    results = check_gates(record["report"], gates, policy)
    store.update(eval_id, gate_results=results, gate_passed=all(r["passed"] for r in results))
    _print_report(record["report"], results)
    _say(f"wall       {record['wall_s']:.1f} s; stored in {store.folder(eval_id)}")
    _verdict(record, results, eval_id)


def _load(store, eval_id: str) -> dict:
    from sequence_ai_data.evals import EvalNotFound
    try:
        record = store.load(eval_id)
    except EvalNotFound:
        _fail("not_found", f"no eval {eval_id!r} in {store.root}", "`seq eval ls` lists them")
    if record["status"] == "running" and not _alive(record.get("pid")):
        record = store.update(eval_id, status="failed", error="the runner process exited before the eval finished")
    return record


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@app.command("status")
def eval_status(eval_id: str, data_dir: Optional[Path] = DataDirOpt) -> None:
    """Where an eval is: running (with progress), done, canceled or failed."""
    store = _store(data_dir)
    r = _load(store, eval_id)
    _say(f"{r['id']}  {r['status']}  {r['done_episodes']}/{r['total_episodes']} episodes  "
         f"benchmark {r['benchmark']}  policies {', '.join(a['name'] for a in r['arms'])}")
    if r.get("wall_s") is not None:
        _say(f"  wall {r['wall_s']:.1f} s")
    elif r["status"] == "running":
        _say(f"  running for {time.time() - r['created_at']:.0f} s")
    if r.get("error"):
        _say(f"  error {r['error']}")
    if r.get("gate_results"):
        _say("  gates " + ", ".join(f"{g['gate']} {'PASS' if g['passed'] else 'FAIL'}" for g in r["gate_results"]))


@app.command("report")
def eval_report(eval_id: str, csv_path: Optional[str] = typer.Option(None, "--csv", help="write CSV to PATH ('-': stdout)"),
                as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """The report of an eval (so far, if it is still running or was canceled)."""
    from sequence_ai_eval.runner import summarize
    store = _store(data_dir)
    record = _load(store, eval_id)
    report = summarize(record, store.episodes(eval_id))
    if csv_path:
        text = _csv_text(report)
        if csv_path == "-":
            sys.stdout.write(text)
        else:
            target = Path(csv_path).expanduser()
            if target.is_dir():
                _fail("invalid_request", f"--csv {csv_path} is a folder", "give a file path, e.g. --csv report.csv")
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")   # renamed into place: never half a file
            try:
                tmp.write_text(text)
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            _say(f"wrote {csv_path}")
        return
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    if record["status"] != "done":
        _say(f"({record['status']}: {record['done_episodes']}/{record['total_episodes']} episodes)")
    _print_report(report, record.get("gate_results"))


@app.command("ls")
def eval_ls(policy: Optional[str] = typer.Argument(None, help="only evals that ran this policy"),
            limit: int = typer.Option(50, "--limit", help="at most this many, newest first"),
            data_dir: Optional[Path] = DataDirOpt) -> None:
    """List evals, newest first."""
    store = _store(data_dir)
    shown = 0
    _say(f"{'id':<26}{'status':<10}{'benchmark':<14}{'episodes':>10}  primary  policies")
    for r in store.all(policy):
        if shown >= limit:
            break
        if r["status"] == "running" and not _alive(r.get("pid")):
            r = store.update(r["id"], status="failed", error="the runner process exited before the eval finished")
        primary = None
        rep = r.get("report")
        if rep and rep["arms"]:
            metrics = rep["arms"][0]["metrics"]
            key = (r.get("metrics") or list(metrics) or [None])[0]
            primary = (metrics.get(key) or {}).get("overall")
        _say(f"{r['id']:<26}{r['status']:<10}{r['benchmark']:<14}{str(r['done_episodes']) + '/' + str(r['total_episodes']):>10}"
             f"  {_fmt(primary):>7}  {', '.join(a['name'] for a in r['arms'])}")
        shown += 1


@app.command("cancel")
def eval_cancel(eval_id: str, wait_s: float = typer.Option(30.0, "--wait", help="seconds to wait for it to stop"),
                data_dir: Optional[Path] = DataDirOpt) -> None:
    """Stop a running eval; the episodes finished so far stay in its report."""
    store = _store(data_dir)
    record = _load(store, eval_id)
    if record["status"] != "running":
        _say(f"{eval_id} is already {record['status']}")
        return
    store.request_cancel(eval_id)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        record = _load(store, eval_id)
        if record["status"] != "running":
            break
        time.sleep(0.2)
    _say(f"{eval_id}: {record['status']} after {record['done_episodes']}/{record['total_episodes']} episodes"
         if record["status"] != "running" else f"{eval_id}: cancel requested; still stopping")
