"""``seq adapter``: the registered ``@seq.adapter`` files, and ``seq deploy adapter.py``.

    seq deploy adapter.py [--class C]       register it (NAME@vN; the same file is the same version)
    seq adapter ls                          every adapter: latest version, count, lossy or not
    seq adapter show NAME[@vN]              one version: steps, each lossy step's reason, params
    seq adapter pull NAME[@vN] [--out F]    write the file back exactly as registered
    seq adapter check FILE[:CLASS] [--benchmark B --policy P]
                                            classify every step; with B and P, run a sample of
                                            each side through it (sends nothing, runs no eval)

Exit codes are the ``seq`` command's (``seq.cli._client``); ``check`` exits 5 when the sample does not
fit, 1 for a malformed declaration, 2 for a missing file.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from ._client import EXIT, ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, call, err, fail, out

__all__ = ["app", "adapter_check", "deploy_adapter"]

app = typer.Typer(help="Adapters between a benchmark and a policy (seq deploy adapter.py registers one).",
          no_args_is_help=True)


def _say(text: str = "") -> None:
    out.print(text, highlight=False, markup=False, soft_wrap=True)


def _die(code: str, detail: str, hint: Optional[str] = None, exit_code: Optional[int] = None) -> None:
    err.print(f"error[{code}]: {detail}", style="bold red", highlight=False, markup=False, soft_wrap=True)
    if hint:
        err.print(f"hint: {hint}", highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(exit_code if exit_code is not None else EXIT.get(code, 1))


def _steps_lines(spec: dict) -> list[str]:
    lines = []
    for s in spec.get("steps") or []:
        what = f"lossy: {s['reason']}" if s["lossy"] else "lossless"
        lines.append(f"  {s['kind']:<12} {s['method']:<20} {what}")
    return lines


def _params_line(spec: dict) -> str:
    params = spec.get("params") or []
    return ", ".join(f"adapter.{p['name']}={p['default']!r}" for p in params) or "none"


def deploy_adapter(path: Path, class_name: Optional[str], gateway: Optional[str], api_key: Optional[str],
                   data_dir: Optional[Path]) -> None:
    """``seq deploy adapter.py``: register the file; print NAME@vN and whether it is new."""
    import seq
    from seq._adapter_registry import register_file
    try:
        gw = GatewayClient(gateway, api_key, data_dir)
        rec = register_file(gw, path, class_name)
    except CliError as exc:
        fail(exc)
        return
    except seq.DeclarationError as exc:
        _die("declaration", str(exc), exit_code=1)
        return
    except (LookupError, FileNotFoundError) as exc:
        _die("invalid_request", str(exc), "give the path of a .py file with a @seq.adapter class, optionally FILE:Class")
        return
    except Exception as exc:  # noqa: BLE001 - the import itself failed: show it, readable
        _die("import", f"{path}: {type(exc).__name__}: {exc}", exit_code=1)
        return
    ref = f"{rec['name']}@v{rec['version']}"
    if rec.get("created"):
        _say(f"registered {ref} from {path} (an adapter: nothing builds, nothing starts)")
    else:
        _say(f"{ref}: {path} is unchanged since it was registered, so it stays {ref}")
    lossy = rec.get("lossy") or []
    _say(f"policy_io  {rec.get('policy_io')}")
    _say(f"lossy      {'yes: ' + str(len(lossy)) + ' step(s)' if lossy else 'no'}")
    for line in _steps_lines(rec.get("spec") or {}):
        _say(line)
    _say(f"use        seq eval run POLICY --benchmark BENCH --adapter {rec['name']} (or {ref})")


@app.command("ls")
def adapter_ls(gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
               data_dir: Optional[Path] = DataDirOpt) -> None:
    """List the registered adapters."""
    body = call(gateway, api_key, data_dir, "GET", "/v1/adapters")
    rows = body.get("adapters") or []
    if not rows:
        _say("no adapters (seq deploy adapter.py registers one)")
        return
    _say(f"{'name':<28}{'latest':>7}{'versions':>10}  {'policy_io':<10}lossy")
    for r in rows:
        _say(f"{r['name']:<28}{'v' + str(r['latest']):>7}{r['versions']:>10}  {str(r.get('policy_io')):<10}"
             f"{'yes' if r['lossy'] else 'no'}")


def _get(ref: str, gateway, api_key, data_dir) -> dict:
    from seq._adapter_registry import parse_ref
    parsed = parse_ref(ref)
    if parsed is None:
        _die("invalid_request", f"{ref!r} is not NAME or NAME@vN", "`seq adapter ls` lists the names")
    name, version = parsed
    return call(gateway, api_key, data_dir, "GET",
                        f"/v1/adapters/{name}/versions/{version if version is not None else 'latest'}")


@app.command("show")
def adapter_show(ref: str = typer.Argument(..., help="NAME (latest) or NAME@vN"),
                 gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                 data_dir: Optional[Path] = DataDirOpt) -> None:
    """One version: whether it is lossy (each lossy step with its reason), its steps and params."""
    rec = _get(ref, gateway, api_key, data_dir)
    spec = rec.get("spec") or {}
    lossy = rec.get("lossy") or []
    _say(f"{rec['name']}@v{rec['version']}  {rec['class_name']} in {rec['filename']}  (sha256 {rec['sha256'][:12]})")
    if spec.get("description"):
        _say(f"  {spec['description']}")
    _say(f"registered {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(rec['created_at']))}")
    _say(f"policy_io  {rec.get('policy_io')}")
    _say(f"lossy      {'yes' if lossy else 'no'}")
    for item in lossy:
        _say(f"  - {item['kind']} step {item['method']}: {item['reason']}")
    _say("steps")
    for line in _steps_lines(spec):
        _say(line)
    _say(f"params     {_params_line(spec)}")


@app.command("pull")
def adapter_pull(ref: str = typer.Argument(..., help="NAME (latest) or NAME@vN"),
                 out_path: Optional[Path] = typer.Option(None, "--out", help="file to write (default: ./<its file name>; '-': stdout)"),
                 force: bool = typer.Option(False, "--force", help="overwrite an existing file"),
                 gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                 data_dir: Optional[Path] = DataDirOpt) -> None:
    """Write a version's file back exactly as it was registered (edit it, seq deploy it again)."""
    rec = _get(ref, gateway, api_key, data_dir)
    if out_path is not None and str(out_path) == "-":
        sys.stdout.write(rec["source"])
        return
    target = (out_path or Path(rec["filename"])).expanduser()
    if target.exists() and not force:
        _die("invalid_request", f"{target} exists", "pass --force to overwrite it, or --out another path")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part")
    tmp.write_text(rec["source"], encoding="utf-8")
    tmp.replace(target)
    _say(f"wrote {target} ({rec['name']}@v{rec['version']}); edit it and `seq deploy {target}` for the next version")


@app.command("check")
def adapter_check(target: str = typer.Argument(..., help="FILE or FILE:Class"),
                  benchmark: Optional[str] = typer.Option(None, "--benchmark", help="benchmark name or path/to/benchmark.py"),
                  policy: Optional[str] = typer.Option(None, "--policy", help="a deployed policy (its declared contract is read)"),
                  param: list[str] = typer.Option([], "--param", help="k=v for the adapter's __init__"),
                  gateway: Optional[str] = GatewayOpt, api_key: Optional[str] = ApiKeyOpt,
                  data_dir: Optional[Path] = DataDirOpt) -> None:
    """Classify every step; with --benchmark and --policy, run a sample of each side through it."""
    import seq
    from seq._adapter import check_adapter, get_adapter_spec, load_adapter_file
    from seq._adapter_registry import split_file_ref
    path, cls_name = split_file_ref(target)
    if not path.is_file():
        _die("invalid_request", f"no such file: {target}", exit_code=2)
    try:
        cls = load_adapter_file(str(path), cls_name)
    except seq.DeclarationError as exc:
        _die("declaration", str(exc), exit_code=1)
    except LookupError as exc:
        _die("invalid_request", str(exc), exit_code=2)
    except Exception as exc:  # noqa: BLE001
        _die("import", f"{target}: {type(exc).__name__}: {exc}", exit_code=1)
    spec = get_adapter_spec(cls)
    if (benchmark is None) != (policy is None):
        _die("invalid_request", "--benchmark and --policy go together", "give both, or neither to only classify the steps",
             exit_code=2)
    bench_spec = contract = None
    params = {}
    if benchmark is not None:
        from sequence_ai_eval.runner import EvalError, load_benchmark
        try:
            bench_cls, _ = load_benchmark(benchmark)
        except EvalError as exc:
            _die(exc.code, exc.detail, exc.hint)
        bench_spec = seq.get_benchmark_spec(bench_cls)
        contract = call(gateway, api_key, data_dir, "GET", f"/v1/deployments/{policy}").get("contract")
        for item in param:
            key, sep, raw = item.partition("=")
            found = [p for p in spec.params if p.name == key.removeprefix("adapter.")]
            if not sep or not found:
                _die("invalid_request", f"--param {item!r}: {spec.name} takes {_params_line(spec.to_dict())}")
            params[found[0].name] = found[0].cast(raw)
    result = check_adapter(cls, bench_spec, contract, params)
    _say(f"{spec.name} ({spec.class_name} in {path.name}), policy_io {spec.policy_io}")
    for line in _steps_lines(spec.to_dict()):
        _say(line)
    _say(f"lossy      {'yes: ' + str(len(result['lossy'])) + ' step(s)' if result['lossy'] else 'no'}")
    _say(f"params     {_params_line(spec.to_dict())}")
    if bench_spec is None:
        _say("sample     not run (give --benchmark B --policy P to run one through it)")
        return
    for note in result["notes"]:
        _say(f"note       {note}")
    if result["problems"]:
        for p in result["problems"]:
            _say(f"misfit     {p}")
        _die("contract_mismatch", f"{spec.name} does not fit {bench_spec.name} -> {policy}: {result['problems'][0]}",
             exit_code=5)
    _say(f"sample     fits: {bench_spec.name}'s observation -> {policy}'s input, {policy}'s chunk -> "
         f"{bench_spec.name}'s rows")
