"""Per-deployment Python environments built from a policy's ``image=`` (``seq.Image``).

A policy that declares ``image=seq.Image.debian_slim().pip_install("tomli==2.4.0")`` gets its
own Python environment: the gateway reads the declaration from the file without importing it
(:func:`image_from_source`), and the local launcher starts the worker with that environment's
interpreter. Environments live in ``<data_dir>/envs/<hash>``, one per image spec (the hash of the
spec, the Python and the worker's own requirements), so every version and deployment with the
same spec shares one; the build runs once (a lock per hash; built into a temporary folder and
renamed, so a half-built environment is never used).

What a build does, with ``uv`` (fast, and it resolves the image's pins together with the worker's
own requirements: a pin that cannot work with the worker is a build error, not a crash later):
``uv venv`` for the image's Python, then one ``uv pip install`` of the ``pip_install`` and
``uv_pip_install`` packages plus :data:`WORKER_REQUIREMENTS` (each pinned to the gateway's own
version unless the image names that package: the image's pin wins), with ``env`` steps'
variables set. Package indexes are pip's own configuration (``pip config list``: ``index-url``,
``extra-index-url``, ``find-links``); the install runs ``--offline`` first (local file indexes and
uv's cache), and asks over the network only when that cannot satisfy it.

The platform's worker code (``sequence_ai_server``, ``seq``, ``sequence_ai_core``,
``sequence_ai``, ``sequence_ai_data``; found, not imported) is not installed into the environment: a frozen copy of the running gateway's
code (``<data_dir>/platform/<hash of the code>``) goes first on the worker's ``PYTHONPATH``,
so every worker runs the code its gateway was started with, and an environment is shared
across gateway upgrades. (A copy is ~1 MB and takes milliseconds; installing the packages
into each environment would cost a wheel build per code change.)

``apt_install`` and ``run_commands`` change the system, not a Python environment: the deploy is
refused with :class:`ImageStepRefused`, naming the step and what to do (pip_install /
uv_pip_install, or install the system package on the host), with or without a container runtime
(this gateway does not build container images) -- never silently skipped.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from sequence_ai_server.common.errors import ApiError

__all__ = ["EnvBuilder", "ImageEnv", "ImageStepRefused", "ImageBuildError", "image_from_source",
           "WORKER_REQUIREMENTS", "container_runtime", "platform_copy", "remove_orphan_builds"]

# what the worker itself imports (setup.py's "server" extra, less the gateway-only packages)
WORKER_REQUIREMENTS = ("fastapi>=0.110", "uvicorn>=0.29", "uvloop>=0.19; sys_platform != 'win32'", "pydantic>=2.5",
                       "numpy>=1.24", "simplejpeg>=1.7", "pillow>=10", "httpx>=0.27", "sniffio>=1.3")
# httptools, websockets and msgpack are optional for a worker (h11, HTTP /act only, no openpi endpoint)
PLATFORM_PACKAGES = ("sequence_ai_server", "seq", "sequence_ai_core", "sequence_ai", "sequence_ai_data")
CONTAINER_STEPS = ("apt_install", "run_commands")
# environment variables an image's env step may not set: the worker's import path and the
# platform's own settings (SEQ_*), and the build's (uv's UV_*, the library loader's preload)
PLATFORM_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "LD_PRELOAD")
PLATFORM_ENV_PREFIXES = ("SEQ_", "SEQUENCE_AI_", "UV_")
BUILD_TIMEOUT_S = 1800.0


class ImageStepRefused(ApiError):
    """An ``image=`` step this gateway cannot run (``apt_install`` / ``run_commands`` without a
    container runtime, or a registry base image). A 400 ``invalid_request`` naming the step."""

    def __init__(self, step: int, kind: str, detail: str, hint: str):
        super().__init__("invalid_request", f"image step {step} ({kind}): {detail}", hint=hint,
                         details={"step": step, "kind": kind})


class ImageBuildError(RuntimeError):
    """A build that ran and failed (``detail``: what failed; ``details``: ``{"command", "exit_code",
    "output_tail"}``)."""

    def __init__(self, detail: str, details: Optional[dict] = None):
        super().__init__(detail)
        self.detail = detail
        self.details = details or {}


@dataclass(frozen=True)
class ImageEnv:
    """A built environment: ``python`` (its interpreter), ``extra_paths`` (the frozen platform
    code, first on the worker's import path), ``env`` (the image's ``env`` step variables)."""
    python: str
    extra_paths: tuple
    env: dict


# ---------------------------------------------------------------- reading image= without importing the policy

_IMAGE_METHODS = {"debian_slim", "from_registry", "apt_install", "pip_install", "uv_pip_install",
                  "run_commands", "env"}


def _image_expr(node: ast.AST, module: dict) -> Any:
    """Evaluate an ``Image`` builder chain (``seq.Image.debian_slim().pip_install("x==1")``) on the
    real ``seq.Image``: method names from the builder only, literal arguments, names resolved to
    module-level assignments. Raises ValueError for anything else."""
    import seq
    if isinstance(node, ast.Name) and node.id in module:
        return _image_expr(module[node.id], module)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        raise ValueError(f"image= must be a seq.Image chain with literal arguments (line {getattr(node, 'lineno', '?')})")
    method, target = node.func.attr, node.func.value
    if method not in _IMAGE_METHODS:
        raise ValueError(f"Image.{method} is not an image step")
    base = seq.Image if method in ("debian_slim", "from_registry") else _image_expr(target, module)
    if not isinstance(base, (seq.Image, type)):
        raise ValueError("image= must start from seq.Image.debian_slim() or seq.Image.from_registry()")
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {}
    for kw in node.keywords:
        if kw.arg == "secrets" and isinstance(kw.value, (ast.List, ast.Tuple)):
            kwargs["secrets"] = [_secret_name(e) for e in kw.value.elts]
        else:
            kwargs[kw.arg] = ast.literal_eval(kw.value)
    return getattr(base, method)(*args, **kwargs)


def _secret_name(node: ast.AST) -> str:
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)          # seq.Secret.from_name("gh")
    return str(ast.literal_eval(node))


def image_from_source(policy_file: str) -> Optional[dict]:
    """The ``image=`` of the file's ``@seq.policy`` as ``seq.Image.to_dict()`` (a registry
    reference string as ``{"base": REF, "python": None, "steps": []}``), or None when it declares
    none. Raises ApiError(invalid_request) for an image the gateway cannot read without
    importing the policy, or one ``seq.Image`` itself refuses."""
    try:
        tree = ast.parse(Path(policy_file).read_text(), filename=policy_file)
    except (OSError, SyntaxError):
        return None                     # the worker reports an unreadable file with its traceback
    module = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        for dec in getattr(node, "decorator_list", []) if isinstance(node, ast.ClassDef) else []:
            fn = getattr(dec, "func", None)
            if (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)) != "policy":
                continue
            for kw in dec.keywords:
                if kw.arg != "image" or (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                    continue
                try:
                    image = _image_expr(kw.value, module)
                except Exception as exc:  # noqa: BLE001 - ValueError, DeclarationError, a bad literal
                    raise ApiError("invalid_request", f"{policy_file}: image= cannot be read: {exc}",
                                   hint="write image= as a seq.Image.debian_slim()... chain with literal arguments, "
                                        "inline or in a module-level variable") from None
                if isinstance(image, str):
                    return {"base": image, "python": None, "steps": []}
                return image.to_dict()
    return None


# ---------------------------------------------------------------- the container runtime and the platform copy

def container_runtime() -> Optional[str]:
    """``podman``, or ``docker`` when its daemon answers (``docker info``); None when neither."""
    if shutil.which("podman"):
        return "podman"
    if shutil.which("docker"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0:
                return "docker"
    return None


def platform_copy(root: Path) -> Path:
    """A frozen copy of the running platform's worker packages under ``root``/<hash of their
    sources> (made once; atomic rename), the folder to put on a worker's import path."""
    import importlib.util
    sources = []                     # (package, its folder, a source file in it); found, not imported
    for pkg in PLATFORM_PACKAGES:
        found = importlib.util.find_spec(pkg)
        if found is None or not found.origin:
            continue
        d = Path(found.origin).resolve().parent
        sources += [(pkg, d, p) for p in sorted(d.rglob("*.py")) if "__pycache__" not in p.parts]
    h = hashlib.sha256()
    for pkg, d, p in sources:
        h.update(f"{pkg}/{p.relative_to(d)}\0".encode())
        h.update(p.read_bytes())
    dest = root / h.hexdigest()[:16]
    if dest.is_dir():
        return dest
    tmp = root / f".{dest.name}.{os.getpid()}.{threading.get_ident()}"
    for pkg, d, p in sources:
        out = tmp / pkg / p.relative_to(d)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, out)
    with contextlib.suppress(OSError):          # another thread made it first: keep theirs
        os.rename(tmp, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


# ---------------------------------------------------------------- building

def pip_indexes(python: str = sys.executable) -> list[str]:
    """``uv pip install`` arguments for pip's configured indexes (``pip config list`` of
    ``python``: index-url, extra-index-url, find-links; ``$PIP_*`` overrides included)."""
    try:
        out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    conf: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        option = key.rsplit(".", 1)[-1].strip()
        conf.setdefault(option, []).extend(value.strip().strip("'\"").split())
    for option, var in (("index-url", "PIP_INDEX_URL"), ("extra-index-url", "PIP_EXTRA_INDEX_URL"),
                        ("find-links", "PIP_FIND_LINKS")):
        if os.environ.get(var):
            conf[option] = os.environ[var].split()
    args: list[str] = []
    for url in conf.get("index-url", [])[:1]:
        args += ["--index-url", url]
    for url in dict.fromkeys(conf.get("extra-index-url", [])):
        args += ["--extra-index-url", url]
    for link in dict.fromkeys(conf.get("find-links", [])):
        if "://" in link or Path(link).exists():
            args += ["--find-links", link]
    return args + ["--index-strategy", "unsafe-best-match"] if args else args


def _dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (``Foo_Bar[x]>=1`` -> ``foo-bar``)."""
    import re
    name = re.split(r"[\s\[<>=!~;@]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _packages(image: dict) -> list[str]:
    """The requirements of the image's ``pip_install`` and ``uv_pip_install`` steps, in order."""
    return [a for s in image.get("steps") or [] if s["kind"] in ("pip_install", "uv_pip_install")
            for a in s.get("args") or []]


def worker_requirements(image_packages: list) -> list[str]:
    """The worker's requirements for an environment whose image installs ``image_packages``:
    each one the image does not name is pinned to the version the gateway runs (the stack the
    worker code is tested with); one the image names is left to the image's pin."""
    from importlib import metadata
    named = {_dist_name(p) for p in image_packages}
    out = []
    for req in WORKER_REQUIREMENTS:
        name = _dist_name(req)
        if name in named:
            continue
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(req)
            continue
        marker = req.partition(";")[2]
        out.append(f"{name}=={version}" + (f"; {marker.strip()}" if marker else ""))
    return out


def _uv() -> list[str]:
    """How to run uv: the ``uv`` module of this interpreter, else ``uv`` on PATH. Raises
    ImageBuildError naming the fix when neither is there."""
    with contextlib.suppress(ImportError):
        from uv import find_uv_bin
        return [find_uv_bin()]
    found = shutil.which("uv")
    if found:
        return [found]
    raise ImageBuildError("uv is not installed where the gateway runs; `pip install uv` (it builds image environments)")


class EnvBuilder:
    """Builds and caches image environments under ``data_dir``/envs, with the frozen platform
    code under ``data_dir``/platform and each deployment's build output in
    ``data_dir``/logs/NAME.build.log (``seq policy logs NAME --build``)."""

    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.root = self.data_dir / "envs"
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def build_log(self, name: str) -> Path:
        """Where ``name``'s image build output goes."""
        return self.data_dir / "logs" / f"{name}.build.log"

    @staticmethod
    def spec_hash(image: dict) -> str:
        """The cache key of ``image``: its steps, its Python and the worker's requirements
        (pinned as ``worker_requirements`` pins them)."""
        blob = json.dumps({"image": image, "worker": worker_requirements(_packages(image)), "v": 1}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def check(self, image: dict) -> None:
        """Refuse at deploy what cannot be built here (``ImageStepRefused``): a registry base
        image, ``apt_install`` or ``run_commands`` -- without a container runtime, or with one
        (container builds are not done by this gateway)."""
        runtime = None
        for i, step in enumerate(image.get("steps") or [], 1):
            if step["kind"] not in CONTAINER_STEPS:
                continue
            runtime = runtime or container_runtime() or "none"
            what = " ".join(step.get("args") or [])
            hint = ("use pip_install / uv_pip_install for Python packages, or install the system package on "
                    "the host (the gateway's machine) and drop the step")
            if runtime == "none":
                raise ImageStepRefused(i, step["kind"], f"{what!r} changes the system; this gateway builds Python "
                                       "environments only (pip_install / uv_pip_install / env steps)", hint)
            raise ImageStepRefused(i, step["kind"], f"{what!r} changes the system; this gateway builds Python "
                                   f"environments only and does not build container images ({runtime} is here)",
                                   f"{hint}; or build the image yourself (`seq image dockerfile FILE` | {runtime} "
                                   "build -) and serve it outside this gateway")
        for i, step in enumerate(image.get("steps") or [], 1):
            if step["kind"] in ("pip_install", "uv_pip_install"):
                for req in step.get("args") or []:
                    if not isinstance(req, str) or req.strip().startswith("-") or "\0" in req:
                        raise ImageStepRefused(i, step["kind"], f"{req!r} is an installer option, not a requirement",
                                               "name packages only (e.g. \"tomli==2.4.0\"); indexes come from the "
                                               "gateway's pip configuration")
            elif step["kind"] == "env":
                for k, v in (step.get("env") or {}).items():
                    if k in PLATFORM_ENV or k.startswith(PLATFORM_ENV_PREFIXES) or "\0" in str(v):
                        raise ImageStepRefused(i, "env", f"{k} is set by the platform for the worker and the build; "
                                               "an image cannot change it",
                                               "drop it from env(); the worker's import path and settings are the gateway's")
        if image.get("base") not in (None, "debian_slim"):
            raise ImageStepRefused(0, "from_registry", f"the base image {image['base']!r} would have to be pulled",
                                   "use seq.Image.debian_slim() with pip_install steps, or serve it outside this gateway")

    def prepare(self, image: dict, name: str, version: int) -> Callable[[], ImageEnv]:
        """Check ``image`` (raises ``ImageStepRefused``) and return the build to run on the
        launcher's thread: it returns the ``ImageEnv`` (cached, or built now), writing its
        output to ``build_log(name)``; it raises ImageBuildError when the build fails."""
        self.check(image)
        return lambda: self._build(image, name, version)

    def _build(self, image: dict, name: str, version: int) -> ImageEnv:
        h = self.spec_hash(image)
        path = self.root / h
        log_path = self.build_log(name)
        with open(log_path, "ab", buffering=0) as logf:
            def say(text: str) -> None:
                logf.write(f"[{time.strftime('%H:%M:%S')}] {text}\n".encode())
            say(f"===== {name} v{version}: image environment {h} =====")
            with self._guard:
                lock = self._locks.setdefault(h, threading.Lock())
            with lock:
                if not (path / "bin" / "python").exists():
                    self._build_into(image, path, logf, say)
                else:
                    say(f"using the cached environment {path} (shared by every deployment with this image)")
            env_vars = {k: v for s in image.get("steps") or [] if s["kind"] == "env" for k, v in s.get("env", {}).items()}
            code = platform_copy(self.data_dir / "platform")
            say(f"platform code: {code}")
            say("environment ready")
        return ImageEnv(str(path / "bin" / "python"), (str(code),), env_vars)

    def _build_into(self, image: dict, path: Path, logf: Any, say: Callable[[str], None]) -> None:
        """Build the environment in a temporary folder beside ``path``, then rename it there."""
        t0 = time.monotonic()
        uv = _uv()
        self.root.mkdir(parents=True, exist_ok=True)
        remove_orphan_builds(self.root, path.name)
        tmp = self.root / f".{path.name}.{os.getpid()}.building"
        shutil.rmtree(tmp, ignore_errors=True)
        python = image.get("python")
        python = sys.executable if python in (None, "image") else f"python{python}"
        env = dict(os.environ)
        env.update({k: v for s in image.get("steps") or [] if s["kind"] == "env" for k, v in s.get("env", {}).items()})
        env.update({"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"})      # the platform's, last
        try:
            self._install(image, uv, python, tmp, env, logf, say)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)        # nothing half-built is left behind
            raise
        os.rename(tmp, path)
        say(f"built {path} in {time.monotonic() - t0:.1f} s")

    def _install(self, image: dict, uv: list, python: str, tmp: Path, env: dict, logf: Any,
                 say: Callable[[str], None]) -> None:
        """``uv venv`` at ``tmp``, then the image's packages with the worker's requirements."""
        self._run(uv + ["venv", "--relocatable", "--python", python, str(tmp)], env, logf, say)
        packages = _packages(image)
        install = uv + ["pip", "install", "--python", str(tmp / "bin" / "python"), *pip_indexes(),
                        *packages, *worker_requirements(packages)]
        try:                    # local indexes and uv's cache first: no network needed when they hold it all
            self._run(install + ["--offline"], env, logf, say)
        except ImageBuildError as offline:
            say("not everything is on this machine: asking the configured indexes over the network")
            try:
                self._run(install, env, logf, say)
            except ImageBuildError as online:
                raise ImageBuildError(f"offline: {offline.detail}; over the network: {online.detail}",
                                      online.details) from None
        (tmp / "seq-image.json").write_text(json.dumps({"image": image, "built_at": time.time()}, indent=1))

    @staticmethod
    def _run(cmd: list, env: dict, logf: Any, say: Callable[[str], None]) -> None:
        say("$ " + " ".join(cmd))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        tail: list[bytes] = []
        for line in proc.stdout:                 # streamed: `seq deploy` shows it as it comes
            logf.write(line)
            tail = (tail + [line])[-20:]
        code = proc.wait(timeout=BUILD_TIMEOUT_S)
        if code:
            text = b"".join(tail).decode(errors="replace")
            last = _failure_lines(text)
            raise ImageBuildError(f"`{Path(cmd[0]).name} {cmd[1]}` exited with code {code}: {last}",
                                  {"command": cmd, "exit_code": code, "output_tail": text.splitlines()})


def remove_orphan_builds(root: Path, spec_hash: str) -> list[Path]:
    """Remove the half-built folders ``.{spec_hash}.{pid}.building`` under ``root`` whose
    building process is gone (a gateway killed mid-build leaves its ``uv`` writing into its own
    folder, never into a later build's). -> the folders removed."""
    removed = []
    for folder in root.glob(f".{spec_hash}.*.building"):
        pid = folder.name[len(spec_hash) + 2:-len(".building")]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _failure_lines(text: str) -> str:
    """The lines of a failed command's output that say why, joined (at most 600 characters):
    from its first ``error`` / ``×`` line (uv's resolver names the package it could not find
    there) up to its first ``hint`` line; else its last three lines."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lower().startswith(("error", "×"))), None)
    if start is None:
        return " ".join(lines[-3:])
    why = []
    for ln in lines[start:]:
        if ln.lower().startswith("hint"):
            break
        why.append(ln)
    return " ".join(why)[:600]
