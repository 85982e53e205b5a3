"""What runs on a Ray node for one worker: the actor that starts the worker process there
(:class:`WorkerActor`), the fan-out HTTP front rank 0 of a multi-machine group runs
(:class:`GroupFront`), and a group member's entry point (``python -m
sequence_ai_server.launchers.ray_node <worker args>``: join ``torch.distributed``, then run the worker).

The gateway side of these (placement, the handle and its events) is ray.py and
ray_handle.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
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

__all__ = ["WorkerActor", "GroupFront", "GROUP_ENV", "FANOUT_PATHS", "free_port"]

log = logging.getLogger("sequence_ai_server.launchers.ray")

GROUP_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
FANOUT_PATHS = ("/act", "/episode/end")


def free_port(host: str) -> int:
    """A port free on ``host`` now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the fan-out front (rank 0's actor)

class GroupFront:
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
        from sequence_ai_server.common.header_timeout import header_timeout_setting, timed_http_protocol
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                                    http=timed_http_protocol(header_timeout_setting(os.environ))))
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
        from sequence_ai_server.common.plain_http import client_options
        async with httpx.AsyncClient(timeout=httpx.Timeout(3600.0, connect=5.0), **client_options(),
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

class WorkerActor:
    """Runs one worker (or one group member) as its child on this node, with its run files in a
    private folder here. The child's ``--parent-pid`` is this actor, so it stops when the actor
    goes away; its ``--host`` is this node's IP as Ray knows it."""

    def __init__(self, secret: str):
        self.dir = tempfile.mkdtemp(prefix="seq-ray-worker-")
        self.ready_file = os.path.join(self.dir, "w.ready.json")
        self.secret_file = os.path.join(self.dir, "w.secret")
        self.activity_file = os.path.join(self.dir, "w.activity")
        self.log_file = os.path.join(self.dir, "w.log")
        self._write(self.secret_file, secret)
        self.log = open(self.log_file, "ab", buffering=0)
        self.proc: Optional[subprocess.Popen] = None
        self.front: Optional[GroupFront] = None

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
        return free_port(self._ip())

    def launch(self, spec: Any, base_env: dict, group: Optional[dict] = None) -> int:
        """Start the worker of ``spec`` (a launch.WorkerLaunchSpec) on this node's interpreter,
        its run files here, with ``base_env`` (the gateway's environment, Ray's own variables
        left out) under the spec's settings; ``group`` (``{RANK, WORLD_SIZE, MASTER_ADDR,
        MASTER_PORT, LOCAL_RANK}``) makes it a group member. Returns the worker's pid."""
        spec = dataclasses.replace(spec, run_dir=Path(self.dir), run_key="w", host=self._ip(), adoptable=False)
        cmd = spec.command(sys.executable, parent_pid=os.getpid())
        env = spec.environment(base_env)
        self._write(self.secret_file, spec.secret)
        if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:   # the cards Ray gave this actor
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        if group:
            env.update({k: str(group[k]) for k in GROUP_ENV})
            if int(group["RANK"]):
                env.pop("SEQ_CAPTURE_DIR", None)             # rank 0 alone records field data
            cmd[cmd.index("-m") + 1] = "sequence_ai_server.launchers.ray_node"   # _member_main, then the worker
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=spec.cwd, start_new_session=True)
        return self.proc.pid

    def start_front(self, member_urls: list) -> str:
        """Start the group's fan-out front on this node (rank 0); returns its URL."""
        if self.front is None:
            self.front = GroupFront(self._ip(), member_urls)
        return self.front.url

    def status(self, log_offset: int) -> dict:
        """``{"files": {ready|phase|error: text or None}, "activity": mtime (unix s) or 0, "code",
        "pid", "actor_pid", "log": bytes from log_offset, "log_offset"}`` (code and pid None/0
        before launch)."""
        files = {}
        for k, p in (("ready", self.ready_file), ("phase", self.ready_file + ".phase"), ("error", self.ready_file + ".error")):
            try:
                with open(p) as f:
                    files[k] = f.read()
            except OSError:
                files[k] = None
        try:
            activity = os.stat(self.activity_file).st_mtime
        except OSError:
            activity = 0.0
        with open(self.log_file, "rb") as f:
            f.seek(log_offset)
            chunk = f.read(1 << 20)
        return {"files": files, "activity": activity, "code": self.proc.poll() if self.proc else None,
                "pid": self.proc.pid if self.proc else 0, "actor_pid": os.getpid(),
                "log": chunk, "log_offset": log_offset + len(chunk)}

    def set_secret(self, secret: str) -> None:
        """Give the worker a new direct secret (it re-reads its secret file on change)."""
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
    run the ordinary worker (``sequence_ai_server.worker.main.main``) with ``argv``."""
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
    from sequence_ai_server.worker.main import main
    return main(argv)


def _local_ip_towards(addr: str) -> str:
    """This host's source address for packets to ``addr`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((addr, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"



if __name__ == "__main__":          # a group member: python -m sequence_ai_server.launchers.ray_node <worker args>
    sys.exit(_member_main(sys.argv[1:]))
