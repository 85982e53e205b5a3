"""``seq deploy``: register a policy file with the gateway and follow its worker until it serves.

    seq deploy FILE [--name NAME] [--class CLS] [--wait/--no-wait] [--timeout S] [--dry-run]

A policy with ``image=`` first gets its Python environment built on the gateway (once per image
spec); its build output streams here, under the phase lines, as it is written.

A file that declares an ``@seq.adapter`` is registered instead (nothing builds). When a
deployment already serves, the new version builds beside it and takes over when ready
(``wait_build``, shared with ``seq policy rollback``).
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Optional

import typer

from seq._adapter import file_declares_adapter

from ._client import ApiKeyOpt, CliError, DataDirOpt, GatewayClient, GatewayOpt, fail, out

__all__ = ["app", "show_failure", "missing_module_hint", "wait_build", "BuildOutput"]

app = typer.Typer()


def default_name(file: Path) -> str:
    """The deployment name for FILE: its stem (its folder's name for policy.py / __init__.py),
    lower-cased, non-alphanumerics as ``-``; ``policy`` when nothing is left."""
    stem = file.parent.name if file.stem in ("policy", "__init__") else file.stem
    name = "".join(c if c.isalnum() else "-" for c in stem.lower()).strip("-")
    return name or "policy"


def show_failure(d: dict) -> CliError:
    """The ``worker_failed`` error for a failed deployment ``d`` (a gateway deployment body): its
    error, the tail of the remote traceback or log, and a hint (upload a missing volume first,
    or fix the policy)."""
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
        hint = (missing_module_hint(details, error)
                or f"fix the policy and deploy again; `seq policy status {d['name']}` shows the error")
    return CliError("worker_failed", error, extra=extra, hint=hint)


def missing_module_hint(details: dict, error: str = "") -> Optional[str]:
    """What to install, and where, for a worker whose load raised ModuleNotFoundError; None for
    any other failure (or a module of this distribution or of ROS 2 missing: no pip line fixes it).

    ``details`` is the failure's (``missing_module``, ``python``: the worker's interpreter,
    ``image``: whether the policy declares ``image=``); a gateway that reports none of it is read
    from ``error`` (``No module named 'x'``). A policy with ``image=`` runs in its built
    environment: the package goes into ``image=``. Otherwise the worker runs in the gateway's
    Python: the extra that brings the module (``sequence_ai.extras.EXTRA_OF``: torch ->
    ``sequence-ai[train]``), else the module itself, installed there.
    """
    from sequence_ai.extras import EXTRA_OF, OWN_MODULES, ROS_MODULES

    module = details.get("missing_module")
    if not module:
        found = re.search(r"ModuleNotFoundError: No module named '([^']+)'", error)
        module = found.group(1) if found else None
    if not module:
        return None
    top = module.split(".")[0]
    if top in OWN_MODULES or top in ROS_MODULES:
        return None
    if details.get("image"):
        return (f"the worker's image environment has no {top}: add its package to the policy's image= "
                f"(e.g. image=seq.Image.debian_slim().pip_install(\"{top}\")), then deploy again")
    python = details.get("python") or "python"
    extra = EXTRA_OF.get(top)
    package = f"'sequence-ai[{extra}]'" if extra else top
    return (f"the worker runs in the gateway's Python environment ({python}), which has no {top}: install it "
            f"there with `{python} -m pip install {package}` (or give the policy an image= that installs it), "
            f"then deploy again")


class BuildOutput:
    """Streams a deployment's image build output (``GET /v1/deployments/NAME/build-log``) to the
    terminal while ``seq deploy`` waits: each new line indented under a ``│``, from where the log
    ended when the deploy was sent."""

    def __init__(self, gw: GatewayClient, name: str):
        self.gw, self.name, self.offset = gw, name, None

    def start(self) -> None:
        """Note where the build log ends now (before the deploy): only this build's lines show."""
        try:
            self.offset = self.gw.call("GET", f"/v1/deployments/{self.name}/build-log", params={"offset": 1 << 62})["offset"]
        except CliError:
            self.offset = 0          # a new deployment: no log yet

    def show(self) -> None:
        """Print the lines written since the last call."""
        if self.offset is None:
            self.offset = 0
        try:
            got = self.gw.call("GET", f"/v1/deployments/{self.name}/build-log", params={"offset": self.offset})
        except CliError:
            return
        text = got.get("text") or ""
        if "\n" in text:
            text = text[:text.rindex("\n") + 1]       # whole lines only; the rest comes next time
            self.offset += len(text.encode())
            for line in text.splitlines():
                out.print(f"         │ {line}", markup=False, highlight=False)


def wait_build(gw: GatewayClient, name: str, d: dict, timeout: float, t0: float,
               build: Optional[BuildOutput] = None) -> dict:
    """Follow a version building beside the serving one until it took over (returns the
    deployment) or failed (raises the worker_failed ``CliError``, saying the old version serves
    on). ``timeout`` counts in seconds from ``t0`` (``time.monotonic()``).

    Raises:
        CliError: ``worker_failed`` when the build failed, ``timeout`` after ``timeout`` s.
    """
    last = None
    serving = d["version"]                       # the version serving when the build began
    building = (d.get("build") or {}).get("version")
    # the same version again (an unchanged file): a fresh worker of it, not a new version
    beside = (f"a fresh v{building} worker beside the serving one" if building == serving
              else f"v{building} beside the serving v{serving}")
    while True:
        b = d.get("build") or {}
        if build is not None and (b.get("phase") == "building_image" or last == "building_image"):
            build.show()
        if b.get("phase") != last:
            last = b.get("phase")
            out.print(f"  {time.monotonic() - t0:6.1f}s  {last} ({beside})")
        if b.get("status") in ("ready", "switching"):
            out.print(f"[bold green]ready[/]: {name} v{b.get('version', d['version'])} at {d['worker_url']} "
                      f"(load {d['load_s']:.1f} s)")
            return d
        if b.get("status") == "failed":
            e = show_failure({**d, "error": b.get("error"), "details": b.get("details")})
            e.detail = f"v{b.get('version')} failed to build; v{serving} keeps serving: {e.detail}"
            raise e
        if time.monotonic() - t0 > timeout:
            raise CliError("timeout", f"{name} v{b.get('version')} is still {b.get('phase')} after {timeout:g} s",
                           hint=f"it keeps building; watch it with `seq policy status {name}`")
        time.sleep(0.25)
        d = gw.call("GET", f"/v1/deployments/{name}")


def _wait_ready(gw: GatewayClient, name: str, timeout: float, t0: float, build: Optional[BuildOutput] = None) -> None:
    """Print each phase of NAME's first worker until it is ready.

    Raises:
        CliError: ``worker_failed`` when it failed or stopped, ``timeout`` after ``timeout`` s.
    """
    last_phase = None
    while True:
        d = gw.call("GET", f"/v1/deployments/{name}")
        if build is not None and (d.get("phase") == "building_image" or last_phase == "building_image"):
            build.show()
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
            raise show_failure(d)
        if time.monotonic() - t0 > timeout:
            raise CliError("timeout", f"{name} is still {d['phase']} after {timeout:g} s",
                           hint=f"it keeps loading; watch it with `seq policy status {name}`")
        time.sleep(0.25)


def _deploy_policy(path: Path, name: str, class_name: Optional[str], wait: bool, timeout: float,
                   gw: GatewayClient) -> None:
    """Register PATH as NAME's next version and, with ``wait``, follow it until it serves."""
    build = BuildOutput(gw, name)
    if wait:
        build.start()
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
    if b.get("status") == "building":   # a new version builds beside the serving one
        wait_build(gw, name, d, timeout, t0, build)
    else:
        _wait_ready(gw, name, timeout, t0, build)


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
        if not dry_run and file_declares_adapter(path):   # an adapter registers; nothing builds
            from .adapter import deploy_adapter
            deploy_adapter(path, class_name, gateway, api_key, data_dir)
            return
        if dry_run:
            from seq.cli._scaffold import validate_target
            validate_target(f"{path}:{class_name}" if class_name else str(path), name or default_name(path))
            out.print("dry run: nothing was sent to the gateway")
            return
        _deploy_policy(path, name or default_name(path), class_name, wait, timeout,
                       GatewayClient(gateway, api_key, data_dir))
    except CliError as exc:
        fail(exc)
