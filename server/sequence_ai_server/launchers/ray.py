"""Workers placed by Ray; robots still talk straight to their worker.

``seq serve --backend ray --ray-address ADDR`` (or ``$SEQ_BACKEND=ray`` and
``$SEQ_RAY_ADDRESS`` for ``python -m sequence_ai_server.gateway``) makes the gateway start
each worker as a Ray actor instead of a local subprocess. Ray places and supervises it
(cpu / gpu / memory from the policy's ``@seq.policy`` declaration become the actor's
resources); the actor runs the very same worker command (``python -m
sequence_ai_server.worker``: the same FastAPI app and hosting code, under uvicorn) as a child
on its node, bound to that node's IP as Ray knows it, and the worker's phase, ready and error
reports, its log and its exit come back to the gateway as launch events. The gateway then
behaves exactly as with a local worker: 503 + Retry-After while the actor boots, the worker's URL in the connect
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

:class:`RayLauncher` implements launch.Launcher: ``start(spec, log_handle)`` places the
actor(s) and returns a handle whose events (ray_handle.py) the supervisor reads; what runs on
the node is ray_node.py. A deployment whose ``image=`` has build steps is refused here (image
environments are built by the local launcher, envs.py).

The worker binds its node's IP and its Ready event carries the full ``url`` (and, for a
group, ``host``); the gateway hands robots that host (``worker_host``), so a worker on another
machine is reached directly. Limits of this slice: ``$SEQ_CAPTURE_DIR`` and
``$SEQ_GATEWAY_URL`` (declared secrets) still name the gateway's machine.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any, Optional

from sequence_ai_server.launchers.base import WorkerLaunchSpec, declared_resources, platform_paths
from sequence_ai_server.launchers.ray_node import GROUP_ENV
from sequence_ai_server.launchers.ray_handle import RayActorWorker, RayGroupWorker

__all__ = ["RayLauncher", "declared_resources", "actor_options", "max_workers", "group_layout",
           "gpus_per_node", "launcher_from_env", "RAY_NAMESPACE", "GROUP_ENV"]

log = logging.getLogger("sequence_ai_server.launchers.ray")

RAY_NAMESPACE = "sequence-ai"
DEFAULT_CPU = 1.0            # when the policy declares no cpu= (one core per worker)
DEFAULT_GPUS_PER_NODE = 8    # past 8 cards a model runs on whole machines of 8 cards
MAX_GROUP_CARDS = 256        # the most cards one group may span; more is refused


# ---------------------------------------------------------------- resources

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
    from sequence_ai_server.common.config import gpus_per_node_setting
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



# ---------------------------------------------------------------- the launcher

class RayLauncher:
    """Starts workers as Ray actors. ``address``: a running cluster (``HOST:PORT``, ``auto``)
    or ``local`` (start a private loopback head inside this process; its default when
    ``$SEQ_RAY_ADDRESS`` is unset). Raises ConnectionError when the cluster is unreachable."""

    places_cards = True     # the cluster decides which node's cards a worker gets
    adopts = False          # a worker stops with its actor, and the actor with this gateway's Ray connection

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
        paths = platform_paths() + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
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
        from sequence_ai_server.launchers.ray_node import WorkerActor
        self._actor_cls = ray.remote(WorkerActor)
        self._live: dict[str, set] = {}         # per deployment: its serving workers (builds are not counted)
        self._placing: dict[str, int] = {}       # per deployment: workers checked and being placed
        self._lock = threading.Lock()
        log.info("workers run as Ray actors (cluster %s)", address)

    def start(self, spec: WorkerLaunchSpec, log_handle: Any = None) -> RayActorWorker:
        """Place one worker actor for ``spec`` -- or, for ``gpu="TYPE:N"`` past one machine, a
        placement group of members -- and return its handle at once (placement and boot happen
        in the background; ``log_handle`` is unused: the output comes as Log events).
        Raises ``ApiError("deployment_full")`` (``details.reason`` too, as the local card pool
        words it, so the gateway answers a connect per ``on_full``) when the deployment's
        workers already hold its ``max_gpus`` -- a build is not counted and not refused: it
        replaces the serving worker -- and ``ApiError("invalid_request")`` when its card count
        is not whole machines (see ``group_layout``) or it declares an ``image=`` with build
        steps (built by the local launcher only)."""
        from sequence_ai_server.common.errors import ApiError
        name, resources = spec.name, spec.resources
        if spec.image:
            self.check_image(spec.image)
        try:
            members, _ = group_layout(resources, self.gpus_per_node)
            opts = actor_options(resources, self.gpus_per_node)
        except ValueError as exc:
            raise ApiError("invalid_request", f"{name}: {exc}",
                           hint="change gpu= in @seq.policy, or SEQ_RAY_GPUS_PER_NODE for this cluster") from None
        cap = max_workers(resources)
        counted = spec.role != "build"
        with self._lock:
            live = self._live.setdefault(name, set())
            held = len(live) + self._placing.get(name, 0)
            if cap is not None and counted and held >= cap:
                raise ApiError("deployment_full",
                               f"{name!r} already runs {held} worker(s), the most max_gpus={resources['max_gpus']} "
                               "allows", hint="raise max_gpus in @seq.policy, or stop a worker first",
                               details={"reason": "deployment_full", "max_gpus": resources["max_gpus"], "held": held})
            if counted:       # reserved in the same lock section as the check: two starts at once cannot both pass
                self._placing[name] = self._placing.get(name, 0) + 1
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        try:
            handle = self._place(spec, members, opts, base_env, live if counted else set())
        finally:
            if counted:
                with self._lock:
                    self._placing[name] -= 1
        if counted:
            with self._lock:
                if handle.returncode is None:
                    live.add(handle)
        return handle

    @staticmethod
    def check_image(image: dict) -> None:
        """Refuse an image with build steps: image environments are built by the local
        launcher (envs.py); a Ray node runs workers on its own Python."""
        from sequence_ai_server.common.errors import ApiError
        if image.get("steps"):
            raise ApiError("invalid_request", "image= environments are built by the local launcher; the Ray backend "
                           "runs workers on each node's own Python",
                           hint="install the image's packages on the Ray nodes, or serve it with the local backend")

    def _place(self, spec: WorkerLaunchSpec, members: int, opts: dict, base_env: dict, live: set) -> RayActorWorker:
        """The actor (``members == 1``) or the placement group of member actors, and its handle."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        def gone(w: RayActorWorker) -> None:
            with self._lock:
                live.discard(w)
        tag = f"seq-worker-{spec.name}-{os.urandom(3).hex()}"
        if members == 1:
            actor = self._actor_cls.options(**opts, max_restarts=0, name=tag).remote(spec.secret)
            return RayActorWorker([actor], spec, base_env, asks=opts, on_exit=gone)
        pg = placement_group([_bundle(opts)] * members, strategy="STRICT_SPREAD", name=tag)
        actors = [self._actor_cls.options(**opts, max_restarts=0, name=f"{tag}-rank{r}",
                                          scheduling_strategy=PlacementGroupSchedulingStrategy(pg, r)).remote(spec.secret)
                  for r in range(members)]
        log.info("%s: a group of %d members (%s each) in placement group %s", spec.name, members, _bundle(opts), tag)
        return RayGroupWorker(actors, spec, base_env, asks=opts, on_exit=gone, placement_group=pg)

    def close(self) -> None:
        """Disconnect from the cluster (a ``local`` head stops with it)."""
        import ray
        with contextlib.suppress(Exception):
            ray.shutdown()


def launcher_from_env() -> Any:
    """``$SEQ_BACKEND``: ``local`` (default: a LocalLauncher) or ``ray`` (a RayLauncher on
    ``$SEQ_RAY_ADDRESS``, default ``local``). Raises ValueError for any other backend name."""
    from sequence_ai_server.common.config import ServerConfig
    from sequence_ai_server.launchers.base import launcher_for
    return launcher_for(ServerConfig.from_env())
