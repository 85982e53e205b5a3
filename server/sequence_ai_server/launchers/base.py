"""How the gateway asks for a worker, and what it hears back: the typed :class:`WorkerLaunchSpec`,
the :class:`LaunchEvent` kinds, and the :class:`Launcher` / :class:`WorkerHandle` protocols.

The launchers (``local.LocalLauncher``: a subprocess on this machine; ``ray.RayLauncher``: one
Ray actor, or a Ray placement group of whole machines for a model past one machine's cards) are the only places that know how a worker process is started and how it
reports. The supervisor builds a spec, hands it to its launcher, and from then on reads the
handle's events -- ``Placed``, ``Started``, ``Phase``, ``Ready``, ``Log``, ``Exited``,
``Failed`` -- instead of any file a worker writes.

The worker command line (``python -m sequence_ai_server.worker ...``) and the environment
variables a worker reads are spelled once, in :meth:`WorkerLaunchSpec.command` and
:meth:`WorkerLaunchSpec.environment`.
"""
from __future__ import annotations

import ast
import contextlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol, Union

__all__ = ["WorkerLaunchSpec", "Placed", "Started", "Phase", "Ready", "Log", "Exited", "Failed", "launcher_for",
           "LaunchEvent", "EventQueue", "WorkerHandle", "Launcher", "declared_resources", "platform_paths"]


@dataclass(frozen=True)
class WorkerLaunchSpec:
    """Everything a launcher needs to start one worker of a deployment.

    ``name``/``role``/``version``: whose worker it is (role: serving | build | side).
    ``policy_file``/``class_name``: what it serves; ``cwd``: its working directory (the original
    file's folder, also put on its import path). ``port``: 0 for an ephemeral one; ``host``:
    None binds 127.0.0.1 (a Ray launcher sets its node's IP). ``secret``: the direct secret.
    ``run_dir``/``run_key``: where a local worker keeps its run files (ready/phase/error,
    secret, activity, supervisor). ``weights_dir``: the deployment's weights folder. ``env``:
    the per-deployment settings the worker reads (``SEQ_CAPTURE_DIR`` and the others, see
    ``environment``). ``resources``: the ``@seq.policy`` resource declaration
    (``declared_resources``). ``python``: the interpreter that runs the worker (default: the
    gateway's own; a deployment with an ``image=`` gets its environment's, see envs.py).
    ``image``: the image spec dict (``seq.Image.to_dict()``) or None. ``log_path``: the
    deployment's worker log. ``adoptable``: a local worker that outlives its gateway (it
    watches a supervisor file) rather than one that stops with its parent (``--parent-pid``).
    ``cards``: the card indices the worker is pinned to (ops/cards.py; ``()``: none, a CPU
    worker; None: not pinned, the environment's own ``CUDA_VISIBLE_DEVICES`` stays), see
    :meth:`card_environment`.
    """

    name: str
    role: str
    version: int
    policy_file: str
    class_name: Optional[str]
    cwd: str
    secret: str = field(repr=False)
    run_dir: Path
    run_key: str
    weights_dir: Path
    log_path: Path
    env: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    python: Optional[str] = None
    image: Optional[dict] = None
    port: int = 0
    host: Optional[str] = None
    adoptable: bool = True
    cards: Optional[tuple] = None

    # -- the run files of a local worker (the worker writes ready/phase/error; the launcher reads them)
    @property
    def ready_file(self) -> Path:
        """``{"port", "pid", "url", ...}``, written atomically once the worker serves."""
        return self.run_dir / f"{self.run_key}.ready.json"

    @property
    def secret_file(self) -> Path:
        """The direct secret (mode 0600); the worker re-reads it when it changes (rotation)."""
        return self.run_dir / f"{self.run_key}.secret"

    @property
    def activity_file(self) -> Path:
        """Touched by the worker on each accepted request (idle tracking)."""
        return self.run_dir / f"{self.run_key}.activity"

    @property
    def supervisor_file(self) -> Path:
        """``{pid, start}`` of the gateway supervising an adoptable worker."""
        return self.run_dir / f"{self.run_key}.supervisor"

    def command(self, python: Optional[str] = None, *, parent_pid: Optional[int] = None) -> list[str]:
        """The worker's argv: ``python -m sequence_ai_server.worker --file ... --ready-file ...``;
        ``python`` overrides the interpreter (default ``self.python``, else the gateway's);
        ``parent_pid`` makes it stop when that process goes, else (``adoptable``) it watches its
        supervisor file."""
        import sys
        cmd = [python or self.python or sys.executable, "-m", "sequence_ai_server.worker", "--file", self.policy_file,
               "--port", str(self.port), "--ready-file", str(self.ready_file), "--name", self.name,
               "--weights-dir", str(self.weights_dir)]
        if self.host:
            cmd += ["--host", self.host]
        if parent_pid is not None:
            cmd += ["--parent-pid", str(parent_pid)]
        elif self.adoptable:
            cmd += ["--supervisor-file", str(self.supervisor_file)]
        if self.class_name:
            cmd += ["--class", self.class_name]
        return cmd

    def environment(self, base: Optional[dict] = None, extra_paths: tuple = ()) -> dict:
        """The worker's environment: ``base`` (default ``os.environ``) plus ``self.env``, the
        direct secret and its files, ``PYTHONPATH`` (``extra_paths`` -- an image worker's frozen
        platform code -- else the platform's packages here; the policy's folder; then the
        inherited entries, except for an image worker, whose environment is its own) and
        ``PYTHONUNBUFFERED=1``."""
        env = dict(os.environ if base is None else base)
        env.update(self.env)
        paths = list(extra_paths) or platform_paths()
        if Path(self.policy_file).parent != Path(self.cwd):
            paths.append(self.cwd)
        if env.get("PYTHONPATH") and not extra_paths:
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        env["SEQ_WORKER_SECRET"] = self.secret
        env["SEQ_WORKER_SECRET_FILE"] = str(self.secret_file)      # rotation (leases.py)
        env["SEQ_WORKER_ACTIVITY_FILE"] = str(self.activity_file)  # idle tracking (leases.py)
        env["SEQ_DEPLOYMENT_VERSION"] = str(self.version)
        return env

    def card_environment(self) -> dict:
        """The variables that pin the worker to ``cards`` (empty when it is not pinned):
        ``CUDA_VISIBLE_DEVICES`` (the indices, comma-separated), ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
        (so CUDA numbers the cards as NVML and nvidia-smi do, not fastest first) and
        ``NVIDIA_VISIBLE_DEVICES`` (the same, for a worker in a container). A CPU worker
        (``cards=()``) gets ``CUDA_VISIBLE_DEVICES=""``: CUDA then sees no card, so a CPU policy
        that imports torch cannot put a context on a card another deployment holds; and
        ``NVIDIA_VISIBLE_DEVICES=void`` (the container runtime adds nothing)."""
        if self.cards is None:
            return {}
        ids = ",".join(str(int(i)) for i in self.cards)
        return {"CUDA_VISIBLE_DEVICES": ids, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "NVIDIA_VISIBLE_DEVICES": ids or "void"}


def platform_paths() -> list[str]:
    """The folders holding this platform's worker code: ``server/`` (sequence_ai_server) and the
    one holding ``seq`` (and the client and core packages beside it)."""
    here = Path(__file__).resolve().parents[2]          # server/ (or site-packages), not the package itself
    seq_root = Path(__import__("seq").__file__).resolve().parent.parent
    return [str(here)] + ([str(seq_root)] if seq_root != here else [])


# ---------------------------------------------------------------- events

@dataclass(frozen=True)
class Placed:
    """The launcher found room for the worker. ``where``: words for operators ("local", or the
    Ray node / group); ``node``: which machine of a cluster runs it (an opaque id, the same for
    every worker on that machine; rank 0's for a group), None on the gateway's own machine."""
    where: str
    node: Optional[str] = None


@dataclass(frozen=True)
class Started:
    """The worker process runs (``pid`` on its node)."""
    pid: int


@dataclass(frozen=True)
class Phase:
    """The worker's load phase changed (``report``: ``{"phase", "spec"?, "t"}``)."""
    report: dict


@dataclass(frozen=True)
class Ready:
    """The worker serves at ``url`` (``report``: ``{"port", "pid", "url", "host"?, "spec", ...}``)."""
    url: str
    report: dict


@dataclass(frozen=True)
class Log:
    """Bytes of the worker's output the gateway has not written to its log yet."""
    chunk: bytes


@dataclass(frozen=True)
class Exited:
    """The worker ended with ``code`` (0..255, -signal, or ``_proc.EXIT_UNKNOWN``); ``error``:
    the ``{"phase", "detail", "exception_type", "traceback"}`` its failed load reported, or None."""
    code: int
    error: Optional[dict] = None


@dataclass(frozen=True)
class Failed:
    """The launcher could not start the worker at all (``reason``, for the deployment's error);
    an ``Exited`` follows."""
    reason: str
    details: Optional[dict] = None


LaunchEvent = Union[Placed, Started, Phase, Ready, Log, Exited, Failed]


class EventQueue:
    """A thread-safe list of events: the launcher's threads ``put``, the supervisor ``drain``s."""

    def __init__(self) -> None:
        self._items: list = []
        self._lock = threading.Lock()

    def put(self, event: LaunchEvent) -> None:
        with self._lock:
            self._items.append(event)

    def drain(self) -> list:
        """Every event since the last drain, oldest first."""
        with self._lock:
            items, self._items = self._items, []
        return items


class WorkerHandle(Protocol):
    """One started worker. Behaves like ``subprocess.Popen`` for stopping it (``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``)."""

    pid: int
    returncode: Optional[int]

    def events(self) -> list:
        """The events since the last call (``LaunchEvent``), oldest first."""

    def set_secret(self, secret: str) -> None:
        """Give the worker a new direct secret (rotation): tokens signed with the old one fail."""

    def last_activity(self) -> float:
        """When the worker last accepted a request (unix s; 0 when it has not)."""

    def poll(self) -> Optional[int]: ...
    def wait(self, timeout: Optional[float] = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    """Starts workers from specs. ``adopts``: whether its workers outlive the gateway (and a
    restarted gateway adopts them: the local launcher) or stop with it (Ray). ``places_cards``:
    whether something else (a Ray cluster) decides which cards a worker gets; when False the
    gateway checks ``gpu=`` against this machine's cards (ops/service.py)."""

    adopts: bool
    places_cards: bool

    def start(self, spec: WorkerLaunchSpec, log_handle: Any) -> WorkerHandle:
        """Start ``spec``'s worker, its output going to ``log_handle`` (an open binary file);
        returns at once. Raises ``errors.ApiError`` for a spec this launcher cannot place."""

    def close(self) -> None:
        """Let go of what the launcher holds (a Ray connection)."""


# ---------------------------------------------------------------- the policy's declaration, read without importing it

def declared_resources(policy_file: str) -> dict:
    """The literal ``gpu``, ``max_gpus``, ``cpu`` and ``memory`` arguments of the file's
    ``@seq.policy(...)`` decorator, read with ``ast`` (the policy module is not imported on
    the gateway), plus ``concurrent``: the literal keyword arguments of its ``@seq.concurrent``
    when it has one. Non-literal values are left out. Raises OSError / SyntaxError for an
    unreadable file."""
    tree = ast.parse(Path(policy_file).read_text(), filename=policy_file)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        found: dict = {}
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            fn = dec.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name not in ("policy", "concurrent"):
                continue
            kws = {}
            for kw in dec.keywords:
                with contextlib.suppress(ValueError, SyntaxError):
                    kws[kw.arg] = ast.literal_eval(kw.value)
            found[name] = kws
        if "policy" in found:
            out = {k: v for k, v in found["policy"].items() if k in ("gpu", "max_gpus", "cpu", "memory")}
            if "concurrent" in found:
                out["concurrent"] = found["concurrent"]
            return out
    return {}


def launcher_for(config: Any, data_dir: Optional[Path] = None) -> Launcher:
    """The launcher ``config`` (a common.config.ServerConfig) asks for, by ``config.backend``:
    ``local``: a local.LocalLauncher (workers are subprocesses of the gateway; image environments
    under ``data_dir``/envs, see envs.py); ``ray``: a ray.RayLauncher on ``config.ray_address``
    (Ray is imported only then). Raises ValueError for any other backend name."""
    if config.backend == "local":
        from sequence_ai_server.launchers.envs import EnvBuilder
        from sequence_ai_server.launchers.local import LocalLauncher
        return LocalLauncher(EnvBuilder(Path(data_dir or config.data_dir)))
    if config.backend == "ray":
        from sequence_ai_server.launchers.ray import RayLauncher
        return RayLauncher(config.ray_address, config.ray_gpus_per_node)
    raise ValueError(f"unknown worker backend {config.backend!r}: SEQ_BACKEND is local or ray")
