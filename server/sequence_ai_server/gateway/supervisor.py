"""The worker supervisor: :class:`Supervisor` owns every worker record (serving, build beside,
side, retiring), the last activity per worker and its own lock. It starts workers through the
launcher (the process is started with no lock held: the key is reserved first, so two callers
never start the same worker), reconciles them on each control tick by their
:class:`~sequence_ai_server.gateway.worker_record.Role` (a load phase, ready, a failed load, an exit,
the startup timeout, a ready build switched in, a retiring worker reaped, idle stops and warm
floors), and tells the services above it what happened through events (events.py)."""
from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from sequence_ai_server.common.errors import ApiError
from sequence_ai_server.common.processes import process_start
from sequence_ai_server.gateway.adoption import Adoption, DataDirInUse, stop_in_background, worker_record, write_supervisor
from sequence_ai_server.gateway.events import EventBus, WorkerCrashed, WorkerStopped, WorkerTookOver
from sequence_ai_server.gateway.fleet import Fleets
from sequence_ai_server.gateway.store import DeploymentRow, Store
from sequence_ai_server.gateway.worker_record import (DEFAULT_IDLE_TIMEOUT_S, JAMMED_GRACE_S, STOP_GRACE_S, Role,
                                                      WorkerRecord, _exit_reason, _log_tail, _ready_host, _terminate,
                                                      worker_key)
from sequence_ai_server.launchers.base import Launcher, WorkerLaunchSpec, declared_resources
from sequence_ai_server.ops.cards import CardRefused
from sequence_ai_server.ops.service import Running

__all__ = ["Supervisor", "DataDirInUse"]

log = logging.getLogger("sequence_ai_server.gateway")


class Supervisor:
    """Starts, reconciles, switches, stops and adopts worker processes.

    ``launcher``: how workers start (launchers/base.py). ``warm_floor(row)``: workers to keep warm
    for a deployment (ops). ``card_refusal(spec)``: why a loaded spec's ``gpu=`` cannot run here,
    or None (ops). ``cards``: pins each local worker to its cards (ops/cards.py ``CardPins``: ``pin``
    before the start, then ``bind`` or ``release``); None pins nothing. ``cpu_workers``: the most
    workers one CPU policy may run (its ``max_gpus`` counts workers, up to this). ``clock``: unix s. Subscribe
    to its events with :meth:`on`."""

    def __init__(self, store: Store, launcher: Launcher, data_dir: Path, *,
                 warm_floor: Callable[[DeploymentRow], int] = lambda row: 0,
                 card_refusal: Callable[[Optional[dict]], Optional[dict]] = lambda spec: None,
                 cards: Any = None, cpu_workers: int = 1, clock: Callable[[], float] = time.time) -> None:
        self.store, self.launcher, self.data_dir = store, launcher, data_dir
        self.cpu_workers = cpu_workers
        self._warm_floor, self._card_refusal, self._cards, self.clock = warm_floor, card_refusal, cards, clock
        self.workers: dict[str, WorkerRecord] = {}
        self.fleets = Fleets(self)                   # a deployment's several serving workers (fleet.py)
        self.retiring: list[WorkerRecord] = []       # replaced workers draining after a version switch
        self.side_failed: dict[str, dict] = {}       # side worker key -> why its last start failed
        self.activity: dict[str, float] = {}         # worker key -> last connect / renew (unix s)
        self.cold_starts = 0
        self.gateway_url: Optional[str] = None       # workers fetch declared secrets from here
        self._starting: dict[str, Running] = {}      # keys reserved while their process starts
        self._saved: Optional[str] = None
        self._lock = threading.RLock()
        self._depth = threading.local()
        self._events = EventBus()
        self.me = {"pid": os.getpid(), "start": process_start(os.getpid())}   # what supervisor files name

    def on(self, kind: type, handler: Callable[[Any], None]) -> None:
        """Call ``handler(event)`` for each event of type ``kind`` (events.py), holding no supervisor lock."""
        self._events.on(kind, handler)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The supervisor's lock; events raised inside are handed out once the outermost holder let go."""
        with self._lock:
            self._depth.n = getattr(self._depth, "n", 0) + 1
            try:
                yield
            finally:
                self._depth.n -= 1
        if not self._depth.n:
            self._events.dispatch()

    # -- adoption and the workers table
    def adopt(self) -> None:
        """At start: adopt the workers a previous gateway on this data dir left running (a
        launcher whose workers stop with it adopts none). Raises DataDirInUse."""
        records = self.store.worker_records() if self.launcher.adopts else []
        adoption = Adoption(self.store, self.data_dir, getattr(self.launcher, "adopt", None), self.me, self.clock)
        with self._locked():
            self.workers, self.retiring = adoption.adopt_all(records, stop_others=self.launcher.adopts)
            self.save_workers()

    def save_workers(self) -> None:
        """Record the running workers in the ``workers`` table when they changed (Ray workers are not recorded)."""
        if not self.launcher.adopts:
            return
        with self._locked():
            records = [worker_record(k, w) for k, w in self.workers.items()]
            records += [worker_record(f"{w.name}.retiring.{w.proc.pid}", w) for w in self.retiring]
            blob = json.dumps(records, sort_keys=True, default=str)
            if blob != self._saved:
                self.store.put_worker_records(records)
                self._saved = blob

    # -- queries
    def get(self, key: str) -> Optional[WorkerRecord]:
        """The worker under ``key`` (worker_key), None when none runs (or it is still starting)."""
        with self._locked():
            return self.workers.get(key)

    def busy(self, key: str) -> bool:
        """Whether a worker runs under ``key`` or is being started."""
        with self._locked():
            return key in self.workers or key in self._starting

    def of(self, role: Role, name: Optional[str] = None) -> dict[str, WorkerRecord]:
        """``{key: worker}`` of the workers in ``role`` (of deployment ``name`` when given)."""
        with self._locked():
            return {k: w for k, w in self.workers.items() if w.role is role and name in (None, w.name)}

    def running(self) -> list[Running]:
        """Every running worker (retiring ones too) as ops counts it."""
        out = []
        with self._locked():
            for w in [*self.workers.values(), *self.retiring]:
                row = self.store.get(w.name)
                spec = w.spec or (row.spec if row else None) or {}
                out.append(Running(w.name, w.role.value, (spec.get("resources") or {}).get("gpu")))
        return out

    def secrets(self) -> list[str]:
        """The current and launch secrets of every worker this supervisor runs."""
        with self._locked():
            return [w.secret for w in [*self.workers.values(), *self.retiring] if w.secret]

    def touch(self, key: str, now: float) -> None:
        """A connect or renew used worker ``key`` at ``now`` (unix s): its idle time starts again."""
        self.activity[key] = now

    # -- starting workers
    def launch_spec(self, name: str, role: Role, file: str, class_name: Optional[str], version: int,
                    source: Path) -> WorkerLaunchSpec:
        """The launch spec of ``name``'s worker in ``role``: run files per launch (a build never
        touches the serving worker's), a fresh secret, the per-deployment settings it reads."""
        env = {"SEQ_CAPTURE_DIR": str(self.data_dir / "capture" / name),     # kept episodes (capture.py)
               "SEQ_VOLUMES_DIR": str(self.data_dir / "volumes"),            # weights="vol://NAME@vN" (volumes.py)
               "SEQ_JSON_LOG": str(self.data_dir / "logs" / f"{name}.jsonl")}  # structured log (logs.py)
        if self.gateway_url:
            env["SEQ_GATEWAY_URL"] = self.gateway_url                         # declared secrets are fetched from here
        try:
            resources = declared_resources(file)
        except (OSError, SyntaxError):
            resources = {}
        return WorkerLaunchSpec(
            name=name, role=role.value, version=version, policy_file=file, class_name=class_name,
            cwd=str(source.parent), secret=secrets.token_urlsafe(32), run_dir=self.data_dir / "run",
            run_key=f"{worker_key(role, name, version)}.{secrets.token_hex(3)}",
            weights_dir=self.data_dir / "weights" / name, log_path=self.data_dir / "logs" / f"{name}.log",
            env=env, resources=resources, image=self.image_of(file), adoptable=self.launcher.adopts)

    def image_of(self, file: str) -> Optional[dict]:
        """The policy's ``image=`` spec dict (envs.py reads it without importing), or None. Raises
        ApiError for a declaration the gateway cannot read."""
        from sequence_ai_server.launchers.envs import image_from_source
        return image_from_source(file)

    def _start(self, key: str, role: Role, name: str, file: str, class_name: Optional[str], version: int,
               source: Path, reserve: Callable[[WorkerLaunchSpec], Callable[[], None]],
               max_workers: Optional[int] = None,
               admit: Optional[Callable[[list[Running]], None]] = None) -> Optional[WorkerRecord]:
        """Start ``name``'s worker under ``key``. Under the lock: refuse past ``max_workers``
        (gpu_limit_reached), ask ``admit(running)`` (the running and starting workers; it raises
        to refuse, e.g. a quota), reserve the key and call ``reserve(spec)`` (which records the
        start and returns how to undo it); then the process starts with no lock held; then it is
        recorded. None when ``key`` already runs or starts. Raises ApiError when the launcher
        refuses the spec (the reservation is undone)."""
        with self._locked():
            if key in self.workers or key in self._starting:
                return None
            if admit is not None:
                admit(self.running() + list(self._starting.values()))
            if max_workers is not None:
                n = sum(1 for w in self.workers.values() if w.role is not Role.BUILD) + len(self._starting)
                if n >= max_workers:
                    raise ApiError("gpu_limit_reached", f"{n} workers run and this machine allows {max_workers} "
                                   f"(SEQ_MAX_GPUS); {name!r} cannot start", details={"max_gpus": max_workers},
                                   hint="stop a deployment (`seq policy stop NAME`) or raise SEQ_MAX_GPUS")
            spec = self.launch_spec(name, role, file, class_name, version, source)
            if self._cards is not None:      # its cards, or CardRefused (gpu_busy, deployment_full, ...)
                spec = self._cards.pin(spec, key)
            self._starting[key] = Running(name, role.value, (spec.resources or {}).get("gpu"))
            undo = reserve(spec)
        try:
            if spec.adoptable:      # a local worker outlives a gateway crash; a restarted gateway adopts it
                write_supervisor(spec.supervisor_file, self.me)
            handle = open(spec.log_path, "ab", buffering=0)
            handle.write(f"\n===== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {name} v{version} =====\n".encode())
            try:
                proc = self.launcher.start(spec, handle)
            except BaseException:
                handle.close()
                raise
        except BaseException:
            with self._locked():
                self._starting.pop(key, None)
                undo()
                if self._cards is not None:
                    self._cards.release(spec)
            raise
        w = WorkerRecord(name, proc, spec.ready_file, spec.log_path, self.clock(), log_handle=handle, secret=spec.secret,
                         secret_file=spec.secret_file, activity_file=spec.activity_file, version=version, file=file,
                         class_name=class_name, supervisor_file=spec.supervisor_file if spec.adoptable else None,
                         proc_start=process_start(proc.pid) if spec.adoptable and proc.pid else None, role=role)
        with self._locked():
            self._starting.pop(key, None)
            self.workers[key] = w
            if self._cards is not None:      # its cards are free again once this process has exited
                self._cards.bind(spec, proc)
            self.cold_starts += 1
            log.info("started worker for %s v%d (pid %d)", name, version, proc.pid)
            self.save_workers()
        return w

    def start_serving(self, name: str, max_workers: Optional[int] = None,
                      admit: Optional[Callable[[list[Running]], None]] = None) -> bool:
        """Start the serving worker of ``name``'s serving version (its row: starting, a new epoch
        and secret). False when one runs or starts already. Raises ApiError gpu_limit_reached
        past ``max_workers``, what ``admit(running)`` raises (checked with the start, as one
        step), the launcher's refusal, or CardRefused when no card is free (the row: stopped,
        phase ``no_card``, the reason as its error)."""
        row = self.store.get(name)
        kept = {v.version: v for v in self.store.versions(name)}
        source = Path(kept[row.version].source_file) if row.version in kept else Path(row.file)

        def reserve(spec: WorkerLaunchSpec) -> Callable[[], None]:
            now = self.clock()
            self.store.update(name, status="starting", phase="spawning", worker_pid=None, worker_port=None,
                              secret=spec.secret, epoch=row.epoch + 1, error=None, details=None,
                              started_at=now, ready_at=None)
            return lambda: self.store.update(name, status=row.status, phase=row.phase, worker_pid=row.worker_pid,
                                             worker_port=row.worker_port, secret=row.secret, epoch=row.epoch,
                                             error=row.error, details=row.details, started_at=row.started_at,
                                             ready_at=row.ready_at)
        try:
            w = self._start(name, Role.SERVING, name, row.file, row.class_name, row.version, source, reserve,
                            max_workers, admit)
        except CardRefused as exc:      # no card now: stopped, and the next connect tries again
            self.store.update(name, status="stopped", phase="no_card", error=exc.detail, details=exc.details,
                              worker_pid=None, worker_port=None)
            raise
        if w is None:
            return False
        with self._locked():
            now_row = self.store.get(name)
            if now_row is None or now_row.status != "starting" or now_row.secret != w.secret:
                # stopped or removed while its process started: this worker is not wanted
                self.workers.pop(name, None)
                w.stopping = True
                stop_in_background(w.proc, f"{name} was stopped while its worker started")
            else:
                self.store.update(name, worker_pid=w.proc.pid, started_at=w.started_at)
            self.save_workers()
        return True

    def start_build(self, name: str, file: str, class_name: Optional[str], version: int, source: Path,
                    sha: Optional[str], build: dict, replacing_jammed: bool = False) -> Optional[WorkerRecord]:
        """Start version ``version`` of ``name`` beside its serving worker (a build that was
        running is stopped first; ``build``: the row's new build record). None when one starts
        already. Raises ApiError as ``_start`` does."""
        bk = worker_key(Role.BUILD, name)
        with self._locked():
            prev = self.workers.get(bk)
            if prev is not None and prev.version != version:
                self.store.update_version(name, prev.version, status="superseded")
            self.stop(bk)

        def reserve(spec: WorkerLaunchSpec) -> Callable[[], None]:
            old = (self.store.get(name) or DeploymentRow(name=name, version=0, file="")).build
            self.store.update(name, build=build)
            return lambda: self.store.update(name, build=old)
        w = self._start(bk, Role.BUILD, name, file, class_name, version, source, reserve)
        if w is not None:
            w.file_sha, w.replacing_jammed = sha, replacing_jammed
        return w

    def start_side(self, name: str, version: int, max_workers: Optional[int] = None) -> Optional[WorkerRecord]:
        """Start kept version ``version`` of ``name`` as a side worker (``name@vN``) for a traffic
        split or pin. None when it runs or starts already. Raises ApiError as ``_start`` does
        (gpu_limit_reached past ``max_workers``)."""
        v = {x.version: x for x in self.store.versions(name)}[version]
        sk = worker_key(Role.SIDE, name, version)

        def reserve(spec: WorkerLaunchSpec) -> Callable[[], None]:
            self.side_failed.pop(sk, None)
            return lambda: None
        w = self._start(sk, Role.SIDE, name, v.file, v.class_name, version, Path(v.source_file), reserve, max_workers)
        if w is not None:
            w.epoch = secrets.randbelow(2 ** 31)
            log.info("started %s v%d beside the serving version for its traffic split/pins", name, version)
        return w

    # -- stopping workers
    def stop(self, key: str) -> None:
        """Stop the worker under ``key`` (SIGTERM, SIGKILL after the grace); no-op when none runs.
        Stopping a deployment's first serving worker (``key`` = its name) stops its other ones too."""
        with self._locked():
            if key in self.workers and self.workers[key].role is Role.SERVING:
                self.fleets.stop_others(key)
            w = self.workers.pop(key, None)
            if w is None:
                return
            w.stopping = True
            _terminate(w.proc)
            w.drain()                       # its last log lines
            if w.log_handle:
                w.log_handle.close()

    def stop_sides(self, name: str) -> None:
        """Stop every side worker of ``name`` and forget why any failed."""
        with self._locked():
            for k in self.of(Role.SIDE, name):
                self.stop(k)
            for k in [k for k in self.side_failed if k.rsplit("@v", 1)[0] == name]:
                self.side_failed.pop(k, None)

    def set_secret(self, name: str, secret: str) -> bool:
        """Give ``name``'s serving worker the direct secret ``secret``; False when none runs."""
        with self._locked():
            w = self.workers.get(name)
            if w is not None:
                w.proc.set_secret(secret)
            return w is not None

    def stop_all(self) -> None:
        """Stop every worker (SIGTERM all, then wait out one grace; SIGKILL what is left)."""
        with self._locked():
            workers = [*self.workers.values(), *self.retiring]
            self.workers.clear()
            self.retiring = []
        for w in workers:
            w.stopping = True
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.drain()
            if w.log_handle:
                w.log_handle.close()
            self.store.update(w.name, status="stopped", phase="stopped", worker_port=None, worker_pid=None)
        self.save_workers()

    # -- reconciling (each control tick)
    def reconcile(self, now: float, held: set[str] = frozenset()) -> None:
        """One supervision pass at ``now`` (unix s): every worker by its role, the retiring ones,
        the side workers no session in ``held`` (worker keys) uses, idle stops and warm floors."""
        from sequence_ai_server.gateway.roles import poll_build, poll_extra, poll_side, reap_retiring, reap_sides
        with self._locked():
            for w in [*self.workers.values(), *self.retiring]:
                w.drain()               # log chunks, phase / ready / exit reports from the launcher
            for key, w in list(self.workers.items()):
                if w.role is Role.BUILD:
                    poll_build(self, key, w, now)
                elif w.role is Role.SIDE:
                    poll_side(self, key, w, now)
                elif w.role is Role.EXTRA:
                    poll_extra(self, key, w, now)
                else:
                    self._poll_serving(key, w, now)
            reap_retiring(self, now)
            reap_sides(self, held, now)
        self._idle_and_floors(now, held)
        self.save_workers()

    def poll(self, key: str) -> Optional[WorkerRecord]:
        """Reconcile the one worker under ``key`` now (a connect asks before it answers); returns
        it, or None when it is gone (or none ran)."""
        from sequence_ai_server.gateway.roles import poll_extra, poll_side
        with self._locked():
            w = self.workers.get(key)
            if w is not None and w.role is Role.SIDE:
                poll_side(self, key, w, self.clock())
            elif w is not None and w.role is Role.EXTRA:
                poll_extra(self, key, w, self.clock())
            elif w is not None and w.role is Role.SERVING:
                self._poll_serving(key, w, self.clock())
            return self.workers.get(key)

    def _poll_serving(self, name: str, w: WorkerRecord, now: float) -> None:
        """The serving worker of ``name``: its load phase, ready (the row says where it listens),
        a failed load (the policy's error), an exit while serving, or the startup timeout."""
        row = self.store.get(name)
        if row is None:
            return
        ph = w.phase_changed()
        if w.proc.pid and row.worker_pid != w.proc.pid and row.status == "starting":
            self.store.update(name, worker_pid=w.proc.pid)     # started once its image environment was built
        if ph:
            fields: dict[str, Any] = {}
            if ph.get("phase") and row.status == "starting":
                fields["phase"] = ph["phase"]
            if ph.get("spec"):
                if self.refuse_missing_card(name, w, ph["spec"]):   # gpu= names no card here (ops)
                    return
                fields["spec"] = ph["spec"]
                w.startup_timeout_s = float(ph["spec"].get("timeouts", {}).get("startup", 1800.0))
            if fields:
                self.store.update(name, **fields)
        code = w.proc.poll()
        if row.status == "starting" and code is None:
            ready = w.ready_report()
            if ready:
                self.store.update(name, status="ready", phase="ready", worker_port=int(ready["port"]),
                                  worker_host=_ready_host(ready), ready_at=now, load_s=round(now - w.started_at, 3), served=1,
                                  spec=ready.get("spec") or row.spec)
                log.info("%s is ready on port %s after %.2fs", name, ready["port"], now - w.started_at)
                self.store.update_version(name, row.version, status="ready", load_s=round(now - w.started_at, 3))
            return      # a load past its startup timeout is the worker's own to end (it exits, code 3)
        if code is None:
            return
        self.workers.pop(name, None)
        if w.log_handle:
            w.log_handle.close()
        if w.stopping:
            return
        if row.status == "starting":
            msg, details = w.load_failure(code, row.phase)
            self.store.update(name, status="failed", phase="failed", error=msg, details=details,
                              worker_port=None, worker_pid=None, served=0)
            log.warning("%s failed: %s", name, msg)
            return
        msg = f"worker {_exit_reason(code)} while serving; the next connect starts a new one"
        self.store.update(name, status="failed", phase="exited", error=msg,
                          details={"log_tail": _log_tail(w.log_path), "exit_code": code},
                          worker_port=None, worker_pid=None)
        log.warning("%s: %s", name, msg)
        self._events.emit(WorkerCrashed(name, row.version, w.proc.pid, code, msg))

    def refuse_missing_card(self, key: str, w: WorkerRecord, spec: Optional[dict]) -> bool:
        """Stop worker ``w`` (``workers[key]``) and record why when its ``spec`` declares a ``gpu=``
        this machine lacks (ops decides); returns whether it did. A serving worker's deployment
        is marked failed, a build's version failed (the serving one stays)."""
        why = self._card_refusal(spec)
        if why is None:
            return False
        w.stopping = True
        _terminate(w.proc)
        self.workers.pop(key, None)
        if w.log_handle:
            w.log_handle.close()
        msg = f"refused at deploy: {why['detail']}"
        if w.role is Role.BUILD:
            row = self.store.get(w.name)
            self.store.update(w.name, build={**((row.build if row else None) or {}), "status": "failed",
                                             "phase": "failed", "error": msg, "details": why})
        else:
            self.store.update(w.name, status="failed", phase="failed", error=msg, details=why, served=0,
                              worker_port=None, worker_pid=None)
        self.store.update_version(w.name, w.version, status="failed", error=msg)
        log.warning("%s v%d: %s", w.name, w.version, msg)
        return True

    def take_over(self, key: str, w: WorkerRecord, row: DeploymentRow, build: dict, ready: dict, now: float) -> None:
        """The build ``w`` is ready: it becomes the serving worker of ``row`` (a new epoch, the
        traffic split cleared), and the worker it replaces retires (its secret rotated, SIGTERM,
        drained in the background), with the deployment's other workers when ``w`` is a new
        version (a jammed first worker's replacement leaves them serving). Emits WorkerTookOver."""
        name = w.name
        self.workers.pop(key, None)
        old = self.workers.pop(name, None)
        # a new version: the old version's other workers retire with its first. A jammed first
        # worker's replacement (the same version) takes its place alone: the others serve on
        if not (w.replacing_jammed and w.version == row.version):
            for ek in self.of(Role.EXTRA, name):
                self._retire(self.workers.pop(ek), now, JAMMED_GRACE_S if w.replacing_jammed else STOP_GRACE_S)
        w.role = Role.SERVING
        self.workers[name] = w
        load_s = round(now - w.started_at, 3)
        self.store.update(name, version=w.version, file=w.file, class_name=w.class_name, file_sha=w.file_sha,
                          status="ready", phase="ready", worker_port=int(ready["port"]), worker_pid=w.proc.pid,
                          worker_host=_ready_host(ready), secret=w.secret, epoch=row.epoch + 1, error=None,
                          details=None, load_s=load_s, started_at=w.started_at, ready_at=now, served=1,
                          spec=ready.get("spec") or w.spec or row.spec,
                          build=({**build, "status": "switching", "phase": "ready", "load_s": load_s}))
        if row.version != w.version:
            self.store.update_version(name, row.version, status="retired")
        pol = row.traffic
        if pol["split"]:   # a new serving version takes every new session (pins stay)
            pol["split"] = {}
            self.store.update(name, traffic=pol)
            log.info("%s v%d took over: its traffic split is cleared", name, w.version)
        self.store.update_version(name, w.version, status="ready", load_s=load_s, error=None)
        # the new worker serves from here on; the old one's tokens stop working at once
        # (its clients reconnect to the new version) and it drains and exits in the background
        if old is not None:      # a jammed worker's replica thread is stuck: do not wait long
            self._retire(old, now, JAMMED_GRACE_S if w.replacing_jammed else STOP_GRACE_S)
        else:
            self.store.update(name, build=({**build, "status": "ready", "load_s": load_s}))
        log.info("%s v%d took over after %.2fs", name, w.version, load_s)
        self._events.emit(WorkerTookOver(name, w.version, w.proc.pid, old.proc.pid if old is not None else None))

    def _retire(self, old: WorkerRecord, now: float, grace_s: float) -> None:
        """``old`` was replaced: its tokens stop working at once (a rotated secret), SIGTERM, and
        it drains among the retiring workers for at most ``grace_s``."""
        old.stopping = True
        old.proc.set_secret(secrets.token_urlsafe(32))
        with contextlib.suppress(ProcessLookupError):
            old.proc.send_signal(signal.SIGTERM)
        old.role, old.retired_at, old.grace_s = Role.RETIRING, now, grace_s
        self.retiring.append(old)

    def _idle_and_floors(self, now: float, held: set[str] = frozenset()) -> None:
        """Stop a ready worker after idle_timeout with no request (direct /act included, via its
        activity file, plus connect/renew here), emitting WorkerStopped; keep each deployment's
        warm floor (min_workers or a scheduled one) running: restart a stopped-idle or crashed one.
        A deployment's other workers (``name#N``) go first, one per pass, the last started first,
        never one a session in ``held`` uses nor below its ``warm_target``; its first worker idles
        out only once they are gone. Starts (restarts and the workers a floor asks for) run with
        no lock held."""
        start: list[str] = []
        grow: list[str] = []
        with self._locked():
            for row in self.store.all():
                name = row.name
                floor = self._warm_floor(row)
                if floor >= 1:
                    self.activity[name] = now          # a floor in force counts as activity
                fleet = self.fleets.of(name)
                target = self.fleets.target(row, held)
                if any(k != name for k in fleet):
                    if len(fleet) > target:
                        self.fleets.stop_one_idle(row, held, now)
                elif row.status == "ready" and name in self.workers and floor < 1:
                    idle_timeout = float(row.spec_value("idle_timeout", DEFAULT_IDLE_TIMEOUT_S))
                    last = max(row.ready_at or 0.0, self.activity.get(name, 0.0), self.workers[name].last_activity())
                    if now - last > idle_timeout:
                        log.info("%s idle for %.0f s (idle_timeout %g s): stopping its worker", name, now - last,
                                 idle_timeout)
                        self.stop(name)
                        self.store.update(name, status="stopped", phase="idle", worker_port=None, worker_pid=None)
                        self._events.emit(WorkerStopped(name, "idle"))
                elif floor >= 1 and not self.busy(name) and not row.halted_at and (
                        row.phase in ("idle", "exited") or (row.status == "stopped" and row.phase != "stopped")):
                    log.info("%s declares min_workers=%d: starting its worker", name, floor)
                    start.append(name)
                if row.status == "ready" and name in self.workers and not row.halted_at \
                        and self.fleets.size(name) < target:
                    grow.append(name)
        for name in start:
            try:
                self.start_serving(name)
            except ApiError as exc:
                log.warning("%s: its warm floor could not start a worker: %s", name, exc.detail)
        for name in grow:
            try:
                self.fleets.start(name)
            except ApiError as exc:
                log.warning("%s: its warm floor could not start another worker: %s", name, exc.detail)
