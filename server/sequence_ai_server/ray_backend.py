"""Workers placed by Ray; robots still talk straight to their worker.

``seq serve --backend ray --ray-address ADDR`` (or ``$SEQ_BACKEND=ray`` and
``$SEQ_RAY_ADDRESS`` for ``python -m sequence_ai_server.gateway``) makes the gateway start
each worker as a Ray actor instead of a local subprocess. Ray places and supervises it
(cpu / gpu / memory from the policy's ``@seq.policy`` declaration become the actor's
resources); the actor runs the very same worker command (``python -m
sequence_ai_server.worker``: the same FastAPI app and hosting code, under uvicorn) as a child
on its node, and reports the worker's phase / ready / error files, its log and its exit back
to the gateway. The gateway then behaves exactly as with a local worker: 503 + Retry-After
while the actor boots, the worker's URL in the connect answer, and every ``/act`` goes
straight to the worker (Ray is not on the robot path).

The launcher interface the gateway uses is one method, ``start(cmd, *, stdout, env, cwd,
**popen_kwargs)``, returning a handle that behaves like ``subprocess.Popen`` (``pid``,
``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``, ``returncode``), plus ``close()``.

Limits of this slice (see the issue): the worker binds 127.0.0.1, so the actor must run on
the gateway's machine (several Ray nodes on one machine work; other machines need a routable
bind address); multi-card placement groups (``gpu="TYPE:N"`` across nodes) are not built.
"""
from __future__ import annotations

import ast
import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

__all__ = ["RayLauncher", "RayWorker", "declared_resources", "actor_options", "max_workers",
           "launcher_from_env", "RAY_NAMESPACE"]

log = logging.getLogger("sequence_ai_server.ray_backend")

RAY_NAMESPACE = "sequence-ai"
POLL_S = 0.1                 # how often the gateway side asks the actor for news
DEFAULT_CPU = 1.0            # when the policy declares no cpu= (one core per worker)
_MIRRORED = ("ready", "phase", "error")


# ---------------------------------------------------------------- resources

def declared_resources(policy_file: str) -> dict:
    """The literal ``gpu``, ``max_gpus``, ``cpu`` and ``memory`` arguments of the file's
    ``@seq.policy(...)`` decorator, read with ``ast`` (the policy module is not imported on
    the gateway). Non-literal values are left out. Raises OSError / SyntaxError for an
    unreadable file."""
    tree = ast.parse(Path(policy_file).read_text(), filename=policy_file)
    out: dict = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            fn = dec.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            if name != "policy":
                continue
            for kw in dec.keywords:
                if kw.arg in ("gpu", "max_gpus", "cpu", "memory"):
                    with contextlib.suppress(ValueError, SyntaxError):
                        out[kw.arg] = ast.literal_eval(kw.value)
            return out
    return out


def _gpu_cards(gpu: Any) -> int:
    first = gpu[0] if isinstance(gpu, list) and gpu else gpu
    if not first or not isinstance(first, str) or first.lower() == "cpu":
        return 0
    _, _, count = first.partition(":")
    return int(count) if count else 1


def actor_options(resources: dict) -> dict:
    """Ray actor options for one worker: ``num_cpus`` (cpu= request, default 1),
    ``num_gpus`` (cards in ``gpu="TYPE[:N]"``, 0 for none/"cpu"), ``memory`` in bytes
    (memory= is in GiB; the request of a (request, limit) pair)."""
    cpu = resources.get("cpu")
    cpu = cpu[0] if isinstance(cpu, (list, tuple)) else cpu
    opts: dict = {"num_cpus": float(cpu) if cpu is not None else DEFAULT_CPU,
                  "num_gpus": _gpu_cards(resources.get("gpu"))}
    mem = resources.get("memory")
    mem = mem[0] if isinstance(mem, (list, tuple)) else mem
    if mem:
        opts["memory"] = int(float(mem) * (1 << 30))
    return opts


def max_workers(resources: dict) -> Optional[int]:
    """The most workers a deployment may run at once: ``max_gpus // cards per worker``
    (at least 1); None when unbounded (no max_gpus, or a CPU-only policy)."""
    cards = _gpu_cards(resources.get("gpu"))
    if not cards or not resources.get("max_gpus"):
        return None
    return max(1, int(resources["max_gpus"]) // cards)


# ---------------------------------------------------------------- the actor (runs on a Ray node)

class _WorkerActor:
    """Runs one worker command as its child on this node, in a private run dir. The child's
    ``--parent-pid`` is this actor, so it stops when the actor goes away."""

    def __init__(self, cmd: list, env: dict, cwd: str, secret: str):
        self.dir = tempfile.mkdtemp(prefix="seq-ray-worker-")
        self.files = {k: os.path.join(self.dir, f"w.ready.json{'' if k == 'ready' else '.' + k}") for k in _MIRRORED}
        self.secret_file = os.path.join(self.dir, "w.secret")
        self.activity_file = os.path.join(self.dir, "w.activity")
        self.log_file = os.path.join(self.dir, "w.log")
        self._write(self.secret_file, secret)
        cmd = list(cmd)
        cmd[cmd.index("--ready-file") + 1] = self.files["ready"]
        if "--parent-pid" in cmd:
            cmd[cmd.index("--parent-pid") + 1] = str(os.getpid())
        child_env = dict(env)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:   # the cards Ray gave this actor
            child_env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        child_env["SEQ_WORKER_SECRET_FILE"] = self.secret_file
        child_env["SEQ_WORKER_ACTIVITY_FILE"] = self.activity_file
        self.log = open(self.log_file, "ab", buffering=0)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=child_env, cwd=cwd, start_new_session=True)

    @staticmethod
    def _write(path: str, text: str) -> None:
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)

    def status(self, log_offset: int) -> dict:
        """``{"files": {ready|phase|error|activity: text or None}, "code", "pid", "actor_pid",
        "log": bytes from log_offset, "log_offset"}``."""
        files = {}
        for k, p in [*self.files.items(), ("activity", self.activity_file)]:
            try:
                with open(p) as f:
                    files[k] = f.read()
            except OSError:
                files[k] = None
        with open(self.log_file, "rb") as f:
            f.seek(log_offset)
            chunk = f.read(1 << 20)
        return {"files": files, "code": self.proc.poll(), "pid": self.proc.pid, "actor_pid": os.getpid(),
                "log": chunk, "log_offset": log_offset + len(chunk)}

    def set_secret(self, secret: str) -> None:
        self._write(self.secret_file, secret)

    def stop(self, grace_s: float) -> int:
        """SIGTERM the worker, SIGKILL it after ``grace_s``; returns its exit code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# ---------------------------------------------------------------- the gateway-side handle

class RayWorker:
    """A ``subprocess.Popen`` look-alike for a worker running in a Ray actor. A background
    thread asks the actor for news every POLL_S s and mirrors the worker's ready / phase /
    error / activity files and its log onto the gateway's paths; the direct secret travels
    the other way when the gateway rotates it. A lost actor reads as exit code -9."""

    def __init__(self, actor: Any, cmd: list, ready_file: str, secret_file: Optional[str],
                 activity_file: Optional[str], log_handle: Any, on_exit: Any = None):
        self.args = cmd
        self.actor = actor
        self.returncode: Optional[int] = None
        self.pid: int = 0                       # the worker's pid on its node, once known (0 before)
        self.actor_pid: Optional[int] = None
        self._paths = {"ready": ready_file, "phase": ready_file + ".phase", "error": ready_file + ".error",
                       "activity": activity_file}
        self._seen: dict = {}
        self._secret_file = secret_file
        self._secret_sent = Path(secret_file).read_text() if secret_file else None
        self._log = log_handle
        self._on_exit = on_exit
        self._done = threading.Event()
        self._stop_sent = False
        self._thread = threading.Thread(target=self._watch, name="ray-worker-watch", daemon=True)
        self._thread.start()

    def _finish(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._done.set()
        import ray
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)          # give the resources back
        if self._on_exit:
            self._on_exit(self)

    def _watch(self) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError
        offset, pending = 0, None
        while not self._done.is_set():
            if pending is None:
                pending = self.actor.status.remote(offset)
            try:
                st = ray.get(pending, timeout=5.0)
            except GetTimeoutError:
                continue                                   # still placing / booting the actor
            except RayActorError:
                self._finish(-signal.SIGKILL)
                return
            except Exception as exc:  # noqa: BLE001 - the cluster went away
                log.warning("lost touch with worker actor: %s", exc)
                self._finish(-signal.SIGKILL)
                return
            pending = None
            self.pid, self.actor_pid = st["pid"], st["actor_pid"]
            if st["log"] and self._log is not None:
                with contextlib.suppress(ValueError, OSError):
                    self._log.write(st["log"])
            offset = st["log_offset"]
            for k, text in st["files"].items():
                path = self._paths.get(k)
                if path and text is not None and self._seen.get(k) != text:
                    self._seen[k] = text
                    tmp = path + ".mirror.tmp"
                    Path(tmp).write_text(text)
                    os.replace(tmp, path)
            if self._secret_file:
                with contextlib.suppress(OSError):
                    secret = Path(self._secret_file).read_text()
                    if secret != self._secret_sent:
                        self._secret_sent = secret
                        self.actor.set_secret.remote(secret)
            if st["code"] is not None:
                self._finish(st["code"])
                return
            self._done.wait(POLL_S)

    # -- Popen surface
    def poll(self) -> Optional[int]:
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is not None:
            return
        if sig == signal.SIGKILL:
            self.kill()
        elif not self._stop_sent:
            self._stop_sent = True
            self.actor.stop.remote(5.0)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import ray
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
        self._finish(-signal.SIGKILL)


# ---------------------------------------------------------------- the launcher

class RayLauncher:
    """Starts workers as Ray actors. ``address``: a running cluster (``HOST:PORT``, ``auto``)
    or ``local`` (start a private loopback head inside this process; its default when
    ``$SEQ_RAY_ADDRESS`` is unset). Raises ConnectionError when the cluster is unreachable."""

    def __init__(self, address: str = "local"):
        import ray
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        here = Path(__file__).resolve().parent.parent
        seq_root = Path(__import__("seq").__file__).resolve().parent.parent
        paths = [str(here), str(seq_root)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
        runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
        kw: dict = dict(namespace=RAY_NAMESPACE, log_to_driver=False, configure_logging=False,
                        runtime_env=runtime_env, ignore_reinit_error=True)
        if address == "local":
            kw.update(include_dashboard=False, object_store_memory=100_000_000, _node_ip_address="127.0.0.1")
            ray.init(**kw)
        else:
            try:
                ray.init(address=address, **kw)
            except Exception as exc:  # noqa: BLE001 - ray raises several types here
                raise ConnectionError(f"cannot reach the Ray cluster at {address!r}: {exc}; "
                                      "start one with `ray start --head --node-ip-address=127.0.0.1` "
                                      "or pass --ray-address local") from exc
        self.address = address
        self._actor_cls = ray.remote(_WorkerActor)
        self._live: dict[str, set] = {}
        self._lock = threading.Lock()
        log.info("workers run as Ray actors (cluster %s)", address)

    def start(self, cmd: list, *, stdout: Any = None, env: Optional[dict] = None, cwd: Optional[str] = None,
              **_popen_kwargs: Any) -> RayWorker:
        """Place one worker actor for ``cmd`` (a ``sequence_ai_server.worker`` command line)
        and return its Popen-like handle at once (placement and boot happen in the background).
        Raises ``ApiError("invalid_request")`` when the deployment already runs ``max_gpus``
        worth of workers."""
        from .errors import ApiError
        file = cmd[cmd.index("--file") + 1]
        name = cmd[cmd.index("--name") + 1] if "--name" in cmd else Path(file).stem
        resources = declared_resources(file)
        cap = max_workers(resources)
        with self._lock:
            live = self._live.setdefault(name, set())
            if cap is not None and len(live) >= cap:
                raise ApiError("invalid_request",
                               f"{name} already runs {len(live)} worker(s), the most max_gpus={resources['max_gpus']} allows",
                               hint="raise max_gpus in @seq.policy, or stop a worker first")
        env = dict(env or os.environ)
        secret = env.pop("SEQ_WORKER_SECRET", "")
        ready_file = cmd[cmd.index("--ready-file") + 1]
        child_env = {k: v for k, v in env.items() if not k.startswith("RAY_")}
        child_env["SEQ_WORKER_SECRET"] = secret
        actor = self._actor_cls.options(**actor_options(resources), max_restarts=0,
                                        name=f"seq-worker-{name}-{os.urandom(3).hex()}").remote(
            cmd, child_env, cwd or os.getcwd(), secret)

        def gone(w: RayWorker) -> None:
            with self._lock:
                self._live.get(name, set()).discard(w)
        handle = RayWorker(actor, cmd, ready_file, env.get("SEQ_WORKER_SECRET_FILE"),
                           env.get("SEQ_WORKER_ACTIVITY_FILE"), stdout, on_exit=gone)
        with self._lock:
            if handle.returncode is None:
                live.add(handle)
        return handle

    def close(self) -> None:
        """Disconnect from the cluster (a ``local`` head stops with it)."""
        import ray
        with contextlib.suppress(Exception):
            ray.shutdown()


def launcher_from_env() -> Optional[RayLauncher]:
    """``$SEQ_BACKEND``: ``local`` (default, returns None: plain subprocesses) or ``ray``
    (a RayLauncher on ``$SEQ_RAY_ADDRESS``, default ``local``). Raises ValueError for any
    other backend name."""
    backend = os.environ.get("SEQ_BACKEND", "local").strip().lower() or "local"
    if backend == "local":
        return None
    if backend != "ray":
        raise ValueError(f"unknown worker backend {backend!r}: use 'local' or 'ray'")
    return RayLauncher(os.environ.get("SEQ_RAY_ADDRESS") or "local")
