"""The gateway's handle on a worker Ray runs: one actor (:class:`RayActorWorker`) or a group of
them on whole machines (:class:`RayGroupWorker`, rank 0 first). A thread asks the actors for
news every ``POLL_S`` s and turns it into launch events (base.py): ``Placed`` once an actor
answers, ``Started`` with the worker's pid, ``Phase`` and ``Ready`` from rank 0's reports (a
group is ready once every member is and rank 0's fan-out front runs), ``Log`` with every
member's output (lines of rank r > 0 prefixed ``[rank r]``), and ``Exited`` with the code (a
lost actor reads as -9; any member's exit stops the whole group). The direct secret travels
the other way (``set_secret``). Stopping behaves like ``subprocess.Popen``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from sequence_ai_server.launchers.base import EventQueue, Exited, Log, Phase, Placed, Ready, Started, WorkerLaunchSpec

__all__ = ["RayActorWorker", "RayGroupWorker", "POLL_S", "STOP_GRACE_S"]

log = logging.getLogger("sequence_ai_server.launchers.ray")

POLL_S = 0.1                 # how often the gateway side asks the actors for news
STOP_GRACE_S = 5.0


class RayActorWorker:
    """A worker in one Ray actor (the base of a group's handle). ``actors``: the worker actor(s),
    rank 0 first; ``spec``: what they run; ``base_env``: the environment they get; ``asks``:
    the actor options (named in the "not placed yet" log line); ``on_exit``: called once with
    this handle when it ends."""

    def __init__(self, actors: list, spec: WorkerLaunchSpec, base_env: dict, *, asks: Optional[dict] = None,
                 on_exit: Optional[Callable] = None, placement_group: Any = None):
        self.args = spec.policy_file
        self.spec = spec
        self.actors = list(actors)
        self.returncode: Optional[int] = None
        self.pid: int = 0                       # rank 0's worker pid on its node, once known (0 before)
        self.actor_pid: Optional[int] = None
        self.members: list[dict] = [{"rank": r} for r in range(len(self.actors))]
        self._base_env = base_env
        self._asks = asks
        self._placing_noted = False
        self._on_exit = on_exit
        self._pg = placement_group
        self._queue = EventQueue()
        self._seen: dict = {}
        self._activity = 0.0
        self._error: Optional[dict] = None
        self._done = threading.Event()
        self._stop_sent = False
        self._line_start = [True] * len(self.actors)
        self._thread = threading.Thread(target=self._watch, name="ray-worker-watch", daemon=True)
        self._thread.start()

    # -- launch.WorkerHandle
    def events(self) -> list:
        """The events since the last call, oldest first."""
        return self._queue.drain()

    def set_secret(self, secret: str) -> None:
        """Send the new direct secret to every member (each re-reads its secret file)."""
        for a in self.actors:
            a.set_secret.remote(secret)

    def last_activity(self) -> float:
        """When rank 0 last accepted a request (unix s on its node), 0 when never."""
        return self._activity

    # -- lifecycle
    def _finish(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._queue.put(Exited(code, self._error))
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

    def _log(self, rank: int, chunk: bytes) -> None:
        if not chunk:
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
        self._queue.put(Log(chunk))

    def _get(self, refs: list) -> list:
        """ray.get that keeps waiting (5 s at a time) while the handle is live; raises
        RayActorError / other errors to the caller, TimeoutError once stopped."""
        import ray
        from ray.exceptions import GetTimeoutError
        while not self._done.is_set():
            if self._stop_sent and self.actor_pid is None:
                raise TimeoutError("stopped before the worker was placed")
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
        self._log(0, f"the worker actor is not up after 5 s: Ray is still placing or starting it (each of "
                     f"{len(self.actors)} asks {self._asks}; free in the cluster now: {free}); it starts "
                     "once resources free up -- add a node or stop another deployment\n".encode())

    def _place(self) -> None:
        """Wait for the actor to be placed, then start its worker."""
        node = self._get([self.actors[0].node.remote()])[0]
        self.members[0].update(node_id=node["node_id"], node_ip=node["ip"], actor_pid=node["actor_pid"])
        self.actor_pid = node["actor_pid"]
        self._queue.put(Placed(f"ray node {node['node_id'][:8]} ({node['ip']})", node=node["node_id"]))
        self.actors[0].launch.remote(self.spec, self._base_env)

    def _watch(self) -> None:
        from ray.exceptions import RayActorError
        try:
            self._place()
            self._watch_loop()
        except TimeoutError:
            self._finish(-signal.SIGTERM)
        except RayActorError as exc:
            if len(self.actors) > 1:
                self._log(0, f"group member lost ({type(exc).__name__}): group_member_lost; "
                             "stopping the whole group\n".encode())
            self._finish(-signal.SIGKILL)
        except Exception as exc:  # noqa: BLE001 - never leave the gateway with a handle that hangs
            log.warning("lost touch with the worker actor(s): %s", exc)
            self._log(0, f"worker actor watch failed: {type(exc).__name__}: {exc}\n".encode())
            self._stop_all(STOP_GRACE_S)
            self._finish(-signal.SIGKILL)

    def _watch_loop(self) -> None:
        offsets = [0] * len(self.actors)
        while not self._done.is_set():
            sts = self._get([a.status.remote(off) for a, off in zip(self.actors, offsets)])
            for rank, st in enumerate(sts):
                self.members[rank].update(pid=st["pid"], actor_pid=st["actor_pid"])
                self._log(rank, st["log"])
                offsets[rank] = st["log_offset"]
            first = sts[0]
            if first["pid"] and not self.pid:
                self._queue.put(Started(first["pid"]))
            self.pid, self.actor_pid, self._activity = first["pid"], first["actor_pid"], first["activity"]
            self._report("phase", first["files"]["phase"])
            self._ready(sts)
            ended = [(rank, st) for rank, st in enumerate(sts) if st["code"] is not None]
            if ended:
                self._ended(*ended[0])
                return
            self._done.wait(POLL_S)

    def _report(self, kind: str, text: Optional[str]) -> Optional[dict]:
        """A new phase / ready report of rank 0 (text as the worker wrote it) as an event."""
        if not text or self._seen.get(kind) == text:
            return None
        self._seen[kind] = text
        try:
            report = json.loads(text)
        except ValueError:
            return None
        if kind == "phase":
            self._queue.put(Phase(report))
        elif kind == "ready" and report.get("port"):
            self._record_ready(report)
            self._queue.put(Ready(str(report.get("url")), report))
        return report

    def _record_ready(self, report: dict) -> None:
        """Keep where the worker serves at the spec's ready-file path (for operators; the
        supervisor hears it from the Ready event)."""
        path = Path(self.spec.ready_file)
        with contextlib.suppress(OSError):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(report))
            tmp.replace(path)

    def _ready(self, sts: list) -> None:
        self._report("ready", sts[0]["files"]["ready"])

    def _ended(self, rank: int, st: dict) -> None:
        if st["files"]["error"]:
            with contextlib.suppress(ValueError):
                self._error = json.loads(st["files"]["error"])
        self._finish(st["code"])

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
        return self.returncode  # type: ignore[return-value]

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


class RayGroupWorker(RayActorWorker):
    """One copy of a model on several whole machines: a Ray placement group (STRICT_SPREAD) of
    member actors, started and stopped together. Member ``r`` runs with ``RANK=r``,
    ``WORLD_SIZE``, ``MASTER_ADDR`` (rank 0's node IP), ``MASTER_PORT`` (a free port there) and
    ``LOCAL_RANK=0``. Ready once every member is and rank 0's fan-out front runs: the Ready
    report is the front's URL plus ``group`` (one ``{rank, node_id, node_ip, actor_pid, pid,
    url}`` per member)."""

    def _place(self) -> None:
        nodes = self._get([a.node.remote() for a in self.actors])
        port = self._get([self.actors[0].free_port.remote()])[0]
        master = nodes[0]["ip"]
        world = len(self.actors)
        for rank, (a, node) in enumerate(zip(self.actors, nodes)):
            self.members[rank].update(node_id=node["node_id"], node_ip=node["ip"], actor_pid=node["actor_pid"])
            group = {"RANK": rank, "WORLD_SIZE": world, "MASTER_ADDR": master, "MASTER_PORT": port, "LOCAL_RANK": 0}
            a.launch.remote(self.spec, self._base_env, group)
        self.actor_pid = nodes[0]["actor_pid"]
        self._queue.put(Placed(f"ray group of {world} on nodes {', '.join(n['node_id'][:8] for n in nodes)}",
                               node=nodes[0]["node_id"]))
        self._log(0, f"group of {world}: rank 0 on {master} (MASTER_PORT {port}); nodes "
                     f"{', '.join(n['node_id'][:8] for n in nodes)}\n".encode())

    def _ready(self, sts: list) -> None:
        if "ready" in self._seen or not all(st["files"]["ready"] for st in sts):
            return
        import ray
        readies = [json.loads(st["files"]["ready"]) for st in sts]
        for m, r in zip(self.members, readies):
            m["url"] = r["url"]
        front = ray.get(self.actors[0].start_front.remote([r["url"] for r in readies]), timeout=30)
        host, _, port = front.rpartition(":")
        self._report("ready", json.dumps({**readies[0], "port": int(port), "url": front,
                                          "host": host.split("//")[-1], "group": self.members}))

    def _ended(self, rank: int, st: dict) -> None:
        if st["files"]["error"]:
            with contextlib.suppress(ValueError):
                self._error = json.loads(st["files"]["error"])
        if not self._stop_sent:
            self._log(0, f"group member rank {rank} exited with code {st['code']}: "
                         "group_member_lost; stopping the whole group\n".encode())
        self._stop_all(STOP_GRACE_S)
        self._finish(st["code"])
