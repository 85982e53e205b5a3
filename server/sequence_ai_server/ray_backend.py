"""Workers placed by Ray; robots still talk straight to their worker.

``seq serve --backend ray --ray-address ADDR`` (or ``$SEQ_BACKEND=ray`` and
``$SEQ_RAY_ADDRESS`` for ``python -m sequence_ai_server.gateway``) makes the gateway start
each worker as a Ray actor instead of a local subprocess. Ray places and supervises it
(cpu / gpu / memory from the policy's ``@seq.policy`` declaration become the actor's
resources); the actor runs the very same worker command (``python -m
sequence_ai_server.worker``: the same FastAPI app and hosting code, under uvicorn) as a child
on its node, bound to that node's IP as Ray knows it, and reports the worker's phase / ready /
error files, its log and its exit back to the gateway. The gateway then behaves exactly as
with a local worker: 503 + Retry-After while the actor boots, the worker's URL in the connect
answer, and every ``/act`` goes straight to the worker (Ray is not on the robot path).

Multi-machine groups. ``gpu="TYPE:N"`` with N above the cards of one machine
(``$SEQ_RAY_GPUS_PER_NODE``, default 8 cards a machine) is one copy of the model on
N / per-node machines: a Ray placement group (STRICT_SPREAD, one bundle of per-node cards per
machine) holds them, started and stopped together. Member ``r`` runs the worker with
``RANK=r``, ``WORLD_SIZE``, ``MASTER_ADDR`` (rank 0's node IP), ``MASTER_PORT`` (a free port
there) and ``LOCAL_RANK=0`` in its environment before anything of the policy is imported, and
with torch installed ``torch.distributed`` is initialised (NCCL with CUDA, else gloo) before the
policy module loads. Rank 0's actor also runs a small fan-out front: the gateway hands robots
its URL; ``POST /act`` and ``POST /episode/end`` go to every member at once (one at a time, so
every member sees the collectives in the same order) and rank 0's answer goes back; anything
else is rank 0's alone. When one member stops, the whole group stops (``group_member_lost`` in
the log) and the next connect starts a new one.

The launcher interface the gateway uses is one method, ``start(cmd, *, stdout, env, cwd,
**popen_kwargs)``, returning a handle that behaves like ``subprocess.Popen`` (``pid``,
``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``, ``returncode``), plus ``close()``.

The worker binds its node's IP and the ready file it gets from here carries the full ``url``
(and, for a group, ``host``); the gateway hands robots that host (``worker_host``), so a worker
on another machine is reached directly. Limits of this slice: ``$SEQ_CAPTURE_DIR`` and
``$SEQ_GATEWAY_URL`` (declared secrets) still name the gateway's machine.
"""
from __future__ import annotations

import ast
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["RayLauncher", "RayWorker", "declared_resources", "actor_options", "max_workers", "group_layout",
           "gpus_per_node", "launcher_for", "launcher_from_env", "RAY_NAMESPACE", "GROUP_ENV"]

log = logging.getLogger("sequence_ai_server.ray_backend")

RAY_NAMESPACE = "sequence-ai"
POLL_S = 0.1                 # how often the gateway side asks the actor for news
DEFAULT_CPU = 1.0            # when the policy declares no cpu= (one core per worker)
DEFAULT_GPUS_PER_NODE = 8    # past 8 cards a model runs on whole machines of 8 cards
MAX_GROUP_CARDS = 256        # the most cards one group may span; more is refused
STOP_GRACE_S = 5.0
GROUP_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
FANOUT_PATHS = ("/act", "/episode/end")
_MIRRORED = ("ready", "phase", "error")


# ---------------------------------------------------------------- resources

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


def _gpu_cards(gpu: Any) -> int:
    first = gpu[0] if isinstance(gpu, list) and gpu else gpu
    if not first or not isinstance(first, str) or first.lower() == "cpu":
        return 0
    _, _, count = first.partition(":")
    return int(count) if count else 1


def gpus_per_node() -> int:
    """Cards in one machine of a multi-machine group: ``$SEQ_RAY_GPUS_PER_NODE`` (default 8,
    cards a machine; read through config.ServerConfig). Raises ValueError for a value that is not
    a whole number >= 1."""
    from .config import gpus_per_node_setting
    return gpus_per_node_setting(os.environ)


def group_layout(resources: dict, per_node: Optional[int] = None) -> tuple[int, int]:
    """``(members, cards per member)`` for one worker of a policy: ``(1, cards)`` when
    ``gpu="TYPE:N"`` fits on one machine (N <= ``per_node``, default ``gpus_per_node()``),
    else ``(N // per_node, per_node)`` -- one member per whole machine. Raises ValueError when
    N is not a multiple of ``per_node``, exceeds 256 cards (``MAX_GROUP_CARDS``), or the class
    asks ``@seq.concurrent`` for several copies (a group is one copy of the model)."""
    per_node = per_node or gpus_per_node()
    cards = _gpu_cards(resources.get("gpu"))
    if cards <= per_node:
        return 1, cards
    copies = {k: v for k, v in (resources.get("concurrent") or {}).items()
              if k in ("replicas_per_gpu", "gpus_per_replica") and v is not None}
    if copies:
        raise ValueError(f"gpu={resources.get('gpu')!r} spans machines, so the group is one copy of the model; "
                         f"leave {', '.join(sorted(copies))} of @seq.concurrent unset")
    if cards > MAX_GROUP_CARDS:
        raise ValueError(f"gpu={resources.get('gpu')!r} asks for {cards} cards; a group holds at most {MAX_GROUP_CARDS}")
    if cards % per_node:
        raise ValueError(f"gpu={resources.get('gpu')!r} asks for {cards} cards, which is not whole machines of "
                         f"{per_node} (SEQ_RAY_GPUS_PER_NODE); ask for a multiple of {per_node}")
    return cards // per_node, per_node


def actor_options(resources: dict, per_node: Optional[int] = None) -> dict:
    """Ray actor options for one worker (or one group member): ``num_cpus`` (cpu= request,
    default 1), ``num_gpus`` (cards in ``gpu="TYPE[:N]"``, 0 for none/"cpu"; a group member's
    share when N spans machines, see ``group_layout``), ``memory`` in bytes (memory= is in GiB;
    the request of a (request, limit) pair). Raises ValueError as ``group_layout`` does."""
    cpu = resources.get("cpu")
    cpu = cpu[0] if isinstance(cpu, (list, tuple)) else cpu
    _, cards = group_layout(resources, per_node)
    opts: dict = {"num_cpus": float(cpu) if cpu is not None else DEFAULT_CPU, "num_gpus": cards}
    mem = resources.get("memory")
    mem = mem[0] if isinstance(mem, (list, tuple)) else mem
    if mem:
        opts["memory"] = int(float(mem) * (1 << 30))
    return opts


def max_workers(resources: dict) -> Optional[int]:
    """The most workers a deployment may run at once: ``max_gpus // cards per worker``
    (at least 1; a group counts all its cards); None when unbounded (no max_gpus, or a
    CPU-only policy)."""
    cards = _gpu_cards(resources.get("gpu"))
    if not cards or not resources.get("max_gpus"):
        return None
    return max(1, int(resources["max_gpus"]) // cards)


def _bundle(opts: dict) -> dict:
    b = {"CPU": opts["num_cpus"]}
    if opts["num_gpus"]:
        b["GPU"] = opts["num_gpus"]
    if opts.get("memory"):
        b["memory"] = opts["memory"]
    return b


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _set_arg(cmd: list, flag: str, value: str) -> None:
    if flag in cmd:
        cmd[cmd.index(flag) + 1] = value
    else:
        cmd += [flag, value]


# ---------------------------------------------------------------- the fan-out front (rank 0's actor)

class _Front:
    """An HTTP front for a group, on rank 0's node: ``POST /act`` and ``POST /episode/end``
    go to every member (serialised, so collectives meet in the same order everywhere) and
    rank 0's answer is returned; every other request goes to rank 0 only. Runs uvicorn on its
    own thread inside the actor; ``port`` is bound before the thread starts."""

    _FORWARD = ("authorization", "content-type", "x-request-id", "accept")
    _DROP = ("content-length", "transfer-encoding", "connection", "date", "server", "content-encoding")

    def __init__(self, host: str, member_urls: list):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.routing import Route
        self.urls = list(member_urls)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(128)                  # connections queue from here on, before uvicorn runs
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])],
                        lifespan=self._lifespan)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, name="seq-group-front", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and self.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.server.started:
            raise RuntimeError(f"the group's front did not start: {self.error!r}")

    def _run(self) -> None:
        import asyncio
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # noqa: BLE001 - reported by __init__ / the actor's log
            self.error = exc
            raise

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Any):
        import asyncio

        import httpx
        self.lock = asyncio.Lock()
        async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=5.0),
                                     limits=httpx.Limits(max_connections=64, max_keepalive_connections=16)) as client:
            self.client = client
            yield

    async def _handle(self, request: Any) -> Any:
        import asyncio

        import httpx
        from starlette.responses import JSONResponse, Response
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() in self._FORWARD}
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        fan = request.method == "POST" and request.url.path in FANOUT_PATHS

        async def one(url: str) -> Any:
            return await self.client.request(request.method, url + path, content=body, headers=headers)
        if fan:
            async with self.lock:
                answers = await asyncio.gather(*(one(u) for u in self.urls), return_exceptions=True)
        else:
            answers = await asyncio.gather(one(self.urls[0]), return_exceptions=True)
        for rank, a in enumerate(answers):
            if isinstance(a, (httpx.TransportError, OSError)):
                rid = request.headers.get("x-request-id")
                return JSONResponse(
                    {"detail": f"group member rank {rank} did not answer ({type(a).__name__}); the group stops",
                     "code": "worker_failed", "retryable": False, "retry_after_s": None, "request_id": rid,
                     "hint": "connect again: the next connect starts a new group",
                     "details": {"reason": "group_member_lost", "rank": rank}}, status_code=503)
            if isinstance(a, BaseException):
                raise a
            if rank and a.status_code != answers[0].status_code:
                log.warning("group member rank %d answered %s %d where rank 0 answered %d", rank, path,
                            a.status_code, answers[0].status_code)
        first = answers[0]
        return Response(first.content, status_code=first.status_code,
                        headers={k: v for k, v in first.headers.items() if k.lower() not in self._DROP})

    def close(self) -> None:
        self.server.should_exit = True


# ---------------------------------------------------------------- the actor (runs on a Ray node)

class _WorkerActor:
    """Runs one worker command (or one group member) as its child on this node, in a private
    run dir. The child's ``--parent-pid`` is this actor, so it stops when the actor goes away;
    its ``--host`` is this node's IP as Ray knows it."""

    def __init__(self, secret: str):
        self.dir = tempfile.mkdtemp(prefix="seq-ray-worker-")
        self.files = {k: os.path.join(self.dir, f"w.ready.json{'' if k == 'ready' else '.' + k}") for k in _MIRRORED}
        self.secret_file = os.path.join(self.dir, "w.secret")
        self.activity_file = os.path.join(self.dir, "w.activity")
        self.log_file = os.path.join(self.dir, "w.log")
        self._write(self.secret_file, secret)
        self.log = open(self.log_file, "ab", buffering=0)
        self.proc: Optional[subprocess.Popen] = None
        self.front: Optional[_Front] = None

    @staticmethod
    def _write(path: str, text: str) -> None:
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)

    @staticmethod
    def _ip() -> str:
        import ray
        return ray.util.get_node_ip_address()

    def node(self) -> dict:
        """``{"ip", "node_id", "actor_pid"}`` of this actor's node."""
        import ray
        return {"ip": self._ip(), "node_id": ray.get_runtime_context().get_node_id(), "actor_pid": os.getpid()}

    def free_port(self) -> int:
        """A port free on this node's IP now (rank 0: the group's MASTER_PORT)."""
        return _free_port(self._ip())

    def launch(self, cmd: list, env: dict, cwd: str, group: Optional[dict] = None) -> int:
        """Start the worker; ``group`` (``{RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
        LOCAL_RANK}``) makes it a group member. Returns the worker's pid."""
        cmd = list(cmd)
        cmd[0] = sys.executable                    # this node's interpreter, not the gateway's path
        _set_arg(cmd, "--ready-file", self.files["ready"])
        _set_arg(cmd, "--host", self._ip())
        if "--parent-pid" in cmd:
            _set_arg(cmd, "--parent-pid", str(os.getpid()))
        child_env = dict(env)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:   # the cards Ray gave this actor
            child_env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        child_env["SEQ_WORKER_SECRET_FILE"] = self.secret_file
        child_env["SEQ_WORKER_ACTIVITY_FILE"] = self.activity_file
        if group:
            child_env.update({k: str(group[k]) for k in GROUP_ENV})
            if int(group["RANK"]):
                child_env.pop("SEQ_CAPTURE_DIR", None)             # rank 0 alone records field data
            if "-m" in cmd and cmd[cmd.index("-m") + 1] == "sequence_ai_server.worker":
                cmd[cmd.index("-m") + 1] = "sequence_ai_server.ray_backend"   # _member_main, then the worker
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=child_env, cwd=cwd, start_new_session=True)
        return self.proc.pid

    def start_front(self, member_urls: list) -> str:
        """Start the group's fan-out front on this node (rank 0); returns its URL."""
        if self.front is None:
            self.front = _Front(self._ip(), member_urls)
        return self.front.url

    def status(self, log_offset: int) -> dict:
        """``{"files": {ready|phase|error|activity: text or None}, "code", "pid", "actor_pid",
        "log": bytes from log_offset, "log_offset"}`` (code and pid None before launch)."""
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
        return {"files": files, "code": self.proc.poll() if self.proc else None,
                "pid": self.proc.pid if self.proc else 0, "actor_pid": os.getpid(),
                "log": chunk, "log_offset": log_offset + len(chunk)}

    def set_secret(self, secret: str) -> None:
        self._write(self.secret_file, secret)

    def stop(self, grace_s: float) -> Optional[int]:
        """SIGTERM the worker, SIGKILL it after ``grace_s``; returns its exit code (None when
        it was never launched)."""
        if self.front is not None:
            self.front.close()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


# ---------------------------------------------------------------- a group member's entry point

def _gloo_interface(ip: str) -> Optional[str]:
    """The network interface that carries ``ip`` (gloo otherwise picks one from the hostname,
    which in a loopback-only namespace does not resolve to a usable address)."""
    try:
        import psutil
    except ImportError:
        return None
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    return None


def _member_main(argv: list) -> int:
    """A group member: with torch installed, join ``torch.distributed`` (NCCL with CUDA, else
    gloo; rank and rendezvous from the GROUP_ENV variables, already in the environment), then
    run the ordinary worker (``sequence_ai_server.worker.main``) with ``argv``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        try:
            import torch.distributed as dist
        except ImportError:
            dist = None
        if dist is not None and dist.is_available() and not dist.is_initialized():
            import datetime

            import torch
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
                iface = _gloo_interface(_local_ip_towards(os.environ["MASTER_ADDR"]))
                if iface:
                    os.environ["GLOO_SOCKET_IFNAME"] = iface
            print(f"joining torch.distributed ({backend}) as rank {os.environ['RANK']} of {world} at "
                  f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
            dist.init_process_group(backend, init_method="env://", rank=int(os.environ["RANK"]), world_size=world,
                                    timeout=datetime.timedelta(seconds=float(os.environ.get("SEQ_GROUP_JOIN_S", "300"))))
    from sequence_ai_server.worker import main
    return main(argv)


def _local_ip_towards(addr: str) -> str:
    """This host's source address for packets to ``addr`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((addr, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


# ---------------------------------------------------------------- the gateway-side handle

class RayWorker:
    """A ``subprocess.Popen`` look-alike for a worker running in a Ray actor -- or for a group
    of them (``len(actors) > 1``; rank 0 first). A background thread asks the actors for news
    every POLL_S s and mirrors rank 0's ready / phase / error / activity files and every
    member's log (lines of rank r > 0 prefixed ``[rank r]``) onto the gateway's paths; the
    direct secret travels the other way when the gateway rotates it. A group's ready file is
    written once every member is ready and the front runs (its URL, plus ``group``: one entry
    per member). A lost actor reads as exit code -9; any member's exit stops the whole group."""

    def __init__(self, actors: list, cmd: list, ready_file: str, secret_file: Optional[str],
                 activity_file: Optional[str], log_handle: Any, on_exit: Any = None,
                 launch: Optional[tuple] = None, placement_group: Any = None, asks: Optional[dict] = None):
        self.args = cmd
        self._asks = asks                       # the actor options, named in the "not placed yet" log line
        self._placing_noted = False
        self.actors = list(actors)
        self.actor = self.actors[0]
        self.returncode: Optional[int] = None
        self.pid: int = 0                       # rank 0's worker pid on its node, once known (0 before)
        self.actor_pid: Optional[int] = None
        self.members: list[dict] = [{"rank": r} for r in range(len(self.actors))]
        self._paths = {"ready": ready_file, "phase": ready_file + ".phase", "error": ready_file + ".error",
                       "activity": activity_file}
        self._seen: dict = {}
        self._secret_file = secret_file
        self._secret_sent = Path(secret_file).read_text() if secret_file else None
        self._log = log_handle
        self._on_exit = on_exit
        self._launch = launch                   # (cmd, env, cwd) for a group, launched once placed
        self._pg = placement_group
        self._done = threading.Event()
        self._stop_sent = False
        self._line_start = [True] * len(self.actors)
        self._thread = threading.Thread(target=self._watch, name="ray-worker-watch", daemon=True)
        self._thread.start()

    # -- lifecycle
    def _finish(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._done.set()
        import ray
        for a in self.actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)          # give the resources back
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group
            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
        if self._on_exit:
            self._on_exit(self)

    def _write_log(self, rank: int, chunk: bytes) -> None:
        if not chunk or self._log is None:
            return
        if rank:
            prefix = f"[rank {rank}] ".encode()
            lines = chunk.split(b"\n")
            out = []
            for i, line in enumerate(lines):
                at_start = self._line_start[rank] if i == 0 else True
                out.append((prefix if at_start and (line or i < len(lines) - 1) else b"") + line)
            self._line_start[rank] = chunk.endswith(b"\n")
            chunk = b"\n".join(out)
        with contextlib.suppress(ValueError, OSError):
            self._log.write(chunk)

    def _mirror(self, key: str, text: str) -> None:
        path = self._paths.get(key)
        if path and text is not None and self._seen.get(key) != text:
            self._seen[key] = text
            tmp = path + ".mirror.tmp"
            Path(tmp).write_text(text)
            os.replace(tmp, path)

    def _get(self, refs: list) -> list:
        """ray.get that keeps waiting (5 s at a time) while the handle is live; raises
        RayActorError / other errors to the caller, TimeoutError once stopped."""
        import ray
        from ray.exceptions import GetTimeoutError
        while not self._done.is_set():
            if self._stop_sent and self._launch is not None:
                raise TimeoutError("stopped before the group was placed")
            try:
                return ray.get(refs, timeout=5.0)
            except GetTimeoutError:
                if self.actor_pid is None and not self._placing_noted:
                    self._note_placing()
                continue                                   # still placing / booting the actors
        raise TimeoutError("handle finished")

    def _note_placing(self) -> None:
        """Say once in the deployment's log that no actor answered yet (Ray may lack the
        resources it asks for: without this, a deploy that cannot be placed reads as a silent
        'spawning' until the caller's timeout)."""
        import ray
        self._placing_noted = True
        try:
            free = {k: v for k, v in ray.available_resources().items() if k in ("CPU", "GPU", "memory")}
        except Exception:  # noqa: BLE001 - only a hint; the cluster may be busy or gone
            free = "unknown"
        self._write_log(0, f"the worker actor is not up after 5 s: Ray is still placing or starting it (each of "
                           f"{len(self.actors)} asks {self._asks}; free in the cluster now: {free}); it starts "
                           "once resources free up -- add a node or stop another deployment\n".encode())

    def _start_group(self) -> None:
        cmd, env, cwd = self._launch
        nodes = self._get([a.node.remote() for a in self.actors])
        port = self._get([self.actors[0].free_port.remote()])[0]
        master = nodes[0]["ip"]
        world = len(self.actors)
        for rank, (a, node) in enumerate(zip(self.actors, nodes)):
            self.members[rank].update(node_id=node["node_id"], node_ip=node["ip"], actor_pid=node["actor_pid"])
            group = {"RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": master, "MASTER_PORT": port, "LOCAL_RANK": 0}
            a.launch.remote(cmd, env, cwd, group)
        self._write_log(0, f"group of {world}: rank 0 on {master} (MASTER_PORT {port}); nodes "
                           f"{', '.join(n['node_id'][:8] for n in nodes)}\n".encode())
        self._launch = None

    def _watch(self) -> None:
        try:
            self._watch_inner()
        except Exception as exc:  # noqa: BLE001 - never leave the gateway with a handle that hangs
            log.exception("worker actor watch failed; stopping the worker")
            self._write_log(0, f"worker actor watch failed: {type(exc).__name__}: {exc}\n".encode())
            self._stop_all(STOP_GRACE_S)
            self._finish(-signal.SIGKILL)

    def _watch_inner(self) -> None:
        import json

        from ray.exceptions import RayActorError
        try:
            if self._launch is not None:
                self._start_group()
        except TimeoutError:
            self._finish(-signal.SIGTERM)
            return
        except RayActorError:
            self._finish(-signal.SIGKILL)
            return
        except Exception as exc:  # noqa: BLE001 - the cluster went away
            log.warning("lost touch with the worker group: %s", exc)
            self._finish(-signal.SIGKILL)
            return
        offsets = [0] * len(self.actors)
        pending = None
        group = len(self.actors) > 1
        while not self._done.is_set():
            if pending is None:
                pending = [a.status.remote(off) for a, off in zip(self.actors, offsets)]
            try:
                sts = self._get(pending)
            except TimeoutError:
                return
            except RayActorError as exc:
                self._write_log(0, f"group member lost ({type(exc).__name__}): group_member_lost; "
                                   "stopping the whole group\n".encode() if group else b"")
                self._finish(-signal.SIGKILL)
                return
            except Exception as exc:  # noqa: BLE001 - the cluster went away
                log.warning("lost touch with worker actor: %s", exc)
                self._finish(-signal.SIGKILL)
                return
            pending = None
            for rank, st in enumerate(sts):
                self.members[rank].update(pid=st["pid"], actor_pid=st["actor_pid"])
                self._write_log(rank, st["log"])
                offsets[rank] = st["log_offset"]
            first = sts[0]
            self.pid, self.actor_pid = first["pid"], first["actor_pid"]
            for k in ("phase", "error", "activity"):
                self._mirror(k, first["files"][k])
            if not group:
                self._mirror("ready", first["files"]["ready"])
            elif "ready" not in self._seen and all(st["files"]["ready"] for st in sts):
                readies = [json.loads(st["files"]["ready"]) for st in sts]
                for m, r in zip(self.members, readies):
                    m["url"] = r["url"]
                import ray
                front = ray.get(self.actors[0].start_front.remote([r["url"] for r in readies]), timeout=30)
                host, _, port = front.rpartition(":")
                self._mirror("ready", json.dumps({**readies[0], "port": int(port), "url": front,
                                                  "host": host.split("//")[-1], "group": self.members}))
            if self._secret_file:
                with contextlib.suppress(OSError):
                    secret = Path(self._secret_file).read_text()
                    if secret != self._secret_sent:
                        self._secret_sent = secret
                        for a in self.actors:
                            a.set_secret.remote(secret)
            ended = [(rank, st) for rank, st in enumerate(sts) if st["code"] is not None]
            if ended:
                rank, st = ended[0]
                if group:
                    if st["files"]["error"]:
                        self._mirror("error", st["files"]["error"])
                    if not self._stop_sent:
                        self._write_log(0, f"group member rank {rank} exited with code {st['code']}: "
                                           "group_member_lost; stopping the whole group\n".encode())
                    self._stop_all(STOP_GRACE_S)
                self._finish(st["code"])
                return
            self._done.wait(POLL_S)

    def _stop_all(self, grace_s: float) -> None:
        import ray
        with contextlib.suppress(Exception):
            ray.get([a.stop.remote(grace_s) for a in self.actors], timeout=grace_s + 5)

    # -- Popen surface
    def poll(self) -> Optional[int]:
        """None while the worker (every group member) runs, else its exit code."""
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Block until the worker exits (subprocess.TimeoutExpired after ``timeout`` s)."""
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """SIGKILL kills the actors at once; any other signal asks every member to stop (the
        worker's own SIGTERM path: open episodes end, @seq.shutdown runs; SIGKILL after 5 s).
        A worker no actor has answered for yet (still waiting for Ray to place it) has nothing
        to drain: any signal kills it at once (a queued stop would only run once placed)."""
        if self.returncode is not None:
            return
        if sig == signal.SIGKILL or self.actor_pid is None:
            self.kill()
        elif not self._stop_sent:
            self._stop_sent = True
            for a in self.actors:
                a.stop.remote(STOP_GRACE_S)

    def terminate(self) -> None:
        """send_signal(SIGTERM)."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """Kill every actor (and with it its worker) now."""
        self._finish(-signal.SIGKILL)


# ---------------------------------------------------------------- the launcher

class RayLauncher:
    """Starts workers as Ray actors. ``address``: a running cluster (``HOST:PORT``, ``auto``)
    or ``local`` (start a private loopback head inside this process; its default when
    ``$SEQ_RAY_ADDRESS`` is unset). Raises ConnectionError when the cluster is unreachable."""

    def __init__(self, address: str = "local", gpus_per_node: Optional[int] = None):
        self.gpus_per_node = gpus_per_node     # None: $SEQ_RAY_GPUS_PER_NODE at each start
        if address == "local" and "ray" not in sys.modules:
            # the private head authenticates with a token that lives in this process's environment
            # only (Ray would otherwise write ~/.ray/auth_token, which every later `ray start` on
            # this account picks up); RAY_* variables never reach the policy's worker. Ray reads
            # these when it is first imported.
            if os.environ.setdefault("RAY_AUTH_MODE", "token") == "token" and not (
                    os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
                os.environ["RAY_AUTH_TOKEN"] = __import__("secrets").token_hex(32)
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # Ray core on loopback (read at import)
        import ray
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
        """Place one worker actor for ``cmd`` (a ``sequence_ai_server.worker`` command line) --
        or, for ``gpu="TYPE:N"`` past one machine, a placement group of members -- and return
        its Popen-like handle at once (placement and boot happen in the background).
        Raises ``ApiError("invalid_request")`` when the deployment already runs ``max_gpus``
        worth of workers, or its card count is not whole machines (see ``group_layout``)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .errors import ApiError
        file = cmd[cmd.index("--file") + 1]
        name = cmd[cmd.index("--name") + 1] if "--name" in cmd else Path(file).stem
        resources = declared_resources(file)
        try:
            members, _ = group_layout(resources, self.gpus_per_node)
            opts = actor_options(resources, self.gpus_per_node)
        except ValueError as exc:
            raise ApiError("invalid_request", f"{name}: {exc}",
                           hint="change gpu= in @seq.policy, or SEQ_RAY_GPUS_PER_NODE for this cluster") from None
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
        tag = f"seq-worker-{name}-{os.urandom(3).hex()}"
        pg = None
        if members == 1:
            actors = [self._actor_cls.options(**opts, max_restarts=0, name=tag).remote(secret)]
            actors[0].launch.remote(cmd, child_env, cwd or os.getcwd())      # queued until the actor is up
            launch = None
        else:
            pg = placement_group([_bundle(opts)] * members, strategy="STRICT_SPREAD", name=tag)
            actors = [self._actor_cls.options(**opts, max_restarts=0, name=f"{tag}-rank{r}",
                                              scheduling_strategy=PlacementGroupSchedulingStrategy(pg, r)).remote(secret)
                      for r in range(members)]
            launch = (cmd, child_env, cwd or os.getcwd())
            log.info("%s: a group of %d members (%s each) in placement group %s", name, members, _bundle(opts), tag)

        def gone(w: RayWorker) -> None:
            with self._lock:
                self._live.get(name, set()).discard(w)
        handle = RayWorker(actors, cmd, ready_file, env.get("SEQ_WORKER_SECRET_FILE"),
                           env.get("SEQ_WORKER_ACTIVITY_FILE"), stdout, on_exit=gone, launch=launch,
                           placement_group=pg, asks=opts)
        with self._lock:
            if handle.returncode is None:
                live.add(handle)
        return handle

    def close(self) -> None:
        """Disconnect from the cluster (a ``local`` head stops with it)."""
        import ray
        with contextlib.suppress(Exception):
            ray.shutdown()


def launcher_for(config: Any) -> Optional[RayLauncher]:
    """The launcher ``config`` (a config.ServerConfig) asks for: None for backend ``local``
    (plain subprocesses), else a RayLauncher on ``config.ray_address``."""
    if config.backend == "local":
        return None
    return RayLauncher(config.ray_address, config.ray_gpus_per_node)


def launcher_from_env() -> Optional[RayLauncher]:
    """``$SEQ_BACKEND``: ``local`` (default, returns None: plain subprocesses) or ``ray``
    (a RayLauncher on ``$SEQ_RAY_ADDRESS``, default ``local``). Raises ValueError for any
    other backend name."""
    from .config import ServerConfig
    return launcher_for(ServerConfig.from_env())


if __name__ == "__main__":          # a group member: python -m sequence_ai_server.ray_backend <worker args>
    sys.exit(_member_main(sys.argv[1:]))
