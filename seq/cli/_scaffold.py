"""What the ``seq`` authoring commands do (``seq/cli/author.py`` declares them): read a policy's
declaration, never run it, and copy the templates.

    seq validate FILE[:CLASS]          what would be deployed: image steps, weights and where they
                                       mount, code files, contracts, params with ranges
    seq init --list                    the templates
    seq init TEMPLATE DIR              copy a template into DIR (refuses a non-empty DIR)
    seq image dockerfile FILE[:CLASS]  the policy's seq.Image rendered as a Dockerfile
    seq deploy FILE --dry-run          (seq/cli/deploy.py) prints what validate prints; sends nothing

Exit codes: 0 accepted, 1 the declaration is malformed (the DeclarationError is printed),
2 usage (no such file, unknown template, DIR not empty).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from seq.spec import TEMPLATES, Template, load_policy_class  # noqa: F401 (Template: re-exported)

__all__ = ["describe", "validate_target", "load_declared", "TEMPLATES", "init_template", "render_dockerfile"]

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

_COPY_SUFFIXES = (".py", ".md", ".txt", ".json", ".yaml", ".toml")


class _Usage(Exception):
    pass


def _split_target(target: str) -> tuple[Path, Optional[str]]:
    file, _, cls = target.partition(":") if not Path(target).exists() else (target, "", "")
    path = Path(file).expanduser()
    if not path.is_file():
        raise _Usage(f"no such file: {file}")
    return path.resolve(), (cls or None)


def load_declared(target: str) -> tuple[Path, type]:
    """Import FILE[:CLASS] and return (path, the @seq.policy class). Import-time errors (a
    DeclarationError for a malformed declaration) propagate."""
    path, cls_name = _split_target(target)
    return path, load_policy_class(str(path), cls_name)


def _code_files(path: Path) -> list[Path]:
    if (path.parent / "__init__.py").exists():
        return sorted(p for p in path.parent.rglob("*.py") if "__pycache__" not in p.parts)
    return [path]


def _contract_lines(spec: Any) -> list[str]:
    lines = []
    a, o = spec.action, spec.observation
    if a is not None:
        limits = []
        if a.bounds is not None:
            limits.append("bounded")
        if a.max_delta is not None:
            limits.append(f"max_delta {a.max_delta}")
        extra = f", {', '.join(limits)}, on_violation={a.on_violation}" if limits else ""
        lines.append(f"action      {a.robot} · {a.action_space.value} · {a.action_dim} dims · {a.control_frequency_hz:g} Hz"
                     f"{extra}  (every chunk is checked against this)")
        limit = "no declared limit" if a.max_delay_steps is None else f"max {a.max_delay_steps} steps"
        takes = ", ".join(spec.delay_inputs) or "neither prefix nor delay_steps"
        lines.append(f"delay       modes {', '.join(a.delay_modes)} · {limit} · infer takes {takes}")
    else:
        lines.append("action      none declared (infer's return value goes back as is)")
    if o is not None:
        cams = [f"{v} {c.width}x{c.height}" + (" +depth" if c.depth else "") for v, c in o.cameras.items()]
        props = [f"{k}[{w}]" for k, w in o.proprio.items()]
        hist = f" · history {o.history}" if o.history > 1 else ""
        lines.append(f"observation {', '.join(cams) or 'no cameras'} · {' · '.join(props) or 'no proprio'} · instruction{hist}"
                     "  (every /act is checked against this)")
    else:
        lines.append("observation none declared (infer gets the request's dict unchanged)")
    return lines


def describe(path: Path, cls: type, name: Optional[str] = None) -> list[str]:
    """The lines `seq validate` prints for a loaded policy class."""
    import seq
    spec = seq.get_spec(cls)
    res = spec.resources
    name = name or (path.parent.name if path.stem == "policy" else path.stem).replace("_", "-")
    lines = [f"policy      {name}  ({spec.class_name} in {path.name})",
             "platform    accepted  (self-hosted: validated locally; gpu is checked against this machine's cards "
             "at deploy; image pip/uv_pip/env steps are built into a Python env of their own, apt_install/"
             "run_commands/registry bases are refused; region is recorded only)"]
    gpu = res.get("gpu")
    if gpu or res.get("max_gpus") or res.get("cpu") or res.get("memory"):
        lines.append(f"resources   gpu={gpu} max_gpus={res.get('max_gpus')} cpu={res.get('cpu')} memory={res.get('memory')}")
    image = res.get("image")
    deps = res.get("deps") or []
    if image or deps:
        base = (image or {}).get("base", "debian_slim")
        py = (image or {}).get("python")
        lines.append(f"image       {base}" + (f" (python {py})" if py else ""))
        for step in (image or {}).get("steps", []):
            label = {"apt_install": "apt-get install", "pip_install": "pip install", "uv_pip_install": "uv pip install",
                     "run_commands": "run", "env": "env"}.get(step["kind"], step["kind"])
            secrets = f"  [secrets: {', '.join(step['secrets'])}]" if step.get("secrets") else ""
            if step["kind"] == "run_commands":
                lines.extend(f"  {label:<17} {c}{secrets}" for c in step["args"])
            elif step["kind"] == "env":
                lines.extend(f"  {label:<17} {k}={v}" for k, v in step["env"].items())
            else:
                lines.append(f"  {label:<17} {', '.join(step['args'])}{secrets}")
        if deps:
            lines.append(f"  {'uv pip install':<17} {', '.join(deps)}  (deps=)")
    else:
        lines.append("image       none declared (self-hosted: the worker runs in this Python environment)")
    weights = spec.weights
    if weights is None:
        lines.append("weights     none")
    elif isinstance(weights, dict):
        lines.append(f"weights     {len(weights)} part(s); load() receives {{part: directory}}")
        lines.extend(f"  {part:<10} {ref}  -> <data_dir>/weights/{name}/{part}" for part, ref in weights.items())
    else:
        lines.append(f"weights     {weights}")
        lines.append(f"            -> mounted at <data_dir>/weights/{name} (self-hosted: a local directory is used in place)")
    if spec.secrets:
        lines.append(f"secrets     {', '.join(spec.secrets)} (read from the environment variable of the same name)")
    files = _code_files(path)
    size = sum(f.stat().st_size for f in files)
    lines.append(f"code        {len(files)} file(s), {size / 1024:.1f} KiB read in place:")
    lines.extend(f"              {f.relative_to(path.parent)}" for f in files)
    lines.extend(_contract_lines(spec))
    for p in spec.params:
        allowed = ""
        if p.constraint is not None:
            d = p.constraint.to_dict()
            allowed = f"  range {d['range'][0]}..{d['range'][1]}" if "range" in d else f"  one of {d['one_of']}"
        lines.append(f"param       {p.name}: {p.type or 'any'} = {p.default!r}{allowed}")
    if spec.batching:
        b = spec.batching
        lines.append(f"batching    up to {b.max_batch_size} per call; eval waits {b.eval_wait_ms:g} ms of quiet, "
                     f"serving waits {b.serve_wait_ms:g} ms")
    if spec.concurrency:
        c = spec.concurrency
        lines.append(f"concurrency {spec.slots()} slot(s) ({c.replicas_per_gpu} replica(s) per card)")
    t = spec.timeouts
    lines.append(f"timeouts    startup {t.startup:g} s, request {t.request:g} s; idle_timeout {spec.idle_timeout:g} s"
                 + ("; streaming episodes" if spec.streaming else ""))
    stages = ", ".join(f"@seq.{s} {m}()" for s, m in spec.methods.items())
    lines.append(f"lifecycle   {stages}")
    return lines


def validate_target(target: str, name: Optional[str] = None) -> None:
    """Print what would be deployed, or the declaration error; exit 1 / 2 on failure. An
    ``@seq.adapter`` file gets ``seq adapter check``'s classification of its steps."""
    import seq
    from seq._adapter import file_declares_adapter
    file_part = target if Path(target).exists() else target.partition(":")[0]
    if Path(file_part).is_file() and file_declares_adapter(Path(file_part)):
        from seq.cli.adapter import adapter_check
        adapter_check(target=target, benchmark=None, policy=None, param=[], gateway=None, api_key=None, data_dir=None)
        return
    try:
        path, cls = load_declared(target)
    except _Usage as exc:
        err.print(f"error[invalid_request]: {exc}", markup=False)
        err.print("hint: give the path of a .py file with a @seq.policy class, optionally FILE:Class", markup=False)
        raise typer.Exit(2)
    except seq.DeclarationError as exc:
        err.print(f"error[declaration]: {exc}", markup=False)
        raise typer.Exit(1)
    except Exception as exc:  # noqa: BLE001 - the import itself failed: show it, readable
        err.print(f"error[import]: {target}: {type(exc).__name__}: {exc}", markup=False)
        raise typer.Exit(1)
    for line in describe(path, cls, name):
        out.print(line, markup=False)


def render_dockerfile(target: str) -> str:
    """The policy's image (plus deps=) as a Dockerfile; a policy with no image gets debian_slim."""
    import seq
    path, cls = load_declared(target)
    spec = seq.get_spec(cls)
    image = spec.resources.get("image")
    img = seq.Image.debian_slim()
    if image:
        img = seq.Image(image["base"], image.get("python"), ())
        for step in image.get("steps", []):
            img = img._add(seq.ImageStep(step["kind"], tuple(step["args"]), tuple(step.get("secrets", ())),
                                         tuple(sorted((step.get("env") or {}).items()))))
    if spec.resources.get("deps"):
        img = img.uv_pip_install(*spec.resources["deps"])
    text = img.dockerfile()
    return text + f"# then: COPY {path.name} and run the sequence-ai worker on it (pip install 'sequence-ai[server]')\n"


def init_template(template: str, directory: Path, name: Optional[str] = None) -> list[Path]:
    """Copy a template into ``directory`` (created; must be empty). -> the files written.
    ``name``: the deployment name ``seq init`` tells the user to deploy it as; a ``client.py``
    then connects to that name (the template's own name, quoted, becomes ``name``).
    Raises _Usage for an unknown template or a non-empty directory."""
    t = TEMPLATES.get(template)
    if t is None:
        raise _Usage(f"unknown template {template!r}; templates: {', '.join(TEMPLATES)}")
    if not t.source.is_dir():
        raise _Usage(f"template {template!r} ships with the source checkout ({t.source} is missing)")
    directory = directory.expanduser()
    if directory.exists() and any(directory.iterdir()):
        raise _Usage(f"{directory} is not empty; pick a new directory")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for src in sorted(t.source.iterdir()):
        if src.is_file() and src.suffix in _COPY_SUFFIXES:
            dst = directory / src.name
            if name and src.name == "client.py":
                dst.write_text(src.read_text(encoding="utf-8").replace(f'"{t.name}"', f'"{name}"'), encoding="utf-8")
                shutil.copymode(src, dst)
            else:
                shutil.copyfile(src, dst)
            written.append(dst)
    return written
