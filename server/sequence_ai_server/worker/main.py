"""The worker: one process hosting one ``@seq.policy`` class behind ``POST /act``.

Where it sits: the robot client calls ``/act`` here directly (the gateway only hands out this
worker's URL and direct secret). The hosting itself -- contracts, decoding, params, replicas,
batching, episodes -- lives in ``host.PolicyHost``, the act pipeline every transport runs in
``act.py``, the app with its transports (HTTP ``app.py``, the /act channel, openpi) in
``asgi.py``; this module is the process around them. Per request the worker

  1. refuses a wrong bearer secret (401, constant-time) from the headers alone, before a byte of
     the body is read (``app.py``'s credentials check), then a body over the size limit (413),
  2. parses the body (JSON, or the binary framing with raw JPEG/PNG blobs) and checks it against
     the ObservationContract and the declared params, decoding each frame once -- on a thread,
     never on the event loop,
  3. queues it on its replica (sticky per episode); infer() runs on that replica's thread,
  4. answers 504 request_timeout if infer runs past ``timeouts.request`` (it still finishes),
  5. checks the chunk against the ActionContract (clip with warnings, or refuse).

Startup: the socket is bound and served at once; ``/ping`` and ``/act`` answer 503 warming with
Retry-After and the load's ``job_id`` while the policy is imported, loaded, warmed up and checked
with one synthetic observation in the background. A start that raises, or runs past
``timeouts.startup``, writes ``<ready-file>.error`` and exits 3. Once ready the worker writes
``--ready-file`` atomically (``{"port", "pid", "url", "load_s", ...}``); ``<ready-file>.phase``
holds the current phase all along. SIGTERM runs ``@seq.on_episode`` for open episodes, then
``@seq.shutdown``.

Who may call what: ``/act`` and ``/episode/end`` take the direct secret (a gateway-signed lease
token, or the raw worker secret); ``/control/revoke`` takes only the raw worker secret (the
gateway ends sessions there, ``leases.py``); ``/ping``, ``/info`` and ``/openapi.json`` are open.

    python -m sequence_ai_server.worker --file policy.py [--class C] --port 0 \\
        --secret S --ready-file /tmp/w.json [--name N] [--weights-dir D] [--cache-dir D] \\
        [--mode serve|eval] [--max-body-bytes N] [--max-connections N] [--parent-pid PID] \\
        [--supervisor-file F]

The secret may come from ``$SEQ_WORKER_SECRET`` instead of ``--secret`` (keeps it out of ps).
Supervision: ``--supervisor-file`` (what the local gateway passes) names the gateway supervising
the worker; when it dies the worker keeps serving the leases robots hold, a restarted gateway
adopts it, and without one it stops after the policy's ``idle_timeout`` with no request
(``_Supervision``). ``--parent-pid`` (a Ray actor) stops it as soon as that process goes away.
``$SEQ_EPISODE_IDLE_S`` overrides the 300 s after which an idle episode is ended.
``--max-connections`` (``$SEQ_WORKER_MAX_CONNECTIONS``, default 64): the open websockets -- /act
channels and openpi connections together -- the worker holds at once; one more upgrade is refused
503 ``too_many_connections`` (``connections.ConnectionBudget``).
A worker started by a gateway (``$SEQ_GATEWAY_URL``) polls it for ended sessions every
``$SEQ_REVOCATION_POLL_S`` (1 s; ``leases.RevocationPoller``); a gateway that does not answer
changes nothing on /act.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Optional

from sequence_ai_core.protocol import MAX_BODY_BYTES

from sequence_ai_server.worker.host import EPISODE_IDLE_S, PolicyError, PolicyHost, export_compile_caches, load_policy_class
from sequence_ai_server.common.config import ServerConfig
from sequence_ai_server.common.plain_http import client_options
from sequence_ai_server.common.logs import install_json_log
from sequence_ai_server.worker.asgi import WorkerState, create_app

__all__ = ["main"]

log = logging.getLogger("sequence_ai_server.worker")


# ---------------------------------------------------------------- process entry point

def _write_json_atomic(path: str, data: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _resolve_weights_dir(spec: Any, file: str, weights_dir: str) -> Any:
    """A local directory named by weights= is handed to load as is; otherwise the deployment's
    own directory (created, nothing fetched self-hosted). Named parts -> {part: directory}."""
    def one(ref: Any, part: Optional[str]) -> str:
        if isinstance(ref, str) and ref.startswith("vol://"):   # an uploaded volume (volumes.py), read-only
            from sequence_ai_server.common.volumes import resolve_volume
            root = os.environ.get("SEQ_VOLUMES_DIR") or str(Path(weights_dir).parent.parent / "volumes")
            return str(resolve_volume(Path(root), ref))
        if isinstance(ref, str):
            local = ref[len("file://"):] if ref.startswith("file://") else ref
            if "://" not in local:
                p = Path(local) if Path(local).is_absolute() else Path(file).resolve().parent / local
                if p.is_dir():
                    return str(p)
                raise FileNotFoundError(f"weights directory not found: {p}")
            log.warning("weights %s are not fetched by a self-hosted worker; load() gets %s", ref, weights_dir)
        d = Path(weights_dir) / part if part else Path(weights_dir)
        d.mkdir(parents=True, exist_ok=True)
        return str(d)
    if isinstance(spec.weights, dict):
        return {part: one(ref, part) for part, ref in spec.weights.items()}
    if spec.weights is None:
        Path(weights_dir).mkdir(parents=True, exist_ok=True)
        return weights_dir
    return one(spec.weights, None)


def _default_cache_dir(weights_dir: str, name: str) -> str:
    """<data_dir>/cache/<name> beside <data_dir>/weights/<name>; else <weights_dir>-cache."""
    w = Path(weights_dir)
    if w.parent.name == "weights":
        return str(w.parent.parent / "cache" / name)
    return str(w.with_name(w.name + "-cache"))


def _inject_secrets(names: list, worker_secret: str) -> None:
    """Fetch the policy's declared secrets from the gateway that started this
    worker ($SEQ_GATEWAY_URL, authenticated with the worker secret) and set them in os.environ.
    Values are never logged. Raises RuntimeError when there is no gateway or it refuses."""
    import httpx
    url = os.environ.get("SEQ_GATEWAY_URL")
    if not url:
        raise RuntimeError(f"the policy declares secrets {names} but this worker was not started by a gateway")
    r = httpx.post(f"{url}/v1/internal/worker-secrets", json={"names": list(names)},
                   headers={"Authorization": f"Bearer {worker_secret}"}, timeout=30.0, **client_options(url))
    if r.status_code != 200:
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        raise RuntimeError(f"could not fetch secrets {names}: {body.get('detail') or r.status_code}"
                           + (f" ({body['hint']})" if body.get("hint") else ""))
    os.environ.update(r.json()["env"])


class _Supervision:
    """Whether the gateway that supervises this worker is alive, and when an unsupervised worker
    should stop.

    The gateway keeps ``{"pid", "start"}`` (``_proc.process_start``) in the worker's supervisor
    file; a restarted gateway that adopts the worker writes its own there. While the process it
    names is gone (the gateway crashed, or was SIGKILLed) the worker is *orphaned*: it keeps
    serving the robots whose leases it can still verify itself, and stops once no request has
    come for the policy's ``idle_timeout`` (seconds; counted from the later of the last request
    -- the mtime of ``$SEQ_WORKER_ACTIVITY_FILE`` -- and the moment it was orphaned), so a
    gateway that never comes back leaves no worker running for ever. The gateway's own idle
    stop does the same while it is alive."""

    def __init__(self, path: str):
        self.path = path
        self.orphaned_at: Optional[float] = None
        self._alive = True

    def gateway_alive(self) -> bool:
        from sequence_ai_server.common.processes import process_alive
        try:
            raw = Path(self.path).read_text()
            sup = json.loads(raw)
            pid, start = int(sup["pid"]), sup.get("start")
        except (OSError, ValueError, KeyError, TypeError):
            return self._alive            # unreadable for a moment: no change
        return process_alive(pid, start)

    def orphan_idle_expired(self, host: Optional[PolicyHost]) -> bool:
        now = time.time()
        if self.gateway_alive():
            if self.orphaned_at is not None:
                log.info("a gateway supervises this worker again")
            self.orphaned_at, self._alive = None, True
            return False
        limit = float(getattr(getattr(host, "spec", None), "idle_timeout", None) or 600.0)
        if self.orphaned_at is None:
            self.orphaned_at, self._alive = now, False
            log.warning("the gateway supervising this worker is gone; it keeps serving valid leases and "
                        "stops after %g s (idle_timeout) without a request", limit)
        last = self.orphaned_at
        activity = os.environ.get("SEQ_WORKER_ACTIVITY_FILE")
        if activity:
            with contextlib.suppress(OSError):
                last = max(last, os.stat(activity).st_mtime)
        if now - last > limit:
            log.warning("no gateway and no request for %.0f s (idle_timeout %g s): stopping", now - last, limit)
            return True
        return False


def _at_least_one(raw: str) -> int:
    """argparse type: a whole number >= 1 (``--max-connections`` and its env default)."""
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a whole number >= 1 (--max-connections / "
                                         "$SEQ_WORKER_MAX_CONNECTIONS; default 64)")
    return n


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sequence_ai_server.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--file", required=True, help="the policy file")
    parser.add_argument("--class", dest="class_name", default=None, help="the @seq.policy class (if the file has several)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = an ephemeral port")
    parser.add_argument("--secret", default=None, help="direct secret (or $SEQ_WORKER_SECRET)")
    parser.add_argument("--ready-file", required=True, help="written atomically once serving: {port, pid, ...}")
    parser.add_argument("--name", default=None)
    parser.add_argument("--weights-dir", default=None,
                        help="the deployment's weights directory (default <data_dir>/weights/<name>; the data dir "
                             "is $SEQUENCES_HOME or ~/.sequence-ai, as ServerConfig reads it)")
    parser.add_argument("--cache-dir", default=None, help="compile caches (default: <data_dir>/cache/<name>)")
    parser.add_argument("--mode", choices=("serve", "eval"), default=os.environ.get("SEQ_WORKER_MODE", "serve"),
                        help="serve: batches never wait for more requests; eval: they gather (eval_wait_ms)")
    parser.add_argument("--max-body-bytes", type=int,
                        default=int(os.environ.get("SEQ_WORKER_MAX_BODY_BYTES", MAX_BODY_BYTES)))
    parser.add_argument("--max-connections", type=_at_least_one, default=os.environ.get("SEQ_WORKER_MAX_CONNECTIONS"),
                        help="open websockets (/act channels and openpi together) held at once; more are refused "
                             "503 too_many_connections (default $SEQ_WORKER_MAX_CONNECTIONS, else 64)")
    parser.add_argument("--inline", action=argparse.BooleanOptionalAction,
                        default=os.environ.get("SEQ_WORKER_INLINE", "").strip().lower() in ("1", "true", "yes", "on"),
                        help="serve a cheap policy's requests on the event loop's thread (0.1-0.3 ms less per "
                             "request; a call that hangs then stalls /ping and every robot until the gateway "
                             "replaces the worker). Default $SEQ_WORKER_INLINE, else off")
    parser.add_argument("--load-estimate-s", type=float, default=10.0, help="Retry-After basis while loading")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="exit when this process goes away (a Ray actor hosting the worker)")
    parser.add_argument("--supervisor-file", default=None,
                        help="JSON {pid, start} of the gateway supervising this worker (rewritten by a gateway "
                             "that adopts it); while that process is gone the worker keeps serving and exits "
                             "after the policy's idle_timeout without a request")
    return parser


class _Launch:
    """One start of the policy in the background: the phase file (``<ready-file>.phase``, all
    along), the ready file once serving, the error file (``<ready-file>.error``) and exit 3 when
    the start raises or runs past ``timeouts.startup``. Exactly one of ready / failed happens."""

    def __init__(self, args: argparse.Namespace, state: WorkerState, secret: str, info: dict,
                 weights_dir: str, idle_s: float):
        self.args, self.state, self.secret, self.info = args, state, secret, info
        self.weights_dir, self.idle_s = weights_dir, idle_s
        self.ready_file = os.path.abspath(args.ready_file)
        self.phase_file, self.error_file = self.ready_file + ".phase", self.ready_file + ".error"
        self.lock = threading.Lock()
        self.finished = threading.Event()

    def phase(self, p: str, **extra: Any) -> None:
        with self.lock:
            self.state.phase = p
            self.info.update(phase=p, t=time.time(), **extra)
            log.info("phase=%s", p)
            _write_json_atomic(self.phase_file, self.info)

    def fail(self, stage: str, exc: BaseException, tb: str) -> None:
        with self.lock:
            if self.finished.is_set():
                return
            self.finished.set()
        detail = f"{type(exc).__name__}: {exc}"
        log.error("failed while %s: %s\n%s", stage, detail, tb)
        report = {"phase": stage, "exception_type": type(exc).__name__, "detail": detail,
                  "traceback": tb, "job_id": self.state.job_id}
        if isinstance(exc, ModuleNotFoundError) and exc.name:   # what to install, and into which Python
            report.update(missing_module=exc.name, python=sys.executable)
        _write_json_atomic(self.error_file, report)
        self.phase("failed")
        sys.stdout.flush()
        os._exit(3)

    def load(self) -> None:
        """Import, construct, fetch declared secrets, load, warm up and check (on its own thread)."""
        args, state = self.args, self.state
        try:
            self.phase("importing")
            cls = load_policy_class(args.file, args.class_name)
            host = PolicyHost(cls, args.name, mode=args.mode, episode_idle_s=self.idle_s, inline=args.inline)
            self.phase("importing", spec=host.spec.to_dict())
            state.host = host
            if host.spec.secrets:   # declared secrets only, into the env, before load
                _inject_secrets(host.spec.secrets, self.secret)
            weights = _resolve_weights_dir(host.spec, args.file, self.weights_dir)
            host.start(weights, self.phase)
        except BaseException as exc:  # noqa: BLE001 - report whatever stops the start, then exit
            inner = exc.exc if isinstance(exc, PolicyError) else exc
            tb = exc.remote_traceback if isinstance(exc, PolicyError) else traceback.format_exc()
            self.fail(state.phase, inner, tb)
            return
        with self.lock:
            if self.finished.is_set():
                return
            self.finished.set()
        self.phase("ready")
        _write_json_atomic(self.ready_file, {"port": self.info["port"], "pid": os.getpid(), "url": self.info["url"],
                                             **host.timings, "job_id": state.job_id, "spec": host.spec.to_dict(),
                                             "caches": self.info["caches"]})
        log.info("serving %s on %s (%d slot(s), mode %s)", host.name, self.info["url"], len(host.replicas), host.mode)

    def check_startup(self) -> None:
        """Fail the start once it has run past the policy's ``timeouts.startup``."""
        host = self.state.host
        if host is not None and not host.ready and not self.finished.is_set():
            limit = host.spec.timeouts.startup
            if time.monotonic() - self.state.t0 > limit:
                self.fail(self.state.phase,
                          TimeoutError(f"the policy did not load within the startup timeout ({limit:g} s)"), "")


def _protocols(max_body_bytes: int, header_timeout_s: float) -> dict[str, Any]:
    """uvicorn's protocol choices: httptools (C parser; ~0.3 ms less CPU per /act than the
    pure-Python h11) when installed, with a deadline of ``header_timeout_s`` (s) on each
    request's headers (common/header_timeout.py), the ``websockets`` implementation for the /act
    channel with its message limit from the body limit (``channel.channel_max_size``), no
    compression (JPEG does not compress) and no server pings (the client pings; an idle robot
    costs nothing)."""
    from sequence_ai_server.common.header_timeout import timed_http_protocol
    from sequence_ai_server.worker.channel import channel_max_size
    chosen: dict[str, Any] = {"ws_max_size": channel_max_size(max_body_bytes), "ws_per_message_deflate": False,
                              "ws_ping_interval": None}
    try:
        import httptools  # noqa: F401
        chosen["http"] = timed_http_protocol(header_timeout_s, "httptools")
    except ImportError:
        chosen["http"] = timed_http_protocol(header_timeout_s, "h11")
    try:
        import websockets  # noqa: F401
    except ImportError:
        chosen["ws"] = "auto"       # wsproto when installed, else no websocket (clients use HTTP /act)
    else:
        from uvicorn.config import WS_PROTOCOLS   # the sans-I/O implementation where uvicorn has it
        chosen["ws"] = "websockets-sansio" if "websockets-sansio" in WS_PROTOCOLS else "websockets"
    return chosen


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose protocol is
    # IPPROTO_TCP; with 0 every response waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _keepalive(sock)
    sock.bind((host, port))
    return sock


# TCP keepalive on every accepted connection (Linux copies these from the listening socket): a
# robot whose link died without a FIN or RST holds its websocket place (``--max-connections``)
# for about KEEPIDLE + KEEPCNT x KEEPINTVL = 60 s, not the kernel's default of over two hours.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT = 30, 10, 3


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
        if hasattr(socket, name):           # Linux; elsewhere the system's keepalive timing applies
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


async def _serve(server: Any, sock: socket.socket, launch: _Launch, supervision: Optional[_Supervision]) -> None:
    """Serve at once, then load the policy on a thread; every 0.5 s (at most) check the startup
    timeout, end idle episodes, and stop when the parent or the supervising gateway is gone."""
    args, state = launch.args, launch.state
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.005)
    launch.phase("importing")
    threading.Thread(target=launch.load, name="policy-load", daemon=True).start()

    async def watch() -> None:
        while not server.should_exit:
            launch.check_startup()
            host = state.host
            if host is not None and host.ready:
                host.reap_idle_episodes()
            if args.parent_pid and os.getppid() != args.parent_pid:
                log.warning("parent %d went away; stopping", args.parent_pid)
                server.should_exit = True
            if supervision is not None and supervision.orphan_idle_expired(host):
                server.should_exit = True
            await asyncio.sleep(min(0.5, launch.idle_s / 4))
    asyncio.create_task(watch())
    await task


def main(argv: Optional[list[str]] = None) -> int:
    """Run one worker process (the arguments are in the module docstring); exits 0 when stopped,
    3 when the policy failed to start."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(asctime)s worker %(levelname)s %(message)s")
    if os.environ.get("SEQ_JSON_LOG"):   # the gateway's structured log for this deployment (logs.py)
        version = os.environ.get("SEQ_DEPLOYMENT_VERSION")
        install_json_log(Path(os.environ["SEQ_JSON_LOG"]), "worker", deployment=args.name,
                         version=int(version) if version and version.isdigit() else None)
    secret = args.secret or os.environ.get("SEQ_WORKER_SECRET")
    if not secret:
        parser.error("a direct secret is required: --secret or $SEQ_WORKER_SECRET")
    from sequence_ai_server.common.header_timeout import header_timeout_setting
    try:
        header_timeout_s = header_timeout_setting(os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    name = args.name or Path(args.file).stem
    ready_file = os.path.abspath(args.ready_file)
    for stale in (ready_file, ready_file + ".error"):
        if os.path.exists(stale):
            os.remove(stale)
    weights_dir = args.weights_dir or str(ServerConfig.from_env().data_dir / "weights" / name)
    caches = export_compile_caches(args.cache_dir or _default_cache_dir(weights_dir, name))
    idle_s = float(os.environ.get("SEQ_EPISODE_IDLE_S", EPISODE_IDLE_S))
    sock = _bind(args.host, args.port)
    port = sock.getsockname()[1]
    url = f"http://{args.host}:{port}"
    state = WorkerState(args.name, args.load_estimate_s)
    info: dict[str, Any] = {"pid": os.getpid(), "port": port, "url": url, "name": args.name, "job_id": state.job_id,
                            "caches": caches}
    launch = _Launch(args, state, secret, info, weights_dir, idle_s)
    supervision = _Supervision(args.supervisor_file) if args.supervisor_file else None

    import uvicorn
    worker_app = create_app(state, secret, max_body_bytes=args.max_body_bytes, max_connections=args.max_connections)
    from sequence_ai_server.common.leases import RevocationPoller   # sessions the gateway ended, when its push did not arrive
    RevocationPoller.from_env(worker_app.state.direct_auth)
    server = uvicorn.Server(uvicorn.Config(worker_app, log_level="warning", access_log=False, lifespan="off",
                                           timeout_graceful_shutdown=5, **_protocols(args.max_body_bytes, header_timeout_s)))
    # uvicorn re-raises the signal it caught once it has stopped: make that a no-op.
    signal.signal(signal.SIGTERM, lambda s, f: None)
    signal.signal(signal.SIGINT, lambda s, f: None)
    try:
        try:   # uvloop (libuv) when installed: ~0.5 ms less CPU per /act than asyncio's selector loop
            import uvloop
        except ImportError:
            asyncio.run(_serve(server, sock, launch, supervision))
        else:
            uvloop.run(_serve(server, sock, launch, supervision))
    finally:
        host = state.host
        if host is not None and host.ready:
            log.info("stopping: calling @seq.shutdown (open episodes end first)")
            host.stop()
        if worker_app.state.capture is not None:   # write the kept steps still queued
            worker_app.state.capture.close()
        log.info("stopped")
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)
